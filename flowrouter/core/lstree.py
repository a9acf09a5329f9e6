"""A location service's members without a full mesh: their graph, its spanning tree, and
the subtree masks members tell each other along it.

The members of one LSID (routers with that LSID in ``core_lsids``) root the subtrees of its
flows. They must pass each flow's traffic between them, filtered by band. Members linked
to each other directly are *siblings*; the graph of sibling links need not be a full mesh,
only connected. Over it the members keep one spanning tree (the tree links), and a flow's
masks and traffic travel along the tree only, with split horizon: what a member tells a
tree neighbour is its own subtree's mask united with what its *other* tree neighbours told
it, and traffic from one tree neighbour goes to the others that want its band and down
the member's own subtree, never back. On a tree that is loop-free and complete, so every
member with a subtree that wants a band gets each frame of it exactly once.

Agreeing on the tree needs no coordinator: each member floods the names of the members it
has links to (``LsTopology`` messages, link-state advertisements with sequence numbers,
over sibling links only), so every member holds the same member graph; from it each one
computes the same tree: the shortest-path tree from the member with the lowest name, each
member's parent being its neighbour nearest that root (lowest name on ties). An edge counts
only when both ends list it. A member failure changes the tree only below the failed
member (unless it was the root).

Where the members a member reaches are all linked to each other (a full mesh, as a few
site routers serving one room usually are), no tree is used: each member is every other's
neighbour, tells each its own subtree's mask only, and what comes from a fellow member goes
only down its own subtree (the member where a frame enters sends it to every other member
that wants its band directly). That keeps the one-hop paths a mesh gives: a tree over a
mesh would carry every member's traffic across the root's links (a star), which on thin
links (56 kbit/s chat sites) is the difference between fitting and saturating. All members
hold the same graph, so they agree on which of the two they use. A location service can
also be declared direct (``direct_lsids``): its members use the mesh rule always, and a
broken member link is then not routed around (what seed 003's chat experiments model:
sites whose pairwise paths fail independently), and its members tell a sibling their own
links only, flooding nothing on (none needs the whole graph: see
:mod:`flowrouter.core.lsexchange`).

Masks go on every sibling link, tree or not (to a link off the tree: everything the
member's tree side wants), so when the tree changes, the members at a new tree link
already know each other's masks: only what the change itself alters is sent.

May import :mod:`flowrouter.wire` and the core's data modules (tables, graphs); never a part.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from flowrouter.core.graphs import hops
from flowrouter.core.tables import FlowEntry

#: members one location service's graph holds at most (more are refused and counted)
MAX_MEMBERS = 1024
#: seconds after the member graph changed during which a member passes on traffic from
#: any sibling link, dropping copies (see :meth:`MemberTree.admit`): long enough for a
#: graph change to flood across the members, short enough that an application repeating
#: the very same bytes on a band is rarely mistaken for a copy
SETTLE = 0.25
#: frames remembered for copy detection at most (the oldest are forgotten first)
MAX_REMEMBERED = 65536


class MemberTree:
    """One LSID's member graph at one member: its link-state database, the spanning tree
    computed from it, and the masks heard from and told to each sibling link."""

    def __init__(self, lsid: int, me: str = "", *, relay: bool = True) -> None:
        self.lsid = lsid
        self.me = me
        #: False: the members are meant as a full mesh and never relay for each other
        #: (``direct_lsids``): always the mesh rule, whatever links are down
        self.relay = relay
        self.seq = 0
        #: member name -> (sequence number, the fellow members it lists as neighbours)
        self.db: dict[str, tuple[int, frozenset[str]]] = {}
        #: when each member's advertisement was last seen reachable (for purging)
        self.seen: dict[str, float] = {}
        #: this member's sibling links: neighbour name -> link id (and back)
        self.by_name: dict[str, int] = {}
        self.names: dict[int, str] = {}
        #: tree neighbours (names) and their links
        self.tree_names: frozenset[str] = frozenset()
        self.tree: frozenset[int] = frozenset()
        self.root = ""
        #: the reachable members are a full mesh: no tree, every member sends directly
        self.mesh = False
        #: the members reachable over confirmed sibling links (this one included)
        self.reach: frozenset[str] = frozenset()
        #: per sibling link: flow key -> (mask, when last heard) / mask last told
        self.heard: dict[int, dict[bytes, tuple[int, float]]] = {}
        self.told: dict[int, dict[bytes, int]] = {}
        self.refused = 0  #: advertisements refused by the member limit
        #: until when the graph is settling (views of the tree may differ between members)
        self.settling_until = 0.0
        #: until when frames go on over every member link (a member link went)
        self.flooding_until = 0.0
        self._graph: tuple[frozenset[str], frozenset[tuple[str, str]]] | None = None
        #: what passed through lately (frame digest -> when), oldest first, for copies
        self._seen_frames: OrderedDict[int, float] = OrderedDict()

    # ------------------------------------------------------------------ the graph
    def set_siblings(self, links: Iterable[tuple[int, str]]) -> bool:
        """This member's sibling links now; True if its neighbour names changed (a new
        advertisement of its own is then due: ``own``)."""
        by_name: dict[str, int] = {}
        for lid, name in sorted(links):
            by_name.setdefault(name, lid)
        old = set(self.by_name)
        for lid in set(self.names) - {lid for lid, _ in links}:
            self.heard.pop(lid, None)
            self.told.pop(lid, None)
        self.by_name = by_name
        self.names = dict(links)
        if set(by_name) == old and self.me in self.db:
            return False
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        self.db[self.me] = (self.seq, frozenset(by_name))
        return True

    def own(self) -> tuple[str, int, tuple[str, ...]]:
        seq, nbrs = self.db[self.me]
        return (self.me, seq, tuple(sorted(nbrs)))

    def entries(self) -> list[tuple[str, int, tuple[str, ...]]]:
        return [(name, seq, tuple(sorted(nbrs))) for name, (seq, nbrs) in sorted(self.db.items())]

    def learn(self, entries: Iterable[tuple[str, int, tuple[str, ...]]], now: float
              ) -> tuple[list[tuple[str, int, tuple[str, ...]]], bool]:
        """Advertisements from a sibling: the new ones (to flood on), and whether our own
        must go out again (someone held an older life of ours with a higher number)."""
        new = []
        bump = False
        for name, seq, nbrs in entries:
            if name == self.me:
                if _newer(seq, self.seq) or seq == self.seq and frozenset(nbrs) != \
                        self.db[self.me][1]:
                    self.seq = (seq + 1) & 0xFFFFFFFF
                    self.db[self.me] = (self.seq, self.db[self.me][1])
                    bump = True
                continue
            held = self.db.get(name)
            if held is None and len(self.db) >= MAX_MEMBERS:
                self.refused += 1
                continue
            if held is None or _newer(seq, held[0]):
                self.db[name] = (seq, frozenset(nbrs))
                self.seen.setdefault(name, now)
                new.append((name, seq, nbrs))
        return new, bump

    def compute(self, now: float, purge_after: float) -> bool:
        """The spanning tree from the database; True if our tree links changed. Members
        unreachable for *purge_after* seconds are forgotten."""
        db = self.db
        adj = _adjacency(db)
        comp = hops(adj, (self.me,))
        for name in list(db):
            if name in comp:
                self.seen[name] = now
            elif now - self.seen.get(name, now) > purge_after:
                del db[name]
                self.seen.pop(name, None)
        self.reach = frozenset(comp)
        edges = frozenset((a, b) for a, nbrs in adj.items() for b in nbrs)
        graph = (self.reach, edges)
        if graph != self._graph:  # the views of the tree may differ for a while
            if self._graph is not None and self._graph[1] - edges:
                # a member link or member went: frames may be cut off until the tree is
                # agreed again (every member sees the loss, so all flood for a while)
                self.flooding_until = now + SETTLE
            self._graph = graph
            self.settling_until = now + SETTLE
        mesh = not self.relay or len(comp) > 1 and all(
            len(adj.get(v, ())) >= len(comp) - 1 for v in comp)  # confirmed edges only
        root = min(comp)
        dist = hops(adj, (root,))
        tree: set[str] = set()
        for v in dist:
            if v == root:
                continue
            parent = min(u for u in adj[v] if dist.get(u) == dist[v] - 1)
            if v == self.me:
                tree.add(parent)
            elif parent == self.me:
                tree.add(v)
        self.root = root
        if not self.relay:
            names = frozenset(self.by_name)  # every sibling link up now, nothing relayed
        elif mesh:
            names = frozenset(comp) - {self.me}
        else:
            names = frozenset(tree)
        links = frozenset(self.by_name[n] for n in names if n in self.by_name)
        changed = links != self.tree or mesh != self.mesh
        self.tree_names, self.tree, self.mesh = names, links, mesh
        return changed

    def members(self) -> list[str]:
        """The members this one reaches over confirmed sibling links (itself included)."""
        return sorted(hops(_adjacency(self.db), (self.me,))) if self.me in self.db \
            else [self.me]

    def off_tree(self, link_id: int) -> bool:
        """*link_id* leads to a fellow member that is not our tree neighbour."""
        name = self.names.get(link_id)
        return name is not None and name not in self.tree_names

    def admit(self, link_id: int, frame: Any, now: float) -> bool:
        """Whether a data frame of this LSID's flows, arriving on *link_id* at this member
        (which roots its subtree) is to be passed on.

        While the graph is settled: not from a fellow member off the tree (our views of the
        tree differ for a moment; passing it on could loop). While it settles (a member
        died or came, and the news floods hop by hop): from any sibling, so that no frame
        is lost to views not yet agreed (and it goes on over every member link that wants
        it: :meth:`flood`), but a frame seen before (flow, band and bytes alike, within the
        settling time) is a copy that went round: dropped, so nothing is delivered twice
        and nothing loops. Copies are looked for twice as long as the flooding lasts (its
        last copies still go round when it stops). What passes is remembered always (the
        copy of a frame passed before the news arrived may come back after it).

        A direct service passes everything: its members never relay, so nothing goes
        round, and a frame its application repeats on purpose is no copy."""
        if not self.relay:
            return True
        seen = self._seen_frames
        digest = hash(frame)
        settling = now < self.settling_until
        # copies are looked for twice as long as members flood: the last copies of
        # the flood, still going round when the flooding stops, die too
        if now < self.settling_until + SETTLE and link_id in self.names and \
                digest in seen and now - seen[digest] < SETTLE:
            return False
        if not settling and self.off_tree(link_id):
            return False
        seen[digest] = now
        seen.move_to_end(digest)
        while len(seen) > MAX_REMEMBERED or next(iter(seen.values())) < now - SETTLE:
            seen.popitem(last=False)
        return True

    def flood(self, key: bytes, bit: int, link_id: int, now: float) -> list[int] | None:
        """While the graph settles after a member link or member went: every sibling link
        but *link_id* whose side wants the band (old tree and new alike, so a fellow member
        that still holds the old tree gets the frame where it expects it); None otherwise
        (the tree rules). Every member sees that news, and a frame a flooding member sends
        reaches a member that has seen it too (the news went out on the same link before
        it), so copies are caught (:meth:`admit`)."""
        if self.mesh or now >= self.flooding_until:  # a mesh sends directly: no relay
            return None
        heard = self.heard
        return [lid for lid in self.names if lid != link_id
                and (got := heard.get(lid, {}).get(key)) is not None and got[0] & bit]

    # ------------------------------------------------------------------ masks
    def hear(self, link_id: int, key: bytes, mask: int, now: float) -> None:
        per = self.heard.setdefault(link_id, {})
        if mask:
            per[key] = (mask, now)
        else:
            per.pop(key, None)

    def heard_mask(self, link_id: int, key: bytes) -> int:
        got = self.heard.get(link_id, {}).get(key)
        return 0 if got is None else got[0]

    def stale(self, link_id: int, before: float) -> list[bytes]:
        """Keys heard from *link_id* not refreshed since *before*: forgotten and returned."""
        per = self.heard.get(link_id, {})
        gone = sorted(k for k, (_, at) in per.items() if at < before)
        for k in gone:
            del per[k]
        return gone

    def masks_for(self, key: bytes, entry: FlowEntry | None) -> list[tuple[int, int]]:
        """What each sibling link must now be told of *key* where that changed (and note
        it told): to a tree link, our subtree and the other tree links' sides (split
        horizon); to a link off the tree, our whole tree side."""
        own = 0
        sib: dict[int, int] = {}
        if entry is not None and entry.upstream is None and entry.joined:
            own = entry.agg
            sib = entry.sib or {}
        total = own
        for m in sib.values():
            total |= m
        out = []
        for lid in self.names:
            if self.mesh:
                mask = own  # a mesh: each member's own side only, nothing passed on
            elif lid in self.tree and lid in sib:
                mask = own
                for other, m in sib.items():
                    if other != lid:
                        mask |= m
            else:
                mask = total
            told = self.told.setdefault(lid, {})
            if told.get(key, 0) != mask:
                if mask:
                    told[key] = mask
                else:
                    told.pop(key, None)
                out.append((lid, mask))
        return out

    def keys(self) -> set[bytes]:
        """Every flow key heard from or told to a sibling."""
        keys: set[bytes] = set()
        for per in self.heard.values():
            keys.update(per)
        for told in self.told.values():
            keys.update(told)
        return keys

    def status(self) -> dict[str, object]:
        return {"members": self.members(), "root": self.root, "mesh": self.mesh,
                "tree_members": sorted(self.tree_names),
                "sibling_members": sorted(self.by_name), "seq": self.seq}


def _newer(a: int, b: int) -> bool:
    """Sequence number *a* is after *b* (serial number arithmetic, 32 bits)."""
    return 0 < (a - b) & 0xFFFFFFFF < 0x80000000


def _adjacency(db: dict[str, tuple[int, frozenset[str]]]) -> dict[str, list[str]]:
    """The member graph's confirmed edges: each member's neighbours that list it too."""
    return {a: sorted(b for b in nbrs if b in db and a in db[b][1])
            for a, (_, nbrs) in db.items()}
