"""Batched datagram I/O for the router's UDP socket: many datagrams per system call, many
frames per datagram.

A UDP link pays per datagram (a system call, socket-buffer accounting, a loopback delivery),
so the number of datagrams decides its message rate. Here the node's shared, non-blocking UDP
socket is drained a bounded batch at a time (``recv``: up to ``batch`` datagrams, returned as
a view of their bytes back to back in a reused buffer, ``(address, length, frames)`` per
datagram, and the kernel's count of datagrams it dropped for a full receive buffer), and
everything the node sends in one wake-up leaves in one call (``send``: a list of
``(destination, buffers, bundle)`` whose buffers hold whole frames back to back).

**Bundles.** A datagram of a router UDP link holds one or more whole frames back to back
(never part of one). ``send`` packs the frames of each item into datagrams of at most
``bundle`` bytes in order (:func:`bundle_frames`: a frame that does not fit closes the
datagram; a frame larger than ``bundle`` travels alone; at most :data:`MAX_SEGMENTS` buffer
pieces per datagram, the kernel's ``UIO_MAXIOV``); ``bundle`` 0 (or an item of two) sends each
frame as its own datagram, for peers that did not announce
:data:`flowrouter.wire.control.FEATURE_DGRAM_BUNDLE`. ``recv`` reports how many whole frames
each datagram holds (:func:`frames_in`; 0: it is not whole frames, or was truncated), so the
node walks headers only where the forwarding engine stops.

**Offloads.** Where the kernel has them, ``send`` hands each run of equal datagrams to one
address (:func:`gso_runs`) to the kernel in one message with ``UDP_SEGMENT`` (GSO: the
stack is walked once per run, and the wire still sees the same datagrams), and ``recv``
takes what ``UDP_GRO`` coalesced apart again (:func:`gro_split`). That matters for bundles
sized to an MTU (1472 bytes); toward loopback a bundle is already as large as a datagram
gets. A GSO send the kernel refuses (no support, a device without checksum offload, a
segment over the MTU) turns GSO off for the socket, logged once and counted
(``offloads.gso_refused``); ``FLOWNET_UDP_GSO=0`` keeps it off.

Two implementations with the same interface and results:

* :class:`PyDatagramIO` — ``recvmsg_into`` / ``sendmsg`` in a loop; the reference;
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
is the last such error, 0 if none). Receive-buffer overflows are counted by the kernel per
socket (``SO_RXQ_OVFL``, asked for when the I/O object is made): ``recv`` returns the newest
count it saw, so the node can count what it never got to read (``drop.udp-rcvbuf``).

May import the standard library only (the socket is the node's).
"""

from __future__ import annotations

import errno as _errno
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["PyDatagramIO", "NativeDatagramIO", "io_choice", "split_frames", "bundle_frames",
           "frames_in", "enable_drop_count", "set_buffers", "gso_runs", "gro_split",
           "enable_offloads", "BATCH", "MAX_DATAGRAM", "MAX_SEGMENTS"]

ENV = "FLOWNET_NATIVE"
IO_ENV = "FLOWNET_UDP_IO"
#: datagrams taken per wake-up at most: the UDP socket yields to TCP reads and timers
#: between batches (the kernel keeps the rest for the next wake-up)
BATCH = 64
#: room per datagram: the largest UDP payload over IPv4 (65507 bytes) fits
MAX_DATAGRAM = 65536
#: buffer pieces one datagram may be sent from (the kernel's UIO_MAXIOV)
MAX_SEGMENTS = 1024
_HEADER = 24  # flowrouter.wire.header.HEADER_SIZE (not imported: this module is I/O only)
_CONGESTED = (_errno.EAGAIN, _errno.EWOULDBLOCK)
#: Linux's SO_RXQ_OVFL (a cmsg with the socket's drop count on each datagram read)
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)
#: Linux's UDP segmentation offload (send) and receive coalescing options (SOL_UDP)
SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
UDP_GRO = getattr(socket, "UDP_GRO", 104)
#: datagrams one GSO send carries at most (the kernel's UDP_MAX_SEGMENTS), and bytes
GSO_SEGMENTS = 64
GSO_BYTES = 65507
GSO_ENV = "FLOWNET_UDP_GSO"
_ANC_SPACE = socket.CMSG_SPACE(4) + socket.CMSG_SPACE(4)
#: errors of a GSO send that mean "not here" (no kernel support, a device without checksum
#: offload, a segment over the path's MTU): its datagrams go one by one from then on
_NO_GSO = (_errno.EIO, _errno.EINVAL, _errno.EOPNOTSUPP, _errno.ENOPROTOOPT)
log = logging.getLogger("flowrouter.net.runtime")

SendResult = tuple[int, int, int, int]
Gram = tuple[tuple[str, int], int, int]
RecvResult = tuple[memoryview, list[Gram], int]


def frames_in(data: Any) -> int:
    """How many whole frames *data* (one datagram) holds back to back; 0 if it is empty or
    not whole frames (a header cut short, a frame running past the end). Only the header's
    size field is read: the frames' other fields are the receiver's to check."""
    view = memoryview(data).cast("B")
    n = len(view)
    pos = count = 0
    while pos < n:
        if n - pos < _HEADER:
            return 0
        pos += _HEADER + int.from_bytes(view[pos + 16:pos + 20], "big")
        count += 1
    return count if pos == n else 0


def enable_drop_count(sock: socket.socket) -> bool:
    """Ask the kernel to report *sock*'s count of dropped datagrams with each datagram read
    (``SO_RXQ_OVFL``); False where it cannot."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    except OSError:
        return False
    return True


def set_buffers(sock: socket.socket, size: int) -> tuple[int, int, str]:
    """Ask for *size*-byte receive and send buffers on *sock* (beyond ``net.core.rmem_max``
    where the process may: ``SO_RCVBUFFORCE``); returns (receive, send) buffer sizes as the
    kernel reports them and, if it gave less than asked, why (else ``""``)."""
    why = []
    for force, opt in ((getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF),
                       (getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:  # not privileged: within the kernel's maximum
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, size)
            except OSError as exc:
                why.append(str(exc))
    rcv = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    snd = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    if rcv < size or snd < size:  # Linux reports twice what it grants (its bookkeeping)
        why.append(f"the kernel caps socket buffers (net.core.rmem_max / wmem_max; "
                   f"receive {rcv}, send {snd} bytes, asked {size})")
    return rcv, snd, "; ".join(why)


def split_frames(buffers: Sequence[Any]) -> list[list[memoryview]]:
    """The frames in *buffers*: whole frames back to back, a frame possibly spread over
    consecutive buffers (a header, then its payload). Each frame is a list of segments.
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


def bundle_frames(frames: list[list[memoryview]], bundle: int) -> list[list[memoryview]]:
    """*frames* (each a list of segments, :func:`split_frames`) packed in order into
    datagrams of at most *bundle* bytes and :data:`MAX_SEGMENTS` segments: a frame that does
    not fit closes the datagram, a frame larger than *bundle* travels alone, *bundle* 0
    gives a datagram per frame. The compiled send packs by the same rule."""
    if bundle <= 0:
        return frames
    grams: list[list[memoryview]] = []
    cur: list[memoryview] = []
    size = 0
    for segs in frames:
        n = sum(map(len, segs))
        if cur and (size + n > bundle or len(cur) + len(segs) > MAX_SEGMENTS):
            grams.append(cur)
            cur, size = [], 0
        cur += segs
        size += n
    if cur:
        grams.append(cur)
    return grams


def gso_runs(grams: Sequence[tuple[Any, int, int, int]]) -> list[int]:
    """How many datagrams each send carries with GSO, for *grams* ``(dest, size, pieces,
    bundle)`` in order: a run of datagrams to one destination, each as large as the first
    (the last may be smaller; a smaller one ends the run), the first no larger than its
    *bundle* (bundles are sized for the path, so segments fit its MTU), at most
    :data:`GSO_SEGMENTS` datagrams, :data:`GSO_BYTES` bytes and :data:`MAX_SEGMENTS` pieces.
    A run of one is a plain datagram. The compiled send groups by the same rule."""
    runs: list[int] = []
    n = len(grams)
    g = 0
    while g < n:
        dest, seg, pieces, bundle = grams[g]
        h = g + 1
        if 0 < seg <= bundle:
            total = seg
            while h < n and h - g < GSO_SEGMENTS:
                d2, size, more, _b = grams[h]
                if (not 0 < size <= seg or total + size > GSO_BYTES or d2 != dest
                        or pieces + more > MAX_SEGMENTS):
                    break
                pieces += more
                total += size
                h += 1
                if size < seg:
                    break
        runs.append(h - g)
        g = h
    return runs


def gro_split(size: int, gro: int) -> list[int]:
    """The datagrams a receive of *size* bytes coalesced by GRO from *gro*-byte segments
    holds (the last may be smaller); ``[size]`` without GRO."""
    if gro <= 0 or size <= gro:
        return [size]
    return [min(gro, size - off) for off in range(0, size, gro)]


def enable_offloads(sock: socket.socket, gso: bool | None = None) -> tuple[bool, bool]:
    """Turn on receive coalescing (``UDP_GRO``) on *sock* and check that segmentation
    offload (``UDP_SEGMENT``) is there: ``(gso, gro)``, each False where the kernel lacks it.
    *gso* None follows ``FLOWNET_UDP_GSO`` (``0``: off), else on where supported."""
    if gso is None:
        gso = os.environ.get(GSO_ENV, "").strip().lower() not in ("0", "off", "no", "false")
    if gso:
        try:
            sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)  # 0: no default segment size
        except OSError:
            gso = False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        gro = True
    except OSError:
        gro = False
    return gso, gro


def _ancillary(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, int]:
    """(the socket's drop count, the GRO segment size) a datagram read carried, 0 if not."""
    drops = gro = 0
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
            drops = int.from_bytes(data[:4], sys.byteorder)  # a host-order uint32
        elif level == SOL_UDP and kind == UDP_GRO and len(data) >= 4:
            gro = int.from_bytes(data[:4], sys.byteorder, signed=True)
    return drops, gro


class _Offloads:
    """GSO and GRO on one socket, shared by both twins: what the kernel offers, and GSO
    turned off for good (counted, logged once) when a send shows it does not work here."""

    __slots__ = ("gso", "gro", "gso_refused")

    def __init__(self, sock: socket.socket, gso: bool | None) -> None:
        self.gso, self.gro = enable_offloads(sock, gso)
        #: GSO sends the kernel refused (then GSO is off for this socket)
        self.gso_refused = 0

    def refused(self, err: int) -> None:
        self.gso_refused += 1
        if self.gso:
            self.gso = False
            log.warning("UDP segmentation offload refused by the kernel (%s): sending "
                        "datagrams one by one from now on", os.strerror(err))


class PyDatagramIO:
    """The reference: one ``recvmsg_into`` / ``sendmsg`` per datagram (or per GSO run)."""

    native = False
    description = "Python datagram loop (recvmsg_into / sendmsg per datagram)"

    __slots__ = ("sock", "batch", "drops_visible", "offloads", "_buf", "_view")

    def __init__(self, sock: socket.socket, batch: int = BATCH, gso: bool | None = None
                 ) -> None:
        self.sock = sock
        self.batch = max(1, batch)
        #: whether the kernel reports receive-buffer drops on this socket (SO_RXQ_OVFL)
        self.drops_visible = enable_drop_count(sock)
        self.offloads = _Offloads(sock, gso)
        self._buf = bytearray(MAX_DATAGRAM * self.batch)
        self._view = memoryview(self._buf)

    def dest(self, addr: tuple[str, int]) -> Any:
        """What :meth:`send` takes for *addr* (here the address itself)."""
        return addr

    def recv(self) -> RecvResult:
        """Up to ``batch`` waiting datagrams (a GRO receive counts once and gives the
        datagrams it joined): (a view of their bytes back to back, [(from, length, whole
        frames)], the socket's drop count as of the newest datagram, 0 if not reported).
        Nothing waiting: an empty view, ``[]``, 0. An error with nothing received raises
        OSError. The view is into a buffer the next call reuses (no allocation, no fresh
        pages per batch): nothing may point into it past the batch's handling, as with a
        TCP link's receive buffer (:mod:`flowrouter.net.streamio`)."""
        sock, view = self.sock, self._view
        grams: list[Gram] = []
        pos = drops = 0
        for _ in range(self.batch):
            try:
                n, anc, flags, addr = sock.recvmsg_into([view[pos:pos + MAX_DATAGRAM]],
                                                        _ANC_SPACE)
            except BlockingIOError:
                break
            except OSError:
                if grams:
                    break  # reported by the next call
                raise
            dropped, gro = _ancillary(anc) if anc else (0, 0)
            drops = max(drops, dropped)
            src = (addr[0], addr[1])
            truncated = bool(flags & socket.MSG_TRUNC)
            for size in gro_split(n, 0 if truncated else gro):
                grams.append((src, size, 0 if truncated else frames_in(view[pos:pos + size])))
                pos += size
        return view[:pos], grams, drops

    def send(self, items: Sequence[tuple[Any, ...]]) -> SendResult:
        """Send the frames of *items* (``(dest, buffers[, bundle])``) in datagrams packed
        by :func:`bundle_frames` (a frame per datagram without *bundle*); with GSO, runs of
        them (:func:`gso_runs`) leave in one send each."""
        flat: list[tuple[Any, list[memoryview], int]] = []
        for it in items:
            bundle = it[2] if len(it) > 2 else 0
            flat += [(it[0], g, bundle)
                     for g in bundle_frames(split_frames(it[1]), bundle)]
        sock, off = self.sock, self.offloads
        sent = congested = failed = err = 0
        i = 0
        runs = gso_runs([(d, sum(map(len, g)), len(g), b) for d, g, b in flat]) \
            if off.gso else [1] * len(flat)
        k = 0
        while k < len(runs):
            run = runs[k]
            dest, segs, _b = flat[i]
            anc = []
            if run > 1:
                segs = [s for _d, g, _b2 in flat[i:i + run] for s in g]
                size = sum(map(len, flat[i][1]))
                anc = [(SOL_UDP, UDP_SEGMENT, size.to_bytes(2, sys.byteorder))]
            try:
                sock.sendmsg(segs, anc, 0, dest)
                sent += run
            except BlockingIOError:
                congested += run
            except OSError as exc:
                if run > 1 and exc.errno in _NO_GSO and off.gso:
                    off.refused(exc.errno or 0)  # this run and the rest, one by one
                    runs = runs[:k] + [1] * (len(flat) - i)
                    continue
                failed += run
                err = exc.errno or 0
            i += run
            k += 1
        return sent, congested, failed, err


class NativeDatagramIO:
    """``recvmmsg`` / ``sendmmsg`` through ``flowrouter.net._udpio``."""

    native = True
    description = "compiled datagram batches (recvmmsg / sendmmsg, flowrouter.net._udpio)"

    __slots__ = ("sock", "batch", "fd", "drops_visible", "offloads", "_mod", "_buf",
                 "_view")

    def __init__(self, sock: socket.socket, batch: int = BATCH, gso: bool | None = None
                 ) -> None:
        from flowrouter.net import _udpio  # type: ignore[attr-defined]

        self._mod = _udpio
        self.sock = sock
        self.batch = max(1, min(batch, _udpio.MAX_BATCH))
        self.fd = sock.fileno()
        self.drops_visible = enable_drop_count(sock)
        self.offloads = _Offloads(sock, gso)
        self._buf = bytearray(MAX_DATAGRAM * self.batch)
        self._view = memoryview(self._buf)

    def dest(self, addr: tuple[str, int]) -> Any:
        """The socket address of *addr* in the kernel's form (names resolved once here)."""
        try:
            return self._mod.sockaddr(addr[0], addr[1])
        except ValueError:  # a name, not a numeric address
            info = socket.getaddrinfo(addr[0], addr[1], self.sock.family, socket.SOCK_DGRAM)
            host, port = info[0][4][:2]
            return self._mod.sockaddr(host, port)

    def recv(self) -> RecvResult:
        total, grams, drops = self._mod.recv_into(self.fd, self._buf, self.batch, MAX_DATAGRAM)
        return self._view[:total], grams, drops

    def send(self, items: Sequence[tuple[Any, ...]]) -> SendResult:
        off = self.offloads
        sent, congested, failed, err, gso_err = self._mod.send(self.fd, items, off.gso)
        if gso_err:
            off.refused(gso_err)
        return sent, congested, failed, err


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
