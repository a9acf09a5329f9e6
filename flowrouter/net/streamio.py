"""Stream I/O without per-read allocations: a reused receive buffer and a gathered write.

:class:`RecvBuffer` is what a TCP link reads into (asyncio's ``BufferedProtocol``): one
``bytearray`` per connection, reused for every read, so a read allocates nothing and touches
no fresh pages (a fresh ``bytes`` object per 256 KiB read page-faults its way in, which cost
a fifth of a router's CPU at 64 KiB frames). The bytes of an incomplete frame stay where
they are and are moved to the front only when the room behind them runs short.

Anything that outlives one read must not point into the buffer: the next read overwrites
it. :func:`write_gathered` therefore writes buffers that may be views into it with one
``writev`` straight to the socket when the transport has nothing queued (nothing is kept),
and hands the transport only owned copies of what the socket did not take.

May import only the standard library.
"""

from __future__ import annotations

import os
from typing import Any

#: first size of a link's receive buffer; it doubles (up to RECV_MAX) while reads fill it
RECV_INITIAL = 64 * 1024
#: largest a receive buffer grows for throughput (a frame larger than this still fits: the
#: buffer grows to hold one whole frame of the link's largest payload); the router's
#: ``read_buffer`` setting
RECV_MAX = 1024 * 1024
#: a grown buffer halves once this many reads in a row used under a quarter of it (a link
#: that was busy once does not keep a large buffer for ever)
SHRINK_AFTER = 256
#: move a kept incomplete frame to the front once less than this is free behind it
MIN_READ = 16 * 1024
#: at most this many buffers per writev (Linux's IOV_MAX is 1024)
IOV_MAX = 1024


class RecvBuffer:
    """A reused receive buffer: ``view[start:end]`` holds bytes not yet consumed.

    The owner reads into :meth:`space`, reports the read with :meth:`filled`, consumes from
    ``start`` and reports where it stopped with :meth:`keep` (which may move or reallocate
    the kept bytes: no view into the buffer may be held across it)."""

    __slots__ = ("buf", "view", "start", "end", "least", "most", "need", "_grow", "_small")

    def __init__(self, initial: int = RECV_INITIAL, most: int = RECV_MAX) -> None:
        self.buf = bytearray(initial)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0
        self.least = initial
        self.most = max(most, initial)
        #: bytes the frame at ``start`` needs in all, as told to :meth:`keep` (0: unknown)
        self.need = 0
        self._grow = False  #: the last read filled all the room it was offered
        self._small = 0  #: reads in a row that used under a quarter of the buffer

    @property
    def pending(self) -> int:
        """Bytes received and not consumed (an incomplete frame)."""
        return self.end - self.start

    @property
    def waiting(self) -> bool:
        """The frame kept at ``start`` is still incomplete: nothing to do yet (a large frame
        arriving in many small reads is looked at once, when whole)."""
        return self.end - self.start < self.need

    def space(self) -> memoryview:
        """Where the next read goes (never empty)."""
        return self.view[self.end:]

    def filled(self, n: int) -> None:
        """*n* bytes were read into :meth:`space`."""
        self.end += n
        size = len(self.buf)
        self._grow = self.end == size
        self._small = self._small + 1 if n < size >> 2 else 0

    def take(self) -> bytes:
        """An owned copy of the unconsumed bytes; the buffer is empty afterwards."""
        data = bytes(self.view[self.start:self.end])
        self.start = self.end = self.need = 0
        self._regrow(0)
        return data

    def load(self, data: bytes | bytearray | memoryview) -> None:
        """Start over with *data* as the unconsumed bytes (a stream changing hands)."""
        self.start = self.end = self.need = 0
        if len(data) > len(self.buf):
            self._realloc(len(data), 0)
        self.view[:len(data)] = data
        self.end = len(data)

    def keep(self, pos: int, need: int) -> None:
        """Everything before *pos* is consumed; what follows starts a frame of *need* bytes
        in all (or at least that many, when its header is not in yet). Makes sure the frame
        will fit and that a useful read fits behind it."""
        have = self.end - pos
        self.need = need if have > 0 else 0
        if have <= 0:
            self.start = self.end = 0
            self._regrow(0)
            return
        self.start = pos
        size = len(self.buf)
        target = max(size * 2 if self._grow and size < self.most else size, need)
        if target > size:
            self._realloc(target, have)
        elif size - self.end < max(need - have, MIN_READ):
            self.view[:have] = self.view[pos:self.end]  # memoryview assignment is a memmove
            self.start, self.end = 0, have

    def _regrow(self, have: int) -> None:
        size = len(self.buf)
        if self._grow and size < self.most:
            self._realloc(min(size * 2, self.most), have)
        elif self._small >= SHRINK_AFTER and size > self.least and have <= size >> 2:
            self._realloc(max(size >> 1, self.least), have)

    def _realloc(self, size: int, have: int) -> None:
        """A new buffer of *size* bytes with the *have* unconsumed bytes at its front (a new
        object rather than a resize: a resize fails while any view into the buffer lives)."""
        new = bytearray(size)
        new[:have] = self.view[self.start:self.start + have]
        self.buf = new
        self.view = memoryview(new)
        self.start, self.end = 0, have
        self._grow = False
        self._small = 0


def write_gathered(transport: Any, fd: int, buffers: list[Any]) -> None:
    """Write *buffers* (bytes or views into a buffer about to be reused) in order.

    With *fd* (>= 0: the transport's own socket, read and written only by asyncio's
    selector loop) and nothing queued in the transport, one ``writev`` per IOV_MAX buffers
    goes straight to the socket, and only what it does not take is queued, as owned copies.
    Otherwise every view is copied and handed to the transport."""
    if fd >= 0 and not transport.get_write_buffer_size():
        i, sent = write_direct(fd, buffers)
        if i < len(buffers):
            keep_rest(transport, buffers, i, sent)
        return
    keep_rest(transport, buffers, 0, 0)


def write_direct(fd: int, buffers: list[Any]) -> tuple[int, int]:
    """``writev`` *buffers* to the socket *fd* (IOV_MAX at a time) until it takes no more.
    Returns ``(i, sent)``: ``buffers[:i]`` went whole, and *sent* bytes of ``buffers[i]``.
    An error other than a full socket stops it too (the transport meets the error itself
    on the write of the rest). Touches no object but its arguments, so another thread may
    run it while the loop's thread waits (:class:`GatheredWrites`)."""
    i, nbuf = 0, len(buffers)
    while i < nbuf:
        chunk = buffers[i:i + IOV_MAX]
        try:
            sent = os.writev(fd, chunk)
        except OSError:  # full (BlockingIOError), interrupted, or broken: the rest waits
            return i, 0
        for b in chunk:
            size = len(b)
            if sent < size:
                return i, sent
            sent -= size
            i += 1
    return i, 0


def keep_rest(transport: Any, buffers: list[Any], i: int, sent: int) -> None:
    """Hand the transport what :func:`write_direct` left: the tail of ``buffers[i]`` after
    *sent* bytes, then the buffers after it."""
    if sent:  # the tail of a buffer the socket took in part (a view of an immutable bytes
        # object, a fan-out's shared run say, may be kept as it is)
        b = buffers[i]
        tail = memoryview(b)[sent:]
        transport.write(tail if type(b) is bytes else bytes(tail))
        i += 1
    # owned copies: some transports keep what they are given (uvloop holds the buffers of
    # a deferred write, asyncio 3.12+ queues views), and this buffer is about to be reused
    # (one write each: asyncio 3.11's writelines would join them, copying them once more)
    for b in buffers[i:]:
        transport.write(b if type(b) is bytes else bytes(b))
