from libs.fence import ownership
from libs.schemas.base import decode
from libs.schemas.common import SessionSummary
from tests.support.fence import engine, post, register
from tests.support.waiting import eventually


async def test_post_assign_claim_release(fence, nc, http, capsys):
    token = await register(nc, "s1")
    status, body = await post(http, fence, "s1", token, {"kind": "text", "data": "hi"})
    assert status == 200 and body["seq"] == 1
    assert (await post(http, fence, "s1", token[:-1], {"kind": "text", "data": "no"}))[0] == 401
    eng = await engine(nc, "e1")
    a = await ownership.assign(nc, "s1", "e1")
    lease = await eng.adopt("s1", a.version)
    for i in range(2, 6):
        status, body = await post(http, fence, "s1", token, {"kind": "action", "data": {"keys": ["w"], "i": i}})
        assert status == 200, body
    await eventually(lambda: eng.state["s1"] == [1, 2, 3, 4, 5])
    kv = await nc.jetstream().key_value("sf_sessions")
    summary = decode((await kv.get("s1")).value, SessionSummary)
    assert (summary.owner_server_id, summary.owner_version, summary.claimed, summary.backend) == \
        ("e1", a.version, True, "toy")
    await lease.report_applied(5)
    await eng.stop()
    out = capsys.readouterr()
    assert token not in out.out + out.err and token[:-1] not in out.out + out.err  # never logged
