"""Backbone regions learn their exits (flowrouter.core.regionexits): the edge through which
the region reaches a location service follows the LS routes, and end flows follow the exit
when it moves, with no configuration.

The region of topologies/region-small.toml with a second way out to x0 (the core of LSID
0x20)::

    app0 - e0 - c0 - c1 - e2 - app2
            |   |    |     \\
    app1 - e1 --+    +- e3 - x0 - app4
                          |
                         app3

e2 and e3 are both one hop from x0: the tie goes to the lower edge, e2. When e2's outside
link fails, e3 becomes the exit; when it comes back, e2 again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrouter.core import regions as R
from flowrouter.core.regionexits import ExitTable
from flowrouter.testbed.sim import SimNetwork
from flowrouter.testbed.topology import loads
from flowrouter.testbed.topology.regions import exits, region_params
from flowrouter.wire.bands import mask_of
from flowrouter.wire.flowid import FlowID

TOPO = (Path(__file__).resolve().parent.parent / "topologies" / "region-small.toml"
        ).read_text()
TWO_WAYS_OUT = TOPO.replace('[[links]]\na = "e3"\nb = "x0"',
                            '[[links]]\na = "e3"\nb = "x0"\n[[links]]\na = "e2"\nb = "x0"')
F20 = FlowID(0x77, 0x20, 1)
EDGES = ("e0", "e1", "e2", "e3")
#: each member's own bands; app3 (on e3) sends without being a member
MASKS = {"app0": "32-33", "app1": "33", "app2": "34", "app4": "32,34"}
SENDERS = ("app0", "app4", "app3")
BANDS = (32, 33, 34, 35)


def build(text: str = TWO_WAYS_OUT, down: tuple[str, ...] = ()) -> SimNetwork:
    net = SimNetwork.from_topology(loads(text), seed=3, aggregate=True)
    for name in down:
        net.link_down(name)
    net.run_until(4.0)
    for app, mask in MASKS.items():
        net.endpoints[app].join(F20, mask)
    net.run_for(1.0)
    assert all(net.endpoints[a].is_joined(F20) for a in MASKS)
    return net


def exit_views(net: SimNetwork) -> set[str | None]:
    """What every edge believes is LSID 0x20's exit (one value once they agree)."""
    return {net.routers[e].status()["region"]["exits"].get("0x20") for e in EDGES}


def core_end_flows(net: SimNetwork) -> int:
    creator = R.region_creator("bb").to_bytes(8, "big")
    return sum(1 for c in ("c0", "c1") for k in net.routers[c].flows if k[:8] != creator)


def probe(net: SimNetwork, tag: bytes) -> None:
    for app in SENDERS:
        for band in BANDS:
            net.endpoints[app].send(F20, band, tag + b"/" + app.encode())


def exact(net: SimNetwork, tag: bytes) -> bool:
    """Every member got exactly its bands of probe *tag* from every other sender, once."""
    for app, mask in MASKS.items():
        bits = mask_of(mask)
        got = sorted((d.band, d.payload) for d in net.endpoints[app].received(F20)
                     if d.payload.startswith(tag + b"/"))
        want = sorted((b, tag + b"/" + s.encode()) for s in SENDERS if s != app
                      for b in BANDS if bits >> b & 1)
        if got != want:
            return False
    return True


def test_exits_are_learned_not_configured() -> None:
    topo = loads(TWO_WAYS_OUT)
    assert all(p.exits == () for p in region_params(topo).values())  # nothing configured
    net = build()
    assert exit_views(net) == {"e2"}  # the tie between e2 and e3 goes to the lower edge
    assert dict(exits(topo, topo.regions[0]))[0x20] == "e2"  # what the topology predicts
    for e in EDGES:  # e0 is 0x10's exit: its core
        assert net.routers[e].status()["region"]["exits"]["0x10"] == "e0"
    assert net.routers["e2"].status()["region"]["flows_as_exit"] == 1
    probe(net, b"before")
    net.run_for(0.5)
    assert exact(net, b"before")
    assert core_end_flows(net) == 0


def converge(net: SimNetwork, label: bytes, limit: float = 3.0, step: float = 0.05
             ) -> float:
    """Probe every *step* until every round since one is exact; the virtual seconds from
    now to that round's sending."""
    start = net.now
    rounds: list[tuple[float, bytes]] = []
    while net.now - start < limit:
        tag = label + b"%d" % len(rounds)
        rounds.append((net.now, tag))
        probe(net, tag)
        net.run_for(step)
        assert core_end_flows(net) == 0  # the region's core never holds an end flow
    net.run_for(0.5)
    ok = [exact(net, tag) for _, tag in rounds]
    assert ok[-1], "never exact again"
    first = len(ok) - ok[::-1].index(False) if False in ok else 0
    assert all(ok[first:])
    return rounds[first][0] - start if first < len(rounds) else limit


def test_the_exits_outside_link_fails_and_flows_move_to_the_new_exit() -> None:
    net = build()
    before = {e: net.routers[e].counters["region.messages-sent"] for e in EDGES}
    net.link_down("e2-x0")
    took = converge(net, b"fail")
    assert exit_views(net) == {"e3"}
    status = {e: net.routers[e].status()["region"] for e in EDGES}
    assert status["e3"]["flows_as_exit"] == 1 and status["e2"]["flows_as_exit"] == 0
    assert took <= 0.5, f"delivery exact again only {took:.2f} s after the failure"
    sent = sum(net.routers[e].counters["region.messages-sent"] - before[e] for e in EDGES)
    moves = sum(net.routers[e].counters["region.exit-moves"] for e in EDGES)
    assert moves >= 4 + 4  # every edge learned e2 at first, then moved to e3
    # the repair costs a bounded number of region messages: offers, leaves, digests,
    # binds and joins for one flow (the probes' own DATA toward the exit included)
    assert sent < 200, sent
    print(f"\nexit failover: exact again {took:.2f} s after the failure; "
          f"{sent} region messages sent by the edges meanwhile")
    # the outside link comes back: e2 is the nearer (lower) exit again
    net.link_up("e2-x0")
    converge(net, b"back")
    assert exit_views(net) == {"e2"}


@pytest.mark.parametrize("late", ["e2-x0"])
def test_a_new_way_out_makes_its_edge_the_exit(late: str) -> None:
    net = build(down=(late,))
    assert exit_views(net) == {"e3"}  # the only way out at first
    net.link_up(late)
    converge(net, b"new")
    assert exit_views(net) == {"e2"}
    assert net.routers["e2"].status()["region"]["flows_as_exit"] == 1


def test_the_election_nearest_offer_lowest_edge_and_the_operators_override() -> None:
    every = {1, 2, 3}

    def table(exits: tuple[tuple[int, str], ...] = ()) -> ExitTable:
        t = ExitTable(R.RegionParams("bb", EDGES, "e0", exits=exits, routers=EDGES))
        t.heard(3, ((0x20, 1), (0x30, 2)), now=0.0)
        t.heard(2, ((0x20, 1), (0x30, 4)), now=1.0)
        t.heard(1, ((0x30, 5),), now=2.0)
        return t

    t = table()
    assert t.elect({1, 2}) == {0x20: 2, 0x30: 2}  # e3 not reachable yet: passed over
    assert t.elect(every) == {0x20: 2, 0x30: 3}  # nearest; a tie to the lower edge
    assert t.elect({1, 2}) == {0x20: 2, 0x30: 2}  # e3 lost: its offer is forgotten,
    assert t.elect(every) == {0x20: 2, 0x30: 2}  # even if a stale route comes back,
    t.heard(3, ((0x20, 1), (0x30, 2)), now=0.0)  # until it offers again
    assert t.elect(every) == {0x20: 2, 0x30: 3}
    t.mine = {0x30: 2}
    assert t.elect(every)[0x30] == 0  # e0 itself, as near as e3 and lower
    t.heard(2, (), now=3.0)  # e2 withdraws its offer
    assert t.elect(every) == {0x20: 3, 0x30: 0}
    t.expire(now=2.5 + 1.0, hold=2.0)  # e3's offer (heard at 0) not repeated: forgotten
    assert t.elect(every) == {0x30: 0}
    assert table(((0x20, "e3"), (0x40, "e1"))).elect(every) == {
        0x20: 3, 0x30: 3, 0x40: 1}  # the operator's exits win, even unoffered ones
    t.heard(0, ((0x50, 1),), now=4.0)  # our own number, or no edge of ours: ignored
    t.heard(9, ((0x50, 1),), now=4.0)
    assert 0x50 not in t.elect(every)


def test_the_exit_edge_dies_and_the_others_move_once() -> None:
    """e2 (the exit) goes away whole: the others elect e3 once, however long the routes
    to e2's inbox take to count to infinity (its offer is forgotten when it is lost)."""
    net = build()
    moves = {e: net.routers[e].counters["region.exit-moves"] for e in ("e0", "e1", "e3")}
    for name in ("e2-x0", "e2-c1", "app2@e2"):
        net.link_down(name)
    net.run_for(6.0)
    assert {net.routers[e].status()["region"]["exits"]["0x20"] for e in moves} == {"e3"}
    for e, before in moves.items():
        assert net.routers[e].counters["region.exit-moves"] - before == 1, e
    eps = net.endpoints
    eps["app4"].send(F20, 32, b"after")
    eps["app1"].send(F20, 33, b"after")
    net.run_for(0.5)
    assert [d.payload for d in eps["app0"].received(F20)] == [b"after", b"after"]
    assert core_end_flows(net) == 0
