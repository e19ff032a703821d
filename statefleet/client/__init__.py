"""statefleet's client library for voice agents: `AvatarStream` drives a talking-avatar session
(audio in; lip-synced frames and the same audio out; `clear` and `segment_end`)."""

from libs.audio_resample import Resampler
from statefleet.client.blocks import AvatarBlock, BlockAssembler
from statefleet.client.stream import AvatarStream

__all__ = ["AvatarBlock", "AvatarStream", "BlockAssembler", "Resampler"]
