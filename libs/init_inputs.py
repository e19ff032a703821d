"""Session init inputs (prompt, image, audio): the one check every hop applies.

A session starts from its seed and these inputs; `static` state leaves are a pure function of
them, so they are stored with the session's shared metadata at fence and travel in every moved
or checkpointed session's descriptor. Both are NATS messages (1 MiB at most), so the image and
audio bytes of one session are capped at MAX_INIT_BYTES together; a backend may declare less.
Admission checks them against what the session's backend declares (its hosts' profile rows), fence
again at registration (a trust boundary), and the engine host once more before `init_state`.
"""

from __future__ import annotations

from collections.abc import Collection

from libs.errors import BadInitInput, TooLarge, UnsupportedInput
from libs.schemas.common import EngineEntry
from libs.schemas.engine import AUDIO_SAMPLE_RATE, RawImage

INIT_KINDS: tuple[str, ...] = ("prompt", "image", "audio")
MAX_INIT_BYTES = 512 * 1024  # image RGB + audio PCM of one session (a 16 s clip, or a 418×418 image)


def given(prompt: str, image: RawImage | None, audio: bytes) -> list[str]:
    """The init kinds a session actually starts from (an empty prompt or clip is none)."""
    return [k for k, present in (("prompt", bool(prompt)), ("image", image is not None), ("audio", bool(audio)))
            if present]


def check(prompt: str, image: RawImage | None, audio: bytes, *, kinds: Collection[str] | None = None,
          max_bytes: int = MAX_INIT_BYTES, backend: str = "", **where: object) -> None:
    """A typed error naming the field, and nothing else: a malformed image (`BadInitInput`), audio
    that is not whole int16 samples (`BadInitInput`), media over `max_bytes` (`TooLarge`), or a kind
    the backend does not take (`UnsupportedInput`; `kinds` None: not known, not checked)."""
    if image is not None and (image.width <= 0 or image.height <= 0
                              or len(image.rgb) != image.width * image.height * 3):
        raise BadInitInput(f"init image of {image.width}×{image.height} needs width·height·3 bytes of row-major RGB, "
                         f"got {len(image.rgb)}", field="image", **where)
    if len(audio) % 2:
        raise BadInitInput(f"init audio is {AUDIO_SAMPLE_RATE} Hz mono int16 LE PCM: an even number of bytes",
                         field="audio", **where)
    size = (len(image.rgb) if image is not None else 0) + len(audio)
    limit = min(max_bytes or MAX_INIT_BYTES, MAX_INIT_BYTES)
    if size > limit:
        raise TooLarge(f"init image and audio are {size} bytes; {backend or 'a session'} takes at most {limit}",
                       field="image" if image is not None else "audio", size=size, limit=limit, **where)
    if kinds is not None:
        for kind in given(prompt, image, audio):
            if kind not in kinds:
                takes = "/".join(sorted(kinds)) or "its seed alone"
                raise UnsupportedInput(f"backend {backend} starts from {takes}, not {kind}",
                                       field=kind, **where)


def limits_on(backend: str, hosts: list[EngineEntry]) -> tuple[set[str] | None, int]:
    """The init kinds every live host that serves `backend` starts a session from, and the fewest
    init bytes any of them takes (a session must start wherever it is placed or failed over to).
    Nothing known (no host says): (None, 0), and only the form and the bus-wide cap are checked."""
    rows = [r for h in hosts for r in h.profile if r.backend == backend and r.init_kinds]
    if not rows:
        return None, 0
    kinds = set.intersection(*(set(r.init_kinds) for r in rows))
    return kinds, min((r.max_init_bytes for r in rows if r.max_init_bytes), default=0)
