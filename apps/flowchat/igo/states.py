"""Site state machine: per-peer states S1/S2/S3 (the transition table and its named events are
:mod:`~flowchat.igo.peerevents`), the site's overall state, the ordering set (membership) and
heartbeats. Sans-I/O: imports only the standard library, flowrouter.wire and the other IGO
modules.
"""

from __future__ import annotations

from flowrouter.wire.bands import (
    BAND_HEARTBEAT,
)

from .actions import MembershipChange, PeerState, Send, StateChange
from .core import SiteCore
from .parts import (
    IncarnationTracking,
    LeaderOrder,
    OrderingRule,
    RepairRequests,
    StreamTransport,
    ViewMembership,
)
from .peerevents import TRANSITIONS, PeerEvent
from .records import PeerRecord, Stream
from .stall import StallWatch
from .wire import Heartbeat, encode_heartbeat


class PeerStates:
    """Peers' liveness and states, membership and heartbeats; a part of SiteOrdering, holding
    the shared SiteCore."""

    _incs: IncarnationTracking
    _transport: StreamTransport
    _repair: RepairRequests
    _ordering: OrderingRule
    _leading: LeaderOrder

    def __init__(self, core: SiteCore) -> None:
        self.core = core
        self._views: ViewMembership | None = None
        #: head-of-line stalls of heard peers (flapping links), see stall.py
        self.stalls = StallWatch(core.cfg.stall_after)

    def connect(self, *, incarnations: IncarnationTracking, transport: StreamTransport,
                repairs: RepairRequests, ordering: OrderingRule, leader: LeaderOrder) -> None:
        """The other parts this one asks (set once, by the coordinator)."""
        self._incs = incarnations
        self._transport = transport
        self._repair = repairs
        self._ordering = ordering
        self._leading = leader

    def attach_views(self, views: ViewMembership) -> None:
        """Agreed views decide the ordering set (all-to-all modes, see viewsync.py)."""
        self._views = views if views.enabled else None

    def reachable(self, p: PeerRecord, now: float) -> bool:
        return (p.state is PeerState.S1 or p.state is PeerState.S2 and p.reconciling) \
            and now - p.last_heard < self.core.cfg.detect_after

    def heard(self, i: int, now: float) -> None:
        """Any frame transmitted by peer *i*: a sign of life."""
        p = self.core.peers[i]
        p.last_heard = now
        if p.state is PeerState.S2 and not p.reconciling:
            p.reconciling = True
            self.core.urgent_hb = True  # tell it where we are, so it can reconcile quickly
            self.core.counters["reconcile.started"] += 1
            st = self.core.streams[i]
            # a fresh reconciliation asks the origin first (not the holder that earlier
            # retries rotated to): after a partition heals each origin's link carries its
            # own repairs, in parallel, instead of one link carrying another side's too
            st.nack_tries = 0
            st.asked_at = float("-inf")  # the next request is a first one, not a retry
            if st.known_high > st.contiguous:
                self._repair.want_nack(st, now, immediate=True)
            self.check_caught_up(p, now)

    def first_contact(self, p: PeerRecord, st: Stream, upto: int,
                      now: float) -> None:
        """Unknown / long-term disconnected peer heard: resume its stream at *upto*.

        A *successor* stream (the peer restarted: a new incarnation) is not resumed but
        fetched from its start, bounded by ``max_lag``: all of it is new conversation."""
        if st.successor:
            self.core.counters["restart.contact"] += 1
            if 0 < upto - st.contiguous <= self.core.cfg.max_lag:
                self.core.counters["restart.fetch"] += 1
                st.known_high = max(st.known_high, upto)
                upto = st.contiguous
                self._repair.want_nack(st, now, immediate=True)
        elif p.state is PeerState.S3:
            self.core.counters["reconnect.long-term"] += 1
            # without transitive connectivity a site we still reach may have received what
            # this one said meanwhile: that part of the conversation was ours, fetch it
            # (peers connected to us all along, that hold the messages right after ours)
            held = max((q.acks[p.idx] for q in self.core.peers.values()
                        if q is not p and q.state is PeerState.S1 and q.since <= p.since
                        and self.reachable(q, now)
                        and self._transport.holds(q, p.idx, st.contiguous + 1, st.inc)), default=0)
            if self.core.cfg.stability and upto > st.contiguous:
                # stability tracking promises connected sites the same sequence, and our
                # acknowledgements cannot tell "skipped" from "have": reconcile instead
                # (bounded by max_lag: the origin answers GONE beyond it)
                held = upto
            if held > st.contiguous:
                self.core.counters["reconnect.fetch-from-holders"] += 1
                upto = st.contiguous
                st.known_high = max(st.known_high, held)
                self._repair.want_nack(st, now, immediate=True)
        elif (p.state is PeerState.UNKNOWN
              and now - self.core.started < self.core.cfg.disconnect_interval
              and upto > st.contiguous):
            mark = self.core.shown_before.get((p.idx, st.inc))
            if (self.core.is_leader and mark is not None
                    and 0 < upto - mark <= self.core.cfg.max_lag):
                # a restarted leader: what it missed while down (since its marks) is what
                # the old run may have left unordered, and everybody's order depends on it:
                # fetched at once, ordered before the live messages that follow it
                self.core.counters["history.leader-fetch"] += upto - mark
                self.core.counters["history.shown-before"] += mark - st.contiguous
                self._transport.skip(p.idx, st, mark, now, reason="history")
                st.known_high = max(st.known_high, upto)
                upto = st.contiguous
                self._repair.want_nack(st, now, immediate=True)
            elif mark is None and upto - st.contiguous <= self.core.cfg.startup_fetch:
                # A peer heard for the first time while we are starting up, a few messages
                # into its stream: not history from before we joined but, very likely, lost
                # on the way (as when every site starts together and a first message is
                # dropped). Reconcile it like a short-term disconnect.
                self.core.counters["first-contact.fetch"] += 1
                st.known_high = max(st.known_high, upto)
                upto = st.contiguous
                self._repair.want_nack(st, now, immediate=True)
            else:
                # a restart (or a late join): live traffic first; what the peer said before
                # is history, fetched in the background at a low rate and shown flagged
                # late, except what this site showed before it restarted (its marks)
                lo = max(st.contiguous, mark or 0, upto - self.core.cfg.max_lag) + 1
                if lo <= upto:
                    st.lt_wanted.append([lo, upto])
                    st.history.append([lo, upto])
                    self.core.counters["history.wanted"] += upto - lo + 1
                if mark is not None:
                    self.core.counters["history.shown-before"] += min(mark, upto) - st.contiguous
                self._transport.skip(p.idx, st, upto, now, reason="history")
        self._transport.skip(p.idx, st, upto, now, reason="long-term")
        st.synced = True
        self.core.urgent_hb = True
        self.peer_event(p, PeerEvent.CONTACT, now)

    def check_caught_up(self, p: PeerRecord, now: float) -> None:
        st = self.core.streams[p.idx]
        if p.state is PeerState.S2 and p.reconciling and st.contiguous >= st.known_high \
                and st.contiguous >= st.hb_high:
            self.core.counters["reconcile.done"] += 1
            self.peer_event(p, PeerEvent.RECONCILED, now)

    def detect_silence(self, now: float) -> None:
        """Failure detection: silent peers get SILENT / LONG_SILENCE events."""
        cfg = self.core.cfg
        for p in self.core.peers.values():
            silent = now - max(p.last_heard, self.core.t0)
            if p.state is PeerState.S2:
                if p.reconciling and silent >= cfg.detect_after:
                    p.reconciling = False
                    self.core.counters["reconcile.interrupted"] += 1
                if silent >= cfg.disconnect_interval:
                    self.peer_event(p, PeerEvent.LONG_SILENCE, now)
            elif silent >= cfg.detect_after:
                self.peer_event(p, PeerEvent.SILENT, now)

    def detect_stalls(self, now: float) -> None:
        """Head-of-line stalls (:mod:`.stall`): a connected peer one of whose messages has
        been known to exist and missing for ``stall_timeout``, or (a site following a
        leader) an order number known and undelivered that long, or one of our messages
        the leader has not acknowledged that long, is a short-term disconnect
        (``STALLED``): heard, but not usable, so the ordering goes on without it and
        reconciles it later."""
        watch = self.stalls
        # a site following a leader watches the leader's order stream (below): it fetches
        # only what ORDER entries name, so its peers' streams keep gaps by design
        follower = self.core.mode == "leader" and not self.core.is_leader
        for p in self.core.peers.values():
            st = self.core.streams[p.idx]
            if p.state is not PeerState.S1 or follower:
                watch.reset(p.idx)
                continue
            if not st.synced:
                watch.reset(p.idx)
                continue
            if watch.missing_stalled(p.idx, st.known_high, st.contiguous, now):
                watch.reset(p.idx)
                self.core.counters["stall.detected"] += 1
                self.peer_event(p, PeerEvent.STALLED, now)
        if self.core.mode == "leader" and not self.core.is_leader:
            lp = self.core.peers[self.core.leader]  # type: ignore[index]
            if lp.state is not PeerState.S1 or not self.core.order_synced:
                watch.reset("order")
                watch.reset("own")
                return
            # the order stream: an order number known to exist (from an ORDER record or
            # the leader's heartbeat) and not delivered for the time-out while the stream
            # does not drain (its entries or their data do not get through, or only a
            # little in each up window; a backlog worked through after a merge drains)
            core = self.core
            known = max([core.g_high, *core.orders])
            order = watch.backlog_stalled("order", known, core.next_g - 1, now)
            # our own messages the leader has not acknowledged (it lacks them: our data
            # does not get through) count too, while its acknowledgements do not advance;
            # ones it holds merely wait their turn
            held = (lp.acks[core.me] if len(lp.acks) == core.n and len(lp.ack_incs) == core.n
                    and lp.ack_incs[core.me] == core.inc else 0)
            oldest = min((m.rx for m in core.awaiting_order.values()
                          if m.seq > held and m.seq not in core.local_delivered),
                         default=now)
            own = watch.acks_stalled("own", oldest, held, now)
            if order or own:
                watch.reset("order")
                watch.reset("own")
                self.core.counters["stall.detected-order"] += 1
                self.peer_event(lp, PeerEvent.STALLED, now)

    def peer_event(self, p: PeerRecord, event: PeerEvent, now: float) -> None:
        """Apply *event* to peer *p* through :data:`TRANSITIONS`."""
        new = TRANSITIONS.get((p.state, event))
        if new is not None:
            self._set_peer(p, new, now, "stalled" if event is PeerEvent.STALLED else "")

    def _set_peer(self, p: PeerRecord, new: PeerState, now: float, reason: str = "") -> None:
        old = p.state
        if old is new:
            return
        p.state = new
        p.since = now
        if new is not PeerState.S2:
            p.reconciling = False
        self.core.counters[f"peer.{old}->{new}"] += 1
        self.core.emit(StateChange(now, p.name, str(old), str(new), reason))
        if self.core.mode == "leader" and not self.core.is_leader and p.idx == self.core.leader:
            self._leading.leader_state_changed(old, new, now)
        self._update_state(now)
        self.update_membership(now)

    def _update_state(self, now: float) -> None:
        if self.core.mode == "leader" and not self.core.is_leader:
            lp = self.core.peers[self.core.leader]  # type: ignore[index]
            new = PeerState.S1 if lp.state in (PeerState.S1, PeerState.UNKNOWN) else lp.state
        else:
            states = {p.state for p in self.core.peers.values()}
            new = (PeerState.S2 if PeerState.S2 in states else
                   PeerState.S3 if PeerState.S3 in states else PeerState.S1)
        if new is not self.core.state:
            self.core.emit(StateChange(now, None, str(self.core.state), str(new)))
            self.core.state = new

    def in_ordering(self, p: PeerRecord) -> bool:
        """Whether the ordering rule waits for *p*: a member of the agreed view (all-to-all
        modes), else what the failure detector says (:meth:`locally_connected`)."""
        if self._views is not None:
            return self._views.member(p)
        return self.locally_connected(p)

    def locally_connected(self, p: PeerRecord) -> bool:
        """What this site's failure detector alone says: *p* belongs in the ordering set
        (the set an agreed view change is proposed for)."""
        if p.state is PeerState.S1:
            return True
        if p.state is PeerState.UNKNOWN:
            # a site not heard yet at start-up is presumed connected until failure
            # detection gives up on it (3 missed heartbeats), as any connected site is
            return True
        if p.state is PeerState.S2:
            return self.core.mode == "all-to-all"  # delay-delivery keeps waiting for it
        return False

    def update_membership(self, now: float) -> None:
        cfg = self.core.cfg
        if self.core.mode == "leader":
            if self.core.is_leader:
                idx = [self.core.me] + [p.idx for p in self.core.peers.values()
                                        if p.state is PeerState.S1]
            else:
                lp = self.core.peers[self.core.leader]  # type: ignore[index]
                if lp.state is PeerState.S1:
                    idx = [i for i in range(self.core.n) if self.core.leader_view >> i & 1]
                    idx += [self.core.me, self.core.leader]  # type: ignore[list-item]
                else:
                    idx = [self.core.me]
        elif self._views is not None:
            idx = list(self._views.members)
        else:
            idx = [self.core.me] + [p.idx for p in self.core.peers.values() if self.in_ordering(p)]
        members = tuple(cfg.sites[i] for i in sorted(set(idx)))
        if members != self.core.members:
            self.core.members = members
            self.core.emit(MembershipChange(now, members))
            if self.core.mode != "leader":
                self._ordering.deliverable(now)

    def view_bits(self) -> int:
        bits = 1 << self.core.me
        for p in self.core.peers.values():
            if p.state is PeerState.S1:
                bits |= 1 << p.idx
        return bits

    def send_heartbeat(self, now: float, flags: int) -> None:
        cfg = self.core.cfg
        acks = tuple(self.core.seq if i == self.core.me else self.core.streams[i].contiguous
                     for i in range(self.core.n))
        g = self.core.g_high if self.core.is_leader else self.core.next_g - 1
        core = self.core
        held = tuple(self._transport.held_from(st) for st in self.core.streams)
        hb = Heartbeat(core.inc, core.clock, core.seq, self.view_bits(), g, flags, acks,
                       self._ordering.frontier(), held,
                       tuple(st.inc for st in self.core.streams),
                       self._views.vid if self._views is not None else 0)
        self.core.emit(Send(BAND_HEARTBEAT, encode_heartbeat(core.tag, core.me, hb), "heartbeat"))
        self.core.counters["sent.heartbeat"] += 1
        self.core.last_hb = now
        self.core.acks_changed = False
        self.core.urgent_hb = False
        if not flags:
            self.core.next_hb = now + cfg.heartbeat_interval

    def on_heartbeat(self, tx: int, hb: Heartbeat, now: float) -> None:
        p = self.core.peers[tx]
        if not self._incs.incarnation(p, self.core.streams[tx], hb.inc, now):
            return
        st = self.core.streams[tx]
        self.core.clock = max(self.core.clock, hb.lamport)
        p.acks = hb.acks
        p.held_from = hb.held_from
        p.ack_incs = hb.ack_incs
        p.frontier = hb.frontier
        p.view = hb.view
        p.g = hb.g
        if self._views is not None:
            self._views.on_peer_view(tx, hb.vid, now)
        st.hb_high = max(st.hb_high, hb.high) if st.synced else hb.high
        st.hb_clock = hb.lamport
        if p.state in (PeerState.UNKNOWN, PeerState.S3) or not st.synced:
            # resume its stream where it is now: no reconciliation (long-term)
            p.last_heard = now
            self.first_contact(p, st, hb.high, now)
        else:
            self.heard(tx, now)
        if hb.high > st.known_high:
            st.known_high = hb.high
        # acknowledgements tell us what exists elsewhere (holders for repairs)
        for o, a in enumerate(hb.acks):
            if o == self.core.me:
                continue
            so = self.core.streams[o]
            if so.synced and a > so.known_high and so.inc and hb.ack_incs[o] == so.inc:
                so.known_high = a
                if self._repair.gap_nacks_enabled():
                    self._repair.want_nack(so, now, hint=True)
        if self.core.mode == "leader" and tx == self.core.leader:
            self.core.leader_view = hb.view
            self._leading.leader_seen_g(hb.g, now)
            self.update_membership(now)
        self._transport.advance(tx, st, now)
        if st.contiguous >= st.hb_high:
            st.bound = max(st.bound, hb.lamport)
        self.check_caught_up(p, now)
        if st.known_high > st.contiguous and self._repair.gap_nacks_enabled():
            self._repair.want_nack(st, now, hint=True)
        self._ordering.deliverable(now)
