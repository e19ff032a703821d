"""Schema round-trips, rejection of malformed payloads and of unknown versions."""

from __future__ import annotations

from typing import ClassVar

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs import errors
from libs.schemas.base import Msg, decode, encode
from libs.schemas.common import EngineEntry, ErrorReply, Pong, ServiceEntry

text = st.text(max_size=40)
finite = st.floats(allow_nan=False, allow_infinity=False)


@given(st.builds(Pong, service=text, instance=text, version=text, uptime_s=finite))
def test_pong_round_trips(msg):
    assert decode(encode(msg), Pong) == msg


@given(st.builds(EngineEntry, host_id=text, device=text, memory_bytes=st.integers(0, 2**62),
                 free_memory_bytes=st.integers(0, 2**62), sessions=st.integers(0, 10**6)))
def test_engine_entry_round_trips(msg):
    assert decode(encode(msg), EngineEntry) == msg


@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_escape_as_untyped_errors(data):
    try:
        decode(data, ServiceEntry)
    except errors.SchemaError:
        pass


def test_missing_field_is_a_schema_error_naming_the_type():
    with pytest.raises(errors.SchemaError, match="ServiceEntry") as e:
        decode(msgspec.msgpack.encode({"v": 1, "service": "x"}), ServiceEntry)
    assert isinstance(e.value, ValueError)


def test_wrong_type_is_a_schema_error():
    with pytest.raises(errors.SchemaError):
        decode(msgspec.msgpack.encode({"v": 1, "code": 5, "detail": "d"}), ErrorReply)


def test_newer_version_is_refused_with_a_typed_error():
    with pytest.raises(errors.UnsupportedVersion) as e:
        decode(encode(Pong(v=7, service="s", instance="i", version="x", uptime_s=1.0)), Pong)
    assert e.value.version == 7 and e.value.supported_max == 1


def test_unknown_fields_from_a_newer_writer_are_ignored():
    data = msgspec.msgpack.encode({"v": 1, "service": "s", "instance": "i", "version": "x",
                                   "uptime_s": 1.0, "added_later": [1, 2]})
    assert decode(data, Pong).service == "s"


class V2(Msg):
    V_MAX: ClassVar[int] = 2
    a: int
    b: int = 0  # added in v2 with a default: a v1 payload still decodes


def test_field_added_with_default_reads_old_payloads():
    old = msgspec.msgpack.encode({"v": 1, "a": 3})
    assert decode(old, V2) == V2(v=1, a=3, b=0)


class Left(Msg, tag="left"):
    x: int


class Right(Msg, tag="right"):
    y: str


def test_tagged_union_decodes_each_kind_and_rejects_unknown_tags():
    assert decode(encode(Left(x=1)), Left | Right) == Left(x=1)
    assert decode(encode(Right(y="a")), Left | Right) == Right(y="a")
    with pytest.raises(errors.SchemaError):
        decode(msgspec.msgpack.encode({"type": "nope", "v": 1}), Left | Right)
