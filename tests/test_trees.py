"""Core-based trees on a 7-router topology: the tree forms on join, masks aggregate at every
hop, it shrinks on leave, and a vanished member's branch is garbage-collected end to end."""

from __future__ import annotations

try:
    from .corenet import LSID, CoreNet, flow
except ImportError:  # pragma: no cover - run without the tests package
    from corenet import LSID, CoreNet, flow  # type: ignore[no-redef]

F = flow(LSID, 7)


def bits(*bands: int) -> int:
    out = 0
    for b in bands:
        out |= 1 << b
    return out


def tree_net(**params: object) -> CoreNet:
    r"""core - a - {a1, a2}; core - b - b1 - b2 (7 routers, core at the root).

            core
           /    \
          a      b
         / \      \
        a1  a2     b1
                    \
                     b2
    """
    net = CoreNet(**params)
    net.router("core", core_lsids=frozenset({LSID}))
    for name in ("a", "b", "a1", "a2", "b1", "b2"):
        net.router(name)
    for x, y in (("core", "a"), ("core", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1"),
                 ("b1", "b2")):
        net.connect(x, y)
    return net


def test_tree_forms_aggregates_and_shrinks() -> None:
    net = tree_net()
    e1 = net.endpoint("E1", "a1")
    e2 = net.endpoint("E2", "a2")
    e3 = net.endpoint("E3", "b2")
    e1.join(F, [32])
    e2.join(F, [33])
    e3.join(F, [34, 35])
    assert sorted(net.has_state(F)) == ["a", "a1", "a2", "b", "b1", "b2", "core"]
    # Aggregates at every hop are the union of what is below.
    assert net.entry("a", F).agg == bits(32, 33)
    assert net.entry("b1", F).agg == bits(34, 35)
    assert net.entry("core", F).agg == bits(32, 33, 34, 35)
    assert net.entry("core", F).down[net.link("core", "a")] == bits(32, 33)
    assert net.entry("core", F).down[net.link("core", "b")] == bits(34, 35)
    # Upstream pointers lead to the core.
    for child, parent in (("a1", "a"), ("a2", "a"), ("a", "core"), ("b2", "b1"),
                          ("b1", "b"), ("b", "core")):
        assert net.entry(child, F).upstream == net.link(child, parent)
    # A sender at a leaf reaches the other branch through the core, filtered by band.
    net.clear_wires()
    e1.send(F, 34, b"x")
    assert e3.payloads() == [b"x"] and e2.payloads() == []
    assert net.data_sent("a", "a2", F) == []  # a2 wants 33 only
    # Leaves shrink the tree hop by hop.
    e3.leave(F)
    assert sorted(net.has_state(F)) == ["a", "a1", "a2", "core"]
    assert net.entry("core", F).agg == bits(32, 33)
    e2.leave(F)
    assert sorted(net.has_state(F)) == ["a", "a1", "core"]
    assert net.entry("core", F).agg == bits(32)
    e1.leave(F)
    assert net.has_state(F) == []


def test_vanished_member_branch_is_collected_within_the_hold_time() -> None:
    interval, hold_factor = 1.0, 3.0
    net = tree_net(refresh_interval=interval, hold_factor=hold_factor, liveness_interval=0.5,
                   dead_after=1.5)
    alive = net.endpoint("E1", "a1")
    ghost = net.endpoint("E3", "b2", silent=True)  # never refreshes, never leaves
    alive.join(F, [32])
    ghost.join(F, [34])
    assert "b2" in net.has_state(F)
    net.run(until=hold_factor * interval + 2, step=interval / 10)
    assert sorted(net.has_state(F)) == ["a", "a1", "core"]  # the whole b branch is gone
    assert net.entry("core", F).agg == bits(32)
    assert net.routers["b2"].counters["gc.links-collected"] == 1
    assert net.routers["a1"].counters["refresh.rounds-received"] >= 3  # E1's digests
    # ... and stays that way.
    net.run(until=3 * (hold_factor + 2) * interval, step=interval / 10)
    assert sorted(net.has_state(F)) == ["a", "a1", "core"]




def test_a_branch_whose_new_way_to_the_core_runs_through_its_own_subtree_turns_around():
    r"""core - b - c - d - core (a ring). b's link to the core fails; b's new way runs
    through c, its downstream on the flow's tree, whose own way now goes round by d. b
    drops c, joins through it, and c turns the branch around (grafts by d and takes b as
    downstream). Before, c refused a JOIN from its upstream and b's members stayed cut off
    for good (the simulator's backbone without aggregation, when the LS's link to an edge
    failed)."""
    net = CoreNet()
    for name in ("core", "b", "c", "d"):
        net.router(name, core_lsids=frozenset({LSID}) if name == "core" else frozenset())
    for a, b in (("core", "b"), ("b", "c"), ("c", "d"), ("d", "core")):
        net.connect(a, b)
    net.tick(1.0)
    eb = net.endpoint("eb", "b")
    ec = net.endpoint("ec", "c")
    eb.join(F, [32])
    ec.join(F, [33])
    assert net.entry("c", F).upstream == net.link("c", "b")  # the tree: core - b - c
    net.cut("core", "b")
    net.tick(2.0)
    assert net.entry("b", F).upstream == net.link("b", "c")
    assert net.entry("c", F).upstream == net.link("c", "d")
    assert net.routers["c"].counters["join.turned"] == 1
    e0 = net.endpoint("e0", "core")
    e0.send(F, 32, b"to b")
    e0.send(F, 33, b"to c")
    assert eb.payloads(F) == [b"to b"]
    assert ec.payloads(F) == [b"to c"]
