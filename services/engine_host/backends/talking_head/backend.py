"""`talking_head`: an audio-driven avatar for voice agents.

A session takes 16 kHz mono `audio` items (the agent's TTS, usually faster than real time) and the
control items `clear` and `segment_end`. Each block applies the block's items in seq order to the
pending-audio ring (ring.py), then consumes up to one block's worth of audio from it, and returns
the frames whose mouths that audio drives together with exactly that audio (int16, starting at
frame 0: a block that consumed less is silent after it, and a block in silence consumes nothing
and shows idle frames). A `clear` drops everything buffered (and every earlier item of the same
block, which the ring already holds) and is answered with a `cleared` event; a `segment_end` is
answered with `segment_done` in the block that consumes the last sample before it.

    encode   items → ring; this block's audio; per-frame features (the model's audio encoder)
    denoise  features + recurrent motion state → per-frame motion (the model, batched)
    decode   motion → frames; Output(frames, audio, events)

The model parts are an `AudioFace` (face.py); a real audio-to-video model replaces `EnergyFace`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import torch

from libs import voice_items
from libs.errors import UnsupportedInput
from libs.schemas.common import InputItem
from libs.schemas.engine import AUDIO_SAMPLE_RATE, SessionInit
from libs.schemas.voice import ClearItem, VoiceEvent
from services.engine_host.backends.base import Output
from services.engine_host.backends.talking_head import ring
from services.engine_host.backends.talking_head.face import AudioFace, EnergyFace


class TalkingHeadConfig(msgspec.Struct, frozen=True, kw_only=True):
    frames: int = 4  # video frames per block
    fps: float = 25.0
    image: int = 128  # square frames
    grid: int = 8
    d_motion: int = 16
    ring_s: float = 8.0  # the most audio a session buffers ahead of playback
    max_item_s: float = 1.0  # the longest audio item
    max_marks: int = 32  # segment ends waiting for their audio
    tiers: tuple[int, ...] = (1, 2)


@dataclass(frozen=True, slots=True)
class Audio:
    seq: int
    pcm: torch.Tensor  # int16 [n]


@dataclass(frozen=True, slots=True)
class Control:
    seq: int
    kind: str  # "clear" | "segment_end"
    reason: str = ""


@dataclass
class Carry:
    audio: torch.Tensor  # int16: what this block consumed
    feats: torch.Tensor  # float32 [frames, k]
    events: list[VoiceEvent]
    motion: torch.Tensor | None = None


class TalkingHeadBackend:
    name: ClassVar[str] = "talking_head"
    config_type: ClassVar[type] = TalkingHeadConfig
    input_kinds = frozenset({"audio", "clear", "segment_end"})
    batchable = True
    # Its clients (AvatarStream under a voice agent's transport) play the audio at real time and each
    # frame with its audio: no playout hold on the host, which would add up to a period of latency.
    client_paced = True
    sample_rate = AUDIO_SAMPLE_RATE

    def __init__(self, config: TalkingHeadConfig | None = None, device: torch.device | str = "cpu",
                 face: AudioFace | None = None) -> None:
        c = self.config = config or TalkingHeadConfig()
        self.device = torch.device(device)
        self.tiers = tuple(sorted(c.tiers))
        spf = self.sample_rate / c.fps
        if spf != int(spf):
            raise UnsupportedInput(f"{c.fps} fps does not divide {self.sample_rate} Hz into whole samples")
        self.samples_per_frame = int(spf)
        self.samples_per_block = c.frames * self.samples_per_frame
        self.media_s_per_block = c.frames / c.fps
        self.ring_samples = int(c.ring_s * self.sample_rate)
        self.max_item_samples = int(c.max_item_s * self.sample_rate)
        self.max_input_bytes = voice_items.audio_item_bytes(self.max_item_samples)
        self.face = face or EnergyFace(image=c.image, grid=c.grid, d_motion=c.d_motion, device=self.device)

    def config_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.config)

    def init_state(self, seed: int, init: SessionInit) -> dict:
        return {"ring": torch.zeros(self.ring_samples, dtype=torch.int16, device=self.device),
                "marks": torch.zeros((self.config.max_marks, 2), dtype=torch.int64, device=self.device),
                "face": self.face.init_state(seed, init),
                "seed": seed, "block": 0, "head": 0, "tail": 0, "played": 0, "dropped": 0, "overflow": 0,
                "segment_start": 0, "marks_n": 0}

    def state_spec(self) -> dict:
        return {"ring": (torch.int16, (self.ring_samples,)), "marks": (torch.int64, (self.config.max_marks, 2)),
                "face": self.face.state_spec(), "seed": int, "block": int, "head": int, "tail": int,
                "played": int, "dropped": int, "overflow": int, "segment_start": int, "marks_n": int}

    def parse_input(self, item: InputItem) -> Audio | Control:
        where = {"session_id": item.session_id, "seq": item.seq}
        if item.kind == "audio":
            raw = voice_items.audio_pcm(item.data, max_samples=self.max_item_samples,
                                        sample_rate=self.sample_rate, **where)
            return Audio(item.seq, torch.frombuffer(bytearray(raw), dtype=torch.int16))
        if item.kind in voice_items.CONTROL_KINDS:
            value = voice_items.control(item.kind, item.data, **where)
            return Control(item.seq, item.kind, value.reason if isinstance(value, ClearItem) else "")
        raise UnsupportedInput(f"talking_head takes audio, clear and segment_end items, not {item.kind}",
                               field="kind", **where)

    # ------------------------------------------------------------ the three stages

    def encode(self, state: dict, inputs: list[Any]) -> Carry:
        """Owns the ring and its counters."""
        block = state["block"] + 1
        events: list[VoiceEvent] = []
        for x in inputs:
            if isinstance(x, Audio):
                ring.push(state, x.pcm.to(self.device))
            elif x.kind == "clear":
                events.append(self._cleared(state, x, block))
            else:
                evicted = ring.add_mark(state, x.seq)
                if evicted is not None:
                    events.append(self._segment_done(state, *evicted, block))
        audio = ring.take(state, self.samples_per_block).cpu()
        events.extend(self._segment_done(state, pos, seq, block) for pos, seq in ring.due_marks(state))
        padded = torch.zeros(self.samples_per_block, dtype=torch.float32)
        padded[: audio.shape[0]] = audio.float() / 32768.0
        return Carry(audio=audio, feats=self.face.features(padded, self.config.frames), events=events)

    def denoise(self, state: dict, carry: Carry, steps: int) -> Carry:
        return self.denoise_batch([state], [carry], steps)[0]

    def denoise_batch(self, states: list[dict], carries: list[Carry], steps: int) -> list[Carry]:
        """Owns the face model's state and `block`."""
        motions = self.face.motion_batch([s["face"] for s in states], [c.feats for c in carries], steps)
        for s, c, m in zip(states, carries, motions, strict=True):
            c.motion = m
            s["block"] += 1
        return carries

    def decode(self, state: dict, carry: Carry) -> Output:
        assert carry.motion is not None  # set by denoise, which every block runs before decode
        frames = self.face.render(state["face"], carry.motion, carry.feats)
        events = [msgspec.json.encode(e) for e in carry.events]
        return Output(frames=frames.cpu(), audio=carry.audio, events=events)

    # ------------------------------------------------------------ events

    def _cleared(self, state: dict, x: Control, block: int) -> VoiceEvent:
        pending = state["head"] - state["tail"]
        segment_played = max(0, state["tail"] - state["segment_start"])
        ring.drop_all(state)
        state["segment_start"] = state["head"]
        return VoiceEvent(event="cleared", seq=x.seq, block=block, sample_rate=self.sample_rate,
                          played=state["played"], segment_played=segment_played, dropped=pending,
                          interrupted=pending > 0, reason=x.reason)

    def _segment_done(self, state: dict, pos: int, seq: int, block: int) -> VoiceEvent:
        """`pos`: where the segment ended in ring positions (`segment_start` is where it began)."""
        segment_played = max(0, pos - state["segment_start"])
        state["segment_start"] = max(state["segment_start"], pos)
        return VoiceEvent(event="segment_done", seq=seq, block=block, sample_rate=self.sample_rate,
                          played=state["played"], segment_played=segment_played)
