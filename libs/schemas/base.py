"""Base message type and the codec every subject uses."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import msgspec

from libs.errors import SchemaError, UnsupportedVersion


class Msg(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Base of every bus message. `v` is the schema version the sender wrote.

    Unknown fields are ignored so an older reader accepts a newer writer that
    only added fields; a `v` above `V_MAX` is refused with a typed error.
    """

    V_MAX: ClassVar[int] = 1
    v: int = 1


M = TypeVar("M")

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def encode(msg: Msg) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes, typ: type[M]) -> M:
    """Decode `data` as `typ` (a Msg subclass or a tagged Union of them)."""
    dec = _decoders.get(typ)
    if dec is None:
        dec = _decoders[typ] = msgspec.msgpack.Decoder(typ)
    try:
        msg = dec.decode(data)
    except msgspec.DecodeError as e:  # ValidationError is a DecodeError
        raise SchemaError(f"malformed {_name(typ)}: {e}", expected=_name(typ)) from None
    check_version(msg)
    return msg


def check_version(msg: Any) -> None:
    v_max = getattr(type(msg), "V_MAX", None)
    if v_max is not None and not (1 <= msg.v <= v_max):
        raise UnsupportedVersion(
            f"{type(msg).__name__} v{msg.v} is not supported (1..{v_max})",
            message=type(msg).__name__,
            version=msg.v,
            supported_max=v_max,
        )


def _name(typ: Any) -> str:
    return getattr(typ, "__name__", None) or str(typ)
