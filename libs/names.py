"""Every subject, stream and bucket name on the bus: no other module spells one.

Each name has one owner that provisions it at start-up (idempotently) or serves
it; the others only use it. Subjects that carry a session or host id are
functions; the `*_SUBJECTS` constants are the wildcards streams and consumers
filter on.
"""

from __future__ import annotations

SERVICES = ("fence", "admission", "placement", "mover", "engine_host")

# KV: live service instances (owner: every service, for itself). Entries expire when heartbeats stop.
SERVICES_BUCKET = "sf_services"
# KV: engine hosts with device, memory, capacity and load (owner: engine_host).
ENGINES_BUCKET = "sf_engines"
# KV: one start-up profile per device (owner: engine_host; key `device_profile.device_profile_key`): the
# first host of a device measures and publishes its rows, the device's other hosts use them (issue 23).
DEVICE_PROFILES_BUCKET = "sf_device_profiles"
# A device's rows are reused by hosts starting within this long; a claim whose measurer died clears by then.
DEVICE_PROFILES_TTL_S = 600.0
# KV: one summary per session for `statefleet status` and dashboards: a hint, never authority.
SESSIONS_BUCKET = "sf_sessions"

# Heartbeat entries live this many heartbeats before they expire.
HEARTBEAT_TTL_FACTOR = 3


def ping_subject(service: str) -> str:
    return f"sf.{service}.ping"


def engine_subject(host_id: str, verb: str) -> str:
    return f"sf.engine.{host_id}.{verb}"


# KV: one record per session admission knows (contract, verdict, placement decision) (owner: admission).
ADMISSION_BUCKET = "sf_admission"
# Request/reply: PlaceRequest → Placement, or Rejected(reason="no_fit") (owner: placement).
PLACEMENT_PLACE = "sf.placement.place"


# Engine output for the frontend: `OutputChunk`s of one session (owner: engine_host).
def output_subject(session_id: str) -> str:
    return f"sf.output.{session_id}"


# `SessionNotice`s of one session for its client: shed from an overloaded device, capacity lost, resumed
# (owner: fence, as it marks the sessions hint; egress forwards them to the session's viewers).
def notice_subject(session_id: str) -> str:
    return f"sf.notice.{session_id}"


# Object Store bucket for small session checkpoints (owner: engine_host; large ones go to a filesystem path).
CHECKPOINTS_BUCKET = "sf_checkpoints"

# ---------------------------------------------------------------- fence (owner: fence)

# Stream: the per-session ownership log of `LogRecord`s. Fence provisions it and is its only writer
# (the others ask its verbs); engines read. A session's records are one ordered log (`session_log_subject`,
# a filter), each stored on the subject of the engine host it is addressed to (`session_record_subject`):
# a release on its recipient's, an assign or close on the owner's it revokes. So one consumer per host
# (`host_records_subject`) sees every record its leases need, however many sessions it holds.
SESSION_STREAM = "SF_SESSION"
SESSION_LOG_SUBJECTS = "sf.session.>"
_SESSION_PREFIX = "sf.session."
# The host token of a record addressed to no host (a close of a session never assigned): not a host id.
NO_HOST = "~"


def session_log_subject(session_id: str) -> str:
    """Every record of one session's log: the filter reads and compare-and-set appends use."""
    return f"{_SESSION_PREFIX}{session_id}.*"


def session_record_subject(session_id: str, host_id: str) -> str:
    """Where one record of a session's log is stored: on the token of the host it is addressed to."""
    return f"{_SESSION_PREFIX}{session_id}.{host_id}"


def host_records_subject(host_id: str) -> str:
    """Every record of every session's log addressed to one engine host: the host's feed."""
    return f"{_SESSION_PREFIX}*.{host_id}"


def record_session_id(subject: str) -> str:
    """The session a record's subject belongs to."""
    return subject.removeprefix(_SESSION_PREFIX).partition(".")[0]


# Stream: stored input, one subject per session holding `InputBatch`es (writer: fence's ingress).
INPUT_STREAM = "SF_INPUT"
INPUT_SUBJECTS = "sf.input.>"
_INPUT_PREFIX = "sf.input."


def input_subject(session_id: str) -> str:
    return f"{_INPUT_PREFIX}{session_id}"


def input_session_id(subject: str) -> str:
    """The session an input-stream subject belongs to."""
    return subject.removeprefix(_INPUT_PREFIX)


# KV: per-session metadata (contract, seed, token hash, checkpoint ref and cursor), its init media
# (`<sid>.init`, written once at registration) and each owner's applied cursor (`<sid>.applied`,
# written by the engine holding the lease).
FENCE_META_BUCKET = "sf_fence_meta"
# Every owner's applied-cursor put, as a core subject: the gateway hears its sessions' engines catch up.
APPLIED_SUBJECTS = f"$KV.{FENCE_META_BUCKET}.*.applied"


def applied_key(session_id: str) -> str:
    return f"{session_id}.applied"


def applied_session_id(subject: str) -> str:
    """The session of an `APPLIED_SUBJECTS` subject."""
    return subject.removeprefix(f"$KV.{FENCE_META_BUCKET}.").removesuffix(".applied")


def init_media_key(session_id: str) -> str:
    return f"{session_id}.init"

# Request/reply verbs of fence (queue group "fence").
FENCE_REGISTER = "sf.fence.register"  # RegisterRequest → RegisterReply (caller: admission)
FENCE_META = "sf.fence.meta"  # MetaRequest → SessionMeta (caller: engine hosts)
FENCE_CHECKPOINT = "sf.fence.checkpoint"  # CheckpointRequest → SessionMeta (caller: the claimed owner)
FENCE_CLOSE = "sf.fence.close"  # CloseRequest → CloseReply (caller: admission)
FENCE_KICK = "sf.fence.kick"  # Kick → KickReply: release what waited for a claim (caller: the lease)
FENCE_MARK = "sf.fence.mark"  # MarkRequest → MarkReply: orphan, shed and resumed marks on the sessions hint (caller: placement)
# Broadcast: a session id whose session closed, so every fence instance stops taking its input.
FENCE_CLOSED = "sf.fence.closed"


def assigned_subject(server_id: str) -> str:
    """`AssignNotice`s to one engine host (a hint; the log decides)."""
    return f"sf.fence.assigned.{server_id}"


# ---------------------------------------------------------------- mover (owner: mover)

# Request/reply: MoveRequest → MoveReceipt, once the move is over (queue group "mover").
MOVER_MOVE = "sf.mover.move"
# Stream: one `MoveReceipt` per move request, on a subject per session.
MOVES_STREAM = "SF_MOVES"
MOVE_RECEIPT_SUBJECTS = "sf.mover.receipt.>"


def move_receipt_subject(session_id: str) -> str:
    return f"sf.mover.receipt.{session_id}"


# KV: moves in flight (`MoveStarted`), so a restarted coordinator closes them out.
MOVES_INFLIGHT_BUCKET = "sf_moves_inflight"


# ---------------------------------------------------------------- exact recovery (issue 11, engine side)

# Stream: the block journal, one subject per session holding `BlockEntry`s: which input items each
# block consumed, written by the session's claimed owner before the block's output is published.
# Fence provisions it; each claimed owner appends (compare-and-set); a replacement reads it.
BLOCK_STREAM = "SF_BLOCKS"
BLOCK_JOURNAL_SUBJECTS = "sf.blocks.>"


def block_journal_subject(session_id: str) -> str:
    return f"sf.blocks.{session_id}"


# ---------------------------------------------------------------- bus security (harden-bus, issue 13)

# Request/reply: AssignRequest → AssignReply (queue group "fence"; callers: admission, placement, the mover).
# Fence is the only writer of the ownership log; everyone else asks it here.
FENCE_ASSIGN = "sf.fence.assign"
# Request/reply: ClaimRequest → ClaimReply (queue group "fence"; caller: the assigned engine host).
FENCE_CLAIM = "sf.fence.claim"
# Replies to a NATS user's requests arrive under this prefix; only that user may subscribe to it.
INBOX_ROOT = "_INBOX"


def inbox_prefix(user: str) -> str:
    return f"{INBOX_ROOT}.{user}"


def service_subjects(service: str) -> str:
    """Every request subject of one service (`sf.<service>.<verb>`): what its NATS user may serve."""
    return f"sf.{service}.>"

# ---- failover, capacity and host lifecycle (issue 11, placement) ----
# KV: one `HostRecord` per engine host: lifecycle state and capacity reservations, CAS on revision (owner: placement).
CAPACITY_BUCKET = "sf_capacity"
# Request/reply (owner: placement): HostsRequest → HostList; HostRequest → DrainReport / HostInfo.
PLACEMENT_HOSTS = "sf.placement.hosts"
PLACEMENT_DRAIN = "sf.placement.drain"
PLACEMENT_UNDRAIN = "sf.placement.undrain"
# KV: tenures held by compare-and-set (owner: placement). Key "fleet": the one placement instance
# that rebalances, autoscales and suspends idle sessions (issue 12). "Tenure", not "lease": a lease is
# an engine host's hold on a session's input (`libs/fence/client.py`); the bucket keeps its first name
# so a running fleet's record stays where its instances look.
PLACEMENT_TENURE_BUCKET = "sf_placement_lease"
# `sf_engines` entries of a host that stopped beating go after this (a listing then no longer shows it).
# Liveness is placement's to judge (three missed beats of the host's own interval), not this TTL's.
ENGINES_TTL_S = 6.0
