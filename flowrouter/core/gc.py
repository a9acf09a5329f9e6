"""GC: the clock of the router: epochs, handshake and join time-outs, orphan re-grafts, and
the soft state's timers (:mod:`flowrouter.core.softstate`).

The seed's collector (section 4.2.6: ping each (flow, link) idle for T1 epochs, drop it
after T2) walked the whole table every epoch and sent a control frame per (flow, link);
at 10^6 flows that cost seconds of CPU and 10^6 frames per epoch. Its principle stays
(endpoints keep state alive, idle state goes away) but the mechanism is now aggregated
refresh digests with hold times, driven by a timer wheel: a tick does only the work that
fell due, never a table walk. PING and PONG from older peers are counted and ignored.

May import :mod:`flowrouter.wire` and the core's shared modules (state, actions, tables,
lsroutes, tracers); never another part (calls into other parts go through ``self``,
declared in :class:`~flowrouter.core.state.RouterState`).
"""

from __future__ import annotations

from flowrouter.core.actions import Action, Close
from flowrouter.core.state import RouterState
from flowrouter.core.tracers import snapshot_fields
from flowrouter.wire import control as C


class GarbageCollection(RouterState):
    """The router's clock: epochs, time-outs, orphan retries and the soft-state timers."""

    def tick(self, now: float) -> list[Action]:
        """Advance the clock. Cost: the handshaking links, the pending joins, the orphans
        (once per refresh interval) and the soft-state timers that fell due."""
        out: list[Action] = []
        p = self.p
        self.epoch = int((now - self.started) / p.epoch_length)
        if self._tracing and self.epoch != self._snapshot_epoch:
            self._snapshot_epoch = self.epoch  # one table snapshot per epoch
            self.tracer.snapshot(now, **snapshot_fields(self))
        for lid in sorted(self._handshaking):
            lk = self.links[lid]
            if now - lk.opened_at > p.handshake_timeout:
                out += self.close_link(lid, now, "no HELLO within the handshake time-out")
                out.append(Close(lid, "handshake time-out"))
        if self._handshaking:
            out += self._repeat_hellos(now)
        if self._pending:
            out += self._join_timeouts(now)
        if self._orphans and now >= self._orphan_retry_at:
            # orphaned subtrees retry their graft (at once when routes change, and here)
            self._orphan_retry_at = now + p.refresh_interval
            out += self._retry_orphans(now)
        out += self._soft_tick(now)
        out += self._member_notices(now)
        return out

    def _join_timeouts(self, now: float) -> list[Action]:
        """Fail joins unanswered for ``join_timeout``; send the JOIN again every quarter of
        it before that (a lost JOIN or JOIN_ACK costs a retry, not the member's join; the
        upstream answers a repeated JOIN like the first)."""
        out: list[Action] = []
        limit = self.p.join_timeout
        retry = limit / 4
        for key, entry in list(self._pending.items()):
            if entry.up_req is None or self.flows.get(key) is not entry:
                del self._pending[key]
            elif now - entry.up_req_at > limit:
                del self._pending[key]
                self.counters["join.timeouts"] += 1
                out += self._join_failed(key, entry, C.JoinStatus.TIMEOUT,
                                         "no answer from the core", now)
            elif (entry.upstream is not None
                  and now - max(entry.up_req_at, entry.up_req_resent) >= retry):
                entry.up_req_resent = now
                self.counters["join.resent"] += 1
                out.append(self._control(entry.upstream, key, C.Join(entry.up_req, entry.agg)))
        return out
