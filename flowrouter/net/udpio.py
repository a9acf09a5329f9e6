"""Batched datagram I/O for the router's UDP socket: many datagrams per system call.

A UDP link carries one frame per datagram, so the per-datagram costs (a future per
``recv``, a ``sendmsg`` per frame) decide its message rate. Here the node's shared,
non-blocking UDP socket is drained a bounded batch at a time (``recv``: up to ``batch``
datagrams, returned as one buffer of their bytes back to back plus ``(address, length)`` per
datagram), and everything the node sends in one wake-up leaves in one call (``send``: a list
of ``(destination, buffers)`` whose buffers hold whole frames back to back; each frame
becomes one datagram).

Two implementations with the same interface and results:

* :class:`PyDatagramIO` — ``recvfrom_into`` / ``sendmsg`` in a loop; the reference;
* :class:`NativeDatagramIO` — ``recvmmsg`` / ``sendmmsg`` through the optional C extension
  ``flowrouter.net._udpio`` (``_udpio.c``), used when it was built.

:func:`io_choice` picks one like :func:`flowrouter.core.fastpath.engine_choice` picks the
forwarding engine: ``FLOWNET_NATIVE=0`` (or ``twin``) forces the Python loops; otherwise the
compiled one when it imports. ``FLOWNET_UDP_IO=py`` forces the Python loops for datagram I/O
alone (the forwarding engine stays as chosen), to measure what the batched system calls buy.
The node reports the choice in its log and status.

Send results are ``(sent, congested, failed, errno)``: datagrams the kernel took, datagrams
refused because the socket buffer was full (EAGAIN: the node counts them
``drop.link-congested``), datagrams refused for another error (``drop.udp-error``; ``errno``
is the last such error, 0 if none).

May import the standard library only (the socket is the node's).
"""

from __future__ import annotations

import errno as _errno
import os
import socket
from collections.abc import Sequence
from typing import Any

__all__ = ["PyDatagramIO", "NativeDatagramIO", "io_choice", "split_frames", "BATCH",
           "MAX_DATAGRAM"]

ENV = "FLOWNET_NATIVE"
IO_ENV = "FLOWNET_UDP_IO"
#: datagrams taken per wake-up at most: the UDP socket yields to TCP reads and timers
#: between batches (the kernel keeps the rest for the next wake-up)
BATCH = 64
#: room per datagram: the largest UDP payload over IPv4 (65507 bytes) fits
MAX_DATAGRAM = 65536
_HEADER = 24  # flowrouter.wire.header.HEADER_SIZE (not imported: this module is I/O only)
_CONGESTED = (_errno.EAGAIN, _errno.EWOULDBLOCK)

SendResult = tuple[int, int, int, int]


def split_frames(buffers: Sequence[Any]) -> list[list[memoryview]]:
    """The datagrams in *buffers*: whole frames back to back, a frame possibly spread over
    consecutive buffers (a header, then its payload). Each datagram is a list of segments.
    Raises ValueError if the buffers end inside a frame (a caller's bug, never input)."""
    grams: list[list[memoryview]] = []
    segs: list[memoryview] = []
    head = bytearray()  # a header spread over buffers
    left = 0  # bytes of the current frame's payload still to take (0: at a header)
    in_frame = False
    for buf in buffers:
        view = memoryview(buf).cast("B")
        pos, n = 0, len(view)
        while pos < n:
            if not in_frame:
                if not head and n - pos >= _HEADER:
                    end = pos + _HEADER + int.from_bytes(view[pos + 16:pos + 20], "big")
                    if end <= n:  # the whole frame is here: one segment
                        grams.append([view[pos:end]])
                        pos = end
                        continue
                take = min(_HEADER - len(head), n - pos)
                head += view[pos:pos + take]
                segs.append(view[pos:pos + take])
                pos += take
                if len(head) < _HEADER:
                    continue
                left = int.from_bytes(head[16:20], "big")
                head.clear()
                in_frame = True
            take = min(left, n - pos)
            if take:
                segs.append(view[pos:pos + take])
                pos += take
                left -= take
            if not left:
                grams.append(segs)
                segs = []
                in_frame = False
    if segs or head or in_frame:
        raise ValueError("the buffers end inside a frame")
    return grams


class PyDatagramIO:
    """The reference: one ``recvfrom_into`` / ``sendmsg`` per datagram."""

    native = False
    description = "Python datagram loop (recvfrom_into / sendmsg per datagram)"

    __slots__ = ("sock", "batch", "_buf", "_view")

    def __init__(self, sock: socket.socket, batch: int = BATCH) -> None:
        self.sock = sock
        self.batch = max(1, batch)
        self._buf = bytearray(MAX_DATAGRAM * self.batch)
        self._view = memoryview(self._buf)

    def dest(self, addr: tuple[str, int]) -> Any:
        """What :meth:`send` takes for *addr* (here the address itself)."""
        return addr

    def recv(self) -> tuple[bytes, list[tuple[tuple[str, int], int]]]:
        """Up to ``batch`` waiting datagrams: (their bytes back to back, [(from, length)]).
        Nothing waiting: ``(b"", [])``. An error with nothing received raises OSError."""
        sock, view = self.sock, self._view
        grams: list[tuple[tuple[str, int], int]] = []
        pos = 0
        for _ in range(self.batch):
            try:
                n, addr = sock.recvfrom_into(view[pos:], MAX_DATAGRAM)
            except BlockingIOError:
                break
            except OSError:
                if grams:
                    break  # reported by the next call
                raise
            pos += n
            grams.append(((addr[0], addr[1]), n))
        return bytes(view[:pos]), grams

    def send(self, items: Sequence[tuple[Any, Sequence[Any]]]) -> SendResult:
        """Send every frame of *items* (``(dest, buffers)``) as its own datagram."""
        plan = [(dest, split_frames(buffers)) for dest, buffers in items]
        sock = self.sock
        sent = congested = failed = err = 0
        for dest, grams in plan:
            for segs in grams:
                try:
                    sock.sendmsg(segs, (), 0, dest)
                    sent += 1
                except BlockingIOError:
                    congested += 1
                except OSError as exc:
                    failed += 1
                    err = exc.errno or 0
        return sent, congested, failed, err


class NativeDatagramIO:
    """``recvmmsg`` / ``sendmmsg`` through ``flowrouter.net._udpio``."""

    native = True
    description = "compiled datagram batches (recvmmsg / sendmmsg, flowrouter.net._udpio)"

    __slots__ = ("sock", "batch", "fd", "_mod")

    def __init__(self, sock: socket.socket, batch: int = BATCH) -> None:
        from flowrouter.net import _udpio  # type: ignore[attr-defined]

        self._mod = _udpio
        self.sock = sock
        self.batch = max(1, min(batch, _udpio.MAX_BATCH))
        self.fd = sock.fileno()

    def dest(self, addr: tuple[str, int]) -> Any:
        """The socket address of *addr* in the kernel's form (names resolved once here)."""
        try:
            return self._mod.sockaddr(addr[0], addr[1])
        except ValueError:  # a name, not a numeric address
            info = socket.getaddrinfo(addr[0], addr[1], self.sock.family, socket.SOCK_DGRAM)
            host, port = info[0][4][:2]
            return self._mod.sockaddr(host, port)

    def recv(self) -> tuple[bytes, list[tuple[tuple[str, int], int]]]:
        return self._mod.recv(self.fd, self.batch, MAX_DATAGRAM)  # type: ignore[no-any-return]

    def send(self, items: Sequence[tuple[Any, Sequence[Any]]]) -> SendResult:
        return self._mod.send(self.fd, items)  # type: ignore[no-any-return]


def _native() -> tuple[Any, str]:
    try:
        from flowrouter.net import _udpio  # type: ignore[attr-defined]  # noqa: F401
    except ImportError as exc:
        return None, f"compiled datagram I/O not built ({exc})"
    return NativeDatagramIO, NativeDatagramIO.description


def io_choice(env: str | None = None, io_env: str | None = None) -> tuple[Any, str]:
    """(datagram I/O class, one line saying which and why) for this process."""
    value = (os.environ.get(ENV, "") if env is None else env).strip().lower()
    if value in ("0", "no", "off", "false", "twin", "py", "python"):
        return PyDatagramIO, f"{PyDatagramIO.description} ({ENV}={value})"
    io_value = (os.environ.get(IO_ENV, "") if io_env is None else io_env).strip().lower()
    if io_value in ("py", "python", "0", "off"):
        return PyDatagramIO, f"{PyDatagramIO.description} ({IO_ENV}={io_value})"
    cls, why = _native()
    if cls is None:
        return PyDatagramIO, f"{PyDatagramIO.description}: {why}"
    return cls, why
