"""Reliable FIFO transport per origin site: sequence numbers, the gap buffer, history
kept for repairs, skipped ranges (gaps). Sans-I/O: imports only the standard library,
flowrouter.wire and the other IGO modules."""

from __future__ import annotations

from .actions import Conflict, PeerState
from .core import SiteCore
from .parts import IncarnationTracking, Liveness, OrderingRule, RepairRequests
from .records import Msg, PeerRecord, Stream
from .wire import F_LOW, F_RESEND, DataMsg


class FifoTransport:
    """Per-origin FIFO streams; a part of SiteOrdering, holding the shared SiteCore."""

    _liveness: Liveness
    _incs: IncarnationTracking
    _repair: RepairRequests
    _ordering: OrderingRule

    def __init__(self, core: SiteCore) -> None:
        self.core = core

    def connect(self, *, liveness: Liveness, incarnations: IncarnationTracking,
                repairs: RepairRequests, ordering: OrderingRule) -> None:
        """The other parts this one asks (set once, by the coordinator)."""
        self._liveness = liveness
        self._incs = incarnations
        self._repair = repairs
        self._ordering = ordering

    def keep(self, st: Stream, msg: Msg) -> None:
        if msg.seq in st.store:
            return
        st.store[msg.seq] = msg
        st.store_order.append(msg.seq)
        while len(st.store_order) > self.core.cfg.history_size:
            st.store.pop(st.store_order.popleft(), None)

    @staticmethod
    def held_from(st: Stream) -> int:
        low = st.store_order[0] if st.store_order else st.contiguous + 1
        if st.skipped:
            low = max(low, max(r[1] for r in st.skipped) + 1)
        return low

    def holds(self, p: PeerRecord, o: int, first: int, inc: int) -> bool:
        """Peer *p* said it can resend message *first* of origin *o*'s incarnation *inc*."""
        return (len(p.acks) == self.core.n and len(p.held_from) == self.core.n
                and len(p.ack_incs) == self.core.n and p.ack_incs[o] == inc
                and p.held_from[o] <= first <= p.acks[o])

    def on_data(self, tx: int, d: DataMsg, now: float) -> None:
        o = d.origin
        if o == self.core.me and (d.inc == self.core.inc or tx == o
                                  or self.core.stream(o, d.inc) is None):
            # our own message returned, or one of an earlier run of ours (we keep nothing of
            # it: what we said before the restart is history to us, but for the tail we had
            # not shown, fetched in the background, see history.py)
            self.core.counters["data.own-returned" if d.inc == self.core.inc
                               else "data.own-earlier-run"] += 1
            self.own_conflict(tx, d, now)
            if tx != self.core.me:
                self._liveness.heard(tx, now)
            return
        st = self.core.streams[o]
        if tx == o and d.inc >= st.inc:
            p = self.core.peers[o]
            self._incs.incarnation(p, st, d.inc, now)  # a newer run: a new stream (restart)
            st = self.core.streams[o]
            if p.state in (PeerState.UNKNOWN, PeerState.S3) or not st.synced:
                p.last_heard = now
                self._liveness.first_contact(p, st, d.seq - 1, now)
            else:
                if d.seq > st.known_high:
                    st.known_high = d.seq
                self._liveness.heard(tx, now)
        else:
            if tx != o:
                self._liveness.heard(tx, now)
            found = self.core.stream(o, d.inc)
            if found is None and not st.synced and tx != o:
                if self.core.mode == "leader" and not self.core.is_leader:
                    # fetched for an ORDER entry: no stream position needed
                    fetched = Msg(o, d.inc, d.seq, d.lamport, d.send_time, tuple(d.deps),
                                  d.payload, now, d.sig, d.view)
                    self._check_conflict(self.core.ready.setdefault((o, d.inc, d.seq), fetched),
                                         fetched, tx, now)
                    self.core.counters["data.fetched-unsynced"] += 1
                    return
                # first we hear of this origin is through another site: start its stream
                # here (like a first contact), so dependencies on it can be met
                self.core.counters["data.relay-sync"] += 1
                st.inc = d.inc
                self.skip(o, st, d.seq - 1, now, reason="first-contact")
                st.synced = True
                found = st
            if found is None:
                # a run of the origin we do not track: an earlier one forgotten (or never
                # known), or a newer one not heard from the origin itself yet (its stream
                # starts when it is: fetched from 1 then)
                self.core.counters["data.unknown-incarnation"] += 1
                return
            if found is not st:
                self.core.counters["data.earlier-run"] += 1
            st = found
        self.core.clock = max(self.core.clock, d.lamport + 1)
        msg = Msg(o, d.inc, d.seq, d.lamport, d.send_time, tuple(d.deps), d.payload, now,
                  d.sig, d.view)
        if d.flags & F_RESEND:
            self.core.counters["received.resent"] += 1
        st.rx_at = now
        if d.seq <= st.contiguous:
            if self.core.mode == "leader" and not self.core.is_leader:
                # an ORDER entry may name a message our stream skipped: keep it for the drain
                held: Msg | None = self.core.ready.get((o, d.inc, d.seq)) or st.store.get(d.seq)
                if (o, d.inc, d.seq) not in self.core.ready:
                    self.core.ready[(o, d.inc, d.seq)] = held or msg
                    self.core.counters["data.kept-for-order"] += 1
                self._check_conflict(held, msg, tx, now)
                return
            if (self.core.cfg.long_term_reconcile or d.flags & F_LOW) and self._unskip(st, d.seq):
                # long-term reconciliation or background history filling a gap (flagged
                # late; the only deliveries that may follow messages that depend on them)
                self.core.counters["long-term.fetched"] += 1
                st.lt_rx_at = now
                self.keep(st, msg)
                self._ordering.accept(msg, now, refill=True)
            elif any(r[0] <= d.seq <= r[1] for r in st.skipped):
                self.core.counters["data.after-skip"] += 1
            else:
                self.core.counters["data.duplicate"] += 1
                self._check_conflict(st.store.get(d.seq), msg, tx, now)
            return
        if d.seq in st.pending:
            self.core.counters["data.duplicate"] += 1
            self._check_conflict(st.pending[d.seq], msg, tx, now)
            return
        st.pending[d.seq] = msg
        if d.seq > st.known_high:
            st.known_high = d.seq
        self.advance(o, st, now)
        if st.known_high > st.contiguous and self._repair.gap_nacks_enabled():
            self._repair.want_nack(st, now)
        if o in self.core.peers and st is self.core.streams[o]:
            self._liveness.check_caught_up(self.core.peers[o], now)
        self._ordering.deliverable(now)

    def own_conflict(self, tx: int, d: DataMsg, now: float) -> None:
        """A frame carrying a message of our own run: other words under our name (a
        forgery that reached us too) are a conflict to report."""
        if d.origin == self.core.me and d.inc == self.core.inc:
            self._check_conflict(self.core.streams[self.core.me].store.get(d.seq),
                                 Msg(d.origin, d.inc, d.seq, d.lamport, d.send_time,
                                     tuple(d.deps), d.payload, self.core.now, b"", d.view),
                                 tx, now)

    def _check_conflict(self, held: Msg | None, msg: Msg, tx: int, now: float) -> None:
        """A second frame for a message already held: the same content is a duplicate (a
        resend), other content a conflict, reported and never swapped in silently."""
        if held is None or held is msg or held.same_content(msg):
            return
        self.core.counters["conflict.data"] += 1
        self.core.emit(Conflict(now, self.core.cfg.sites[msg.origin], msg.inc, msg.seq,
                                self.core.cfg.sites[tx], held.payload, msg.payload))

    def advance(self, o: int, st: Stream, now: float) -> None:
        """Move contiguous messages out of the gap buffer into ordering."""
        moved = False
        while st.contiguous + 1 in st.pending:
            msg = st.pending.pop(st.contiguous + 1)
            st.contiguous += 1
            st.bound = max(st.bound, msg.lamport + 1)
            self.keep(st, msg)
            self._ordering.accept(msg, now)
            moved = True
        if st.contiguous >= st.hb_high:
            st.bound = max(st.bound, st.hb_clock)
        if moved:
            self.core.acks_changed = True
            st.progress_at = now
            if st.contiguous >= st.known_high:
                st.nack_due = None
                st.nack_tries = 0

    def skip(self, o: int, st: Stream, upto: int, now: float, *,
             reason: str) -> None:
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
            self.keep(st, msg)
            self._ordering.accept(msg, now)
            prev = s
        if upto > prev:
            self._add_skip(st, prev + 1, upto)
            skipped += upto - prev
        st.contiguous = max(st.contiguous, upto)
        st.known_high = max(st.known_high, upto)
        if skipped:
            self.core.counters[f"skipped.{reason}"] += skipped
        self._ordering.settle(st)
        self.advance(o, st, now)
        self.core.acks_changed = True

    def _add_skip(self, st: Stream, lo: int, hi: int) -> None:
        st.skipped.append([lo, hi])
        if self.core.cfg.long_term_reconcile:
            st.lt_wanted.append([lo, hi])

    def _unskip(self, st: Stream, seq: int) -> bool:
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
