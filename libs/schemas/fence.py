"""Fence messages: the per-session ownership log, session metadata, and the `sf.fence.<verb>` requests.

The log (`sf.session.<sid>` in stream `SF_SESSION`) holds `LogRecord`s. Each record
carries the event and the `SessionView` it produced, so the last record alone tells
a reader the owner, the claim and the release cursor (one direct get, no replay).
"""

from __future__ import annotations

from libs.schemas.base import Msg
from libs.schemas.common import InputItem, ShedKind
from libs.schemas.engine import RawImage


class Owner(Msg, frozen=True):
    """One incarnation of a session on a server: `(server_id, version)`."""

    server_id: str
    version: int


class SessionView(Msg, frozen=True):
    """What the log says after a record: the pure core folds events into this."""

    owner: Owner | None = None  # the latest assign
    claim: Owner | None = None  # the claim accepted since that assign, if any
    released: int = 0  # the last item seq released to the current claim (its cursor at claim time before any)
    input_pos: int = 0  # input-stream sequence of the batch holding item `released` (0 = unknown: look it up)
    closed: bool = False
    # The engine-host process (incarnation) the owner is: the claimant's once claimed, else the one the
    # assign named ("" = unnamed). A restarted host process is a new incarnation and never inherits.
    incarnation: str = ""
    claim_id: str = ""  # the request that made `claim` (a repeat of it is answered, not refused)


# ---------------------------------------------------------------- log events


class Assign(Msg, frozen=True, tag="assign"):
    server_id: str
    version: int
    incarnation: str = ""  # only this process of `server_id` may claim ("" = any)


class Claim(Msg, frozen=True, tag="claim"):
    server_id: str
    version: int
    cursor: int  # the item seq the claimant's installed state reflects
    incarnation: str = ""  # the claiming engine-host process
    claim_id: str = ""  # the claim request's id (its repeats carry the same one)


class Release(Msg, frozen=True, tag="release"):
    """Consecutive items released to `(server_id, version)`; `input_pos` is the last item's batch's stream seq."""

    server_id: str
    version: int
    items: list[InputItem]
    input_pos: int = 0


class InputBatch(Msg):
    """Consecutive items of one session stored as one message of the input stream (`sf.input.<sid>`).

    Ingress stores every item that waits while the session's previous store is in flight in one
    compare-and-set write (group commit), so a busy session pays one store per group, not per item.
    """

    session_id: str
    items: list[InputItem]
    item_ids: list[str] = []  # the clients' ids of the items, aligned with `items` ("" = none)


class Close(Msg, frozen=True, tag="close"):
    reason: str = ""


Event = Assign | Claim | Release | Close


class LogRecord(Msg):
    event: Event
    view: SessionView
    at: float = 0.0


# ---------------------------------------------------------------- shared metadata (KV `sf_fence_meta`)


class SessionSpec(Msg):
    """What admission registers about a session: everything needed to start it from scratch."""

    session_id: str
    backend: str
    seed: int
    prompt: str = ""
    # The other init inputs: a replacement regenerates the session's `static` leaves from them.
    image: RawImage | None = None
    audio: bytes = b""
    contract: bytes = b""  # opaque msgpack written by admission
    tier: int = 0  # quality tier
    # What the session's backend takes (from its hosts' profile rows), so ingress refuses the rest
    # with a 4xx instead of storing an item the engine would skip. Empty / 0: not known, not checked.
    input_kinds: list[str] = []
    max_input_bytes: int = 0


class SessionMeta(SessionSpec):
    """What a replacement server rebuilds a session from, next to the log. Only the owner moves the checkpoint."""

    token_sha256: bytes = b""  # the input token itself is never stored
    # Image + audio bytes of the init media, stored once under `names.init_media_key` (0: none) so the
    # record that every checkpoint rewrites stays small; `sf.fence.meta` answers with them filled in.
    init_media_bytes: int = 0
    checkpoint_ref: str = ""  # where the owner's latest checkpoint lives ("" = replay from seed)
    checkpoint_cursor: int = 0  # the item seq that checkpoint reflects
    closed: bool = False
    checkpoint_block: int = 0  # the block index that checkpoint captured (blocks after it are replayed)
    created_at: float = 0.0


# ---------------------------------------------------------------- sf.fence.<verb> requests


class RegisterRequest(SessionSpec):
    """`sf.fence.register`: admission registers a new session and receives its input token."""


class RegisterReply(Msg):
    session_id: str
    token: str  # the per-session input token; shown once, only its hash is kept


class MetaRequest(Msg):
    session_id: str
    init_media: bool = False  # also the init image and audio (up to 512 KiB): for a server starting the session


class CheckpointRequest(Msg):
    """The owning engine moved its checkpoint; refused unless `(server_id, version)` holds the claim."""

    session_id: str
    server_id: str
    version: int
    ref: str
    cursor: int
    block: int = 0  # the block index the checkpoint captured


class CloseRequest(Msg):
    session_id: str
    reason: str = ""


class CloseReply(Msg):
    session_id: str
    log_seq: int


class MarkRequest(Msg):
    """Placement's say on the `sf_sessions` hint, which fence writes (`sf.fence.mark`). `orphaned` (why
    no live host takes the session) marks it orphaned, `shed` (why placement suspended it to relieve its
    device) marks it suspended, each only while the log still shows owner version `version`; neither
    clears a mark: the summary then says what the log says."""

    session_id: str
    version: int = 0
    orphaned: str = ""
    shed: str = ""
    # With `shed`: "overload" | "capacity_lost", kept in the summary (`SessionSummary.shed`) and told to the
    # session's client (`SessionNotice`). Without it, `resumed` says a shed session is back on a device:
    # the summary drops the mark and the client is told.
    shed_kind: ShedKind = ""
    resumed: bool = False


class MarkReply(Msg):
    session_id: str
    state: str  # the summary's state as fence wrote it


class AssignRequest(Msg):
    """`sf.fence.assign`: make `server_id` the assigned owner at the next version.

    With `expect_version` set, a session whose latest version is another one is a `Conflict`
    (the caller decided on a view that moved on); without it, fence retries a lost race.
    """

    session_id: str
    server_id: str
    expect_version: int | None = None
    incarnation: str = ""  # only this process of `server_id` may claim ("" = any)


class AssignReply(Msg):
    session_id: str
    server_id: str
    version: int
    log_seq: int


class ClaimRequest(Msg):
    """`sf.fence.claim`: the assigned engine-host process `incarnation` of `server_id` claims `version`,
    its installed state reflecting item `cursor`. Asking again after an unanswered request (same
    `claim_id`) is safe: a claim that already landed for it is answered again, never appended twice;
    any other claim of an already claimed assignment is refused."""

    session_id: str
    server_id: str
    version: int
    cursor: int
    incarnation: str = ""
    claim_id: str = ""  # unique per claim the engine makes; "" = never recognised as a repeat


class ClaimReply(Msg):
    session_id: str
    server_id: str
    version: int
    # Where the claim landed in the session's log; 0 when this answers a repeated request whose claim
    # had landed already (the lease then tells history from its own records by version alone).
    log_seq: int


class AssignNotice(Msg):
    """Published on `sf.fence.assigned.<server_id>` after an assign lands: a hint, the log decides."""

    session_id: str
    server_id: str
    version: int
    log_seq: int


class Kick(Msg):
    """Asks a gateway (queue group) to release what is pending for a session, e.g. after a claim."""

    session_id: str


class KickReply(Msg):
    session_id: str
    released: int  # the release cursor after the gateway pumped


class ConsumedBlock(Msg, frozen=True, array_like=True):
    """Block `block` of a session folded in exactly items `first_seq..last_seq` (none when
    `first_seq == last_seq + 1`) at denoise tier `tier`: enough to regenerate it bit for bit."""

    block: int
    first_seq: int
    last_seq: int
    tier: int


class BlockEntry(Msg):
    """One record of the block journal (`sf.blocks.<sid>`), appended by the claimed owner
    `(server_id, version)` with compare-and-set on the journal's tail. An entry without blocks is
    a seal: the first write of a new owner, after which no older version can append.

    `quiet_through`: the owner may publish blocks after this entry's last block, up to and including
    this one, without another record as long as each consumes no item at the last block's tier; a
    replacement regenerates every such block not recorded later (they may have been shown). 0: none.

    `threads`: the torch intra-op threads the session's blocks run at (`OpenSession.threads`, the same
    in every entry of a session): a replacement starting from the seed opens the session at it, so it
    regenerates the same bytes. 0: each host's own (a T2 session, or an entry from before it was kept)."""

    server_id: str
    version: int
    blocks: list[ConsumedBlock] = []
    at: float = 0.0
    quiet_through: int = 0
    threads: int = 0


class AppliedCursor(Msg):
    """The owning engine's applied cursor (`<sid>.applied` in the meta bucket): a hint for status and moves."""

    server_id: str
    version: int
    cursor: int
