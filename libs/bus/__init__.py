"""The NATS bus: the only package that imports nats-py; everyone else uses `from libs import bus`.

Modules, each for one concern:
- `connection`: connect (user, inbox prefix, TLS, reconnect), `tls_context`, `redacted`;
- `provision`: idempotent `ensure_stream` / `ensure_kv` / `ensure_object_store`;
- `keyvalue`: KV reads (`kv_read`, `kv_entries`, `bucket`), compare-and-set (`kv_swap`, retried by
  callers up to `MAX_CAS_ATTEMPTS`), watches, purges;
- `jetstream`: stream reads (`last_msg`, `next_msg`), conditional `append`, `purge`, `read_object`;
- `rpc`: typed request/reply (`request`, `serve`); `events`: `publish`, `subscribe_events`;
- `failures`: the one module that names nats-py's exceptions; `retry`: `retry_transient`;
- `types`: nats-py's handle types under our names, for annotations (`bus.Client`, `bus.JetStream`,
  `bus.KeyValue`, `bus.KvEntry`, `bus.Message`, `bus.ObjectStore`, `bus.Subscription`, ...).

How failures surface (no module outside this package ever catches a nats-py exception):
- nothing there (no key, message, bucket or object) is None, not an error (`kv_read`, `last_msg`, ...);
- a compare-and-set that lost the race is False (`kv_swap`) or `Conflict` (`append`): read again, decide again;
- a request nothing serves, or a lost connection, is `Unavailable`; a request or read unanswered in time
  is `Timeout`;
- anything else the bus or the server says is `Unavailable` (retryable; a write that said so may or may
  not have landed). For a nats-py call without a wrapper here, `bus.unavailable(what)` turns what it
  raises into `Unavailable` (ours pass through) and `bus.quietly(op)` awaits an ending whose failure
  changes nothing (an unsubscribe, an ack). `bus.typed_error(e)` maps any exception to ours or None.
"""

from libs.bus.connection import (
    INITIAL_CONNECT_ATTEMPTS,
    RECONNECT_BUFFER_BYTES,
    RECONNECT_WAIT_S,
    connect,
    redacted,
    tls_context,
)
from libs.bus.events import publish, subscribe_events
from libs.bus.failures import BUS_ERRORS, quietly, typed_error, unavailable
from libs.bus.jetstream import append, last_msg, next_msg, purge, read_object
from libs.bus.keyvalue import (
    MAX_CAS_ATTEMPTS,
    bucket,
    kv_entries,
    kv_read,
    kv_swap,
    next_update,
    purge_key,
    watch,
)
from libs.bus.provision import StreamSpec, ensure_kv, ensure_object_store, ensure_stream
from libs.bus.retry import retry_transient
from libs.bus.rpc import ERROR_HEADER, Handler, error_reply, raise_error_reply, request, respond_error, serve
from libs.bus.types import (
    AckPolicy,
    Client,
    ConsumerConfig,
    DeliverPolicy,
    JetStream,
    KeyValue,
    KeyWatcher,
    KvEntry,
    Message,
    ObjectStore,
    RawStreamMsg,
    StreamInfo,
    Subscription,
)

__all__ = [
    "BUS_ERRORS", "ERROR_HEADER", "INITIAL_CONNECT_ATTEMPTS", "MAX_CAS_ATTEMPTS", "RECONNECT_BUFFER_BYTES",
    "RECONNECT_WAIT_S", "AckPolicy", "Client", "ConsumerConfig", "DeliverPolicy", "Handler", "JetStream",
    "KeyValue", "KeyWatcher", "KvEntry", "Message", "ObjectStore", "RawStreamMsg", "StreamInfo", "StreamSpec",
    "Subscription", "append", "bucket", "connect", "ensure_kv", "ensure_object_store", "ensure_stream",
    "error_reply", "kv_entries", "kv_read", "kv_swap", "last_msg", "next_msg", "next_update", "publish",
    "purge", "purge_key", "quietly", "raise_error_reply", "read_object", "redacted", "request",
    "respond_error", "retry_transient", "serve", "subscribe_events", "tls_context", "typed_error",
    "unavailable", "watch",
]
