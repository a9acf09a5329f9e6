"""The location-service table: which link leads toward each LSID.

Three sources, in order of precedence:

1. this router is the core for the LSID (distance 0, no link);
2. a static route from the config (LSID -> neighbour name), used while that neighbour is up;
3. routes learned from neighbours by a small distance vector (LS_ROUTES messages), so an
   overlay needs only its core routers configured, and reroutes when a link dies;
4. the configured default neighbour.

The distance vector uses split horizon with poisoned reverse and a small infinity, which is
enough for the handful of LSIDs an overlay carries.

At a member of a location service the table also holds, per LSID it serves, the members'
graph and spanning tree (:class:`~flowrouter.core.lstree.MemberTree`): which sibling links
carry the LSID's flows between members.
"""

from __future__ import annotations

from flowrouter.core.lstree import MemberTree
from flowrouter.core.tables import FlowEntry
from flowrouter.wire.flowid import key_lsid

INFINITY = 32


class LsRouting:
    def __init__(self, core_lsids: frozenset[int], static: dict[int, str],
                 default: str | None, max_lsids: int = 4096,
                 direct: frozenset[int] = frozenset()) -> None:
        self.core = core_lsids
        self.static = dict(static)
        self.default = default
        self.by_name: dict[str, int] = {}  #: neighbour router name -> link id (up links)
        self.names: dict[int, str] = {}
        self.learned: dict[int, dict[int, int]] = {}  #: lsid -> {link: distance}
        #: LSIDs we keep routes for; more are refused (a neighbour announcing thousands of
        #: bogus LSIDs must not make our own vector outgrow a frame or our memory)
        self.max_lsids = max_lsids
        self.refused = 0  #: LSIDs refused by the last update
        self._best: dict[int, tuple[int, int | None]] = {}
        #: LSIDs reached through a link no vector decides: a region edge sends end flows
        #: whose location service lies beyond another edge into the region
        #: (flowrouter.core.regionedge)
        self.pinned: dict[int, int] = {}
        #: LSIDs kept among some neighbours (a region's own: learned from and told to the
        #: region's routers only, so its flows never leave it), and those neighbours' names
        self.confined: frozenset[int] = frozenset()
        self.confined_to: frozenset[str] = frozenset()
        #: per LSID served: its members' graph and spanning tree (flowrouter.core.lstree)
        self.trees: dict[int, MemberTree] = {lsid: MemberTree(lsid, relay=lsid not in direct)
                                             for lsid in core_lsids}
        self._recompute()

    # events -------------------------------------------------------------------------------
    def link_up(self, link_id: int, name: str) -> None:
        self.by_name.setdefault(name, link_id)
        self.names[link_id] = name

    def link_down(self, link_id: int) -> bool:
        name = self.names.pop(link_id, None)
        if name is not None and self.by_name.get(name) == link_id:
            del self.by_name[name]
            for lid, n in self.names.items():  # another link to the same neighbour
                if n == name:
                    self.by_name[name] = lid
                    break
        self._forget(link_id)
        return self._recompute()

    def _forget(self, link_id: int) -> None:
        for lsid in [lsid for lsid, per in self.learned.items()
                     if per.pop(link_id, None) is not None and not per]:
            del self.learned[lsid]

    def confine(self, lsids: frozenset[int], neighbours: frozenset[str]) -> None:
        """Learn *lsids* only from, and tell them only to, the named neighbours."""
        self.confined = lsids
        self.confined_to = neighbours

    def _outside(self, link_id: int) -> bool:
        return bool(self.confined) and self.names.get(link_id) not in self.confined_to

    def update(self, link_id: int, routes: tuple[tuple[int, int], ...]) -> bool:
        """A neighbour's full vector replaced what we knew from it; True if our best changed."""
        self._forget(link_id)
        self.refused = 0
        if self._outside(link_id):
            routes = tuple(r for r in routes if r[0] not in self.confined)
        for lsid, dist in routes:
            if lsid and dist < INFINITY:
                per = self.learned.get(lsid)
                if per is None:
                    if len(self.learned) >= self.max_lsids:
                        self.refused += 1
                        continue
                    per = self.learned[lsid] = {}
                per[link_id] = dist
        return self._recompute()

    def _recompute(self) -> bool:
        best: dict[int, tuple[int, int | None]] = {lsid: (0, None) for lsid in self.core}
        for lsid, per_link in self.learned.items():
            if lsid in best or not per_link:
                continue
            lid, dist = min(per_link.items(), key=lambda kv: (kv[1], kv[0]))
            if dist + 1 < INFINITY:
                best[lsid] = (dist + 1, lid)
        changed = best != self._best
        self._best = best
        return changed

    # queries ------------------------------------------------------------------------------
    def pin(self, lsid: int, link_id: int) -> None:
        """Route *lsid* through *link_id* whatever the vectors say."""
        self.pinned[lsid] = link_id

    def unpin(self, lsid: int) -> None:
        self.pinned.pop(lsid, None)

    def best(self, lsid: int) -> tuple[int, int | None] | None:
        """(distance, link) of the best route the vectors give (pins aside; link None: we
        are a core), or None: what a region edge offers as an exit."""
        return self._best.get(lsid)

    def link_for(self, lsid: int) -> int | None:
        pinned = self.pinned.get(lsid)
        if pinned is not None:
            return pinned
        name = self.static.get(lsid)
        if name is not None and name in self.by_name:
            return self.by_name[name]
        best = self._best.get(lsid)
        if best is not None and best[1] is not None:
            return best[1]
        if self.default is not None:
            return self.by_name.get(self.default)
        return None

    def siblings(self, lsid: int) -> list[int]:
        """Links to other members of a location service we are a member of (distance 0)."""
        if lsid not in self.core:
            return []
        return sorted(lid for lid, dist in self.learned.get(lsid, {}).items() if dist == 0)

    def sibling_map(self) -> dict[int, tuple[tuple[int, str], ...]]:
        """Per LSID served: the sibling links and their members' names."""
        return {lsid: tuple((lid, self.names.get(lid, "")) for lid in self.siblings(lsid))
                for lsid in self.core}

    def sibling_link(self, link_id: int) -> bool:
        """*link_id* leads to a fellow member of a location service we serve."""
        return any(link_id in tree.names for tree in self.trees.values())

    def tree_links(self, lsid: int) -> frozenset[int]:
        """The sibling links on the members' spanning tree of *lsid* (empty elsewhere)."""
        tree = self.trees.get(lsid)
        return frozenset() if tree is None else tree.tree

    def admit(self, lsid: int, link_id: int, frame: object, now: float) -> bool:
        """At a member of *lsid*: whether a frame of its flows from *link_id* is passed
        on (:meth:`MemberTree.admit`); elsewhere always."""
        tree = self.trees.get(lsid)
        return tree is None or tree.admit(link_id, frame, now)

    def from_mesh(self, lsid: int, link_id: int) -> bool:
        """*link_id* leads to a fellow member of *lsid* and the members are a full mesh:
        what it sends was sent to every member that wants it, so it goes only down."""
        tree = self.trees.get(lsid)
        return tree is not None and tree.mesh and link_id in tree.names

    def flood(self, lsid: int, key: bytes, bit: int, link_id: int, now: float
              ) -> list[int] | None:
        """At a member of *lsid* while its graph settles: the sibling links a frame goes
        to (:meth:`MemberTree.flood`); else None."""
        tree = self.trees.get(lsid)
        return None if tree is None else tree.flood(key, bit, link_id, now)

    def sibling_masks(self, key: bytes, entry: FlowEntry | None) -> list[tuple[int, int]]:
        """At a member: (sibling link, mask) for each sibling that must be told a new mask
        of flow *key* (see :meth:`MemberTree.masks_for`); elsewhere nothing."""
        tree = self.trees.get(key_lsid(key))
        return [] if tree is None else tree.masks_for(key, entry)

    def told_to(self, link_id: int) -> dict[bytes, int]:
        """The masks this member last told a sibling link (what its digests repeat); the
        caller only reads it."""
        found = [told for tree in self.trees.values() if (told := tree.told.get(link_id))]
        if len(found) == 1:  # nearly always: one LSID per member link (read, not copied)
            return found[0]
        out: dict[bytes, int] = {}
        for told in found:
            out.update(told)
        return out

    def known_lsids(self) -> set[int]:
        return set(self._best) | set(self.static)

    def vector_for(self, link_id: int) -> tuple[tuple[int, int], ...]:
        """What we tell neighbour *link_id* (poisoned reverse for routes through it)."""
        hide = self.confined if self._outside(link_id) else frozenset()
        return tuple(sorted(
            (lsid, INFINITY if via == link_id else dist)
            for lsid, (dist, via) in self._best.items() if lsid not in hide))

    def table(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for lsid in sorted(self.known_lsids()):
            lid = None if lsid in self.core else self.link_for(lsid)
            dist, _ = self._best.get(lsid, (None, None))
            tree = self.trees.get(lsid)
            rows.append({"lsid": f"{lsid:#x}", "core": lsid in self.core, "link": lid,
                         "distance": dist, "siblings": self.siblings(lsid),
                         **({"tree_links": sorted(tree.tree), **tree.status()}
                            if tree is not None else {}),
                         "source": "core" if lsid in self.core else
                         "pinned" if lsid in self.pinned else
                         "static" if lsid in self.static else "learned"})
        if self.default:
            rows.append({"lsid": "default", "core": False,
                         "link": self.by_name.get(self.default), "distance": None,
                         "source": "static"})
        return rows
