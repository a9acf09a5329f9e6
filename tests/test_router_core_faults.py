"""The sans-I/O router core under faults: malformed input from endpoints and routers,
links that go down (entries removed, masks narrowed, subtrees regrafted), and router
claims it cannot prove; driven by corenet.py's in-memory harness (the rest of the
core is in test_router_core.py)."""

from __future__ import annotations

import pytest

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_GC, BAND_MEMBERSHIP, mask_of
from flowrouter.wire.header import pack_header

try:  # tests/ as a package or as a plain directory on sys.path
    from .corenet import LINK_KEY, LSID, SOFT, CoreNet, bits, chain, diamond, filter_net, flow
except ImportError:
    from corenet import LINK_KEY, LSID, SOFT, CoreNet, bits, chain, diamond, filter_net, flow

F = flow(LSID)


# =========================================================================== malformed input
def _malformed_net():
    net = chain(3)
    e1, e3 = net.endpoint("e1", "r1"), net.endpoint("e3", "r3")
    e3.join(F, "data")
    return net, e1, e3


def _still_works(net, e1, e3, tag=b"still works"):
    e1.send(F, 32, tag)
    assert e3.payloads()[-1] == tag


@pytest.mark.parametrize("payload, reason", [
    (b"\x07\x0a", "bad-version"),
    (b"", "bad-control"),
    (C.Join(1, 0).encode()[:-3], "bad-control"),  # truncated
    (C.Hello(1, C.Role.ENDPOINT, "again", 100).encode(), "bad-control"),  # not on a flow
])
def test_garbage_on_a_control_band_drops_that_endpoint_link_only(payload, reason):
    net, e1, e3 = _malformed_net()
    bad = net.endpoint("bad", "r2")
    bad.send_raw(pack_header(F.key, len(payload), BAND_MEMBERSHIP), payload)
    r2 = net.routers["r2"]
    assert [(n, lk) for n, lk, _ in net.closes] == [("r2", bad.link_id)]
    assert r2.counters[f"malformed.{reason}"] == 1 and r2.counters["malformed"] == 1
    assert bad.link_id not in r2.links
    (err,) = bad.msgs(C.Error)
    assert reason in err.text
    assert set(r2.links) == {net.link("r2", "r1"), net.link("r2", "r3")}
    _still_works(net, e1, e3)


def test_garbage_on_the_gc_band_and_on_the_link_local_flow():
    net, e1, e3 = _malformed_net()
    b1, b2 = net.endpoint("b1", "r2"), net.endpoint("b2", "r2")
    b1.send_raw(pack_header(F.key, 3, BAND_GC), b"\x01\x0e\x00")  # PING cut short
    body = C.Join(1, 0).encode()  # a flow message on the link-local flow
    b2.send_raw(pack_header(LINK_KEY, len(body), BAND_MEMBERSHIP), body)
    r2 = net.routers["r2"]
    assert r2.counters["malformed.bad-control"] == 2
    assert {lk for _, lk, _ in net.closes} == {b1.link_id, b2.link_id}
    _still_works(net, e1, e3)


def test_bad_hello_drops_the_link():
    net, e1, e3 = _malformed_net()
    bad = net.endpoint("bad", "r2", hello=False)
    raw = C.Hello(5, C.Role.ENDPOINT, "bad", 100).encode()
    raw = raw[:2] + b"WOLF" + raw[6:]
    bad.send_raw(pack_header(LINK_KEY, len(raw), BAND_MEMBERSHIP), raw)
    r2 = net.routers["r2"]
    assert r2.counters["malformed.bad-hello"] == 1
    assert [(n, lk) for n, lk, _ in net.closes] == [("r2", bad.link_id)]
    _still_works(net, e1, e3)


@pytest.mark.parametrize("first", ["data", "join"])
def test_anything_before_hello_drops_the_link(first):
    net, e1, e3 = _malformed_net()
    bad = net.endpoint("bad", "r2", hello=False)
    if first == "data":
        bad.send(F, 32, b"too early")
    else:
        bad.join(F, "data")
    r2 = net.routers["r2"]
    assert r2.counters["malformed.no-hello"] == 1
    assert [(n, lk) for n, lk, _ in net.closes] == [("r2", bad.link_id)]
    assert e3.payloads() == []  # the early data went nowhere
    _still_works(net, e1, e3)


def test_malformed_frame_from_a_router_drops_only_that_router_link():
    net, e1, e3 = _malformed_net()
    e2 = net.endpoint("e2", "r2")
    e2.join(F, "data")
    net.inject("r3", "r2", pack_header(F.key, 2, BAND_MEMBERSHIP), b"\x01\x0a")  # JOIN cut
    r2 = net.routers["r2"]
    assert r2.counters["malformed.bad-control"] == 1
    assert net.closes[0][:2] == ("r2", net.link("r2", "r3"))
    assert net.link("r2", "r3") not in r2.links
    assert net.link("r3", "r2") not in net.routers["r3"].links  # r3 saw the close
    assert net.link("r2", "r1") in r2.links
    e1.send(F, 32, b"r1-r2 still works")
    assert e2.payloads() == [b"r1-r2 still works"]
    assert net.entry("r2", F).down == {e2.link_id: mask_of("data")}


def test_error_from_the_peer_during_handshake_closes_quietly():
    net = chain(1)
    ep = net.endpoint("e", "r1", hello=False)
    ep.control(LINK_KEY, C.Error(3, "go away"))
    assert [(n, lk, why) for n, lk, why in net.closes] == [("r1", ep.link_id,
                                                              "refused by peer")]
    assert net.routers["r1"].counters["malformed"] == 0


# =========================================================================== link down
def test_link_down_removes_downstream_entries():
    net = chain(3)
    e2, e3 = net.endpoint("e2", "r2"), net.endpoint("e3", "r3")
    e2.join(F, [32])
    e3.join(F, [33])
    lk23 = net.link("r2", "r3")
    assert F.key in net.routers["r2"].links[lk23].dependent
    net.cut("r2", "r3")
    assert net.entry("r2", F).down == {e2.link_id: bits(32)}
    assert lk23 not in net.entry("r2", F).traffic
    assert net.routers["r3"].counters["flows.orphaned"] == 1
    net.disconnect(e2)  # r2's last member goes: r2 leaves r1, r1 forgets the flow
    assert net.has_state(F) == ["r3"]


def test_endpoint_disconnect_narrows_masks_via_leave_cascade():
    net, s, b, c, d = filter_net()
    net.disconnect(c)
    net.disconnect(d)
    assert net.has_state(F) == ["r1", "r2"]
    assert net.entry("r1", F).down == {net.link("r1", "r2"): bits(40)}


def test_downstream_link_down_narrows_the_mask_upstream():
    net, s, b, c, d = filter_net()
    net.cut("r2", "r3")  # C and D (bands 32, 33) are behind r3
    assert net.entry("r2", F).agg == bits(40)
    assert net.entry("r1", F).down[net.link("r1", "r2")] == bits(40)
    net.clear_wires()
    s.send(F, 32, b"nobody below r2 wants this")
    assert net.data_sent("r1", "r2", F) == []


def test_endpoint_link_down_narrows_the_mask_upstream():
    net, s, b, c, d = filter_net()
    net.disconnect(d)  # C still holds r3's entry; band 33 has no taker any more
    assert net.entry("r3", F).down == {c.link_id: bits(32)}
    net.clear_wires()
    s.send(F, 33, b"33")
    assert d.payloads() == []
    assert net.entry("r3", F).agg == bits(32)
    assert net.data_sent("r2", "r3", F) == []


def test_upstream_link_down_rejoins_by_another_route_and_faults_reach_band_17():
    net = diamond()
    e1a, e1b = net.endpoint("e1a", "r1"), net.endpoint("e1b", "r1")
    e4a, e4b = net.endpoint("e4a", "r4"), net.endpoint("e4b", "r4")
    for ep, m in ((e1a, [32, BAND_FAULT]), (e1b, [32]), (e4a, [32, BAND_FAULT]),
                  (e4b, [32])):
        ep.join(F, m)
    r1 = net.routers["r1"]
    assert net.entry("r1", F).upstream == net.link("r1", "r2")
    assert net.has_state(F) == ["r1", "r2", "r4"]
    net.cut("r1", "r2")
    entry = net.entry("r1", F)
    assert entry.upstream == net.link("r1", "r3") and entry.joined
    assert sorted(net.has_state(F)) == ["r1", "r3", "r4"]  # r2's branch state is gone
    assert set(net.entry("r4", F).down) == {net.link("r4", "r3"), e4a.link_id, e4b.link_id}
    assert r1.counters["flows.orphaned"] == 0
    # faults went to the band-17 listeners only
    (fault,) = e1a.faults(F)
    assert fault.kind is C.FaultKind.LINK_DOWN and fault.origin == "r1"
    assert fault.extra["flow"] == str(F) and fault.extra["peer"] == "r2"
    assert e4a.faults(F) and all(f.kind is C.FaultKind.LINK_DOWN for f in e4a.faults(F))
    assert e1b.faults() == [] and e4b.faults() == []
    assert e1b.data() == [] and e4b.data() == []  # faults are not data on band 32
    # traffic flows both ways over the new path, none over r2
    net.clear_wires()
    e4b.send(F, 32, b"down")
    e1b.send(F, 32, b"up")
    assert e1a.payloads() == [b"down", b"up"] and e1b.payloads() == [b"down"]
    assert e4a.payloads() == [b"down", b"up"] and e4b.payloads() == [b"up"]
    assert net.data_sent("r4", "r2", F) == []
    assert len(net.data_sent("r4", "r3", F)) == 1 and len(net.data_sent("r3", "r1", F)) == 1


def test_orphaned_subtree_keeps_local_delivery_and_regrafts_when_a_route_returns():
    net = chain(3, **SOFT)
    e1, e3a, e3b = net.endpoint("e1", "r1"), net.endpoint("e3a", "r3"), net.endpoint("e3b",
                                                                                      "r3")
    for ep in (e1, e3a, e3b):
        ep.join(F, [32, BAND_FAULT])
    net.cut("r2", "r3")
    assert e3a.faults(F) and e3b.faults(F)
    e3a.send(F, 32, b"local")
    assert e3b.payloads() == [b"local"] and e1.payloads() == []
    net.connect("r2", "r3")
    net.run(until=net.now + 2.0, step=0.25)
    entry = net.entry("r3", F)
    assert entry.upstream == net.link("r3", "r2") and entry.joined
    e1.send(F, 32, b"healed")
    assert e3a.payloads()[-1] == b"healed" and e3b.payloads()[-1] == b"healed"


def test_join_on_an_orphaned_entry_does_not_crash_the_router():
    net = chain(3)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, "data")
    net.cut("r2", "r3")  # r3 has no other way to the core: its entry is orphaned
    assert net.entry("r3", F).upstream is None
    late = net.endpoint("late", "r3")
    late.join(F, "data")  # must be answered (OK or NO_ROUTE), not crash the router
    assert len(late.acks(F)) == 1


def test_failed_regraft_does_not_silently_drop_joined_members():
    net = CoreNet(epoch_length=1.0, join_timeout=3.0)
    net.router("r1", accept_routers=frozenset({("hang", "hang")}))
    net.router("r2", core_lsids=frozenset({LSID}))
    net.connect("r1", "r2")
    hang = net.endpoint("hang", "r1", role=C.Role.ROUTER, silent=True)  # a worse, dead path
    hang.control(LINK_KEY, C.LsRoutes(((LSID, 4),)))
    e1a, e1b = net.endpoint("e1a", "r1"), net.endpoint("e1b", "r1")
    e1a.join(F, "data")
    e1b.join(F, "data")
    net.cut("r1", "r2")
    assert net.entry("r1", F).upstream == hang.link_id  # re-graft attempted via the dead path
    net.run(until=6.0, step=0.5)
    notices = e1a.faults(F) + [a for a in e1a.acks(F) if a.status is not C.JoinStatus.OK]
    e1a.send(F, 32, b"local")
    # the members keep their (orphaned) entry, so local delivery goes on
    assert F.key in net.routers["r1"].flows and e1b.payloads() == [b"local"], notices


def test_unproven_router_claim_is_refused_and_counted():
    """Issue 15: without link keys, a HELLO claiming ROUTER from a link nobody dialled and
    nobody listed is refused; a listed (name, host) pair is accepted."""
    net = CoreNet()
    r1 = net.router("r1", core_lsids=frozenset({LSID}),
                    accept_routers=frozenset({("friend", "friend")}))
    spoof = net.endpoint("mallory", "r1", role=C.Role.ROUTER)
    errors = spoof.msgs(C.Error)
    assert errors and "claims to be a router" in errors[0].text
    assert spoof.link_id not in r1.links
    assert r1.counters["refused.router-claim"] == 1
    friend = net.endpoint("friend", "r1", role=C.Role.ROUTER)
    assert r1.links[friend.link_id].role is C.Role.ROUTER
    app = net.endpoint("app", "r1")
    assert r1.links[app.link_id].role is C.Role.ENDPOINT
