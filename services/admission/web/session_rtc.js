// The session page's use of WebRTC (rtc.js): connect, show the data channel's block events with the
// readouts the socket path gives, and fall back to fence's sockets when WebRTC is unavailable or drops.
// Shares the page's state with session.js (loaded first).
"use strict";

async function connectRtc(created) {
  showTransport("WebRTC (connecting…)", "warn");
  const video = $("video");
  try {
    const conn = await sfRtc.connect(created, video, {
      block: onRtcBlock, owner: onOwner, notice: onNotice, ack: (ack) => answered(page.pending.get(ack.id), ack),
      closed: (reason) => { if (page.rtc === conn) fallBack(`WebRTC lost: ${reason}`); },
    });
    if (page.session !== created) return conn.close();
    page.rtc = conn;
    canvas.hidden = true;
    video.hidden = false;
    showTransport("WebRTC", "ok");
    showConnection();
    for (const item of page.outbox.splice(0)) sendItem(item);
  } catch (e) {
    if (page.session === created) connectSockets(`WebSocket (WebRTC unavailable: ${e.message || e})`);
  }
}

function fallBack(reason) { // the peer connection dropped: the sockets take over, items unanswered go again
  page.rtc = null;
  page.reconnects++;
  for (const sent of page.pending.values()) page.outbox.push(sent);
  page.pending.clear();
  connectSockets(`WebSocket (${reason})`);
}

function connectSockets(label) {
  canvas.hidden = false;
  $("video").hidden = true;
  showTransport(label, label === "WebSocket" ? "ok" : "warn");
  connectInput();
  connectOutput();
}

function showTransport(text, cls) {
  page.transport = text;
  $("transport-now").textContent = text;
  $("transport-now").className = `v ${cls}`;
}

function onRtcBlock(b) { // the readouts showBlock gives the WebSocket path, from the data channel's events
  const now = performance.now() / 1000;
  if (page.lastArrival !== null) {
    sf.setText("period-now", sf.ms(now - page.lastArrival));
    if (b.media_s > 0) sf.setText("rtf", ((now - page.lastArrival) / b.media_s).toFixed(2));
  }
  page.lastArrival = now;
  coverInputs(b.input_seq, now);
  page.lastBlock = b.index;
  page.replays = b.replays_dropped;
  sf.setText("replays", page.replays);
  page.blocksShown++;
  sf.setText("blocks", page.blocksShown);
  const video = $("video");
  if (video.videoWidth) sf.setText("frame-size", `${video.videoWidth}×${video.videoHeight}`);
  sf.setText("audio", "Opus");
}
