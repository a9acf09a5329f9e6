"""Overload control: fair bounded output queues, credits, quotas, alerts, link emulation."""

from __future__ import annotations

import asyncio

import pytest

import flowlib
from flowrouter.core.linkqueue import OutputQueue, TokenBucket
from flowrouter.net.config import ConfigError, Emulation, NodeConfig, PeerConfig
from flowrouter.net.configfile import config_from_dict
from flowrouter.net.runtime import RouterNode, query_control
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT

from .rawep import RawEndpoint, addr, within

A, B, Z = b"A" * 16, b"B" * 16, b"Z" * 16
HDR = b"h" * 24


def frames_of(q: OutputQueue, now: float = 0.0) -> list[bytes]:
    out = []
    while (fr := q.pop(now)) is not None:
        out.append(fr[1])
    return out


# ---------------------------------------------------------------- the queue, sans-I/O
def test_drr_shares_the_link_between_a_flooder_and_a_polite_flow() -> None:
    q = OutputQueue(max_bytes=10**9, quantum=1000)
    for i in range(100):
        q.push(A, HDR, b"a%03d" % i + b"." * 996, False, 0.0)
    for i in range(5):
        q.push(B, HDR, b"b%03d" % i + b"." * 996, False, 0.0)
    order = [p[:1] for p in frames_of(q)]
    # B's five frames are all served within the first dozen, not after A's hundred.
    assert [i for i, f in enumerate(order) if f == b"b"][-1] < 12
    assert order.count(b"a") == 100


def test_bound_drops_from_the_longest_queue() -> None:
    q = OutputQueue(max_bytes=10 * 124)
    for _ in range(8):
        assert q.push(A, HDR, b"x" * 100, False, 0.0) == []
    q.push(B, HDR, b"y" * 100, False, 0.0)
    q.push(B, HDR, b"y" * 100, False, 0.0)
    dropped = q.push(B, HDR, b"y" * 100, False, 0.0)  # over the bound: A (longest) pays
    assert [(k, n) for k, n, _ in dropped] == [(A, 124)]
    assert q.bytes <= q.max_bytes and q.dropped == 1
    assert len([f for f in frames_of(q) if f.startswith(b"y")]) == 3


def test_bound_drop_picks_the_longest_queue_not_the_first_or_the_newest() -> None:
    # Arrival order Z, A, B: the longest queue (A) is neither the first nor the last flow
    # to arrive nor the flow whose push overflows the bound, so only "longest" picks it.
    q = OutputQueue(max_bytes=10 * 124)
    q.push(Z, HDR, b"z0" + b"." * 98, False, 0.0)
    for i in range(7):
        q.push(A, HDR, b"a%d" % i + b"." * 98, False, 0.0)
    for i in range(2):
        q.push(B, HDR, b"b%d" % i + b"." * 98, False, 0.0)
    dropped = q.push(Z, HDR, b"z1" + b"." * 98, False, 0.0)
    assert [(k, n) for k, n, _ in dropped] == [(A, 124)]
    left = sorted(f[:2] for f in frames_of(q))
    assert left == sorted([b"z0", b"z1", b"b0", b"b1", *(b"a%d" % i for i in range(6))])


def test_control_frames_go_first() -> None:
    q = OutputQueue(max_bytes=10**6)
    q.push(A, HDR, b"data", False, 0.0)
    q.push(A, HDR, b"join", True, 0.0)
    assert frames_of(q) == [b"join", b"data"]


def test_token_bucket_paces_and_delay_holds() -> None:
    q = OutputQueue(max_bytes=10**6, rate=1000.0)  # 1000 bytes/s, burst 2048
    for _ in range(5):
        q.push(A, HDR, b"x" * 976, False, 0.0)  # 1000 bytes per frame
    assert len(frames_of(q, 0.0)) == 2  # the burst
    wait = q.next_ready(0.0)
    assert wait is not None and 0.9 < wait <= 1.0
    assert len(frames_of(q, 1.0)) == 1
    assert len(frames_of(q, 3.0)) == 2
    d = OutputQueue(max_bytes=10**6, delay=0.5)
    d.push(A, HDR, b"late", False, 0.0)
    assert d.pop(0.4) is None and d.next_ready(0.4) == pytest.approx(0.1)
    assert d.pop(0.5)[1] == b"late"  # type: ignore[index]
    bucket = TokenBucket(100.0, burst=100.0)
    bucket.take(100, 0.0)
    assert bucket.wait_for(50, 0.0) == pytest.approx(0.5)


def test_emulation_config_is_validated() -> None:
    cfg = config_from_dict({"router": {"name": "r1"},
                            "peer": [{"address": "127.0.0.1:9", "name": "r2",
                                      "bandwidth": 56000, "delay": 0.2}],
                            "emulate": [{"peer": "r3", "loss": 0.5}]})
    assert cfg.peers[0].emulation == Emulation(bandwidth=56000.0, delay=0.2)
    assert cfg.emulation["r3"].loss == 0.5
    for bad in ({"peer": "r3", "loss": 2}, {"peer": "r3", "delay": -1},
                {"peer": "r3", "colour": 1}, {"loss": 0.1}):
        with pytest.raises(ConfigError):
            config_from_dict({"router": {"name": "r1"}, "emulate": [bad]})


# ---------------------------------------------------------------- on real sockets
async def _pair(edge_extra: dict[str, object], emu: Emulation | None = None
                ) -> tuple[RouterNode, RouterNode]:
    core = RouterNode(NodeConfig("core", listen="127.0.0.1:0", control="127.0.0.1:0",
                                 accept_routers=["edge@127.0.0.1"],
                                 core_lsids=frozenset({0x10}), default_lsid=0x10))
    await core.start()
    edge = RouterNode(NodeConfig(
        "edge", listen="127.0.0.1:0", control="127.0.0.1:0",
        peers=[PeerConfig("%s:%d" % core.tcp_address, "core",
                          emulation=emu or Emulation())], **edge_extra))  # type: ignore[arg-type]
    await edge.start()
    await within(edge.wait_routes(0x10))
    return edge, core


async def _flood_vs_polite(edge_extra: dict[str, object]) -> tuple[RouterNode, list[int],
                                                                   list[flowlib.Message]]:
    # edge -> core limited to 400 kbit/s: the flood cannot all fit, the polite flow must.
    edge, core = await _pair(edge_extra, Emulation(bandwidth=400_000))
    try:
        rx = await flowlib.connect([addr(core)], name="rx")
        flooder = await flowlib.connect([addr(edge)], name="flooder")
        polite = await flowlib.connect([addr(edge)], name="polite")
        f_flood = await flooder.create()
        f_polite = await polite.create()
        l_flood = await rx.listen(f_flood, [32, BAND_FAULT], size=100_000)
        l_polite = await rx.listen(f_polite, [32], size=1000)
        stop = asyncio.Event()

        async def flood() -> None:
            blob = b"F" * 1000
            while not stop.is_set():
                await flooder.send(f_flood, blob, band=32)
                await asyncio.sleep(0)
        task = asyncio.ensure_future(flood())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got: list[int] = []
        for i in range(20):  # 20 small messages, 20 ms apart, while the flood runs
            await polite.send(f_polite, b"p%02d" % i, band=32)
            await asyncio.sleep(0.02)
        while len(got) < 20:
            msg = await within(l_polite.get(), 20)
            got.append(int(msg.payload[1:]))
        polite_done = loop.time() - t0
        stop.set()
        await task
        elapsed = loop.time() - t0
        faults = []
        flood_bytes = 0
        while not l_flood.empty():
            m = l_flood.get_nowait()
            if m.band == BAND_FAULT:
                faults.append(m)
            else:
                flood_bytes += len(m.payload)
        # Both rates, for the record: the flood fills the emulated 400 kbit/s link (its share
        # is what is left), the polite flow's 20 messages arrive at the pace they were sent.
        print(f"\nflood: {flood_bytes * 8 / elapsed / 1000:.0f} kbit/s delivered over "
              f"{elapsed:.2f} s; polite: 20 messages in {polite_done:.2f} s "
              f"({20 / polite_done:.1f} msg/s, sent 20 ms apart)")
        assert flood_bytes > 0  # the flooder was slowed, not starved
        for c in (rx, flooder, polite):
            await c.close()
        return edge, got, faults
    finally:
        await edge.stop()
        await core.stop()


def test_flooder_is_held_back_by_credit_and_polite_flow_gets_through() -> None:
    edge, got, _ = asyncio.run(asyncio.wait_for(_flood_vs_polite({}), 90))
    assert got == list(range(20))
    # The flood was pushed back on its own input link rather than dropped.
    assert edge.core.counters["credit.paused"] >= 1


def test_bounded_queue_drops_the_flooder_and_alerts_its_flow() -> None:
    extra = {"max_link_buffer": 64 * 1024, "link_credit": 64 * 1024 * 1024}
    edge, got, faults = asyncio.run(asyncio.wait_for(_flood_vs_polite(extra), 90))
    assert got == list(range(20))
    assert edge.core.counters["drop.link-congested"] > 0
    assert edge.core.counters["alerts.link-congested"] > 0
    assert any(a["kind"] == "link-congested" for a in edge.core.alerts)
    assert faults, "the flooded flow's members were told on the fault band"
    fault = flowlib.decode_fault(faults[0])
    assert fault.kind is C.FaultKind.LIMIT and fault.extra["limit"] == "link-congested"


def test_endpoint_flow_quota_refuses_and_router_keeps_serving() -> None:
    async def main() -> None:
        edge, core = await _pair({"max_flows_per_endpoint": 5})
        try:
            ep = await RawEndpoint.connect(edge, "flooder")
            acks = []
            for i in range(12):  # the seed's advertisement flood
                fid = flowlib.FlowID(0xBAD, 0x10, i + 1)
                acks.append((await ep.join(fid, 0, req=i + 1)).status)
            assert acks[:5] == [C.JoinStatus.OK] * 5
            assert acks[5:] == [C.JoinStatus.LIMIT] * 7
            assert edge.core.counters["refused.endpoint-quota"] == 7
            assert len(edge.core.flows) == 5
            st = (await query_control("%s:%d" % edge.control_address))["status"]
            assert any(a["kind"] == "endpoint-quota" for a in st["alerts"])
            # Another application is unaffected.
            c = await flowlib.connect([addr(edge)], name="other")
            flow = await c.create()
            lst = await c.listen(flow, [40])
            s = await flowlib.connect([addr(core)], name="s")
            await s.send(flow, b"fine", band=40)
            assert (await within(lst.get())).payload == b"fine"
            for x in (c, s):
                await x.close()
            await ep.close()
        finally:
            await edge.stop()
            await core.stop()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_emulated_delay_loss_and_administrative_cut() -> None:
    async def main() -> None:
        edge, core = await _pair({}, Emulation(delay=0.15))
        try:
            rx = await flowlib.connect([addr(core)], name="rx")
            tx = await flowlib.connect([addr(edge)], name="tx")
            flow = await tx.create()
            lst = await rx.listen(flow, [32, BAND_FAULT])
            await tx.advertise(flow)  # the flow now depends on the edge-core link
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await tx.send(flow, b"slow", band=32)
            assert (await within(lst.get())).payload == b"slow"
            assert loop.time() - t0 >= 0.15  # the one-way delay was applied
            ctl = "%s:%d" % edge.control_address
            await query_control(ctl, "emulate", peer="core", loss=1.0)
            await tx.send(flow, b"lost", band=32)
            await query_control(ctl, "emulate", peer="core")  # back to a plain link
            await tx.send(flow, b"after", band=32)
            assert (await within(lst.get())).payload == b"after"
            assert edge.core.counters["drop.emulated-loss"] == 1
            # Administrative cut: the link closes like a failure; members hear of it.
            reply = await query_control(ctl, "link", peer="core", up=False)
            assert reply["closed"] == 1
            msg = await within(lst.get())
            assert msg.band == BAND_FAULT
            fault = flowlib.decode_fault(msg)  # the core saw its link to the edge go
            assert fault.kind is C.FaultKind.LINK_DOWN and fault.extra["peer"] == "edge"
            assert edge.links_up() == 0
            await query_control(ctl, "link", peer="core", up=True)
            await within(edge.wait_peers_up(1))
            with pytest.raises(ConnectionError, match="loss"):
                await query_control(ctl, "emulate", peer="core", loss=5)
            for c in (rx, tx):
                await c.close()
        finally:
            await edge.stop()
            await core.stop()
    asyncio.run(asyncio.wait_for(main(), 60))
