"""Messages of the engine host: session verbs on `sf.engine.<host_id>.<verb>`, output chunks, metrics."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from libs.schemas.base import Msg
from libs.schemas.common import InputItem
from libs.session_classes import DeterminismTier, SessionClass

SessionState = Literal["running", "suspended", "closing", "closed", "failed"]

AUDIO_SAMPLE_RATE = 16000  # session init audio and `audio` input items: mono int16 little-endian PCM
# Bytes that JSON carries as base64: the pattern tells a JSON Schema reader what decodes.
Base64Bytes = Annotated[bytes, msgspec.Meta(extra_json_schema={
    "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"})]


class RawImage(Msg):
    """An image a session starts from: `rgb` is width·height·3 bytes, row-major, uint8."""

    width: Annotated[int, msgspec.Meta(ge=1, le=1 << 16)]
    height: Annotated[int, msgspec.Meta(ge=1, le=1 << 16)]
    rgb: Base64Bytes


class SessionInit(Msg):
    """What a backend's `init_state` starts a session from, besides its seed."""

    prompt: str = ""
    image: RawImage | None = None
    audio: bytes = b""  # AUDIO_SAMPLE_RATE mono int16 LE PCM


class OpenSession(Msg):
    """`open`: create a session from a seed and prompt. Periodic classes (`session_classes.PERIODIC`)
    run one block per `period_ms` on their own; the others run the blocks asked for by `advance`."""

    session_id: str
    backend: str
    seed: int
    prompt: str = ""
    tier: int = 0  # requested quality tier (denoise steps); 0 = the backend's best
    quality_floor: int = 0  # the ladder never steps below this many denoise steps; 0 = the lowest tier
    session_class: SessionClass = "C3"
    period_ms: float = 0.0  # release period of C1/C2 sessions (their deadline is the next release)
    determinism: DeterminismTier = "T0"  # T0 sessions are never coalesced into a batch (bitwise replay)
    image: RawImage | None = None  # init inputs besides the prompt, for backends that start from them
    audio: bytes = b""
    # Torch intra-op threads every block of a T0/T1 session runs at, wherever it runs (its bytes depend on
    # the count): 0 at its first open, which pins the opening host's count; a move, checkpoint or block
    # journal carries it to the next host. A T2 session runs at each host's own count (0).
    threads: int = 0

    def init(self) -> SessionInit:
        return SessionInit(prompt=self.prompt, image=self.image, audio=self.audio)


class SessionRef(Msg):
    """`close`, `suspend`, `resume`, `checkpoint`, `metrics`: a verb on one held session."""

    session_id: str
    finish: bool = True  # close: let in-flight blocks finish (True) or cancel them (False)
    # suspend: keep its device share in the host's load while suspended (a C1 shed as `capacity_lost`: new
    # sessions do not take the room it is re-queued for)
    hold_share: bool = False


class Advance(Msg):
    """`advance`: run `blocks` more blocks of a non-periodic session; replies when they are done."""

    session_id: str
    blocks: int = 1


class RestoreSession(Msg):
    """`restore`: create the session from checkpoint `key` (failover), then take input from its cursor."""

    session_id: str
    key: str


class SessionInfo(Msg):
    session_id: str
    backend: str
    state: SessionState
    session_class: SessionClass
    tier: int
    blocks_done: int
    input_cursor: int  # last input seq accepted
    consumed_seq: int  # last input seq folded into the state by a block
    state_bytes: int
    skipped_blocks: int = 0
    rejected_inputs: int = 0  # input items the backend refused: skipped, each reported on the output stream
    last_rejected_seq: int = 0
    last_rejected_detail: str = ""
    threads: int = 0  # the intra-op threads its blocks run at (OpenSession.threads); 0: the host's own


class CheckpointRef(Msg):
    session_id: str
    key: str
    location: str  # "object" (NATS Object Store) or "file"
    total_bytes: int
    blocks_done: int
    consumed_seq: int


class StageTiming(Msg):
    stage: str
    count: int
    mean_ms: float
    p95_ms: float


class IdleInterval(Msg):
    start_s: float  # host monotonic clock
    duration_ms: float
    reason: str  # waiting_release | device_busy | suspended | block_boundary | no_budget


class SessionMetrics(Msg):
    session_id: str
    blocks: int
    skipped_blocks: int
    tier: int
    tier_changes: int
    first_output_ms: float  # open (or resume of a moved session) → first output published
    control_to_output_p50_ms: float
    control_to_output_p95_ms: float
    chunk_period_p50_ms: float
    chunk_period_p95_ms: float
    media_s_per_block: float
    rtf_p95: float  # p95 chunk period / chunk media duration (< 1: faster than real time)
    stages: list[StageTiming] = []
    playout_hold_p95_ms: float = 0.0  # C1: how long a block waited for its playout point (playout.py)
    idle: list[IdleInterval] = []


class PipelineCounters(Msg):
    stale: int = 0
    orphaned: int = 0
    duplicate: int = 0
    cleanup_failures: int = 0
    slot_leaks: int = 0


class StatusRequest(Msg):
    pass


class HostStatus(Msg):
    host_id: str
    device: str
    sessions: list[SessionInfo]
    metrics: list[SessionMetrics]
    pipeline: PipelineCounters
    busy_fraction: float
    state_bytes_resident: int


class OutputChunk(Msg):
    """One piece of a block's output on `sf.output.<session_id>`; a tensor is cut into parts so
    every message stays under the NATS payload limit. Reassemble by (block, kind, part/parts).

    `encoding` "raw": the parts are consecutive slices of the tensor's bytes; "png": part i is
    frame i of the uint8 [F, 3, H, W] tensor as one PNG (browsers decode it natively)."""

    session_id: str
    block: int
    # "input_rejected": an input item the backend refused and skipped; `data` is its problem+json
    # (with `seq`), dtype "json", one part. "event": the block's events (libs/schemas/voice.py), dtype
    # "json", one event's JSON per part. Readers that only render media skip other kinds.
    kind: Literal["frames", "audio", "input_rejected", "event"]
    dtype: str
    shape: list[int]
    part: int
    parts: int
    data: bytes
    replayed: bool = False  # regenerated after a failover: a client that showed this block drops it
    encoding: Literal["raw", "png"] = "raw"
    media_s: float = 0.0  # seconds of media the block carries (frames are shown at shape[0] / media_s fps)
    input_seq: int = 0  # the last input seq this block consumed (0: none yet): control-to-output latency


class SessionDescriptor(Msg):
    """What travels with a moved session's state (opaque to the mover): contract, progress, cursor."""

    session_id: str
    backend: str
    seed: int
    prompt: str
    tier: int
    quality_floor: int
    session_class: SessionClass
    period_ms: float
    determinism: DeterminismTier
    backend_config: bytes  # the backend's own msgpack config (e.g. the world model's cache size)
    blocks_done: int
    input_cursor: int
    consumed_seq: int
    pending: list[InputItem] = []  # accepted but not yet folded into the state (empty in checkpoints)
    image: RawImage | None = None  # init inputs: the destination regenerates `static` leaves from them
    audio: bytes = b""
    # The leaf roles the tree carries: ["moved"], or ["moved", "rebuildable"] when the source judged
    # a rebuild dearer than sending those leaves (`rebuild_choice`); the destination rebuilds the rest.
    sent_roles: tuple[str, ...] = ("moved",)
    threads: int = 0  # OpenSession.threads: the count the session's blocks run at (0: each host's own)
