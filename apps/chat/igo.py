"""Intermittent Global Order (IGO): a sans-I/O ordering layer for a few sites on one flow.

Seed 003 (Ramanan, *Robust Chat for Airborne Command and Control*, chapters 4-6) orders the
messages of a handful of *sites* (one server per site, many thin clients behind it) so that
every site shows them in the **same order while the network allows it**, and in a weaker but
well-defined order with **bounded latency** when links fail. This module is that protocol as a
reusable state machine: one :class:`SiteOrdering` per site, fed with events and returning
actions, with the clock passed in. It knows nothing about sockets, asyncio or chat; the
simulator adapter (:mod:`apps.chat.sim_adapter`) and the flowlib adapter
(:mod:`apps.chat.flow_adapter`) carry its actions out.

Events in::

    actions = site.submit(app_payload, now)          # a message from this site's clients
    actions = site.on_message(band, payload, now)    # a frame received on the room flow
    actions = site.tick(now)                          # timers (call every 50-100 ms)

Actions out (plain named tuples, in the order they must be carried out):

* :class:`Send` ``(band, payload, kind)`` — multicast *payload* on *band* of the room flow;
* :class:`Deliver` ``(delivery)`` — hand a :class:`Delivery` to the application (site, origin
  site, sequence number, Lamport time, leader order number, send time, delivery time, late
  flag, local-only flag, payload);
* :class:`MembershipChange` — the ordering set (the sites this site's order includes) changed;
* :class:`StateChange` — a peer's state, or this site's overall state, changed (S1/S2/S3).

What it implements (seed sections in brackets)
==============================================

**Reliable FIFO per sending site** [4.2]. Every message carries its origin site and a
per-origin sequence number (from 1). Receivers keep, per origin, the highest contiguous
sequence number received; later messages wait in a buffer. A gap (seen from a later
message, from the origin's heartbeat, which carries its highest sequence number, or from
another site's acknowledgement vector) triggers a *repair request* on
:data:`~flowrouter.wire.bands.BAND_REPAIR` after ``nack_delay``, retried every ``nack_retry``.
"Multicast out, point-to-point in" (seed 004, Isis): data is multicast on the flow; the repair
request names **one** site that should answer — the origin while it is reachable, otherwise any
reachable site whose acknowledgement vector shows that it holds the messages. The answering
site coalesces requests for ``repair_coalesce`` seconds and resends each message **point to
point** (on the requester's *inbox band*, so routers filter it away from everybody else) when
one site asked, or multicast when several did, at most ``repair_rate`` messages per second.
A requester that has fallen more than ``max_lag`` messages behind (or asks for messages the
history no longer holds) is *dropped from the sender's duty*: it gets a GONE answer naming the
lowest sequence number still served, skips the rest (counted, visible as a gap) and can never
stall the others; the sender never waits for any receiver.

**Lamport clocks and all-to-all ordering** [2.1.1, 2.2.3]. Each message carries the sender's
Lamport time ``T`` (then the clock advances); every received message and heartbeat moves the
clock to ``max(C, T + 1)``. Messages wait in a buffer sorted by ``(T, origin index)`` and the
head is delivered once every site of the *ordering set* is known to have passed it: each
site's bound is ``T + 1`` of its last contiguous message or the clock in its heartbeat (used
only once every message the heartbeat counts has arrived, because routers let the heartbeat
band overtake queued data). With every site connected this is a global order.

**Heartbeats** [5.1.3.2]. Every ``heartbeat_interval`` (2 s) on
:data:`~flowrouter.wire.bands.BAND_HEARTBEAT`; any message from a site counts as a sign of life; a
site silent for ``missed_heartbeats`` intervals (3, i.e. 6 s) is disconnected.

**States** [4.3.2, Figure 10]. Per peer site: ``S1`` connected; ``S2`` short-term disconnect
(detected, silent for less than ``disconnect_interval`` = 15 s; when heard again it is
*reconciling* until every message it sent has arrived); ``S3`` long-term disconnect (silent for
``disconnect_interval`` or more). The site's overall state is S2 if any peer is in S2, else S3 if
any is in S3, else S1. Reconnecting from S2 reconciles (the gap is repaired, so there are **no
gaps in per-site sequence numbers**); reconnecting from S3 does not: the stream resumes at the
site's current sequence number and the skipped ones are a visible gap (or, with
``long_term_reconcile``, fetched later at a low rate, see below). A restarted site (new
incarnation number) is treated like a long-term reconnect.

**Modes** [4.3.3-4.3.5]:

* ``all-to-all`` (delay-delivery): the ordering set is this site plus every peer in S1 or S2.
  Delivery stops while a peer is disconnected (waiting for it to come back), so a short
  disconnect keeps the global order; at S3 the peer leaves the ordering set and delivery
  resumes with the remaining sites.
* ``hasten`` (all-to-all + hasten-delivery): peers leave the ordering set as soon as the
  disconnect is detected (S2) and come back once reconciled, so delivery continues among the
  connected sites; messages delivered out of Lamport order (reconciled ones) are flagged
  ``late``.
* ``leader`` (leader-based, hasten): every site still multicasts its messages (so data crosses
  each link once), and the *leader* site assigns global order numbers, multicast in small
  ORDER records on :data:`~flowrouter.wire.bands.BAND_ORDER`; sites deliver in that order. A site
  cut off from the leader (leader in S2/S3) keeps intra-site chat: its own messages are
  delivered at once (``local``), including those that were waiting for an order number when
  the cut was detected. When the leader hears a site again within the disconnect interval it
  fetches the site's missed messages and orders them flagged ``late``; the reconnected site
  itself does not receive what the others said meanwhile (seed 6.3.3: it would be deluged),
  it resumes the order stream at the leader's current number (``leader_reconcile_cut_site``
  changes that). The leader's view (the sites in S1 at the leader) is carried in its ORDER
  records and heartbeats and is the membership shown by every site connected to it.

**Causal order, always.** Each message carries a dependency vector: per origin, the highest
sequence number its sender had delivered when it sent it. A message is never delivered before
its dependencies (or before they are known to be skipped), so replies never precede their
questions even among late, reconciled messages (a dependency on a message this site lacks
fetches it from a holder; one that cannot be had within ``dependency_timeout`` is skipped).

Beyond the seed (its chapter 7):

* **stability tracking** (``stability=True``): a message is delivered only once every site of
  the ordering set acknowledges having it, reports a *frontier* past it (it holds everything
  its own ordering set sent below it) and we hold everything they hold (acknowledgement
  vectors and frontiers ride on heartbeats, sent every ``ack_interval`` while they change), so
  connected sites deliver the same sequence even without transitive connectivity; with it, a
  long-term reconnect reconciles too (bounded by ``max_lag``), since a site we are connected
  to may have delivered what the reconnecting site said meanwhile;
* **long-term reconciliation** (``long_term_reconcile=True``): after an S3 reconnect, skipped
  messages are requested with a LOW-PRIORITY flag, at most ``long_term_rate`` per second, and
  answered only when no ordinary repair is waiting; they are delivered flagged ``late``;
* **display-rate limit** (``display_rate``): deliveries leave the layer at most that many per
  second (bursts after reconciliation are spread out; delivery time is the release time).

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

import enum
import heapq
import secrets
import struct
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from flowrouter.wire.bands import (
    BAND_HEARTBEAT,
    BAND_ORDER,
    BAND_REPAIR,
    DATA_BAND_FIRST,
    NUM_BANDS,
)

__all__ = [
    "IGOConfig", "SiteOrdering", "Delivery", "Send", "Deliver", "MembershipChange",
    "StateChange", "PeerState", "ProtocolError", "MODES", "decode", "encode_data",
    "DataMsg", "Heartbeat", "Nack", "Gone", "Order", "room_tag",
]

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

MODES = ("all-to-all", "hasten", "leader")
_MODE_ALIASES = {"delay": "all-to-all", "all-to-all-delay": "all-to-all",
                 "all-to-all-hasten": "hasten", "leader-based": "leader"}


class ProtocolError(ValueError):
    """A payload that is not a valid IGO frame; ``reason`` is the counter suffix."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class ForeignFrame(ProtocolError):
    """A well-formed frame of another room (or another site list)."""


# ============================================================================ configuration
@dataclass(frozen=True)
class IGOConfig:
    """Every knob of the protocol; defaults are seed 003's values where it has one."""

    sites: tuple[str, ...] = ()  #: the sites of the room (sorted on construction)
    room: str = "chat"
    mode: str = "all-to-all"  #: all-to-all (delay-delivery) | hasten | leader
    leader: str | None = None  #: leader mode: the sequencing site (one of ``sites``)
    heartbeat_interval: float = 2.0  #: seed: every 2 s
    missed_heartbeats: int = 3  #: seed: silent for 3 intervals = disconnected
    disconnect_interval: float = 15.0  #: seed: short-term disconnects last up to 15 s
    data_band: int = 32
    inbox_band_base: int = 64  #: site i's point-to-point band is inbox_band_base + i
    nack_delay: float = 0.05  #: wait this long after a message arrives beyond a gap
    hint_delay: float = 1.0  #: ... after a heartbeat / acknowledgement reveals a gap (data
    #: may still be queued behind: routers let administration bands overtake data)
    nack_retry: float = 2.0  #: ask again (another holder) after this long without progress
    repair_coalesce: float = 0.05  #: collect requests this long before answering
    repair_rate: float = 100.0  #: repairs sent per second at most
    history_size: int = 20000  #: messages kept per origin for repairs
    max_lag: int = 2000  #: a requester further behind than this is dropped from our duty
    dependency_timeout: float = 15.0  #: a missing causal dependency is skipped after this
    stability: bool = False  #: deliver only messages every ordering-set site acknowledged
    ack_interval: float = 0.25  #: stability: acknowledgement heartbeats at most this often
    long_term_reconcile: bool = False  #: fetch what an S3 reconnect skipped, at a low rate
    long_term_rate: float = 2.0  #: messages per second for long-term reconciliation
    display_rate: float | None = None  #: deliveries per second at most (None: no limit)
    display_burst: int = 10
    leader_reconcile_cut_site: bool = False  #: seed: a site cut off from the leader is not
    #: sent what the others said meanwhile; True repairs its order stream (late messages)
    keep_ready_for: float = 60.0  #: leader mode: unordered data kept this long (seconds)

    def __post_init__(self) -> None:
        sites = tuple(sorted(dict.fromkeys(self.sites)))
        if not sites:
            raise ValueError("an IGO room needs at least one site")
        if len(sites) > MAX_SITES:
            raise ValueError(f"at most {MAX_SITES} sites, got {len(sites)}")
        for s in sites:
            if not isinstance(s, str) or not s or len(s.encode()) > 64:
                raise ValueError(f"bad site name {s!r}")
        object.__setattr__(self, "sites", sites)
        mode = _MODE_ALIASES.get(self.mode, self.mode)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        object.__setattr__(self, "mode", mode)
        if mode == "leader":
            if self.leader not in sites:
                raise ValueError(f"leader mode needs a leader among the sites ({', '.join(sites)})"
                                 f", got {self.leader!r}")
        elif self.leader is not None and self.leader not in sites:
            raise ValueError(f"leader {self.leader!r} is not one of the sites")
        if not DATA_BAND_FIRST <= self.data_band < NUM_BANDS:
            raise ValueError("data_band must be an application band (32..127)")
        last = self.inbox_band_base + len(sites) - 1
        if not self.inbox_band_base >= DATA_BAND_FIRST or last >= NUM_BANDS:
            raise ValueError(f"inbox bands {self.inbox_band_base}..{last} must lie in 32..127")
        if self.inbox_band_base <= self.data_band <= last:
            raise ValueError("the data band must not be one of the inbox bands")
        for name in ("heartbeat_interval", "disconnect_interval", "nack_retry", "repair_rate",
                     "long_term_rate", "ack_interval", "dependency_timeout", "keep_ready_for"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("nack_delay", "hint_delay", "repair_coalesce"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.missed_heartbeats < 1 or self.history_size < 1 or self.max_lag < 1:
            raise ValueError("missed_heartbeats, history_size and max_lag must be >= 1")
        if self.display_rate is not None and not self.display_rate > 0:
            raise ValueError("display_rate must be positive or None")
        if self.disconnect_interval < self.detect_after:
            raise ValueError("disconnect_interval must be at least missed_heartbeats x "
                             "heartbeat_interval")

    @property
    def detect_after(self) -> float:
        """Silence after which a site counts as disconnected (seed: 3 x 2 s)."""
        return self.missed_heartbeats * self.heartbeat_interval

    def index(self, site: str) -> int:
        try:
            return self.sites.index(site)
        except ValueError:
            raise KeyError(f"unknown site {site!r} (sites: {', '.join(self.sites)})") from None

    def inbox_band(self, site: str | int) -> int:
        i = site if isinstance(site, int) else self.index(site)
        return self.inbox_band_base + i

    def with_(self, **changes: Any) -> IGOConfig:
        return replace(self, **changes)


def room_tag(cfg: IGOConfig) -> int:
    text = f"{cfg.room}|{','.join(cfg.sites)}|{cfg.leader or ''}"
    return zlib.crc32(text.encode())


# ============================================================================ wire format
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


# ============================================================================ actions
@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to the application at ``site``."""

    site: str  #: where it was delivered
    origin: str  #: the site that sent it
    seq: int  #: the origin's sequence number
    lamport: int
    gseq: int | None  #: leader mode: the leader's order number (None if delivered locally)
    send_time: float
    delivery_time: float
    late: bool  #: delivered out of the order its ordering rule would give (reconciled)
    local: bool  #: leader mode: delivered while cut off from the leader (intra-site order)
    payload: bytes

    @property
    def latency(self) -> float:
        return self.delivery_time - self.send_time


class Send(NamedTuple):
    band: int
    payload: bytes
    kind: str


class Deliver(NamedTuple):
    delivery: Delivery


class MembershipChange(NamedTuple):
    time: float
    members: tuple[str, ...]  #: sites this site's ordering includes (always itself)


class StateChange(NamedTuple):
    time: float
    peer: str | None  #: the peer whose state changed, or None for the site's overall state
    old: str
    new: str


Action = Send | Deliver | MembershipChange | StateChange


class PeerState(enum.StrEnum):
    UNKNOWN = "unknown"  #: never heard
    S1 = "S1"
    S2 = "S2"
    S3 = "S3"


# ============================================================================ internals
class _Msg:
    __slots__ = ("origin", "inc", "seq", "lamport", "send_time", "deps", "payload", "rx")

    def __init__(self, origin: int, inc: int, seq: int, lamport: int, send_time: float,
                 deps: tuple[int, ...], payload: bytes, rx: float) -> None:
        self.origin = origin
        self.inc = inc
        self.seq = seq
        self.lamport = lamport
        self.send_time = send_time
        self.deps = deps
        self.payload = payload
        self.rx = rx


class _Stream:
    """What this site knows about one origin's sequence of messages."""

    __slots__ = ("inc", "contiguous", "pending", "known_high", "bound", "hb_high", "hb_clock",
                 "delivered", "settled", "skipped", "store", "store_order", "nack_due",
                 "nack_tries", "lt_wanted", "synced", "asked_high", "asked_at", "progress_at")

    def __init__(self, inc: int = 0) -> None:
        self.inc = inc
        self.contiguous = 0  #: every seq <= this was received or skipped
        self.pending: dict[int, _Msg] = {}  #: received beyond a gap
        self.known_high = 0  #: highest seq known to exist
        self.bound = 0  #: the origin's future messages have lamport >= bound
        self.hb_high = 0  #: from its last heartbeat: its highest seq ...
        self.hb_clock = 0  #: ... and its clock then (usable once contiguous >= hb_high)
        self.delivered: set[int] = set()  #: delivered seqs above `settled`
        self.settled = 0  #: every seq <= this was delivered or skipped
        self.skipped: list[list[int]] = []  #: [lo, hi] ranges never to be delivered (gaps)
        self.store: dict[int, _Msg] = {}  #: messages kept to answer repairs
        self.store_order: deque[int] = deque()
        self.nack_due: float | None = None
        self.nack_tries = 0
        self.asked_high = 0  #: highest seq a repair request already named
        self.asked_at = float("-inf")  #: when every missing seq was last requested
        self.progress_at = float("-inf")  #: when `contiguous` last advanced
        self.lt_wanted: list[list[int]] = []  #: skipped ranges still to fetch (long-term)
        self.synced = False  #: the stream's position is established (first contact done)


class _Peer:
    __slots__ = ("idx", "name", "state", "reconciling", "last_heard", "since", "acks", "view",
                 "g", "inc", "frontier", "held_from")

    def __init__(self, idx: int, name: str) -> None:
        self.idx = idx
        self.name = name
        self.state = PeerState.UNKNOWN
        self.reconciling = False
        self.last_heard = float("-inf")
        self.since = 0.0  #: when the current state began
        self.acks: tuple[int, ...] = ()
        self.view = 0
        self.g = 0
        self.inc = 0
        self.frontier: tuple[int, int] = (0, 0)
        self.held_from: tuple[int, ...] = ()


class _Bucket:
    """Token bucket: ``take()`` succeeds at most ``rate`` times a second (burst ``burst``)."""

    __slots__ = ("rate", "burst", "tokens", "t")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.t = now

    def refill(self, now: float) -> None:
        if now > self.t:
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now

    def take(self, now: float) -> bool:
        self.refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def _ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in sorted(seqs):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


# ============================================================================ the machine
class SiteOrdering:
    """The IGO state machine of one site. See the module documentation.

    *incarnation* tells this run of the site from earlier ones (a restarted site starts its
    sequence numbers again); default random. All methods take the current time in seconds
    (any monotonic clock shared in meaning with the other sites' send times: virtual time in
    the simulator, ``time.time()`` on real hosts) and return a list of actions.
    """

    def __init__(self, config: IGOConfig, site: str, now: float = 0.0,
                 incarnation: int | None = None) -> None:
        self.cfg = config
        self.site = site
        self.me = config.index(site)
        self.n = len(config.sites)
        self.tag = room_tag(config)
        self.inc = incarnation if incarnation is not None else (secrets.randbits(32) or 1)
        self.started = now
        self.mode = config.mode
        self.leader = (config.index(config.leader) if config.mode == "leader"
                       and config.leader is not None else None)
        self.is_leader = self.leader == self.me
        self.counters: Counter[str] = Counter()
        self.clock = 0  #: Lamport clock: the next own message gets this time
        self.seq = 0  #: last own sequence number
        self.streams = [_Stream() for _ in range(self.n)]
        own = self.streams[self.me]
        own.inc = self.inc
        own.synced = True
        self.peers = {i: _Peer(i, s) for i, s in enumerate(config.sites) if i != self.me}
        self.state = PeerState.S1  #: overall: S1 / S2 / S3
        self._members: tuple[str, ...] = ()
        self._heap: list[tuple[int, int, int]] = []  #: (lamport, origin, seq) ready to order
        self._ready: dict[tuple[int, int], _Msg] = {}
        self._last_key: tuple[int, int] = (-1, -1)  #: last delivered (lamport, origin)
        self._dep_wait: dict[tuple[int, int], float] = {}
        self._next_hb = now
        self._last_hb = float("-inf")
        self._acks_changed = False
        self._urgent_hb = False
        self._repairs: dict[tuple[int, int], set[int]] = {}  #: (stream, number) -> requesters
        self._repair_due: float | None = None
        self._low_repairs: deque[tuple[int, int, int]] = deque()  #: (stream, seq, requester)
        self._repair_bucket = _Bucket(config.repair_rate, config.repair_rate, now)
        self._low_bucket = _Bucket(config.long_term_rate, 1.0, now)
        self._lt_bucket = _Bucket(config.long_term_rate, 1.0, now)
        self._display: deque[Delivery] = deque()
        self._display_bucket = (_Bucket(config.display_rate, config.display_burst, now)
                                if config.display_rate else None)
        # --- leader mode
        self.g_high = 0  #: leader: last order number assigned
        self._order_log: dict[int, tuple[int, int, int]] = {}  #: leader: g -> entry
        self._order_log_first = 1
        self._order_out: list[tuple[int, int, int]] = []
        self._order_out_first = 0
        self.next_g = 1  #: site: next order number to deliver
        self._orders: dict[int, tuple[int, int, int]] = {}  #: received, not yet delivered
        self._order_synced = False
        self._order_nack_due: float | None = None
        self._awaiting_order: dict[int, _Msg] = {}  #: own messages not yet ordered/delivered
        self._local_delivered: set[int] = set()  #: own seqs delivered while cut off
        self._leader_view = 0
        self._leader_inc = 0
        self._fetch_due: dict[tuple[int, int], float] = {}
        self._draining = False
        self.deliveries = 0
        self._out: list[Action] = []
        self._now = now
        self._t0 = now
        self._update_membership(now)

    # ------------------------------------------------------------------ public API
    def bands(self) -> list[int]:
        """The bands this site must listen to on the room flow."""
        return sorted({BAND_HEARTBEAT, BAND_REPAIR, BAND_ORDER, self.cfg.data_band,
                       self.cfg.inbox_band(self.me)})

    @property
    def members(self) -> tuple[str, ...]:
        return self._members

    def submit(self, payload: bytes, now: float) -> list[Action]:
        """A message from this site's clients: number it, multicast it, order it."""
        self._begin(now)
        self.seq += 1
        seq = self.seq
        t = self.clock
        self.clock += 1
        deps = tuple(seq - 1 if i == self.me else self.streams[i].settled
                     for i in range(self.n))
        msg = _Msg(self.me, self.inc, seq, t, now, deps, bytes(payload), now)
        own = self.streams[self.me]
        own.contiguous = own.known_high = seq
        own.bound = self.clock
        self._keep(own, msg)
        self._emit(Send(self.cfg.data_band, self._encode_msg(msg, 0), "data"))
        self.counters["sent.data"] += 1
        self._accept(msg, now)
        return self._finish(now)

    def on_message(self, band: int, payload: bytes | memoryview, now: float) -> list[Action]:
        """A frame received on the room flow (any band this site listens to)."""
        self._begin(now)
        try:
            kind, tx, msg = decode(payload, self.tag, self.n)
            self._check_band(kind, band, msg)
        except ForeignFrame:
            self.counters["foreign"] += 1
            return self._finish(now)
        except ProtocolError as exc:
            if band == BAND_HEARTBEAT and bytes(payload[:2]) == b"HB":
                self.counters["foreign.flowlib-heartbeat"] += 1
            else:
                self.counters[f"malformed.{exc.reason}"] += 1
            return self._finish(now)
        if tx == self.me:
            self.counters["own-echo"] += 1
            return self._finish(now)
        self.counters[f"received.{KIND_NAMES[kind]}"] += 1
        try:
            if kind == K_DATA:
                self._on_data(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_HEARTBEAT:
                self._on_heartbeat(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_NACK:
                self._heard(tx, now)
                self._on_nack(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_GONE:
                self._heard(tx, now)
                self._on_gone(tx, msg, now)  # type: ignore[arg-type]
            else:
                self._on_order(tx, msg, now)  # type: ignore[arg-type]
        except ProtocolError as exc:  # semantically invalid (e.g. ORDER from a non-leader)
            self.counters[f"malformed.{exc.reason}"] += 1
        return self._finish(now)

    def tick(self, now: float) -> list[Action]:
        """Timers: heartbeats, failure detection, repair requests and answers, pacing."""
        self._begin(now)
        cfg = self.cfg
        # failure detection
        for p in self.peers.values():
            silent = now - max(p.last_heard, self._t0)
            if p.state is PeerState.UNKNOWN and silent >= cfg.detect_after:
                self._set_peer(p, PeerState.S3, now)
            elif p.state is PeerState.S1 and silent >= cfg.detect_after:
                self._set_peer(p, PeerState.S2, now)
            elif p.state is PeerState.S2:
                if p.reconciling and silent >= cfg.detect_after:
                    p.reconciling = False
                    self.counters["reconcile.interrupted"] += 1
                if silent >= cfg.disconnect_interval:
                    self._set_peer(p, PeerState.S3, now)
        # heartbeats (and acknowledgement beats for stability tracking)
        if now >= self._next_hb or self._urgent_hb and now - self._last_hb >= 0.25:
            self._send_heartbeat(now, 0)
        elif (cfg.stability and self._acks_changed and now - self._last_hb >= cfg.ack_interval):
            self._send_heartbeat(now, F_STABLE_ACK)
        self._nacks(now)
        self._serve_repairs(now)
        self._long_term(now)
        self._deliverable(now)
        self._prune_ready(now)
        return self._finish(now)

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot for status displays and debugging."""
        return {
            "site": self.site, "mode": self.mode, "state": str(self.state),
            "members": list(self._members), "clock": self.clock, "seq": self.seq,
            "incarnation": self.inc,
            "peers": {p.name: {"state": str(p.state), "reconciling": p.reconciling,
                               "last_heard": p.last_heard,
                               "contiguous": self.streams[p.idx].contiguous,
                               "known_high": self.streams[p.idx].known_high,
                               "delivered": self.streams[p.idx].settled}
                      for p in self.peers.values()},
            "waiting": len(self._heap) + len(self._orders),
            "deliveries": self.deliveries,
            "counters": dict(sorted(self.counters.items())),
        }

    def peer_state(self, site: str) -> PeerState:
        return self.peers[self.cfg.index(site)].state

    # ------------------------------------------------------------------ plumbing
    def _begin(self, now: float) -> None:
        self._now = now

    def _emit(self, action: Action) -> None:
        self._out.append(action)

    def _finish(self, now: float) -> list[Action]:
        if self.mode == "leader" and not self.is_leader:
            self._drain_orders(now)
        self._flush_orders()
        if self._display_bucket is not None:
            while self._display and self._display_bucket.take(now):
                d = self._display.popleft()
                self._out.append(Deliver(replace(d, delivery_time=now)))
        out, self._out = self._out, []
        return out

    def _check_band(self, kind: int, band: int, msg: Any) -> None:
        inbox = band == self.cfg.inbox_band(self.me)
        ok = {K_DATA: band == self.cfg.data_band or inbox,
              K_HEARTBEAT: band == BAND_HEARTBEAT,
              K_NACK: band == BAND_REPAIR or inbox,
              K_GONE: band == BAND_REPAIR or inbox,
              K_ORDER: band == BAND_ORDER or inbox}[kind]
        if not ok:
            raise ProtocolError("band", f"{KIND_NAMES[kind]} on band {band}")

    def _encode_msg(self, m: _Msg, flags: int) -> bytes:
        return encode_data(self.tag, self.me, DataMsg(m.origin, m.inc, m.seq, m.lamport,
                                                      m.send_time, flags, m.deps, m.payload))

    def _keep(self, st: _Stream, msg: _Msg) -> None:
        if msg.seq in st.store:
            return
        st.store[msg.seq] = msg
        st.store_order.append(msg.seq)
        while len(st.store_order) > self.cfg.history_size:
            st.store.pop(st.store_order.popleft(), None)

    @staticmethod
    def _held_from(st: _Stream) -> int:
        low = st.store_order[0] if st.store_order else st.contiguous + 1
        if st.skipped:
            low = max(low, max(r[1] for r in st.skipped) + 1)
        return low

    def _holds(self, p: _Peer, o: int, first: int) -> bool:
        """Peer *p* said it can resend origin *o*'s message *first*."""
        return (len(p.acks) == self.n and len(p.held_from) == self.n
                and p.held_from[o] <= first <= p.acks[o])

    def _reachable(self, p: _Peer, now: float) -> bool:
        return (p.state is PeerState.S1 or p.state is PeerState.S2 and p.reconciling) \
            and now - p.last_heard < self.cfg.detect_after

    # ------------------------------------------------------------------ peers and states
    def _heard(self, i: int, now: float) -> None:
        """Any frame transmitted by peer *i*: a sign of life."""
        p = self.peers[i]
        p.last_heard = now
        if p.state is PeerState.S2 and not p.reconciling:
            p.reconciling = True
            self._urgent_hb = True  # tell it where we are, so it can reconcile quickly
            self.counters["reconcile.started"] += 1
            st = self.streams[i]
            if st.known_high > st.contiguous:
                self._want_nack(st, now, immediate=True)
            self._check_caught_up(p, now)

    def _first_contact(self, p: _Peer, st: _Stream, upto: int, now: float) -> None:
        """Unknown / long-term disconnected peer heard: resume its stream at *upto*."""
        if p.state is PeerState.S3:
            self.counters["reconnect.long-term"] += 1
            # without transitive connectivity a site we still reach may have received what
            # this one said meanwhile: that part of the conversation was ours, fetch it
            # (peers connected to us all along, that hold the messages right after ours)
            held = max((q.acks[p.idx] for q in self.peers.values()
                        if q is not p and q.state is PeerState.S1 and q.since <= p.since
                        and self._reachable(q, now)
                        and self._holds(q, p.idx, st.contiguous + 1)), default=0)
            if self.cfg.stability and upto > st.contiguous:
                # stability tracking promises connected sites the same sequence, and our
                # acknowledgements cannot tell "skipped" from "have": reconcile instead
                # (bounded by max_lag: the origin answers GONE beyond it)
                held = upto
            if held > st.contiguous:
                self.counters["reconnect.fetch-from-holders"] += 1
                upto = st.contiguous
                st.known_high = max(st.known_high, held)
                self._want_nack(st, now, immediate=True)
        elif (p.state is PeerState.UNKNOWN and now - self.started < self.cfg.disconnect_interval
              and 0 < upto - st.contiguous <= self.cfg.max_lag):
            # A peer heard for the first time while we are starting up: what it said before
            # is not history from before we joined but, very likely, lost on the way (as
            # when every site starts together and a first message is dropped). Reconcile it
            # like a short-term disconnect, bounded by max_lag, instead of skipping it.
            self.counters["first-contact.fetch"] += 1
            st.known_high = max(st.known_high, upto)
            upto = st.contiguous
            self._want_nack(st, now, immediate=True)
        self._skip(p.idx, st, upto, now, reason="long-term")
        st.synced = True
        self._urgent_hb = True
        self._set_peer(p, PeerState.S1, now)

    def _check_caught_up(self, p: _Peer, now: float) -> None:
        st = self.streams[p.idx]
        if p.state is PeerState.S2 and p.reconciling and st.contiguous >= st.known_high \
                and st.contiguous >= st.hb_high:
            self.counters["reconcile.done"] += 1
            self._set_peer(p, PeerState.S1, now)

    def _set_peer(self, p: _Peer, new: PeerState, now: float) -> None:
        old = p.state
        if old is new:
            return
        p.state = new
        p.since = now
        if new is not PeerState.S2:
            p.reconciling = False
        self.counters[f"peer.{old}->{new}"] += 1
        self._emit(StateChange(now, p.name, str(old), str(new)))
        if self.mode == "leader" and not self.is_leader and p.idx == self.leader:
            self._leader_state_changed(old, new, now)
        self._update_state(now)
        self._update_membership(now)

    def _update_state(self, now: float) -> None:
        if self.mode == "leader" and not self.is_leader:
            lp = self.peers[self.leader]  # type: ignore[index]
            new = PeerState.S1 if lp.state in (PeerState.S1, PeerState.UNKNOWN) else lp.state
        else:
            states = {p.state for p in self.peers.values()}
            new = (PeerState.S2 if PeerState.S2 in states else
                   PeerState.S3 if PeerState.S3 in states else PeerState.S1)
        if new is not self.state:
            self._emit(StateChange(now, None, str(self.state), str(new)))
            self.state = new

    def _in_ordering(self, p: _Peer) -> bool:
        if p.state is PeerState.S1:
            return True
        if p.state is PeerState.UNKNOWN:
            # a site not heard yet at start-up is presumed connected until failure
            # detection gives up on it (3 missed heartbeats), as any connected site is
            return True
        if p.state is PeerState.S2:
            return self.mode == "all-to-all"  # delay-delivery keeps waiting for it
        return False

    def _update_membership(self, now: float) -> None:
        cfg = self.cfg
        if self.mode == "leader":
            if self.is_leader:
                idx = [self.me] + [p.idx for p in self.peers.values()
                                   if p.state is PeerState.S1]
            else:
                lp = self.peers[self.leader]  # type: ignore[index]
                if lp.state is PeerState.S1:
                    idx = [i for i in range(self.n) if self._leader_view >> i & 1]
                    idx += [self.me, self.leader]  # type: ignore[list-item]
                else:
                    idx = [self.me]
        else:
            idx = [self.me] + [p.idx for p in self.peers.values() if self._in_ordering(p)]
        members = tuple(cfg.sites[i] for i in sorted(set(idx)))
        if members != self._members:
            self._members = members
            self._emit(MembershipChange(now, members))
            if self.mode != "leader":
                self._deliverable(now)

    def _view_bits(self) -> int:
        bits = 1 << self.me
        for p in self.peers.values():
            if p.state is PeerState.S1:
                bits |= 1 << p.idx
        return bits

    # ------------------------------------------------------------------ heartbeats
    def _send_heartbeat(self, now: float, flags: int) -> None:
        cfg = self.cfg
        acks = tuple(self.seq if i == self.me else self.streams[i].contiguous
                     for i in range(self.n))
        g = self.g_high if self.is_leader else self.next_g - 1
        hb = Heartbeat(self.inc, self.clock, self.seq, self._view_bits(), g, flags, acks,
                       self._frontier(), tuple(self._held_from(st) for st in self.streams))
        self._emit(Send(BAND_HEARTBEAT, encode_heartbeat(self.tag, self.me, hb), "heartbeat"))
        self.counters["sent.heartbeat"] += 1
        self._last_hb = now
        self._acks_changed = False
        self._urgent_hb = False
        if not flags:
            self._next_hb = now + cfg.heartbeat_interval

    def _on_heartbeat(self, tx: int, hb: Heartbeat, now: float) -> None:
        p = self.peers[tx]
        if not self._incarnation(p, self.streams[tx], hb.inc, now):
            return
        st = self.streams[tx]
        self.clock = max(self.clock, hb.lamport)
        p.acks = hb.acks
        p.held_from = hb.held_from
        p.frontier = hb.frontier
        p.view = hb.view
        p.g = hb.g
        st.hb_high = max(st.hb_high, hb.high) if st.synced else hb.high
        st.hb_clock = hb.lamport
        if p.state in (PeerState.UNKNOWN, PeerState.S3) or not st.synced:
            # resume its stream where it is now: no reconciliation (long-term)
            p.last_heard = now
            self._first_contact(p, st, hb.high, now)
        else:
            self._heard(tx, now)
        if hb.high > st.known_high:
            st.known_high = hb.high
        # acknowledgements tell us what exists elsewhere (holders for repairs)
        for o, a in enumerate(hb.acks):
            if o == self.me:
                continue
            so = self.streams[o]
            if so.synced and a > so.known_high and so.inc:
                so.known_high = a
                if self._gap_nacks_enabled():
                    self._want_nack(so, now, hint=True)
        if self.mode == "leader" and tx == self.leader:
            self._leader_view = hb.view
            self._leader_seen_g(hb.g, now)
            self._update_membership(now)
        self._advance(tx, st, now)
        if st.contiguous >= st.hb_high:
            st.bound = max(st.bound, hb.lamport)
        self._check_caught_up(p, now)
        if st.known_high > st.contiguous and self._gap_nacks_enabled():
            self._want_nack(st, now, hint=True)
        self._deliverable(now)

    def _incarnation(self, p: _Peer, st: _Stream, inc: int, now: float) -> bool:
        """Check a frame's incarnation of peer *p*; a new one restarts its stream."""
        if st.inc == inc:
            return True
        if st.inc == 0:
            st.inc = inc
            p.inc = inc
            return True
        # the peer restarted: forget its old stream, treat it like a long-term reconnect
        self.counters["peer.restarted"] += 1
        new = _Stream(inc)
        self.streams[p.idx] = new
        st.pending.clear()
        self._heap = [e for e in self._heap if e[1] != p.idx]
        heapq.heapify(self._heap)
        for k in [k for k in self._ready if k[0] == p.idx]:
            del self._ready[k]
        p.inc = inc
        if p.state is not PeerState.UNKNOWN:
            self._set_peer(p, PeerState.S3, now)
        return True

    # ------------------------------------------------------------------ data path
    def _on_data(self, tx: int, d: DataMsg, now: float) -> None:
        o = d.origin
        if o == self.me:
            self.counters["data.own-returned"] += 1
            if tx != self.me:
                self._heard(tx, now)
            return
        st = self.streams[o]
        if tx == o:
            p = self.peers[o]
            if not self._incarnation(p, st, d.inc, now):
                return
            st = self.streams[o]
            if p.state in (PeerState.UNKNOWN, PeerState.S3) or not st.synced:
                p.last_heard = now
                self._first_contact(p, st, d.seq - 1, now)
            else:
                if d.seq > st.known_high:
                    st.known_high = d.seq
                self._heard(tx, now)
        else:
            self._heard(tx, now)
            if not st.synced:
                if self.mode == "leader" and not self.is_leader:
                    # fetched for an ORDER entry: no stream position needed
                    self._ready[(o, d.seq)] = _Msg(o, d.inc, d.seq, d.lamport, d.send_time,
                                                   tuple(d.deps), d.payload, now)
                    self.counters["data.fetched-unsynced"] += 1
                    return
                # first we hear of this origin is through another site: start its stream
                # here (like a first contact), so dependencies on it can be met
                self.counters["data.relay-sync"] += 1
                st.inc = d.inc
                self._skip(o, st, d.seq - 1, now, reason="first-contact")
                st.synced = True
            if d.inc != st.inc:
                self.counters["data.stale-incarnation"] += 1
                return
        self.clock = max(self.clock, d.lamport + 1)
        msg = _Msg(o, d.inc, d.seq, d.lamport, d.send_time, tuple(d.deps), d.payload, now)
        if d.flags & F_RESEND:
            self.counters["received.resent"] += 1
        if d.seq <= st.contiguous:
            if self.mode == "leader" and not self.is_leader:
                # an ORDER entry may name a message our stream skipped: keep it for the drain
                if (o, d.seq) not in self._ready:
                    self._ready[(o, d.seq)] = msg
                    self.counters["data.kept-for-order"] += 1
                return
            if self.cfg.long_term_reconcile and self._unskip(st, d.seq):
                # long-term reconciliation filling a gap (history, flagged late; the only
                # deliveries that may follow messages that depend on them)
                self.counters["long-term.fetched"] += 1
                self._keep(st, msg)
                self._accept(msg, now, refill=True)
            elif any(r[0] <= d.seq <= r[1] for r in st.skipped):
                self.counters["data.after-skip"] += 1
            else:
                self.counters["data.duplicate"] += 1
            return
        if d.seq in st.pending:
            self.counters["data.duplicate"] += 1
            return
        st.pending[d.seq] = msg
        if d.seq > st.known_high:
            st.known_high = d.seq
        self._advance(o, st, now)
        if st.known_high > st.contiguous and self._gap_nacks_enabled():
            self._want_nack(st, now)
        if o in self.peers:
            self._check_caught_up(self.peers[o], now)
        self._deliverable(now)

    def _advance(self, o: int, st: _Stream, now: float) -> None:
        """Move contiguous messages out of the gap buffer into ordering."""
        moved = False
        while st.contiguous + 1 in st.pending:
            msg = st.pending.pop(st.contiguous + 1)
            st.contiguous += 1
            st.bound = max(st.bound, msg.lamport + 1)
            self._keep(st, msg)
            self._accept(msg, now)
            moved = True
        if st.contiguous >= st.hb_high:
            st.bound = max(st.bound, st.hb_clock)
        if moved:
            self._acks_changed = True
            st.progress_at = now
            if st.contiguous >= st.known_high:
                st.nack_due = None
                st.nack_tries = 0

    def _accept(self, msg: _Msg, now: float, refill: bool = False) -> None:
        """A message whose FIFO predecessors are all in: hand it to the ordering rule."""
        key = (msg.origin, msg.seq)
        if self.mode == "leader":
            if self.is_leader:
                self._ready[key] = msg
                self._leader_assign(msg, now)
            elif msg.origin == self.me:
                self._awaiting_order[msg.seq] = msg
                lp = self.peers[self.leader]  # type: ignore[index]
                if lp.state in (PeerState.S2, PeerState.S3):
                    self._deliver_local(msg, now)
            else:
                self._ready[key] = msg
            return
        self._ready[key] = msg
        heapq.heappush(self._heap, (msg.lamport, msg.origin, msg.seq))

    # ------------------------------------------------------------------ all-to-all delivery
    def _lamport_ok(self, t: int, o: int) -> bool:
        for p in self.peers.values():
            i = p.idx
            if i == o or not self._in_ordering(p):
                continue
            b = self.streams[i].bound
            if b > t or (b == t and i > o):
                continue
            return False
        return not (o != self.me and not (self.clock > t or self.clock == t and self.me > o))

    def _frontier(self) -> tuple[int, int]:
        """The smallest (lamport, origin) key a message from our ordering set may still
        have: everything below it that the ordering set sent is here."""
        best = (self.clock, self.me)
        for p in self.peers.values():
            if self._in_ordering(p):
                k = (self.streams[p.idx].bound, p.idx)
                if k < best:
                    best = k
        return best

    def _stable(self, msg: _Msg, now: float) -> bool:
        """Stability tracking: every peer of the ordering set (1) has the message, (2) has
        everything its own ordering set sent below it (its frontier is past it), and (3) we
        hold every message any of them holds. Then all of us deliver the same messages
        below it, in the same order, whether or not connectivity is transitive."""
        key = (msg.lamport, msg.origin)
        need: dict[int, int] = {}
        for p in self.peers.values():
            if not self._in_ordering(p):
                continue
            if len(p.acks) != self.n or p.frontier <= key:
                return False
            if p.idx != msg.origin and p.acks[msg.origin] < msg.seq:
                return False
            for o, a in enumerate(p.acks):
                if a > need.get(o, 0):
                    need[o] = a
        for o, a in need.items():
            if o == self.me:
                continue
            st = self.streams[o]
            if st.synced and st.contiguous < a:
                if a > st.known_high:
                    st.known_high = a
                self._want_nack(st, now)
                return False
        return True

    def _missing_dep(self, msg: _Msg) -> tuple[int, int] | None:
        for o, s in enumerate(msg.deps):
            if o == msg.origin or o == self.me:
                continue
            if s > self.streams[o].settled:
                return o, s
        return None

    def _deps_ok(self, msg: _Msg, now: float) -> bool:
        dep = self._missing_dep(msg)
        while dep is not None:
            o, s = dep
            st = self.streams[o]
            key = (msg.origin, msg.seq)
            since = self._dep_wait.setdefault(key, now)
            if now - since >= self.cfg.dependency_timeout:
                # bounded latency beats a dependency nobody can give us
                self.counters["dependency.skipped"] += 1
                if s > st.contiguous:
                    self._skip(o, st, s, now, reason="dependency")
                break
            if s > st.known_high:
                st.known_high = s
            if st.contiguous < s:
                self._want_nack(st, now, hint=True)
            self.counters["dependency.waits"] += 1
            return False
        self._dep_wait.pop((msg.origin, msg.seq), None)
        return True

    def _deliverable(self, now: float) -> None:
        if self.mode == "leader":
            return
        heap = self._heap
        stability = self.cfg.stability
        while heap:
            t, o, s = heap[0]
            msg = self._ready.get((o, s))
            if msg is None:  # dropped (peer restarted)
                heapq.heappop(heap)
                continue
            late = (t, o) < self._last_key
            if not late and not self._lamport_ok(t, o):
                break
            if stability and not late and not self._stable(msg, now):
                break
            if not self._deps_ok(msg, now):
                break
            heapq.heappop(heap)
            del self._ready[(o, s)]
            if not late:
                self._last_key = (t, o)
            self._deliver(msg, now, late=late, gseq=None, local=False)

    # ------------------------------------------------------------------ delivering
    def _deliver(self, msg: _Msg, now: float, *, late: bool, gseq: int | None,
                 local: bool) -> None:
        st = self.streams[msg.origin]
        if msg.seq > st.settled:
            st.delivered.add(msg.seq)
            self._settle(st)
        self.deliveries += 1
        self._acks_changed = True
        self.counters["delivered"] += 1
        if late:
            self.counters["delivered.late"] += 1
        if local:
            self.counters["delivered.local"] += 1
        d = Delivery(self.site, self.cfg.sites[msg.origin], msg.seq, msg.lamport, gseq,
                     msg.send_time, now, late, local, msg.payload)
        if self._display_bucket is not None:
            self._display.append(d)
        else:
            self._emit(Deliver(d))

    def _settle(self, st: _Stream) -> None:
        while True:
            n = st.settled + 1
            if n in st.delivered:
                st.delivered.discard(n)
                st.settled = n
                continue
            for r in st.skipped:
                if r[0] <= n <= r[1]:
                    st.settled = r[1]
                    break
            else:
                return

    def _skip(self, o: int, st: _Stream, upto: int, now: float, *, reason: str) -> None:
        """Give up on every message of origin *o* up to *upto* that has not arrived (a gap).

        Messages already buffered beyond the gap are kept and ordered."""
        if upto <= st.contiguous:
            return
        waiting = sorted(s for s in st.pending if s <= upto)
        prev = st.contiguous
        skipped = 0
        for s in waiting:
            if s > prev + 1:
                self._add_skip(st, prev + 1, s - 1)
                skipped += s - 1 - prev
            msg = st.pending.pop(s)
            st.contiguous = s
            st.bound = max(st.bound, msg.lamport + 1)
            self._keep(st, msg)
            self._accept(msg, now)
            prev = s
        if upto > prev:
            self._add_skip(st, prev + 1, upto)
            skipped += upto - prev
        st.contiguous = max(st.contiguous, upto)
        st.known_high = max(st.known_high, upto)
        if skipped:
            self.counters[f"skipped.{reason}"] += skipped
        self._settle(st)
        self._advance(o, st, now)
        self._acks_changed = True

    def _add_skip(self, st: _Stream, lo: int, hi: int) -> None:
        st.skipped.append([lo, hi])
        if self.cfg.long_term_reconcile:
            st.lt_wanted.append([lo, hi])

    def _unskip(self, st: _Stream, seq: int) -> bool:
        for i, r in enumerate(st.skipped):
            if r[0] <= seq <= r[1]:
                if r[0] == r[1]:
                    del st.skipped[i]
                elif seq == r[0]:
                    r[0] += 1
                elif seq == r[1]:
                    r[1] -= 1
                else:
                    st.skipped.insert(i + 1, [seq + 1, r[1]])
                    r[1] = seq - 1
                return True
        return False

    # ------------------------------------------------------------------ repair: asking
    def _gap_nacks_enabled(self) -> bool:
        # leader mode: ordinary sites fetch only what an ORDER entry names
        return self.mode != "leader" or self.is_leader

    def _want_nack(self, st: _Stream, now: float, immediate: bool = False,
                   hint: bool = False) -> None:
        due = now if immediate else now + (self.cfg.hint_delay if hint else self.cfg.nack_delay)
        if st.nack_due is None or st.nack_due > due:
            st.nack_due = due

    def _missing(self, st: _Stream, above: int = 0, limit: int = MAX_NACK_NUMBERS
                 ) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        total = 0
        s = max(st.contiguous, above) + 1
        while s <= st.known_high and len(out) < MAX_RANGES and total < limit:
            if s in st.pending:
                s += 1
                continue
            lo = s
            while s <= st.known_high and s not in st.pending and total + (s - lo) < limit:
                s += 1
            out.append((lo, s - 1))
            total += s - lo
        return out

    def _choose_target(self, o: int, first: int, now: float, tries: int) -> int | None:
        cands = []
        if o in self.peers and self._reachable(self.peers[o], now):
            cands.append(o)
        holders = [p.idx for p in self.peers.values()
                   if p.idx != o and self._reachable(p, now) and self._holds(p, o, first)]
        cands += sorted(holders, key=lambda i: (i != self.leader, i))
        if not cands:
            return None
        return cands[tries % len(cands)]

    def _nacks(self, now: float) -> None:
        """Ask for missing messages. The first request names every gap; later ones name
        only seqs no request named yet, until no progress was made for ``nack_retry``
        (growing with each retry): then everything still missing is asked again, of the
        next holder. Repairs trickling in over a slow link are progress, so a long
        reconciliation is never requested twice."""
        cfg = self.cfg
        for o, st in enumerate(self.streams):
            if o == self.me or st.nack_due is None or st.nack_due > now:
                continue
            timeout = cfg.nack_retry * (1.0 + 0.5 * min(st.nack_tries, 2))
            last = max(st.asked_at, st.progress_at)
            stale = now - last >= timeout
            ranges = self._missing(st, 0 if stale else st.asked_high)
            if not ranges:
                st.nack_due = (last + timeout if st.known_high > st.contiguous else None)
                if st.nack_due is None:
                    st.nack_tries = 0
                continue
            if stale and st.asked_at > float("-inf"):
                st.nack_tries += 1
                self.counters["nack.retry"] += 1
            target = self._choose_target(o, ranges[0][0], now, st.nack_tries)
            if target is None:
                self.counters["nack.no-target"] += 1
                st.nack_due = now + cfg.nack_retry
                continue
            self._emit(Send(BAND_REPAIR, encode_nack(self.tag, self.me,
                                                     Nack(target, o, 0, tuple(ranges))),
                            "nack"))
            self.counters["sent.nack"] += 1
            st.asked_high = max(st.asked_high, ranges[-1][1])
            if stale:
                st.asked_at = now
            st.nack_due = now + timeout
        if self._order_nack_due is not None and self._order_nack_due <= now:
            self._order_nack(now)

    # ------------------------------------------------------------------ repair: answering
    def _on_nack(self, tx: int, n: Nack, now: float) -> None:
        if n.target != self.me:
            self.counters["nack.overheard"] += 1
            return
        if n.stream == STREAM_ORDER:
            self._answer_order_nack(tx, n, now)
            return
        o = n.stream
        st = self.streams[o]
        high = self.seq if o == self.me else st.contiguous
        low_priority = bool(n.flags & F_LOW)
        floor = st.store_order[0] if st.store_order else high + 1
        if not low_priority:
            floor = max(floor, high - self.cfg.max_lag + 1)
        gone = False
        queued = 0
        for lo, hi in n.ranges:
            for s in range(lo, hi + 1):
                if s > high:
                    break
                if s < floor or s not in st.store:
                    gone = True
                    continue
                if low_priority:
                    if len(self._low_repairs) < self.cfg.max_lag:
                        self._low_repairs.append((o, s, tx))
                else:
                    self._repairs.setdefault((o, s), set()).add(tx)
                queued += 1
        if gone:
            low = max(floor, 1)
            # everything we cannot give below `low`: the requester must skip it
            self.counters["repair.gone"] += 1
            self._emit(Send(self.cfg.inbox_band(tx),
                            encode_gone(self.tag, self.me, Gone(tx, o, low)), "gone"))
        if queued and self._repair_due is None:
            self._repair_due = now + self.cfg.repair_coalesce
        self.counters["repair.requested"] += queued

    def _serve_repairs(self, now: float) -> None:
        cfg = self.cfg
        if self._repairs and self._repair_due is not None and now >= self._repair_due:
            for key in sorted(self._repairs):
                if not self._repair_bucket.take(now):
                    break
                who = self._repairs.pop(key)
                o, s = key
                msg = self.streams[o].store.get(s)
                if msg is None:
                    continue
                band = cfg.inbox_band(next(iter(who))) if len(who) == 1 else cfg.data_band
                self._emit(Send(band, self._encode_msg(msg, F_RESEND),
                                "repair" if len(who) == 1 else "repair-multicast"))
                self.counters["repair.sent"] += 1
            self._repair_due = now if self._repairs else None
        if not self._repairs:
            while self._low_repairs and self._low_bucket.take(now):
                o, s, requester = self._low_repairs.popleft()
                msg = self.streams[o].store.get(s)
                if msg is not None:
                    self._emit(Send(cfg.inbox_band(requester),
                                    self._encode_msg(msg, F_RESEND | F_LOW),
                                    "repair-low"))
                    self.counters["repair.low-sent"] += 1

    def _on_gone(self, tx: int, g: Gone, now: float) -> None:
        if g.requester != self.me:
            return
        if g.stream == STREAM_ORDER:
            if self.next_g < g.low:
                self.counters["order.gone"] += g.low - self.next_g
                for k in [k for k in self._orders if k < g.low]:
                    del self._orders[k]
                self.next_g = g.low
                self._drain_orders(now)
            return
        st = self.streams[g.stream]
        self.counters["repair.gone-received"] += 1
        if tx != g.stream:
            # a holder that no longer has them: ask someone else (the origin decides gaps)
            self.counters["repair.gone-holder"] += 1
            st.nack_tries += 1
            st.asked_at = float("-inf")
            st.nack_due = now
            return
        if g.low - 1 > st.contiguous:
            self._skip(g.stream, st, g.low - 1, now, reason="gone")
        for r in st.lt_wanted:  # a low-priority fetch it cannot serve: stop asking
            if r[0] < g.low:
                r[0] = min(g.low, r[1] + 1)
        st.lt_wanted = [r for r in st.lt_wanted if r[0] <= r[1]]
        self._deliverable(now)

    # ------------------------------------------------------------------ long-term reconcile
    def _long_term(self, now: float) -> None:
        if not self.cfg.long_term_reconcile:
            return
        for o, st in enumerate(self.streams):
            if o == self.me or not st.lt_wanted:
                continue
            r = st.lt_wanted[0]
            target = self._choose_target(o, r[0], now, 0)
            if target is None or not self._lt_bucket.take(now):
                continue
            hi = min(r[1], r[0] + 4)
            self._emit(Send(BAND_REPAIR, encode_nack(self.tag, self.me,
                                                     Nack(target, o, F_LOW, ((r[0], hi),))),
                            "nack-low"))
            self.counters["sent.nack-low"] += 1
            r[0] = hi + 1
            if r[0] > r[1]:
                st.lt_wanted.pop(0)

    # ------------------------------------------------------------------ leader mode: leader
    def _leader_assign(self, msg: _Msg, now: float) -> None:
        """The leader orders a message whose FIFO predecessors are all ordered."""
        o = msg.origin
        flags = 0
        if o != self.me:
            p = self.peers[o]
            if p.state is not PeerState.S1:
                flags |= F_LATE
        self.g_high += 1
        g = self.g_high
        entry = (o, msg.seq, flags)
        self._order_log[g] = entry
        while len(self._order_log) > self.cfg.history_size:
            self._order_log.pop(self._order_log_first, None)
            self._order_log_first += 1
        if not self._order_out:
            self._order_out_first = g
        self._order_out.append(entry)
        self.counters["order.assigned"] += 1
        del self._ready[(o, msg.seq)]
        self._deliver(msg, now, late=bool(flags & F_LATE), gseq=g, local=False)

    def _flush_orders(self) -> None:
        if not self._order_out:
            return
        first = self._order_out_first
        entries = self._order_out
        self._order_out = []
        for k in range(0, len(entries), MAX_ORDER_ENTRIES):
            chunk = tuple(entries[k:k + MAX_ORDER_ENTRIES])
            self._out.append(Send(BAND_ORDER, encode_order(
                self.tag, self.me, Order(self.inc, self._view_bits(), first + k, chunk)),
                "order"))
            self.counters["sent.order"] += 1

    def _answer_order_nack(self, tx: int, n: Nack, now: float) -> None:
        if not self.is_leader:
            return
        for lo, hi in n.ranges:
            hi = min(hi, self.g_high)
            if lo < self._order_log_first:
                self._emit(Send(self.cfg.inbox_band(tx), encode_gone(
                    self.tag, self.me, Gone(tx, STREAM_ORDER, self._order_log_first)), "gone"))
                lo = self._order_log_first
            if lo > hi:
                continue
            entries = tuple(self._order_log[g] for g in range(lo, hi + 1))
            for k in range(0, len(entries), MAX_ORDER_ENTRIES):
                self._emit(Send(self.cfg.inbox_band(tx), encode_order(
                    self.tag, self.me,
                    Order(self.inc, self._view_bits(), lo + k, entries[k:k + MAX_ORDER_ENTRIES])),
                    "order-repair"))
                self.counters["repair.order-sent"] += 1

    # ------------------------------------------------------------------ leader mode: sites
    def _on_order(self, tx: int, o: Order, now: float) -> None:
        if self.mode != "leader" or tx != self.leader:
            raise ProtocolError("order-not-leader", f"ORDER from site {tx}")
        if self.is_leader:
            return
        p = self.peers[tx]
        if self._leader_inc and o.inc != self._leader_inc:
            self.counters["leader.restarted"] += 1
            self._orders.clear()
            self._order_synced = False
        self._leader_inc = o.inc
        self._leader_view = o.view
        if p.state in (PeerState.UNKNOWN, PeerState.S3):
            p.last_heard = now
            self._leader_seen_g(o.first - 1, now)
            self._set_peer(p, PeerState.S1, now)
        else:
            self._heard(tx, now)
            self._leader_seen_g(o.first - 1, now)
        for k, entry in enumerate(o.entries):
            g = o.first + k
            if g >= self.next_g:
                self._orders[g] = entry
        last = o.first + len(o.entries) - 1
        if last > self.g_high:
            self.g_high = last
        self._drain_orders(now)
        self._update_membership(now)

    def _leader_seen_g(self, g: int, now: float) -> None:
        """The leader has assigned up to *g* (from its heartbeat or an ORDER record)."""
        if not self._order_synced:
            # first contact, or back after a cut: resume at the leader's current position
            self._order_synced = True
            if g + 1 > self.next_g:
                skipped = g + 1 - self.next_g
                self.counters["order.skipped"] += skipped
                for k in [k for k in self._orders if k <= g]:
                    del self._orders[k]
                self.next_g = g + 1
        if g > self.g_high:
            self.g_high = g
        if self.g_high >= self.next_g and self._order_nack_due is None:
            self._order_nack_due = now + self.cfg.nack_delay

    def _leader_state_changed(self, old: PeerState, new: PeerState, now: float) -> None:
        if new in (PeerState.S2, PeerState.S3) and old in (PeerState.S1, PeerState.UNKNOWN):
            # cut off from the leader: intra-site chat; our waiting messages go out now
            for seq in sorted(self._awaiting_order):
                msg = self._awaiting_order[seq]
                if seq not in self._local_delivered:
                    self._deliver_local(msg, now)
            if not self.cfg.leader_reconcile_cut_site:
                self._order_synced = False
        if new is PeerState.S1 and old is PeerState.S2 and self.cfg.leader_reconcile_cut_site:
            self._order_nack_due = now

    def _deliver_local(self, msg: _Msg, now: float) -> None:
        if msg.seq in self._local_delivered:
            return
        self._local_delivered.add(msg.seq)
        self._deliver(msg, now, late=False, gseq=None, local=True)

    def _drain_orders(self, now: float) -> None:
        if self.mode != "leader" or self.is_leader or self._draining:
            return
        self._draining = True
        try:
            self._drain_orders_loop(now)
        finally:
            self._draining = False

    def _drain_orders_loop(self, now: float) -> None:
        while self.next_g in self._orders:
            g = self.next_g
            o, s, fl = self._orders[g]
            late = bool(fl & F_LATE)
            if o == self.me:
                # the leader orders our messages in FIFO order: any older one still waiting
                # was skipped by it (e.g. it restarted) and will never be ordered
                for old in [q for q in self._awaiting_order if q < s]:
                    self._deliver_local(self._awaiting_order.pop(old), now)
                for old in [q for q in self._local_delivered if q < s]:
                    self._local_delivered.discard(old)
                msg = self._awaiting_order.pop(s, None)
                if s in self._local_delivered:
                    self._local_delivered.discard(s)
                    self.counters["order.own-already-delivered"] += 1
                else:
                    msg = msg or self.streams[self.me].store.get(s)
                    if msg is None:
                        self.counters["order.own-unknown"] += 1
                    else:
                        self._deliver(msg, now, late=late, gseq=g, local=False)
            else:
                st = self.streams[o]
                msg = self._ready.pop((o, s), None) or st.pending.get(s) or st.store.get(s)
                if msg is None:
                    self._fetch_for_order(o, s, now)
                    return
                self._deliver(msg, now, late=late, gseq=g, local=False)
            del self._orders[g]
            self._fetch_due.pop((o, s), None)
            self.next_g += 1
        if (self._orders and min(self._orders) > self.next_g
                and self._order_nack_due is None):
            self._order_nack_due = now + self.cfg.nack_delay

    def _fetch_for_order(self, o: int, s: int, now: float) -> None:
        """ORDER entries name messages we lack: ask the leader (it holds everything it
        ordered), or another holder, for all of them at once (per origin, as ranges)."""
        due = self._fetch_due.get((o, s))
        if due is not None and due > now:
            return
        want: dict[int, list[int]] = {}
        for g in sorted(self._orders)[:MAX_NACK_NUMBERS]:
            eo, es, _ = self._orders[g]
            if eo == self.me or (eo, es) in self._ready:
                continue
            est = self.streams[eo]
            if es in est.pending or es in est.store:
                continue
            d = self._fetch_due.get((eo, es))
            if d is not None and d > now:
                continue
            want.setdefault(eo, []).append(es)
        lp = self.peers[self.leader]  # type: ignore[index]
        for eo, seqs in want.items():
            target = self.leader if self._reachable(lp, now) \
                else self._choose_target(eo, seqs[0], now, 0)
            if target is None:
                self.counters["nack.no-target"] += 1
                continue
            for q in seqs:
                self._fetch_due[(eo, q)] = now + self.cfg.nack_retry
            self._emit(Send(BAND_REPAIR, encode_nack(self.tag, self.me, Nack(
                target, eo, 0, tuple(_ranges(seqs)[:MAX_RANGES]))), "nack"))
            self.counters["sent.nack"] += 1

    def _order_nack(self, now: float) -> None:
        self._order_nack_due = None
        if self.is_leader or self.leader is None:
            return
        lp = self.peers[self.leader]
        if not self._reachable(lp, now) or not self._order_synced:
            return
        hi = max([self.g_high] + list(self._orders))
        missing = [g for g in range(self.next_g, hi + 1) if g not in self._orders]
        if not missing:
            return
        ranges = _ranges(missing[:MAX_NACK_NUMBERS])[:MAX_RANGES]
        self._emit(Send(BAND_REPAIR, encode_nack(self.tag, self.me, Nack(
            self.leader, STREAM_ORDER, 0, tuple(ranges))), "nack"))
        self.counters["sent.nack-order"] += 1
        self._order_nack_due = now + self.cfg.nack_retry

    def _prune_ready(self, now: float) -> None:
        """Leader mode, ordinary site: data never named by an ORDER we deliver (ordered while
        we were cut off) is dropped after ``keep_ready_for`` seconds."""
        if self.mode != "leader" or self.is_leader:
            return
        limit = now - self.cfg.keep_ready_for
        old = [k for k, m in self._ready.items() if m.rx < limit]
        for k in old:
            del self._ready[k]
        n = len(old)
        for o, st in enumerate(self.streams):
            if o == self.me or not st.pending:
                continue
            stale = [q for q, m in st.pending.items() if m.rx < limit]
            for q in stale:
                del st.pending[q]
            n += len(stale)
        if n:
            self.counters["ready.pruned"] += n
        for k in [k for k, v in self._fetch_due.items() if v < limit]:
            del self._fetch_due[k]


def default_config(sites: Sequence[str], **kwargs: Any) -> IGOConfig:
    """Shorthand: ``default_config(["a", "b"], mode="hasten")``."""
    return IGOConfig(sites=tuple(sites), **kwargs)


