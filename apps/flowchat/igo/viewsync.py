"""The site's part that runs the view agreement (:mod:`.views`) and applies its outcome to
ordering: which sites the Lamport rule waits for (the installed view's members), which
messages are in order (those sent in the view this site is in) or late (sent in an older
view, or above the agreed cut of the view being left), when own messages may go (not while
a change is under way), and the actions an application shows (:class:`ViewChange`,
:class:`ViewInstalled`). A part of :class:`~flowchat.igo.site.SiteOrdering`, holding the
shared SiteCore; leader mode has its leader's view instead and leaves this part idle.
Sans-I/O: imports only the standard library, flowrouter.wire and the other IGO modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowrouter.wire.bands import BAND_HEARTBEAT

from .actions import PeerState, Send, ViewChange, ViewInstalled
from .records import Msg, PeerRecord
from .views import (
    Broadcast,
    CutAgreed,
    FlushStarted,
    Installed,
    LocalState,
    ViewAgreement,
    ViewOutput,
    vid_counter,
)
from .wire import ViewRecord, encode_view

if TYPE_CHECKING:
    from .core import SiteCore
    from .parts import Liveness, OrderingRule, RepairRequests

IN_ORDER, LATE, WAIT = "in-order", "late", "wait"
#: sent in a view this run of the site never shared with anyone (it has installed none yet:
#: it started, or restarted, while the others had moved on): the Lamport rule alone decides
#: (a restarted site shows the live traffic of its peers at once, as without views)
UNVIEWED = "unviewed"


class ViewSync:
    """Agreed views for the all-to-all modes (see the module documentation)."""

    _liveness: Liveness
    _repair: RepairRequests
    _ordering: OrderingRule

    def __init__(self, core: SiteCore, now: float) -> None:
        self.core = core
        self.cfg = core.cfg
        self.enabled = (core.mode != "leader" and core.cfg.agreed_views
                        and not core.cfg.stability)
        self.agreement = ViewAgreement(core.me, core.n, timeout=core.cfg.heartbeat_interval,
                                       rejoin_after=core.cfg.detect_after, now=now)
        self.history: list[ViewInstalled] = []  #: views installed here, oldest first
        self._flush_at: dict[int, float] = {}  #: proposal vid -> when this site adopted it
        #: when this site adopted the change to the installed view: a member that was
        #: disconnected here already then (reconciling after a heal) stays while it
        #: reconciles; one that leaves S1 later is proposed out
        self._basis = now

    def connect(self, *, liveness: Liveness, repairs: RepairRequests,
                ordering: OrderingRule) -> None:
        self._liveness = liveness
        self._repair = repairs
        self._ordering = ordering

    # ------------------------------------------------------------------ queries

    @property
    def vid(self) -> int:
        """The installed view's id (0 before any change, and in leader mode)."""
        return self.agreement.view.vid

    @property
    def members(self) -> frozenset[int]:
        """The installed view's members (indices)."""
        return self.agreement.view.members

    def status(self) -> dict[str, object]:
        """For status pages and ``/who``: the installed view and a change under way."""
        a = self.agreement
        names = self.cfg.sites
        out: dict[str, object] = {
            "id": a.view.vid, "number": a.view.number,
            "members": [names[i] for i in sorted(a.view.members)],
            "agreed": self.enabled, "changing": self.flushing, "installed": a.installs}
        if self.history:
            out["transitional"] = list(self.history[-1].transitional)
        if a.pending is not None:
            out["proposal"] = {"id": a.pending.vid, "number": vid_counter(a.pending.vid),
                               "members": [names[i] for i in sorted(a.pending.members)],
                               "records": len(a.pending.answers)}
        return out

    @property
    def flushing(self) -> bool:
        """A change is under way: own messages wait for the new view."""
        return self.enabled and self.agreement.flushing

    def member(self, p: PeerRecord) -> bool:
        """Whether the Lamport rule waits for peer *p*: a member of the installed view,
        unless a change is agreed and every message it sent in the view is here (its
        stream reached the cut)."""
        if p.idx not in self.agreement.view.members:
            return False
        pos = self.agreement.cut_position(p.idx)
        if pos is None:
            return True
        st = self.core.streams[p.idx]
        return st.inc == pos[0] and st.contiguous < pos[1]

    def classify(self, msg: Msg) -> str:
        """Whether *msg* (its FIFO predecessors in) is in order here, late, or waits for a
        view this site has not installed yet."""
        view = self.agreement.view
        if msg.view == view.vid:
            pos = self.agreement.cut_position(msg.origin)
            if msg.origin not in view.members:
                return LATE
            if pos is not None and (msg.inc != pos[0] or msg.seq > pos[1]):
                return LATE  # above the cut: the members staying together never had it
            return IN_ORDER
        pending = self.agreement.pending
        if pending is not None and msg.view == pending.vid:
            return WAIT  # sent in the view being installed here
        if self.agreement.installs == 0:
            return UNVIEWED
        # an older view, or one this site is not in: a view is installed only once every
        # member said READY, so a view with us in it sends nothing before we are ready to
        # install it too (then it is our pending one)
        return LATE

    # ------------------------------------------------------------------ events

    def tick(self, now: float) -> None:
        if not self.enabled:
            return
        self._apply(self.agreement.tick(now, self._local(), *self._sets(now),
                                        self._fresh(now)), now)

    def on_record(self, tx: int, rec: ViewRecord, now: float) -> None:
        if not self.enabled:
            self.core.counters["view.ignored-leader-mode"] += 1
            return
        self._note_positions(tx, rec)
        self._apply(self.agreement.on_record(tx, rec, now, self._local(), *self._sets(now),
                                             self._fresh(now)), now)

    def on_peer_view(self, tx: int, vid: int, now: float) -> None:
        if self.enabled:
            self.agreement.on_peer_view(tx, vid, now)

    def try_install(self, now: float) -> bool:
        """After delivery: if the agreed cut is shown, install the new view (True)."""
        cut = self.agreement.cut
        if cut is None:
            return False
        core = self.core
        for o in cut.old.members:
            pos = cut.positions[o]
            st = core.streams[o]
            if o != core.me and st.inc == pos[0] and st.contiguous < pos[1]:
                return False
        old = cut.old.vid
        for entry in core.heap:
            m = core.ready.get((entry[1], entry[2], entry[3]))
            if m is not None and m.view == old and self.classify(m) == IN_ORDER:
                return False  # still to be shown in the old view
        core.clock = max(core.clock, cut.clock)
        self._apply(self.agreement.complete(now), now)
        return True

    # ------------------------------------------------------------------ internals

    def _sets(self, now: float) -> tuple[frozenset[int], frozenset[int]]:
        """(desired, heard): the peers the failure detector counts in the ordering set,
        and those heard recently."""
        members = self.agreement.view.members
        desired = frozenset(p.idx for p in self.core.peers.values()
                            if self._liveness.locally_connected(p)
                            or p.idx in members and p.state is PeerState.S2 and p.reconciling
                            and p.since <= self._basis)
        heard = frozenset(p.idx for p in self.core.peers.values()
                          if p.state in (PeerState.S1, PeerState.S2)
                          and now - p.last_heard < self.cfg.detect_after)
        return desired, heard

    def _fresh(self, now: float) -> frozenset[int]:
        """The peers heard within the last heartbeat interval: surely alive."""
        return frozenset(p.idx for p in self.core.peers.values()
                         if now - p.last_heard < self.cfg.heartbeat_interval)

    def _local(self) -> LocalState:
        core = self.core
        return LocalState(core.clock, tuple(
            (core.inc, core.seq) if st.origin == core.me else (st.inc, st.contiguous)
            for st in core.streams))

    def _note_positions(self, tx: int, rec: ViewRecord) -> None:
        """A view record says what its sender holds: like a heartbeat's acknowledgements,
        it makes the sender a holder to fetch the cut from."""
        p = self.core.peers.get(tx)
        if p is None or len(p.acks) != self.core.n or len(p.ack_incs) != self.core.n:
            return
        acks = list(p.acks)
        for o, (inc, seq) in enumerate(rec.positions):
            if o != self.core.me and p.ack_incs[o] == inc and seq > acks[o]:
                acks[o] = seq
        p.acks = tuple(acks)

    def _apply(self, outs: list[ViewOutput], now: float) -> None:
        core = self.core
        names = core.cfg.sites
        for o in outs:
            if isinstance(o, Broadcast):
                core.emit(Send(BAND_HEARTBEAT, encode_view(core.tag, core.me, o.record),
                               "view"))
                core.counters["sent.view"] += 1
            elif isinstance(o, FlushStarted):
                core.counters["view.flush"] += 1
                self._flush_at = {o.vid: now}
                core.emit(ViewChange(now, o.vid, vid_counter(o.vid),
                                     tuple(names[i] for i in sorted(o.members))))
            elif isinstance(o, CutAgreed):
                core.counters["view.agreed"] += 1
                for i in o.cut.old.members:
                    st = core.streams[i]
                    inc, seq = o.cut.positions[i]
                    if i != core.me and st.inc == inc and seq > st.contiguous:
                        st.known_high = max(st.known_high, seq)
                        self._repair.want_nack(st, now, immediate=True)
                self._ordering.deliverable(now)
            elif isinstance(o, Installed):
                core.counters["view.installed"] += 1
                self._basis = self._flush_at.get(o.view.vid, now)
                ev = ViewInstalled(now, o.view.vid, o.view.number,
                                   tuple(names[i] for i in sorted(o.view.members)),
                                   tuple(names[i] for i in sorted(o.transitional)),
                                   o.previous.vid)
                self.history.append(ev)
                core.emit(ev)
                self._liveness.update_membership(now)
                self._ordering.deliverable(now)
