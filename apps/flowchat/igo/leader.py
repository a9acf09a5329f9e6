"""Leader mode: the leader numbers every message in ORDER records; sites deliver in that
order, fetch what an ORDER names, and chat locally when cut off from the leader. Sans-I/O:
imports only the standard library, flowrouter.wire and the other IGO modules."""

from __future__ import annotations

from flowrouter.wire.bands import (
    BAND_ORDER,
    BAND_REPAIR,
)

from .actions import PeerState, Send
from .core import SiteCore
from .parts import Liveness, OrderingRule, RepairRequests
from .peerevents import PeerEvent
from .records import Msg, Stream, seq_ranges
from .wire import (
    F_LATE,
    MAX_NACK_NUMBERS,
    MAX_ORDER_ENTRIES,
    MAX_RANGES,
    STREAM_ORDER,
    Nack,
    Order,
    ProtocolError,
    encode_nack,
    encode_order,
)


class LeaderOrdering:
    """Leader-based ordering; a part of SiteOrdering, holding the shared SiteCore."""

    _liveness: Liveness
    _repair: RepairRequests
    _ordering: OrderingRule

    def __init__(self, core: SiteCore) -> None:
        self.core = core
        self._assigning = False  #: leader: inside leader_assign_ready (no re-entry)
        self._order_log: dict[int, tuple[int, int, int, int]] = {}  #: leader: g -> entry
        self._order_log_first = 1
        self._order_out: list[tuple[int, int, int, int]] = []  #: leader: to multicast
        self._order_out_first = 0
        self._fetch_due: dict[tuple[int, int, int], float] = {}  #: (origin, inc, seq)
        self._fetch_tries: dict[tuple[int, int], int] = {}  #: (origin, inc) -> retries
        self._draining = False  #: inside drain_orders (no re-entry)

    def connect(self, *, liveness: Liveness, repairs: RepairRequests,
                ordering: OrderingRule) -> None:
        """The other parts this one asks (set once, by the coordinator)."""
        self._liveness = liveness
        self._repair = repairs
        self._ordering = ordering

    def leader_assign_ready(self, now: float) -> None:
        """The leader numbers each stream's next message once its causal dependencies are
        settled here (delivered, or given up as ``OrderingRule.deps_ok`` does), so an answer is
        never numbered before its question, not even when the leader fetches everybody's
        history at start-up (a restarted leader) and the answers' stream comes back
        first."""
        if self._assigning:
            return
        self._assigning = True
        try:
            while True:
                before = (len(self.core.ready), self.core.g_high)
                for st in self.core.all_streams():
                    msg = self.core.ready.get((st.origin, st.inc, st.settled + 1))
                    if msg is not None and self._ordering.deps_ok(msg, now):
                        self.core.refills.discard((msg.origin, msg.inc, msg.seq))
                        self._leader_assign(msg, now)
                # history (fetched in the background): in Lamport order, causes first
                self.core.refills &= self.core.ready.keys()
                for key in sorted(self.core.refills, key=lambda k: (self.core.ready[k].lamport, k)):
                    msg = self.core.ready.get(key)
                    if msg is not None and self._ordering.deps_ok(msg, now, late=True):
                        self.core.refills.discard(key)
                        self._leader_assign(msg, now, late=True)
                if (len(self.core.ready), self.core.g_high) == before:
                    return
        finally:
            self._assigning = False

    def _leader_assign(self, msg: Msg, now: float, late: bool = False) -> None:
        """The leader orders a message whose FIFO predecessors are all ordered (or, *late*,
        one of history fetched in the background)."""
        o = msg.origin
        flags = F_LATE if late else 0
        if o != self.core.me:
            p = self.core.peers[o]
            if p.state is not PeerState.S1:
                flags |= F_LATE
        self.core.g_high += 1
        g = self.core.g_high
        entry = (o, msg.inc, msg.seq, flags)
        self._order_log[g] = entry
        while len(self._order_log) > self.core.cfg.history_size:
            self._order_log.pop(self._order_log_first, None)
            self._order_log_first += 1
        if not self._order_out:
            self._order_out_first = g
        self._order_out.append(entry)
        self.core.counters["order.assigned"] += 1
        del self.core.ready[(o, msg.inc, msg.seq)]
        self._ordering.deliver(msg, now, late=bool(flags & F_LATE), gseq=g, local=False)

    def flush_orders(self) -> None:
        if not self._order_out:
            return
        first = self._order_out_first
        entries = self._order_out
        self._order_out = []
        for k in range(0, len(entries), MAX_ORDER_ENTRIES):
            chunk = tuple(entries[k:k + MAX_ORDER_ENTRIES])
            self.core.emit(Send(BAND_ORDER, encode_order(
                self.core.tag, self.core.me,
                Order(self.core.inc, self._liveness.view_bits(), first + k, chunk)), "order"))
            self.core.counters["sent.order"] += 1

    def answer_order_nack(self, tx: int, n: Nack, now: float) -> None:
        if not self.core.is_leader:
            return
        for lo, hi in n.ranges:
            hi = min(hi, self.core.g_high)
            if lo < self._order_log_first:
                self.core.send_gone(tx, STREAM_ORDER, self._order_log_first, self.core.inc)
                lo = self._order_log_first
            if lo > hi:
                continue
            entries = tuple(self._order_log[g] for g in range(lo, hi + 1))
            for k in range(0, len(entries), MAX_ORDER_ENTRIES):
                self.core.emit(Send(self.core.cfg.inbox_band(tx), encode_order(
                    self.core.tag, self.core.me,
                    Order(self.core.inc, self._liveness.view_bits(), lo + k,
                          entries[k:k + MAX_ORDER_ENTRIES])),
                    "order-repair"))
                self.core.counters["repair.order-sent"] += 1

    def on_order(self, tx: int, o: Order, now: float) -> None:
        if self.core.mode != "leader" or tx != self.core.leader:
            raise ProtocolError("order-not-leader", f"ORDER from site {tx}")
        if self.core.is_leader:
            return
        p = self.core.peers[tx]
        if self.core.leader_inc and o.inc < self.core.leader_inc:
            self.core.counters["order.earlier-run"] += 1  # delayed, of the leader's earlier run
            return
        if self.core.leader_inc and o.inc != self.core.leader_inc:
            self.leader_restarted(o.inc)
        self.core.leader_inc = o.inc
        self.core.leader_view = o.view
        if p.state in (PeerState.UNKNOWN, PeerState.S3):
            p.last_heard = now
            self.leader_seen_g(o.first - 1, now)
            self._liveness.peer_event(p, PeerEvent.CONTACT, now)
        else:
            self._liveness.heard(tx, now)
            self.leader_seen_g(o.first - 1, now)
        for k, entry in enumerate(o.entries):
            g = o.first + k
            if g >= self.core.next_g:
                self.core.orders[g] = entry
        last = o.first + len(o.entries) - 1
        if last > self.core.g_high:
            self.core.g_high = last
        self.drain_orders(now)
        self._liveness.update_membership(now)

    def leader_restarted(self, inc: int) -> None:
        """The leader is a new run (incarnation *inc*): its order numbers start again at 1,
        a new order stream. Follow it from its start (all of it is wanted: the new leader
        orders, from its start, what it fetched of everybody's history and whatever the
        old run left unordered); entries naming messages delivered under the old run's
        numbers are passed over (``order.already-delivered``)."""
        if inc == self.core.leader_inc:
            return
        self.core.counters["leader.restarted"] += 1
        self.core.leader_inc = inc
        self.core.orders.clear()
        self._fetch_due.clear()
        self.core.next_g = 1
        self.core.g_high = 0
        self.core.order_synced = True
        self.core.order_nack_due = None

    def _was_delivered(self, o: int, inc: int, s: int) -> bool:
        """Message *s* of stream (o, inc) was delivered here (not merely skipped)."""
        st = self.core.stream(o, inc)
        if st is None:
            return False
        if s in st.delivered:
            return True
        return s <= st.settled and not any(r[0] <= s <= r[1] for r in st.skipped)

    def leader_seen_g(self, g: int, now: float) -> None:
        """The leader has assigned up to *g* (from its heartbeat or an ORDER record)."""
        if not self.core.order_synced:
            # first contact, or back after a cut: resume at the leader's current position
            self.core.order_synced = True
            if g + 1 > self.core.next_g:
                skipped = g + 1 - self.core.next_g
                self.core.counters["order.skipped"] += skipped
                for k in [k for k in self.core.orders if k <= g]:
                    del self.core.orders[k]
                self.core.next_g = g + 1
        if g > self.core.g_high:
            self.core.g_high = g
        if self.core.g_high >= self.core.next_g and self.core.order_nack_due is None:
            self.core.order_nack_due = now + self.core.cfg.nack_delay

    def leader_state_changed(self, old: PeerState, new: PeerState,
                             now: float) -> None:
        if new in (PeerState.S2, PeerState.S3) and old in (PeerState.S1, PeerState.UNKNOWN):
            # cut off from the leader: intra-site chat; our waiting messages go out now
            for seq in sorted(self.core.awaiting_order):
                msg = self.core.awaiting_order[seq]
                if seq not in self.core.local_delivered:
                    self.deliver_local(msg, now)
            if not self.core.cfg.leader_reconcile_cut_site:
                self.core.order_synced = False
        if new is PeerState.S1 and old is PeerState.S2 and self.core.cfg.leader_reconcile_cut_site:
            self.core.order_nack_due = now

    def deliver_local(self, msg: Msg, now: float) -> None:
        if msg.seq in self.core.local_delivered:
            return
        self.core.local_delivered.add(msg.seq)
        self._ordering.deliver(msg, now, late=False, gseq=None, local=True)

    def drain_orders(self, now: float) -> None:
        if self.core.mode != "leader" or self.core.is_leader or self._draining:
            return
        self._draining = True
        try:
            self._drain_orders_loop(now)
        finally:
            self._draining = False

    def _drain_orders_loop(self, now: float) -> None:
        while self.core.next_g in self.core.orders:
            g = self.core.next_g
            o, inc, s, fl = self.core.orders[g]
            late = bool(fl & F_LATE)
            if o == self.core.me and inc != self.core.inc:
                # a message of an earlier run of ours: we keep nothing of it
                self.core.counters["order.own-earlier-run"] += 1
            elif o == self.core.me:
                # the leader orders our messages in FIFO order: any older one still waiting
                # was skipped by it (e.g. it restarted) and will never be ordered
                for old in [q for q in self.core.awaiting_order if q < s]:
                    self.deliver_local(self.core.awaiting_order.pop(old), now)
                for old in [q for q in self.core.local_delivered if q < s]:
                    self.core.local_delivered.discard(old)
                msg = self.core.awaiting_order.pop(s, None)
                if s in self.core.local_delivered:
                    self.core.local_delivered.discard(s)
                    self.core.counters["order.own-already-delivered"] += 1
                elif msg is None and self._was_delivered(o, inc, s):
                    self.core.counters["order.already-delivered"] += 1  # the leader restarted
                else:
                    msg = msg or self.core.streams[self.core.me].store.get(s)
                    if msg is None:
                        self.core.counters["order.own-unknown"] += 1
                    else:
                        self._ordering.deliver(msg, now, late=late, gseq=g, local=False)
            elif self._was_delivered(o, inc, s):
                self.core.counters["order.already-delivered"] += 1  # the leader restarted
                self.core.ready.pop((o, inc, s), None)
            else:
                st = self.core.stream(o, inc)
                msg = self.core.ready.pop((o, inc, s), None) or (
                    st.pending.get(s) or st.store.get(s) if st is not None else None)
                if msg is None:
                    self._fetch_for_order(o, inc, s, now)
                    return
                self._ordering.deliver(msg, now, late=late, gseq=g, local=False)
            del self.core.orders[g]
            self._fetch_due.pop((o, inc, s), None)
            self.core.next_g += 1
        if (self.core.orders and min(self.core.orders) > self.core.next_g
                and self.core.order_nack_due is None):
            self.core.order_nack_due = now + self.core.cfg.nack_delay

    def _fetch_for_order(self, o: int, inc: int, s: int, now: float) -> None:
        """ORDER entries name messages we lack: ask the leader (it holds everything it
        ordered), or another holder, for all of them at once (per stream, as ranges)."""
        due = self._fetch_due.get((o, inc, s))
        if due is not None and due > now:
            return
        want: dict[tuple[int, int], list[int]] = {}
        for g in sorted(self.core.orders)[:MAX_NACK_NUMBERS]:
            eo, einc, es, _ = self.core.orders[g]
            if eo == self.core.me or (eo, einc, es) in self.core.ready:
                continue
            est = self.core.stream(eo, einc)
            if est is not None and (es in est.pending or es in est.store):
                continue
            d = self._fetch_due.get((eo, einc, es))
            if d is not None and d > now:
                continue
            want.setdefault((eo, einc), []).append(es)
        for (eo, einc), seqs in want.items():
            est = self.core.stream(eo, einc) or Stream(eo, einc)
            retry = any((eo, einc, q) in self._fetch_due for q in seqs)
            tries = self._fetch_tries.get((eo, einc), -1) + 1 if retry else 0
            self._fetch_tries[(eo, einc)] = tries
            target = self._order_fetch_target(est, seqs[0], now, tries)
            if target is None:
                self.core.counters["nack.no-target"] += 1
                continue
            for q in seqs:
                self._fetch_due[(eo, einc, q)] = now + self.core.cfg.nack_retry
            self.core.emit(Send(BAND_REPAIR, encode_nack(self.core.tag, self.core.me, Nack(
                target, eo, 0, tuple(seq_ranges(seqs)[:MAX_RANGES]), einc)), "nack"))
            self.core.counters["sent.nack"] += 1

    def _order_fetch_target(self, st: Stream, first: int, now: float,
                            tries: int) -> int | None:
        """Whom to ask for a message an ORDER entry names: its origin while reachable (its
        own link carries its own repairs, so a site that missed everybody's messages is
        repaired over every link in parallel, not through the leader's link alone), then
        the leader (it holds everything it ordered), then any holder; each retry asks the
        next one."""
        cands: list[int] = []
        o = st.origin
        lp = self.core.peers[self.core.leader]  # type: ignore[index]
        if self._liveness.reachable(lp, now):
            cands.append(self.core.leader)  # type: ignore[arg-type]
        if (st is self.core.streams[o] and o in self.core.peers
                and self._liveness.reachable(self.core.peers[o], now) and o not in cands):
            cands.append(o)
        if not cands:
            other = self._repair.choose_target(st, first, now, tries)
            return other
        return cands[tries % len(cands)]

    def order_nack(self, now: float) -> None:
        self.core.order_nack_due = None
        if self.core.is_leader or self.core.leader is None:
            return
        lp = self.core.peers[self.core.leader]
        if not self._liveness.reachable(lp, now) or not self.core.order_synced:
            return
        hi = max([self.core.g_high] + list(self.core.orders))
        missing = [g for g in range(self.core.next_g, hi + 1) if g not in self.core.orders]
        if not missing:
            return
        ranges = seq_ranges(missing[:MAX_NACK_NUMBERS])[:MAX_RANGES]
        self.core.emit(Send(BAND_REPAIR, encode_nack(self.core.tag, self.core.me, Nack(
            self.core.leader, STREAM_ORDER, 0, tuple(ranges), self.core.leader_inc)), "nack"))
        self.core.counters["sent.nack-order"] += 1
        self.core.order_nack_due = now + self.core.cfg.nack_retry

    def prune_ready(self, now: float) -> None:
        """Leader mode, ordinary site: data never named by an ORDER we deliver (ordered while
        we were cut off) is dropped after ``keep_ready_for`` seconds."""
        if self.core.mode != "leader" or self.core.is_leader:
            return
        limit = now - self.core.cfg.keep_ready_for
        old = [k for k, m in self.core.ready.items() if m.rx < limit]
        for k in old:
            del self.core.ready[k]
        n = len(old)
        for st in self.core.all_streams():
            if st is self.core.streams[self.core.me] or not st.pending:
                continue
            stale = [q for q, m in st.pending.items() if m.rx < limit]
            for q in stale:
                del st.pending[q]
            n += len(stale)
        if n:
            self.core.counters["ready.pruned"] += n
        for k in [k for k, v in self._fetch_due.items() if v < limit]:
            del self._fetch_due[k]
