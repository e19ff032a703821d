"""State layouts: nested specs checked recursively, roles selected and grafted, and a backend that
rebinds or reshapes a leaf fails its session with an error naming the leaf."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import msgspec
import pytest
import torch

from libs.errors import Conflict, NotFound
from libs.schemas.engine import OpenSession, SessionInit
from services.engine_host.backends import spec as specs
from services.engine_host.backends.base import Output
from services.engine_host.backends.registry import Registry
from services.engine_host.runtime import EngineRuntime

SPEC = {
    "layers": [{"k": specs.TensorSpec(torch.float32, (2, 3)), "v": (torch.float32, (2, 3))} for _ in range(3)],
    "vae": [specs.TensorSpec(torch.float32, (4,), "rebuildable")],
    "ctx": specs.TensorSpec(torch.float32, (5,), "static"),
    "block": int,
}


def tree() -> dict:
    return {"layers": [{"k": torch.zeros(2, 3), "v": torch.ones(2, 3)} for _ in range(3)],
            "vae": [torch.full((4,), 2.0)], "ctx": torch.arange(5.0), "block": 7}


def test_nested_specs_are_checked_leaf_by_leaf_and_errors_name_the_leaf():
    specs.check(tree(), SPEC, torch.device("cpu"))
    bad = tree()
    bad["layers"][2]["v"] = torch.ones(2, 4)
    with pytest.raises(specs.StateLayoutError) as e:
        specs.check(bad, SPEC, None)
    assert e.value.leaf == "layers/2/v"
    missing = tree()
    missing["layers"][1]["k"] = None
    with pytest.raises(specs.StateLayoutError, match="layers/1/k"):
        specs.check(missing, SPEC, None)
    short = tree()
    short["layers"].pop()
    with pytest.raises(specs.StateLayoutError, match="layers"):
        specs.check(short, SPEC, None)
    wrong_scalar = tree() | {"block": 7.0}
    with pytest.raises(specs.StateLayoutError, match="block"):
        specs.check(wrong_scalar, SPEC, None)


def test_roles_count_select_and_graft_without_copying():
    assert specs.tensor_bytes(SPEC) == (6 * 6 + 4 + 5) * 4
    assert specs.tensor_bytes(SPEC, "moved") == 6 * 6 * 4 and specs.tensor_bytes(SPEC, "static") == 20
    live = tree()
    moved = specs.select(live, SPEC)
    assert set(moved) == {"layers", "vae", "block"} and moved["vae"] == [None]  # a list keeps its positions
    assert moved["layers"][0]["k"] is live["layers"][0]["k"]
    specs.check(moved, SPEC, None, roles=("moved",))
    with pytest.raises(specs.StateLayoutError, match="ctx"):
        specs.check(moved | {"ctx": torch.zeros(5)}, SPEC, None, roles=("moved",))
    fresh = {"layers": [{"k": torch.full((2, 3), 9.0), "v": torch.full((2, 3), 9.0)} for _ in range(3)],
             "vae": [torch.zeros(4)], "ctx": torch.arange(5.0), "block": 0}
    whole = specs.graft(fresh, moved, SPEC)
    assert whole["layers"][1]["v"] is live["layers"][1]["v"] and whole["vae"][0] is fresh["vae"][0]
    assert whole["block"] == 7 and whole["ctx"] is fresh["ctx"]


class _Config(msgspec.Struct, frozen=True):
    fault: str = ""  # "rebind" | "reshape" | "" (well behaved)


class FaultyBackend:
    """Writes its cache one way or another, per its config."""

    name: ClassVar[str] = "faulty"
    config_type: ClassVar[type] = _Config
    input_kinds = frozenset({"json"})
    batchable = False
    tiers = (1,)
    media_s_per_block = 0.1

    def __init__(self, config: _Config, device: torch.device) -> None:
        self.config, self.device = config, torch.device(device)

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    def state_spec(self) -> dict:
        return {"layers": [{"k": (torch.float32, (4, 2))} for _ in range(2)], "block": int}

    def init_state(self, seed: int, init: SessionInit) -> dict:
        return {"layers": [{"k": torch.zeros(4, 2)} for _ in range(2)], "block": 0}

    def parse_input(self, item):
        return item.data

    def encode(self, state, inputs):
        return None

    def denoise(self, state, carry, steps):
        return self.denoise_batch([state], [carry], steps)[0]

    def denoise_batch(self, states, carries, steps):
        for s in states:
            slot = s["block"] % 4
            if self.config.fault == "rebind" and s["block"] == 2:
                s["layers"][1]["k"] = s["layers"][1]["k"].roll(1, 0)  # a shift by clone: a new tensor
            elif self.config.fault == "reshape" and s["block"] == 2:
                s["layers"][0]["k"].resize_(8, 1)
            else:
                s["layers"][1]["k"][slot] = float(s["block"])
            s["block"] += 1
        return carries

    def decode(self, state, carry) -> Output:
        return Output(frames=torch.zeros(1, 3, 2, 2, dtype=torch.uint8))


@pytest.mark.parametrize("fault,leaf", [("rebind", "layers/1/k"), ("reshape", "layers/0/k")])
async def test_rebinding_or_reshaping_a_leaf_fails_the_session_naming_the_leaf(fault, leaf):
    registry = Registry({"faulty": f"{__name__}:FaultyBackend"}, discovered=[])
    rt = EngineRuntime("cpu", host_id="h", registry=registry,
                       backend_configs={"faulty": msgspec.msgpack.encode(_Config(fault=fault))})
    await rt.start()
    try:
        await rt.open(OpenSession(session_id="ok", backend="faulty", seed=1, session_class="C3"))
        await rt.advance("ok", 1)
        await rt.open(OpenSession(session_id="bad", backend="faulty", seed=1, session_class="C3"))
        await rt.advance("bad", 2)
        with pytest.raises(Conflict, match=leaf):
            await rt.advance("bad", 1)
        for _ in range(100):  # the failed session is closed in order, in the background
            if not rt.holds("bad"):
                break
            await asyncio.sleep(0.02)
        with pytest.raises(NotFound, match=leaf):
            rt.info("bad")
        await rt.advance("ok", 1)  # the host and its other sessions go on
    finally:
        await rt.stop()
