"""Repairs: asking for missing messages (NACK, one named site), answering them point to
point or multicast at a bounded rate, GONE answers, and answering low-priority requests
(history, long-term reconciliation; asking for those is :mod:`.history`). Sans-I/O: imports
only the standard library, flowrouter.wire and the other IGO modules."""

from __future__ import annotations

from collections import deque

from flowrouter.wire.bands import (
    BAND_REPAIR,
)

from .actions import Send
from .core import SiteCore
from .parts import LeaderOrder, Liveness, OrderingRule, StreamTransport
from .records import Stream, TokenBucket
from .wire import (
    F_LOW,
    F_RESEND,
    MAX_NACK_NUMBERS,
    MAX_RANGES,
    STREAM_ORDER,
    Gone,
    Nack,
    encode_nack,
)


class Repairs:
    """Repair requests and answers; a part of SiteOrdering, holding the shared SiteCore."""

    _liveness: Liveness
    _transport: StreamTransport
    _ordering: OrderingRule
    _leading: LeaderOrder

    def __init__(self, core: SiteCore, now: float) -> None:
        self.core = core
        cfg = core.cfg
        #: (origin or STREAM_ORDER, incarnation, number) -> requesters
        self._repairs: dict[tuple[int, int, int], set[int]] = {}
        self._repair_due: float | None = None
        #: (origin, incarnation, seq, requester)
        self._low_repairs: deque[tuple[int, int, int, int]] = deque()
        self._repair_bucket = TokenBucket(cfg.repair_rate, cfg.repair_rate, now)
        self._repair_bytes = TokenBucket(cfg.repair_bytes, cfg.repair_bytes, now)
        #: (origin, incarnation, seq, requester) -> when it was last resent to it
        self._resent: dict[tuple[int, int, int, int], float] = {}
        self._low_bucket = TokenBucket(cfg.long_term_rate, 1.0, now)
        #: the same keys, to drop a low-priority request queued already (a retry)
        self._low_queued: set[tuple[int, int, int, int]] = set()

    def connect(self, *, liveness: Liveness, transport: StreamTransport, ordering: OrderingRule,
                leader: LeaderOrder) -> None:
        """The other parts this one asks (set once, by the coordinator)."""
        self._liveness = liveness
        self._transport = transport
        self._ordering = ordering
        self._leading = leader

    def gap_nacks_enabled(self) -> bool:
        # leader mode: ordinary sites fetch only what an ORDER entry names
        return self.core.mode != "leader" or self.core.is_leader

    def want_nack(self, st: Stream, now: float, immediate: bool = False,
                  hint: bool = False) -> None:
        cfg = self.core.cfg
        due = now if immediate else now + (cfg.hint_delay if hint else cfg.nack_delay)
        if st.nack_due is None or st.nack_due > due:
            st.nack_due = due

    def _missing(self, st: Stream, above: int = 0, limit: int = MAX_NACK_NUMBERS,
                 upto: int | None = None) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        total = 0
        high = st.known_high if upto is None else min(upto, st.known_high)
        s = max(st.contiguous, above) + 1
        while s <= high and len(out) < MAX_RANGES and total < limit:
            if s in st.pending:
                s += 1
                continue
            lo = s
            while s <= high and s not in st.pending and total + (s - lo) < limit:
                s += 1
            out.append((lo, s - 1))
            total += s - lo
        return out

    def choose_target(self, st: Stream, first: int, now: float,
                      tries: int) -> int | None:
        """Whom to ask for *st*'s message *first*: its origin while reachable (for its
        current run only: a restarted origin keeps nothing of its earlier run), else a
        reachable holder (by its acknowledgements of that very run); for a retired run no
        site may say it holds it, so any reachable site is asked in turn."""
        o = st.origin
        current = st is self.core.streams[o]
        cands = []
        if current and o in self.core.peers and self._liveness.reachable(self.core.peers[o], now):
            cands.append(o)
        holders = [p.idx for p in self.core.peers.values()
                   if p.idx != o and self._liveness.reachable(p, now)
                   and self._transport.holds(p, o, first, st.inc)]
        if not holders and not current:
            holders = [p.idx for p in self.core.peers.values()
                       if p.idx != o and self._liveness.reachable(p, now)]
        cands += sorted(holders, key=lambda i: (i != self.core.leader, i))
        if not cands:
            return None
        return cands[tries % len(cands)]

    def _tail_limit(self, st: Stream, now: float) -> int | None:
        """The highest number worth asking for now. Messages above the highest one received
        are known only from heartbeats or acknowledgements, which overtake queued data:
        while the stream's data keeps arriving they are most likely in flight (on a
        saturated link, for seconds), and asking for them again only doubles the load.
        They are asked for once the stream has been quiet for ``hint_delay``; a gap below
        a message that did arrive is asked for at once."""
        if now - st.rx_at >= self.core.cfg.hint_delay:
            return None
        return max([st.contiguous, *st.pending])

    def nacks(self, now: float) -> None:
        """Ask for missing messages. The first request names every gap; later ones name
        only seqs no request named yet, until no progress was made for ``nack_retry``
        (growing with each retry): then everything still missing is asked again, of the
        next holder. Repairs trickling in over a slow link are progress, so a long
        reconciliation is never requested twice."""
        cfg = self.core.cfg
        for st in self.core.all_streams():
            o = st.origin
            if st is self.core.streams[self.core.me] or st.nack_due is None or st.nack_due > now:
                continue
            timeout = cfg.nack_retry * (1.0 + 0.5 * min(st.nack_tries, 2))
            last = max(st.asked_at, st.progress_at)
            stale = now - last >= timeout
            ranges = self._missing(st, 0 if stale else st.asked_high,
                                   upto=self._tail_limit(st, now))
            if not ranges:
                st.nack_due = (last + timeout if st.known_high > st.contiguous else None)
                if st.nack_due is None:
                    st.nack_tries = 0
                continue
            if stale and st.asked_at > float("-inf"):
                st.nack_tries += 1
                self.core.counters["nack.retry"] += 1
            target = self.choose_target(st, ranges[0][0], now, st.nack_tries)
            if target is None:
                self.core.counters["nack.no-target"] += 1
                st.nack_due = now + cfg.nack_retry
                continue
            while True:
                ask, ranges = ranges, []
                if target != o and self._transport.holds(self.core.peers[target], o,
                                                          ask[0][0], st.inc):
                    # a holder is asked only for what it acknowledged: it answers nothing
                    # beyond, and its partial answer is progress that put off asking for
                    # the rest for a whole retry time-out (a flapping link's up window
                    # lost); the rest is asked of the next candidate (the origin) now
                    ask, ranges = _split(ask, self.core.peers[target].acks[o])
                self.core.emit(Send(BAND_REPAIR, encode_nack(self.core.tag, self.core.me,
                                                             Nack(target, o, 0, tuple(ask),
                                                                  st.inc)),
                                    "nack"))
                self.core.counters["sent.nack"] += 1
                st.asked_high = max(st.asked_high, ask[-1][1])
                nxt = self.choose_target(st, ranges[0][0], now, st.nack_tries) if ranges \
                    else None
                if nxt is None:
                    break
                target = nxt
            if stale:
                st.asked_at = now
            st.nack_due = now + timeout
        if self.core.order_nack_due is not None and self.core.order_nack_due <= now:
            self._leading.order_nack(now)

    def on_nack(self, tx: int, n: Nack, now: float) -> None:
        if n.target != self.core.me:
            self.core.counters["nack.overheard"] += 1
            return
        if n.stream == STREAM_ORDER:
            self._leading.answer_order_nack(tx, n, now)
            return
        o = n.stream
        found = self.core.stream(o, n.inc)
        if found is None:
            # a run we do not hold: an earlier run of ours (the restart lost it: the
            # requester must skip what it asked), or a run of another origin unknown here
            # (the requester asks another holder)
            self.core.counters["repair.unknown-incarnation"] += 1
            low = max(hi for _, hi in n.ranges) + 1 if o == self.core.me else 1
            self.core.send_gone(tx, o, low, n.inc)
            return
        st = found
        high = self.core.seq if st is self.core.streams[self.core.me] else st.contiguous
        low_priority = bool(n.flags & F_LOW)
        floor = st.store_order[0] if st.store_order else high + 1
        if not low_priority:
            floor = max(floor, high - self.core.cfg.max_lag + 1)
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
                    key = (o, st.inc, s, tx)
                    if key in self._low_queued:
                        self.core.counters["repair.low-deduplicated"] += 1
                    elif len(self._low_repairs) < self.core.cfg.max_lag:
                        self._low_repairs.append(key)
                        self._low_queued.add(key)
                else:
                    self._repairs.setdefault((o, st.inc, s), set()).add(tx)
                queued += 1
        if gone:
            low = max(floor, 1)
            # everything we cannot give below `low`: the requester must skip it
            self.core.counters["repair.gone"] += 1
            self.core.send_gone(tx, o, low, st.inc)
        if queued and self._repair_due is None:
            self._repair_due = now + self.core.cfg.repair_coalesce
        self.core.counters["repair.requested"] += queued

    def serve_repairs(self, now: float) -> None:
        cfg = self.core.cfg
        if self._repairs and self._repair_due is not None and now >= self._repair_due:
            self._forget_resent(now)
            for key in sorted(self._repairs):
                o, inc, s = key
                st = self.core.stream(o, inc)
                msg = st.store.get(s) if st is not None else None
                if msg is None:
                    del self._repairs[key]
                    continue
                # deduplicated: not again to a site it went to a moment ago (in flight)
                who = {r for r in self._repairs[key]
                       if now - self._resent.get((o, inc, s, r), float("-inf"))
                       >= cfg.repair_dedup}
                if not who:
                    del self._repairs[key]
                    self.core.counters["repair.deduplicated"] += 1
                    continue
                if not (self._repair_bucket.take(now)
                        and self._repair_bytes.take(now, len(msg.payload))):
                    self.core.counters["repair.paced"] += 1
                    break
                del self._repairs[key]
                for r in who:
                    self._resent[(o, inc, s, r)] = now
                band = cfg.inbox_band(next(iter(who))) if len(who) == 1 else cfg.data_band
                self.core.emit(Send(band, self.core.encode_msg(msg, F_RESEND),
                                    "repair" if len(who) == 1 else "repair-multicast"))
                self.core.counters["repair.sent"] += 1
            self._repair_due = now if self._repairs else None
        if not self._repairs:
            while self._low_repairs and self._low_bucket.take(now):
                low = self._low_repairs.popleft()
                self._low_queued.discard(low)
                o, inc, s, requester = low
                st = self.core.stream(o, inc)
                msg = st.store.get(s) if st is not None else None
                if msg is not None:
                    self.core.emit(Send(cfg.inbox_band(requester),
                                        self.core.encode_msg(msg, F_RESEND | F_LOW),
                                        "repair-low"))
                    self.core.counters["repair.low-sent"] += 1

    def _forget_resent(self, now: float) -> None:
        if len(self._resent) > 4 * self.core.cfg.max_lag:
            horizon = now - self.core.cfg.repair_dedup
            self._resent = {k: t for k, t in self._resent.items() if t >= horizon}

    def on_gone(self, tx: int, g: Gone, now: float) -> None:
        if g.requester != self.core.me:
            return
        if g.stream == STREAM_ORDER:
            if g.inc != self.core.leader_inc:  # about another run of the leader's numbering
                self.core.counters["order.gone-other-run"] += 1
                return
            if self.core.next_g < g.low:
                self.core.counters["order.gone"] += g.low - self.core.next_g
                for k in [k for k in self.core.orders if k < g.low]:
                    del self.core.orders[k]
                self.core.next_g = g.low
                self._leading.drain_orders(now)
            return
        found = self.core.stream(g.stream, g.inc)
        self.core.counters["repair.gone-received"] += 1
        if found is None:
            self.core.counters["repair.gone-unknown-incarnation"] += 1
            return
        st = found
        retired = st is not self.core.streams[g.stream]
        if tx != g.stream:
            # a holder that no longer has them: ask someone else (the origin decides gaps)
            self.core.counters["repair.gone-holder"] += 1
            st.nack_tries += 1
            st.asked_at = float("-inf")
            st.nack_due = now
            return
        if g.low - 1 > st.contiguous:
            # from the origin about its earlier run: its restart lost these (declared lost)
            self._transport.skip(g.stream, st, g.low - 1, now,
                                 reason="restart-lost" if retired else "gone")
        st.stop_low_fetch(g.low)  # a low-priority fetch it cannot serve: stop asking
        self._ordering.deliverable(now)



def _split(ranges: list[tuple[int, int]], upto: int
           ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """*ranges* (ascending) as the part up to *upto* and the part above it."""
    low = [(lo, min(hi, upto)) for lo, hi in ranges if lo <= upto]
    high = [(max(lo, upto + 1), hi) for lo, hi in ranges if hi > upto]
    return low, high
