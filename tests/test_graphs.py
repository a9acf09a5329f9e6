"""The core's one breadth-first search (flowrouter.core.graphs.hops), which the members'
tree and the test-bed's region exits share (test_ls_tree, test_region_exits: the exits the
topology predicts are those the routers learn)."""

from __future__ import annotations

from flowrouter.core.graphs import hops


def test_hops_from_several_sources_counts_to_the_nearest_and_skips_the_unreachable() -> None:
    # a - b - c - d - e, and f alone; sources a and e: c is two from either
    adj = {"a": ["b"], "b": ["a", "c"], "c": ["b", "d"], "d": ["c", "e"], "e": ["d"],
           "f": []}
    assert hops(adj, ("a", "e")) == {"a": 0, "e": 0, "b": 1, "d": 1, "c": 2}
    assert hops(adj, ["f"]) == {"f": 0}
    assert hops(adj, ()) == {}
    assert hops(adj, ["x"]) == {"x": 0}  # a source the graph does not list has no links


def test_hops_lists_nearer_nodes_first() -> None:
    adj = {0: [3, 1], 1: [0, 2], 3: [0], 2: [1]}
    assert list(hops(adj, [0])) == [0, 3, 1, 2]

