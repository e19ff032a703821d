from libs.fence import ownership
from tests.fence.conftest import engine, post, register, wait_for


async def test_post_assign_claim_release(fence, nc, http):
    token = await register(nc, "s1")
    status, body = await post(http, fence, "s1", token, {"kind": "text", "data": "hi"})
    assert status == 200 and body["seq"] == 1
    eng = await engine(nc, "e1")
    a = await ownership.assign(nc, nc.jetstream(), "s1", "e1")
    await eng.adopt("s1", a.version)
    for i in range(2, 6):
        status, body = await post(http, fence, "s1", token, {"kind": "action", "data": {"keys": ["w"], "i": i}})
        assert status == 200, body
    await wait_for(lambda: eng.state["s1"] == [1, 2, 3, 4, 5])
    await eng.stop()
