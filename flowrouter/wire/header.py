"""The 24-byte flow header (Warfield, Flows, UBC MSc thesis, 2001), network byte order.

=====  ==============================
bytes  field
=====  ==============================
0-7    creator ID
8-11   LSID
12-15  local ID
16-19  payload size (bytes that follow)
20     band (0..127)
21     locality type (NONE, BANDWIDTH, DELAY, GEOGRAPHY)
22     locality value
23     TTL
=====  ==============================

A TCP link is a plain sequence of ``header + payload``; a UDP datagram holds one, or several
whole frames back to back between peers that announced ``FEATURE_DGRAM_BUNDLE``
(:mod:`flowrouter.wire.control`; never part of a frame). The forwarding path only reads
fields in place (``unpack_from``) and builds a fresh 24-byte header per distinct outgoing
(TTL, locality) pair; the payload is never copied.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from flowrouter.wire.bands import NUM_BANDS

HEADER = struct.Struct("!QIIIBBBB")
HEADER_SIZE = HEADER.size  # 24
assert HEADER_SIZE == 24

#: Offsets of single-byte fields, for in-place reads on the hot path.
OFF_SIZE = 16
OFF_BAND = 20
OFF_LOC_TYPE = 21
OFF_LOC_VALUE = 22
OFF_TTL = 23

DEFAULT_TTL = 32
MAX_TTL = 255
#: Default largest payload a link accepts; larger messages are fragmented by flowlib.
DEFAULT_MAX_PAYLOAD = 64 * 1024
#: Largest payload that fits a single UDP datagram with the header.
UDP_MAX_PAYLOAD = 65507 - HEADER_SIZE


class Locality(enum.IntEnum):
    NONE = 0
    BANDWIDTH = 1
    DELAY = 2
    GEOGRAPHY = 3

    @classmethod
    def parse(cls, text: str | int) -> Locality:
        if isinstance(text, int):
            return cls(text)
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(
                f"unknown locality type {text!r}; use one of "
                + ", ".join(m.name.lower() for m in cls)) from None


NUM_LOCALITY_TYPES = len(Locality)


class MalformedFrame(ValueError):
    """A frame that cannot be trusted; the link it came from is dropped."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason  # short, stable: used as a counter key
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Header:
    creator: int
    lsid: int
    local: int
    size: int
    band: int
    loc_type: int = Locality.NONE
    loc_value: int = 0
    ttl: int = DEFAULT_TTL

    def pack(self) -> bytes:
        return HEADER.pack(self.creator, self.lsid, self.local, self.size, self.band,
                           self.loc_type, self.loc_value, self.ttl)

    @property
    def key(self) -> bytes:
        return self.pack()[:16]


def pack_header(key: bytes, size: int, band: int, loc_type: int = 0, loc_value: int = 0,
                ttl: int = DEFAULT_TTL) -> bytes:
    """Build a header from a 16-byte flow key: the one builder every sender uses."""
    return key + _TAIL.pack(size, band, loc_type, loc_value, ttl)


_TAIL = struct.Struct("!IBBBB")


def validate_header(buf: bytes | bytearray | memoryview, offset: int = 0,
                    max_payload: int = DEFAULT_MAX_PAYLOAD) -> int:
    """Check the header at *offset* and return its payload size.

    Raises :class:`MalformedFrame` for anything a sender following the protocol could not
    have produced. Works on the first 24 bytes alone, so an oversized frame is refused before
    any of its payload is buffered.
    """
    size = int.from_bytes(buf[offset + OFF_SIZE:offset + OFF_SIZE + 4], "big")
    band = buf[offset + OFF_BAND]
    loc_type = buf[offset + OFF_LOC_TYPE]
    if size > max_payload:
        raise MalformedFrame("oversized", f"payload of {size} bytes exceeds the link maximum "
                                          f"of {max_payload}")
    if band >= NUM_BANDS:
        raise MalformedFrame("bad-band", f"band {band} is not in 0..{NUM_BANDS - 1}")
    if loc_type >= NUM_LOCALITY_TYPES:
        raise MalformedFrame("bad-locality", f"locality type {loc_type} is unknown")
    return size


def parse_header(buf: bytes | bytearray | memoryview, offset: int = 0,
                 max_payload: int = DEFAULT_MAX_PAYLOAD) -> Header:
    """Decode and validate a header (for tools and tests; the router reads fields in place)."""
    if len(buf) - offset < HEADER_SIZE:
        raise MalformedFrame("truncated", f"{len(buf) - offset} bytes, a header needs 24")
    validate_header(buf, offset, max_payload)
    return Header(*HEADER.unpack_from(buf, offset))


def split_datagram(data: bytes | memoryview, max_payload: int = UDP_MAX_PAYLOAD
                   ) -> tuple[memoryview, memoryview]:
    """Split one UDP datagram into (header, payload) views, checking it is exactly one frame."""
    view = memoryview(data)
    if len(view) < HEADER_SIZE:
        raise MalformedFrame("truncated", f"datagram of {len(view)} bytes, a header needs 24")
    size = validate_header(view, 0, max_payload)
    if len(view) != HEADER_SIZE + size:
        raise MalformedFrame("length-mismatch", f"header says {size} payload bytes, datagram "
                                                f"carries {len(view) - HEADER_SIZE}")
    return view[:HEADER_SIZE], view[HEADER_SIZE:]


def take_frame(buf: bytearray, max_payload: int = DEFAULT_MAX_PAYLOAD) -> bytes | None:
    """Remove the first complete frame from *buf* and return it, or None if it is not all
    there yet (raises :class:`MalformedFrame` for a bad header).

    For link handshakes, parsed one frame at a time because what follows a frame (after the
    peer's AUTH) may be sealed records rather than frames; the FrameDecoder, which splits a
    whole read at once, takes over when the handshake is done.
    """
    if len(buf) < HEADER_SIZE:
        return None
    end = HEADER_SIZE + validate_header(buf, 0, max_payload)
    if len(buf) < end:
        return None
    frame = bytes(buf[:end])
    del buf[:end]
    return frame


class FrameDecoder:
    """Sans-I/O splitter of a TCP byte stream into frames.

    ``feed(data)`` returns the complete frames as ``(header, payload)`` memoryviews; they stay
    valid as long as the caller holds them. Frames wholly inside one read are views into
    that read (no copy); a frame split across reads is gathered in a buffer of its own,
    which becomes the frame (each of its bytes is copied once, and nothing else is). A
    malformed header raises :class:`MalformedFrame` as soon as its 24 bytes are in, so the
    runtime can drop the link without reading the rest.
    """

    __slots__ = ("_buf", "max_payload", "_need")

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self._buf = bytearray()  #: the start of a frame split across reads
        self.max_payload = max_payload
        self._need = HEADER_SIZE  #: total size of the frame being gathered, once known

    def feed(self, data: bytes) -> list[tuple[memoryview, memoryview]]:
        frames: list[tuple[memoryview, memoryview]] = []
        view = memoryview(data)
        n = len(data)
        pos = 0
        if self._buf:  # finish the split frame first
            whole, pos = self.complete(data)
            if whole is None:
                return frames
            frames.append((whole[:HEADER_SIZE], whole[HEADER_SIZE:]))
        buf = self._buf
        max_payload = self.max_payload
        while n - pos >= HEADER_SIZE:
            end = pos + HEADER_SIZE + validate_header(data, pos, max_payload)
            if end > n:
                break
            frames.append((view[pos:pos + HEADER_SIZE], view[pos + HEADER_SIZE:end]))
            pos = end
        if pos < n:
            buf += view[pos:]
            if len(buf) >= HEADER_SIZE:  # refuse an oversized frame before buffering it
                self._need = HEADER_SIZE + validate_header(buf, 0, max_payload)
        return frames

    def complete(self, data: bytes | memoryview) -> tuple[memoryview | None, int]:
        """Finish the frame split across reads with the start of *data*.

        Returns the whole frame as one buffer (or None while it is still incomplete) and how
        many bytes of *data* it took. With nothing pending it takes nothing. Lets the runtime
        hand the rest of a read to the forwarding fast path in place.
        """
        buf = self._buf
        if not buf:
            return None, 0
        view = memoryview(data)
        n = len(view)
        pos = 0
        if len(buf) < HEADER_SIZE:
            take = min(HEADER_SIZE - len(buf), n)
            buf += view[:take]
            pos = take
            if len(buf) < HEADER_SIZE:
                return None, pos
            self._need = HEADER_SIZE + validate_header(buf, 0, self.max_payload)
        need = self._need - len(buf)
        if n - pos < need:
            buf += view[pos:]
            return None, n
        buf += view[pos:pos + need]
        pos += need
        self._buf = bytearray()  # the old buffer now belongs to the frame
        self._need = HEADER_SIZE
        return memoryview(buf), pos

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back (non-zero at EOF means a truncated frame)."""
        return len(self._buf)
