// The fleet dashboard: live snapshots over admission's feed socket (admin token in the first message),
// and operator actions (move a session) over HTTP with the token in the Authorization header.
// The token lives only in this page's memory.
"use strict";

const dash = { token: "", ws: null, attempt: 0, snapshot: null, refused: false, busy: new Set(), choice: {} };
window.sfDash = dash; // for the browser tests: read-only use

const $ = (id) => document.getElementById(id);

$("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  dash.token = $("token").value;
  $("token").value = "";
  dash.refused = false;
  connect();
});

// `statefleet up` prints this page's URL with the admin token in its fragment (#token=...), so one click
// signs in. A fragment never reaches a server, a log or a Referer (the page also sends no-referrer); it is
// taken into memory and removed from the address bar and history at once.
(function tokenFromFragment() {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  if (token) { dash.token = token; connect(); }
})();

function connect() {
  if (dash.ws) { dash.ws.onclose = null; dash.ws.close(); }
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/admin/feed`);
  dash.ws = ws;
  ws.onopen = () => ws.send(JSON.stringify({ type: "auth", token: dash.token }));
  ws.onmessage = (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.authenticated) { dash.attempt = 0; status("live", "ok"); }
    else if (msg.error) { dash.refused = true; status(`refused: ${msg.error.detail}`, "bad"); }
    else if (msg.snapshot) render(msg.snapshot);
  };
  ws.onclose = (ev) => {
    if (dash.ws !== ws || dash.refused || ev.code === 4401) return;
    status("reconnecting…", "warn");
    setTimeout(() => { if (dash.ws === ws) connect(); }, sf.backoff(dash.attempt++));
  };
}

function status(text, cls) {
  $("conn").textContent = text;
  $("conn").className = `status ${cls}`;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.append(c); else td.textContent = c === undefined || c === null ? "–" : String(c);
    tr.append(td);
  }
  return tr;
}

function bar(fraction) {
  const outer = sf.el("div", null, "bar");
  const inner = sf.el("div");
  inner.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  outer.append(inner);
  const wrap = sf.el("div");
  wrap.append(outer, sf.el("span", sf.pct(fraction), "dim"));
  return wrap;
}

function pill(text, cls) { return sf.el("span", text, `pill ${cls}`); }

const STATE_CLASS = { up: "ok", draining: "warn", dead: "bad" };
// Why a session is not plainly serving: overload relief's shed (capacity_lost: a C1 no device could keep,
// re-queued until one has room) as a pill, then the summary's reason in words.
const SHED_CLASS = { capacity_lost: "bad", overload: "warn" };

function why(s) {
  if (!s.shed && !s.reason) return "–";
  const text = sf.el("span", s.reason || "");
  if (!s.shed) return text;
  const cell = sf.el("span");
  cell.append(pill(s.shed, SHED_CLASS[s.shed] || "dim"), " ", text);
  return cell;
}

function render(snap) {
  dash.snapshot = snap;
  const live = snap.hosts.filter((h) => h.state === "up").map((h) => h.host_id);
  $("hosts").replaceChildren(...snap.hosts.map((h) => row([
    sf.el("span", h.host_id, "mono"), pill(h.state, STATE_CLASS[h.state] || "dim"), h.incarnation ?? "–", h.device,
    h.sessions, bar(h.busy_fraction || 0),
    `${sf.bytes(h.memory_bytes - h.free_memory_bytes)} / ${sf.bytes(h.memory_bytes)}`,
    `${h.heartbeat_age_s.toFixed(1)} s ago`, hostControl(h),
  ])));
  $("sessions").replaceChildren(...snap.sessions.map((s) => row([
    sf.el("span", s.session_id, "mono"), s.backend, s.session_class, s.state, s.owner_server_id,
    s.owner_version ? `v${s.owner_version}` : "–", why(s), moveControl(s, live),
  ])));
  $("inflight").replaceChildren(...snap.moves_in_flight.map((m) => row([
    sf.el("span", (m.session_id || "").slice(0, 12), "mono"), `${m.source} → ${m.dest}`, sf.clock(m.at),
  ])));
  $("receipts").replaceChildren(...snap.receipts.map((r) => row([
    sf.el("span", (r.session_id || "").slice(0, 12), "mono"), `${r.source} → ${r.dest}`,
    pill(r.outcome, r.outcome === "committed" ? "ok" : "bad"),
    r.outcome === "committed" ? `bit-identical, ${sf.bytes(r.state_bytes)}` : `failed closed: ${r.reason || "–"}`,
    sf.clock(r.at),
  ])));
  $("queue").replaceChildren(...snap.queue.entries.map((e) => row([
    e.position, sf.el("span", e.session_id.slice(0, 12), "mono"), `${(snap.at - e.enqueued_at).toFixed(1)} s`,
    `${Math.max(0, e.deadline - snap.at).toFixed(1)} s left`,
  ])));
  $("events").replaceChildren(...snap.events.map((e) => {
    const li = sf.el("li");
    li.append(sf.el("span", sf.clock(e.at), "t"), sf.el("span", `${e.kind}: ${e.text}`));
    return li;
  }));
}

function moveControl(session, live) {
  const wrap = sf.el("div", null, "row");
  const select = document.createElement("select");
  for (const h of live.filter((h) => h !== session.owner_server_id)) select.append(new Option(h, h));
  if (dash.choice[session.session_id]) select.value = dash.choice[session.session_id]; // kept across refreshes
  select.addEventListener("change", () => { dash.choice[session.session_id] = select.value; });
  const button = sf.el("button", "Move", "small");
  button.dataset.session = session.session_id;
  button.disabled = !select.options.length || dash.busy.has(session.session_id);
  button.addEventListener("click", () => move(session.session_id, select.value));
  wrap.append(select, button);
  return wrap;
}

function hostControl(host) {
  const draining = host.state === "draining" || host.state === "drained";
  const button = sf.el("button", draining ? "Undrain" : "Drain", "small");
  button.dataset.host = host.host_id;
  button.disabled = host.state === "dead" || dash.busy.has(host.host_id);
  button.addEventListener("click", () => drain(host.host_id, draining ? "undrain" : "drain"));
  return button;
}

// Drain moves every session off the host (live where admissible, else checkpoint + replay) and
// answers once the host is empty; undrain lets placement use it again.
async function drain(hostId, verb) {
  dash.busy.add(hostId);
  $("action").textContent = `${verb === "drain" ? "draining" : "undraining"} ${hostId}…`;
  try {
    const resp = await fetch(`/v1/admin/hosts/${encodeURIComponent(hostId)}/${verb}`, {
      method: "POST", headers: { Authorization: `Bearer ${dash.token}` },
    });
    const body = await resp.json();
    const moved = (body.outcomes || []).map((o) => `${o.session_id.slice(0, 8)}: ${o.outcome}`).join(", ");
    $("action").textContent = resp.ok
      ? `${hostId} ${body.state}${moved ? ` (${moved})` : ""}`
      : `${verb} refused: ${body.detail || resp.status}`;
    $("action").className = `hint ${resp.ok ? "ok" : "bad"}`;
  } catch (e) {
    $("action").textContent = `${verb} failed: ${e.message || e}`;
  } finally {
    dash.busy.delete(hostId);
  }
}

async function move(sessionId, dest) {
  dash.busy.add(sessionId);
  $("action").textContent = `moving ${sessionId} to ${dest}…`;
  try {
    const resp = await fetch(`/v1/admin/sessions/${encodeURIComponent(sessionId)}/move`, {
      method: "POST", headers: { "Content-Type": "application/json", Authorization: `Bearer ${dash.token}` },
      body: JSON.stringify({ to: dest }),
    });
    const body = await resp.json();
    $("action").textContent = resp.ok
      ? `${sessionId} → ${dest}: ${body.outcome}${body.reason ? ` (${body.reason})` : ""}`
      : `move refused: ${body.detail || resp.status}`;
    $("action").className = `hint ${resp.ok && body.outcome === "committed" ? "ok" : "bad"}`;
  } catch (e) {
    $("action").textContent = `move failed: ${e.message || e}`;
  } finally {
    dash.busy.delete(sessionId);
  }
}
