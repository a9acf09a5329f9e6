"""Hop counts over a graph given as adjacency lists: one breadth-first search for all.

The members' tree of a location service (:mod:`flowrouter.core.lstree`: who a member
reaches, each member's distance from the root) and the test-bed's topology code (each
region's exits: the edge nearest a location service's cores) both ask how many hops each
node is from a set of sources; this is the one search they share.

Imports nothing of the project (a leaf of the core, below every part).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)


def hops(adj: Mapping[Node, Iterable[Node]], sources: Iterable[Node]) -> dict[Node, int]:
    """The fewest hops from any of *sources* (0 for themselves) to every node they reach,
    following *adj* (node -> its neighbours; a node not in it has none). The nodes come in
    the order found: nearer first, then as the adjacency lists list them."""
    dist = dict.fromkeys(sources, 0)
    todo = deque(dist)
    while todo:
        node = todo.popleft()
        step = dist[node] + 1
        for nbr in adj.get(node, ()):
            if nbr not in dist:
                dist[nbr] = step
                todo.append(nbr)
    return dist
