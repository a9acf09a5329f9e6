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
from .peerevents import TRANSITIONS, PeerEvent
from .records import PeerRecord, Stream
from .wire import Heartbeat, encode_heartbeat


class PeerStates(SiteCore):
    """Peers' liveness and states, membership and heartbeats (a part of SiteOrdering)."""

    def _reachable(self, p: PeerRecord, now: float) -> bool:
        return (p.state is PeerState.S1 or p.state is PeerState.S2 and p.reconciling) \
            and now - p.last_heard < self.cfg.detect_after

    def _heard(self, i: int, now: float) -> None:
        """Any frame transmitted by peer *i*: a sign of life."""
        p = self.peers[i]
        p.last_heard = now
        if p.state is PeerState.S2 and not p.reconciling:
            p.reconciling = True
            self._urgent_hb = True  # tell it where we are, so it can reconcile quickly
            self.counters["reconcile.started"] += 1
            st = self.streams[i]
            # a fresh reconciliation asks the origin first (not the holder that earlier
            # retries rotated to): after a partition heals each origin's link carries its
            # own repairs, in parallel, instead of one link carrying another side's too
            st.nack_tries = 0
            st.asked_at = float("-inf")  # the next request is a first one, not a retry
            if st.known_high > st.contiguous:
                self._want_nack(st, now, immediate=True)
            self._check_caught_up(p, now)

    def _first_contact(self, p: PeerRecord, st: Stream, upto: int,
                       now: float) -> None:
        """Unknown / long-term disconnected peer heard: resume its stream at *upto*.

        A *successor* stream (the peer restarted: a new incarnation) is not resumed but
        fetched from its start, bounded by ``max_lag``: all of it is new conversation."""
        if st.successor:
            self.counters["restart.contact"] += 1
            if 0 < upto - st.contiguous <= self.cfg.max_lag:
                self.counters["restart.fetch"] += 1
                st.known_high = max(st.known_high, upto)
                upto = st.contiguous
                self._want_nack(st, now, immediate=True)
        elif p.state is PeerState.S3:
            self.counters["reconnect.long-term"] += 1
            # without transitive connectivity a site we still reach may have received what
            # this one said meanwhile: that part of the conversation was ours, fetch it
            # (peers connected to us all along, that hold the messages right after ours)
            held = max((q.acks[p.idx] for q in self.peers.values()
                        if q is not p and q.state is PeerState.S1 and q.since <= p.since
                        and self._reachable(q, now)
                        and self._holds(q, p.idx, st.contiguous + 1, st.inc)), default=0)
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
              and upto > st.contiguous):
            mark = self.shown_before.get((p.idx, st.inc))
            if self.is_leader and mark is not None and 0 < upto - mark <= self.cfg.max_lag:
                # a restarted leader: what it missed while down (since its marks) is what
                # the old run may have left unordered, and everybody's order depends on it:
                # fetched at once, ordered before the live messages that follow it
                self.counters["history.leader-fetch"] += upto - mark
                self.counters["history.shown-before"] += mark - st.contiguous
                self._skip(p.idx, st, mark, now, reason="history")
                st.known_high = max(st.known_high, upto)
                upto = st.contiguous
                self._want_nack(st, now, immediate=True)
            elif mark is None and upto - st.contiguous <= self.cfg.startup_fetch:
                # A peer heard for the first time while we are starting up, a few messages
                # into its stream: not history from before we joined but, very likely, lost
                # on the way (as when every site starts together and a first message is
                # dropped). Reconcile it like a short-term disconnect.
                self.counters["first-contact.fetch"] += 1
                st.known_high = max(st.known_high, upto)
                upto = st.contiguous
                self._want_nack(st, now, immediate=True)
            else:
                # a restart (or a late join): live traffic first; what the peer said before
                # is history, fetched in the background at a low rate and shown flagged
                # late, except what this site showed before it restarted (its marks)
                lo = max(st.contiguous, mark or 0, upto - self.cfg.max_lag) + 1
                if lo <= upto:
                    st.lt_wanted.append([lo, upto])
                    st.history.append([lo, upto])
                    self.counters["history.wanted"] += upto - lo + 1
                if mark is not None:
                    self.counters["history.shown-before"] += min(mark, upto) - st.contiguous
                self._skip(p.idx, st, upto, now, reason="history")
        self._skip(p.idx, st, upto, now, reason="long-term")
        st.synced = True
        self._urgent_hb = True
        self._peer_event(p, PeerEvent.CONTACT, now)

    def _check_caught_up(self, p: PeerRecord, now: float) -> None:
        st = self.streams[p.idx]
        if p.state is PeerState.S2 and p.reconciling and st.contiguous >= st.known_high \
                and st.contiguous >= st.hb_high:
            self.counters["reconcile.done"] += 1
            self._peer_event(p, PeerEvent.RECONCILED, now)

    def _detect_silence(self, now: float) -> None:
        """Failure detection: silent peers get SILENT / LONG_SILENCE events."""
        cfg = self.cfg
        for p in self.peers.values():
            silent = now - max(p.last_heard, self._t0)
            if p.state is PeerState.S2:
                if p.reconciling and silent >= cfg.detect_after:
                    p.reconciling = False
                    self.counters["reconcile.interrupted"] += 1
                if silent >= cfg.disconnect_interval:
                    self._peer_event(p, PeerEvent.LONG_SILENCE, now)
            elif silent >= cfg.detect_after:
                self._peer_event(p, PeerEvent.SILENT, now)

    def _detect_stalls(self, now: float) -> None:
        """Head-of-line stalls (:mod:`.stall`): a connected peer one of whose messages has
        been known to exist and missing for ``stall_timeout``, or (a site following a
        leader) an order number known and undelivered that long, or one of our messages
        the leader has not acknowledged that long, is a short-term disconnect
        (``STALLED``): heard, but not usable, so the ordering goes on without it and
        reconciles it later."""
        watch = self.stalls
        # a site following a leader watches the leader's order stream (below): it fetches
        # only what ORDER entries name, so its peers' streams keep gaps by design
        follower = self.mode == "leader" and not self.is_leader
        for p in self.peers.values():
            st = self.streams[p.idx]
            if p.state is not PeerState.S1 or follower:
                watch.reset(p.idx)
                continue
            if not st.synced:
                watch.reset(p.idx)
                continue
            if watch.missing_stalled(p.idx, st.known_high, st.contiguous, now):
                watch.reset(p.idx)
                self.counters["stall.detected"] += 1
                self._peer_event(p, PeerEvent.STALLED, now)
        if self.mode == "leader" and not self.is_leader:
            lp = self.peers[self.leader]  # type: ignore[index]
            if lp.state is not PeerState.S1 or not self._order_synced:
                watch.reset("order")
                return
            # the order stream: an order number known to exist (from an ORDER record or
            # the leader's heartbeat) and not delivered for the time-out (its entry or its
            # data does not get through, or only a little in each up window)
            known = max([self.g_high, *self._orders])
            # our own messages the leader has not acknowledged (it lacks them: our data
            # does not get through) count too; ones it holds merely wait their turn
            held = (lp.acks[self.me] if len(lp.acks) == self.n and len(lp.ack_incs) == self.n
                    and lp.ack_incs[self.me] == self.inc else 0)
            oldest = min((m.rx for m in self._awaiting_order.values()
                          if m.seq > held and m.seq not in self._local_delivered),
                         default=now)
            if (watch.missing_stalled("order", known, self.next_g - 1, now)
                    or now - oldest >= watch.timeout):
                watch.reset("order")
                self.counters["stall.detected-order"] += 1
                self._peer_event(lp, PeerEvent.STALLED, now)

    def _peer_event(self, p: PeerRecord, event: PeerEvent, now: float) -> None:
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
        self.counters[f"peer.{old}->{new}"] += 1
        self._emit(StateChange(now, p.name, str(old), str(new), reason))
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

    def _in_ordering(self, p: PeerRecord) -> bool:
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

    def _send_heartbeat(self, now: float, flags: int) -> None:
        cfg = self.cfg
        acks = tuple(self.seq if i == self.me else self.streams[i].contiguous
                     for i in range(self.n))
        g = self.g_high if self.is_leader else self.next_g - 1
        hb = Heartbeat(self.inc, self.clock, self.seq, self._view_bits(), g, flags, acks,
                       self._frontier(), tuple(self._held_from(st) for st in self.streams),
                       tuple(st.inc for st in self.streams))
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
        p.ack_incs = hb.ack_incs
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
            if so.synced and a > so.known_high and so.inc and hb.ack_incs[o] == so.inc:
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
