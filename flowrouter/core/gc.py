"""GC: the clock of the router: epochs, the incremental epoch GC, join and handshake
time-outs.

Seed 002 section 4.2.6: a (flow, link) idle for T1 epochs is pinged, one idle for T2
epochs leaves the entry. The GC visits a share of the table on every tick, so pings are
spread over the epoch; expired capabilities are withdrawn on the same visit.

May import :mod:`flowrouter.wire` and the core's shared modules (state, actions, tables,
lsroutes, tracers); never another part (calls into other parts go through ``self``,
declared in :class:`~flowrouter.core.state.RouterState`).
"""

from __future__ import annotations

from flowrouter.core.actions import Action, Close
from flowrouter.core.state import RouterState
from flowrouter.core.tables import FlowEntry, Link
from flowrouter.core.tracers import snapshot_fields
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_GC


class GarbageCollection(RouterState):
    """Epochs, the incremental GC, keep-alive pings and time-outs."""

    def tick(self, now: float) -> list[Action]:
        """Advance the clock: epochs, incremental GC, join and handshake time-outs.

        The GC visits a share of the table proportional to the time since the last tick, so
        each entry is examined about once per epoch and pings are spread over the epoch rather
        than sent in a burst at its boundary.
        """
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
        if self._pending:
            out += self._join_timeouts(now)
        if not self._gc_keys or self._gc_pos >= len(self._gc_keys):
            self._gc_keys = list(self.flows)
            self._gc_pos = 0
        share = (now - self._gc_last) / p.epoch_length
        self._gc_last = now
        budget = min(len(self._gc_keys) - self._gc_pos,
                     int(len(self._gc_keys) * share) + 1)
        end = self._gc_pos + budget
        for key in self._gc_keys[self._gc_pos:end]:
            entry = self.flows.get(key)
            if entry is not None:
                out += self._gc_entry(key, entry, now)
        self._gc_pos = end
        return out

    def _join_timeouts(self, now: float) -> list[Action]:
        out: list[Action] = []
        limit = self.p.join_timeout
        for key, entry in list(self._pending.items()):
            if entry.up_req is None or self.flows.get(key) is not entry:
                del self._pending[key]
            elif now - entry.up_req_at > limit:
                del self._pending[key]
                self.counters["join.timeouts"] += 1
                out += self._join_failed(key, entry, C.JoinStatus.TIMEOUT,
                                         "no answer from the core", now)
        return out

    def _gc_entry(self, key: bytes, entry: FlowEntry, now: float) -> list[Action]:
        p, epoch = self.p, self.epoch
        out: list[Action] = []
        if entry.upstream is None and not entry.joined:
            out += self._rejoin(key, entry, now)  # an orphaned subtree retries its graft
        if self._policies_active:
            wall = now + self.wall_offset
            for lid in list(entry.down):
                lk = self.links.get(lid)
                cap = lk.caps.get(key) if lk is not None and lk.caps else None
                if cap is not None and cap.expiry <= wall:
                    out += self._withdraw(lk, key, "expired", now)  # type: ignore[arg-type]
            if key not in self.flows:
                return out
        doomed = []
        for lid, last in entry.traffic.items():
            idle = epoch - last
            if idle >= p.gc_delete_after:
                doomed.append(lid)
            elif idle >= p.gc_ping_after and entry.pinged.get(lid) != epoch:
                entry.pinged[lid] = epoch
                self.counters["gc.pings"] += 1
                if self._tracing:
                    self.tracer.gc_ping(now, key, lid, epoch)
                out.append(self._control(lid, key, C.Ping(epoch), BAND_GC))
        if doomed:
            for lid in doomed:
                self._drop_down(entry, key, lid, "gc", now)
                self.counters["gc.links-collected"] += 1
            if not entry.down:
                self.counters["gc.entries-collected"] += 1
            out += self._after_change(key, entry, now, "gc")
        return out

    def _on_ping(self, link: Link, key: bytes, msg: C.Ping) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or link.link_id != entry.upstream or entry.ping_epoch == self.epoch:
            return []
        entry.ping_epoch = self.epoch
        self.counters["gc.pings-relayed"] += 1
        return [self._control(lk, key, msg, BAND_GC) for lk in entry.down]

    def _on_pong(self, link: Link, key: bytes, msg: C.Pong) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or link.link_id not in entry.down:
            return []
        entry.traffic[link.link_id] = self.epoch
        if entry.upstream is None or entry.pong_epoch == self.epoch:
            return []
        entry.pong_epoch = self.epoch
        return [self._control(entry.upstream, key, msg, BAND_GC)]
