"""bench/webrtc_sync.py's A/V skew from what a page recorded: the audio's RTP origin found from the levels sent and
played (also with packets missed, and across the 32-bit wrap), the skew of each packet read back,
and no figure at all when the levels cannot say where the audio is (a steady tone, a periodic one)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.webrtc_sync import audio_offset, skews

T0 = 1_000_000.0  # wall ms of media time 0 on the video


def levels(n: int) -> list[int]:
    per_frame = np.random.default_rng(3).integers(20, 80, n // 2)
    return [int(per_frame[k // 2]) for k in range(n)]  # both 20 ms halves of a 40 ms frame alike, as the avatar's


def recorded(skew_ms: float, origin: int, level_of_frame: list[int]):
    sent = [[320 * k, level] for k, level in enumerate(level_of_frame)]
    sound = [[T0 + 20 * k + skew_ms, (origin + 960 * k) % 2**32, 10 ** (-level / 20)]
             for k, level in enumerate(level_of_frame) if k % 6 != 5]  # polled at 60 Hz: now and then one missed
    frames = [[T0 + 40 * k, 40.0 * k] for k in range(len(level_of_frame) // 2)]
    return sound, sent, frames


@pytest.mark.parametrize("skew_ms, origin", [(0.0, 123_456), (35.0, 2**32 - 5_000), (-80.0, 7)])
def test_the_skew_of_each_packet_played_is_read_back(skew_ms, origin):
    sound, sent, frames = recorded(skew_ms, origin, levels(400))
    assert audio_offset(sound, sent) == origin
    got = skews(sound, sent, frames, since_ms=0)
    assert len(got) >= 300 and all(abs(s - skew_ms) < 1e-6 for s in got)


@pytest.mark.parametrize("level_of_frame", [[40] * 400, [30 + k % 8 for k in range(400)]], ids=["steady", "periodic"])
def test_audio_that_cannot_say_where_it_is_gives_no_figure_rather_than_a_wrong_one(level_of_frame):
    sound, sent, frames = recorded(0.0, 99, level_of_frame)
    assert audio_offset(sound, sent) is None and skews(sound, sent, frames, since_ms=0) == []
