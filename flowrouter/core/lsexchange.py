"""LS exchange: what routers tell each other about location services.

LS route vectors (a distance vector over :class:`~flowrouter.core.lsroutes.LsRouting`),
the subtree masks that members of one location service (sibling cores) send each other,
and, as soon as a route changes, the re-grafting of orphaned subtrees (by membership).

A part of the router (see :mod:`flowrouter.core.router`): its own object over the shared
:class:`~flowrouter.core.state.RouterState` (whose LS routing table it keeps). It has
membership re-graft orphans and drop entries (:class:`~flowrouter.core.interfaces.TreeRepair`)
and raises alerts through admission (:class:`~flowrouter.core.interfaces.Alerts`); the links
part has it advertise routes, the soft state hands it sibling masks from digests.

May import :mod:`flowrouter.wire` and the core's shared modules (state, interfaces, actions,
tables, lsroutes, tracers); never another part.
"""

from __future__ import annotations

from flowrouter.core.actions import Action
from flowrouter.core.interfaces import Alerts, TreeRepair
from flowrouter.core.state import RouterState, control_frame, link_message, log
from flowrouter.core.tables import FlowEntry, Link, LinkState
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_LS
from flowrouter.wire.flowid import key_lsid


class LsExchange:
    """LS routes and sibling-member masks between routers."""

    def __init__(self, state: RouterState, trees: TreeRepair, alerts: Alerts) -> None:
        self.state = state
        self.trees = trees
        self.alerts = alerts
        self.p = state.p
        self.links = state.links
        self.flows = state.flows
        self.counters = state.counters
        self.routing = state.routing

    def on_ls_routes(self, link: Link, msg: C.LsRoutes, now: float) -> list[Action]:
        """A router neighbour's LS route vector: update, re-advertise, sync new siblings."""
        before = self.routing.sibling_map()
        out = self.advertise_routes(self.routing.update(link.link_id, msg.routes), now)
        if self.routing.refused:
            self.counters["refused.ls-routes"] += self.routing.refused
            out += self.alerts.alert("ls-routes", f"{link.describe()} announced more LSIDs "
                              f"than the limit of {self.p.max_ls_routes}; "
                              f"{self.routing.refused} ignored", now)
        after = self.routing.sibling_map()
        if after != before:
            out += self._sync_siblings(before, after)
        return out

    def advertise_routes(self, changed: bool, now: float, only: int | None = None
                          ) -> list[Action]:
        if not changed:
            return []
        self.state.generation += 1
        out = self.trees.retry_orphans(now)
        targets = [only] if only is not None else [
            lid for lid, lk in self.links.items()
            if lk.role is C.Role.ROUTER and lk.state is LinkState.UP]
        for lid in targets:
            out.append(link_message(lid, C.LsRoutes(self.routing.vector_for(lid))))
        return out

    def on_sibling_mask(self, link: Link, key: bytes, msg: C.Mask, now: float
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
            entry = FlowEntry(None, True, now)
            self.state.add_entry(key, entry)
            self.counters["flows.created"] += 1
            if self.state.tracing:
                self.state.tracer.entry_add(now, key, None)
        self.state.entry_changed(key)
        if msg.mask:
            if entry.sib is None:
                entry.sib = {}
            entry.sib[lid] = msg.mask
            link.dependent.add(key)
        elif entry.sib:
            entry.sib.pop(lid, None)
            link.dependent.discard(key)
        if not entry.down_count() and not entry.sib:
            self.trees.remove_entry(key, entry, "leave", now)
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
                    out += [control_frame(lid, key, msg, BAND_LS) for lid in sorted(new)]
        return out
