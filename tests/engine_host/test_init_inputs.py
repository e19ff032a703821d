"""An engine host starts a session only from init inputs its backend declares, well formed."""

from __future__ import annotations

import pytest

from libs.errors import BadInitInput, UnsupportedInput
from libs.schemas.engine import OpenSession, RawImage
from services.engine_host.runtime import EngineRuntime


@pytest.mark.parametrize(("kw", "error", "field"), [
    ({"audio": b"\0\0" * 8}, UnsupportedInput, "audio"),  # dit starts from a prompt or an image
    ({"image": RawImage(width=2, height=2, rgb=b"\0" * 11)}, BadInitInput, "image"),
])
async def test_open_refuses_init_inputs_the_backend_does_not_take_and_holds_nothing(kw, error, field):
    rt = EngineRuntime("cpu", host_id="h")
    await rt.start()
    try:
        with pytest.raises(error) as e:
            await rt.open(OpenSession(session_id="s", backend="dit", seed=1, session_class="C3", **kw))
        assert e.value.fields["field"] == field and not rt.holds("s")
        info = await rt.open(OpenSession(session_id="s", backend="dit", seed=1, session_class="C3",
                                         image=RawImage(width=2, height=2, rgb=b"\0" * 12)))
        assert info.session_id == "s"
    finally:
        await rt.stop()
