"""The deterministic simulator under faults: outages and cut links routed around, a one-way
outage noticed by liveness, frames lost in flight, serialisation and queue limits on slow links
(administration bands overtaking queued data), TCP and UDP under loss, a partition healing and
an orphaned subtree regrafting. Shared pieces (topologies, the flow, senders): simnet.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowrouter.testbed.sim import SimNetwork
from flowrouter.testbed.topology import Fault
from flowrouter.wire import control as C

from .simnet import FLOW, join_all, periodic_sender, senders_of, topo

# ---------------------------------------------------------------------------- faults


def test_seed003_A1_outage_stops_and_resumes_traffic() -> None:
    net = SimNetwork.from_topology(topo("seed003-testbed"), seed=1, scenario="A1")
    join_all(net)
    for name in ("metropol-client", "kingdom-client"):
        periodic_sender(net, name, 0.25, 2.0, 45.0)
    net.run_until(45.0)
    # A1: metropol is cut from everyone at 10 s and reconnects at 20 s (then 50 s...)
    k_from_m = senders_of(net.endpoints["kingdom-client"])["metropol-client"]
    m_from_k = senders_of(net.endpoints["metropol-client"])["kingdom-client"]
    for times in (k_from_m, m_from_k):
        before = [t for t in times if t < 10.0]
        during = [t for t in times if 10.1 < t < 20.0]
        after = [t for t in times if t >= 20.0]
        assert before and max(before) > 9.6  # flowing right up to the cut
        assert during == []
        assert after and min(after) < 20.0 + 3.0  # resumes within 3 s of the link
        gaps = [b - a for a, b in zip(after, after[1:])]
        assert max(gaps) < 1.0  # and keeps flowing
    # the sites that stayed connected never noticed
    c_from_k = senders_of(net.endpoints["commonwe-client"])["kingdom-client"]
    assert max(b - a for a, b in zip(c_from_k, c_from_k[1:])) < 1.0
    # the routers saw the links close and come back as fresh links
    metropol = net.routers["metropol"]
    assert metropol.counters["links.down"] == 4
    assert net.links["metropol-hub"].connects == 2
    assert not net.errors


def test_seed003_L1_reroutes_around_the_cut_link() -> None:
    net = SimNetwork.from_topology(topo("seed003-testbed"), seed=1, scenario="L1")
    join_all(net)
    periodic_sender(net, "leader", 0.25, 2.0, 30.0)
    net.run_until(30.0)
    times = senders_of(net.endpoints["metropol-client"])["leader"]
    # the overlay routes metropol's branch through another site: at most a short hiccup
    assert max(b - a for a, b in zip(times, times[1:])) < 3.0
    assert len(times) > 100
    during = net.path(FLOW.key, "metropol")
    assert during[0] == "metropol" and during[-1] == "hub"


def test_one_way_outage_is_noticed_by_liveness_and_routed_around() -> None:
    t = topo("two-site")
    net = SimNetwork.from_topology(t, seed=1, scenario="boston-cut")
    join_all(net)
    for name in ("alice", "carol"):
        periodic_sender(net, name, 0.5, 30.0, 50.0)
    net.run_until(50.0)
    # 40-45 s: frames sent by bos-1 on the main WAN link are lost. Before soft state this
    # went unnoticed; now van-1 hears nothing from bos-1 for dead_after (3 s) and drops the
    # link like a failed one, and the tree re-grafts over the backup link.
    main = net.links["van-1-bos-1"]
    assert main.ba.drops["direction-down"] > 0 and main.ab.drops["direction-down"] == 0
    assert main.connects >= 3  # the 15-25 s outage, and the one-way outage too
    assert net.routers["van-1"].counters["liveness.dead"] >= 1
    carol_at_alice = senders_of(net.endpoints["alice"])["carol"]
    during = [x for x in carol_at_alice if 40.1 < x < 45.0]
    assert during and min(during) < 40.0 + 3.0 + 1.5  # within dead_after + 1.5 s, outage on


def test_frames_in_flight_are_lost_and_routers_see_close_then_open() -> None:
    net = SimNetwork(seed=0)
    net.add_router("r1", core_lsids=[0x10])
    net.add_router("r2")
    net.add_link("r1", "r2", bandwidth=8000, delay=0.5)  # 1 ms per byte
    a = net.add_endpoint("a", "r1")
    b = net.add_endpoint("b", "r2")
    join_all(net)
    net.run_until(10.0)
    assert b.is_joined(FLOW)
    lids_before = set(net.routers["r1"].links)
    for _ in range(5):
        a.send(FLOW, 32, b"a|" + bytes(100))
    net.schedule(10.3, net.link_down, "r1-r2")
    net.schedule(12.0, net.link_up, "r1-r2")
    net.run_until(11.0)
    assert b.deliveries == []
    link = net.links["r1-r2"]
    assert link.ab.drops["in-flight"] >= 1 and not link.connected
    assert net.routers["r1"].counters["links.down"] == 1
    assert net.routers["r2"].counters["links.down"] == 1
    net.run_until(20.0)
    assert link.connected and link.connects == 2
    assert set(net.routers["r1"].links) - lids_before  # a fresh link id
    a.send(FLOW, 32, b"a|after")
    net.run_until(22.0)
    assert b.payloads(FLOW) == [b"a|after"]


def slow_pair() -> tuple[SimNetwork, Any, Any]:
    """r1 (the core) - r2 over an 80 kbit/s, 100 ms link: a 1000-byte frame takes 0.1 s to
    serialise. Endpoint ``a`` on r1, ``b`` on r2: returns ``(net, a, b)``."""
    net = SimNetwork(seed=0)
    net.add_router("r1", core_lsids=[0x10])
    net.add_router("r2")
    net.add_link("r1", "r2", bandwidth=80_000, delay=0.1)
    return net, net.add_endpoint("a", "r1"), net.add_endpoint("b", "r2")


def test_serialisation_queues_frames_fifo() -> None:
    net, a, b = slow_pair()
    join_all(net)
    net.run_until(5.0)
    for k in range(4):
        a.send(FLOW, 32, bytes([k]) * 976)  # 1000 bytes on the wire: 0.1 s each
    net.run_until(7.0)
    times = [d.time - 5.0 for d in b.deliveries]
    assert [d.payload[0] for d in b.deliveries] == [0, 1, 2, 3]
    assert times == pytest.approx([0.2001, 0.3001, 0.4001, 0.5001], abs=1e-3)


def test_administration_bands_overtake_queued_data() -> None:
    """As a router's output queue does (core.linkqueue), a repair request or heartbeat
    (bands 16..31) is served ahead of data queued on a slow link: it waits only for its own
    serialisation, and data sent after it is pushed back by as much."""
    net, a, b = slow_pair()
    for ep in (a, b):
        ep.join(FLOW, [20, 32])
    net.run_until(5.0)
    for k in range(4):
        a.send(FLOW, 32, bytes([k]) * 976)  # 1000 bytes on the wire: 0.1 s each
    a.send(FLOW, 20, b"R" * 76)  # a 100-byte repair request: 0.01 s
    a.send(FLOW, 32, bytes([4]) * 976)
    net.run_until(7.0)
    got = [(d.band, d.payload[0]) for d in b.deliveries]
    assert got[:2] == [(20, ord("R")), (32, 0)]  # ahead of the queued data
    times = {(d.band, d.payload[0]): d.time - 5.0 for d in b.deliveries}
    assert times[(20, ord("R"))] == pytest.approx(0.11, abs=2e-3)
    assert times[(32, 3)] == pytest.approx(0.5002, abs=2e-3)  # already on its way
    assert times[(32, 4)] == pytest.approx(0.6102, abs=2e-3)  # later data: 0.01 s later


def test_bandwidth_change_fault_and_queue_limit() -> None:
    net = SimNetwork(seed=0)
    net.add_router("r1", core_lsids=[0x10])
    net.add_router("r2")
    link = net.add_link("r1", "r2", bandwidth=1e6, delay=0.0, queue_limit=2500)
    a = net.add_endpoint("a", "r1")
    b = net.add_endpoint("b", "r2")
    join_all(net)
    net.apply_fault(Fault(("r1-r2",), at=5.0, until=8.0, bandwidth=8000))
    net.run_until(6.0)
    assert link.ab.bandwidth == 8000 and link.ba.bandwidth == 8000
    for _ in range(5):
        a.send(FLOW, 32, bytes(976))  # 1000-byte frames, 1 s each at 8 kbit/s
    net.run_until(7.5)
    # 2500 bytes hold two 1000-byte frames (the one on the wire counts)
    assert link.ab.drops["queue-full"] == 3
    assert len(b.deliveries) == 1
    net.run_until(9.0)
    assert link.ab.bandwidth == 1e6  # restored at `until`
    assert len(b.deliveries) == 2


def test_tcp_loss_delays_udp_loss_drops() -> None:
    results = {}
    for transport in ("tcp", "udp"):
        net = SimNetwork(seed=7)
        net.add_router("r1", core_lsids=[0x10])
        net.add_router("r2")
        net.add_link("r1", "r2", delay=0.01, transport=transport)
        a = net.add_endpoint("a", "r1")
        b = net.add_endpoint("b", "r2")
        join_all(net)
        net.run_until(2.0)
        net.set_link("r1-r2", loss=0.3)
        for k in range(200):
            net.schedule(2.0 + k * 0.01, a.send, FLOW, 32, b"a|%d" % k)
        net.run_until(30.0)
        results[transport] = (b.payloads(FLOW), net.links["r1-r2"])
    tcp_got, tcp_link = results["tcp"]
    assert tcp_got == [b"a|%d" % k for k in range(200)]  # all, in order
    assert tcp_link.ab.retransmits > 30
    udp_got, udp_link = results["udp"]
    assert 100 < len(udp_got) < 180
    assert udp_link.ab.drops["loss"] >= 200 - len(udp_got)  # (plus lost control frames)


# ---------------------------------------------------------------------------- partitions


@pytest.mark.parametrize("repair", [False, True])
def test_seed003_A2_partition_heals_for_both_sides(repair: bool) -> None:
    net = SimNetwork.from_topology(topo("seed003-testbed"), seed=4, scenario="A2",
                                   endpoint_options={"repair": repair})
    join_all(net)
    for name in ("metropol-client", "republic-client"):
        periodic_sender(net, name, 0.25, 2.0, 40.0)
    net.run_until(40.0)
    for rx, tx in (("republic-client", "metropol-client"),
                   ("metropol-client", "republic-client"),
                   ("kingdom-client", "republic-client")):
        times = senders_of(net.endpoints[rx])[tx]
        assert [t for t in times if 10.2 < t < 20.0] == [], (rx, tx)
        after = [t for t in times if t >= 20.0]
        assert after and min(after) < 24.0, (rx, tx)
        assert max(b - a for a, b in zip(after, after[1:])) < 1.0, (rx, tx)
    assert not net.errors
    repairs = sum(ep.counters["repairs"] for ep in net.endpoints.values())
    assert (repairs > 0) == repair


def test_orphaned_subtree_survives_joins_and_regrafts() -> None:
    net = SimNetwork(seed=1)
    net.add_router("r1", core_lsids=[0x10])
    net.add_router("r2")
    net.add_link("r1", "r2", delay=0.01)
    a = net.add_endpoint("a", "r1")
    b = net.add_endpoint("b", "r2")
    c = net.add_endpoint("c", "r2")
    d = net.add_endpoint("d", "r2")
    join_all(net)
    net.run_until(3.0)
    net.schedule(5.0, net.link_down, "r1-r2")
    net.schedule(7.0, b.join, FLOW, "32-33")  # r2's entry is orphaned, c and d stay
    net.schedule(9.0, net.link_up, "r1-r2")
    net.run_until(8.0)
    # Accepted as a local member of the cut-off subtree (the graft is retried meanwhile).
    assert b.acks[-1].status is C.JoinStatus.OK
    c.send(FLOW, 32, b"c|local")  # the orphan keeps local delivery going, b included
    net.run_until(15.0)
    assert d.payloads(FLOW) == [b"c|local"]
    assert b"c|local" in b.payloads(FLOW)
    assert not net.errors
    a.send(FLOW, 32, b"a|healed")
    net.run_until(16.0)
    for ep in (b, c, d):
        assert ep.payloads(FLOW)[-1] == b"a|healed", ep.name
    assert b.is_joined(FLOW)
