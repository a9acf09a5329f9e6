"""Incarnations: a site's stream is ``(origin, incarnation)``. When a frame of a newer run of
a peer arrives (it restarted: sequence numbers and Lamport clock begin again), the stream of
the earlier run is *retired*, not thrown away, and the new run gets a stream of its own.
Sans-I/O: imports only the standard library, flowrouter.wire and the other IGO modules.

What happens to a retired stream (counters in brackets):

* the messages of it this site holds are still ordered and delivered, exactly once, in its
  FIFO order (``incarnation.retired``);
* what it lacks (a gap before messages buffered beyond it, or numbers the old run's heartbeat
  or acknowledgements announced) is asked of *holders*, the other sites (never its origin,
  whose new run keeps nothing of the old one and answers GONE); after
  ``dependency_timeout`` since retirement whatever is still missing is **declared lost**:
  skipped and counted (``skipped.restart-lost``), so messages buffered beyond it and messages
  depending on it are not held for ever;
* dependencies name ``(origin, incarnation, seq)``, so a dependency on the old run waits for
  (or times out within) the old stream only: it can never skip a message of the new run,
  and a dependency on the new run is never met by the old run's numbers;
* at most ``RETIRED_KEPT`` earlier runs are kept per origin; an older one is *forgotten*
  (``incarnation.forgotten``; its undelivered messages, normally none, are counted under
  ``incarnation.forgotten-undelivered``) and dependencies on it count as met.

A frame of an *older* run than the current one (delayed in the network) never restarts
anything: DATA goes to its retired stream if kept (``data.earlier-run``), anything else is
counted (``stale-incarnation``) and ignored. The new run's stream starts at 1 and is fetched
from its beginning (bounded by ``max_lag``), like a short-term reconnect: a restart is a new
stream, not a long-term reconnect of the old one, so nothing of the new run is skipped.

Leader mode: a restarted *leader* begins a new order stream too (its order numbers start
again at 1). Sites follow it from 1 instead of resuming at its current number, and pass
over entries naming messages they delivered under the old run's numbers (the new leader
orders the history it fetched at start-up again), so nothing is shown twice and nothing the
old run left unordered is lost."""

from __future__ import annotations

import heapq

from .core import RETIRED_KEPT, SiteCore
from .parts import LeaderOrder, Liveness, OrderingRule, RepairRequests, StreamTransport
from .peerevents import PeerEvent
from .records import PeerRecord, Stream


class Incarnations:
    """Restarts of peers: retiring, expiring and forgetting streams; a part of SiteOrdering,
    holding the shared SiteCore."""

    _liveness: Liveness
    _transport: StreamTransport
    _repair: RepairRequests
    _ordering: OrderingRule
    _leading: LeaderOrder

    def __init__(self, core: SiteCore) -> None:
        self.core = core

    def connect(self, *, liveness: Liveness, transport: StreamTransport, repairs: RepairRequests,
                ordering: OrderingRule, leader: LeaderOrder) -> None:
        """The other parts this one asks (set once, by the coordinator)."""
        self._liveness = liveness
        self._transport = transport
        self._repair = repairs
        self._ordering = ordering
        self._leading = leader

    def incarnation(self, p: PeerRecord, st: Stream, inc: int, now: float) -> bool:
        """A frame of peer *p* itself names its incarnation *inc*: True if it belongs to its
        current stream (a newer incarnation becomes the current stream: a restart)."""
        if st.inc == inc:
            return True
        if st.inc == 0:
            st.inc = inc
            p.inc = inc
            return True
        if inc < st.inc:
            self.core.counters["stale-incarnation"] += 1
            return False
        self.core.counters["peer.restarted"] += 1
        self._retire(st, now)
        new = Stream(p.idx, inc)
        new.successor = True
        self.core.streams[p.idx] = new
        p.inc = inc
        # acknowledgement vectors the peer sent in its earlier run no longer describe it
        p.acks = p.held_from = p.ack_incs = ()
        self._liveness.peer_event(p, PeerEvent.RESTARTED, now)
        if self.core.mode == "leader" and p.idx == self.core.leader and not self.core.is_leader:
            self._leading.leader_restarted(inc)  # after RESTARTED: being cut off resets the order
        return True

    def _retire(self, st: Stream, now: float) -> None:
        st.retired_at = now
        self.core.counters["incarnation.retired"] += 1
        olds = self.core.retired.setdefault(st.origin, [])
        olds.append(st)
        while len(olds) > RETIRED_KEPT:
            self._forget(olds.pop(0))
        if st.known_high > st.contiguous:
            self._repair.want_nack(st, now, immediate=True)

    def _forget(self, st: Stream) -> None:
        o, inc = st.origin, st.inc
        self.core.counters["incarnation.forgotten"] += 1
        gone = [k for k in self.core.ready if k[0] == o and k[1] == inc]
        for k in gone:
            del self.core.ready[k]
        if gone:
            self.core.counters["incarnation.forgotten-undelivered"] += len(gone)
            late = [e for e in self.core.late_heap if e[1] == o and e[2] == inc]
            self.core.late_waiting[o] -= len(late)
            if self.core.late_waiting[o] <= 0:
                self.core.late_waiting.pop(o, None)
            self.core.heap = [e for e in self.core.heap if not (e[1] == o and e[2] == inc)]
            heapq.heapify(self.core.heap)
            self.core.late_heap = [e for e in self.core.late_heap
                                   if not (e[1] == o and e[2] == inc)]
            heapq.heapify(self.core.late_heap)

    def expire_retired(self, now: float) -> None:
        """Retired streams: what is still missing ``dependency_timeout`` after retirement
        is declared lost (skipped, counted), which releases what waits behind it."""
        limit = self.core.cfg.dependency_timeout
        changed = False
        for olds in self.core.retired.values():
            for st in olds:
                if st.retired_at is None or now - st.retired_at < limit:
                    continue
                if st.known_high > st.contiguous:
                    self._transport.skip(st.origin, st, st.known_high, now, reason="restart-lost")
                    changed = True
                st.nack_due = None
                st.stop_low_fetch()
        if changed:
            self._ordering.deliverable(now)
