"""A/V skew as the page played it over WebRTC: when a moment of the media was heard against when it was seen.

Both of fence's tracks count from one origin (services/fence/rtc_media.py): video sample `pts` at
pts / 90 ms, audio sample s at s / 16 ms. The page records, at each video frame it presents,
- the frame: its presentation time (requestVideoFrameCallback) and, by its RTP timestamp and the block
  messages, its media time (as for glass-to-glass);
- the audio packet being played: `getSynchronizationSources()`'s delivery time to the track, RTP
  timestamp and level.
An audio RTP timestamp has an origin of the sender's choosing, so the marker that ties it to media time
is the audio itself: each block message lists the RFC 6464 level of each 20 ms audio frame fence sent
with its first sample, and the level the page saw played with each RTP timestamp votes for the offset
`rtp - 3 * sample` (48 kHz RTP clock) of every sent frame of that level; the true offset gets a vote from
(nearly) every packet, a wrong one only by chance. With it each played packet's media time m is known,
and its skew is its delivery time minus the time the video presented m (the frame showing m, plus m's
distance into that frame). Positive: the sound comes after the picture.

Resolution about 10 ms: the browser plays 10 ms at a time (the second half of a packet reports the packet's
timestamp 10 ms late when the first was not seen), and Opus's 6.5 ms look-ahead puts every sample that
much after what the packet's timestamp says (not corrected: the figure reads ~6.5 ms early for audio).
"""

from __future__ import annotations

import bisect
import collections
import math

AUDIO_RTP_PER_SAMPLE = 3  # Opus's 48 kHz RTP clock over fence's 16 kHz samples
FRAME_MS = 40.0  # a video frame presented shows media from its time until the next frame's (25 fps)
MIN_VOTE_SHARE = 0.3  # fewer agreeing packets than this: no offset found, no figure
CLEAR_LEAD = 1.25  # the offset found has this many times the votes of the next best


def level_of(audio_level: float) -> int:
    """The RFC 6464 level (0 loudest .. 127 silent) a browser's linear audioLevel came from."""
    return 127 if audio_level <= 0 else min(127, round(-20 * math.log10(audio_level)))


def audio_offset(sound: list, levels: list) -> int | None:
    """The audio RTP timestamp of sample 0, from the levels sent and played; None if they do not agree."""
    by_level: dict[int, list[int]] = collections.defaultdict(list)
    for sample, level in levels:
        if level < 127:  # silence matches everything silent: no evidence
            by_level[level].append(sample)
    votes: collections.Counter[int] = collections.Counter()
    heard = 0
    for _, rtp, audio_level in sound:
        samples = by_level.get(level_of(audio_level))
        if samples:
            heard += 1
            votes.update({(rtp - AUDIO_RTP_PER_SAMPLE * s) % 2**32 for s in samples})
    if not votes:
        return None
    (offset, n), *rest = votes.most_common(2)
    runner_up = rest[0][1] if rest else 0
    # The two 20 ms halves of a 40 ms frame often share a level, so one frame off scores about half:
    # the winner must lead clearly, or the audio (a steady tone, silence) does not say where it is.
    return offset if n >= MIN_VOTE_SHARE * heard and n >= CLEAR_LEAD * runner_up else None


def skews(sound: list, levels: list, frames: list, since_ms: float) -> list[float]:
    """Skew (ms, audio minus video) of each audio packet played from `since_ms` on; [] without an offset.
    `sound`: [delivered ms, rtp, level]; `levels`: [sample, level]; `frames`: [presented ms, media ms]."""
    offset = audio_offset(sound, levels)
    if offset is None or not frames:
        return []
    shown = sorted((media, at) for at, media in frames)
    medias = [m for m, _ in shown]
    out = []
    for at, rtp, _ in sound:
        if at < since_ms:
            continue
        media = ((rtp - offset) % 2**32) / AUDIO_RTP_PER_SAMPLE / 16.0  # ms from the origin
        i = bisect.bisect_right(medias, media) - 1
        if i < 0 or media - medias[i] >= FRAME_MS:  # that moment's frame was not presented: nothing to compare
            continue
        out.append(at - (shown[i][1] + (media - medias[i])))
    return out
