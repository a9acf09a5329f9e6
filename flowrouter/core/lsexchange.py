"""LS exchange: what routers tell each other about location services.

LS route vectors (a distance vector over :class:`~flowrouter.core.lsroutes.LsRouting`),
the subtree masks that members of one location service (sibling cores) send each other,
and the re-grafting of orphaned subtrees as soon as a route changes.

May import :mod:`flowrouter.wire` and the core's shared modules (state, actions, tables,
lsroutes, tracers); never another part (calls into other parts go through ``self``,
declared in :class:`~flowrouter.core.state.RouterState`).
"""

from __future__ import annotations

from flowrouter.core.actions import Action, Send
from flowrouter.core.state import LINK_KEY, RouterState, log
from flowrouter.core.tables import FlowEntry, Link, LinkState
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_LS, BAND_MEMBERSHIP
from flowrouter.wire.flowid import key_lsid
from flowrouter.wire.header import pack_header


class LsExchange(RouterState):
    """LS routes and sibling-member masks between routers."""

    def _on_ls_routes(self, link: Link, msg: C.LsRoutes, now: float) -> list[Action]:
        """A router neighbour's LS route vector: update, re-advertise, sync new siblings."""
        before = self.routing.sibling_map()
        out = self._advertise_routes(self.routing.update(link.link_id, msg.routes), now)
        if self.routing.refused:
            self.counters["refused.ls-routes"] += self.routing.refused
            out += self.alert("ls-routes", f"{link.describe()} announced more LSIDs "
                              f"than the limit of {self.p.max_ls_routes}; "
                              f"{self.routing.refused} ignored", now)
        after = self.routing.sibling_map()
        if after != before:
            out += self._sync_siblings(before, after)
        return out

    def _advertise_routes(self, changed: bool, now: float, only: int | None = None
                          ) -> list[Action]:
        if not changed:
            return []
        self.generation += 1
        out: list[Action] = self._retry_orphans(now) if self._orphans else []
        targets = [only] if only is not None else [
            lid for lid, lk in self.links.items()
            if lk.role is C.Role.ROUTER and lk.state is LinkState.UP]
        for lid in targets:
            body = C.LsRoutes(self.routing.vector_for(lid)).encode()
            out.append(Send(lid, pack_header(LINK_KEY, len(body), BAND_MEMBERSHIP), body))
        return out

    def _retry_orphans(self, now: float) -> list[Action]:
        """Routes changed: graft cut-off subtrees back now rather than at the next GC visit."""
        out: list[Action] = []
        for key in sorted(self._orphans):
            entry = self.flows.get(key)
            if entry is None or entry.upstream is not None or entry.joined:
                self._orphans.discard(key)
                continue
            out += self._rejoin(key, entry, now)
            if entry.up_req is not None:
                self._orphans.discard(key)
        return out

    def _on_sibling_mask(self, link: Link, key: bytes, msg: C.Mask, now: float
                         ) -> list[Action]:
        """Another member of our location service announces its subtree mask for a flow."""
        lid = link.link_id
        if lid not in self.routing.siblings(key_lsid(key)):
            self.counters["control.stale-sibling"] += 1
            return []
        entry = self.flows.get(key)
        if entry is None:
            if not msg.mask:
                return []
            if len(self.flows) >= self.p.max_flows:
                self.counters["refused.flow-limit"] += 1
                return []
            entry = self.flows[key] = FlowEntry(None, True, now)
            self.counters["flows.created"] += 1
            if self._tracing:
                self.tracer.entry_add(now, key, None)
        self._entry_changed(key)
        if msg.mask:
            if entry.sib is None:
                entry.sib = {}
            entry.sib[lid] = msg.mask
            link.dependent.add(key)
        elif entry.sib:
            entry.sib.pop(lid, None)
            link.dependent.discard(key)
        if not entry.down and not entry.sib:
            self._remove_entry(key, entry, "leave", now)
        return []

    def _sync_siblings(self, before: dict[int, tuple[int, ...]],
                       after: dict[int, tuple[int, ...]]) -> list[Action]:
        """A new LS member became reachable: tell it our subtree masks for that LSID."""
        out: list[Action] = []
        for lsid, links in after.items():
            new = set(links) - set(before.get(lsid, ()))
            if not new:
                continue
            log.info("location service %#x: sibling member(s) on link(s) %s", lsid,
                     sorted(new))
            for key, entry in self.flows.items():
                if entry.upstream is None and entry.agg and key_lsid(key) == lsid:
                    msg = C.Mask(entry.agg)
                    out += [self._control(lid, key, msg, BAND_LS) for lid in sorted(new)]
        return out
