"""Helpers for the UDP tests: loopback sockets, draining them, cutting a byte stream at
arbitrary places (test_udpio, test_udp_bundles)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

try:
    from flowrouter.net import _udpio  # type: ignore[attr-defined]  # noqa: F401
    NATIVE = True
except ImportError:
    NATIVE = False


@contextlib.contextmanager
def udp_sockets(n: int, rcvbuf: int = 4 << 20) -> Iterator[list[socket.socket]]:
    """*n* non-blocking UDP sockets bound to 127.0.0.1, closed afterwards."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def drain(sock: socket.socket) -> list[bytes]:
    """Every datagram waiting on *sock*."""
    out = []
    while True:
        try:
            out.append(sock.recv(65536))
        except BlockingIOError:
            return out


def cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    """*stream* split at *cuts* (arbitrary places, even inside headers)."""
    points = sorted({c % (len(stream) + 1) for c in cuts})
    pieces, prev = [], 0
    for p in [*points, len(stream)]:
        pieces.append(stream[prev:p])
        prev = p
    return pieces
