"""SiteCore: the state one IGO site keeps, shared by its parts (states, transport, repairs,
Lamport or leader ordering, stability), and the plumbing that turns events into actions.
Sans-I/O: imports only the standard library, flowrouter.wire and the other IGO modules."""

from __future__ import annotations

import secrets
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flowrouter.wire.bands import (
    BAND_HEARTBEAT,
    BAND_ORDER,
    BAND_REPAIR,
)

from .actions import Action, Deliver, Delivery, PeerState, Send
from .config import IGOConfig, room_tag
from .flowcontrol import SendWindow
from .records import Msg, PeerRecord, Stream, TokenBucket
from .stall import StallWatch
from .wire import (
    K_DATA,
    K_GONE,
    K_HEARTBEAT,
    K_NACK,
    K_ORDER,
    KIND_NAMES,
    MAX_INCARNATION,
    MAX_NACK_NUMBERS,
    DataMsg,
    Gone,
    Heartbeat,
    Nack,
    Order,
    ProtocolError,
    encode_data,
)

if TYPE_CHECKING:
    from .auth import FrameAuth
    from .peerevents import PeerEvent


#: earlier incarnations of each origin kept (their undelivered messages, settled positions,
#: repair history); an older one is forgotten (dependencies on it count as met)
RETIRED_KEPT = 2


def new_incarnation(wall_time: float, salt: int | None = None) -> int:
    """An incarnation id for a site starting at *wall_time* (seconds): the time in
    milliseconds shifted left 16 bits, plus 16 bits of *salt* (default random). Later runs
    of a site get larger ids, which is how receivers tell a restart from a stale frame of an
    earlier run; the low bits keep two sites (or runs) starting in one millisecond apart."""
    ms = max(0, int(wall_time * 1000))
    low = secrets.randbits(16) if salt is None else salt & 0xFFFF
    return ((ms << 16) | low) & MAX_INCARNATION or 1


class SiteCore:
    """The state of one site and its action plumbing; each part of :class:`~flowchat.igo.site.
    SiteOrdering` is a subclass adding one concern's methods."""

    def __init__(self, config: IGOConfig, site: str, now: float = 0.0,
                 incarnation: int | None = None, auth: FrameAuth | None = None,
                 shown: Iterable[tuple[str, int, int]] = ()) -> None:
        self.cfg = config
        #: display marks of this site's previous run, (origin index, incarnation) -> seq:
        #: what it showed before it restarted, never shown again (see display_marks())
        self.shown_before: dict[tuple[int, int], int] = {
            (config.index(o), inc): seq for o, inc, seq in shown if o in config.sites}
        #: keyed room: frames are signed by their transmitter, DATA by its origin too
        self.auth = auth
        self.site = site
        self.me = config.index(site)
        self.n = len(config.sites)
        self.tag = room_tag(config)
        if incarnation is None:
            incarnation = new_incarnation(now)
        if not 0 < incarnation <= MAX_INCARNATION:
            raise ValueError(f"incarnation must be 1..2**64-1, got {incarnation}")
        self.inc = incarnation
        self.started = now
        self.mode = config.mode
        self.leader = (config.index(config.leader) if config.mode == "leader"
                       and config.leader is not None else None)
        self.is_leader = self.leader == self.me
        self.counters: Counter[str] = Counter()
        self.clock = 0  #: Lamport clock: the next own message gets this time
        self.seq = 0  #: last own sequence number
        #: per origin, the stream of its current (newest known) incarnation ...
        self.streams = [Stream(i) for i in range(self.n)]
        #: ... and of earlier ones still referred to (oldest first, at most RETIRED_KEPT)
        self.retired: dict[int, list[Stream]] = {}
        own = self.streams[self.me]
        own.inc = self.inc
        own.synced = True
        self.peers = {i: PeerRecord(i, s) for i, s in enumerate(config.sites) if i != self.me}
        self.state = PeerState.S1  #: overall: S1 / S2 / S3
        self._members: tuple[str, ...] = ()
        #: (lamport, origin, incarnation, seq) of messages ready to order
        self._heap: list[tuple[int, int, int, int]] = []
        #: the same for late messages, released in key order (see lamport.py)
        self._late_heap: list[tuple[int, int, int, int]] = []
        self._late_waiting: Counter[int] = Counter()  #: origin -> messages in _late_heap
        #: history fetched in the background (after a restart, a long-term disconnect)
        self._history_heap: list[tuple[int, int, int, int]] = []
        self._ready: dict[tuple[int, int, int], Msg] = {}  #: (origin, incarnation, seq)
        self._last_key: tuple[int, int] = (-1, -1)  #: last delivered (lamport, origin)
        self._dep_wait: dict[tuple[int, int, int], float] = {}
        self._next_hb = now
        self._last_hb = float("-inf")
        self._acks_changed = False
        self._urgent_hb = False
        #: (origin or STREAM_ORDER, incarnation, number) -> requesters
        self._repairs: dict[tuple[int, int, int], set[int]] = {}
        self._repair_due: float | None = None
        #: (origin, incarnation, seq, requester)
        self._low_repairs: deque[tuple[int, int, int, int]] = deque()
        self._repair_bucket = TokenBucket(config.repair_rate, config.repair_rate, now)
        self._repair_bytes = TokenBucket(config.repair_bytes, config.repair_bytes, now)
        #: (origin, incarnation, seq, requester) -> when it was last resent to it
        self._resent: dict[tuple[int, int, int, int], float] = {}
        self._low_bucket = TokenBucket(config.long_term_rate, 1.0, now)
        self._lt_bucket = TokenBucket(config.long_term_rate, 1.0, now)
        self._lt_turn = 0  #: the stream whose low-priority fetch goes next (round robin)
        self._display: deque[Delivery] = deque()
        self._display_bucket = (TokenBucket(config.display_rate, config.display_burst, now)
                                if config.display_rate else None)
        # --- leader mode
        self.g_high = 0  #: leader: last order number assigned
        self._assigning = False  #: leader: inside _leader_assign_ready (no re-entry)
        self._order_log: dict[int, tuple[int, int, int, int]] = {}  #: leader: g -> entry
        #: leader: history fetched in the background, waiting in _ready to be ordered late
        self._refills: set[tuple[int, int, int]] = set()
        self._order_log_first = 1
        self._order_out: list[tuple[int, int, int, int]] = []
        self._order_out_first = 0
        self.next_g = 1  #: site: next order number to deliver
        #: g -> (origin, incarnation, seq, flags): received, not yet delivered
        self._orders: dict[int, tuple[int, int, int, int]] = {}
        self._order_synced = False
        self._order_nack_due: float | None = None
        self._awaiting_order: dict[int, Msg] = {}  #: own messages not yet ordered/delivered
        self._local_delivered: set[int] = set()  #: own seqs delivered while cut off
        self._leader_view = 0
        self._leader_inc = 0
        self._fetch_due: dict[tuple[int, int, int], float] = {}  #: (origin, inc, seq)
        #: head-of-line stalls of heard peers (flapping links), see stall.py
        self.stalls = StallWatch(config.stall_after)
        #: own messages in flight and the outbox (congestion), see flowcontrol.py
        self.flow = SendWindow(config.send_window, config.outbox_limit)
        self._congested = False
        self._fetch_tries: dict[tuple[int, int], int] = {}  #: (origin, inc) -> retries
        self._draining = False
        self.deliveries = 0
        self._out: list[Action] = []
        self._now = now
        self._t0 = now
        self._update_membership(now)

    def _begin(self, now: float) -> None:
        self._now = now

    def _emit(self, action: Action) -> None:
        self._out.append(action)

    @property
    def undelivered(self) -> int:
        """Messages ordered and ready but not delivered yet (none once the site caught up)."""
        return len(self._ready)

    def finish(self, now: float) -> list[Action]:
        """The actions of the event just handled (orders drained and flushed, display paced);
        every event handler ends with it, and a driver calls it once after construction."""
        if self.mode == "leader" and not self.is_leader:
            self._drain_orders(now)
        self._flush_orders()
        if self._display_bucket is not None:
            while self._display and self._display_bucket.take(now):
                d = self._display.popleft()
                self._out.append(Deliver(replace(d, delivery_time=now)))
        out, self._out = self._out, []
        if self.auth is not None:
            sign = self.auth.sign
            out = [Send(a.band, a.payload + sign(a.payload), a.kind) if isinstance(a, Send)
                   else a for a in out]
        return out

    def _stream(self, o: int, inc: int) -> Stream | None:
        """The stream of origin *o*'s incarnation *inc*, current or retired (None: unknown
        here, or forgotten)."""
        st = self.streams[o]
        if st.inc == inc:
            return st
        for old in self.retired.get(o, ()):
            if old.inc == inc:
                return old
        return None

    def _all_streams(self) -> list[Stream]:
        """Every stream kept: the current one of each origin, then the retired ones."""
        out = list(self.streams)
        for olds in self.retired.values():
            out.extend(olds)
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

    def _encode_msg(self, m: Msg, flags: int) -> bytes:
        return encode_data(self.tag, self.me, DataMsg(m.origin, m.inc, m.seq, m.lamport,
                                                      m.send_time, flags, m.deps, m.payload,
                                                      m.sig))

    if TYPE_CHECKING:  # the parts' methods the others call (defined in their modules)
        def _reachable(self, p: PeerRecord, now: float) -> bool: ...

        def _heard(self, i: int, now: float) -> None: ...

        def _first_contact(self, p: PeerRecord, st: Stream, upto: int,
                           now: float) -> None: ...

        def _check_caught_up(self, p: PeerRecord, now: float) -> None: ...

        def _set_peer(self, p: PeerRecord, new: PeerState, now: float,
                      reason: str = "") -> None: ...

        def _peer_event(self, p: PeerRecord, event: PeerEvent, now: float) -> None: ...

        def _detect_silence(self, now: float) -> None: ...

        def _detect_stalls(self, now: float) -> None: ...

        def _update_state(self, now: float) -> None: ...

        def _in_ordering(self, p: PeerRecord) -> bool: ...

        def _update_membership(self, now: float) -> None: ...

        def _view_bits(self) -> int: ...

        def _send_heartbeat(self, now: float, flags: int) -> None: ...

        def _on_heartbeat(self, tx: int, hb: Heartbeat, now: float) -> None: ...

        def _incarnation(self, p: PeerRecord, st: Stream, inc: int, now: float) -> bool: ...

        def _expire_retired(self, now: float) -> None: ...

        def _keep(self, st: Stream, msg: Msg) -> None: ...

        @staticmethod
        def _held_from(st: Stream) -> int: ...

        def _holds(self, p: PeerRecord, o: int, first: int, inc: int) -> bool: ...

        def _on_data(self, tx: int, d: DataMsg, now: float) -> None: ...

        def _advance(self, o: int, st: Stream, now: float) -> None: ...

        def _skip(self, o: int, st: Stream, upto: int, now: float, *,
                  reason: str) -> None: ...

        def _add_skip(self, st: Stream, lo: int, hi: int) -> None: ...

        def _unskip(self, st: Stream, seq: int) -> bool: ...

        def _gap_nacks_enabled(self) -> bool: ...

        def _want_nack(self, st: Stream, now: float, immediate: bool = False,
                       hint: bool = False) -> None: ...

        def _missing(self, st: Stream, above: int = 0, limit: int = MAX_NACK_NUMBERS
                     ) -> list[tuple[int, int]]: ...

        def _choose_target(self, st: Stream, first: int, now: float,
                           tries: int) -> int | None: ...

        def _nacks(self, now: float) -> None: ...

        def _on_nack(self, tx: int, n: Nack, now: float) -> None: ...

        def _serve_repairs(self, now: float) -> None: ...

        def _on_gone(self, tx: int, g: Gone, now: float) -> None: ...

        def _long_term(self, now: float) -> None: ...

        def _accept(self, msg: Msg, now: float, refill: bool = False) -> None: ...

        def _late_ok(self, t: int, o: int) -> bool: ...

        def _after_late(self, msg: Msg) -> bool: ...

        def _deliver_late(self, now: float) -> None: ...

        def _lamport_ok(self, t: int, o: int) -> bool: ...

        def _frontier(self) -> tuple[int, int]: ...

        def _deps_ok(self, msg: Msg, now: float, late: bool = False) -> bool: ...

        def _deliverable(self, now: float) -> None: ...

        def _deliver(self, msg: Msg, now: float, *, late: bool, gseq: int | None,
                     local: bool) -> None: ...

        def _settle(self, st: Stream) -> None: ...

        def _stable(self, msg: Msg, now: float) -> bool: ...

        def _leader_assign(self, msg: Msg, now: float, late: bool = False) -> None: ...

        def _leader_assign_ready(self, now: float) -> None: ...

        def _flush_orders(self) -> None: ...

        def _answer_order_nack(self, tx: int, n: Nack, now: float) -> None: ...

        def _on_order(self, tx: int, o: Order, now: float) -> None: ...

        def _leader_seen_g(self, g: int, now: float) -> None: ...

        def _leader_restarted(self, inc: int) -> None: ...

        def _leader_state_changed(self, old: PeerState, new: PeerState,
                                  now: float) -> None: ...

        def _deliver_local(self, msg: Msg, now: float) -> None: ...

        def _drain_orders(self, now: float) -> None: ...

        def _drain_orders_loop(self, now: float) -> None: ...

        def _fetch_for_order(self, o: int, inc: int, s: int, now: float) -> None: ...

        def _order_nack(self, now: float) -> None: ...

        def _prune_ready(self, now: float) -> None: ...
