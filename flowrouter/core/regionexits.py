"""Which edge of a backbone region is each location service's exit, learned at run time.

An end flow crosses a region toward its location service (LS) through one edge, the LSID's
*exit*: the exit keeps the flow's edges and joins the flow outside the region for all of
them (:mod:`flowrouter.core.regionedge`). Nobody configures it. Each edge reads its own LS
routing table (:class:`~flowrouter.core.lsroutes.LsRouting`, fed by the LS route vectors
the routers already exchange) and *offers* itself for every LSID whose best route leaves
the region: through a link to a router outside it, or because the edge is that LSID's core
(distance 0). Edges tell each other their offers (region EXITS messages, to each edge's
inbox): at once when their offer changes or another edge becomes reachable, and again
every refresh interval (soft state: an offer not repeated for the hold time, or from an
edge the region no longer reaches, is forgotten). Every edge then elects the same exit per
LSID from the same offers: the nearest (fewest hops to the LS), ties to the lowest edge
number. An operator's ``exits`` in the region's parameters override the election.

So an exit follows the routes: when its outside link fails (its best route now runs through
the region), when the LS moves, or when another edge gets a shorter way out, the offers
change within a round trip of the route vectors, and the edges move their end flows to the
new exit (:mod:`flowrouter.core.regionmoves`).

What an edge cannot see: an LS whose core is one of the region's core routers has no exit
(no edge's best route leaves the region) and its flows cross the region unwrapped; an
offer is only as good as the routing table behind it (``routers`` of the region must be
known, or only the edges' own LSIDs are offered).

May import :mod:`flowrouter.wire` and the core's data modules (tables, lsroutes,
regions); imported by regionmoves only (the region edge's exits).
"""

from __future__ import annotations

from collections.abc import Mapping

from flowrouter.core.lsroutes import LsRouting
from flowrouter.core.regions import RegionParams
from flowrouter.core.tables import Link
from flowrouter.wire import control as C


class ExitTable:
    """One edge's view of its region's exits: its own offer, the others', the election."""

    def __init__(self, rp: RegionParams) -> None:
        self.me = rp.index
        self.edges = len(rp.edges)
        #: the operator's fixed exits (LSID -> edge number): they override the election
        self.static = {lsid: rp.edges.index(name) for lsid, name in rp.exits
                       if name in rp.edges}
        self.inside = frozenset(rp.routers)
        self.region_lsids = rp.region_lsids()
        #: this edge's offer (LSID -> hops to the LS), as last told to the others
        self.mine: dict[int, int] = {}
        #: the other edges' offers: edge -> ({LSID: hops}, when heard)
        self.offers: dict[int, tuple[dict[int, int], float]] = {}
        #: the edges that have our current offer (told, and reachable since)
        self.told: set[int] = set()
        #: the edges the region's routes reached at the last election
        self.reach: set[int] = set()
        #: the election's outcome: LSID -> exit edge
        self.exits: dict[int, int] = dict(self.static)

    def offer(self, routing: LsRouting, links: Mapping[int, Link]) -> dict[int, int]:
        """The LSIDs this edge reaches without crossing the region, with their distance."""
        out: dict[int, int] = {}
        for lsid in routing.known_lsids():
            if lsid in self.region_lsids:
                continue
            best = routing.best(lsid)
            if best is None:
                continue
            dist, lid = best
            if lid is None or self._leaves(links.get(lid)):
                out[lsid] = dist
        return out

    def _leaves(self, link: Link | None) -> bool:
        """A link to a router outside the region (unknown without the region's routers)."""
        return (link is not None and link.role is C.Role.ROUTER and bool(self.inside)
                and link.peer_name not in self.inside)

    def heard(self, edge: int, items: tuple[tuple[int, int], ...], now: float) -> None:
        if not 0 <= edge < self.edges or edge == self.me:
            return
        if items:
            self.offers[edge] = (dict(items), now)
        else:
            self.offers.pop(edge, None)

    def expire(self, now: float, hold: float) -> None:
        for edge in [e for e, (_, at) in self.offers.items() if now - at > hold]:
            del self.offers[edge]

    def elect(self, reach: set[int]) -> dict[int, int]:
        """LSID -> exit edge: the operator's, else the nearest offer of an edge in *reach*
        (those the region's routes reach now; ties: the lowest edge number). Every edge
        with the same offers elects the same. The offer of an edge that was reachable and
        is no more is forgotten, not only passed over: a dead edge's route counting to
        infinity comes and goes and must not bring its old offer back (a live edge that is
        reachable again tells its offer again). An offer from an edge not reachable yet
        (routes still spreading) is kept for when it is."""
        for edge in [e for e in self.offers if e in self.reach and e not in reach]:
            del self.offers[edge]
        self.reach = set(reach)
        best: dict[int, tuple[int, int]] = {lsid: (d, self.me) for lsid, d in self.mine.items()}
        for edge, (items, _) in self.offers.items():
            if edge not in reach:
                continue
            for lsid, d in items.items():
                cur = best.get(lsid)
                if cur is None or (d, edge) < cur:
                    best[lsid] = (d, edge)
        out = {lsid: edge for lsid, (_, edge) in best.items()}
        out.update(self.static)
        return out
