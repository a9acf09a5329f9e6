"""Backbone regions: end flows cross a region inside aggregate flows (flowrouter.core.regions,
aggregates, regionedge), and everything a flow does keeps working through it.

The small region used here (virtual time, the simulator)::

    app0 - e0 - c0 - c1 - e2 - app2          LSID 0x10: core e0 (an edge)
            |   |    |                       LSID 0x20: core x0 (outside, behind e3)
    app1 - e1 --+    +- e3 - x0 - app4
                          |
                         app3

c0, c1 are the region's core routers; e0..e3 its edges (groups of 2).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from flowrouter.core import regions as R
from flowrouter.core.aggregates import Catalogue
from flowrouter.testbed.sim import SimNetwork
from flowrouter.testbed.topology import TopologyError, dumps, loads
from flowrouter.testbed.topology.regions import edges, exits, roles
from flowrouter.wire.capabilities import CreatorKey, Policy
from flowrouter.wire.flowid import FlowID

#: the shipped small region (topologies/region-small.toml), as text: tests vary it
TOPO = (Path(__file__).resolve().parent.parent / "topologies" / "region-small.toml"
        ).read_text()

F10 = FlowID(0x77, 0x10, 1)
F20 = FlowID(0x77, 0x20, 1)


def build(aggregate: bool = True, text: str = TOPO, **opts: object) -> SimNetwork:
    net = SimNetwork.from_topology(loads(text), seed=3, aggregate=aggregate, **opts)
    net.run_until(4.0)
    return net


def bands_got(net: SimNetwork, app: str, flow: FlowID) -> list[tuple[int, bytes]]:
    return sorted((d.band, d.payload) for d in net.endpoints[app].received(flow))


def end_flow_keys(net: SimNetwork, router: str) -> set[bytes]:
    """The end flows (not the region's own aggregates) in a router's table."""
    creator = R.region_creator("bb").to_bytes(8, "big")
    return {k for k in net.routers[router].flows if k[:8] != creator}


# ---------------------------------------------------------------- the policy
@pytest.mark.parametrize("edges_n,k,extra", [(30, 5, 0), (30, 5, 1), (30, 5, 2), (7, 3, 1),
                                             (12, 4, 4), (5, 5, 9)])
def test_every_cover_holds_its_targets_within_the_waste_bound(edges_n: int, k: int,
                                                             extra: int) -> None:
    cat = Catalogue(edges_n, k, extra)
    offered = set(cat.all_aggregates())
    rng = random.Random(1)
    for _ in range(500):
        targets = frozenset(rng.sample(range(edges_n), rng.randint(1, edges_n)))
        sender = rng.randrange(edges_n)
        for g, bits, served in cat.plan(targets - {sender}, prefer=sender):
            got = set(cat.members(g, bits))
            assert served <= got
            assert (g, bits) in offered
            assert len(got - served - {sender}) <= extra
    assert len(offered) <= cat.groups() * (2 ** k - 1)


def test_the_catalogue_shrinks_as_the_waste_allowed_grows() -> None:
    sizes = [len(Catalogue(30, 5, n).all_aggregates()) for n in range(6)]
    assert sizes[0] == 6 * 31 and sizes[-1] == 6
    assert sizes == sorted(sizes, reverse=True)


def test_region_messages_round_trip() -> None:
    key = F10.key
    for msg in (R.Join(key, 3, 77, 1 << 40), R.Ack(key, 77, 2, "no"), R.Mask(key, 1, 5),
                R.Leave(key, 9), R.Bind(key, 4, ((0, 1 << 100), (3, 6))),
                R.Digest(2, ((key, 1 << 33, 7), (key, 2, 0))), R.Data(5, bytes(24) + b"x"),
                R.Exits(3, ((0x10, 0), (0x7E00_0001, 7))), R.Exits(1, ())):
        assert R.decode(R.encode(msg)) == msg
    with pytest.raises(R.BadRegionMessage):
        R.decode(b"\x09")
    with pytest.raises(R.BadRegionMessage):
        R.decode(bytes([R.BIND]) + bytes(10))
    with pytest.raises(R.BadRegionMessage):
        R.decode(R.encode(R.Exits(3, ((0x10, 0),)))[:-1])


# ---------------------------------------------------------------- the topology
def test_a_region_has_edges_exits_and_roles() -> None:
    topo = loads(TOPO)
    region = topo.regions[0]
    assert edges(topo, region) == ("e0", "e1", "e2", "e3")
    assert dict(exits(topo, region)) == {0x10: "e0", 0x20: "e3"}
    assert roles(topo) == {"e0": "edge", "e1": "edge", "e2": "edge", "e3": "edge",
                           "c0": "core", "c1": "core", "x0": "router"}
    assert loads(dumps(topo), topo.source) == topo


@pytest.mark.parametrize("change,message", [
    ('routers = ["e0", "nope"]', "unknown router"),
    ('routers = ["e0", "c0"]\n[[regions]]\nname = "b2"\nrouters = ["c0"]', "two regions"),
])
def test_bad_regions_are_refused(change: str, message: str) -> None:
    text = TOPO.replace('routers = ["e0", "e1", "e2", "e3", "c0", "c1"]', change)
    with pytest.raises(TopologyError, match=message):
        loads(text)


def test_flows_of_a_location_service_inside_the_region_cross_it_unwrapped() -> None:
    text = TOPO.replace('name = "c0"', 'name = "c0"\ncore_lsids = [0x30]')
    topo = loads(text)
    assert 0x30 not in dict(exits(topo, topo.regions[0]))
    net = build(text=text)
    flow = FlowID(0x77, 0x30, 1)
    net.endpoints["app1"].join(flow, 32)
    net.endpoints["app2"].join(flow, 32)
    net.run_for(1.0)
    net.endpoints["app1"].send(flow, 32, b"plain")
    net.run_for(1.0)
    assert bands_got(net, "app2", flow) == [(32, b"plain")]
    assert flow.key in net.routers["c0"].flows  # no aggregation for it


# ---------------------------------------------------------------- the data plane
def join_three(net: SimNetwork, flow: FlowID = F10) -> None:
    eps = net.endpoints
    eps["app1"].join(flow, "32-33")
    eps["app2"].join(flow, "33-34")
    eps["app0"].join(flow, "34")
    net.run_for(1.0)
    assert all(eps[a].is_joined(flow) for a in ("app0", "app1", "app2"))


@pytest.mark.parametrize("aggregate", [True, False])
def test_members_get_exactly_their_bands_through_the_region(aggregate: bool) -> None:
    net = build(aggregate)
    join_three(net)
    for band in (32, 33, 34, 35):
        net.endpoints["app1"].send(F10, band, b"m%d" % band)  # a member
        net.endpoints["app3"].send(F10, band, b"n%d" % band)  # a non-member, toward the LS
    net.run_for(1.0)
    assert bands_got(net, "app0", F10) == [(34, b"m34"), (34, b"n34")]
    assert bands_got(net, "app1", F10) == [(32, b"n32"), (33, b"n33")]
    assert bands_got(net, "app2", F10) == [(33, b"m33"), (33, b"n33"), (34, b"m34"),
                                           (34, b"n34")]
    assert bands_got(net, "app3", F10) == []
    for core in ("c0", "c1"):
        assert bool(end_flow_keys(net, core)) is not aggregate
    if aggregate:  # the region's core holds aggregates only, the edges the end flow
        assert {e for e in ("e0", "e1", "e2") if end_flow_keys(net, e)} == {"e0", "e1", "e2"}
        # band 35 is wanted by no one: it goes up to the flow's exit (upstream is never
        # filtered), and there, where it would enter the region, it is dropped unwrapped
        assert net.routers["e0"].counters["region.band-filtered"] >= 1
        assert net.routers["e2"].counters["region.wasted"] == 0


def test_a_core_routers_table_stays_flat_while_flows_are_added() -> None:
    net = build()
    sizes = []
    for i in range(1, 41):
        flow = FlowID(0x78, 0x10 if i % 2 else 0x20, i)
        net.endpoints["app1"].join(flow, 32)
        net.endpoints["app2"].join(flow, 32)
        if i % 10 == 0:
            net.run_for(1.0)
            sizes.append(len(net.routers["c1"].flows))
            assert not end_flow_keys(net, "c1")
    assert len(set(sizes)) == 1
    off = build(aggregate=False)
    for i in range(1, 41):
        flow = FlowID(0x78, 0x10 if i % 2 else 0x20, i)
        off.endpoints["app1"].join(flow, 32)
        off.endpoints["app2"].join(flow, 32)
    off.run_for(1.0)
    assert len(off.routers["c1"].flows) >= 40


def test_leave_stops_delivery_and_the_exit_forgets_the_edge() -> None:
    net = build()
    join_three(net)
    net.endpoints["app2"].leave(F10)
    net.run_for(1.0)
    assert F10.key not in net.routers["e2"].flows
    net.endpoints["app1"].send(F10, 34, b"after")
    net.run_for(1.0)
    assert bands_got(net, "app2", F10) == []
    assert bands_got(net, "app0", F10) == [(34, b"after")]
    e0 = net.routers["e0"].status()
    assert e0["region"]["flows_as_exit"] == 1


def test_an_outside_location_service_is_reached_through_its_exit_edge() -> None:
    net = build()
    eps = net.endpoints
    eps["app4"].join(F20, 32)
    eps["app0"].join(F20, 32)
    net.run_for(1.0)
    assert eps["app0"].is_joined(F20)
    eps["app0"].send(F20, 32, b"out")
    eps["app4"].send(F20, 32, b"in")
    net.run_for(1.0)
    assert bands_got(net, "app4", F20) == [(32, b"out")]
    assert bands_got(net, "app0", F20) == [(32, b"in")]
    assert net.path(F20.key, "e0") == ["e0"]  # the region is e0's upstream, not c0
    assert net.path(F20.key, "e3") == ["e3", "x0"]


def test_ttl_and_locality_apply_to_the_end_flow_across_the_region() -> None:
    net = build()
    join_three(net)
    app1 = net.endpoints["app1"]
    app1.send(F10, 33, b"ttl1", ttl=1)  # reaches only applications on e1
    app1.send(F10, 33, b"ttl2", ttl=2)  # crosses the region (ingress and egress edges)
    net.run_for(1.0)
    assert bands_got(net, "app2", F10) == [(33, b"ttl2")]


def test_heartbeat_and_fault_bands_cross_the_region() -> None:
    net = build()
    eps = net.endpoints
    eps["app0"].join(F20, "16-17,32")
    eps["app4"].join(F20, "16-17,32")
    net.run_for(1.0)
    eps["app4"].send(F20, 16, b"beat")
    net.run_for(0.5)
    assert bands_got(net, "app0", F20) == [(16, b"beat")]
    net.link_down("e3-x0")  # the exit loses its way to the LS: it tells the flow on band 17
    net.run_for(0.5)
    assert any(d.band == 17 for d in eps["app0"].received(F20))


def test_a_core_link_failure_is_repaired_by_the_aggregates_trees() -> None:
    net = build()
    join_three(net)
    net.link_down("c0-c1")
    net.run_for(6.0)
    net.endpoints["app2"].send(F10, 34, b"x")
    net.run_for(1.0)
    # e0 hangs off c0 only, and c0's other way out is e1 (an edge): the region still
    # reaches it, through e1's two core links
    assert bands_got(net, "app0", F10) == [(34, b"x")]


def test_lost_region_messages_are_repaired_by_digests() -> None:
    net = build(router_options={"refresh_interval": 2.0})
    net.set_control_loss(1.0, ["e2-c1"])  # nothing of e2's joins reaches the exit
    eps = net.endpoints
    eps["app0"].join(F10, 32)
    eps["app2"].join(F10, 32)
    net.run_for(1.0)
    net.set_control_loss(0.0)
    net.run_for(8.0)  # join retries and digests repair it
    assert eps["app2"].is_joined(F10)
    eps["app0"].send(F10, 32, b"late")
    net.run_for(1.0)
    assert bands_got(net, "app2", F10) == [(32, b"late")]


def test_the_exit_forgets_an_edge_that_stops_refreshing() -> None:
    net = build(router_options={"refresh_interval": 1.0})
    join_three(net)
    e0 = net.routers["e0"]
    assert e0.status()["region"]["flows_as_exit"] == 1
    # e1 and e2 go silent for the region (cut off from it: their digests stop arriving;
    # a loss of control frames alone no longer silences them, as the edges' exit offers,
    # on a data band, keep their links alive)
    for name in ("e2-c1", "e1-c0", "e1-c1"):
        net.link_down(name)
    net.run_for(8.0)
    assert e0.counters["region.expired"] == 2
    entry = e0.flows[F10.key]
    assert R.REGION_LINK not in entry.down


def test_a_padded_aggregate_never_reaches_an_edge_a_policy_excludes() -> None:
    # max_extra 1 with groups of 2: a copy for e2 alone rides the aggregate {e2, e3}
    net = build(text=TOPO.replace("max_extra = 0", "max_extra = 1"))
    key = CreatorKey.generate()
    flow = key.flow(0x10, 1)
    eps = net.endpoints
    eps["app0"].join(flow, 32)
    eps["app2"].join(flow, 32)  # e2's group partner e3 has no member
    net.run_for(1.0)
    eps["app0"].send(flow, 32, b"pad")
    net.run_for(1.0)
    assert net.routers["e3"].counters["region.wasted"] == 1  # padding reached e3
    # the creator puts the flow under a policy (joins and sends stay open here, so the
    # members need no capabilities): its frames now go to exactly the edges with members
    for rt in net.routers.values():
        rt.policies.install(Policy.issue(key, flow, version=1, require_join=False,
                                         require_send=False).raw)
        rt.state.policies_active = True
    eps["app0"].send(flow, 32, b"exact")
    net.run_for(1.0)
    assert net.routers["e3"].counters["region.wasted"] == 1
    assert bands_got(net, "app2", flow) == [(32, b"exact"), (32, b"pad")]


def test_results_do_not_depend_on_the_order_flows_join() -> None:
    seen = []
    for order in itertools.permutations(("app0", "app1", "app2")):
        net = build()
        for a in order:
            net.endpoints[a].join(F10, 32)
            net.run_for(0.3)
        net.endpoints["app3"].send(F10, 32, b"z")
        net.run_for(1.0)
        seen.append(tuple(len(net.endpoints[a].received(F10)) for a in ("app0", "app1",
                                                                       "app2")))
    assert set(seen) == {(1, 1, 1)}


def test_frames_forged_in_the_regions_name_are_dropped_at_the_edge() -> None:
    """An application (or an outside router) sending on an edge's inbox or on an aggregate
    would speak for an edge: joins, bindings, or wrapped frames that bypass the end flow's
    own checks. Edges take the region's own flows only from the region's routers."""
    from flowrouter.wire.header import pack_header

    net = build()
    join_three(net)
    creator = R.region_creator("bb")
    inner = b"forged"
    frame = pack_header(F10.key, len(inner), 32, 0, 0, 9) + inner
    inbox_e0 = FlowID(creator, R.DEFAULT_LSID_BASE, 0)
    aggregate = FlowID(creator, R.DEFAULT_LSID_BASE, 0b10)  # {e1}, rooted at e0
    for app in ("app3", "app4"):  # on an edge; behind an outside router
        net.endpoints[app].send(inbox_e0, 22, R.encode(R.Data(3, frame)))
        net.endpoints[app].send(aggregate, 32, frame)
    net.run_for(1.0)
    for app in ("app0", "app1", "app2"):
        assert bands_got(net, app, F10) == []
    assert net.routers["e3"].counters["drop.region-forged"] == 2  # app3's
    # outside the region no router knows the way to the region's own flows at all
    assert net.routers["x0"].counters["drop.no-route"] == 2  # app4's
    assert not [r for r in net.routers["x0"].routing.table()
                if int(str(r["lsid"]), 0) >= R.DEFAULT_LSID_BASE]
