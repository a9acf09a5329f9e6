"""Datagram links for applications: how frames travel in UDP datagrams between a router and
an application (flowlib's ``udp://`` router addresses), sans-I/O.

A datagram is a small prefix and then **one or more whole frames** (the frames of a TCP
link, back to back; no frame is ever split across datagrams: a message larger than a frame
is fragmented by flowlib first)::

    magic "Fd" (2) | version 1 (1) | flags 0 (1) | sequence (4) | frame | frame | ...

Each side numbers the datagrams it sends on a link, 1, 2, 3, ...; the receiver counts the
gaps (:class:`DatagramSequence`): datagram links lose instead of queueing, and the loss is
visible. Anything that is not a prefix followed by whole, valid frames is refused as a
whole (:func:`split_frames` raises :class:`~flowrouter.wire.header.MalformedFrame`): one bad
datagram costs itself, never its neighbours. :class:`DatagramPacker` packs outgoing frames
into as few datagrams as fit. May import the standard library and :mod:`flowrouter.wire`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from flowrouter.wire.header import HEADER_SIZE, MalformedFrame, validate_header

MAGIC = b"Fd"
VERSION = 1
_PREFIX = struct.Struct("!2sBBI")
PREFIX_SIZE = _PREFIX.size  #: 8 bytes
#: the largest datagram (IPv4's UDP payload limit)
MAX_DATAGRAM = 65507
#: the largest frame payload a datagram link carries
MAX_PAYLOAD = MAX_DATAGRAM - PREFIX_SIZE - HEADER_SIZE


def prefix(seq: int) -> bytes:
    return _PREFIX.pack(MAGIC, VERSION, 0, seq & 0xFFFFFFFF)


def split_frames(datagram: bytes | memoryview, max_payload: int = MAX_PAYLOAD
                 ) -> tuple[int, memoryview]:
    """The sequence number and the frames (the bytes after the prefix) of a datagram, after
    checking that they are whole frames; MalformedFrame otherwise."""
    view = memoryview(datagram)
    n = len(view)
    if n < PREFIX_SIZE + HEADER_SIZE:
        raise MalformedFrame("bad-datagram", f"datagram of {n} bytes holds no frame")
    magic, version, _flags, seq = _PREFIX.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        raise MalformedFrame("bad-datagram", "not a flownet datagram (bad magic or version)")
    pos = PREFIX_SIZE
    while pos < n:
        if n - pos < HEADER_SIZE:
            raise MalformedFrame("bad-datagram", f"{n - pos} bytes after the last frame")
        end = pos + HEADER_SIZE + validate_header(view, pos, max_payload)
        if end > n:
            raise MalformedFrame("bad-datagram", "a frame runs past the datagram's end")
        pos = end
    return seq, view[PREFIX_SIZE:]


def frame_spans(buffers: Iterable[Any]) -> list[bytes]:
    """Whole frames out of buffers that hold whole frames back to back (a frame may be a
    header and its payload in several buffers): each frame as one bytes object."""
    data = b"".join(bytes(b) if not isinstance(b, bytes) else b for b in buffers)
    out: list[bytes] = []
    pos, n = 0, len(data)
    while pos + HEADER_SIZE <= n:
        end = pos + HEADER_SIZE + int.from_bytes(data[pos + 16:pos + 20], "big")
        out.append(data[pos:end])
        pos = end
    return out


class DatagramSequence:
    """The receiving side's count of one link's datagram numbers: losses (gaps), late
    arrivals, duplicates (a datagram is still taken when late: frames carry no order
    promise beyond their flow's)."""

    __slots__ = ("highest", "received", "lost", "late")

    def __init__(self) -> None:
        self.highest = 0
        self.received = 0
        self.lost = 0  #: datagrams skipped over (a late one takes itself off again)
        self.late = 0  #: datagrams that came after a later one

    def seen(self, seq: int) -> int:
        """Note datagram *seq*; the number newly counted lost (0 if none)."""
        self.received += 1
        if self.highest == 0:
            self.highest = seq
            return 0
        ahead = (seq - self.highest) & 0xFFFFFFFF
        if ahead == 0:
            return 0
        if ahead < 0x80000000:
            if seq < self.highest:
                ahead -= 1  # the numbers wrapped, and 0 is never used
            self.highest = seq
            self.lost += ahead - 1
            return ahead - 1
        self.late += 1
        if self.lost:
            self.lost -= 1
        return 0


class DatagramPacker:
    """Packs frames into numbered datagrams of at most ``size`` bytes (a frame that alone
    is larger goes alone, as large as it is)."""

    __slots__ = ("size", "seq")

    def __init__(self, size: int = MAX_DATAGRAM) -> None:
        self.size = size
        self.seq = 0

    def pack(self, frames: Iterable[bytes]) -> list[bytes]:
        out: list[bytes] = []
        parts: list[bytes] = []
        used = PREFIX_SIZE
        for frame in frames:
            if parts and used + len(frame) > self.size:
                out.append(self._datagram(parts))
                parts, used = [], PREFIX_SIZE
            parts.append(frame)
            used += len(frame)
        if parts:
            out.append(self._datagram(parts))
        return out

    def _datagram(self, parts: list[bytes]) -> bytes:
        self.seq = (self.seq + 1) & 0xFFFFFFFF or 1
        return prefix(self.seq) + b"".join(parts)


__all__ = ["MAGIC", "VERSION", "PREFIX_SIZE", "MAX_DATAGRAM", "MAX_PAYLOAD", "prefix",
           "split_frames", "frame_spans", "DatagramSequence", "DatagramPacker"]
