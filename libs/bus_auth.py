"""Who may do what on the bus: one NATS user per service (one per engine host) and its permissions.

Pure: `permissions(user)` is the table, `server_config(...)` renders it as a
nats-server `authorization` block. `statefleet up` writes one for its embedded
server (`write_auth`); production renders one with `statefleet nats-auth` and
keeps the passwords in each service's environment file.

The rules the table keeps:
- Fence alone publishes to the ownership log (`sf.session.>`) and the input stream; everyone
  else asks fence (`sf.fence.assign`, engines `sf.fence.claim`, ...).
- Engine host `h` serves only `sf.engine.h.>`, hears only its own assignment notices and
  writes only its own heartbeat key.
- Each user receives replies under its own inbox prefix (`names.inbox_prefix(user)`) and may
  subscribe to no other; answering a request goes through response permissions
  (`allow_responses`), so no client can read another's replies, which carry input tokens.
- JetStream API calls are allowed per stream: a service may create/update only the streams
  it provisions, and read (info, direct get, consumers, acks) only the ones it reads.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from libs import errors, names

CONTROL_USERS = ("fence", "admission", "placement", "mover")
# The operator's CLI (`statefleet status`, `session watch`, tests' probes): everything, like an admin.
CLI_USER = "cli"
_ENGINE_USER_PREFIX = "engine."


def engine_user(host_id: str) -> str:
    if not host_id or not all(c.isalnum() or c in "-_" for c in host_id):
        raise errors.BadRequest("host_id must be letters, digits, - and _", host_id=host_id[:64])
    return f"{_ENGINE_USER_PREFIX}{host_id}"


def user_for(service: str, host_id: str = "") -> str:
    """The NATS user a service instance connects as."""
    if service == "engine_host":
        return engine_user(host_id)
    if service in CONTROL_USERS or service == CLI_USER:
        return service
    raise errors.BadRequest(f"no NATS user for service {service!r}", service=service)


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = True


def _kv(bucket: str) -> str:
    return f"KV_{bucket}"


def _obj(bucket: str) -> str:
    return f"OBJ_{bucket}"


def _js_read(stream: str) -> list[str]:
    """Look at a stream: info, direct and stored-message gets, (ordered) consumers, acks."""
    api = "$JS.API"
    return [f"{api}.STREAM.INFO.{stream}", f"{api}.STREAM.MSG.GET.{stream}",
            f"{api}.DIRECT.GET.{stream}", f"{api}.DIRECT.GET.{stream}.>",
            f"{api}.CONSUMER.CREATE.{stream}", f"{api}.CONSUMER.CREATE.{stream}.>",
            f"{api}.CONSUMER.DURABLE.CREATE.{stream}.>", f"{api}.CONSUMER.INFO.{stream}.>",
            f"{api}.CONSUMER.DELETE.{stream}.>", f"{api}.CONSUMER.MSG.NEXT.{stream}.>",
            f"$JS.ACK.{stream}.>", f"$JS.FC.{stream}.>"]


def _js_create(stream: str) -> list[str]:
    """Create a stream its owner may not have created yet (an idempotent create) and read it."""
    return [f"$JS.API.STREAM.CREATE.{stream}", *_js_read(stream)]


def _js_admin(stream: str) -> list[str]:
    """Provision a stream (create or bring to spec) and purge it (object store deletes)."""
    api = "$JS.API"
    return [f"{api}.STREAM.CREATE.{stream}", f"{api}.STREAM.UPDATE.{stream}",
            f"{api}.STREAM.PURGE.{stream}", *_js_read(stream)]


def _common(user: str, service: str) -> list[str]:
    """Every service: account info, its own service heartbeat key."""
    return ["$JS.API.INFO", "$JS.API.STREAM.NAMES", *_js_admin(_kv(names.SERVICES_BUCKET)),
            f"$KV.{names.SERVICES_BUCKET}.{service}.>"]


def permissions(user: str) -> Permissions:
    inbox = f"{names.inbox_prefix(user)}.>"
    if user == CLI_USER:
        return Permissions(publish=(">",), subscribe=(">",))
    if user.startswith(_ENGINE_USER_PREFIX):
        host = user.removeprefix(_ENGINE_USER_PREFIX)
        publish = [
            *_common(user, "engine_host"),
            *_js_admin(_kv(names.ENGINES_BUCKET)), f"$KV.{names.ENGINES_BUCKET}.{host}",
            # its device's profile, shared with the device's other hosts (one key token: a device's hash)
            *_js_admin(_kv(names.DEVICE_PROFILES_BUCKET)), f"$KV.{names.DEVICE_PROFILES_BUCKET}.*",
            *_js_admin(_obj(names.CHECKPOINTS_BUCKET)), f"$O.{names.CHECKPOINTS_BUCKET}.>",
            *_js_read(names.SESSION_STREAM), *_js_read(_kv(names.FENCE_META_BUCKET)),
            *_js_read(_kv(names.SESSIONS_BUCKET)),
            # The block journal: a claimed owner appends (CAS, sealed by its successor) and purges up
            # to its latest checkpoint; the stream is fence's.
            *_js_read(names.BLOCK_STREAM), f"$JS.API.STREAM.PURGE.{names.BLOCK_STREAM}",
            names.BLOCK_JOURNAL_SUBJECTS,
            f"$KV.{names.FENCE_META_BUCKET}.*.applied",
            names.output_subject("*"),
            names.FENCE_META, names.FENCE_CLAIM, names.FENCE_CHECKPOINT, names.FENCE_KICK,
            names.engine_subject("*", ">"),  # the motion verbs it calls on the other side of a move
        ]
        subscribe = [inbox, names.engine_subject(host, ">"), names.assigned_subject(host)]
        return Permissions(tuple(publish), tuple(subscribe))
    table: dict[str, tuple[list[str], list[str]]] = {
        "fence": (
            [*_js_admin(names.SESSION_STREAM), *_js_admin(names.INPUT_STREAM), *_js_admin(names.BLOCK_STREAM),
             *_js_admin(_kv(names.FENCE_META_BUCKET)), *_js_admin(_kv(names.SESSIONS_BUCKET)),
             names.SESSION_LOG_SUBJECTS, names.INPUT_SUBJECTS,
             f"$KV.{names.FENCE_META_BUCKET}.>", f"$KV.{names.SESSIONS_BUCKET}.>",
             names.assigned_subject("*"), names.FENCE_CLOSED, names.FENCE_KICK,
             names.notice_subject("*")],  # a session's notices, as it marks the summary (summaries.py)
            # a viewer's socket follows its session's output, owner changes and notices (egress.py)
            # and the gateway hears owners' applied cursors (releases are bounded by them: gateway.py)
            [names.service_subjects("fence"), names.output_subject("*"), names.SESSION_LOG_SUBJECTS,
             names.notice_subject("*"), names.APPLIED_SUBJECTS],
        ),
        "admission": (
            [*_js_admin(_kv(names.ADMISSION_BUCKET)), f"$KV.{names.ADMISSION_BUCKET}.>",
             *_js_create(_kv(names.ENGINES_BUCKET)), *_js_read(names.SESSION_STREAM),
             *_js_read(_kv(names.SESSIONS_BUCKET)),  # the sessions hint: fence writes it
             *_js_read(_kv(names.CAPACITY_BUCKET)),  # host lifecycle (draining, drained) for the dashboard
             # the dashboard's moves in flight (the mover's bucket) and their receipts (fleet_feed.py)
             *_js_read(_kv(names.MOVES_INFLIGHT_BUCKET)),
             names.FENCE_REGISTER, names.FENCE_CLOSE, names.FENCE_ASSIGN, names.PLACEMENT_PLACE,
             names.PLACEMENT_HOSTS, names.PLACEMENT_DRAIN, names.PLACEMENT_UNDRAIN],
            [names.ping_subject("admission"), names.MOVE_RECEIPT_SUBJECTS],
        ),
        "placement": (
            [*_js_create(_kv(names.ENGINES_BUCKET)), *_js_read(names.SESSION_STREAM),
             # its host records (reservations, drain state), CAS-written; the sessions hint it reads (fence
             # writes it, orphan marks included: `FENCE_MARK`)
             *_js_admin(_kv(names.CAPACITY_BUCKET)), f"$KV.{names.CAPACITY_BUCKET}.>",
             *_js_create(_kv(names.SESSIONS_BUCKET)),
             *_js_create(_kv(names.ADMISSION_BUCKET)),  # admission's queue: load the autoscaler counts
             # the block journal's tail, read only: the torch threads a stranded session's blocks ran at,
             # which failover and drain prefer a host at (`recorded_threads`)
             *_js_read(names.BLOCK_STREAM),
             names.FENCE_ASSIGN, names.FENCE_META, names.FENCE_MARK, names.MOVER_MOVE,
             # the fleet controller: its tenure, and the engine verbs it reads load from and offloads with
             *_js_admin(_kv(names.PLACEMENT_TENURE_BUCKET)), f"$KV.{names.PLACEMENT_TENURE_BUCKET}.>",
             *(names.engine_subject("*", verb) for verb in ("status", "suspend", "resume"))],
            [names.service_subjects("placement"), names.MOVE_RECEIPT_SUBJECTS],  # receipts: measured path rates
        ),
        "mover": (
            [*_js_admin(names.MOVES_STREAM), *_js_admin(_kv(names.MOVES_INFLIGHT_BUCKET)),
             f"$KV.{names.MOVES_INFLIGHT_BUCKET}.>", names.MOVE_RECEIPT_SUBJECTS,
             *_js_read(names.SESSION_STREAM), *_js_create(_kv(names.ENGINES_BUCKET)),
             *_js_read(_kv(names.SESSIONS_BUCKET)),
             names.FENCE_ASSIGN, names.FENCE_META, names.engine_subject("*", ">")],
            [names.service_subjects("mover")],
        ),
    }
    if user not in table:
        raise errors.BadRequest(f"unknown NATS user {user!r}", user=user)
    publish, subscribe = table[user]
    return Permissions(tuple([*_common(user, user), *publish]), tuple([inbox, *subscribe]))


@dataclass(frozen=True, slots=True)
class Credential:
    user: str
    password: str


@dataclass(frozen=True, slots=True)
class Tls:
    """Server TLS: certificate and key, and the CA clients' certificates must chain to (mutual TLS)."""

    cert_file: str
    key_file: str
    ca_file: str = ""


def server_config(credentials: list[Credential], tls: Tls | None = None) -> str:
    """A nats-server config fragment (its JSON-compatible syntax): users, permissions, TLS."""
    users = []
    for c in credentials:
        p = permissions(c.user)
        users.append({"user": c.user, "password": c.password, "permissions": {
            "publish": {"allow": list(p.publish)}, "subscribe": {"allow": list(p.subscribe)},
            **({"allow_responses": True} if p.allow_responses else {})}})
    lines = [f"authorization: {json.dumps({'users': users}, indent=2)}"]
    if tls is not None:
        block = {"cert_file": tls.cert_file, "key_file": tls.key_file}
        if tls.ca_file:
            block |= {"ca_file": tls.ca_file, "verify": True}
        lines.append(f"tls: {json.dumps(block, indent=2)}")
    return "\n".join(lines) + "\n"


def all_users(host_ids: list[str]) -> list[str]:
    return [*CONTROL_USERS, CLI_USER, *(engine_user(h) for h in host_ids)]


def write_auth(directory: Path, host_ids: list[str]) -> dict[str, Credential]:
    """Create (or keep) a password per user under `directory` and the server config using them.

    Passwords persist in `credentials.json` (mode 0600) so a restarted server and its clients agree;
    a user added later (another engine host) gets a new one, and a user whose file entry is deleted
    gets a new password (that is how one rotates). `<user>.env` holds each user's `SF_NATS_USER` and
    `SF_NATS_PASSWORD` for an `EnvironmentFile=` or compose `env_file:`.
    """
    directory.mkdir(parents=True, exist_ok=True)
    store = directory / "credentials.json"
    known: dict[str, str] = json.loads(store.read_text()) if store.exists() else {}
    creds = {u: Credential(u, known.get(u) or secrets.token_urlsafe(24)) for u in all_users(host_ids)}
    _write_private(store, json.dumps({u: c.password for u, c in creds.items()}, indent=2))
    _write_private(directory / "auth.conf", server_config(list(creds.values())))
    for c in creds.values():  # one systemd/compose environment file per user
        _write_private(directory / f"{c.user}.env", f"SF_NATS_USER={c.user}\nSF_NATS_PASSWORD={c.password}\n")
    return creds


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.touch(mode=0o600)
    tmp.chmod(0o600)
    tmp.write_text(text)
    tmp.replace(path)


def url_with(url: str, credential: Credential) -> str:
    """`nats://host:port` with the user and password in it (each of a comma-separated list)."""
    out = []
    for one in url.split(","):
        scheme, _, rest = one.partition("://")
        out.append(f"{scheme}://{credential.user}:{credential.password}@{rest.rpartition('@')[2]}")
    return ",".join(out)
