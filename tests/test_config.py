"""Config loading: precedence, and one clear line naming a bad field."""

from __future__ import annotations

import pytest

from libs import config
from libs.errors import ConfigError
from services.engine_host.service import EngineHostConfig


def test_env_overrides_file_overrides_defaults(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('heartbeat_s = 5.0\ndevice = "cpu"\nhost_id = "from-file"\n')
    cfg = config.load(EngineHostConfig, f, env={"SF_HOST_ID": "from-env", "PATH": "/bin"})
    assert (cfg.heartbeat_s, cfg.host_id, cfg.device) == (5.0, "from-env", "cpu")
    assert cfg.nats_url == "nats://127.0.0.1:4222"


@pytest.mark.parametrize(
    ("env", "field"),
    [({"SF_HEARTBEAT_S": "-1"}, "heartbeat_s"), ({"SF_NATS_REPLICAS": "three"}, "nats_replicas"),
     ({"SF_LOG_LEVEL": "loud"}, "log_level")],
)
def test_bad_env_value_names_the_field(env, field):
    with pytest.raises(ConfigError) as e:
        config.load(EngineHostConfig, env=env)
    assert e.value.field == field and field in str(e.value) and "\n" not in str(e.value)


def test_unknown_key_in_file_is_named(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("heartbeet_s = 1\n")
    with pytest.raises(ConfigError, match="heartbeet_s"):
        config.load(EngineHostConfig, f, env={})


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="missing.toml"):
        config.load(EngineHostConfig, tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("x = = 1")
    with pytest.raises(ConfigError, match="bad.toml"):
        config.load(EngineHostConfig, bad, env={})
