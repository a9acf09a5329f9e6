"""IGO frames: encoding and parsing (sans-I/O; imports only the standard library and
flowrouter.wire).

Wire format (version 3, network byte order)
===========================================

Every payload starts with a 9-byte prefix::

    "IG" | version (1) = 3 | kind (1) | room tag (4) | transmitter (1)

The *room tag* is CRC-32 of ``room|site,site,...|leader``: frames of another room or of a site
configured with another site list are counted (``foreign``) and ignored. *transmitter* is the
index (in the sorted site list) of the site that put the frame on the wire.

**Streams are (origin, incarnation).** A site's *incarnation* (8 bytes, never 0) tells one run
of it from the others: a restarted site starts its sequence numbers and Lamport clock again,
so a sequence number alone does not name a message. Every reference to a message or a
position in a stream carries the incarnation it belongs to: DATA (its own), dependency
entries, acknowledgements, NACK, GONE and ORDER entries. Incarnations of one site grow from
run to run (:func:`~flowchat.igo.core.new_incarnation`: start time in milliseconds, shifted
left 16 bits, plus 16 random bits), so a receiver tells a restart (larger) from a stale frame
of an earlier run (smaller). Kinds:

==========  ====  ==================================================================  =======
kind        code  body after the prefix                                               band
==========  ====  ==================================================================  =======
DATA        1     origin (1) | incarnation (8) | seq (4) | lamport (8) | send time    data /
                  (float64, s) | view (8: the vid its origin sent it in, views.py)  inbox
                  | flags (1: 1 RESEND, 2 LOW-PRIORITY) | ndeps (1, <= 2 x sites) |
                  deps (origin (1) | incarnation (8) | seq (4)) x ndeps |
                  application payload. A dependency names, for a stream of an origin,
                  the highest seq its sender had delivered of it; one origin may have
                  two entries (its current and its previous incarnation, while the
                  sender still delivers the previous one's last messages). With flag
                  4 SIGNED (rooms with keys) the origin's Ed25519 signature (64) of
                  :func:`data_signed_bytes` sits between the deps and the payload.
HEARTBEAT   2     incarnation (8) | lamport (8) | highest own seq (4) | view bitmap    16
                  (4) | order number (4: leader: highest assigned; others: highest
                  delivered) | frontier lamport (8) | frontier origin (1) | flags (1:
                  1 STABLE-ACK) | nsites (1) | per origin: incarnation (8: the stream
                  the next two numbers are about, 0 = none yet) | ack (4: highest
                  contiguous seq received or skipped) | held from (4: the lowest seq
                  the sender holds and can resend, up to its ack). The *frontier* is
                  the smallest (lamport, origin) key a message from the sender's
                  ordering set could still have. Then view (8): the vid of the sender's
                  installed view.
NACK        3     target (1) | stream (1: origin index, 254 = the leader's order       20 /
                  stream) | incarnation (8: of that stream) | flags (1: 2              inbox
                  LOW-PRIORITY) | nranges (1, <= 64) | ranges (first (4), last (4)) x
                  nranges; at most 4096 numbers in all
GONE        4     requester (1) | stream (1) | incarnation (8) | low (4): "of this     20 /
                  stream, below *low* I serve nothing: skip to it"                     inbox
ORDER       5     leader incarnation (8) | view bitmap (4) | first order number (4) |   21 /
                  count (2, <= 1024) | entries (origin (1) | incarnation (8) | seq (4)  inbox
                  | flags (1: 1 LATE)) x count
VIEW        6     op (1: 1 PROPOSE, 2 FLUSH, 3 READY) | proposed vid (8) | members bitmap (4) |  16
                  sender's current vid (8) | clock (8) | nsites (1) | per origin:
                  incarnation (8) | highest contiguous seq held (4). A proposal is its
                  initiator's flush record; see :mod:`~flowchat.igo.views`.
==========  ====  ==================================================================  =======

*Bands*: DATA goes multicast on ``data_band`` (32); anything addressed to a single site (point
to point repairs, GONE, resent ORDER records) goes on that site's **inbox band**
``inbox_band_base + index`` (64 + index), which only that site listens to. A site listens to
:meth:`SiteOrdering.bands`. A frame that does not parse, has an unknown kind, an index out of
range, inconsistent lengths, or arrives on a band its kind never uses is counted under
``malformed.<reason>`` in :attr:`SiteOrdering.counters` and dropped: malformed input is never
fatal.

*Keyed rooms* (:class:`~flowchat.igo.auth.FrameAuth`): every frame ends with a 64-byte
signature by its transmitter's key over the bytes before it, and every DATA frame carries its
origin's signature (flag SIGNED), which a site resending the message copies unchanged.

*Version 2* (until this version; no views: DATA did not say which view it was sent in, so
receivers could not agree on which messages were late) is refused the same way, and so is
*version 1* ( 4-byte incarnations, dependency vectors and acknowledgements
of bare sequence numbers) is **refused**, not read: its dependencies cannot say which run of
a site they mean, and guessing is exactly the defect version 2 removes (a dependency on an
old run matched against the new run's numbers, skipping real messages). A version-1 frame is
counted as ``refused.old-version`` (other unknown versions as ``malformed.version``) and the
site's status names it; sites of one room must run the same version.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MAGIC = b"IG"


VERSION = 3


OLD_VERSIONS = (1, 2)  #: earlier formats, refused with their own counter (see above)


K_DATA, K_HEARTBEAT, K_NACK, K_GONE, K_ORDER, K_VIEW = 1, 2, 3, 4, 5, 6


KIND_NAMES = {K_DATA: "data", K_HEARTBEAT: "heartbeat", K_NACK: "nack", K_GONE: "gone",
              K_ORDER: "order", K_VIEW: "view"}


V_PROPOSE, V_FLUSH, V_READY = 1, 2, 3  #: VIEW record ops


STREAM_ORDER = 254  #: NACK/GONE stream number of the leader's order stream


MAX_SITES = 32  #: view bitmaps are 32 bits


MAX_INCARNATION = (1 << 64) - 1


MAX_RANGES = 64


MAX_NACK_NUMBERS = 4096


MAX_ORDER_ENTRIES = 1024


F_RESEND = 0x01


F_LOW = 0x02  #: low-priority (long-term reconciliation) request / answer


F_SIGNED = 0x04  #: DATA: the origin's signature (SIG_LEN bytes) follows the dependencies


SIG_LEN = 64  #: an Ed25519 signature (origin signatures of DATA, transmitter trailers)


F_LATE = 0x01  #: ORDER entry flag: ordered after a reconciliation


F_STABLE_ACK = 0x01  #: heartbeat sent to carry acknowledgements (stability tracking)


_PREFIX = struct.Struct("!2sBBIB")


_DATA = struct.Struct("!BQIQdQBB")


_DEP = struct.Struct("!BQI")


_HB = struct.Struct("!QQIIIQBBB")


_VID = struct.Struct("!Q")


_VIEW = struct.Struct("!BQIQQB")


_POS = struct.Struct("!QI")


_ACK = struct.Struct("!QII")


_NACK = struct.Struct("!BBQBB")


_RANGE = struct.Struct("!II")


_GONE = struct.Struct("!BBQI")


_ORDER = struct.Struct("!QIIH")


_ENTRY = struct.Struct("!BQIB")


class ProtocolError(ValueError):
    """A payload that is not a valid IGO frame; ``reason`` is the counter suffix."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class ForeignFrame(ProtocolError):
    """A well-formed frame of another room (or another site list)."""


class OldVersion(ProtocolError):
    """A frame of an earlier wire version (refused: see the module documentation)."""


Dep = tuple[int, int, int]  #: (origin, incarnation, seq): its sender had delivered up to seq


class DataMsg(NamedTuple):
    origin: int
    inc: int
    seq: int
    lamport: int
    send_time: float
    flags: int
    deps: tuple[Dep, ...]
    payload: bytes
    sig: bytes = b""  #: the origin's signature over :func:`data_signed_bytes` (keyed rooms)
    view: int = 0  #: the vid of the view its origin sent it in


class Heartbeat(NamedTuple):
    inc: int
    lamport: int
    high: int
    view: int
    g: int
    flags: int
    acks: tuple[int, ...]  #: per origin: highest contiguous seq of stream ack_incs[origin]
    frontier: tuple[int, int] = (0, 0)  #: (lamport, origin): nothing below it is missing
    held_from: tuple[int, ...] = ()  #: per origin: lowest seq held (and servable) up to acks
    ack_incs: tuple[int, ...] = ()  #: per origin: the incarnation acks/held_from are about
    vid: int = 0  #: the sender's installed view


class Nack(NamedTuple):
    target: int
    stream: int
    flags: int
    ranges: tuple[tuple[int, int], ...]
    inc: int = 0  #: the incarnation of origin *stream* (the leader's, for STREAM_ORDER)


class Gone(NamedTuple):
    requester: int
    stream: int
    low: int
    inc: int = 0  #: the incarnation of the stream the answer is about


class ViewRecord(NamedTuple):
    """A view proposal or flush record (see :mod:`~flowchat.igo.views`)."""

    op: int  #: V_PROPOSE or V_FLUSH
    proposal: int  #: the vid proposed
    members: int  #: its member bitmap
    old: int  #: the vid of the sender's current (installed) view
    clock: int  #: the sender's Lamport clock
    positions: tuple[tuple[int, int], ...]  #: per origin (incarnation, highest contiguous)


class Order(NamedTuple):
    inc: int
    view: int
    first: int
    entries: tuple[tuple[int, int, int, int], ...]  #: (origin, incarnation, seq, flags)


def _prefix(kind: int, tag: int, tx: int) -> bytes:
    return _PREFIX.pack(MAGIC, VERSION, kind, tag, tx)


def encode_data(tag: int, tx: int, m: DataMsg) -> bytes:
    flags = (m.flags | F_SIGNED) if m.sig else (m.flags & ~F_SIGNED)
    return b"".join([_prefix(K_DATA, tag, tx),
                     _DATA.pack(m.origin, m.inc, m.seq, m.lamport, m.send_time, m.view,
                                flags, len(m.deps))]
                    + [_DEP.pack(*d) for d in m.deps] + [m.sig, m.payload])


def data_signed_bytes(tag: int, origin: int, inc: int, seq: int, lamport: int,
                      send_time: float, deps: tuple[Dep, ...], payload: bytes,
                      view: int = 0) -> bytes:
    """What an origin signs for one of its messages: everything that names it or that a
    receiver shows or orders by, in the room *tag*, never the flags or the transmitter (a
    resend by another site carries the origin's signature unchanged)."""
    return b"".join([b"IGO-DATA-3", _PREFIX.pack(MAGIC, VERSION, K_DATA, tag, 0),
                     _DATA.pack(origin, inc, seq, lamport, send_time, view, 0, len(deps))]
                    + [_DEP.pack(*d) for d in deps] + [payload])


def encode_heartbeat(tag: int, tx: int, h: Heartbeat) -> bytes:
    n = len(h.acks)
    held = h.held_from or (1,) * n
    incs = h.ack_incs or (0,) * n
    return b"".join([_prefix(K_HEARTBEAT, tag, tx),
                     _HB.pack(h.inc, h.lamport, h.high, h.view, h.g, h.frontier[0],
                              h.frontier[1], h.flags, n)]
                    + [_ACK.pack(incs[i], h.acks[i], held[i]) for i in range(n)]
                    + [_VID.pack(h.vid)])


def encode_view(tag: int, tx: int, v: ViewRecord) -> bytes:
    return b"".join([_prefix(K_VIEW, tag, tx),
                     _VIEW.pack(v.op, v.proposal, v.members, v.old, v.clock,
                                len(v.positions))]
                    + [_POS.pack(i, s) for i, s in v.positions])


def encode_nack(tag: int, tx: int, n: Nack) -> bytes:
    return b"".join([_prefix(K_NACK, tag, tx),
                     _NACK.pack(n.target, n.stream, n.inc, n.flags, len(n.ranges))]
                    + [_RANGE.pack(a, b) for a, b in n.ranges])


def encode_gone(tag: int, tx: int, g: Gone) -> bytes:
    return _prefix(K_GONE, tag, tx) + _GONE.pack(g.requester, g.stream, g.inc, g.low)


def encode_order(tag: int, tx: int, o: Order) -> bytes:
    return b"".join([_prefix(K_ORDER, tag, tx),
                     _ORDER.pack(o.inc, o.view, o.first, len(o.entries))]
                    + [_ENTRY.pack(*e) for e in o.entries])


def decode(payload: bytes | memoryview, tag: int, nsites: int
           ) -> tuple[int, int, DataMsg | Heartbeat | Nack | Gone | Order | ViewRecord]:
    """Parse one frame: ``(kind, transmitter, message)``; raises :class:`ProtocolError`."""
    b = bytes(payload)
    if len(b) < _PREFIX.size:
        raise ProtocolError("short", f"{len(b)} bytes")
    magic, version, kind, rtag, tx = _PREFIX.unpack_from(b)
    if magic != MAGIC:
        raise ProtocolError("magic", repr(magic))
    if version in OLD_VERSIONS:
        raise OldVersion("old-version", f"IGO wire version {version} (this site speaks "
                         f"{VERSION}: messages carry views); upgrade that site")
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
            origin, inc, seq, lamport, sent, view, flags, nd = _DATA.unpack_from(b, off)
            off += _DATA.size
            if origin >= nsites:
                raise ProtocolError("index", f"origin {origin}")
            if inc == 0:
                raise ProtocolError("incarnation", "incarnation 0")
            if nd > 2 * nsites:
                raise ProtocolError("deps", f"{nd} dependencies for {nsites} sites")
            if seq == 0:
                raise ProtocolError("seq", "sequence numbers start at 1")
            if sent != sent or sent in (float("inf"), float("-inf")):
                raise ProtocolError("time", "send time not finite")
            deps = []
            for _ in range(nd):
                do, dinc, ds = _DEP.unpack_from(b, off)
                off += _DEP.size
                if do >= nsites or dinc == 0 or ds == 0:
                    raise ProtocolError("deps", f"dependency {do}/{dinc}#{ds}")
                deps.append((do, dinc, ds))
            sig = b""
            if flags & F_SIGNED:
                sig = b[off:off + SIG_LEN]
                off += SIG_LEN
            if off > len(b):
                raise ProtocolError("truncated", "dependencies")
            return kind, tx, DataMsg(origin, inc, seq, lamport, sent, flags, tuple(deps),
                                     b[off:], sig, view)
        if kind == K_HEARTBEAT:
            inc, lamport, high, view, g, fl_t, fl_o, flags, n = _HB.unpack_from(b, off)
            off += _HB.size
            if inc == 0:
                raise ProtocolError("incarnation", "incarnation 0")
            if fl_o >= nsites:
                raise ProtocolError("index", f"frontier origin {fl_o}")
            if n != nsites:
                raise ProtocolError("acks", f"{n} acknowledgements for {nsites} sites")
            if off + n * _ACK.size + _VID.size != len(b):
                raise ProtocolError("length", "acknowledgements")
            rows = [_ACK.unpack_from(b, off + i * _ACK.size) for i in range(n)]
            (vid,) = _VID.unpack_from(b, off + n * _ACK.size)
            return kind, tx, Heartbeat(inc, lamport, high, view, g, flags,
                                       tuple(r[1] for r in rows), (fl_t, fl_o),
                                       tuple(r[2] for r in rows), tuple(r[0] for r in rows),
                                       vid)
        if kind == K_VIEW:
            op, proposal, members, old, clock, n = _VIEW.unpack_from(b, off)
            off += _VIEW.size
            if op not in (V_PROPOSE, V_FLUSH, V_READY):
                raise ProtocolError("view", f"op {op}")
            if n != nsites or members >> nsites or not members >> (proposal & 0xFF) & 1:
                raise ProtocolError("view", f"{n} positions, members {members:#x}")
            if off + n * _POS.size != len(b):
                raise ProtocolError("length", "view positions")
            pos = tuple(_POS.unpack_from(b, off + i * _POS.size) for i in range(n))
            return kind, tx, ViewRecord(op, proposal, members, old, clock, pos)
        if kind == K_NACK:
            target, stream, inc, flags, nr = _NACK.unpack_from(b, off)
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
            return kind, tx, Nack(target, stream, flags, tuple(ranges), inc)
        if kind == K_GONE:
            if len(b) != off + _GONE.size:
                raise ProtocolError("length", "gone")
            req, stream, inc, low = _GONE.unpack_from(b, off)
            if req >= nsites or not (stream < nsites or stream == STREAM_ORDER):
                raise ProtocolError("index", f"requester {req} stream {stream}")
            return kind, tx, Gone(req, stream, low, inc)
        # K_ORDER
        inc, view, first, count = _ORDER.unpack_from(b, off)
        off += _ORDER.size
        if not 0 < count <= MAX_ORDER_ENTRIES or len(b) != off + count * _ENTRY.size:
            raise ProtocolError("length", f"{count} order entries")
        if first == 0:
            raise ProtocolError("seq", "order numbers start at 1")
        entries = []
        for i in range(count):
            o, einc, s, fl = _ENTRY.unpack_from(b, off + i * _ENTRY.size)
            if o >= nsites or s == 0 or einc == 0:
                raise ProtocolError("index", f"order entry origin {o} seq {s}")
            entries.append((o, einc, s, fl))
        return kind, tx, Order(inc, view, first, tuple(entries))
    except struct.error as exc:
        raise ProtocolError("truncated", str(exc)) from None
