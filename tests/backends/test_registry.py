"""The backend registry: entry points found lazily, clashes refused unless the config settles them."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from libs.errors import BadRequest, ConfigError
from services.engine_host.backends.registry import GROUP, Registry


def ep(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=GROUP)


def test_the_reference_backends_register_through_entry_points():
    reg = Registry()
    assert {"world", "avatar", "dit"} <= set(reg.names())
    assert reg.sources["dit"] == "services.engine_host.backends.dit:DitWorldBackend"
    assert reg.load("world").name == "world"
    with pytest.raises(BadRequest, match="unknown backend 'nope'"):
        reg.load("nope")


def test_a_name_two_distributions_claim_is_an_error_unless_the_config_picks_one():
    claims = [ep("world", "services.engine_host.backends.world:WorldBackend"),
              ep("world", "other_pkg.models:World"), ep("avatar", "services.engine_host.backends.avatar:AvatarBackend")]
    with pytest.raises(ConfigError, match="world") as e:
        Registry(discovered=claims)
    assert "other_pkg.models:World" in str(e.value.clashes)
    reg = Registry({"world": "services.engine_host.backends.world:WorldBackend"}, discovered=claims)
    assert reg.load("world").name == "world" and reg.names() == ["avatar", "world"]
    with pytest.raises(ConfigError, match="module:Class"):
        Registry({"x": "no_colon"}, discovered=[])


def test_a_backend_that_does_not_load_or_lacks_the_interface_is_a_config_error():
    reg = Registry(discovered=[ep("gone", "no_such_module_xyz:Model"), ep("odd", "json:JSONDecoder")])
    with pytest.raises(ConfigError, match="does not load"):
        reg.load("gone")
    with pytest.raises(ConfigError, match="lacks"):
        reg.load("odd")


def test_the_cli_imports_no_backend():
    code = ("import sys, statefleet.cli, statefleet.backends; "
            "print(sorted(m for m in sys.modules if m.startswith('services.engine_host') or m == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
