"""The limits on fence's WebRTC viewers and the metrics that count them (no aiortc import here)."""

from __future__ import annotations

from dataclasses import dataclass

from libs.telemetry import counter, meter

REFUSED = counter("sf_fence_rtc_refused_total",
                  "WebRTC offers refused and peer connections dropped, by reason (token, bad_offer, too_large, "
                  "peers, session_peers, deadline, consent, slow_reader, unavailable)")
CONNECTED = counter("sf_fence_rtc_connected_total", "WebRTC peer connections that completed negotiation")
OPEN = meter().create_up_down_counter("sf_fence_rtc_open_peers", description="WebRTC peer connections open now")


@dataclass(frozen=True, slots=True, kw_only=True)
class RtcLimits:
    max_peers: int = 64  # per fence instance (each one encodes its own VP8 and Opus)
    max_peers_per_session: int = 4
    negotiation_timeout_s: float = 10.0  # from the offer to a connected peer with its data channel
    max_offer_bytes: int = 32 * 1024
    max_buffered_bytes: int = 1 << 20  # unread data-channel bytes before the viewer is dropped
    ice_addresses: str = "127.0.0.1"  # comma-separated: the host candidates offered and the only peers tried

    def addresses(self) -> list[str]:
        return [a.strip() for a in self.ice_addresses.split(",") if a.strip()]
