// Shared by the session page and the dashboard: DOM helpers that only ever set text (never HTML),
// a msgpack reader for the engine's OutputChunk frames, and number formatting.
"use strict";

const sf = {};

// An element with text content only: whatever a user typed is shown as text, never parsed as markup.
sf.el = function (tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
};

sf.setText = function (id, text) {
  document.getElementById(id).textContent = String(text);
};

sf.ms = (s) => (s === null || s === undefined || !isFinite(s) ? "–" : `${(s * 1000).toFixed(0)} ms`);
sf.pct = (x) => (isFinite(x) ? `${(x * 100).toFixed(0)} %` : "–");
sf.bytes = function (n) {
  if (!isFinite(n) || n <= 0) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
};
sf.clock = (t) => new Date(t * 1000).toLocaleTimeString();

// The wire's msgpack (msgspec writes structs as maps): enough of the format for what the engine sends.
sf.unpack = function (buffer) {
  const bytes = new Uint8Array(buffer);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const utf8 = new TextDecoder();
  let at = 0;
  const take = (n) => { const out = bytes.subarray(at, at + n); at += n; return out; };
  const u8 = () => view.getUint8(at++);
  const u16 = () => { const v = view.getUint16(at); at += 2; return v; };
  const u32 = () => { const v = view.getUint32(at); at += 4; return v; };
  const array = (n) => { const out = []; for (let i = 0; i < n; i++) out.push(read()); return out; };
  const map = (n) => { const out = {}; for (let i = 0; i < n; i++) { const k = read(); out[k] = read(); } return out; };
  function read() {
    const b = u8();
    if (b <= 0x7f) return b;
    if (b >= 0xe0) return b - 0x100;
    if ((b & 0xf0) === 0x80) return map(b & 0x0f);
    if ((b & 0xf0) === 0x90) return array(b & 0x0f);
    if ((b & 0xe0) === 0xa0) return utf8.decode(take(b & 0x1f));
    switch (b) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return take(u8());
      case 0xc5: return take(u16());
      case 0xc6: return take(u32());
      case 0xca: { const v = view.getFloat32(at); at += 4; return v; }
      case 0xcb: { const v = view.getFloat64(at); at += 8; return v; }
      case 0xcc: return u8();
      case 0xcd: return u16();
      case 0xce: return u32();
      case 0xcf: { const v = Number(view.getBigUint64(at)); at += 8; return v; }
      case 0xd0: { const v = view.getInt8(at); at += 1; return v; }
      case 0xd1: { const v = view.getInt16(at); at += 2; return v; }
      case 0xd2: { const v = view.getInt32(at); at += 4; return v; }
      case 0xd3: { const v = Number(view.getBigInt64(at)); at += 8; return v; }
      case 0xd9: return utf8.decode(take(u8()));
      case 0xda: return utf8.decode(take(u16()));
      case 0xdb: return utf8.decode(take(u32()));
      case 0xdc: return array(u16());
      case 0xdd: return array(u32());
      case 0xde: return map(u16());
      case 0xdf: return map(u32());
      default: throw new Error(`msgpack type 0x${b.toString(16)} is not used on this wire`);
    }
  }
  return read();
};

// Reconnect delays: quick at first, then up to 5 s.
sf.backoff = (attempt) => Math.min(5000, 250 * 2 ** Math.min(attempt, 5));
