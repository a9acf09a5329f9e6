"""A region edge's exits: electing each LSID's exit, and moving its end flows when it moves.

Owned by the region edge (:mod:`flowrouter.core.regionedge`), which says what an exit does
for an end flow. An end flow's exit is the edge through which the region reaches the flow's
location service, learned from the LS routes (:class:`~flowrouter.core.regionexits.
ExitTable` holds the offers and elects): :class:`ExitMoves` tells the other edges this
edge's offer (region EXITS messages: when it changes, to an edge newly reached, and again
every refresh interval), elects after every change of links, routes or offers, and pins
the LS route of each LSID whose exit is another edge to the region's pseudo link.

When an exit moves, every edge moves the flows of that LSID (:meth:`ExitMoves.sync`): a
member edge refreshes its joins at the new exit at once (a digest, not a message per flow),
the old exit forgets the flows' edges and re-grafts what it still needs through the region,
the new one re-grafts outside and takes the edges' joins. What a move changes of the edge's
own flow tables, and how it reaches the other edges, it does through the edge's
:class:`EdgeFlows`; membership re-grafts (:class:`~flowrouter.core.interfaces.RegionTrees`).

May import :mod:`flowrouter.wire` and the core's shared modules (state, interfaces, actions,
tables, regions, regionexits); imported by regionedge only.
"""

from __future__ import annotations

from typing import Protocol

from flowrouter.core import regions as R
from flowrouter.core.actions import Action
from flowrouter.core.interfaces import RegionTrees
from flowrouter.core.regionexits import ExitTable
from flowrouter.core.state import RouterState, log
from flowrouter.core.tables import Link
from flowrouter.wire.flowid import key_lsid

#: {LSID: (old exit, new exit)}, None where an LSID has (or had) none
Moves = dict[int, tuple[int | None, int | None]]


class EdgeFlows(Protocol):
    """The region edge, for its exits: the flows' edges it keeps, and its ways out."""

    #: at an exit: flow -> {edge: (mask, refreshed at)}, the BIND versions, waiting joins
    members: dict[bytes, dict[int, tuple[int, float]]]
    versions: dict[bytes, int]
    waiting: dict[bytes, list[tuple[int, int]]]
    #: at a member edge: flow -> (BIND version, {edge: mask})
    bound: dict[bytes, tuple[int, dict[int, int]]]

    def outbound(self, actions: list[Action], now: float) -> list[Action]: ...

    def to_edge(self, edge: int, msg: R.RegionMessage, now: float) -> list[Action]: ...

    def digests(self, now: float, keys: list[bytes] | None = None) -> list[Action]: ...

    def adopt(self, key: bytes, now: float) -> list[Action]: ...

    def forget_plans(self, key: bytes) -> None: ...


class ExitMoves:
    """One edge's exits and their moves (see the module docs)."""

    def __init__(self, state: RouterState, trees: RegionTrees, edge: EdgeFlows,
                 region: Link) -> None:
        self.state, self.trees, self.edge, self.region = state, trees, edge, region
        rp: R.RegionParams = state.p.region
        self.rp, self.me, self.flows = rp, rp.index, state.flows
        #: which edge is each LSID's exit (learned; the operator's override first)
        self.table = ExitTable(rp)
        #: the exits in force, LSID -> edge (changed in place: the edge reads the same dict)
        self.exits = dict(self.table.exits)
        #: the routing generation the exits were last elected at
        self._generation = -1
        for lsid, exit_edge in self.exits.items():
            if exit_edge != self.me:
                state.routing.pin(lsid, R.REGION_LINK)

    def exit_of(self, key: bytes) -> int | None:
        return self.exits.get(key_lsid(key))

    def sync(self, now: float) -> list[Action]:
        """Links or LS routes changed since we last looked: offer, elect, move the flows of
        every LSID whose exit moved (cheap when nothing changed: one comparison)."""
        if self.state.generation == self._generation:
            return []
        out, moves = self.elect(now)
        return out + self.move(moves, now)

    def heard(self, edge: int, items: tuple[tuple[int, int], ...], now: float
              ) -> list[Action]:
        """Another edge's offer (an EXITS message): elect again, move what moved."""
        self.table.heard(edge, items, now)
        out, moves = self.elect(now)
        return out + self.move(moves, now)

    def repeat_offer(self, now: float) -> list[Action]:
        """Soft state: our offer again to every edge we reach; offers not repeated for the
        hold time are forgotten (and the exits elected again)."""
        table = self.table
        table.expire(now, self.state.p.hold)
        out: list[Action] = []
        if table.mine:
            msg = R.Exits(self.me, tuple(sorted(table.mine.items())))
            for edge in range(len(self.rp.edges)):
                if edge != self.me and self._reaches(edge):
                    out += self.edge.to_edge(edge, msg, now)
        acts, moves = self.elect(now)
        return out + acts + self.move(moves, now)

    def _reaches(self, edge: int) -> bool:
        return self.state.routing.link_for(self.rp.inbox_lsid(edge)) is not None

    def elect(self, now: float) -> tuple[list[Action], Moves]:
        """Tell the edges our offer when it changed (or they newly reach us), elect, and
        pin the routes of the LSIDs whose exit moved: {LSID: (old exit, new exit)}."""
        st = self.state
        self._generation = st.generation
        table = self.table
        reach = {e for e in range(len(self.rp.edges)) if e != self.me and self._reaches(e)}
        offer = table.offer(st.routing, st.links)
        if offer != table.mine:
            table.mine = offer
            targets = reach
        else:
            targets = reach - table.told if offer else set()
        table.told = reach if offer else set()
        out: list[Action] = []
        if targets:
            msg = R.Exits(self.me, tuple(sorted(offer.items())))
            for edge in sorted(targets):
                out += self.edge.to_edge(edge, msg, now)
        new = table.elect(reach)
        moves = {lsid: (self.exits.get(lsid), new.get(lsid))
                 for lsid in set(self.exits) | set(new)
                 if self.exits.get(lsid) != new.get(lsid)}
        for lsid, (_, to) in moves.items():
            if to is not None and to != self.me:
                st.routing.pin(lsid, R.REGION_LINK)
            else:
                st.routing.unpin(lsid)
        if moves:
            st.generation += 1  # routes changed: the fast path forgets its mirrored ones
            self._generation = st.generation
        return out, moves

    def move(self, moves: Moves, now: float) -> list[Action]:
        """The exits moved: every flow of those LSIDs follows (see the module docs)."""
        if not moves:
            return []
        names = self.rp.edges
        for lsid, (old, new) in moves.items():
            if new is None:
                self.exits.pop(lsid, None)
            else:
                self.exits[lsid] = new
            self.state.counters["region.exit-moves"] += 1
            log.info("region %s: the exit for location service %#x is now %s (was %s)",
                     self.rp.name, lsid, "none" if new is None else names[new],
                     "none" if old is None else names[old])
        by_lsid: dict[int, list[bytes]] = {}
        for key in self.flows:
            lsid = key_lsid(key)
            if lsid in moves:
                by_lsid.setdefault(lsid, []).append(key)
        for key in self.edge.members:
            lsid = key_lsid(key)
            if lsid in moves and key not in self.flows:
                by_lsid.setdefault(lsid, []).append(key)
        out: list[Action] = []
        for lsid, (old, new) in sorted(moves.items()):
            out += self._move_flows(sorted(by_lsid.get(lsid, ())), old, new, now)
        return out

    def _move_flows(self, keys: list[bytes], old: int | None, new: int | None, now: float
                    ) -> list[Action]:
        me = self.me
        edge = self.edge
        out: list[Action] = []
        refresh: list[bytes] = []
        for key in keys:
            edge.forget_plans(key)  # planned by what the old exit knew
            if old == me:  # the edges join the new exit (or cross unwrapped): forget them
                edge.members.pop(key, None)
                edge.versions.pop(key, None)
                edge.waiting.pop(key, None)
                entry = self.flows.get(key)
                if entry is not None and entry.has_down(R.REGION_LINK):
                    out += edge.outbound(self.trees.on_leave(self.region, key, now), now)
            entry = self.flows.get(key)
            if entry is None:
                continue
            if entry.upstream == R.REGION_LINK:
                # no LEAVE to the old exit: it elects from the same offers and forgets the
                # flows' edges itself (one that does not expires them after the hold time)
                held = edge.bound.pop(key, None)
                if new is not None and new != me:
                    if held is not None:  # the same edges until the new exit binds
                        edge.bound[key] = (0, held[1])
                    refresh.append(key)
            out += edge.outbound(self.trees.regraft(key, now), now)
        if refresh:  # our joins, at the new exit now rather than at the next interval
            out += edge.digests(now, refresh)
        if new == me:  # joins the edges sent us before we knew we were the exit
            for key in keys:
                if edge.members.get(key):
                    out += edge.adopt(key, now)
        return out
