"""All-to-all ordering (delay and hasten modes): Lamport order over the ordering set,
causal dependencies, late delivery, and delivery. Sans-I/O: imports only the standard
library, flowrouter.wire and the other IGO modules.

**Late messages in one order per partition.** In hasten mode a message whose key
``(lamport, origin)`` is below the last one delivered in order is *late* (it was reconciled
after a disconnect). Late messages are not delivered as they trickle in (repairs reach the
sites of a partition at different times, so each would show its own interleaving): they wait
in a second heap, in key order, and the head is released once no message with a smaller
key can still come from any site that is connected or disconnected for the short term
(S1/S2): each such site's stream bound is past the key, exactly the all-to-all rule applied
to the sites whose messages may still arrive late. So every site of a partition delivers the
late messages it shares in the same order, ``(lamport, origin)``, and causal order still
holds (dependencies are checked as for any message). A site that goes to S3 leaves the rule
(its stream resumes without reconciliation)."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import replace

from .actions import Deliver, Delivery, PeerState
from .core import SiteCore
from .parts import (
    LeaderOrder,
    Liveness,
    RepairRequests,
    StabilityRule,
    StreamTransport,
    ViewMembership,
)
from .records import Msg, Stream, TokenBucket
from .viewsync import IN_ORDER, LATE, UNVIEWED, WAIT


class LamportOrdering:
    """Lamport order, causal order and delivery; a part of SiteOrdering, holding the shared
    SiteCore."""

    _liveness: Liveness
    _transport: StreamTransport
    _repair: RepairRequests
    _leading: LeaderOrder
    _stability: StabilityRule

    def __init__(self, core: SiteCore, now: float) -> None:
        self.core = core
        self._last_key: tuple[int, int] = (-1, -1)  #: last delivered (lamport, origin)
        self._views: ViewMembership | None = None
        #: (origin, incarnation, seq) -> since when it waits for a dependency
        self._dep_wait: dict[tuple[int, int, int], float] = {}
        #: deliveries waiting for the display pace (``display_rate``)
        self._display: deque[Delivery] = deque()
        self._display_bucket = (TokenBucket(core.cfg.display_rate, core.cfg.display_burst, now)
                                if core.cfg.display_rate else None)

    def connect(self, *, liveness: Liveness, transport: StreamTransport, repairs: RepairRequests,
                leader: LeaderOrder, stability: StabilityRule) -> None:
        """The other parts this one asks (set once, by the coordinator)."""
        self._liveness = liveness
        self._transport = transport
        self._repair = repairs
        self._leading = leader
        self._stability = stability

    def attach_views(self, views: ViewMembership) -> None:
        """Agreed views decide which messages are in order (all-to-all modes: sent in the
        view this site is in) and which are late (see viewsync.py)."""
        self._views = views if views.enabled else None

    def accept(self, msg: Msg, now: float, refill: bool = False) -> None:
        """A message whose FIFO predecessors are all in: hand it to the ordering rule."""
        key = (msg.origin, msg.inc, msg.seq)
        if self.core.mode == "leader":
            if self.core.is_leader:
                self.core.ready[key] = msg
                if refill:  # history fetched after a restart or a long-term disconnect:
                    self.core.refills.add(key)  # ordered flagged late, causes first
                self._leading.leader_assign_ready(now)
            elif msg.origin == self.core.me:
                self.core.awaiting_order[msg.seq] = msg
                lp = self.core.peers[self.core.leader]  # type: ignore[index]
                if lp.state in (PeerState.S2, PeerState.S3):
                    self._leading.deliver_local(msg, now)
            else:
                self.core.ready[key] = msg
            return
        self.core.ready[key] = msg
        entry = (msg.lamport, msg.origin, msg.inc, msg.seq)
        # history fetched in the background has a queue of its own: shown late, in
        # Lamport order, causes first, never holding live messages (nor reconciled ones)
        heapq.heappush(self.core.history_heap if refill else self.core.heap, entry)

    def _lamport_ok(self, t: int, o: int) -> bool:
        for p in self.core.peers.values():
            i = p.idx
            if i == o or not self._liveness.in_ordering(p):
                continue
            b = self.core.streams[i].bound
            if b > t or (b == t and i > o):
                continue
            return False
        clock = self.core.clock
        return not (o != self.core.me and not (clock > t or clock == t and self.core.me > o))

    def release_display(self, now: float) -> None:
        """Deliveries held for the display pace (``display_rate``) that may go now."""
        bucket = self._display_bucket
        if bucket is not None:
            while self._display and bucket.take(now):
                d = self._display.popleft()
                self.core.emit(Deliver(replace(d, delivery_time=now)))

    def frontier(self) -> tuple[int, int]:
        """The smallest (lamport, origin) key a message from our ordering set may still
        have: everything below it that the ordering set sent is here."""
        best = (self.core.clock, self.core.me)
        for p in self.core.peers.values():
            if self._liveness.in_ordering(p):
                k = (self.core.streams[p.idx].bound, p.idx)
                if k < best:
                    best = k
        return best

    def deps_ok(self, msg: Msg, now: float, late: bool = False) -> bool:
        """Every causal dependency of *msg* is settled here (delivered or skipped).

        History a restarted site fetches in the background (:attr:`Stream.history`) counts
        as skipped for live messages (live traffic is not held back by history: it is shown
        first, the history after it, flagged late), but a *late* message waits for its
        causes among the history for as long as the history keeps coming.

        A dependency names a stream, ``(origin, incarnation)``, and a sequence number in it;
        it is looked up in that stream only (current or retired, see incarnations.py), so
        one on a peer's earlier run never waits for, or skips, its new run's numbers.

        * One still missing is asked for; after ``dependency_timeout`` it is skipped
          (bounded latency beats a dependency nobody can give us). Each missing dependency
          is looked at, not only the first: skipping one and passing the others would show
          them later, after the message that answers them.
        * One this site holds but has not delivered yet (waiting in order or among the late
          messages) is never passed: it goes first, whatever the time-out. (A held message
          with a larger Lamport time than *msg* cannot be its cause: not waited for.)
        * One on a run of the origin this site does not track: an earlier run (forgotten, or
          before we knew the site) is met (``dependency.forgotten``); a newer run not heard
          of yet is waited for, then given up (``dependency.lost``) after the time-out.
        * Our own messages' dependencies were settled when we sent them."""
        if msg.origin == self.core.me:
            return True
        key = (msg.origin, msg.inc, msg.seq)
        ok = True
        forgotten = lost = 0
        for o, inc, s in msg.deps:
            if o == msg.origin and inc == msg.inc or o == self.core.me and inc == self.core.inc:
                continue
            st = self.core.stream(o, inc)
            waited = now - self._dep_wait.setdefault(key, now)
            timed_out = waited >= self.core.cfg.dependency_timeout
            if st is None:
                if inc < (self.core.inc if o == self.core.me else self.core.streams[o].inc):
                    forgotten += 1
                elif timed_out:
                    lost += 1
                else:
                    ok = False
                continue
            if s <= st.settled:
                if late and st.awaiting_history(s) and (
                        st.lt_wanted or st.lt_asked
                        or now - st.rx_at < self.core.cfg.disconnect_interval):
                    ok = False  # history fetched in the background: its causes first
                continue
            if s > st.contiguous and timed_out:
                self.core.counters["dependency.skipped"] += 1
                self._transport.skip(o, st, s, now, reason="dependency")
                if s <= st.settled:
                    continue
            if s <= st.contiguous:
                # the first of the stream's messages not settled here (FIFO: the rest
                # follow it)
                held = self.core.ready.get((o, st.inc, st.settled + 1))
                if held is not None and held.lamport >= msg.lamport:
                    continue  # not what the sender had delivered (see above)
                if held is None and timed_out:
                    continue  # nothing left to wait for
                ok = False
                continue
            if s > st.known_high:
                st.known_high = s
            self._repair.want_nack(st, now, hint=True)
            ok = False
        if ok:
            self._dep_wait.pop(key, None)
            if forgotten:
                self.core.counters["dependency.forgotten"] += forgotten
            if lost:
                self.core.counters["dependency.lost"] += lost
        else:
            self.core.counters["dependency.waits"] += 1
        return ok

    def deliverable(self, now: float) -> None:
        if self.core.mode == "leader":
            if self.core.is_leader and self.core.ready:
                self._leading.leader_assign_ready(now)  # dependency time-outs
            return
        heap = self.core.heap
        stability = self.core.cfg.stability
        views = self._views
        while heap:
            t, o, inc, s = heap[0]
            msg = self.core.ready.get((o, inc, s))
            if msg is None:  # dropped (an incarnation forgotten)
                heapq.heappop(heap)
                continue
            cls = views.classify(msg) if views is not None else UNVIEWED
            if cls == WAIT:
                break  # sent in a view this site is about to install
            if views is not None and cls == IN_ORDER and (
                    self.core.late_waiting[o] or self._after_late(msg)):
                # in order in the view, but after late messages it must follow (FIFO,
                # causal order): every member of the view holds it back alike, until those
                # are shown (late), instead of some showing it late and others not
                self._deliver_late(now)
                if self.core.late_waiting[o] or self._after_late(msg):
                    break
            if (cls == LATE or (t, o) < self._last_key or self.core.late_waiting[o]
                    or self._after_late(msg)):
                # late, or after a late message it must follow (FIFO, causal order):
                # released in key order by _deliver_late
                heapq.heappop(heap)
                heapq.heappush(self.core.late_heap, (t, o, inc, s))
                self.core.late_waiting[o] += 1
                continue
            if not self._lamport_ok(t, o):
                break
            if stability and not self._stability.stable(msg, now):
                break
            ok = self.deps_ok(msg, now)
            if heap[0] != (t, o, inc, s):
                # skipping a timed-out dependency let messages buffered beyond it into the
                # heap, some with smaller keys: they come first (popping now would take one
                # of them out unseen, never to be delivered)
                continue
            if not ok:
                break
            heapq.heappop(heap)
            del self.core.ready[(o, inc, s)]
            self._last_key = (t, o)
            self.deliver(msg, now, late=False, gseq=None, local=False)
        if views is not None and views.try_install(now):
            return  # installing delivered what the new view allows (and the late ones)
        self._deliver_late(now)
        self._deliver_history(now)

    def _deliver_history(self, now: float) -> None:
        heap = self.core.history_heap
        while heap:
            t, o, inc, s = heap[0]
            msg = self.core.ready.get((o, inc, s))
            if msg is None:
                heapq.heappop(heap)
                continue
            if not self.deps_ok(msg, now, late=True):
                break
            heapq.heappop(heap)
            del self.core.ready[(o, inc, s)]
            self.deliver(msg, now, late=True, gseq=None, local=False)

    def _after_late(self, msg: Msg) -> bool:
        """*msg* depends on a message we hold that waits among the late ones."""
        for o, inc, s in msg.deps:
            if o == msg.origin or o == self.core.me or not self.core.late_waiting[o]:
                continue
            st = self.core.stream(o, inc)
            if st is not None and st.settled < s <= st.contiguous:
                return True
        return False

    def _late_ok(self, t: int, o: int) -> bool:
        """No late message below key (t, o) can still arrive from a site in S1 or S2."""
        for p in self.core.peers.values():
            i = p.idx
            if i == o or p.state not in (PeerState.S1, PeerState.S2):
                continue
            b = self.core.streams[i].bound
            if not (b > t or (b == t and i > o)):
                return False
        return True

    def _deliver_late(self, now: float) -> None:
        heap = self.core.late_heap
        while heap:
            t, o, inc, s = heap[0]
            msg = self.core.ready.get((o, inc, s))
            if msg is None:  # dropped (an incarnation forgotten)
                heapq.heappop(heap)
                continue
            if not self._late_ok(t, o) or not self.deps_ok(msg, now, late=True):
                break
            heapq.heappop(heap)
            self.core.late_waiting[o] -= 1
            del self.core.ready[(o, inc, s)]
            self.deliver(msg, now, late=True, gseq=None, local=False)

    def deliver(self, msg: Msg, now: float, *, late: bool, gseq: int | None,
                local: bool) -> None:
        st = self.core.stream(msg.origin, msg.inc)
        if st is not None and msg.seq > st.settled:
            st.delivered.add(msg.seq)
            self.settle(st)
        self.core.deliveries += 1
        self.core.acks_changed = True
        self.core.counters["delivered"] += 1
        if late:
            self.core.counters["delivered.late"] += 1
        if local:
            self.core.counters["delivered.local"] += 1
        d = Delivery(self.core.site, self.core.cfg.sites[msg.origin], msg.seq, msg.lamport, gseq,
                     msg.send_time, now, late, local, msg.payload, msg.inc,
                     self._views.vid if self._views is not None else 0)
        if self._display_bucket is not None:
            self._display.append(d)
        else:
            self.core.emit(Deliver(d))

    def settle(self, st: Stream) -> None:
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
