"""Session registration and shared metadata (`sf_fence_meta` KV), served on `sf.fence.<verb>`.

The metadata is what a replacement server rebuilds a session from: contract, seed,
init inputs (prompt, image, audio), tier and the latest checkpoint with the cursor it reflects.
The image and audio live under a key of their own (`<sid>.init`), written once: the record
itself is rewritten by every checkpoint and cached per session for ingress, so it stays small. Only the
session's claimed owner moves the checkpoint, and only forward. The input token
is returned once at registration; only its SHA-256 is stored.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time

import structlog

from libs import bus, errors, init_inputs, names
from libs.contracts import Contract
from libs.fence import core, session_log
from libs.schemas.base import decode, encode
from libs.schemas.common import INPUT_KINDS
from libs.schemas.engine import SessionInit
from libs.schemas.fence import (
    CheckpointRequest,
    CloseReply,
    CloseRequest,
    MetaRequest,
    Owner,
    RegisterReply,
    RegisterRequest,
    SessionMeta,
    SessionSpec,
)
from services.fence import summaries

_log = structlog.get_logger("statefleet.fence.sessions")


# What `secrets.token_urlsafe` issues; anything else (a non-UTF-8 header, a newline) is no token of ours.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Sessions:
    def __init__(self, nc: bus.Client, js: bus.JetStream, kv: bus.KeyValue, *, max_contract_bytes: int) -> None:
        self.nc, self.js, self.kv = nc, js, kv
        self.max_contract_bytes = max_contract_bytes
        self._cache: dict[str, SessionMeta] = {}  # for ingress authentication; evicted on close

    # -------------------------------------------------------------- verbs

    async def register(self, req: RegisterRequest) -> RegisterReply:
        session_log.check_session_id(req.session_id)
        if not req.backend:
            raise errors.BadRequest("register needs a backend", session_id=req.session_id)
        if set(req.input_kinds) - set(INPUT_KINDS) or req.max_input_bytes < 0:
            raise errors.BadRequest(f"input_kinds must be drawn from {INPUT_KINDS}, max_input_bytes >= 0",
                                    session_id=req.session_id)
        if len(req.contract) > self.max_contract_bytes:
            raise errors.TooLarge(f"contract is {len(req.contract)} bytes (max {self.max_contract_bytes})",
                                  session_id=req.session_id)
        # Form and size: the kinds are the backend's to say (admission and the engine check those).
        init_inputs.check(req.prompt, req.image, req.audio, backend=req.backend, session_id=req.session_id)
        token = secrets.token_urlsafe(32)
        spec = {name: getattr(req, name) for name in SessionSpec.__struct_fields__}
        media = (len(req.image.rgb) if req.image is not None else 0) + len(req.audio)
        meta = SessionMeta(**{**spec, "image": None, "audio": b""}, token_sha256=token_digest(token),
                           created_at=time.time(), init_media_bytes=media)
        # First the media: whoever reads the record finds them. Revision 0: only if the key has none yet.
        if (media and not await bus.kv_swap(self.kv, names.init_media_key(req.session_id),
                                            encode(SessionInit(image=req.image, audio=req.audio)), 0)) \
                or not await bus.kv_swap(self.kv, req.session_id, encode(meta), 0):
            raise errors.Conflict("session already registered", session_id=req.session_id)
        self._cache[req.session_id] = meta
        _log.info("session_registered", session_id=req.session_id, backend=req.backend)
        await summaries.first_summary(self.js, req.session_id, backend=req.backend,
                                      session_class=_session_class(req.contract))
        return RegisterReply(session_id=req.session_id, token=token)

    async def meta(self, req: MetaRequest) -> SessionMeta:
        """The record, with its init media when asked (a server starting the session needs them)."""
        meta, _ = await self._read(session_log.check_session_id(req.session_id))
        if req.init_media and meta.init_media_bytes and not meta.closed:  # a closed one starts nowhere again
            entry = await bus.kv_read(self.kv, names.init_media_key(req.session_id))
            if entry is None:
                raise errors.IntegrityError("the session's init media are missing", session_id=req.session_id)
            media = decode(entry.value, SessionInit)
            meta.image, meta.audio = media.image, media.audio
        return meta

    async def checkpoint(self, req: CheckpointRequest) -> SessionMeta:
        session_log.check_session_id(req.session_id)
        me = Owner(server_id=req.server_id, version=req.version)
        tail = await session_log.read_tail(self.js, req.session_id)
        if not core.authorized(me, tail.view):
            raise errors.Conflict("only the claimed owner may move the checkpoint", session_id=req.session_id,
                                  server_id=req.server_id, version=req.version)
        for _ in range(bus.MAX_CAS_ATTEMPTS):
            meta, revision = await self._read(req.session_id)
            if req.cursor < meta.checkpoint_cursor or req.block < meta.checkpoint_block:
                raise errors.Conflict(f"checkpoint (block {req.block}, cursor {req.cursor}) is behind "
                                      f"(block {meta.checkpoint_block}, cursor {meta.checkpoint_cursor})",
                                      session_id=req.session_id)
            meta.checkpoint_ref, meta.checkpoint_cursor, meta.checkpoint_block = req.ref, req.cursor, req.block
            if await self._write(meta, revision):
                return meta
        raise errors.Conflict("checkpoint kept losing the race", session_id=req.session_id)

    async def close(self, req: CloseRequest) -> CloseReply:
        session_log.check_session_id(req.session_id)
        for _ in range(bus.MAX_CAS_ATTEMPTS):
            meta, revision = await self._read(req.session_id)
            meta.closed = True
            if await self._write(meta, revision):
                if meta.init_media_bytes:
                    await self._forget_media(req.session_id)
                break
        await self.nc.publish(names.FENCE_CLOSED, req.session_id.encode())
        for _ in range(bus.MAX_CAS_ATTEMPTS):
            tail = await session_log.read_tail(self.js, req.session_id)
            if tail.view.closed:
                return CloseReply(session_id=req.session_id, log_seq=tail.seq)
            try:
                new = await session_log.append(self.js, req.session_id, tail, core.decide_close(tail.view, req.reason))
            except errors.Conflict:
                continue
            await summaries.update_summary(self.js, req.session_id, new.view)
            await self._purge_input(req.session_id)
            _log.info("session_closed", session_id=req.session_id, log_seq=new.seq)
            return CloseReply(session_id=req.session_id, log_seq=new.seq)
        raise errors.Conflict("close kept losing the race", session_id=req.session_id)

    async def _forget_media(self, session_id: str) -> None:
        """A closed session's init media are read by no one again: free them."""
        try:
            await bus.purge_key(self.kv, names.init_media_key(session_id), what="init media")
        except errors.Unavailable as e:  # only storage until the bucket is cleaned
            _log.warning("init_media_purge_failed", session_id=session_id, error=e.detail)

    async def _purge_input(self, session_id: str) -> None:
        """A closed session's stored input is never released again (its log ends in Close): free it."""
        try:
            await bus.purge(self.js, names.INPUT_STREAM, names.input_subject(session_id), what="stored input")
        except errors.Unavailable as e:  # retention ages it out anyway
            _log.warning("input_purge_failed", session_id=session_id, error=e.detail)

    # -------------------------------------------------------------- ingress side

    async def authenticate(self, session_id: str, token: str | None) -> SessionMeta:
        """The session's metadata if `token` is its input token (constant-time compare, never logged).

        An unknown session answers exactly as a wrong token does, so the answers never tell
        which session ids exist; a token that is not of the form fence issues is refused before
        any lookup. A closed session's token no longer works."""
        session_log.check_session_id(session_id)
        if not token or not _TOKEN.fullmatch(token):
            raise errors.Unauthorized("missing or wrong input token", session_id=session_id)
        meta = self._cache.get(session_id)
        if meta is None:
            try:
                meta, _ = await self._read(session_id)
            except errors.NotFound:
                raise errors.Unauthorized("missing or wrong input token", session_id=session_id) from None
            if not meta.closed:
                self._cache[session_id] = meta
        if not hmac.compare_digest(token_digest(token), meta.token_sha256):
            raise errors.Unauthorized("missing or wrong input token", session_id=session_id)
        if meta.closed:
            raise errors.Conflict("the session is closed", session_id=session_id)
        return meta

    def evict(self, session_id: str) -> None:
        self._cache.pop(session_id, None)

    # -------------------------------------------------------------- KV

    async def _read(self, session_id: str) -> tuple[SessionMeta, int]:
        entry = await bus.kv_read(self.kv, session_id)
        if entry is None:
            raise errors.NotFound("unknown session", session_id=session_id)
        return decode(entry.value, SessionMeta), entry.revision

    async def _write(self, meta: SessionMeta, revision: int) -> bool:
        if not await bus.kv_swap(self.kv, meta.session_id, encode(meta), revision):
            return False
        if meta.closed:
            self._cache.pop(meta.session_id, None)
        else:
            self._cache[meta.session_id] = meta
        return True


def _session_class(contract: bytes) -> str:
    """The contract's session class for the summary ("" when none was sent or it does not decode: fence
    only stores the contract, admission and the engine check it)."""
    if not contract:
        return ""
    try:
        return decode(contract, Contract).session_class
    except errors.SchemaError:
        return ""
