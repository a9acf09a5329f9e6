"""LS exchange: what routers tell each other about location services.

LS route vectors (a distance vector over :class:`~flowrouter.core.lsroutes.LsRouting`),
and, as soon as a route changes, the re-grafting of orphaned subtrees (by membership). At
a member of a location service: the members' graph (``LsTopology`` advertisements flooded
over sibling links), the spanning tree every member computes from it, and the subtree
masks members tell each other along it (:mod:`flowrouter.core.lstree` says why a tree
and not a full mesh). ``entry.sib`` holds the masks of the entry's *tree* links only, so
forwarding, faults and notices follow the tree; what other sibling links said is kept
aside and takes over at once when the tree changes.

A part of the router (see :mod:`flowrouter.core.router`): its own object over the shared
:class:`~flowrouter.core.state.RouterState` (whose LS routing table it keeps). It has
membership re-graft orphans and drop entries (:class:`~flowrouter.core.interfaces.TreeRepair`)
and raises alerts through admission (:class:`~flowrouter.core.interfaces.Alerts`); the links
part has it advertise routes, the soft state hands it sibling masks from digests and
the fellow members' REFRESH_UPDATE batches (within its work budget).

May import :mod:`flowrouter.wire` and the core's shared modules (state, interfaces, actions,
tables, lsroutes, tracers); never another part.
"""

from __future__ import annotations

from flowrouter.core.actions import Action
from flowrouter.core.interfaces import Alerts, TreeRepair
from flowrouter.core.lstree import MemberTree
from flowrouter.core.state import RouterState, control_frame, link_message, log
from flowrouter.core.tables import FlowEntry, Link, LinkState
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_LS
from flowrouter.wire.flowid import key_lsid


class LsExchange:
    """LS routes, and the members' graph, tree and masks between routers."""

    def __init__(self, state: RouterState, trees: TreeRepair, alerts: Alerts) -> None:
        self.state = state
        self.trees = trees
        self.alerts = alerts
        self.p = state.p
        self.links = state.links
        self.flows = state.flows
        self.counters = state.counters
        self.routing = state.routing
        for tree in self.routing.trees.values():
            tree.me = self.p.name
        #: the sibling links (and names) per LSID served, as last seen
        self._siblings: dict[int, tuple[tuple[int, str], ...]] = {}
        #: masks to tell, per sibling link, held while a batch of changes is worked through
        #: (a tree change, a fellow member's batch): sent as REFRESH_UPDATE chunks
        self._held: dict[int, dict[bytes, int]] = {}
        self._holding = 0

    def on_ls_routes(self, link: Link, msg: C.LsRoutes, now: float) -> list[Action]:
        """A router neighbour's LS route vector: update, re-advertise, sync new siblings."""
        out = self.advertise_routes(self.routing.update(link.link_id, msg.routes), now)
        if self.routing.refused:
            self.counters["refused.ls-routes"] += self.routing.refused
            out += self.alerts.alert("ls-routes", f"{link.describe()} announced more LSIDs "
                              f"than the limit of {self.p.max_ls_routes}; "
                              f"{self.routing.refused} ignored", now)
        return out

    def advertise_routes(self, changed: bool, now: float, only: int | None = None
                          ) -> list[Action]:
        out = self._siblings_changed(now) if self.routing.trees else []
        if not changed:
            return out
        self.state.generation += 1
        out += self.trees.retry_orphans(now)
        targets = [only] if only is not None else [
            lid for lid, lk in self.links.items()
            if lk.role is C.Role.ROUTER and lk.state is LinkState.UP]
        for lid in targets:
            out.append(link_message(lid, C.LsRoutes(self.routing.vector_for(lid))))
        return out

    # ------------------------------------------------------------------ the members' graph
    def _siblings_changed(self, now: float) -> list[Action]:
        """Sibling links came or went: advertise our neighbours, give a new sibling the
        graph and our masks, and recompute the tree."""
        out: list[Action] = []
        for lsid, links in self.routing.sibling_map().items():
            before = self._siblings.get(lsid, ())
            if links == before:
                continue
            self._siblings[lsid] = links
            tree = self.routing.trees[lsid]
            new = sorted({lid for lid, _ in links} - {lid for lid, _ in before})
            if new:
                log.info("location service %#x: sibling member(s) on link(s) %s", lsid, new)
            if tree.set_siblings(links):
                own = tree.own()
                out += self._topology(tree, [own], [lid for lid in tree.names
                                                    if lid not in new])
            out += self._topology(tree, self._graph_of(tree), new)
            out += self._retree(tree, now)
            if new:  # a new sibling (on the tree or off it) learns our masks
                self.hold_masks()
                for key in sorted(self._lsid_keys(tree)):
                    out += self._frames(key, tree.masks_for(key, self.flows.get(key)))
                out += self.release_masks()
        return out

    def on_topology(self, link: Link, msg: C.LsTopology, now: float) -> list[Action]:
        """A fellow member's view of the members' graph: learn, flood on, recompute."""
        tree = self.routing.trees.get(msg.lsid)
        if tree is None or link.link_id not in tree.names:
            self.counters["control.stale-topology"] += 1
            return []
        new, bump = tree.learn(msg.entries, now)
        if tree.refused:
            self.counters["refused.ls-members"] += tree.refused
            tree.refused = 0
        out: list[Action] = []
        if new and tree.relay:
            # Flood on, but not to members the originator reaches itself: an advertisement
            # heard from its own member went to each of that member's neighbours directly
            # (a full mesh floods nothing on; what a loss costs, the refresh repairs).
            sender = tree.names.get(link.link_id)
            direct = [e for e in new if e[0] == sender]
            other = [e for e in new if e[0] != sender]
            if direct:
                also = set(direct[0][2])
                out += self._topology(tree, direct, [
                    lid for lid, name in tree.names.items()
                    if lid != link.link_id and name not in also])
            if other:
                out += self._topology(tree, other, [lid for lid in tree.names
                                                    if lid != link.link_id])
        if bump:
            out += self._topology(tree, [tree.own()], list(tree.names))
        if new or bump:
            out += self._retree(tree, now)
        return out

    def topology_refresh(self, link_id: int, now: float) -> list[Action]:
        """The graph is soft state too: every refresh interval a sibling gets it whole (a
        lost advertisement is repaired), and the tree is recomputed (what stayed
        unreachable for the hold time is forgotten)."""
        out: list[Action] = []
        for tree in self.routing.trees.values():
            if link_id in tree.names:
                out += self._topology(tree, self._graph_of(tree), [link_id])
                out += self._retree(tree, now)
        return out

    @staticmethod
    def _graph_of(tree: MemberTree) -> list[tuple[str, int, tuple[str, ...]]]:
        """What a sibling is given of the members' graph: all of it, or for a direct
        service (whose members never relay, so no member needs more than its own links)
        our own entry only, and nothing is flooded on. After a partition of a direct
        service of n members heals, each link carried every member's changed entry, each
        sent on by every member: a burst of control frames ahead of the application's
        traffic on links of 56 kbit/s (chat test 19: 3 KB, 0.4 s, on each site's link)."""
        return tree.entries() if tree.relay else [tree.own()]

    def _topology(self, tree: MemberTree, entries: list[tuple[str, int, tuple[str, ...]]],
                  links: list[int]) -> list[Action]:
        """*entries* to each of *links*, in as many messages as the link's frames need."""
        out: list[Action] = []
        for lid in sorted(links):
            link = self.links.get(lid)
            if link is None or link.state is not LinkState.UP:
                continue
            budget = link.max_payload - 16
            chunk: list[tuple[str, int, tuple[str, ...]]] = []
            size = 0
            for e in entries:
                n = 8 + sum(len(x.encode()) + 1 for x in (e[0], *e[2]))
                if chunk and size + n > budget:
                    out.append(link_message(lid, C.LsTopology(tree.lsid, tuple(chunk))))
                    chunk, size = [], 0
                chunk.append(e)
                size += n
            if chunk:
                out.append(link_message(lid, C.LsTopology(tree.lsid, tuple(chunk))))
        self.counters["ls.topology-sent"] += len(out)
        return out

    def _retree(self, tree: MemberTree, now: float) -> list[Action]:
        """Recompute the spanning tree; where its links changed, every flow of the LSID
        takes its tree masks from what the new tree links said."""
        before = tree.reach
        changed = tree.compute(now, self.p.hold)
        lost = before - tree.reach
        if lost:  # a partition of the members' graph (or members that died)
            self.counters["ls.members-unreachable"] += len(lost)
            log.warning("location service %#x: member(s) %s no longer reachable over "
                        "member-to-member links (%d reachable)", tree.lsid,
                        ", ".join(sorted(lost)), len(tree.reach))
        if not changed:
            return []
        self.counters["ls.tree-changes"] += 1
        log.info("location service %#x: tree links %s (members %s, root %s)", tree.lsid,
                 sorted(tree.tree), ", ".join(tree.members()), tree.root)
        self.state.generation += 1
        self.hold_masks()
        out: list[Action] = []
        for key in sorted(self._lsid_keys(tree)):
            out += self._rebuild(tree, key, now)
        return out + self.release_masks()

    def _lsid_keys(self, tree: MemberTree) -> set[bytes]:
        keys = tree.keys()
        keys.update(k for k, e in self.flows.items()
                    if e.upstream is None and key_lsid(k) == tree.lsid)
        return keys

    # ------------------------------------------------------------------ masks
    def on_sibling_mask(self, link: Link, key: bytes, msg: C.Mask, now: float
                         ) -> list[Action]:
        """A fellow member announces what its side of the tree wants of a flow."""
        lid = link.link_id
        tree = self.routing.trees.get(key_lsid(key))
        if tree is None or lid not in tree.names:
            self.counters["control.stale-sibling"] += 1
            return []
        tree.hear(lid, key, msg.mask, now)
        if lid not in tree.tree:
            return []  # kept for when this link joins the tree
        return self._rebuild(tree, key, now)

    def on_sibling_update(self, link: Link, entries: tuple[tuple[bytes, int, int], ...],
                          now: float) -> list[Action]:
        """A fellow member's batch of mask changes outside any digest round (a REFRESH_UPDATE,
        what :meth:`release_masks` sends when its tree changed): taken like MASKs, and what
        they change in turn goes out batched too."""
        self.counters["refresh.sibling-updates"] += len(entries)
        if not self.routing.sibling_link(link.link_id):
            self.counters["control.stale-sibling"] += len(entries)
            return []
        self.hold_masks()
        out: list[Action] = []
        for key, mask, flags in entries:
            if flags & C.REFRESH_SIBLING:
                out += self.on_sibling_mask(link, key, C.Mask(mask), now)
        return out + self.release_masks()

    def sibling_round_done(self, link: Link, started: float, now: float) -> list[Action]:
        """A sibling's digest round completed: masks not refreshed since *started* (the
        round before began) are gone."""
        out: list[Action] = []
        lid = link.link_id
        for tree in self.routing.trees.values():
            if lid not in tree.names:
                continue
            for key in tree.stale(lid, started):
                self.counters["refresh.sibling-masks-removed"] += 1
                if lid in tree.tree:
                    out += self._rebuild(tree, key, now)
        return out

    def _rebuild(self, tree: MemberTree, key: bytes, now: float) -> list[Action]:
        """Set the entry's tree masks from what its tree links said; tell the siblings
        whose masks that changed; drop an entry nobody wants any more."""
        sib = {lid: m for lid in sorted(tree.tree) if (m := tree.heard_mask(lid, key))}
        entry = self.flows.get(key)
        if entry is None:
            if not sib:
                return self._frames(key, tree.masks_for(key, None))
            if len(self.flows) >= self.p.max_flows:
                self.counters["refused.flow-limit"] += 1
                return []
            entry = FlowEntry(None, True, now)
            self.state.add_entry(key, entry)
            self.counters["flows.created"] += 1
            if self.state.tracing:
                self.state.tracer.entry_add(now, key, None)
        elif entry.upstream is not None:
            return []  # not rooted here (an orphan's graft, or not a member's flow)
        old = entry.sib or {}
        if old != sib:
            for lid in old.keys() - sib.keys():
                if lid in self.links:
                    self.links[lid].dependent.discard(key)
            for lid in sib.keys() - old.keys():
                self.links[lid].dependent.add(key)
            entry.sib = sib or None
            self.state.entry_changed(key)
        out = self._frames(key, tree.masks_for(key, entry))
        if not entry.down_count() and not entry.sib:
            self.trees.remove_entry(key, entry, "leave", now)
        return out

    def _frames(self, key: bytes, masks: list[tuple[int, int]]) -> list[Action]:
        if self._holding:
            for lid, m in masks:
                self._held.setdefault(lid, {})[key] = m
            return []
        return [control_frame(lid, key, C.Mask(m), BAND_LS) for lid, m in masks]

    # ------------------------------------------------------------------ batches
    def hold_masks(self) -> None:
        """Masks told from now until :meth:`release_masks` go out together."""
        self._holding += 1

    def release_masks(self) -> list[Action]:
        """The held masks (the last one per flow and link): a lone change as a MASK, more
        as REFRESH_UPDATE chunks of as many entries as the link's frames take. A tree
        change tells every flow's new masks: one MASK per flow and link, passed on hop by
        hop, cost a frame and a dispatch each (and thousands of frames per link); chunks
        carry a thousand, and the receiver reconciles them within its work budget."""
        self._holding -= 1
        if self._holding or not self._held:
            return []
        held, self._held = self._held, {}
        out: list[Action] = []
        for lid, masks in sorted(held.items()):
            link = self.links.get(lid)
            if link is None or link.state is not LinkState.UP:
                continue
            if len(masks) == 1:
                ((key, m),) = masks.items()
                out.append(control_frame(lid, key, C.Mask(m), BAND_LS))
                continue
            entries = [(key, m, C.REFRESH_SIBLING) for key, m in sorted(masks.items())]
            per = C.refresh_capacity(link.max_payload)
            for i in range(0, len(entries), per):
                out.append(link_message(lid, C.Refresh(0, 0, C.REFRESH_UPDATE, 0,
                                                       tuple(entries[i:i + per]))))
            self.counters["ls.mask-batches"] += (len(entries) + per - 1) // per
        return out
