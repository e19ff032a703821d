"""Session init inputs through admission's create API: checked against what the backend's hosts
declare (typed 4xx, nothing registered), then stored in fence's metadata for any server that starts
the session, and kept out of fence's per-session ingress cache."""

from __future__ import annotations

import base64

import msgspec
import nats.js.errors
import pytest

from libs import bus, names
from libs.init_inputs import MAX_INIT_BYTES
from libs.schemas.base import decode
from libs.schemas.fence import MetaRequest, SessionMeta
from tests.support.admission import body, problem, records, sees
from tests.support.fleet_rows import rows


def image(w: int, h: int, extra: int = 0) -> dict:
    return {"width": w, "height": h, "rgb": base64.b64encode(bytes(range(256)) * (w * h * 3 // 256) +
                                                             bytes(w * h * 3 % 256 + extra)).decode()}


def takes(*kinds: str, max_init_bytes: int = 0) -> list:
    return [msgspec.structs.replace(r, init_kinds=list(kinds), max_init_bytes=max_init_bytes) for r in rows()]


async def test_an_image_the_backend_takes_is_stored_with_the_session_at_fence(http, admission, fleet, fence):
    await fleet.beat("h0", profile=takes("prompt", "image"))
    await sees(admission)
    pcm = b"\x01\x00" * 10
    resp = await http.post("/v1/sessions", json={**body(), "image": image(64, 32)})
    assert resp.status == 201, await resp.text()
    sid = (await resp.json())["session_id"]
    meta = await bus.request(admission.nc, names.FENCE_META, MetaRequest(session_id=sid, init_media=True),
                             SessionMeta)
    assert (meta.image.width, meta.image.height) == (64, 32)
    assert base64.b64encode(meta.image.rgb).decode() == image(64, 32)["rgb"] and meta.prompt == "a quiet harbour"
    plain = await bus.request(admission.nc, names.FENCE_META, MetaRequest(session_id=sid), SessionMeta)
    assert plain.image is None and plain.contract == meta.contract  # what placement and the lease loops read
    kv = await admission.js.key_value(names.FENCE_META_BUCKET)
    record = decode((await kv.get(sid)).value, SessionMeta)  # what every checkpoint rewrites: no media
    assert record.image is None and record.init_media_bytes == 64 * 32 * 3
    assert fence.sessions._cache[sid].image is None  # nor what ingress keeps per session
    # audio the backend does not start from: refused by name, nothing registered or recorded
    before = set(await records(admission))
    p = await problem(await http.post("/v1/sessions", json={**body(), "audio": base64.b64encode(pcm).decode()}), 422)
    assert (p["code"], p["field"]) == ("unsupported_input", "audio")
    assert set(await records(admission)) == before and admission.core.waiting() == []
    assert (await http.delete(f"/v1/sessions/{sid}")).status == 204
    with pytest.raises(nats.js.errors.KeyNotFoundError):  # a closed session's media are freed
        await kv.get(names.init_media_key(sid))


async def test_malformed_and_oversized_init_inputs_get_typed_errors(http, admission, fleet):
    await fleet.beat("h0", profile=takes("prompt", "image", "audio", max_init_bytes=4096))
    await sees(admission)
    p = await problem(await http.post("/v1/sessions", json={**body(), "image": image(8, 8, extra=1)}), 422)
    assert (p["code"], p["field"]) == ("bad_init_input", "image")  # width·height·3 bytes, not one more
    p = await problem(await http.post("/v1/sessions", json={**body(), "audio": base64.b64encode(b"\0" * 3).decode()}),
                      422)
    assert (p["code"], p["field"]) == ("bad_init_input", "audio")  # whole int16 samples
    p = await problem(await http.post("/v1/sessions", json={**body(), "image": image(0, 0)}), 400)
    assert p["field"].startswith("image")  # a schema error: no empty image
    p = await problem(await http.post("/v1/sessions", json={**body(), "image": image(40, 40)}), 413)
    assert p["field"] == "image"  # 4800 bytes: over what this backend's hosts take
    await fleet.beat("h0", profile=takes("prompt", "image", "audio"))
    side = int((MAX_INIT_BYTES / 3) ** 0.5) + 1
    p = await problem(await http.post("/v1/sessions", json={**body(), "image": image(side, side)}), 413)
    assert p["field"] == "image"  # over the bus-wide cap whatever a backend says
    assert await records(admission) == {}
