"""Messages of state motion: the manifest, the six engine verbs, move requests and receipts."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from libs.schemas.base import Msg

Mode = Literal["stop_and_copy", "precopy"]
Codec = Literal["none", "zstd", "lz4"]
MoveOutcome = Literal["committed", "rolled_back", "rejected"]
# auto: in-process when the destination is in this process, shared memory when it is on this machine
# (`libs.motion.route`), else TCP; the others force one transport.
Transport = Literal["auto", "shm", "tcp", "mooncake"]
Checksum = Literal["crc32c", "devhash64"]  # what a manifest's leaf values are (`libs.motion.checksum`)


class Leaf(Msg):
    """One tensor of a session's state tree."""

    path: str  # e.g. "kv/3/k"; one path per tensor, in tree order
    dtype: str  # torch dtype name without the "torch." prefix
    shape: list[int]
    nbytes: int
    crc32c: int  # the leaf's CRC32C, or its fingerprint of the kind the manifest's `checksum` names


class Manifest(Msg):
    """A typed fingerprint of a live state tree at one block boundary.

    `topology` hashes the tensor structure (paths, dtypes, shapes);
    `fingerprint` is the whole-state check: CRC32C over the topology, the
    skeleton with its control values, and every leaf CRC in order. Two trees with equal fingerprints are
    byte-identical with CRC32C confidence. `checksum` says what the leaf values are: "crc32c", or
    "devhash64" for a move between CUDA devices (`libs.motion.checksum`), which `fingerprint` then covers too:
    the same bytes moved by another transport have another fingerprint.
    """

    session_id: str
    leaves: list[Leaf]
    control: bytes  # msgpack of the tree's skeleton with scalar control values in place
    topology: int
    fingerprint: int
    total_bytes: int
    tier: str = "T0"  # determinism tier the engine declares for this session
    descriptor: bytes = b""  # opaque engine bytes (backend, seed, cursor) that travel with the state
    checksum: Checksum = "crc32c"


# ---------------------------------------------------------------- the six verbs (sf.engine.<host>.<verb>)


class RegisterState(Msg):
    session_id: str
    move_id: str = ""
    # False: structure only (paths, dtypes, shapes, sizes, control values), no pass over the bytes; leaf
    # CRCs and fingerprint are 0, so the manifest verifies nothing. The coordinator asks for this: a
    # move's fingerprint is the one `migrate` takes over the frozen source as it sends.
    fingerprint: bool = True


class AdmitMove(Msg):
    """Asked of the destination: can it take `state_bytes` from this path within the horizon."""

    session_id: str
    move_id: str
    state_bytes: int
    dirty_rate_bps: float
    horizon_s: float
    bandwidth_bps: float
    setup_s: float = 0.0


class AdmitVerdict(Msg):
    admissible: bool
    reason: str = ""
    t_migrate_s: float = 0.0
    token: str = ""  # one-time data-plane token for this move (only when admissible)
    data_addr: str = ""  # where the source sends the bytes
    machine: str = ""  # the destination's machine identity (`libs.motion.machine`)
    device: str = ""  # the destination slot's device type ("cpu", "cuda")


class Migrate(Msg):
    """Asked of the source: send the session's state to the destination's shadow slot."""

    session_id: str
    move_id: str
    dest_host: str
    dest_addr: str
    token: str
    mode: Mode = "stop_and_copy"
    round_cap: int = 4
    converge_fraction: float = 0.05  # stop live rounds once the dirty fraction is at or below this
    codec: Codec = "none"
    byte_planes: bool = False
    transport: Transport = "auto"
    chunk_bytes: int = 1 << 20
    deadline_s: float = 30.0  # relative; the freeze and the transfer end by then
    dest_machine: str = ""  # from the destination's AdmitVerdict: equal to the source's picks shared memory
    dest_device: str = ""


class MigrateResult(Msg):
    manifest: Manifest
    rounds: list[float]  # dirty fraction per round (round 0 is the full copy: 1.0)
    wire_bytes: int
    transfer_s: float
    freeze_s: float  # the stall the session paid (the final frozen round)
    transport: str = ""  # the one the move took: inprocess, shm, tcp, mooncake


class SlotRequest(Msg):
    """verify / commit / rollback: addressed to a move's slot on either side."""

    session_id: str
    move_id: str
    manifest: Manifest | None = None  # the manifest to verify against (destination verify/commit)


class Verified(Msg):
    ok: bool
    reason: str = ""
    staging: str = ""  # where the slot's memory came from: "pool", "device", or "fresh: <why>"


class SlotDone(Msg):
    manifest: Manifest | None = None


# ---------------------------------------------------------------- the coordinator (sf.mover.move)


class MoveRequest(Msg):
    session_id: Annotated[str, msgspec.Meta(min_length=1)]
    source: Annotated[str, msgspec.Meta(min_length=1)]  # engine host ids
    dest: Annotated[str, msgspec.Meta(min_length=1)]
    deadline_s: Annotated[float, msgspec.Meta(gt=0)]  # the horizon H: done within it, or rejected up front
    mode: Mode = "stop_and_copy"
    dirty_rate_bps: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # the session's measured rewrite rate
    codec: Codec = "none"
    transport: Transport = "auto"
    move_id: str = ""  # idempotency key; the coordinator picks one when empty


class StageTimes(Msg):
    register_s: float = 0.0
    admit_s: float = 0.0
    migrate_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    freeze_s: float = 0.0


class MoveReceipt(Msg):
    """Published on `sf.mover.receipt.<session_id>` for every move request, whatever its outcome."""

    move_id: str
    session_id: str
    source: str
    dest: str
    outcome: MoveOutcome
    reason: str = ""
    fingerprint: int = 0
    state_bytes: int = 0
    wire_bytes: int = 0
    rounds: list[float] = []
    times: StageTimes = msgspec.field(default_factory=StageTimes)
    predicted_s: float = 0.0  # the calculator's T_migrate at admission
    at: float = 0.0
    staging: str = ""  # the destination slot's memory: "pool", "device", or "fresh: <why the pool could not>"
    transport: str = ""  # the transport the move took (inprocess, shm, tcp, mooncake)
    transfer_s: float = 0.0  # the copy's wall time: wire_bytes / transfer_s is the path's measured rate


class MoveStarted(Msg):
    """Journalled before a move touches any host, so a restarted coordinator can close it out."""

    move_id: str
    session_id: str
    source: str
    dest: str
    lease_s: float
    at: float
    owner_version: int = 0  # fence's version of the source's ownership at the start (0: not fenced)
