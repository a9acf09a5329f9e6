"""IGO frames: encoding and parsing (sans-I/O; imports only the standard library and
flowrouter.wire).

Wire format (version 1, network byte order)
===========================================

Every payload starts with a 9-byte prefix::

    "IG" | version (1) = 1 | kind (1) | room tag (4) | transmitter (1)

The *room tag* is CRC-32 of ``room|site,site,...|leader``: frames of another room or of a site
configured with another site list are counted (``foreign``) and ignored. *transmitter* is the
index (in the sorted site list) of the site that put the frame on the wire. Kinds:

==========  ====  ==================================================================  =======
kind        code  body after the prefix                                               band
==========  ====  ==================================================================  =======
DATA        1     origin (1) | incarnation (4) | seq (4) | lamport (8) | send time    data /
                  (float64, s) | flags (1: 1 RESEND, 2 LOW-PRIORITY) | ndeps (1) |     inbox
                  deps (4 x ndeps, ndeps = 0 or the number of sites) | application
                  payload
HEARTBEAT   2     incarnation (4) | lamport (8) | highest own seq (4) | view bitmap    16
                  (4) | order number (4: leader: highest assigned; others: highest
                  delivered) | frontier lamport (8) | frontier origin (1) | flags (1:
                  1 STABLE-ACK) | nsites (1) | acks (4 x nsites: highest contiguous seq
                  received or skipped, per origin) | held from (4 x nsites: per origin,
                  the lowest seq the sender holds and can resend, up to its ack). The
                  *frontier* is the smallest (lamport, origin) key a message from the
                  sender's ordering set could still have.
NACK        3     target (1) | stream (1: origin index, 254 = the leader's order       20 /
                  stream) | flags (1: 2 LOW-PRIORITY) | nranges (1, <= 64) | ranges    inbox
                  (first (4), last (4)) x nranges; at most 4096 numbers in all
GONE        4     requester (1) | stream (1) | low (4): "below *low* I serve nothing:  20 /
                  skip to it"                                                          inbox
ORDER       5     leader incarnation (4) | view bitmap (4) | first order number (4) |   21 /
                  count (2, <= 1024) | entries (origin (1) | seq (4) | flags (1: 1     inbox
                  LATE)) x count
==========  ====  ==================================================================  =======

*Bands*: DATA goes multicast on ``data_band`` (32); anything addressed to a single site (point
to point repairs, GONE, resent ORDER records) goes on that site's **inbox band**
``inbox_band_base + index`` (64 + index), which only that site listens to. A site listens to
:meth:`SiteOrdering.bands`. A frame that does not parse, has an unknown version or kind, an
index out of range, inconsistent lengths, or arrives on a band its kind never uses is counted
under ``malformed.<reason>`` in :attr:`SiteOrdering.counters` and dropped: malformed input is
never fatal.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MAGIC = b"IG"


VERSION = 1


K_DATA, K_HEARTBEAT, K_NACK, K_GONE, K_ORDER = 1, 2, 3, 4, 5


KIND_NAMES = {K_DATA: "data", K_HEARTBEAT: "heartbeat", K_NACK: "nack", K_GONE: "gone",
              K_ORDER: "order"}


STREAM_ORDER = 254  #: NACK/GONE stream number of the leader's order stream


MAX_SITES = 32  #: view bitmaps are 32 bits


MAX_RANGES = 64


MAX_NACK_NUMBERS = 4096


MAX_ORDER_ENTRIES = 1024


F_RESEND = 0x01


F_LOW = 0x02  #: low-priority (long-term reconciliation) request / answer


F_LATE = 0x01  #: ORDER entry flag: ordered after a reconciliation


F_STABLE_ACK = 0x01  #: heartbeat sent to carry acknowledgements (stability tracking)


_PREFIX = struct.Struct("!2sBBIB")


_DATA = struct.Struct("!BIIQdBB")


_HB = struct.Struct("!IQIIIQBBB")


_NACK = struct.Struct("!BBBB")


_RANGE = struct.Struct("!II")


_GONE = struct.Struct("!BBI")


_ORDER = struct.Struct("!IIIH")


_ENTRY = struct.Struct("!BIB")


class ProtocolError(ValueError):
    """A payload that is not a valid IGO frame; ``reason`` is the counter suffix."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class ForeignFrame(ProtocolError):
    """A well-formed frame of another room (or another site list)."""


class DataMsg(NamedTuple):
    origin: int
    inc: int
    seq: int
    lamport: int
    send_time: float
    flags: int
    deps: tuple[int, ...]
    payload: bytes


class Heartbeat(NamedTuple):
    inc: int
    lamport: int
    high: int
    view: int
    g: int
    flags: int
    acks: tuple[int, ...]
    frontier: tuple[int, int] = (0, 0)  #: (lamport, origin): nothing below it is missing
    held_from: tuple[int, ...] = ()  #: per origin: lowest seq held (and servable) up to acks


class Nack(NamedTuple):
    target: int
    stream: int
    flags: int
    ranges: tuple[tuple[int, int], ...]


class Gone(NamedTuple):
    requester: int
    stream: int
    low: int


class Order(NamedTuple):
    inc: int
    view: int
    first: int
    entries: tuple[tuple[int, int, int], ...]


def _prefix(kind: int, tag: int, tx: int) -> bytes:
    return _PREFIX.pack(MAGIC, VERSION, kind, tag, tx)


def encode_data(tag: int, tx: int, m: DataMsg) -> bytes:
    return b"".join((_prefix(K_DATA, tag, tx),
                     _DATA.pack(m.origin, m.inc, m.seq, m.lamport, m.send_time, m.flags,
                                len(m.deps)),
                     struct.pack(f"!{len(m.deps)}I", *m.deps), m.payload))


def encode_heartbeat(tag: int, tx: int, h: Heartbeat) -> bytes:
    return b"".join((_prefix(K_HEARTBEAT, tag, tx),
                     _HB.pack(h.inc, h.lamport, h.high, h.view, h.g, h.frontier[0],
                              h.frontier[1], h.flags, len(h.acks)),
                     struct.pack(f"!{len(h.acks)}I", *h.acks),
                     struct.pack(f"!{len(h.acks)}I", *(h.held_from or (1,) * len(h.acks)))))


def encode_nack(tag: int, tx: int, n: Nack) -> bytes:
    return b"".join([_prefix(K_NACK, tag, tx),
                     _NACK.pack(n.target, n.stream, n.flags, len(n.ranges))]
                    + [_RANGE.pack(a, b) for a, b in n.ranges])


def encode_gone(tag: int, tx: int, g: Gone) -> bytes:
    return _prefix(K_GONE, tag, tx) + _GONE.pack(g.requester, g.stream, g.low)


def encode_order(tag: int, tx: int, o: Order) -> bytes:
    return b"".join([_prefix(K_ORDER, tag, tx),
                     _ORDER.pack(o.inc, o.view, o.first, len(o.entries))]
                    + [_ENTRY.pack(*e) for e in o.entries])


def decode(payload: bytes | memoryview, tag: int, nsites: int
           ) -> tuple[int, int, DataMsg | Heartbeat | Nack | Gone | Order]:
    """Parse one frame: ``(kind, transmitter, message)``; raises :class:`ProtocolError`."""
    b = bytes(payload)
    if len(b) < _PREFIX.size:
        raise ProtocolError("short", f"{len(b)} bytes")
    magic, version, kind, rtag, tx = _PREFIX.unpack_from(b)
    if magic != MAGIC:
        raise ProtocolError("magic", repr(magic))
    if version != VERSION:
        raise ProtocolError("version", str(version))
    if kind not in KIND_NAMES:
        raise ProtocolError("kind", str(kind))
    if rtag != tag:
        raise ForeignFrame("foreign", f"room tag {rtag:#010x}")
    if tx >= nsites:
        raise ProtocolError("index", f"transmitter {tx}")
    off = _PREFIX.size
    try:
        if kind == K_DATA:
            origin, inc, seq, lamport, sent, flags, nd = _DATA.unpack_from(b, off)
            off += _DATA.size
            if origin >= nsites:
                raise ProtocolError("index", f"origin {origin}")
            if nd not in (0, nsites):
                raise ProtocolError("deps", f"{nd} dependencies for {nsites} sites")
            if seq == 0:
                raise ProtocolError("seq", "sequence numbers start at 1")
            if sent != sent or sent in (float("inf"), float("-inf")):
                raise ProtocolError("time", "send time not finite")
            deps = struct.unpack_from(f"!{nd}I", b, off)
            off += 4 * nd
            return kind, tx, DataMsg(origin, inc, seq, lamport, sent, flags, deps, b[off:])
        if kind == K_HEARTBEAT:
            inc, lamport, high, view, g, fl_t, fl_o, flags, n = _HB.unpack_from(b, off)
            off += _HB.size
            if fl_o >= nsites:
                raise ProtocolError("index", f"frontier origin {fl_o}")
            if n != nsites:
                raise ProtocolError("acks", f"{n} acknowledgements for {nsites} sites")
            acks = struct.unpack_from(f"!{n}I", b, off)
            held = struct.unpack_from(f"!{n}I", b, off + 4 * n)
            off += 8 * n
            if off != len(b):
                raise ProtocolError("length", "trailing bytes")
            return kind, tx, Heartbeat(inc, lamport, high, view, g, flags, acks, (fl_t, fl_o),
                                       held)
        if kind == K_NACK:
            target, stream, flags, nr = _NACK.unpack_from(b, off)
            off += _NACK.size
            if target >= nsites or not (stream < nsites or stream == STREAM_ORDER):
                raise ProtocolError("index", f"target {target} stream {stream}")
            if not 0 < nr <= MAX_RANGES or len(b) != off + nr * _RANGE.size:
                raise ProtocolError("length", f"{nr} ranges")
            ranges = []
            total = 0
            for i in range(nr):
                lo, hi = _RANGE.unpack_from(b, off + i * _RANGE.size)
                if lo == 0 or lo > hi:
                    raise ProtocolError("range", f"{lo}..{hi}")
                total += hi - lo + 1
                ranges.append((lo, hi))
            if total > MAX_NACK_NUMBERS:
                raise ProtocolError("range", f"{total} numbers requested")
            return kind, tx, Nack(target, stream, flags, tuple(ranges))
        if kind == K_GONE:
            if len(b) != off + _GONE.size:
                raise ProtocolError("length", "gone")
            req, stream, low = _GONE.unpack_from(b, off)
            if req >= nsites or not (stream < nsites or stream == STREAM_ORDER):
                raise ProtocolError("index", f"requester {req} stream {stream}")
            return kind, tx, Gone(req, stream, low)
        # K_ORDER
        inc, view, first, count = _ORDER.unpack_from(b, off)
        off += _ORDER.size
        if not 0 < count <= MAX_ORDER_ENTRIES or len(b) != off + count * _ENTRY.size:
            raise ProtocolError("length", f"{count} order entries")
        if first == 0:
            raise ProtocolError("seq", "order numbers start at 1")
        entries = []
        for i in range(count):
            o, s, fl = _ENTRY.unpack_from(b, off + i * _ENTRY.size)
            if o >= nsites or s == 0:
                raise ProtocolError("index", f"order entry origin {o} seq {s}")
            entries.append((o, s, fl))
        return kind, tx, Order(inc, view, first, tuple(entries))
    except struct.error as exc:
        raise ProtocolError("truncated", str(exc)) from None

