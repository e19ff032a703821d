"""Admission messages: the HTTP bodies of the session API and the durable session record.

HTTP bodies are JSON (the same Structs); the record is msgpack in the `sf_admission` KV bucket.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from libs.contracts import Contract, Demand, Estimate
from libs.schemas.base import Msg
from libs.schemas.engine import Base64Bytes, RawImage

SESSION_ID_PATTERN = "^[0-9a-f]{32}$"
BACKEND_PATTERN = "^[A-Za-z0-9_.-]{1,64}$"
MAX_PROMPT_CHARS = 65536

AdmissionOutcome = Literal["admitted", "queued", "rejected", "timed_out"]
AdmissionState = Literal["queued", "placed", "timed_out"]


class AdmissionVerdict(Msg):
    """An admission decision and the arithmetic it used.

    `reason` is "" when admitted; else incoherent_contract | never_fits | queue_full | queue_timeout,
    or waiting_for_capacity while queued. `estimates`: the host it fits (admitted), or every live
    host's estimate (why each does not fit now, or would not fit even idle for never_fits).
    """

    outcome: AdmissionOutcome
    reason: str = ""
    detail: str = ""
    fields: list[str] = []
    estimates: list[Estimate] = []
    queue_position: int = 0  # 1 = head of the queue; 0 when not queued
    queue_deadline: float = 0.0  # unix seconds after which a queued candidate times out


class CreateSession(Msg, kw_only=True, forbid_unknown_fields=True):
    """POST /v1/sessions."""

    v: Annotated[int, msgspec.Meta(ge=1, le=1)] = 1  # stated in the schema, so a client sees the range
    contract: Contract
    backend: Annotated[str, msgspec.Meta(pattern=BACKEND_PATTERN)]
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    prompt: Annotated[str, msgspec.Meta(max_length=MAX_PROMPT_CHARS)] = ""
    # Init inputs besides the prompt, for backends that start from them (their profile rows say
    # which): `rgb` and `audio` are base64 in JSON; image + audio at most `libs.init_inputs.MAX_INIT_BYTES`.
    image: RawImage | None = None
    audio: Base64Bytes = b""  # 16 kHz mono int16 LE PCM


class SessionRecord(Msg):
    """One session as admission knows it: the authority for its contract and placement decision."""

    session_id: str
    backend: str
    contract: Contract
    seed: int
    prompt: str
    state: AdmissionState
    verdict: AdmissionVerdict
    created_at: float
    updated_at: float
    queue_deadline: float = 0.0
    host_id: str = ""  # placed on this engine host
    placed_at: float = 0.0
    demand: Demand | None = None  # what it takes on host_id until the host's heartbeat shows it
    tenant: str = ""  # whose API key created it ("" = the admin); only they and the admin may touch it


class AdmissionMetrics(msgspec.Struct, kw_only=True):
    queue_wait_s: float  # created → placed (or → now while queued, → timeout)
    tier: int = 0  # the quality tier admission budgeted (lowest profiled tier >= floor)
    busy_fraction: float = 0.0  # its estimated steady-state share of the host's device
    state_bytes: int = 0  # its estimated resident state


class SessionStatus(Msg):
    """GET /v1/sessions/{session_id}. The owner fields are fence's log as last read: a hint."""

    session_id: str
    state: AdmissionState
    backend: str
    contract: Contract
    host_id: str
    verdict: AdmissionVerdict
    metrics: AdmissionMetrics
    created_at: float
    updated_at: float
    owner_server_id: str = ""  # the latest fence assignment (server_id, version)
    owner_version: int = 0
    claimed: bool = False  # the assigned server has claimed: it takes the session's input
    # What fence and placement say about the owner: pending | assigned | serving | orphaned (its host died
    # and none has room yet; retried as room appears) | owner_dead (not yet failed over) | closed.
    owner_state: str = ""


class CreatedSession(SessionStatus):
    """The body of a successful create (201 placed, 202 queued): the view plus how to talk to the session.

    `input_token` is shown once (fence keeps only its hash); it authorizes the input and output
    routes of fence's ingress, whose URLs follow.
    """

    input_token: str = ""
    input_url: str = ""  # POST {"kind": "text"|"action"|"json", "data": ...}
    input_ws_url: str = ""  # the same items over a WebSocket
    output_ws_url: str = ""  # frames/audio chunks as the engine publishes them


class QueueEntry(msgspec.Struct, kw_only=True):
    session_id: str
    position: int
    enqueued_at: float
    deadline: float


class QueueView(Msg):
    """GET /v1/admin/queue (admin token)."""

    capacity: int
    timeout_s: float
    entries: list[QueueEntry]


class FleetHost(msgspec.Struct, kw_only=True):
    host_id: str
    device: str
    heartbeat_at: float
    sessions: int
    busy_fraction: float
    free_memory_bytes: int
    memory_bytes: int
    pending_sessions: int  # placed by us, not yet in the host's heartbeat
    pending_busy_fraction: float
    pending_state_bytes: int


class FleetView(Msg):
    """GET /v1/admin/fleet (admin token): live engine hosts as admission sees them."""

    hosts: list[FleetHost]


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """RFC 9457 problem details (`application/problem+json`)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    code: str
    field: str | None = None  # the first offending request field (a JSON path for schema errors)
    fields: list[str] = []
    reason: str | None = None
    retryable: bool = False
    verdict: AdmissionVerdict | None = None
