"""The audio-driven avatar (`talking_head`): the backend, its pending-audio ring and its face model."""

from services.engine_host.backends.talking_head.backend import TalkingHeadBackend, TalkingHeadConfig

__all__ = ["TalkingHeadBackend", "TalkingHeadConfig"]
