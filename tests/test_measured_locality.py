"""Measured locality (flowrouter.core.measured): samples -> smoothed values -> modifier units.

Sans-I/O: samples and the clock are passed in. Checks the mapping, the hysteresis (no flap at
a unit boundary), the hold time, refusal of hostile samples, that geography stays configured,
and, in the simulator, that a measured slow link's larger delay modifier stops a
delay-limited message from crossing it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

from flowrouter.core.measured import LinkMeter, LocalityMapping
from flowrouter.core.tables import Modifiers

if TYPE_CHECKING:
    from flowrouter.net.runtime import RouterNode
    from flowrouter.wire.flowid import FlowID


def feed(meter: LinkMeter, rtt: float, n: int, t0: float, dt: float = 1.0) -> float:
    t = t0
    for _ in range(n):
        meter.rtt_sample(rtt, t)
        t += dt
    return t


def test_slower_link_gets_larger_delay_modifier() -> None:
    fast, slow = LinkMeter(), LinkMeter()
    feed(fast, 0.002, 10, 0.0)  # 1 ms one way: 0.2 units -> 0
    feed(slow, 0.100, 10, 0.0)  # 50 ms one way: 10 units
    assert fast.delay == 0 and slow.delay == 10
    conf = Modifiers(bandwidth=1, delay=1, geography=3)
    assert slow.modifiers(conf) == Modifiers(bandwidth=1, delay=10, geography=3)
    assert fast.status()["srtt_ms"] == pytest.approx(2.0)


def test_no_modifier_before_min_samples() -> None:
    m = LinkMeter(LocalityMapping(min_samples=3))
    feed(m, 0.05, 2, 0.0)
    assert m.delay is None and m.modifiers(Modifiers(delay=7)).delay == 7
    m.rtt_sample(0.05, 3.0)
    assert m.delay == 5


def test_hysteresis_keeps_a_boundary_value_from_flapping() -> None:
    mp = LocalityMapping(alpha=1.0, hysteresis=0.25, hold=0.0, min_samples=1)
    m = LinkMeter(mp)
    m.rtt_sample(0.050, 0.0)  # 25 ms one way = 5.0 units
    assert m.delay == 5
    t = 1.0
    for rtt in [0.056, 0.054, 0.057, 0.055, 0.0565] * 4:  # 5.4 .. 5.7 units: within 0.75
        m.rtt_sample(rtt, t)
        t += 1.0
    assert m.delay == 5 and m.status()["delay_changes"] == 0
    m.rtt_sample(0.058, t)  # 5.8 units: beyond 5 + 0.5 + 0.25
    assert m.delay == 6


def test_hold_time_limits_changes() -> None:
    m = LinkMeter(LocalityMapping(alpha=1.0, hold=10.0, min_samples=1))
    m.rtt_sample(0.010, 0.0)
    assert m.delay == 1
    m.rtt_sample(0.100, 1.0)
    assert m.delay == 1  # held
    m.rtt_sample(0.100, 10.5)
    assert m.delay == 10


def test_smoothing_ignores_a_single_spike() -> None:
    m = LinkMeter(LocalityMapping(hold=0.0))
    t = feed(m, 0.020, 20, 0.0)
    assert m.delay == 2
    m.rtt_sample(0.400, t)  # one 400 ms outlier (40 units alone)
    assert m.delay == 7  # the EWMA moves by 1/8 of the jump: (20 + 380/8) ms / 2 / 5 ms
    feed(m, 0.020, 30, t + 1.0)
    assert m.delay == 2


def test_bandwidth_units_are_logarithmic() -> None:
    mp = LocalityMapping(bandwidth_ref=1e9, alpha=1.0, min_samples=1, hold=0.0)
    for bps, units in [(2e9, 0), (1e9, 0), (5e8, 1), (1e6, 10), (56e3, 14)]:
        m = LinkMeter(mp)
        m.throughput_sample(bps, 0.0)
        assert m.bandwidth == units, (bps, m.bandwidth)
    assert mp.bandwidth_units(1e6) == pytest.approx(math.log2(1000))


def test_hostile_samples_are_refused_and_counted() -> None:
    m = LinkMeter()
    for bad in (0.0, -1.0, math.inf, math.nan):
        assert m.rtt_sample(bad, 0.0) is False
        assert m.throughput_sample(bad, 0.0) is False
    assert m.refused == 8 and m.status()["rtt_samples"] == 0


def test_mapping_is_checked() -> None:
    with pytest.raises(ValueError, match="delay_unit"):
        LocalityMapping(delay_unit=0)
    with pytest.raises(ValueError, match="unknown"):
        LocalityMapping.from_mapping({"delay_units": 1})
    assert LocalityMapping.from_mapping({"delay_unit": 0.01}).delay_unit == 0.01


# ---------------------------------------------------------------------- in the simulator
def _sim_abc(flow: FlowID, mapping: LocalityMapping | None, *, bc_bandwidth: float = 0.0,
             modifiers: Modifiers | None = None) -> tuple[Any, Any, Any, Any]:
    """a (core for 0x10) - b - c in the simulator, 2 ms one way per link (b-c limited to
    *bc_bandwidth*, both links configured with *modifiers*), measured locality on with
    *mapping* (None: left off, for the test to turn on). Endpoints ``src`` on a, ``eb`` on b
    and ``ec`` on c; eb and ec have joined *flow* on band 32 at t=1. Returns
    ``(net, src, eb, ec)``."""
    from flowrouter.testbed.sim.network import SimNetwork

    net = SimNetwork(seed=1)
    for name, routes in (("a", {}), ("b", {0x10: "a"}), ("c", {0x10: "b"})):
        net.add_router(name, core_lsids=[0x10] if name == "a" else [], routes=routes)
        net.routers[name].p.locality_mapping = mapping
    net.add_link("a", "b", delay=0.002, modifiers=modifiers)
    net.add_link("b", "c", delay=0.002, bandwidth=bc_bandwidth, modifiers=modifiers)
    src = net.add_endpoint("src", "a")
    eb = net.add_endpoint("eb", "b")
    ec = net.add_endpoint("ec", "c")
    net.run_until(1.0)
    eb.join(flow, 32)
    ec.join(flow, 32)
    return net, src, eb, ec


def test_sim_slow_link_gets_larger_delay_modifier_and_stops_delay_limited_traffic() -> None:
    """a (core) - b - c, measured locality on. Each router is fed RTT samples of its links
    (Router.measure_rtt) taken from the simulated links (2 x one-way delay: what a liveness
    echo would measure on an idle link; the echo itself is not wired here). When the b-c link
    is slowed (link emulation: 2 ms -> 40 ms one way), b's delay modifier for it grows from
    0 to 8, and a message sent with a delay budget of 5 from a reaches b's endpoint but no
    longer c's."""
    from flowrouter.wire.flowid import FlowID
    from flowrouter.wire.header import Locality

    flow = FlowID(0xBEEF, 0x10, 1)
    net, src, eb, ec = _sim_abc(flow, None, modifiers=Modifiers(delay=1))
    for r in net.routers.values():
        r.p.locality_mapping = LocalityMapping()  # measured locality on

    def lid(name: str, end: str) -> int:
        link = net.links[name]
        out = link.lid_a if end == link.a else link.lid_b
        assert out is not None
        return out

    def measure(t: float) -> None:
        for name in ("a-b", "b-c"):
            link = net.links[name]
            for end, other in ((link.a, link.b), (link.b, link.a)):
                rtt = link.direction_from(end).delay + link.direction_from(other).delay
                net.routers[end].measure_rtt(lid(name, end), rtt, t)

    def measured(router: str, name: str) -> dict[str, object]:
        rows = [lk for lk in net.routers[router].status()["links"]
                if lk["id"] == lid(name, router)]
        return {**rows[0]["measured"], "modifiers": rows[0]["modifiers"]}

    for i in range(5):
        net.run_until(2.0 + i)
        measure(net.now)
    assert measured("b", "b-c")["delay_modifier"] == 0
    src.send(flow, 32, b"near", locality=(Locality.DELAY, 5))
    net.run_until(8.0)
    assert eb.payloads(flow) == [b"near"] and ec.payloads(flow) == [b"near"]

    net.set_link("b-c", delay=0.040)  # the emulated link becomes slow
    for i in range(40):
        net.run_until(9.0 + i)
        measure(net.now)
    row = measured("b", "b-c")
    assert row["delay_modifier"] == 8  # 40 ms one way / 5 ms per unit
    assert row["modifiers"] == {"bandwidth": 0, "delay": 8, "geography": 0}
    assert 75.0 < row["srtt_ms"] < 80.1  # type: ignore[operator]
    assert measured("b", "a-b")["delay_modifier"] == 0
    before = net.routers["b"].counters["drop.locality"]
    src.send(flow, 32, b"far", locality=(Locality.DELAY, 5))
    net.run_until(60.0)
    assert eb.payloads(flow) == [b"near", b"far"]
    assert ec.payloads(flow) == [b"near"]  # the delay-limited message stops at b
    assert net.routers["b"].counters["drop.locality"] == before + 1
    assert net.routers["b"].counters["locality.modifier-changes"] >= 2


def test_sim_liveness_echo_drives_the_delay_modifier() -> None:
    """The same, fed by the routers' own link liveness echoes (ECHO / ECHO_REPLY round
    trips), not by the test: slowing the emulated b-c link raises b's delay modifier for it
    and a delay-limited message stops crossing it."""
    from flowrouter.wire.flowid import FlowID
    from flowrouter.wire.header import Locality

    flow = FlowID(0xBEEF, 0x10, 2)
    net, src, eb, ec = _sim_abc(flow, LocalityMapping(), modifiers=Modifiers(delay=1))
    net.run_until(15.0)

    def row(router: str, peer: str) -> dict[str, object]:
        rows = [lk for lk in net.routers[router].status()["links"] if lk["peer"] == peer]
        assert rows and "measured" in rows[0], rows
        return {**rows[0]["measured"], "modifiers": rows[0]["modifiers"]}

    assert row("b", "c")["delay_modifier"] == 0
    src.send(flow, 32, b"near", locality=(Locality.DELAY, 5))
    net.run_until(16.0)
    assert ec.payloads(flow) == [b"near"]
    net.set_link("b-c", delay=0.040)
    net.run_until(90.0)
    r = row("b", "c")
    assert r["delay_modifier"] == 8 and r["modifiers"]["delay"] == 8, r  # type: ignore[index]
    assert row("b", "a")["delay_modifier"] == 0
    src.send(flow, 32, b"far", locality=(Locality.DELAY, 5))
    net.run_until(95.0)
    assert eb.payloads(flow) == [b"near", b"far"] and ec.payloads(flow) == [b"near"]


def test_sim_busy_rate_limited_link_gets_bandwidth_modifier() -> None:
    """a (core) - b - c, measured locality on; b-c serialises at 1 Mbit/s, a-b is unlimited.
    Kept busy (a burst from a), b's bandwidth modifier for b-c follows the wire's rate
    (log2(1e9 / 1e6) ~ 10 units) while a-b keeps its configured one, and a message with
    bandwidth budget 5 reaches b's endpoint but no longer c's; before, it did."""
    from flowrouter.wire.flowid import FlowID
    from flowrouter.wire.header import Locality

    flow = FlowID(0xBEEF, 0x10, 3)
    net, src, eb, ec = _sim_abc(flow, LocalityMapping(min_samples=2, hold=0.1), bc_bandwidth=1e6)
    net.run_until(5.0)

    def row(router: str, peer: str) -> dict[str, object]:
        rows = [lk for lk in net.routers[router].status()["links"] if lk["peer"] == peer]
        return {**rows[0].get("measured", {}), "modifiers": rows[0]["modifiers"]}

    src.send(flow, 32, b"near", locality=(Locality.BANDWIDTH, 5))
    net.run_until(6.0)
    assert ec.payloads(flow) == [b"near"]
    for _ in range(250):  # 250 kB: 2 s of the 1 Mbit/s wire
        src.send(flow, 32, bytes(1000))
    net.run_until(9.0)
    r = row("b", "c")
    assert r["bandwidth_modifier"] == 10 and r["modifiers"]["bandwidth"] == 10, r  # type: ignore[index]
    assert r["throughput_bps"] == 1e6
    assert row("b", "a").get("bandwidth_modifier") is None
    assert row("b", "a")["modifiers"]["bandwidth"] == 0  # type: ignore[index]
    src.send(flow, 32, b"far", locality=(Locality.BANDWIDTH, 5))
    net.run_until(12.0)
    assert eb.payloads(flow)[-1] == b"far" and ec.payloads(flow)[-1] != b"far"


# ---------------------------------------------------------------------- real routers
@contextlib.asynccontextmanager
async def _near_message(core: RouterNode, edge: RouterNode, kind: Any, budget: int
                        ) -> AsyncIterator[tuple[Any, FlowID, Any]]:
    """Applications ``rx`` on *core* and ``tx`` on *edge*, on a flow rx created and listens
    to on band 32: yields ``(tx, flow, rx's listener)`` once a message from tx with locality
    budget (*kind*, *budget*) has reached rx (the "before" of every loopback test here), and
    closes both applications after."""
    import flowlib

    from .rawep import addr, within

    clients = []
    try:
        rx = await flowlib.connect([addr(core)], name="rx")
        clients.append(rx)
        tx = await flowlib.connect([addr(edge)], name="tx")
        clients.append(tx)
        flow = await rx.create()
        lst = await rx.listen(flow, 32)
        await tx.advertise(flow)
        await tx.send(flow, b"near", band=32, locality=(kind, budget))
        assert (await within(lst.get())).payload == b"near"
        yield tx, flow, lst
    finally:
        for c in clients:
            await c.close()


def test_emulated_slow_link_on_loopback_routers() -> None:
    """edge -> core over loopback, measured locality on, ECHOs every 0.2 s. The link
    emulator adds 40 ms one way toward the core: the edge's delay modifier for that link grows
    (about 20 ms one way of a 40 ms RTT: 4 units) and a message with delay budget 2 from an
    application on the edge no longer reaches the core's application; before, it did."""
    import asyncio

    import flowlib
    from flowrouter.net.config import Emulation

    from .rawep import core_and_edge, run, within

    mapping = LocalityMapping(alpha=0.5, min_samples=2, hold=0.2)

    async def until(pred: object, timeout: float = 20.0) -> None:
        async def spin() -> None:
            while not pred():  # type: ignore[operator]
                await asyncio.sleep(0.05)
        await asyncio.wait_for(spin(), timeout)

    async def main() -> None:
        async with core_and_edge(liveness_interval=0.2, locality_mapping=mapping) as (core, edge):

            def measured() -> dict[str, object] | None:
                for lk in edge.core.status()["links"]:
                    if lk["peer"] == "core" and "measured" in lk:
                        return lk["measured"]  # type: ignore[no-any-return]
                return None

            await until(lambda: (measured() or {}).get("delay_modifier") == 0)
            async with _near_message(core, edge, flowlib.Locality.DELAY, 2) as (tx, flow, lst):
                edge.set_emulation("core", Emulation(delay=0.040))
                # the smoothed RTT converges on the 40 ms added (the modifier may move first,
                # its hysteresis lets it reach 3 from about 27 ms)
                await until(lambda: ((measured() or {}).get("delay_modifier") or 0) >= 3
                            and ((measured() or {}).get("srtt_ms") or 0) > 30)
                m = measured()
                assert m is not None and m["delay_modifier"] >= 3, m
                before = edge.core.counters["drop.locality"]
                await tx.send(flow, b"far", band=32, locality=(flowlib.Locality.DELAY, 2))
                await tx.send(flow, b"any", band=32)  # no budget: still crosses (slowly)
                assert (await within(lst.get())).payload == b"any"
                assert edge.core.counters["drop.locality"] == before + 1
    run(main())


def test_router_config_turns_measured_locality_on_and_checks_it() -> None:
    from flowrouter.net.config import ConfigError
    from flowrouter.net.configfile import config_from_dict

    cfg = config_from_dict({"router": {"name": "r"}})
    assert cfg.params().locality_mapping is None
    cfg = config_from_dict({"router": {"name": "r"},
                            "measured_locality": {"delay_unit": 0.01, "hold": 2.0}})
    assert cfg.params().locality_mapping == LocalityMapping(delay_unit=0.01, hold=2.0)
    assert config_from_dict({"router": {"name": "r"}, "measured_locality": {}}
                            ).params().locality_mapping == LocalityMapping()
    with pytest.raises(ConfigError, match="measured_locality.*unknown"):
        config_from_dict({"router": {"name": "r"}, "measured_locality": {"delay": 1}})
    with pytest.raises(ConfigError, match="measured_locality.*delay_unit"):
        config_from_dict({"router": {"name": "r"}, "measured_locality": {"delay_unit": -1}})


def test_busy_rate_measures_capacity_not_utilisation() -> None:
    """BusyRate counts only bytes written while the output was backlogged, over busy time."""
    from flowrouter.core.measured import BusyRate

    r = BusyRate(min_busy=0.05)
    r.wrote(10_000)  # not backlogged: a light load says nothing about capacity
    r.backlog(False, 0.0)
    assert r.sample(1.0) is None
    r.backlog(True, 1.0)  # frames wait from t=1.0
    r.wrote(1250)
    r.backlog(True, 1.05)
    r.wrote(1250)
    r.backlog(False, 1.1)  # 2500 B over 0.1 s busy
    r.wrote(99_999)  # idle again: not counted
    assert r.sample(5.0) == pytest.approx(200_000)
    assert r.sample(6.0) is None


def test_rate_limited_link_on_loopback_routers_gets_bandwidth_modifier() -> None:
    """edge -> core over loopback, measured locality on. Kept busy while unlimited, the
    edge's link toward the core measures loopback speed (bandwidth modifier small, or none);
    then the link emulator limits it to 1 Mbit/s and, kept busy again, its bandwidth modifier
    grows (log2(1e9 / 1e6) ~ 10 units); a message with bandwidth budget 5 that crossed
    before is now dropped for locality."""
    import asyncio

    import flowlib
    from flowrouter.net.config import Emulation

    from .rawep import core_and_edge, run, within

    mapping = LocalityMapping(alpha=0.5, min_samples=2, hold=0.1)

    async def main() -> None:
        async with (core_and_edge(tick_interval=0.05, locality_mapping=mapping)
                    as (core, edge),
                    _near_message(core, edge, flowlib.Locality.BANDWIDTH, 5) as (tx, flow, _)):

            def measured() -> dict[str, object]:
                for lk in edge.core.status()["links"]:
                    if lk["peer"] == "core":
                        return {**lk.get("measured", {}), "modifiers": lk["modifiers"]}
                return {}

            blob = bytes(1000)

            async def busy_until(pred: object, timeout: float = 30.0) -> None:
                async def pump() -> None:
                    while not pred():  # type: ignore[operator]
                        for _ in range(50):
                            await tx.send(flow, blob, band=32)
                        await asyncio.sleep(0.01)
                await asyncio.wait_for(pump(), timeout)

            for _ in range(40):  # unlimited and busy: loopback speed (or never backlogged)
                for _ in range(50):
                    await tx.send(flow, blob, band=32)
                await asyncio.sleep(0.01)
            unlimited = measured()
            assert (unlimited.get("bandwidth_modifier") or 0) < 5, unlimited
            edge.set_emulation("core", Emulation(bandwidth=1e6))
            await busy_until(lambda: (measured().get("bandwidth_modifier") or 0) >= 7)
            m = measured()
            assert 5e5 < m["throughput_bps"] < 2e6, m  # type: ignore[operator]
            before = edge.core.counters["drop.locality"]
            await tx.send(flow, b"far", band=32, locality=(flowlib.Locality.BANDWIDTH, 5))

            async def dropped() -> None:
                while edge.core.counters["drop.locality"] == before:
                    await asyncio.sleep(0.02)
            await within(dropped())
            assert edge.core.counters["drop.locality"] == before + 1
            assert m["modifiers"]["bandwidth"] >= 7, m  # type: ignore[index]
    run(main())
