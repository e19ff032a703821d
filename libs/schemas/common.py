"""Messages every service speaks: errors, ping, service and engine directory entries."""

from __future__ import annotations

from typing import Any, Literal, get_args

from libs.schemas.base import Msg

InputKind = Literal["text", "action", "audio", "json", "clear", "segment_end"]
# Why overload relief suspended a session ("" where it did not): see `SessionSummary.shed`.
ShedKind = Literal["", "overload", "capacity_lost"]
INPUT_KINDS: tuple[str, ...] = get_args(InputKind)


class ErrorReply(Msg):
    """The reply to any request that failed. Rebuilt as a typed exception by the caller."""

    code: str
    detail: str
    retryable: bool = False
    fields: dict[str, Any] = {}


class Ping(Msg):
    pass


class Pong(Msg):
    service: str
    instance: str
    version: str
    uptime_s: float


class ServiceEntry(Msg):
    """A live service instance, kept in the `sf_services` KV bucket (TTL-expired when dead)."""

    service: str
    instance: str
    version: str
    hostname: str
    pid: int
    started_at: float
    heartbeat_at: float
    metrics_port: int = -1  # where its /metrics listens (-1: none), so instances sharing a machine can be told apart


class ProfileRow(Msg):
    """One measured row of an engine host's profile: what a block costs for a backend at a quality tier.

    Measured on the host itself at start-up (never model constants); admission and
    placement compute residual capacity from these.
    """

    backend: str
    tier: int  # quality tier: the number of denoise steps (higher = better)
    quantum_ms: float  # device time of one generation quantum (one block at this tier)
    block_ms: float  # wall time of one whole block through the pipeline
    state_bytes: int  # resident state of one session
    media_s_per_block: float  # media seconds one block produces (for the real-time factor)
    # What the backend takes as input, so ingress refuses anything else at the door ([] = not said):
    input_kinds: list[str] = []
    max_input_bytes: int = 0  # the largest value of one item it takes (a text item: its UTF-8 bytes); 0 = not said
    # The admissibility inputs of a move: what a move sends (leaves of role `moved`) and how many of
    # those bytes one block rewrites (chunks whose CRC changed, at the mover's default chunk size).
    moved_bytes: int = 0
    dirty_bytes_per_block: int = 0
    # What re-deriving the `rebuildable` leaves of one warm session takes here (0: it has none): a
    # move sends those leaves instead when this exceeds their bytes' wire time.
    rebuild_ms: float = 0.0
    # The session init inputs it starts from (of prompt/image/audio) and the most image + audio bytes
    # it takes: admission refuses anything else with a typed 4xx ([] / 0 = not said).
    init_kinds: list[str] = []
    max_init_bytes: int = 0
    # Block ms at 1, 2, 4, 8, … sessions of this kind running at once on the device (up to the host's
    # measured limit; [] = not measured): stage ms per block, the dearer of the sessions in one process
    # and spread over the device's host processes; what `contracts.device_ms` prices k sessions at (issue 23).
    colocated: list[float] = []


class BackendInfo(Msg):
    """A backend an engine host can serve, as its heartbeat lists it (`statefleet backends`)."""

    name: str
    source: str  # "module:Class", from the `statefleet.backends` entry points or the host config
    tiers: list[int] = []
    input_kinds: list[str] = []
    init_kinds: list[str] = []  # what a session starts from: of prompt, image, audio
    moved_bytes: int = 0  # default config's per-session state, by role
    rebuildable_bytes: int = 0
    static_bytes: int = 0


class EngineEntry(Msg):
    """An engine host's registration and heartbeat, kept in the `sf_engines` KV bucket (TTL)."""

    host_id: str
    device: str
    memory_bytes: int
    free_memory_bytes: int
    sessions: int = 0
    version: str = ""
    heartbeat_at: float = 0.0
    profile: list[ProfileRow] = []
    busy_fraction: float = 0.0  # share of device time admitted sessions are promised (quanta at their floors)
    served_fraction: float = 0.0  # share they take at the tiers served now (at most the budget, or all at floor)
    state_bytes_resident: int = 0
    data_addr: str = ""  # host:port of the mover data plane (TCP) on this host
    # Sessions on this host's device's other hosts, their reservations included: set by capacity's view
    # of a shared device (`contracts.pooled`), never sent (a host announces 0).
    peer_sessions: int = 0
    machine: str = ""  # boot id + hostname (`libs.motion.machine`): equal on two hosts that share memory
    backends: list[BackendInfo] = []
    incarnation: str = ""  # random per engine-host process start: a new one is a restarted host
    heartbeat_s: float = 0.0  # how often this host beats; placement declares it dead after missed beats
    # share of wall time its stages measured themselves running (services/engine_host/device_time.py)
    measured_fraction: float = 0.0
    # How many of its sessions the host's prices were last measured beside (`EngineRuntime.measured_sessions`):
    # admission takes a device past what it was measured at only step by step (services/admission/ramp.py).
    measured_sessions: int = 0
    # Share of device time its sessions suspended with their share held would take back (C1 sessions overload
    # relief shed as `capacity_lost`, re-queued for that room): admission counts it, relief and resumes do not.
    held_fraction: float = 0.0
    # Every session this host holds, so its load counts it: a reservation for one of them stops counting
    # (libs/contracts.py `shown`); one still missing here keeps counting however long its start takes.
    session_ids: list[str] = []
    # The torch intra-op threads this host's blocks run at (`services/engine_host/torch_threads.py`); 0: not
    # announced. A T0/T1 session replays bit-exactly only at its own count, so placement prefers its hosts.
    threads: int = 0


class SessionSummary(Msg):
    """One session as `statefleet status` shows it (`sf_sessions` KV): a hint, never authority."""

    session_id: str
    backend: str = ""
    session_class: str = ""
    state: str = ""
    owner_server_id: str = ""
    owner_version: int = 0
    claimed: bool = False
    updated_at: float = 0.0
    owner_incarnation: str = ""  # the owner's engine-host process (see SessionView.incarnation)
    # Why the session is in its state, where that is not plain serving: an orphaned (re-queued) session
    # names every host's reason for not taking it. Cleared by any summary update that gives none.
    reason: str = ""
    # "overload" | "capacity_lost" while suspended to relieve a device measured past its limit (placement's
    # overload relief; a `capacity_lost` C1 is re-queued: it resumes where a device has room). Cleared with `reason`.
    shed: ShedKind = ""


NoticeKind = Literal["overload", "capacity_lost", "orphaned", "resumed"]


class SessionNotice(Msg):
    """What happened to a session that its client must hear of, beyond its output (`sf.notice.<session_id>`,
    published by fence as it marks the session's summary; egress forwards it to the session's viewers).

    `overload`: suspended to relieve a device measured past its limit; it resumes where there is room when
    input asks. `capacity_lost`: a C1 session no device could keep, suspended and re-queued instead of served
    late; it resumes as soon as a device has room. `orphaned`: its owner died and no live host has room for it
    (`reason` names each host's): re-queued, its accepted input kept, and placed as soon as one has (the
    owner change then says where). `resumed`: back on a device after `overload` or `capacity_lost`."""

    session_id: str
    kind: NoticeKind
    reason: str = ""  # for a person: which device, and why
    at: float = 0.0  # wall clock, as fence published it


class InputItem(Msg):
    """One control item a frontend sent for a session, as ingress stores it and the gateway releases it.

    `data` is the JSON value exactly as the client sent it (size-checked by ingress):
    `text` → a JSON string (avatar speech), `action` → a JSON object such as
    {"keys": ["w"], "mouse": [dx, dy]} (world models), `audio` → a JSON string holding base64 of
    16 kHz mono int16 little-endian PCM (or an `AudioChunk` object naming its rate), `json` → any JSON
    object, `clear` / `segment_end` → a voice agent's control items (libs/schemas/voice.py).
    Backends validate the shape they need and reject others with a typed error.
    """

    session_id: str
    seq: int  # the session's ingress sequence: strictly increasing, gap-free per session
    kind: InputKind
    data: bytes
    accepted_at: float = 0.0
