"""The talking-head backend: each block carries exactly the audio it consumed, its mouths follow that
audio, silence gives idle frames, `clear` drops what is buffered and `segment_end` is answered once its
audio is out; the state is exact (same inputs, same bits) and survives a checkpoint-style cut."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from libs.checkpoint import clone_tree, trees_equal
from libs.errors import BadRequest, SchemaError, TooLarge, UnsupportedInput
from libs.schemas.engine import SessionInit
from libs.schemas.voice import VoiceEvent
from services.engine_host.backends import advance
from services.engine_host.backends import spec as specs
from services.engine_host.backends.talking_head import TalkingHeadBackend
from services.engine_host.backends.talking_head.face import mouth_opening
from tests.voice.helpers import audio_item, control_item, tone

B = TalkingHeadBackend()
SPB = B.samples_per_block


def run(blocks: list[list], *, seed: int = 3, state: dict | None = None, backend=B):
    state = state if state is not None else backend.init_state(seed, SessionInit(prompt="host"))
    outs = [advance(backend, state, [backend.parse_input(i) for i in items], backend.tiers[-1]) for items in blocks]
    return state, outs


def events(outs) -> list[VoiceEvent]:
    return [msgspec.json.decode(e, type=VoiceEvent) for o in outs for e in o.events]


def test_each_block_carries_exactly_the_audio_it_consumed():
    pcm = tone(1.0)
    items = [audio_item(i + 1, c) for i, c in enumerate(np.array_split(pcm, 7))]  # uneven chunks
    state, outs = run([items] + [[]] * 8)
    played = np.concatenate([o.audio.numpy() for o in outs])
    assert np.array_equal(played, pcm)  # nothing lost, nothing repeated, in order
    assert all(o.audio.shape[0] <= SPB and o.frames.shape == (4, 3, 128, 128) for o in outs)
    assert [o.audio.shape[0] for o in outs[:6]] == [SPB] * 6  # 2560 × 6 < 16000: full blocks first
    assert state["played"] == len(pcm) and state["head"] == state["tail"] == len(pcm)


def test_the_mouth_follows_the_audio_and_silence_is_idle():
    loud = tone(0.16, amp=0.8, freq=200)
    quiet = np.zeros(SPB, dtype=np.int16)
    _, outs = run([[audio_item(1, quiet)], [audio_item(2, loud)], []])
    closed = mouth_opening(outs[0].frames, 128)
    speaking = mouth_opening(outs[1].frames, 128)
    idle = mouth_opening(outs[2].frames, 128)
    assert outs[2].audio.shape[0] == 0  # nothing buffered: an idle block consumes nothing
    assert float(speaking.max()) > 2 * max(float(closed.max()), float(idle.max())) + 0.01
    # frame by frame: the quietest window of the speaking block has the narrowest mouth
    windows = torch.from_numpy(loud.astype(np.float64)).reshape(4, -1).pow(2).mean(1)
    assert int(speaking.argmin()) == int(windows.argmin())


def test_clear_drops_buffered_audio_and_reports_the_playback_position():
    pcm = tone(2.0)
    state, outs = run([[audio_item(1, pcm[:16000]), audio_item(2, pcm[16000:])], [],
                       [control_item(3, "clear", reason="barge_in")], []])
    ev = events(outs)
    assert [e.event for e in ev] == ["cleared"]
    c = ev[0]
    assert (c.seq, c.block, c.reason, c.interrupted) == (3, 3, "barge_in", True)
    assert c.segment_played == 2 * SPB and c.dropped == len(pcm) - 2 * SPB
    assert [o.audio.shape[0] for o in outs] == [SPB, SPB, 0, 0]  # the clear's block plays nothing stale
    assert state["dropped"] == c.dropped and state["head"] == state["tail"]


def test_a_clear_also_drops_the_audio_released_with_it():
    state, outs = run([[audio_item(1, tone(0.5)), audio_item(2, tone(0.5)), control_item(3, "clear"),
                        audio_item(4, tone(0.1))]])
    assert outs[0].audio.shape[0] == 1600  # only what came after the clear
    assert events(outs)[0].dropped == 16000


def test_segment_done_comes_with_the_block_that_emits_the_segments_last_sample():
    first, second = tone(0.3), tone(0.2, freq=240)
    state, outs = run([[audio_item(1, first), control_item(2, "segment_end"), audio_item(3, second),
                        control_item(4, "segment_end")], [], [], []])
    ev = events(outs)
    assert [(e.event, e.seq) for e in ev] == [("segment_done", 2), ("segment_done", 4)]
    assert ev[0].segment_played == len(first) and ev[1].segment_played == len(second)
    total = len(first) + len(second)
    assert ev[0].block == 2 and ev[1].block == -(-total // SPB)  # 4800 samples end in block 2 of 2560
    assert np.array_equal(np.concatenate([o.audio.numpy() for o in outs]), np.concatenate([first, second]))


def test_segment_end_on_an_empty_ring_is_answered_at_once():
    _, outs = run([[control_item(1, "segment_end")]])
    assert [(e.event, e.block, e.segment_played) for e in events(outs)] == [("segment_done", 1, 0)]


def test_same_inputs_are_bit_exact_and_a_cut_state_resumes_exactly():
    blocks = [[audio_item(1, tone(0.7))], [control_item(2, "segment_end")], [], [audio_item(3, tone(0.4))],
              [control_item(4, "clear")], [audio_item(5, tone(0.3))], []]
    s1, o1 = run(blocks)
    s2, o2 = run(blocks[:3])
    cut = clone_tree(specs.select(s2, B.state_spec()))  # what a move or checkpoint carries
    resumed = specs.graft(B.init_state(3, SessionInit(prompt="host")), cut, B.state_spec())
    s3, o3 = run(blocks[3:], state=resumed, backend=TalkingHeadBackend())
    assert trees_equal(s1, s3)
    for a, b in zip(o1, o2 + o3, strict=True):
        assert torch.equal(a.frames, b.frames) and torch.equal(a.audio, b.audio) and a.events == b.events
    specs.check(s1, B.state_spec(), torch.device("cpu"))


def test_batched_denoise_matches_single_blocks():
    states = [B.init_state(s, SessionInit()) for s in (1, 2)]
    twins = clone_tree(states)
    feed = [B.parse_input(audio_item(1, tone(0.2, freq=f))) for f in (150, 300)]
    batched = B.denoise_batch(states, [B.encode(s, [x]) for s, x in zip(states, feed, strict=True)], 2)
    single = [B.denoise(s, B.encode(s, [x]), 2) for s, x in zip(twins, feed, strict=True)]
    for a, b in zip(batched, single, strict=True):
        torch.testing.assert_close(a.motion, b.motion)
    for a, b in zip(states, twins, strict=True):  # batching may reorder float sums (T0 is never batched)
        torch.testing.assert_close(a["face"]["motion"], b["face"]["motion"])
        assert (a["block"], a["tail"]) == (b["block"], b["tail"]) == (1, 2560)


def test_overflowing_the_ring_keeps_the_oldest_audio_and_counts_the_rest():
    state = B.init_state(1, SessionInit())
    items = [B.parse_input(audio_item(i + 1, tone(1.0))) for i in range(10)]  # 10 s into an 8 s ring
    B.encode(state, items)
    assert state["overflow"] == 2 * 16000 and state["head"] == 8 * 16000


@pytest.mark.parametrize("item,error", [
    (audio_item(1, tone(0.1), rate=24000), UnsupportedInput),
    (audio_item(1, np.zeros(0, np.int16)), BadRequest),
    (audio_item(1, tone(1.5)), TooLarge),
    (control_item(1, "clear", unknown=1), SchemaError),
    (control_item(1, "segment_end", v=2), SchemaError),
    (control_item(1, "text"), UnsupportedInput),
])
def test_bad_items_are_typed_errors(item, error):
    with pytest.raises(error):
        B.parse_input(item)
