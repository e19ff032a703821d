"""Fence's ingress: bad ids, tokens and items get a typed 4xx problem+json, and nothing is stored."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import pytest

from tests.support.fence import fence, http, post, register, stored_items  # noqa: F401

# Control and Unicode line-break characters, each of which a `$`-anchored `re.match` or a NATS
# protocol line would treat specially.
BREAKS = ["\n", "\r", "\x00", "\u2028", "\u0085", "\r\n", " ", "\t", ".", "*", ">"]


@pytest.mark.parametrize("suffix", BREAKS)
async def test_ids_with_breaks_are_refused_before_any_lookup(nats_server, nc, fence, http, suffix):  # noqa: F811
    token = await register(nc, "s1")
    sid = quote("s1" + suffix, safe="")
    status, problem = await post(http, fence, sid, token, {"kind": "text", "data": "x"})
    assert (status, problem["code"]) == (400, "bad_request"), problem
    assert await stored_items(nc.jetstream(), "s1") == []


async def test_unknown_sessions_and_wrong_tokens_answer_alike(nats_server, nc, fence, http):  # noqa: F811
    token = await register(nc, "s1")
    unknown = await post(http, fence, "s2", token, {"kind": "text", "data": "x"})
    wrong = await post(http, fence, "s1", token[:-1] + ("A" if token[-1] != "A" else "B"), {"kind": "text", "data": "x"})
    assert unknown[0] == wrong[0] == 401
    assert {k: v for k, v in unknown[1].items() if k != "session_id"} == \
        {k: v for k, v in wrong[1].items() if k != "session_id"}


async def test_a_non_utf8_authorization_header_is_a_401_not_a_500(nats_server, nc, fence):  # noqa: F811
    await register(nc, "s1")
    reader, writer = await asyncio.open_connection("127.0.0.1", fence.http_port)
    body = b'{"kind":"text","data":"x"}'
    writer.write(b"POST /v1/sessions/s1/items HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\x80\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                 % (len(body), body))
    await writer.drain()
    head = (await reader.read()).split(b"\r\n\r\n", 1)[0]
    writer.close()
    assert head.startswith(b"HTTP/1.1 401") and b"application/problem+json" in head


async def test_items_the_backend_does_not_take_are_refused_at_ingress(nats_server, nc, fence, http):  # noqa: F811
    token = await register(nc, "s1", backend="avatar", input_kinds=["text"], max_input_bytes=8)
    cases = [({"kind": "json", "data": {"a": 1}}, 422, "unsupported_input"),
             ({"kind": "action", "data": {"keys": []}}, 422, "unsupported_input"),
             ({"kind": "text", "data": "ü" * 5}, 413, "too_large"),  # 5 chars, 10 UTF-8 bytes
             ]
    for body, status, code in cases:
        got, problem = await post(http, fence, "s1", token, body)
        assert (got, problem["code"]) == (status, code), (body, problem)
    assert await stored_items(nc.jetstream(), "s1") == []
    escaped = b'{"kind": "text", "data": "' + b"\\u00fc" * 4 + b'"}'  # 24 bytes of JSON, 8 of text
    assert await post(http, fence, "s1", token, escaped) == (200, {"session_id": "s1", "seq": 1})
