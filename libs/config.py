"""One validated config object per service, from an optional TOML file and env vars.

Precedence: defaults < TOML file < environment (`SF_<FIELD>`, upper case).
Field names carry their units (`heartbeat_s`, `max_item_bytes`). A bad value
stops start-up with a `ConfigError` whose one-line message names the field.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from libs.errors import ConfigError

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]


class BaseConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Settings every service shares."""

    nats_url: str = "nats://127.0.0.1:4222"
    nats_connect_timeout_s: PositiveFloat = 2.0
    # The NATS user and password of this service (or put them in `nats_url`); see docs/operations.md.
    nats_user: str = ""
    nats_password: str = ""
    # TLS to NATS: the CA that signed the servers' certificates, and this client's certificate (mutual TLS).
    nats_tls_ca_file: str = ""
    nats_tls_cert_file: str = ""
    nats_tls_key_file: str = ""
    # JetStream replicas for the streams and buckets this service creates: 1 alone, 3 on a cluster.
    nats_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    instance_id: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_json: bool = True
    telemetry_exporter: Literal["none", "console", "otlp"] = "none"
    otlp_endpoint: str = ""
    heartbeat_s: PositiveFloat = 2.0
    # Prometheus `/metrics` (libs/metrics_http.py): -1 off, 0 any free port; `statefleet up` gives each a port.
    # Several instances on one machine: a per-instance `metrics_port_offset` (systemd: the unit's
    # instance number), and a port already taken falls back to a free one (logged, and advertised in
    # the instance's `sf_services` entry), so a second instance never fails to start over it.
    metrics_port: Annotated[int, msgspec.Meta(ge=-1, le=65535)] = -1
    metrics_port_offset: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    metrics_host: str = "127.0.0.1"


class HttpServerConfig(BaseConfig, kw_only=True):
    """Limits every HTTP/WebSocket front door shares (libs/http_limits.py, libs/ws_limits.py)."""

    http_max_connections: PositiveInt = 1024  # one more is answered 503 and closed
    http_head_timeout_s: PositiveFloat = 10.0  # a request head's first byte to its last (slowloris: 408)
    http_body_timeout_s: PositiveFloat = 30.0  # a request's body after its head (408)
    http_idle_timeout_s: PositiveFloat = 60.0  # a keep-alive connection with no request is closed
    ws_max_sockets: PositiveInt = 512  # open WebSockets; one more is refused 503 before the upgrade
    ws_idle_timeout_s: PositiveFloat = 300.0  # an input socket with no message is closed (4408)
    ws_send_timeout_s: PositiveFloat = 10.0  # a send a client does not take within this drops it



C = TypeVar("C", bound=BaseConfig)
T = TypeVar("T")


def _field_names(cls: type) -> list[str]:
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        return list(cls.__struct_fields__)
    return list(cls.__dataclass_fields__)  # type: ignore[attr-defined]


def section(cfg: BaseConfig, prefix: str, cls: type[T]) -> T:
    """The settings named `<prefix><field>` as a `cls` (a dataclass or a msgspec Struct):
    `http_idle_timeout_s` → `idle_timeout_s`."""
    return cls(**{name: getattr(cfg, prefix + name) for name in _field_names(cls)})


def with_section(source: type[msgspec.Struct], prefix: str = "") -> Callable[[type[C]], type[C]]:
    """A class decorator: the config takes every field of `source` as `<prefix><field>`, with its type and
    default, so settings also used without a config (a simulator's, a pure policy's) are declared once,
    in `source`, and read back with `section(cfg, prefix, source)`."""
    def extend(cls: type[C]) -> type[C]:
        fields: list[tuple[str, Any, Any]] = []
        for f in msgspec.structs.fields(source):
            default = f.default if f.default is not msgspec.NODEFAULT else msgspec.field(
                default_factory=f.default_factory)
            fields.append((prefix + f.name, f.type, default))
        out = msgspec.defstruct(cls.__name__, fields, bases=(cls,), kw_only=True, module=cls.__module__)
        out.__doc__, out.__qualname__ = cls.__doc__, cls.__qualname__
        return out  # type: ignore[return-value]
    return extend


_FIELD_RE = re.compile(r"(?:at `\$\.|unknown field `)([A-Za-z0-9_]+)")


def load(cls: type[C], file: str | Path | None = None, env: Mapping[str, str] | None = None) -> C:
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    if file:
        try:
            data.update(tomllib.loads(Path(file).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"config file {file}: {e}", file=str(file)) from None
    known = set(cls.__struct_fields__)
    for key, value in env.items():
        if key.startswith("SF_") and key[3:].lower() in known:
            data[key[3:].lower()] = value
    try:
        return msgspec.convert(data, cls, strict=False)
    except msgspec.ValidationError as e:
        field = m.group(1) if (m := _FIELD_RE.search(str(e))) else "?"
        raise ConfigError(f"invalid config field '{field}': {e}", field=field) from None
