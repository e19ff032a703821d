"""Which addresses WebRTC may use: the host candidates offered and the remote candidates tried.

aiortc adds a public STUN server unless `RTCConfiguration(iceServers=[])` is given, and aioice
offers every interface of the machine except loopback. A server (or a test) that must send to no
address but the ones it names sets both sides here:

- `offer_only(addresses)`: the host candidates aioice gathers in this process are exactly these
  (aioice has no per-connection option for it, so its address lookup is replaced, process-wide);
- `keep_candidates(sdp, addresses)`: a remote description keeps only candidates on these addresses,
  so no connectivity check goes anywhere else (an mDNS `.local` candidate is never resolved either).
  A peer that reaches us from another address still can (peer-reflexive): replies go to its packets'
  source, not to an address an offer named.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import aioice.ice
from aiortc import RTCConfiguration

LOOPBACK = ("127.0.0.1",)


def configuration() -> RTCConfiguration:
    """No STUN or TURN server: only host candidates, only on the addresses `offer_only` set."""
    return RTCConfiguration(iceServers=[])


def offer_only(addresses: Iterable[str]) -> None:
    chosen = [str(ipaddress.ip_address(a.strip())) for a in addresses if a.strip()]
    if not chosen:
        raise ValueError("WebRTC needs at least one address to offer")
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: [  # noqa: ARG005 - aioice's signature
        a for a in chosen if (use_ipv4 if ipaddress.ip_address(a).version == 4 else use_ipv6)]


def keep_candidates(sdp: str, addresses: Iterable[str]) -> str:
    """The SDP without the `a=candidate` lines whose address is not one of `addresses`."""
    allowed = {str(ipaddress.ip_address(a.strip())) for a in addresses if a.strip()}
    lines = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:") and _address(line) not in allowed:
            continue
        lines.append(line)
    return "\r\n".join(lines) + "\r\n"


def _address(line: str) -> str | None:
    # a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ <type> ...
    fields = line.split()
    if len(fields) < 8:
        return None
    try:
        return str(ipaddress.ip_address(fields[4]))
    except ValueError:  # a name (mDNS) or garbage: not an address we allow
        return None
