"""The sans-I/O router core, driven by the deterministic in-memory harness in corenet.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrouter.core.router import Router, RouterParams
from flowrouter.core.tables import LinkState, Modifiers
from flowrouter.wire import control as C
from flowrouter.wire.header import Locality, pack_header

try:  # tests/ as a package or as a plain directory on sys.path
    from .corenet import LINK_KEY, LSID, CoreNet, bits, chain, diamond, filter_net, flow, star
except ImportError:
    from corenet import LINK_KEY, LSID, CoreNet, bits, chain, diamond, filter_net, flow, star

F = flow(LSID)


# =========================================================================== params, links
def test_router_params_validation():
    with pytest.raises(ValueError, match="GC thresholds"):
        RouterParams("x", 1, gc_ping_after=3, gc_delete_after=3)
    with pytest.raises(ValueError, match="GC thresholds"):
        RouterParams("x", 1, gc_ping_after=0, gc_delete_after=3)
    with pytest.raises(ValueError, match="epoch_length"):
        RouterParams("x", 1, epoch_length=0)


def test_open_link_says_hello_and_handshake_brings_it_up():
    net = CoreNet()
    r = net.router("r1", core_lsids=frozenset({LSID}))
    ep = net.endpoint("e", "r1", hello=False)
    hello = ep.msgs(C.Hello)
    assert len(hello) == 1 and hello[0].role is C.Role.ROUTER and hello[0].name == "r1"
    assert hello[0].default_lsid == LSID
    assert r.links[ep.link_id].state is LinkState.HANDSHAKE
    ep.hello()
    link = r.links[ep.link_id]
    assert link.state is LinkState.UP and link.role is C.Role.ENDPOINT and link.peer_name == "e"
    assert r.counters["links.up"] == 1
    with pytest.raises(ValueError, match="already in use"):
        r.open_link(ep.link_id, 0.0)


def test_router_links_come_up_both_ways():
    net = chain(2)
    for a, b in (("r1", "r2"), ("r2", "r1")):
        link = net.routers[a].links[net.link(a, b)]
        assert link.state is LinkState.UP and link.role is C.Role.ROUTER and link.peer_name == b


def test_handshake_timeout_closes_only_that_link():
    net = chain(2, handshake_timeout=10.0)
    mute = net.endpoint("mute", "r2", hello=False)
    good = net.endpoint("good", "r2")
    net.tick(9.0)
    assert net.closes == []
    net.tick(10.5)
    assert [(n, lk) for n, lk, _ in net.closes] == [("r2", mute.link_id)]
    r2 = net.routers["r2"]
    assert mute.link_id not in r2.links and good.link_id in r2.links
    assert net.link("r2", "r1") in r2.links


def test_receive_on_unknown_link_is_ignored():
    r = Router(RouterParams("r", 1))
    assert r.receive(99, pack_header(F.key, 0, 32), b"", 0.0) == []
    assert r.close_link(99, 0.0) == []


def test_status_reports_tables():
    net = chain(3)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32, 40])
    st_ = net.routers["r2"].status()
    assert st_["name"] == "r2" and st_["flow_count"] == 1
    (row,) = st_["flows"]
    assert row["flow"] == str(F) and row["aggregate"] == "32,40" and row["joined"]
    assert row["upstream"] == net.link("r2", "r1")
    assert {lk["id"] for lk in st_["links"]} == {net.link("r2", "r1"), net.link("r2", "r3")}


# =========================================================================== LS routes (DV)
def test_dv_learns_ls_routes_along_a_chain():
    net = chain(4)
    r = net.routers
    assert r["r1"].routing.link_for(LSID) is None  # the core itself
    assert r["r2"].routing.link_for(LSID) == net.link("r2", "r1")
    assert r["r3"].routing.link_for(LSID) == net.link("r3", "r2")
    assert r["r4"].routing.link_for(LSID) == net.link("r4", "r3")
    dist = {n: {row["lsid"]: row["distance"] for row in r[n].routing.table()} for n in r}
    assert dist == {"r1": {"0x10": 0}, "r2": {"0x10": 1}, "r3": {"0x10": 2},
                    "r4": {"0x10": 3}}
    assert r["r4"].default_lsid() == LSID
    assert r["r4"].routing.link_for(0x99) is None
    assert net.control_sent("r1", "r2", C.LsRoutes)  # learned by advertisement


def test_dv_star_with_two_location_services():
    net = CoreNet()
    net.router("hub", core_lsids=frozenset({LSID}))
    net.router("a")
    net.router("b")
    net.router("c", core_lsids=frozenset({0x20}))
    for leaf in ("a", "b", "c"):
        net.connect("hub", leaf)
    a, hub = net.routers["a"], net.routers["hub"]
    assert a.routing.link_for(LSID) == net.link("a", "hub")
    assert a.routing.link_for(0x20) == net.link("a", "hub")
    assert hub.routing.link_for(0x20) == net.link("hub", "c")
    assert {row["lsid"]: row["distance"] for row in a.routing.table()} == {"0x10": 1, "0x20": 2}


def test_dv_reroutes_when_a_link_dies():
    net = diamond()
    r1 = net.routers["r1"]
    assert r1.routing.link_for(LSID) == net.link("r1", "r2")
    net.cut("r1", "r2")
    assert r1.routing.link_for(LSID) == net.link("r1", "r3")


def test_dv_route_disappears_with_the_only_path():
    net = chain(3)
    net.cut("r1", "r2")
    assert net.routers["r2"].routing.link_for(LSID) is None
    assert net.routers["r3"].routing.link_for(LSID) is None


# =========================================================================== join
def test_join_travels_to_the_core_and_the_ack_cascades_back():
    net = chain(3)
    e3 = net.endpoint("e3", "r3")
    req = e3.join(F, [32], pump=False)
    net.step()  # r3 takes the JOIN and sends its own upstream
    assert e3.acks() == [] and net.has_state(F) == ["r3"]
    net.pump()
    assert e3.acks() == [C.JoinAck(req, C.JoinStatus.OK)]
    # the join went hop by hop to the core, the approval came back the same way
    (j32,) = net.control_sent("r3", "r2", C.Join, F)
    (j21,) = net.control_sent("r2", "r1", C.Join, F)
    assert j32.mask == j21.mask == bits(32)
    assert [a.status for a in net.control_sent("r1", "r2", C.JoinAck, F)] == [C.JoinStatus.OK]
    assert [a.req_id for a in net.control_sent("r1", "r2", C.JoinAck, F)] == [j21.req_id]
    assert [a.req_id for a in net.control_sent("r2", "r3", C.JoinAck, F)] == [j32.req_id]
    e1, e2, e3_ = (net.entry(n, F) for n in ("r1", "r2", "r3"))
    assert e1.upstream is None and e1.joined and e1.down == {net.link("r1", "r2"): bits(32)}
    assert e2.upstream == net.link("r2", "r1") and e2.joined
    assert e2.down == {net.link("r2", "r3"): bits(32)}
    assert e3_.upstream == net.link("r3", "r2") and e3_.joined
    assert e3_.down == {e3.link_id: bits(32)}


def test_first_on_tree_router_approves():
    net = chain(3)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32])
    net.clear_wires()
    e2 = net.endpoint("e2", "r2")
    req = e2.join(F, [40])
    assert e2.acks() == [C.JoinAck(req, C.JoinStatus.OK)]
    assert net.control_sent("r2", "r1", C.Join) == []  # r2 is on the tree already
    assert [m.mask for m in net.control_sent("r2", "r1", C.Mask, F)] == [bits(32, 40)]


def test_joins_while_a_join_is_pending_share_it():
    net = chain(3)
    a, b = net.endpoint("a", "r3"), net.endpoint("b", "r3")
    ra = a.join(F, [32], pump=False)
    rb = b.join(F, [33], pump=False)
    net.pump()
    assert a.acks() == [C.JoinAck(ra, C.JoinStatus.OK)]
    assert b.acks() == [C.JoinAck(rb, C.JoinStatus.OK)]
    assert len(net.control_sent("r3", "r2", C.Join, F)) == 1
    assert net.entry("r1", F).down[net.link("r1", "r2")] == bits(32, 33)


def test_join_at_the_core():
    net = chain(2)
    e = net.endpoint("e", "r1")
    req = e.join(F, "data")
    assert e.acks() == [C.JoinAck(req, C.JoinStatus.OK)]
    assert net.has_state(F) == ["r1"]


def test_join_refused_with_no_route_for_an_unknown_lsid():
    net = chain(3)
    e3 = net.endpoint("e3", "r3")
    unknown = flow(0x99)
    req = e3.join(unknown, [32])
    (ack,) = e3.acks()
    assert ack.req_id == req and ack.status is C.JoinStatus.NO_ROUTE and "0x99" in ack.reason
    assert net.has_state(unknown) == []
    assert net.routers["r3"].counters["refused.no-route"] == 1
    assert net.control_sent("r3", "r2", C.Join) == []


def test_no_route_refusal_cascades_back_and_leaves_no_state():
    net = CoreNet()
    net.router("r1", core_lsids=frozenset({LSID}))
    net.router("r2")
    net.router("r3", default_route="r2")  # r3 sends everything unknown to r2
    net.connect("r1", "r2")
    net.connect("r2", "r3")
    e3 = net.endpoint("e3", "r3")
    unknown = flow(0x99)
    req = e3.join(unknown, [32])
    assert len(net.control_sent("r3", "r2", C.Join, unknown)) == 1
    assert [(a.req_id, a.status) for a in e3.acks()] == [(req, C.JoinStatus.NO_ROUTE)]
    assert net.has_state(unknown) == []
    assert net.routers["r2"].counters["refused.no-route"] == 1


def test_flow_table_limit_refuses_with_limit():
    net = CoreNet()
    net.router("r1", core_lsids=frozenset({LSID}))
    net.router("r2", max_flows=1)
    net.router("r3")
    net.connect("r1", "r2")
    net.connect("r2", "r3")
    fa, fb, fc = flow(LSID, 1), flow(LSID, 2), flow(LSID, 3)
    e2, e2b, e3 = net.endpoint("e2", "r2"), net.endpoint("e2b", "r2"), net.endpoint("e3", "r3")
    e2.join(fa, [32])
    assert [a.status for a in e2.acks(fa)] == [C.JoinStatus.OK]
    # directly at the full router
    e2.join(fc, [32])
    assert [a.status for a in e2.acks(fc)] == [C.JoinStatus.LIMIT]
    # from further down: the refusal cascades and r3 forgets the flow
    e3.join(fb, [32])
    assert [a.status for a in e3.acks(fb)] == [C.JoinStatus.LIMIT]
    assert net.has_state(fb) == [] and net.has_state(fc) == []
    assert net.routers["r2"].counters["refused.flow-limit"] == 2
    # a flow it already has still takes new members
    e2b.join(fa, [33])
    assert [a.status for a in e2b.acks(fa)] == [C.JoinStatus.OK]
    assert len(net.routers["r2"].flows) == 1


def test_join_timeout():
    net = CoreNet(epoch_length=1.0, join_timeout=5.0)
    net.router("r1", accept_routers=frozenset({("fake", "fake")}))
    fake = net.endpoint("fake", "r1", role=C.Role.ROUTER, silent=True)  # a router that hangs
    fake.control(LINK_KEY, C.LsRoutes(((0x20, 0),)))
    r1 = net.routers["r1"]
    assert r1.routing.link_for(0x20) == fake.link_id
    f = flow(0x20)
    e = net.endpoint("e", "r1")
    req = e.join(f, [32])
    assert len(fake.msgs(C.Join, f)) == 1
    net.run(until=5.0, step=0.5)
    assert e.acks() == [] and f.key in r1.flows
    net.run(until=6.0, step=0.5)
    assert [(a.req_id, a.status) for a in e.acks()] == [(req, C.JoinStatus.TIMEOUT)]
    assert f.key not in r1.flows
    assert r1.counters["join.timeouts"] == 1


# =========================================================================== forwarding
def test_multicast_to_receivers_on_several_routers():
    net = star(("a", "b", "c"))
    rx = {n: net.endpoint(f"rx-{n}", n) for n in ("hub", "a", "b", "c")}
    rx_b2 = net.endpoint("rx-b2", "b")
    sender = net.endpoint("tx", "b")
    for ep in [*rx.values(), rx_b2, sender]:
        ep.join(F, "data")
        assert ep.acks()[-1].status is C.JoinStatus.OK
    msgs = [b"m%d" % i for i in range(5)]
    for m in msgs:
        sender.send(F, 32, m)
    for ep in [*rx.values(), rx_b2]:
        assert ep.payloads(F) == msgs, ep  # exactly once each, in order
    assert sender.payloads(F) == []  # never back on the arrival link
    # each router-router link carried each message once
    for leaf in ("a", "c"):
        assert len(net.data_sent("hub", leaf, F)) == len(msgs)
    assert len(net.data_sent("b", "hub", F)) == len(msgs)
    assert net.data_sent("hub", "b", F) == []


def test_band_filtering_delivers_exactly_the_subscribed_bands():
    net, s, b, c, d = filter_net()
    for band in (32, 33, 40, 50, 17, 16):
        s.send(F, band, b"band %d" % band)
    assert b.bands(F) == {40} and c.bands(F) == {32} and d.bands(F) == {33}
    assert len(b.data()) == len(c.data()) == len(d.data()) == 1


def test_band_filtering_keeps_unwanted_traffic_off_links():
    net, s, b, c, d = filter_net()
    for band in (32, 33, 40, 50):
        s.send(F, band, b"band %d" % band)
    assert {fr.band for fr in net.data_sent("r1", "r2", F)} == {32, 33, 40}
    assert {fr.band for fr in net.data_sent("r2", "r3", F)} == {32, 33}
    r1, r2 = net.routers["r1"], net.routers["r2"]
    assert r1.links[net.link("r1", "r2")].tx == 3
    assert r2.links[net.link("r2", "r3")].tx == 2
    assert r2.counters["drop.band-filtered"] == 0  # r1 already filtered band 50
    assert r1.counters["drop.no-receivers"] == 1  # band 50 stopped at the core


def test_upstream_is_never_filtered():
    net, s, b, c, d = filter_net()
    c.send(F, 50, b"nobody wants 50")  # not even c's own router has a taker
    c.send(F, 32, b"32")
    assert [fr.band for fr in net.data_sent("r3", "r2", F)] == [50, 32]
    assert [fr.band for fr in net.data_sent("r2", "r1", F)] == [50, 32]
    assert net.routers["r1"].counters["drop.no-receivers"] == 2


def test_never_sent_back_on_the_arrival_link():
    net, s, b, c, d = filter_net()
    d.set_mask(F, [32, 33])
    net.clear_wires()
    c.send(F, 32, b"from C")
    assert c.payloads() == [] and d.payloads() == [b"from C"]
    assert net.data_sent("r2", "r3", F) == []  # it came up from r3
    assert net.data_sent("r1", "r2", F) == []  # it came up from r2
    assert len(net.data_sent("r3", "r2", F)) == len(net.data_sent("r2", "r1", F)) == 1


def test_non_member_sender_reaches_members_via_the_core():
    net = chain(3)
    m1, m2 = net.endpoint("m1", "r1"), net.endpoint("m2", "r2")
    m1.join(F, "data")
    m2.join(F, "data")
    outsider = net.endpoint("out", "r3")
    assert net.has_state(F) == ["r1", "r2"]
    outsider.send(F, 33, b"hello members")
    assert m1.payloads() == [b"hello members"] and m2.payloads() == [b"hello members"]
    assert net.has_state(F) == ["r1", "r2"]  # sending installs no state
    assert net.routers["r3"].counters["forward.toward-core"] == 1
    assert len(net.data_sent("r2", "r1", F)) == 1 and net.data_sent("r1", "r2", F) == []


def test_message_for_a_flow_nobody_joined_dies_at_the_core():
    net = chain(3)
    out = net.endpoint("out", "r3")
    out.send(F, 32, b"x")
    assert len(net.data_sent("r2", "r1", F)) == 1
    assert net.routers["r1"].counters["drop.no-members"] == 1
    out.send(flow(0x99), 32, b"x")
    assert net.routers["r3"].counters["drop.no-route"] == 1


def test_ttl_counts_routers():
    net = chain(3)
    s = net.endpoint("s", "r1")
    m = {n: net.endpoint(f"m{n[1]}", n) for n in ("r1", "r2", "r3")}
    for ep in m.values():
        ep.join(F, "data")
    for ttl in (0, 1, 2, 3):
        s.send(F, 32, b"ttl%d" % ttl, ttl=ttl)
    assert m["r1"].payloads() == [b"ttl1", b"ttl2", b"ttl3"]
    assert m["r2"].payloads() == [b"ttl2", b"ttl3"]
    assert m["r3"].payloads() == [b"ttl3"]
    # TTL 1 reaches the first router's endpoints only, with TTL 0
    assert m["r1"].data()[0].header.ttl == 0
    assert [fr.header.ttl for fr in m["r3"].data()] == [0]
    assert [fr.header.ttl for fr in m["r2"].data()] == [0, 1]
    assert net.routers["r1"].counters["drop.ttl"] == 2  # ttl 0 on arrival; ttl 1 toward r2


def _locality_net():
    """r1(core) -2-> r2 -2-> r3 in geography cost; m1b hangs off r1 at cost 1."""
    net = CoreNet()
    net.router("r1", core_lsids=frozenset({LSID}))
    net.router("r2")
    net.router("r3")
    geo2 = Modifiers(geography=2)
    net.connect("r1", "r2", mods_a=geo2, mods_b=geo2)
    net.connect("r2", "r3", mods_a=geo2, mods_b=geo2)
    s = net.endpoint("s", "r1")
    m = {n: net.endpoint(f"m{n[1]}", n) for n in ("r1", "r2", "r3")}
    m1b = net.endpoint("m1b", "r1", modifiers=Modifiers(geography=1, delay=7))
    for ep in [*m.values(), m1b]:
        ep.join(F, "data")
    return net, s, m, m1b


def test_locality_budget_per_outgoing_link_modifier():
    net, s, m, m1b = _locality_net()
    geo = Locality.GEOGRAPHY
    for value in (0, 1, 2, 3, 4):
        s.send(F, 32, b"g%d" % value, loc_type=geo, loc_value=value)
    assert m["r1"].payloads() == [b"g0", b"g1", b"g2", b"g3", b"g4"]  # zero-cost link
    assert m1b.payloads() == [b"g1", b"g2", b"g3", b"g4"]  # costs 1: value 0 stays off it
    assert m["r2"].payloads() == [b"g2", b"g3", b"g4"]
    assert m["r3"].payloads() == [b"g4"]
    # the budget left is written into each copy's header
    assert [fr.header.loc_value for fr in m1b.data()] == [0, 1, 2, 3]
    assert [fr.header.loc_value for fr in m["r2"].data()] == [0, 1, 2]
    assert [fr.header.loc_value for fr in m["r3"].data()] == [0]
    assert all(fr.header.loc_type == geo for fr in m["r3"].data())
    assert net.routers["r1"].counters["drop.locality"] == 3  # g0 to m1b, g0 and g1 to r2


def test_locality_only_charges_its_own_type():
    net, s, m, m1b = _locality_net()
    s.send(F, 32, b"bw0", loc_type=Locality.BANDWIDTH, loc_value=0)  # no bandwidth costs
    s.send(F, 32, b"d6", loc_type=Locality.DELAY, loc_value=6)  # only m1b charges delay (7)
    for ep in m.values():
        assert ep.payloads() == [b"bw0", b"d6"]
    assert m1b.payloads() == [b"bw0"]
    assert m["r3"].data()[1].header.loc_value == 6


def test_locality_limits_the_way_up_too():
    net, s, m, m1b = _locality_net()
    m["r3"].send(F, 32, b"near", loc_type=Locality.GEOGRAPHY, loc_value=1)
    m["r3"].send(F, 32, b"far", loc_type=Locality.GEOGRAPHY, loc_value=2)
    assert [fr.payload for fr in net.data_sent("r3", "r2", F)] == [b"far"]
    assert m["r2"].payloads() == [b"far"] and m["r1"].payloads() == []


def test_payload_too_big_for_a_link_is_dropped_for_that_link_only():
    net = chain(2)
    small = net.endpoint("small", "r2", hello=False)
    small.hello(max_payload=10)
    big = net.endpoint("big", "r2")
    small.join(F, "data")
    big.join(F, "data")
    s = net.endpoint("s", "r1")
    s.send(F, 32, b"x" * 11)
    s.send(F, 32, b"y" * 10)
    assert big.payloads() == [b"x" * 11, b"y" * 10]
    assert small.payloads() == [b"y" * 10]
    assert net.routers["r2"].counters["drop.too-big-for-link"] == 1


# =========================================================================== masks, leave
def test_mask_aggregation_at_every_hop():
    net, s, b, c, d = filter_net()
    r1, r2, r3 = (net.entry(n, F) for n in ("r1", "r2", "r3"))
    assert r3.down == {c.link_id: bits(32), d.link_id: bits(33)} and r3.agg == bits(32, 33)
    assert r2.down == {b.link_id: bits(40), net.link("r2", "r3"): bits(32, 33)}
    assert r1.down == {net.link("r1", "r2"): bits(32, 33, 40)}
    d.set_mask(F, [34, 35])
    assert r3.agg == bits(32, 34, 35)
    assert r2.down[net.link("r2", "r3")] == bits(32, 34, 35)
    assert r1.down[net.link("r1", "r2")] == bits(32, 34, 35, 40)
    net.clear_wires()
    s.send(F, 33, b"33")
    s.send(F, 35, b"35")
    assert d.payloads() == [b"35"]
    assert {fr.band for fr in net.data_sent("r1", "r2", F)} == {35}


def test_unchanged_aggregate_is_not_pushed_up():
    net, s, b, c, d = filter_net()
    e = net.endpoint("E", "r3")
    e.join(F, [32])  # r3's aggregate does not change
    assert net.control_sent("r3", "r2", C.Mask, F) == []
    assert net.control_sent("r3", "r2", C.Join, F) == []


def test_leave_narrows_masks_hop_by_hop_and_removes_empty_entries():
    net, s, b, c, d = filter_net()
    lk12, lk23 = net.link("r1", "r2"), net.link("r2", "r3")
    d.leave(F)
    assert net.entry("r3", F).down == {c.link_id: bits(32)}
    assert net.entry("r2", F).down[lk23] == bits(32)
    assert net.entry("r1", F).down[lk12] == bits(32, 40)
    c.leave(F)  # r3 has no one left: it leaves r2 and forgets the flow
    assert net.has_state(F) == ["r1", "r2"]
    assert net.entry("r2", F).down == {b.link_id: bits(40)}
    assert net.entry("r1", F).down[lk12] == bits(40)
    assert len(net.control_sent("r3", "r2", C.Leave, F)) == 1
    net.clear_wires()
    s.send(F, 32, b"no one")
    s.send(F, 40, b"b")
    assert net.data_sent("r2", "r3", F) == [] and [fr.band for fr in
                                                  net.data_sent("r1", "r2", F)] == [40]
    b.leave(F)
    assert net.has_state(F) == []
    assert not any(F.key in r.links[lk].dependent for r in net.routers.values()
                   for lk in r.links)


def test_stale_leave_and_mask_are_counted_not_fatal():
    net = chain(2)
    e = net.endpoint("e", "r2")
    e.leave(F)
    e.set_mask(F, [32])
    r2 = net.routers["r2"]
    assert r2.counters["control.stale-leave"] == 1 and r2.counters["control.stale-mask"] == 1
    assert e.link_id in r2.links and net.closes == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.integers(min_value=32, max_value=39)), min_size=3, max_size=3),
       st.sampled_from(["r1", "r3"]))
def test_property_receivers_get_their_bands_and_links_carry_only_what_is_below(masks, origin):
    net = chain(3)
    rx = [net.endpoint(f"rx{i}", f"r{i + 1}") for i in range(3)]
    for ep, m in zip(rx, masks):
        ep.join(F, sorted(m))
    sender = net.endpoint("s", origin)
    net.clear_wires()
    for band in range(32, 40):
        sender.send(F, band, bytes([band]))
    for ep, m in zip(rx, masks):
        assert [fr.band for fr in ep.data(F)] == sorted(m)
    if origin == "r1":
        assert {fr.band for fr in net.data_sent("r1", "r2", F)} == masks[1] | masks[2]
        assert {fr.band for fr in net.data_sent("r2", "r3", F)} == masks[2]
    else:  # from the bottom: upstream unfiltered, downstream filtered
        assert [fr.band for fr in net.data_sent("r3", "r2", F)] == list(range(32, 40))
        assert [fr.band for fr in net.data_sent("r2", "r1", F)] == list(range(32, 40))
        assert net.data_sent("r2", "r3", F) == [] and net.data_sent("r1", "r2", F) == []
