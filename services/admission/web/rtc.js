// The session page's WebRTC transport: one peer connection to fence's offer endpoint
// (`/v1/sessions/{id}/rtc`, the input token in the Authorization header, never in the URL), carrying
// the session's video and audio as tracks and, on its data channel, owner changes, block events and
// input with its acknowledgements. No STUN or TURN server: host candidates only.
// Also measures what the page presents: each video frame's presentation (requestVideoFrameCallback),
// mapped to its block by the data channel's timestamps.
"use strict";

const sfRtc = {};

sfRtc.supported = () => typeof RTCPeerConnection === "function" &&
  typeof HTMLVideoElement !== "undefined" && "requestVideoFrameCallback" in HTMLVideoElement.prototype;

// Connect; resolves once the data channel is open. `on`: {block, owner, ack, closed(reason)}.
sfRtc.connect = async function (created, video, on, timeoutMs = 15000) {
  const url = created.input_url.replace(/\/items$/, "/rtc");
  const pc = new RTCPeerConnection({ iceServers: [] });
  pc.addTransceiver("video", { direction: "recvonly" });
  pc.addTransceiver("audio", { direction: "recvonly" });
  const channel = pc.createDataChannel("sf");
  const conn = { pc, channel, peerId: "", timing: sfRtc.timing(), ended: false };
  const stream = new MediaStream();
  pc.ontrack = (ev) => {
    stream.addTrack(ev.track);
    video.srcObject = stream;
    video.play().catch(() => {}); // muted until the browser allows sound: the video still plays
  };
  channel.onmessage = (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.block) { conn.timing.block(msg.block); on.block(msg.block); }
    else if (msg.owner) on.owner(msg.owner);
    else if (msg.notice) { if (on.notice) on.notice(msg.notice); }  // a caller may not follow notices
    else if (msg.ack) on.ack(msg.ack);
  };
  const end = (reason) => {
    if (conn.ended) return;
    conn.ended = true;
    pc.close();
    on.closed(reason);
  };
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc, 3000);
    const resp = await fetch(url, {
      method: "POST", body: JSON.stringify({ type: "offer", sdp: pc.localDescription.sdp }),
      headers: { Authorization: `Bearer ${created.input_token}`, "Content-Type": "application/json" },
      credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
    });
    const answer = await resp.json();
    if (!resp.ok) throw new Error(`${answer.title || resp.status}: ${answer.detail || ""}`);
    conn.peerId = answer.peer_id;
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    await opened(pc, channel, timeoutMs);
  } catch (e) {
    conn.ended = true;
    pc.close();
    throw e;
  }
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed" || pc.connectionState === "closed") end(`connection ${pc.connectionState}`);
  };
  channel.onclose = () => end("data channel closed");
  conn.send = (item) => channel.send(JSON.stringify(item));
  conn.close = () => { conn.ended = true; pc.close(); };
  const onFrame = (now, meta) => {
    if (conn.ended) return;
    conn.timing.frame(meta);
    video.requestVideoFrameCallback(onFrame);
  };
  const audio = pc.getReceivers().find((r) => r.track.kind === "audio");
  const listen = () => { // each animation frame (60 Hz): every 20 ms audio packet seen as it plays
    if (conn.ended || !audio) return;
    conn.timing.heard(audio.getSynchronizationSources());
    requestAnimationFrame(listen);
  };
  requestAnimationFrame(listen);
  video.requestVideoFrameCallback(onFrame);
  return conn;
};

function gathered(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs); // send what was gathered: host candidates come first
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") { clearTimeout(timer); resolve(); }
    });
  });
}

function opened(pc, channel, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("WebRTC did not connect in time")), timeoutMs);
    channel.onopen = () => { clearTimeout(timer); resolve(); };
    pc.addEventListener("connectionstatechange", () => {
      if (pc.connectionState === "failed") { clearTimeout(timer); reject(new Error("WebRTC connection failed")); }
    });
  });
}

// Frame presentation mapped to blocks. A block message gives its first frame's video timestamp from
// the connection's origin, and `first_pts`, that of the first frame the connection sent; the RTP
// timestamps the browser reports add an offset chosen by the sender, learned from the first frame
// presented (the first sent, a key frame). A frame whose block message has not come yet waits and is
// matched when it comes. Messages come in order, so a frame still unmatched once a later block was
// announced belongs to no announced block: it is counted as unmatched, not guessed.
// For measuring A/V sync, also the audio played: `sound` keeps [delivered to the track (wall ms), RTP
// timestamp, level] of each audio packet as first seen (polled at each animation frame), `levels` the
// [sample, RFC 6464 level] of each audio frame fence sent (block messages); together they tell which
// sample each audio RTP timestamp carries, so audio and video go on one media clock (bench.webrtc).
sfRtc.timing = function () {
  const t = { firstRtp: null, offset: null, byPts: new Map(), shownAt: {}, frames: [], waiting: [], unmatched: 0,
              presented: 0, stamps: {}, sound: [], levels: [] }; // stamps: block → [arrived at fence, first frame sent] (wall ms)
  const match = (f) => {
    if (t.offset === null) return false;
    const pts = (f.rtp - t.offset) >>> 0;
    const hit = t.byPts.get(pts) || t.byPts.get(pts - 1) || t.byPts.get(pts + 1); // rounding of pts
    if (!hit) return pts;
    t.shownAt[hit.block] = Math.min(t.shownAt[hit.block] || Infinity, f.at); // the block's first frame seen
    t.frames.push([f.at, pts / 90]); // [wall ms presented, media ms]
    if (t.frames.length > 4000) t.frames.shift();
    return true;
  };
  t.heard = (sources) => {
    for (const s of sources) {
      const last = t.sound[t.sound.length - 1];
      if (s.rtpTimestamp === undefined || (last && last[1] === s.rtpTimestamp)) continue; // first seen kept
      if (t.sound.push([s.timestamp, s.rtpTimestamp, s.audioLevel || 0]) > 4000) t.sound.shift();
    }
  };
  t.block = (b) => {
    t.stamps[b.index] = [b.arrived_at * 1000, b.sent_at * 1000];
    for (const l of b.levels || []) if (t.levels.push(l) > 8000) t.levels.shift();
    delete t.stamps[b.index - 400];
    for (let i = 0; i < b.frames; i++) t.byPts.set(b.pts + i * b.step_pts, { block: b.index, i });
    while (t.byPts.size > 4000) t.byPts.delete(t.byPts.keys().next().value);
    if (t.offset === null && t.firstRtp !== null && b.first_pts !== null) t.offset = t.firstRtp - b.first_pts;
    t.waiting = t.waiting.filter((f) => {
      const got = match(f);
      if (got === true) return false;
      if (got !== false && got < b.pts) { t.unmatched++; return false; }
      return true;
    });
  };
  t.frame = (meta) => {
    t.presented++;
    if (meta.rtpTimestamp === undefined) return;
    if (t.firstRtp === null) t.firstRtp = meta.rtpTimestamp;
    const f = { rtp: meta.rtpTimestamp, at: performance.timeOrigin + meta.presentationTime };
    if (match(f) !== true && t.waiting.push(f) > 400) { t.waiting.shift(); t.unmatched++; }
  };
  return t;
};
