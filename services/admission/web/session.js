// The session page: create a session, send it input and show its output with latency, period, RTF and
// owner. Over WebRTC where the browser and fence can (rtc.js: video and audio tracks, input and events on
// the data channel), else over fence's ingress sockets (frames on the canvas at their real rate, audio
// through Web Audio); the page says which it uses.
// The input token lives only in this page's memory: never in a URL, storage or a log.
"use strict";

const PERIOD_MS = { avatar: 400, world: 1000 / 15 };
const MAX_BACKLOG_S = 2.0; // frames waiting to be shown beyond this are dropped (late is worse than skipped)
const WORLD_KEYS = { w: "w", a: "a", s: "s", d: "d", " ": "space", shift: "shift" };

const page = {
  session: null, // the create reply (token included), memory only
  input: null, output: null, // the two sockets
  inputAttempt: 0, outputAttempt: 0, reconnects: 0, refused: false,
  unanswered: [], // items sent and not yet answered, in order: the socket answers in the same order
  outbox: [], // items typed while the input socket was down: sent (same id) once it is back
  sentAt: new Map(), // input seq → when it was sent (for control-to-output latency)
  latencies: [],
  parts: new Map(), // block → {frames: [...], audio: [...], meta}
  lastBlock: 0, replays: 0, blocksShown: 0, lastArrival: null,
  frames: [], nextFrameAt: 0, // decoded frames waiting for their time on the canvas
  audio: null, audioNext: 0,
  owner: null, keys: new Set(), mouse: [0, 0],
  rtc: null, pending: new Map(), // the WebRTC connection; its items sent and not yet answered, by id
  transport: "", wsBytes: 0, timing: { shownAt: {}, frames: [], skews: [] }, // what the WebSocket path presents
};
window.sfPage = page; // for the browser tests and the curious: read-only use

const $ = (id) => document.getElementById(id);
const canvas = $("screen");
const ctx2d = canvas.getContext("2d");

// ---------------------------------------------------------------- create

$("backend").addEventListener("change", () => {
  $("period").value = PERIOD_MS[$("backend").value].toFixed(1).replace(/\.0$/, "");
});

$("create").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("create-error").textContent = "";
  startAudio(); // a click: the one moment a browser lets a page start sound
  const backend = $("backend").value;
  const body = {
    backend, seed: Number($("seed").value) || 0, prompt: $("prompt").value,
    contract: { session_class: $("class").value, quality_floor: 1, determinism: "T1",
                period_ms: Number($("period").value) || PERIOD_MS[backend] },
  };
  $("create-btn").disabled = true;
  try {
    // Creating a session needs a credential; it goes in a header, never in the URL, and is not kept.
    const headers = { "Content-Type": "application/json" };
    if ($("apikey").value) headers.Authorization = `Bearer ${$("apikey").value}`;
    const resp = await fetch("/v1/sessions", { method: "POST", headers, body: JSON.stringify(body) });
    const reply = await resp.json();
    if (!resp.ok) throw new Error(`${reply.title || resp.status}: ${reply.detail || ""}`);
    open(reply);
  } catch (e) {
    $("create-error").textContent = String(e.message || e);
    $("create-btn").disabled = false;
  }
});

function open(created) {
  closeSockets();
  Object.assign(page, { session: created, lastBlock: 0, blocksShown: 0, replays: 0, reconnects: 0, refused: false,
                        frames: [], parts: new Map(), latencies: [], sentAt: new Map(), owner: null,
                        pending: new Map(), wsBytes: 0, timing: { shownAt: {}, frames: [], skews: [] } });
  $("owners").replaceChildren();
  $("sent").replaceChildren();
  $("title").textContent = `Stream · ${created.backend} · ${created.session_id}`;
  const world = created.backend === "world";
  $("avatar-input").hidden = world;
  $("world-input").hidden = !world;
  $("say").disabled = $("say-btn").disabled = world;
  $("create-btn").disabled = false;
  if ($("transport").value === "auto" && sfRtc.supported()) connectRtc(created);
  else connectSockets("WebSocket" + (sfRtc.supported() ? "" : " (this browser has no WebRTC)"));
  if (world) canvas.focus();
  else $("say").focus();
}

function closeSockets() {
  for (const ws of [page.input, page.output]) if (ws) { ws.onclose = null; ws.close(); }
  page.input = page.output = null;
  if (page.rtc) page.rtc.close();
  page.rtc = null;
}

function coverInputs(inputSeq, now) {
  for (const [seq, at] of page.sentAt) {
    if (seq > inputSeq) continue;
    page.latencies.push(now - at);
    page.sentAt.delete(seq);
    sf.setText("latency", sf.ms(now - at));
  }
}

// ---------------------------------------------------------------- input (fence ingress /ws)

function connectInput() {
  const created = page.session;
  const ws = new WebSocket(created.input_ws_url);
  page.input = ws;
  ws.ready = false;
  ws.onopen = () => ws.send(JSON.stringify({ type: "auth", token: created.input_token }));
  ws.onmessage = (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.authenticated) {
      ws.ready = true;
      page.inputAttempt = 0;
      page.unanswered = [];
      for (const item of page.outbox.splice(0)) sendItem(item); // resent with their ids: stored once
      showConnection();
      return;
    }
    if (!ws.ready) return refused(msg.error);
    answered(page.unanswered.shift(), msg);
  };
  ws.onclose = (ev) => {
    if (page.input !== ws) return;
    for (const sent of page.unanswered.splice(0)) page.outbox.push(sent); // unanswered: maybe not stored
    showConnection();
    if (ev.code === 4401 || page.refused) return;
    setTimeout(() => { if (page.input === ws) { page.reconnects++; connectInput(); } },
               sf.backoff(page.inputAttempt++));
  };
}

function send(kind, data, label) {
  const row = sf.el("li");
  row.append(sf.el("span", new Date().toLocaleTimeString(), "t"), sf.el("span", label), sf.el("span", " · "),
             sf.el("span", "sending…", "dim"));
  if (label !== null) $("sent").prepend(row);
  sendItem({ body: { kind, data, id: crypto.randomUUID() }, row, at: 0 });
}

function answered(sent, msg) {
  if (!sent) return;
  page.pending.delete(sent.body.id);
  if (msg.seq !== undefined) {
    page.sentAt.set(msg.seq, sent.at);
    sent.row.lastChild.textContent = `seq ${msg.seq}${msg.duplicate ? " (resent)" : ""}`;
  } else if (msg.error) {
    sent.row.lastChild.textContent = `refused: ${msg.error.detail || msg.error.code}`;
    sent.row.lastChild.className = "bad";
  }
}

function sendItem(item) {
  if (page.rtc) {
    item.at = performance.now() / 1000;
    page.pending.set(item.body.id, item);
    return page.rtc.send(item.body);
  }
  const ws = page.input;
  if (!ws || !ws.ready || ws.readyState !== WebSocket.OPEN) { page.outbox.push(item); return; }
  item.at = performance.now() / 1000;
  page.unanswered.push(item);
  ws.send(JSON.stringify(item.body));
}

$("say-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("say").value;
  if (!text || !page.session) return;
  send("text", text, text);
  $("say").value = "";
});

// world: the keys held and the mouse's motion, sent as one action whenever they change
function sendAction() {
  const data = { keys: [...page.keys], mouse: page.mouse };
  page.mouse = [0, 0];
  send("action", data, null);
  for (const k of document.querySelectorAll("kbd[data-key]")) k.classList.toggle("down", page.keys.has(k.dataset.key));
}
for (const screen of [canvas, $("video")]) {
  screen.addEventListener("keydown", (ev) => keyChange(ev, true));
  screen.addEventListener("keyup", (ev) => keyChange(ev, false));
}
function keyChange(ev, down) {
  const key = WORLD_KEYS[ev.key.toLowerCase()];
  if (!key || !page.session || page.session.backend !== "world") return;
  ev.preventDefault();
  if (down === page.keys.has(key)) return; // auto-repeat
  if (down) page.keys.add(key); else page.keys.delete(key);
  sendAction();
}
canvas.addEventListener("mousemove", (ev) => {
  if (!ev.buttons || !page.session || page.session.backend !== "world") return;
  page.mouse = [page.mouse[0] + ev.movementX, page.mouse[1] + ev.movementY];
  if (!page.mouseTimer) page.mouseTimer = setTimeout(() => { page.mouseTimer = null; sendAction(); }, 50);
});

// ---------------------------------------------------------------- output (fence ingress /output)

function connectOutput() {
  const created = page.session;
  const ws = new WebSocket(created.output_ws_url);
  ws.binaryType = "arraybuffer";
  page.output = ws;
  ws.ready = false;
  ws.onopen = () => ws.send(JSON.stringify({ type: "auth", token: created.input_token }));
  ws.onmessage = (ev) => {
    page.wsBytes += typeof ev.data === "string" ? ev.data.length : ev.data.byteLength;
    if (typeof ev.data !== "string") return onChunk(sf.unpack(ev.data));
    const msg = JSON.parse(ev.data);
    if (msg.authenticated) { ws.ready = true; page.outputAttempt = 0; showConnection(); }
    else if (msg.owner) onOwner(msg.owner);
    else if (msg.notice) onNotice(msg.notice);
    else if (msg.error) refused(msg.error);
  };
  ws.onclose = (ev) => {
    if (page.output !== ws) return;
    showConnection();
    if (ev.code === 4401 || page.refused) return;
    // back with the last block shown remembered: anything at or below it that comes again is skipped
    setTimeout(() => { if (page.output === ws) { page.reconnects++; connectOutput(); } },
               sf.backoff(page.outputAttempt++));
  };
}

function refused(error) {
  page.refused = true;
  $("conn").textContent = `refused: ${(error && (error.detail || error.code)) || "unauthorized"}`;
  $("conn").className = "status bad";
}

function showConnection() {
  if (page.refused) return;
  const up = (ws) => ws && ws.ready && ws.readyState === WebSocket.OPEN;
  const both = (page.rtc && page.rtc.channel.readyState === "open") || (up(page.input) && up(page.output));
  $("conn").textContent = both ? "connected" : "reconnecting…";
  $("conn").className = `status ${both ? "ok" : "warn"}`;
  sf.setText("reconnects", page.reconnects);
}

function onOwner(owner) {
  const text = `${owner.server_id} v${owner.version} ${owner.closed ? "closed" : owner.claimed ? "claimed" : "assigned"}`;
  const changed = !page.owner || page.owner.server_id !== owner.server_id || page.owner.version !== owner.version;
  page.owner = owner;
  $("owner").textContent = text;
  const row = sf.el("li");
  row.append(sf.el("span", new Date().toLocaleTimeString(), "t"), sf.el("span", text, changed ? "" : "dim"));
  $("owners").prepend(row);
}

// Overload relief or failover acted on the session (a `SessionNotice`, docs/api.md): said in the owner log,
// where a move or a failover is, so a viewer whose output paused sees why (capacity_lost, orphaned:
// re-queued for room).
function onNotice(notice) {
  const row = sf.el("li");
  const text = notice.kind === "resumed" ? "resumed" : notice.reason || notice.kind;
  row.append(sf.el("span", new Date().toLocaleTimeString(), "t"),
             sf.el("span", text, notice.kind === "resumed" ? "" : "bad"));
  $("owners").prepend(row);
}

function onChunk(chunk) {
  if (chunk.kind !== "frames" && chunk.kind !== "audio") return; // e.g. input_rejected: no media to draw
  if (chunk.block <= page.lastBlock) { // shown already: a replay after a move or failover, or a resend
    if (chunk.part === 0 && chunk.kind === "frames") { page.replays++; sf.setText("replays", page.replays); }
    return;
  }
  let block = page.parts.get(chunk.block);
  if (!block) { block = { frames: [], audio: [], meta: chunk }; page.parts.set(chunk.block, block); }
  block[chunk.kind][chunk.part] = chunk;
  const complete = (list) => {
    const got = list.filter(Boolean);
    return got.length > 0 && got.length === got[0].parts;
  };
  const hasAudio = page.session.backend === "avatar";
  if (!complete(block.frames) || (hasAudio && !complete(block.audio))) return;
  page.parts.delete(chunk.block);
  for (const b of page.parts.keys()) if (b < chunk.block) page.parts.delete(b); // never completed: gone
  showBlock(chunk.block, block);
}

async function showBlock(index, block) {
  page.lastBlock = index;
  const now = performance.now() / 1000;
  const meta = block.frames[0];
  if (page.lastArrival !== null) {
    const period = now - page.lastArrival;
    sf.setText("period-now", sf.ms(period));
    if (meta.media_s > 0) sf.setText("rtf", (period / meta.media_s).toFixed(2));
  }
  page.lastArrival = now;
  coverInputs(meta.input_seq, now);
  const [n, , h, w] = meta.shape;
  sf.setText("frame-size", `${w}×${h}`);
  // the block's time on screen is taken now, in block order, whatever order the decodes finish in
  const step = meta.media_s > 0 ? meta.media_s / n : 0;
  const start = Math.max(page.nextFrameAt, now);
  page.nextFrameAt = start + n * step;
  const heard = block.audio.length ? playAudio(block.audio, meta.media_s) : null;
  if (heard !== null) page.timing.skews.push((heard - start) * 1000); // audio start after first frame, ms
  page.blocksShown++;
  sf.setText("blocks", page.blocksShown);
  const images = await decodeFrames(block.frames, n, h, w);
  images.forEach((image, i) => page.frames.push({ at: start + i * step, image, block: index, first: i === 0 }));
  page.frames.sort((a, b) => a.at - b.at);
}

function decodeFrames(parts, n, h, w) {
  if (parts[0].encoding === "png") { // one PNG per frame: the browser decodes it
    return Promise.all(parts.map((p) => createImageBitmap(new Blob([p.data], { type: "image/png" }))));
  }
  // raw: the whole uint8 [F, 3, H, W] tensor cut into byte slices; rebuild each frame as RGBA
  const bytes = concat(parts.map((p) => p.data));
  const plane = h * w;
  const frames = [];
  for (let f = 0; f < n; f++) {
    const rgba = new ImageData(w, h);
    const base = f * 3 * plane;
    for (let i = 0; i < plane; i++) {
      rgba.data[4 * i] = bytes[base + i];
      rgba.data[4 * i + 1] = bytes[base + plane + i];
      rgba.data[4 * i + 2] = bytes[base + 2 * plane + i];
      rgba.data[4 * i + 3] = 255;
    }
    frames.push(createImageBitmap(rgba));
  }
  return Promise.all(frames);
}

function draw() {
  const now = performance.now() / 1000;
  let shown = null;
  while (page.frames.length && page.frames[0].at <= now) shown = page.frames.shift();
  if (page.frames.length && page.frames[page.frames.length - 1].at - now > MAX_BACKLOG_S) {
    page.frames.splice(0, page.frames.length - 1);
    page.nextFrameAt = now;
  }
  if (shown) {
    const at = performance.timeOrigin + now * 1000;
    if (!(shown.block in page.timing.shownAt)) page.timing.shownAt[shown.block] = at; // its first frame seen
    page.timing.frames.push([at, shown.at * 1000]); // [wall ms presented, ms it was due]
    if (page.timing.frames.length > 4000) page.timing.frames.shift();
    canvas.width = shown.image.width;
    canvas.height = shown.image.height;
    ctx2d.drawImage(shown.image, 0, 0);
  }
  requestAnimationFrame(draw);
}
requestAnimationFrame(draw);

// ---------------------------------------------------------------- audio (Web Audio, where the browser allows)

function startAudio() {
  if (page.audio || !window.AudioContext) return;
  try { page.audio = new AudioContext(); page.audio.resume(); } catch (e) { page.audio = null; }
}

function playAudio(parts, mediaS) {
  const bytes = concat(parts.map((p) => p.data));
  const samples = new Int16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >> 1);
  const rate = mediaS > 0 ? Math.round(samples.length / mediaS) : 16000;
  sf.setText("audio", `${(rate / 1000).toFixed(0)} kHz`);
  const ac = page.audio;
  if (!ac || ac.state !== "running" || !samples.length) return null;
  const buffer = ac.createBuffer(1, samples.length, rate);
  const out = buffer.getChannelData(0);
  for (let i = 0; i < samples.length; i++) out[i] = samples[i] / 32768;
  const source = ac.createBufferSource();
  source.buffer = buffer;
  source.connect(ac.destination);
  page.audioNext = Math.max(page.audioNext, ac.currentTime + 0.05);
  if (page.audioNext - ac.currentTime > MAX_BACKLOG_S) page.audioNext = ac.currentTime + 0.05;
  source.start(page.audioNext);
  const starts = performance.now() / 1000 + (page.audioNext - ac.currentTime); // on the page's clock
  page.audioNext += buffer.duration;
  return starts;
}

function concat(arrays) {
  const out = new Uint8Array(arrays.reduce((n, a) => n + a.length, 0));
  let at = 0;
  for (const a of arrays) { out.set(a, at); at += a.length; }
  return out;
}
