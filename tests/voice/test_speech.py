"""The text avatar's espeak voice: it plays exactly the speech espeak-ng makes of its text, in order and
across blocks, the same bits on every run, with the mouth open while it speaks and closed after."""

from __future__ import annotations

import shutil

import pytest
import torch

from libs.checkpoint import trees_equal
from libs.schemas.engine import SessionInit
from services.engine_host.backends import advance
from services.engine_host.backends import spec as specs
from services.engine_host.backends.avatar import AvatarBackend, AvatarConfig
from services.engine_host.backends.speech import Espeak
from services.engine_host.backends.talking_head.face import mouth_opening
from tests.support.items import item

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="espeak-ng is not installed (`make espeak` installs Debian's as root)")
TEXT = "Hello, I am your statefleet avatar."


def speak(backend: AvatarBackend, blocks: int):
    state = backend.init_state(4, SessionInit(prompt="narrator"))
    outs = [advance(backend, state, [backend.parse_input(item("text", TEXT))] if k == 0 else [], 1)
            for k in range(blocks)]
    return state, outs


def test_the_avatar_plays_exactly_espeaks_speech_and_is_deterministic():
    speech = Espeak().speak(TEXT)
    assert speech.shape[0] > 16000 and int(speech.abs().max()) > 5000  # over a second of real speech
    a, b = AvatarBackend(AvatarConfig(voice="espeak")), AvatarBackend(AvatarConfig(voice="espeak"))
    n_blocks = -(-speech.shape[0] // 6400) + 2
    s1, o1 = speak(a, n_blocks)
    s2, o2 = speak(b, n_blocks)
    assert trees_equal(s1, s2)
    assert all(torch.equal(x.frames, y.frames) and torch.equal(x.audio, y.audio) for x, y in zip(o1, o2, strict=True))
    played = torch.cat([o.audio for o in o1])
    assert torch.equal(played[: speech.shape[0]], speech) and not played[speech.shape[0]:].any()
    assert all(o.audio.shape[0] == 6400 for o in o1)  # each chunk carries its full 0.4 s (silence when done)
    talking, quiet = mouth_opening(o1[0].frames, 256), mouth_opening(o1[-1].frames, 256)
    assert float(talking.max()) > 2 * float(quiet.max())
    specs.check(s1, a.state_spec(), torch.device("cpu"))


def test_the_tone_voice_is_unchanged_by_default():
    assert AvatarBackend().speech is None and "speech" not in AvatarBackend().state_spec()
