"""A randomized campaign against a real stack: admission, placement and fence on a real nats-server,
with a control session served by an engine throughout.

Hypothesis drives a state machine whose rules create, read, delete and feed sessions (ids linked
from create to the later calls) and mix in hostile requests: ids with control and Unicode
line-break characters, wrong and non-UTF-8 tokens, huge, deeply nested and mis-encoded bodies.
After every step: no 5xx, every 4xx is problem+json; at the end no service lost its NATS
connection, and the control session applied every item it was sent, in order.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import quote

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from libs.fence.ownership import assign
from services.admission.service import AdmissionConfig
from tests.support.fence import engine, register
from tests.support.threaded_stack import ThreadedStack

ADMIN = "campaign-admin-token"
RESET = 0  # the connection was closed on a request that was not HTTP or whose body was too large
BREAKS = ["\n", "\r", "\x00", "\u2028", "\u0085", "\r\n", "%", "/", ".", " "]


class Stack(ThreadedStack):
    """The shared threaded stack with fence, and a control session registered, claimed by a real consumer
    and fed throughout."""

    def __init__(self, store_dir) -> None:
        super().__init__(store_dir, busy={"h0": 0.2}, fence=dict(http_port=0, log_json=False, max_item_bytes=4096),
                         admission=lambda url: AdmissionConfig(
                             nats_url=url, http_port=0, admin_token=ADMIN, api_keys={"acme": "acme-key"},
                             max_sessions_per_tenant=3, queue_capacity=4, queue_timeout_s=1.0,
                             reservation_settle_s=1.0, log_json=False))

    async def _start(self) -> None:
        await super()._start()
        self.control_token = await register(self.nc, "control", backend="avatar", input_kinds=["text"])
        self.toy = await engine(self.nc, "toy")
        await assign(self.nc, "control", "toy")
        await self.toy.adopt("control", 1)

    async def _stop(self) -> None:
        await self.toy.stop()
        await super()._stop()

    def connected(self) -> dict[str, bool]:
        return {s.name: s.nc.is_connected and s.nc.stats["reconnects"] == 0
                for s in (self.fence, self.admission, self.placement)}


def raw_http(port: int, method: str, path: str, headers: dict[str, bytes], body: bytes = b"") -> tuple[int, bytes, bytes]:
    """One request as raw bytes (so headers may be anything); returns (status, head, body)."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close",
             b"Content-Length: " + str(len(body)).encode()]
    lines += [k.encode() + b": " + v for k, v in headers.items()]
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        try:
            s.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
            while chunk := s.recv(65536):
                data += chunk
        except (ConnectionResetError, BrokenPipeError):
            # the server answered (or refused) before reading a large body, then closed
            if not data and len(body) < 65536 and all(0x20 <= b < 0x7F for v in headers.values() for b in v):
                raise
    if not data:
        return RESET, b"", b""
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, rest


def contract() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"session_class": st.sampled_from(["C1", "C3"]),
                                  "quality_floor": st.sampled_from([1, 4, 16, 64]),
                                  "determinism": st.sampled_from(["T0", "T1", "T2"])})


tokens = st.one_of(st.just(ADMIN.encode()), st.just(b"acme-key"), st.just(b"wrong"),
                   st.binary(min_size=1, max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b))
hostile_ids = st.one_of(st.sampled_from(["x" * 200, "..", "a.b", "*", ">"]),
                        st.builds(lambda c, b: "a" * 31 + c + b, st.sampled_from(BREAKS), st.sampled_from(["", "f"])),
                        st.text(min_size=1, max_size=40))
json_values = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                           max_leaves=20)
bodies = st.one_of(json_values.map(lambda v: json.dumps(v).encode()),
                   st.integers(100, 100_000).map(lambda n: b"[" * n + b"]" * n),  # deeply nested
                   st.integers(100, 100_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
                   st.just(b'{"kind": "text", "data": "' + b"x" * 300_000 + b'"}'),  # huge
                   st.binary(max_size=200),  # mis-encoded
                   st.just(b'{"kind": "text", "data": "\xff\xfe"}'))


class Campaign(RuleBasedStateMachine):
    stack: Stack
    sessions = Bundle("sessions")

    def __init__(self) -> None:
        super().__init__()
        self.control_sent = 0

    def _check(self, status: int, head: bytes, what: str, token: bytes = b"") -> None:
        assert status < 500, (what, status, head)
        # A header with control bytes is no HTTP request: aiohttp's parser answers it (a plain 400)
        # before any handler runs. Everything that parses gets problem+json.
        if status >= 400 and all(0x20 <= b < 0x7F for b in token):
            assert b"application/problem+json" in head, (what, head)

    @rule(target=sessions, c=contract(), backend=st.sampled_from(["avatar", "world", "avatar\n", "nope"]),
          token=tokens)
    def create(self, c, backend, token):
        body = json.dumps({"contract": c, "backend": backend}).encode()
        status, head, rest = raw_http(self.stack.admission.http_port, "POST", "/v1/sessions",
                                      {"Authorization": b"Bearer " + token, "Content-Type": b"application/json"}, body)
        self._check(status, head, "create", token)
        created = json.loads(rest) if status in (201, 202) else {}
        return (created.get("session_id", "0" * 32), created.get("input_token", ""))

    @rule(s=sessions, token=tokens, method=st.sampled_from(["GET", "DELETE"]))
    def read_or_delete(self, s, token, method):
        status, head, _ = raw_http(self.stack.admission.http_port, method, f"/v1/sessions/{s[0]}",
                                   {"Authorization": b"Bearer " + token})
        self._check(status, head, method, token)

    @rule(s=sessions, body=bodies, own_token=st.booleans())
    def feed(self, s, body, own_token):
        token = s[1].encode() if own_token and s[1] else b"nope-nope-nope-nope"
        status, head, _ = raw_http(self.stack.fence.http_port, "POST", f"/v1/sessions/{s[0]}/items",
                                   {"Authorization": b"Bearer " + token, "Content-Type": b"application/json"}, body)
        self._check(status, head, "feed", token)

    @rule(sid=hostile_ids, token=tokens, body=bodies, front=st.sampled_from(["fence", "admission"]))
    def hostile(self, sid, token, body, front):
        port = (self.stack.fence if front == "fence" else self.stack.admission).http_port
        path = f"/v1/sessions/{quote(sid, safe='')}" + ("/items" if front == "fence" else "")
        method = "POST" if front == "fence" else "GET"
        status, head, _ = raw_http(port, method, path, {"Authorization": b"Bearer " + token}, body)
        self._check(status, head, f"hostile {front} {sid!r}", token)

    @rule(text=st.text(max_size=40))
    def control_item(self, text):
        body = json.dumps({"kind": "text", "data": text}).encode()
        status, head, rest = raw_http(self.stack.fence.http_port, "POST", "/v1/sessions/control/items",
                                      {"Authorization": b"Bearer " + self.stack.control_token.encode()}, body)
        assert status == 200, (status, rest)
        self.control_sent += 1
        self.stack.control_base = json.loads(rest)["seq"]

    @invariant()
    def services_stay_connected(self):
        assert all(self.stack.connected().values()), self.stack.connected()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("nats"))
    s.control_base = 0
    yield s
    s.stop()


def test_randomized_campaign_finds_no_5xx_no_disconnect_and_the_control_session_keeps_serving(stack):
    Campaign.stack = stack
    runner = Campaign.TestCase
    runner.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
    started = time.monotonic()
    runner().runTest()
    sent = stack.run(_stored_seq(stack))
    assert sent > 0  # the control session was fed while the campaign ran

    async def applied() -> list[int]:
        for _ in range(200):
            if len(stack.toy.state["control"]) == sent:
                break
            await asyncio.sleep(0.05)
        return stack.toy.state["control"]

    assert stack.run(applied()) == list(range(1, sent + 1))  # every item, once, in order
    assert all(stack.connected().values())
    assert time.monotonic() - started < 60


async def _stored_seq(stack) -> int:
    return stack.fence.appender.last_seq("control") or 0
