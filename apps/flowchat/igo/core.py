"""SiteCore: the state one IGO site shares among its parts (peer states, incarnations,
transport, repairs, Lamport or leader ordering, stability): who the site is, the streams and
peers, the queues of messages on their way to delivery, and the list of actions the event in
hand produces. A plain object: each part (its own class, in its own module) holds it and
keeps what only that part uses to itself; :class:`~flowchat.igo.site.SiteOrdering` owns the
parts and this state. Sans-I/O: imports only the standard library, flowrouter.wire and the
other IGO modules."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .actions import Action, PeerState, Send
from .config import IGOConfig, room_tag
from .records import Msg, PeerRecord, Stream
from .wire import (
    MAX_INCARNATION,
    DataMsg,
    Gone,
    encode_data,
    encode_gone,
)

if TYPE_CHECKING:
    from .auth import FrameAuth


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
    """The state the parts of one site share (see the module documentation). Its fields are
    public on purpose: this object is the shared room, the parts meet here and through their
    narrow interfaces (:mod:`.parts`), not through one another's private names."""

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
        self.t0 = now
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
        self.members: tuple[str, ...] = ()  #: the ordering set, as this site sees it
        #: (lamport, origin, incarnation, seq) of messages ready to order
        self.heap: list[tuple[int, int, int, int]] = []
        #: the same for late messages, released in key order (see lamport.py)
        self.late_heap: list[tuple[int, int, int, int]] = []
        self.late_waiting: Counter[int] = Counter()  #: origin -> messages in late_heap
        #: history fetched in the background (after a restart, a long-term disconnect)
        self.history_heap: list[tuple[int, int, int, int]] = []
        self.ready: dict[tuple[int, int, int], Msg] = {}  #: (origin, incarnation, seq)
        self.next_hb = now  #: when the next regular heartbeat is due
        self.last_hb = float("-inf")
        self.acks_changed = False  #: our acknowledgements moved since the last heartbeat
        self.urgent_hb = False  #: a peer should hear where we are soon (reconciliation)
        # --- leader mode (the leader part's, and what the others look at)
        self.g_high = 0  #: leader: last order number assigned; site: highest known
        #: leader: history fetched in the background, waiting in ready to be ordered late
        self.refills: set[tuple[int, int, int]] = set()
        self.next_g = 1  #: site: next order number to deliver
        #: g -> (origin, incarnation, seq, flags): received, not yet delivered
        self.orders: dict[int, tuple[int, int, int, int]] = {}
        self.order_synced = False
        self.order_nack_due: float | None = None
        self.awaiting_order: dict[int, Msg] = {}  #: own messages not yet ordered/delivered
        self.local_delivered: set[int] = set()  #: own seqs delivered while cut off
        self.leader_view = 0
        self.leader_inc = 0
        self.deliveries = 0
        self.out: list[Action] = []  #: the actions of the event in hand
        self.now = now  #: the time of the event in hand

    def emit(self, action: Action) -> None:
        self.out.append(action)

    def stream(self, o: int, inc: int) -> Stream | None:
        """The stream of origin *o*'s incarnation *inc*, current or retired (None: unknown
        here, or forgotten)."""
        st = self.streams[o]
        if st.inc == inc:
            return st
        for old in self.retired.get(o, ()):
            if old.inc == inc:
                return old
        return None

    def all_streams(self) -> list[Stream]:
        """Every stream kept: the current one of each origin, then the retired ones."""
        out = list(self.streams)
        for olds in self.retired.values():
            out.extend(olds)
        return out

    def send_gone(self, requester: int, stream: int, low: int, inc: int) -> None:
        """Tell *requester* that of *stream* (run *inc*) nothing below *low* can be had from
        us: it must skip that, or ask another holder (on its inbox band)."""
        self.emit(Send(self.cfg.inbox_band(requester), encode_gone(
            self.tag, self.me, Gone(requester, stream, low, inc)), "gone"))

    def encode_msg(self, m: Msg, flags: int) -> bytes:
        return encode_data(self.tag, self.me, DataMsg(m.origin, m.inc, m.seq, m.lamport,
                                                      m.send_time, flags, m.deps, m.payload,
                                                      m.sig, m.view))
