"""Fence's WebRTC endpoint: a viewer sends an SDP offer and gets the answer (non-trickle).

    POST /v1/sessions/{session_id}/rtc     Authorization: Bearer <input token>
         {"type": "offer", "sdp": "..."}  →  200 {"type": "answer", "sdp": "...", "peer_id": "..."}

The offer needs a video media section and a data channel (an audio section is served where there is
one); the connection then carries the session's output, owner changes and input (rtc_peer.py).
Everything is checked before anything is made, and a refused offer changes nothing: a wrong
token 401, an offer over `max_offer_bytes` 413, an SDP that does not parse or lacks a section 400,
too many peers here (503) or on the session (429). A connection not up within
`negotiation_timeout_s` is closed. A browser page on an allowed origin (the session page) may call it
across origins: the preflight and the answers carry CORS headers for exactly that origin.

Without the `webrtc` extra (aiortc) the endpoint answers 503 and pages keep to the WebSocket path.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

import msgspec
import structlog
from aiohttp import web

from libs import errors
from libs.fence import session_log
from libs.ws_auth import Origins
from services.fence.ingress import Ingress, _bearer
from services.fence.problems import problem
from services.fence.rtc_limits import CONNECTED, OPEN, REFUSED, RtcLimits

if TYPE_CHECKING:  # aiortc is an optional extra: the modules are imported only when an offer comes
    from services.fence.rtc_feed import Feeds
    from services.fence.rtc_peer import Peer

_log = structlog.get_logger("statefleet.fence.rtc")
PATH = "/v1/sessions/{session_id}/rtc"


class Offer(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    sdp: str


class RtcEndpoint:
    def __init__(self, *, nc, ingress: Ingress, origins: Origins, limits: RtcLimits) -> None:
        self.nc, self.ingress, self.origins, self.limits = nc, ingress, origins, limits
        self.peers: dict[str, Peer] = {}
        self.by_session: collections.Counter[str] = collections.Counter()
        self._ice_set = False
        self.feeds: Feeds | None = None  # made with the first offer (it needs the webrtc extra)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(PATH, self._offer)
        app.router.add_route("OPTIONS", PATH, self._preflight)
        app.on_shutdown.append(self._close_all)

    async def _preflight(self, request: web.Request) -> web.Response:
        try:
            self._origin(request)
        except errors.StatefleetError as e:
            return problem(e)
        return web.Response(status=204, headers={**_cors(request), "Access-Control-Allow-Methods": "POST",
                                                 "Access-Control-Allow-Headers": "Authorization, Content-Type",
                                                 "Access-Control-Max-Age": "600"})

    async def _offer(self, request: web.Request) -> web.Response:
        try:
            self._origin(request)
        except errors.StatefleetError as e:
            return problem(e)  # no CORS headers: that origin's page cannot read the answer
        try:
            answer = await self._negotiate(request)
        except errors.StatefleetError as e:
            response = problem(e)
        else:
            response = web.json_response(answer)
        response.headers.update(_cors(request))
        return response

    async def _negotiate(self, request: web.Request) -> dict:
        session_id = session_log.check_session_id(request.match_info["session_id"])
        token = _bearer(request)
        try:
            await self.ingress.sessions.authenticate(session_id, token)
        except errors.Unauthorized:
            REFUSED.add(1, {"reason": "token"})
            raise
        body = await request.read()  # bounded by the app's client_max_size (and read by the guard already)
        if len(body) > self.limits.max_offer_bytes:
            REFUSED.add(1, {"reason": "too_large"})
            raise errors.TooLarge(f"an offer is at most {self.limits.max_offer_bytes} bytes",
                                  max_offer_bytes=self.limits.max_offer_bytes)
        sdp = _checked_offer(body)
        if len(self.peers) >= self.limits.max_peers:
            REFUSED.add(1, {"reason": "peers"})
            raise errors.Unavailable(f"{self.limits.max_peers} WebRTC viewers are connected here; retry",
                                     max_peers=self.limits.max_peers, retry_after_s=1)
        if self.by_session[session_id] >= self.limits.max_peers_per_session:
            REFUSED.add(1, {"reason": "session_peers"})
            raise errors.Busy(f"{self.limits.max_peers_per_session} WebRTC viewers watch this session already",
                              session_id=session_id, max_peers_per_session=self.limits.max_peers_per_session)
        peer_type = _peer_type()
        if not self._ice_set:
            from libs import rtc_ice
            from services.fence.rtc_feed import Feeds
            rtc_ice.offer_only(self.limits.addresses())
            self.feeds = Feeds(self.nc)
            self._ice_set = True
        peer = peer_type(nc=self.nc, ingress=self.ingress, feeds=self.feeds, session_id=session_id, token=token,
                         limits=self.limits, on_closed=self._forget)
        self.peers[peer.peer_id] = peer
        self.by_session[session_id] += 1
        OPEN.add(1)
        try:
            answer = await asyncio.wait_for(peer.answer(sdp), self.limits.negotiation_timeout_s)
        except TimeoutError:
            REFUSED.add(1, {"reason": "deadline"})
            await peer.close("negotiation deadline")
            raise errors.Timeout("the answer was not ready in time", session_id=session_id) from None
        except Exception as e:  # aiortc refusing the description: its checks are the SDP's own rules
            REFUSED.add(1, {"reason": "bad_offer"})
            await peer.close("bad offer")
            raise errors.BadRequest(f"offer refused: {_reason(e)}", field="sdp") from None
        CONNECTED.add(1)
        _log.info("rtc_peer_answered", session_id=session_id, peer_id=peer.peer_id)
        return {"type": "answer", "sdp": answer, "peer_id": peer.peer_id}

    def _origin(self, request: web.Request) -> None:
        self.origins.check(request)

    def _forget(self, peer) -> None:
        if self.peers.pop(peer.peer_id, None) is not None:
            self.by_session[peer.session_id] -= 1
            if self.by_session[peer.session_id] <= 0:
                del self.by_session[peer.session_id]

    async def _close_all(self, _: web.Application) -> None:
        await asyncio.gather(*(p.close("fence stopping") for p in list(self.peers.values())),
                             return_exceptions=True)


def _peer_type():
    try:
        from services.fence.rtc_peer import Peer
    except ImportError:
        REFUSED.add(1, {"reason": "unavailable"})
        raise errors.Unavailable("WebRTC is not installed here (pip install 'statefleet[webrtc]'); "
                                 "use the output WebSocket") from None
    return Peer


def _checked_offer(body: bytes) -> str:
    """The offer's SDP, refused (400) unless it is a well-formed offer with video and a data channel."""
    try:
        offer = msgspec.json.decode(body, type=Offer)
    except msgspec.DecodeError as e:
        REFUSED.add(1, {"reason": "bad_offer"})
        raise errors.BadRequest(f"malformed offer: {e}", field="body") from None
    problem_text = _sdp_problem(offer)
    if problem_text:
        REFUSED.add(1, {"reason": "bad_offer"})
        raise errors.BadRequest(f"offer refused: {problem_text}", field="sdp")
    return offer.sdp


def _sdp_problem(offer: Offer) -> str:
    if offer.type != "offer":
        return f"type must be \"offer\", not {offer.type[:20]!r}"
    try:
        from aiortc.sdp import SessionDescription
        parsed = SessionDescription.parse(offer.sdp)
    except ImportError:
        return ""  # refused as unavailable next
    except Exception as e:  # aiortc's parser raises what its string handling hits on garbage
        return f"SDP does not parse ({_reason(e)})"
    kinds = [m.kind for m in parsed.media]
    if "video" not in kinds or "application" not in kinds:
        return "an offer needs a video section and a data channel"
    if len(kinds) > 3:
        return "an offer has at most one video, one audio and one data-channel section"
    for m in parsed.media:
        if m.ice is None or not (m.ice.usernameFragment and m.ice.password) or m.dtls is None or not m.dtls.fingerprints:
            return f"the {m.kind} section lacks ICE credentials or a DTLS fingerprint"
    return ""


def _reason(e: Exception) -> str:
    return (str(e) or type(e).__name__)[:200]


def _cors(request: web.Request) -> dict[str, str]:
    origin = request.headers.get("Origin")
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"} if origin else {}
