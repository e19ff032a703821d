"""Idempotent provisioning: streams, key-value buckets and object stores, created or opened."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import structlog
from nats.js import api

from libs.bus import failures
from libs.bus.types import JetStream, KeyValue, ObjectStore, StreamInfo

log = structlog.get_logger("statefleet.bus")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: list[str]
    max_age_s: float | None = None
    max_msgs_per_subject: int = -1
    replicas: int = 1
    # A full stream refuses new messages (the writer gets a retryable error) rather than dropping old
    # ones, which may be what a live session still needs (see docs/configuration.md, retention).
    max_bytes: int = -1


async def ensure_stream(js: JetStream, spec: StreamSpec) -> StreamInfo:
    """Create the stream, or bring an existing one to `spec`. Safe to run any number of times.
    Any other refusal or bus failure is `Unavailable`."""
    config = api.StreamConfig(
        name=spec.name,
        subjects=spec.subjects,
        storage=api.StorageType.FILE,
        max_age=spec.max_age_s,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_bytes=spec.max_bytes,
        discard=api.DiscardPolicy.NEW if spec.max_bytes > 0 else api.DiscardPolicy.OLD,
        num_replicas=spec.replicas,
        allow_direct=True,
    )
    return await _create_or_open(lambda: js.add_stream(config), lambda: js.update_stream(config),
                                 f"stream {spec.name} not provisioned")


async def ensure_kv(
    js: JetStream, bucket: str, *, ttl_s: float | None = None, history: int = 1, replicas: int = 1,
    max_bytes: int = -1,
) -> KeyValue:
    """Create the KV bucket, or open it if it exists (its settings are left as they are). A bucket
    at `max_bytes` refuses new writes."""
    async def open_existing() -> KeyValue:
        log.info("kv_exists_with_other_settings", bucket=bucket)
        return await js.key_value(bucket)

    return await _create_or_open(
        lambda: js.create_key_value(bucket=bucket, ttl=ttl_s, history=history, replicas=replicas,
                                    max_bytes=max_bytes),
        open_existing, f"bucket {bucket} not provisioned")


async def ensure_object_store(js: JetStream, bucket: str, *, replicas: int = 1) -> ObjectStore:
    return await _create_or_open(lambda: js.create_object_store(bucket=bucket, replicas=replicas),
                                 lambda: js.object_store(bucket), f"object store {bucket} not provisioned")


async def _create_or_open(create: Callable[[], Awaitable[T]], open_existing: Callable[[], Awaitable[T]],
                          what: str) -> T:
    """`create()`, or `open_existing()` when the name is in use; any other refusal or bus failure is
    `Unavailable`."""
    try:
        return await create()
    except failures.BUS_ERRORS as e:
        if not failures.is_name_in_use(e):
            raise failures.unanswered(e, what) from None
    try:
        return await open_existing()
    except failures.BUS_ERRORS as e:
        raise failures.unanswered(e, what) from None
