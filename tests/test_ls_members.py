"""Members of one location service (several cores of one LSID) exchange subtree masks and
carry a flow's traffic across the core only to the members whose subtrees want its band."""

from __future__ import annotations

try:  # tests/ as a package or as a plain directory on sys.path
    from .corenet import LSID, CoreNet, flow
except ImportError:
    from corenet import LSID, CoreNet, flow

F = flow(LSID)


def _two_members() -> CoreNet:
    net = CoreNet()
    net.router("m1", core_lsids=frozenset({LSID}))
    net.router("m2", core_lsids=frozenset({LSID}))
    net.connect("m1", "m2")
    assert net.routers["m1"].routing.siblings(LSID) == [net.link("m1", "m2")]
    return net


def test_traffic_crosses_to_a_sibling_member_only_for_bands_its_subtree_wants():
    net = _two_members()
    a = net.endpoint("a", "m1")
    b = net.endpoint("b", "m2")
    s = net.endpoint("s", "m1")
    a.join(F, [32])
    b.join(F, [40])
    s.join(F, [])  # on the tree at m1 but listening to nothing
    net.clear_wires()
    for band in (32, 40, 50):
        s.send(F, band, b"band %d" % band)
    assert {fr.band for fr in net.data_sent("m1", "m2", F)} == {40}
    assert a.bands(F) == {32} and b.bands(F) == {40}
    assert net.routers["m1"].counters["drop.no-receivers"] == 1  # band 50


def test_traffic_from_a_sibling_goes_down_only_and_back_only_when_wanted():
    net = _two_members()
    a = net.endpoint("a", "m1")
    b = net.endpoint("b", "m2")
    a.join(F, [32])
    b.join(F, [32, 40])
    net.clear_wires()
    b.send(F, 32, b"to a")
    b.send(F, 40, b"nobody at m1 wants 40")
    assert [fr.band for fr in net.data_sent("m2", "m1", F)] == [32]
    assert a.payloads(F) == [b"to a"]
    assert net.data_sent("m1", "m2", F) == []  # never bounced back to the sibling


def test_a_sibling_whose_members_leave_stops_receiving():
    net = _two_members()
    a = net.endpoint("a", "m1")
    b = net.endpoint("b", "m2")
    a.join(F, [32])
    b.join(F, [32])
    b.leave(F)
    net.clear_wires()
    a.send(F, 32, b"only local")
    assert net.data_sent("m1", "m2", F) == []
