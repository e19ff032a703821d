"""Socket plumbing both ends of the TCP data plane share: tuning, addresses, connect, listen, exact reads.

Reads are blocking and run on threads (the frame loop, the acknowledgement, the
hello): one implementation, so a short read means the same thing everywhere.
"""

from __future__ import annotations

import asyncio
import socket

from libs.errors import IntegrityError, Unavailable

SOCK_BUF = 4 << 20


def tune(sock: socket.socket) -> None:
    """No Nagle, 4 MiB socket buffers: what every data-plane socket (and the bench's raw baseline) uses."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def connect(addr: str, timeout_s: float) -> socket.socket:
    """A tuned, blocking socket connected to `addr` (socket I/O then runs on threads); Unavailable if not."""
    host, port = split_addr(addr)
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    sock.setblocking(False)
    tune(sock)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), timeout_s)
    except (OSError, TimeoutError) as e:
        sock.close()
        raise Unavailable(f"cannot reach data plane {addr}: {e}", addr=addr) from None
    sock.setblocking(True)
    return sock


def listen(bind: str) -> tuple[socket.socket, str]:
    """A non-blocking listening socket on `bind` and the address it got (the port filled in)."""
    host, port = split_addr(bind)
    family = _family(host)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    sock.setblocking(False)
    bound = sock.getsockname()
    return sock, f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"{bound[0]}:{bound[1]}"


def recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from a blocking socket; a peer that hangs up first is an IntegrityError."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise IntegrityError(f"connection closed after {got} of {len(view)} bytes")
        got += n


def recv_bytes(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into(sock, memoryview(buf))
    return bytes(buf)
