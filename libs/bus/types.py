"""nats-py's handle types under our names, for annotations and the few settings objects callers build.

Everyone outside `libs/bus/` annotates with these (`bus.Client`, `bus.JetStream`, ...) so that only this
package imports nats-py. `Message` is a delivered NATS message (nats-py's `Msg`): not `Msg`, which is the
base of our own schemas (`libs.schemas.base.Msg`).
"""

from __future__ import annotations

from nats.aio.client import Client
from nats.aio.msg import Msg as Message
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext as JetStream
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RawStreamMsg, StreamInfo
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

# A key's entry and a bucket watcher, as `KeyValue` names them.
KvEntry = KeyValue.Entry
KeyWatcher = KeyValue.KeyWatcher

__all__ = [
    "AckPolicy", "Client", "ConsumerConfig", "DeliverPolicy", "JetStream", "KeyValue", "KeyWatcher", "KvEntry",
    "Message", "ObjectStore", "RawStreamMsg", "StreamInfo", "Subscription",
]
