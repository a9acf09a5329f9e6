"""The aggregation policy: which aggregate flows a backbone region offers, and which of them
carry an end flow to the set of edges that have its members.

Flows in flows (seed 002 section 6.2.1, as MPLS label stacking and aggregated multicast do
it): inside a region, end flows ride a small, fixed catalogue of aggregate flows between the
region's edges, so a core router's table holds aggregates only, however many end flows cross
it. The catalogue is bounded by construction, and so is the bandwidth it wastes:

* The edges (sorted by name, numbered 0..E-1) fall into groups of ``group_size`` (k)
  consecutive edges. An end flow whose edge set touches g groups is sent as g copies, one
  per group, each on an aggregate of that group: state and copies are traded against each
  other by k (at most ``ceil(E/k) * (2**k - 1)`` aggregates in the whole region).
* Within a group, the catalogue holds every subset of edges whose size is k, k-(N+1),
  k-2(N+1), ... for ``max_extra`` N. An end flow's edges in the group ride the catalogue
  subset of the smallest such size that holds them, padded with the group's lowest-numbered
  other edges, so no copy ever reaches more than N edges without members (N = 0: every
  subset, no waste; N >= k-1: one aggregate per group, the whole group).

An aggregate's FlowID is ``region creator | LSID of the group's root edge | subset bits``;
the root edge (the group's first) is the core of its group's aggregates, so each aggregate
is an ordinary shared tree, joined, refreshed and repaired like any flow.

Pure functions and one small class; imports only the standard library.
"""

from __future__ import annotations

from functools import lru_cache


class Catalogue:
    """The aggregates a region with *edges* edges offers under one policy (see the module)."""

    __slots__ = ("edges", "group_size", "max_extra", "_sizes")

    def __init__(self, edges: int, group_size: int = 5, max_extra: int = 1) -> None:
        if edges < 1:
            raise ValueError("a region needs at least one edge")
        if not 1 <= group_size <= 16:
            raise ValueError("group_size must be 1..16")
        if max_extra < 0:
            raise ValueError("max_extra must be >= 0")
        self.edges = edges
        self.group_size = group_size
        self.max_extra = max_extra
        self._sizes: dict[int, tuple[int, ...]] = {}

    # groups --------------------------------------------------------------------------------
    def groups(self) -> int:
        return -(-self.edges // self.group_size)

    def group_of(self, edge: int) -> int:
        return edge // self.group_size

    def group_edges(self, group: int) -> range:
        first = group * self.group_size
        return range(first, min(first + self.group_size, self.edges))

    def root(self, group: int) -> int:
        """The edge that is the core of the group's aggregates (its first)."""
        return group * self.group_size

    def sizes(self, group: int) -> tuple[int, ...]:
        """The subset sizes the group's catalogue holds, largest first."""
        got = self._sizes.get(group)
        if got is None:
            k = len(self.group_edges(group))
            got = self._sizes[group] = tuple(range(k, 0, -(self.max_extra + 1)))
        return got

    # the policy ----------------------------------------------------------------------------
    def cover(self, group: int, targets: frozenset[int], prefer: int | None = None) -> int:
        """The subset bits (bit i: the group's i-th edge) of the aggregate that carries a
        copy to *targets* (edges of *group*, not empty): see the module docs. Padding takes
        *prefer* first (the sending edge: a copy never goes back to it, so padding with it
        wastes nothing)."""
        edges = self.group_edges(group)
        return _cover(edges.start, len(edges), self.sizes(group), targets,
                      prefer if prefer in edges else None)

    def plan(self, targets: frozenset[int], prefer: int | None = None
             ) -> list[tuple[int, int, frozenset[int]]]:
        """(group, subset bits, the targets it serves) for every group *targets* touch."""
        by_group: dict[int, set[int]] = {}
        for e in targets:
            by_group.setdefault(self.group_of(e), set()).add(e)
        return [(g, self.cover(g, frozenset(t), prefer), frozenset(t))
                for g, t in sorted(by_group.items())]

    def members(self, group: int, bits: int) -> list[int]:
        """The edges of an aggregate."""
        first = self.group_edges(group).start
        return [first + i for i in range(self.group_size) if bits >> i & 1]

    def aggregates_of(self, edge: int) -> list[int]:
        """Subset bits of every aggregate of the edge's group that has *edge* as a member:
        the aggregates the edge joins."""
        g = self.group_of(edge)
        k = len(self.group_edges(g))
        me = edge - self.group_edges(g).start
        return [bits for bits in _subsets(k, self.sizes(g)) if bits >> me & 1]

    def all_aggregates(self) -> list[tuple[int, int]]:
        """(group, subset bits) of the whole catalogue."""
        return [(g, bits) for g in range(self.groups())
                for bits in _subsets(len(self.group_edges(g)), self.sizes(g))]

    def extra(self, group: int, bits: int, targets: frozenset[int]) -> int:
        """Edges the aggregate reaches beyond *targets* (the waste of one copy)."""
        return bin(bits).count("1") - len(targets)


def _cover(first: int, k: int, sizes: tuple[int, ...], targets: frozenset[int],
           prefer: int | None) -> int:
    bits = 0
    for e in targets:
        bits |= 1 << (e - first)
    have = len(targets)
    size = min(s for s in sizes if s >= have)
    if have < size and prefer is not None and not bits >> (prefer - first) & 1:
        bits |= 1 << (prefer - first)
        have += 1
    i = 0
    while have < size:  # pad with the lowest-numbered edges without members
        if not bits >> i & 1:
            bits |= 1 << i
            have += 1
        i += 1
    assert i <= k
    return bits


@lru_cache(maxsize=64)
def _subsets(k: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    want = set(sizes)
    return tuple(b for b in range(1, 1 << k) if bin(b).count("1") in want)
