"""`flowrouter up`: real router processes with a fault schedule, compared with the simulator
running the same topology and schedule (issue 4: same observable effect)."""

from __future__ import annotations

import asyncio

from flownet.traffic import Traffic
from flowrouter.testbed.launcher import Launcher
from flowrouter.testbed.sim import SimNetwork
from flowrouter.testbed.topology import loads

from .ports import free_port_block

TOPO = """
name = "outage-check"
duration = 7

[defaults.link]
delay = "5ms"

[defaults.router]
base_port = {base}
epoch = 5.0

[[routers]]
name = "x1"
[[routers]]
name = "x2"

[[endpoints]]
name = "east"
router = "x1"
[[endpoints]]
name = "west"
router = "x2"

[[links]]
a = "x1"
b = "x2"

[[location_services]]
lsid = 0x10
cores = ["x1"]

[scenarios.cut]
faults = [ {{ link = "x1-x2", at = 2.0, until = 4.0 }} ]
"""

DOWN, UP = 2.0, 4.0
TOL = 0.6  # seconds: process scheduling and re-dial back-off on a loaded machine


def _free_base() -> int:
    """Two consecutive free ports: the topology's routers x1 and x2 listen on base and base+1."""
    return free_port_block(2)


def test_launcher_and_simulator_see_the_same_outage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    topo = loads(TOPO.format(base=_free_base()), source="outage-check.toml")

    # Real processes.
    launcher = Launcher(topo, scenario="cut", view=False, workdir=str(tmp_path))
    report = asyncio.run(asyncio.wait_for(Traffic(launcher, rate=10.0).run(), 120))
    assert [w for _, w in report.faults_applied] == ["x1-x2 down", "x1-x2 up"]
    real_before = report.delivered_between("west", "east", 0.5, DOWN - TOL)
    real_during = report.delivered_between("west", "east", DOWN + TOL, UP - TOL)
    real_after = report.delivered_between("west", "east", UP + 1.5, 7.0)
    assert real_before > 0 and real_after > 0
    assert real_during == 0
    assert report.counters["x1"]["links.down"] >= 1

    # The simulator, same topology and schedule.
    net = SimNetwork.from_topology(topo, seed=3, scenario="cut")
    east, west = net.endpoints["east"], net.endpoints["west"]
    from flowrouter.wire.flowid import FlowID
    flow = FlowID(0xE, 0x10, 1)
    east.join(flow, "32")
    west.join(flow, "32")
    net.run_until(0.5)
    arrivals: list[float] = []
    west.on_delivery = lambda ep, d: arrivals.append(d.time)  # type: ignore[assignment]
    t = 0.5
    while t < 7.0:
        net.schedule(t, east.send, flow, 32, b"x")
        t += 0.1
    net.run_until(7.5)
    sim_before = sum(1 for a in arrivals if a < DOWN - TOL)
    sim_during = sum(1 for a in arrivals if DOWN + TOL <= a < UP - TOL)
    sim_after = sum(1 for a in arrivals if a >= UP + 1.5)
    assert sim_before > 0 and sim_after > 0 and sim_during == 0


UDP_TOPO = """
name = "udp-check"
duration = 2

[defaults.router]
base_port = {base}

[[routers]]
name = "u1"
[[routers]]
name = "u2"
[[routers]]
name = "u3"

[[endpoints]]
name = "east"
router = "u1"
[[endpoints]]
name = "west"
router = "u3"

[[links]]
a = "u1"
b = "u2"
[[links]]
a = "u2"
b = "u3"
transport = "udp"

[[location_services]]
lsid = 0x10
cores = ["u1"]
"""


def test_up_brings_a_udp_link_up_and_flags_links_that_never_came_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from flowrouter.testbed.launcher import LaunchReport, summarize

    topo = loads(UDP_TOPO.format(base=_free_base()), source="udp-check.toml")
    launcher = Launcher(topo, view=False, workdir=str(tmp_path))
    report = asyncio.run(asyncio.wait_for(Traffic(launcher, rate=5.0).run(), 120))
    assert launcher.links_seen_up == {lk.name for lk in topo.links}
    assert report.links_never_up == [] and "NEVER" not in summarize(report)
    assert report.delivered_between("west", "east", 0.0, 2.0) > 0  # across the UDP link
    bad = LaunchReport("t", None, 1.0, links_never_up=["backup (a-b, udp)"])
    assert "LINK NEVER CAME UP: backup (a-b, udp)" in summarize(bad)


def test_a_router_whose_control_port_was_taken_starts_again_on_another(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Ports are checked free, not reserved: another process may bind one before the router
    does (a CI run lost a router so: 'address already in use' on its control port, exit
    code 1). The launcher chose that port itself, so it starts the router again on another
    one instead of giving up; the topology's own ports it cannot move."""
    import socket

    from flowrouter.testbed import launcher as launcher_module
    from flowrouter.testbed.launcher import query_control

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    picks = [port]
    real = launcher_module.free_port

    def pick(host: str = "127.0.0.1") -> int:
        return picks.pop() if picks else real(host)

    monkeypatch.setattr(launcher_module, "free_port", pick)
    topo = loads(TOPO.format(base=_free_base()), source="taken.toml")

    async def main() -> None:
        la = Launcher(topo, view=False, workdir=str(tmp_path))
        try:
            await la.start_routers()
            ctl = la.control["x1"]
            assert ctl != f"127.0.0.1:{port}" and not picks
            await query_control(ctl, "ping", timeout=5.0)
            await query_control(la.control["x2"], "ping", timeout=5.0)
        finally:
            await la.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        taken.close()
