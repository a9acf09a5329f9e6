"""The deterministic simulator: real routers over virtual links, in virtual time. (Faults,
slow and lossy links and partitions: test_sim_faults.py; shared pieces: simnet.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowrouter.core.router import Router, RouterParams
from flowrouter.core.tables import Modifiers
from flowrouter.testbed.sim import SimNetwork, SimulationError, cli_main
from flowrouter.testbed.sim.engine import EventQueue
from flowrouter.testbed.sim.generate import random_mesh, tree
from flowrouter.testbed.sim.workload import SharedFlowWorkload, default_flow
from flowrouter.wire import control as C

from .checkout import with_checkout
from .simnet import FLOW, TOPOLOGIES, join_all, senders_of, topo

# ---------------------------------------------------------------------------- engine


def test_event_queue_orders_by_time_then_schedule_order() -> None:
    q = EventQueue()
    seen: list[str] = []
    q.schedule(2.0, seen.append, "late")
    q.schedule(1.0, seen.append, "first")
    q.schedule(1.0, seen.append, "second")
    q.run_until(1.5)
    assert seen == ["first", "second"] and q.now == 1.5
    with pytest.raises(ValueError):
        q.schedule(1.0, seen.append, "past")
    q.run_until(5)
    assert seen[-1] == "late" and q.processed == 3


# ---------------------------------------------------------------------------- basic delivery


def test_two_site_multicast_and_join_acks() -> None:
    net = SimNetwork.from_topology(topo("two-site"), seed=1)
    join_all(net)
    net.run_until(3.0)
    for ep in net.endpoints.values():
        assert ep.is_joined(FLOW), (ep.name, ep.acks)
        assert ep.acks[-1].status is C.JoinStatus.OK
        assert ep.router_hello is not None and ep.router_hello.name == ep.router
    net.endpoints["alice"].send(FLOW, 32, b"alice|0")
    net.endpoints["carol"].send(FLOW, 40, b"carol|not-wanted")  # nobody listens on 40
    net.run_until(4.0)
    assert net.endpoints["bob"].payloads(FLOW) == [b"alice|0"]
    assert net.endpoints["carol"].payloads(FLOW) == [b"alice|0"]
    assert net.endpoints["alice"].payloads(FLOW) == []  # never back to the sender
    d = net.endpoints["carol"].deliveries[0]
    assert d.band == 32 and d.flow == FLOW and d.ttl == 32 - 2
    # WAN delay is 20 ms; the LAN path to bob is much faster
    assert d.time - 3.0 > 0.02 > net.endpoints["bob"].deliveries[0].time - 3.0
    counters = net.router_counters()
    assert counters["drop.band-filtered"] + counters["drop.no-receivers"] >= 1
    assert not net.errors


def test_multicast_across_seed003_testbed_reaches_all_sites() -> None:
    net = SimNetwork.from_topology(topo("seed003-testbed"), seed=3)
    join_all(net)
    net.run_until(3.0)
    for name in ("metropol-client", "commonwe-client", "kingdom-client", "republic-client"):
        net.endpoints[name].send(FLOW, 32, f"{name}|hello".encode())
    net.run_until(5.0)
    sites = ["metropol", "commonwe", "kingdom", "republic"]
    for site in sites:
        got = senders_of(net.endpoints[f"{site}-client"])
        assert set(got) == {f"{s}-client" for s in sites if s != site}
    assert set(senders_of(net.endpoints["leader"])) == {f"{s}-client" for s in sites}
    # 56 kbit/s: a ~40-byte frame takes ~6 ms per hop; delivery well under a second
    for ep in net.endpoints.values():
        assert all(3.0 < d.time < 3.5 for d in ep.deliveries)


def test_linear_array_end_to_end() -> None:
    net = SimNetwork.from_topology(topo("linear-20"), seed=0)
    join_all(net)
    net.run_until(20.0)
    assert all(ep.is_joined(FLOW) for ep in net.endpoints.values())
    net.endpoints["r01-ua"].send(FLOW, 32, b"r01|across the array")
    net.run_until(40.0)
    (d,) = net.endpoints["r20-ua"].received(FLOW)
    assert d.payload == b"r01|across the array"
    # 19 router-to-router hops at 4800 bit/s for a 44-byte frame, each ~73 ms; on such slow
    # links a frame may also wait behind a soft-state ECHO or digest (a few per hop and
    # second), so allow a quarter more
    serial = 19 * 44 * 8 / 4800
    assert serial <= d.time - 20.0 <= 1.25 * serial
    assert d.ttl == 32 - 20
    assert all(len(ep.deliveries) == 1 for n, ep in net.endpoints.items() if n != "r01-ua")


@pytest.mark.parametrize("name", ["ring-bi-20", "cdnnet-15"])
def test_seed000_meshes_route_to_everyone(name: str) -> None:
    net = SimNetwork.from_topology(topo(name), seed=2)
    join_all(net)
    net.run_until(20.0)
    names = list(net.endpoints)
    for n in (names[0], names[len(names) // 2], names[-1]):
        net.endpoints[n].send(FLOW, 32, f"{n}|x".encode())
    net.run_until(40.0)
    for n, ep in net.endpoints.items():
        expected = {names[0], names[len(names) // 2], names[-1]} - {n}
        assert set(senders_of(ep)) == expected, n
    assert not net.errors


def test_unidirectional_ring_carries_data_clockwise_only() -> None:
    net = SimNetwork.from_topology(topo("ring-uni-20"), seed=0)
    join_all(net)
    net.run_until(30.0)
    assert all(ep.is_joined(FLOW) for ep in net.endpoints.values())
    assert net.path(FLOW.key, "r20") == [f"r{i:02d}" for i in range(20, 0, -1)]
    net.endpoints["r01-ua"].send(FLOW, 32, b"r01|from the core")
    net.endpoints["r05-ua"].send(FLOW, 32, b"r05|from a member")
    net.run_until(60.0)
    for i in range(2, 21):
        got = senders_of(net.endpoints[f"r{i:02d}-ua"])
        assert "r01" in got, i  # down the tree = clockwise: everyone
        assert ("r05" in got) == (i > 5), i  # r05's copy toward the core is refused
    assert net.links["r04-r05"].ba.drops["oneway"] == 1
    assert sum(lk.ab.drops["oneway"] for lk in net.links.values()) == 0


# ---------------------------------------------------------------------------- determinism


def _traced_run(seed: int, loss: float) -> list:  # noqa: ANN401
    net = SimNetwork.from_topology(topo("two-site"), seed=seed, scenario="wan-flap",
                                   trace=True)
    for name in net.links:
        if net.links[name].kind == "router":
            net.set_link(name, loss=loss)
    wl = SharedFlowWorkload(net, default_flow(net.topology), rate=5.0, size=100, start=1.0)
    wl.install()
    net.run_until(40.0)
    assert wl.delivered > 100
    assert net.trace is not None
    return net.trace


def test_same_seed_gives_identical_traces_and_seeds_differ_with_loss() -> None:
    one = _traced_run(11, 0.05)
    two = _traced_run(11, 0.05)
    assert len(one) > 1000
    assert one == two
    assert {r.event for r in one} >= {"send", "deliver", "down", "up", "drop"}
    other = _traced_run(12, 0.05)
    assert other != one


def test_write_trace_jsonl(tmp_path: Path) -> None:
    net = SimNetwork.from_topology(topo("two-site"), seed=0, trace=True)
    join_all(net)
    net.run_until(2.0)
    out = tmp_path / "trace.jsonl"
    n = net.write_trace(out)
    lines = out.read_text().splitlines()
    assert n == len(lines) > 10
    rec = json.loads(lines[0])
    assert set(rec) == {"time", "event", "link", "node", "band", "size", "detail"}


# ---------------------------------------------------------------------------- protocol details


def test_endpoint_refresh_digests_keep_idle_members() -> None:
    net = SimNetwork(seed=0)
    soft = dict(refresh_interval=1.0, hold_factor=3.0, liveness_interval=0.5, dead_after=1.5)
    net.add_router("r1", core_lsids=[0x10], **soft)
    net.add_router("r2", **soft)
    net.add_link("r1", "r2", delay=0.01)
    a = net.add_endpoint("a", "r1", refresh_interval=1.0)
    b = net.add_endpoint("b", "r2", refresh_interval=1.0)
    join_all(net)
    net.run_until(30.0)  # 10 hold times, idle: only the digests keep the state
    assert b.counters["refresh.rounds"] > 25
    assert net.routers["r1"].counters["refresh.rounds-received"] > 25  # from r2 and a
    assert net.routers["r1"].counters["gc.links-collected"] == 0
    a.send(FLOW, 32, b"a|still there")
    net.run_until(31.0)
    assert b.payloads(FLOW) == [b"a|still there"]
    b.leave(FLOW)
    net.run_until(32.0)
    a.send(FLOW, 32, b"a|gone")
    net.run_until(33.0)
    assert b.payloads(FLOW) == [b"a|still there"]
    assert FLOW.key not in net.routers["r2"].flows


def test_locality_and_ttl_limit_reach() -> None:
    net = SimNetwork.from_topology(topo("two-site"), seed=0)
    join_all(net)
    net.run_until(3.0)
    alice = net.endpoints["alice"]
    # geography costs: endpoint links 1, van-1 - van-2 2, WAN 3; budget 3 stays in Vancouver
    alice.send(FLOW, 32, b"alice|local", locality=("geography", 3))
    # TTL counts routers: van-1 does not hand a TTL-0 copy to another router
    alice.send(FLOW, 32, b"alice|ttl1", ttl=1)
    alice.send(FLOW, 32, b"alice|ttl2", ttl=2)
    net.run_until(4.0)
    assert net.endpoints["bob"].payloads(FLOW) == [b"alice|local", b"alice|ttl2"]
    assert net.endpoints["carol"].payloads(FLOW) == [b"alice|ttl2"]
    assert net.endpoints["carol"].deliveries[0].ttl == 0
    counters = net.router_counters()
    assert counters["drop.locality"] >= 1 and counters["drop.ttl"] >= 1


def test_advertise_lets_a_sender_reach_members() -> None:
    net = SimNetwork.from_topology(topo("two-site"), seed=0)
    net.endpoints["bob"].join(FLOW, 32)
    net.endpoints["carol"].advertise(FLOW)
    net.run_until(3.0)
    assert net.endpoints["carol"].is_joined(FLOW)
    net.endpoints["carol"].send(FLOW, 32, b"carol|adv")
    net.run_until(4.0)
    assert net.endpoints["bob"].payloads(FLOW) == [b"carol|adv"]
    assert net.endpoints["carol"].deliveries == []


def test_router_exceptions_strict_and_lenient() -> None:
    class Faulty(Router):
        def tick(self, now: float):  # noqa: ANN201
            if now > 1.0:
                raise RuntimeError("boom")
            return super().tick(now)

    def factory(p: RouterParams, now: float) -> Router:
        return Faulty(p, now=now) if p.name == "r2" else Router(p, now=now)

    for strict in (True, False):
        net = SimNetwork(seed=0, strict=strict, router_factory=factory)
        net.add_router("r1", core_lsids=[0x10])
        net.add_router("r2")
        net.add_link("r1", "r2")
        if strict:
            with pytest.raises(SimulationError, match="router r2 raised in tick"):
                net.run_until(2.0)
        else:
            net.run_until(2.0)
            assert net.errors and net.errors[0][1:3] == ("r2", "tick")
            assert net.counters["router-errors"] == len(net.errors) == 10


def test_hand_built_network_validates() -> None:
    net = SimNetwork(seed=0)
    net.add_router("r1")
    with pytest.raises(ValueError, match="duplicate node name"):
        net.add_router("r1")
    with pytest.raises(KeyError):
        net.add_link("r1", "nope")
    with pytest.raises(ValueError):
        net.add_link("r1", "r1")
    net.add_router("r2")
    with pytest.raises(ValueError, match="loss"):
        net.add_link("r1", "r2", loss=2.0)
    with pytest.raises(KeyError):
        net.add_endpoint("e", "nope")
    with pytest.raises(KeyError, match="no scenario"):
        SimNetwork.from_topology(topo("two-site"), scenario="nope")
    net.add_link("r1", "r2", modifiers=Modifiers(geography=3))
    with pytest.raises(KeyError):
        net.link_down("nope")


# ---------------------------------------------------------------------------- scale and CLI


def test_generated_topologies_run() -> None:
    mesh = random_mesh(60, degree=4, endpoints=10, seed=3, check=True)
    assert len(mesh.routers) == 60 and len(mesh.endpoints) == 10
    assert random_mesh(60, degree=4, endpoints=10, seed=3) == mesh
    net = SimNetwork.from_topology(mesh, seed=3)
    wl = SharedFlowWorkload(net, default_flow(mesh), rate=2.0, start=3.0)
    wl.install()
    net.run_until(10.0)
    s = wl.summary()
    assert s["sent"] > 50 and s["delivery_ratio"] > 0.95 and s["duplicates"] == 0
    t = tree(40, fanout=3, endpoints=5)
    assert len(t.links) == 39


def test_cli_summary_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main([str(TOPOLOGIES / "seed003-testbed.toml"), "--scenario", "A1", "--seed",
                   "2", "--duration", "30", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    assert s["scenario"] == "A1" and s["seed"] == 2 and s["virtual_time"] == 30.0
    m = s["messages"]
    assert m["sent"] > 100 and 0.5 < m["delivery_ratio"] < 1.0  # metropol cut 10-20 s
    assert s["drops"]  # drops are reported by reason
    assert {lk["name"] for lk in s["links_traffic"]} >= {"metropol-hub", "kingdom-republic"}
    assert s["events"] > 0 and s["router_error_count"] == 0


def test_cli_text_and_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli_main([str(TOPOLOGIES / "two-site.toml"), "--duration", "5"]) == 0
    out = capsys.readouterr().out
    assert "messages on flow" in out and "per-link traffic" in out and "van-1-bos-1" in out
    assert cli_main([str(TOPOLOGIES / "two-site.toml"), "--list-scenarios"]) == 0
    assert "wan-flap" in capsys.readouterr().out
    assert cli_main([str(TOPOLOGIES / "two-site.toml"), "--scenario", "nope"]) == 2
    assert "no scenario 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[[routers]]\nname = "a"\n[[links]]\na = "a"\nb = "x"\n')
    assert cli_main([str(bad)]) == 2
    assert f"{bad}:5: " in capsys.readouterr().err


_DETERMINISM_SCRIPT = """
import hashlib
from flowrouter.testbed import topology
from flowrouter.wire.flowid import FlowID
from flowrouter.testbed.sim import SimNetwork
from flowrouter.testbed.sim.workload import SharedFlowWorkload, default_flow
t = topology.load({path!r})
net = SimNetwork.from_topology(t, seed=5, scenario="A2", trace=True)
for n, lk in net.links.items():
    if lk.kind == "router":
        net.set_link(n, loss=0.02)
SharedFlowWorkload(net, default_flow(t), rate=2, start=1).install()
for ep in net.endpoints.values():
    ep.join(FlowID(0x77, 0x10, 2), 33)
net.run_until(25)
print(hashlib.sha256(repr(net.trace).encode()).hexdigest())
"""


def test_traces_identical_across_processes() -> None:
    import os
    import subprocess
    import sys

    script = _DETERMINISM_SCRIPT.format(path=str(TOPOLOGIES / "seed003-testbed.toml"))
    digests = set()
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed,
               "PYTHONPATH": with_checkout(os.environ.get("PYTHONPATH"))}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, check=True, timeout=120)
        digests.add(out.stdout.strip())
    assert len(digests) == 1
