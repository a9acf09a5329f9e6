"""Issue 15's attacks, reproduced on real sockets (127.0.0.1): each one worked on the old main
and is refused, counted and contained now.

* an application claiming ROUTER in its HELLO on an overlay without keys;
* quotas dodged by opening more connections (they are per principal now);
* one stuck receiver freezing its flow (slow consumers hurt only themselves);
* an open control interface (commands need proof);
* half-sent frames holding connections for ever (progress time-outs).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest

from flowrouter.net.config import ConfigError, NodeConfig, PeerConfig
from flowrouter.net.configfile import config_from_dict
from flowrouter.net.runtime import RouterNode, query_control
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT
from flowrouter.wire.capabilities import CreatorKey, Policy
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import FrameDecoder, pack_header

from .rawep import RawEndpoint, blocking_member, until, within

LSID = 0x10


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 90))


async def _router(name: str = "core", **extra: object) -> RouterNode:
    node = RouterNode(NodeConfig(name, listen="127.0.0.1:0", core_lsids=frozenset({LSID}),
                                 default_lsid=LSID, **extra))  # type: ignore[arg-type]
    await node.start()
    return node


async def _refusal(ep: RawEndpoint) -> str:
    """The ERROR a router sends before closing the link (skipping its HELLO)."""
    while True:
        _, payload = await ep.next_frame()
        msg = C.decode(payload)
        if isinstance(msg, C.Error):
            await within(ep.closed.wait())
            return msg.text


# ---------------------------------------------------------------- role spoofing
def test_application_claiming_router_is_refused_and_cannot_join_a_protected_flow(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        core = await _router()
        try:
            owner = CreatorKey.generate()
            flow = owner.flow(LSID, 1)
            creator = await RawEndpoint.connect(core, "creator")
            creator.send_control(LINK_LOCAL_FLOW.key, C.PolicyMsg(
                Policy.issue(owner, flow, version=1, now=time.time()).encode()))
            await until(lambda: core.core.counters["policies.installed"] >= 1)
            spoof = await RawEndpoint.connect(core, hello=False)
            with caplog.at_level(logging.WARNING):
                spoof.send_control(LINK_LOCAL_FLOW.key,
                                   C.Hello(9, C.Role.ROUTER, "mallory", 65536))
                spoof.send_control(flow.key, C.Join(1, 1 << 40))  # tried on the old main
                text = await _refusal(spoof)
            assert "router" in text and "not a configured peer" in text
            assert core.core.counters["refused.router-claim"] == 1
            assert "mallory" in caplog.text and "claims to be a router" in caplog.text
            assert flow.key not in core.core.flows  # the join never took effect
            # A real application on the same router still joins (and is checked).
            alice = await RawEndpoint.connect(core, "alice")
            ack = await alice.join(flow, 1 << 40)
            assert ack.status is C.JoinStatus.REFUSED and "missing" in ack.reason
            for ep in (creator, spoof, alice):
                await ep.close()
        finally:
            await core.stop()
    run(main())


def test_configured_peers_and_the_allow_list_may_be_routers() -> None:
    async def main() -> None:
        core = await _router(accept_routers=["edge1@127.0.0.1"])
        edge1 = RouterNode(NodeConfig("edge1", listen="127.0.0.1:0", peers=[
            PeerConfig("%s:%d" % core.tcp_address, "core")]))
        edge2 = RouterNode(NodeConfig("edge2", listen="127.0.0.1:0", peers=[
            PeerConfig("%s:%d" % core.tcp_address, "core")], reconnect_min=5.0))
        await edge1.start()
        await edge2.start()
        try:
            await within(edge1.wait_routes(LSID))  # allowed by name and host
            await until(lambda: core.core.counters["refused.router-claim"] >= 1)
            assert edge2.core.routing.link_for(LSID) is None  # not on the list
            assert core.links_up() == 1
        finally:
            for n in (edge2, edge1, core):
                await n.stop()
    run(main())


def test_allow_list_entries_are_checked() -> None:
    with pytest.raises(ConfigError, match="name@host"):
        config_from_dict({"router": {"name": "r1", "accept_routers": ["r2"]}})
    cfg = config_from_dict({"router": {"name": "r1", "accept_routers": ["r2@10.0.0.2"]},
                            "quota": {"flows": 10, "joins_per_second": 5.0,
                                      "connections_per_host": 3}})
    assert cfg.accept_routers == ["r2@10.0.0.2"] and cfg.quota.flows == 10
    with pytest.raises(ConfigError, match="quota"):
        config_from_dict({"router": {"name": "r1"}, "quota": {"flows": 0}})


# ---------------------------------------------------------------- quotas per principal
def test_flow_quota_is_per_principal_not_per_connection() -> None:
    async def main() -> None:
        core = await _router(quota={"flows": 30})
        try:
            eps = [await RawEndpoint.connect(core, f"app{i}") for i in range(5)]
            statuses = []
            for i, ep in enumerate(eps):  # 5 connections x 10 joins from one host
                for j in range(10):
                    ack = await ep.join(FlowID(0xBAD, LSID, i * 100 + j + 1), 1 << 40,
                                        req=j + 1)
                    statuses.append(ack.status)
            assert statuses.count(C.JoinStatus.OK) == 30
            assert statuses.count(C.JoinStatus.LIMIT) == 20
            assert core.core.counters["refused.principal-flows"] == 20
            assert len(core.core.flows) == 30
            st = (await query_control_status(core))
            assert st["quota"]["limits"]["flows"] == 30
            assert st["quota"]["principals"]["host:127.0.0.1"]["flows"] == 30
            assert any(a["kind"] == "principal-flows" for a in st["alerts"])
            for ep in eps:
                await ep.close()
        finally:
            await core.stop()
    run(main())


async def query_control_status(node: RouterNode) -> dict:  # type: ignore[type-arg]
    return node.status()


def test_join_rate_and_connections_per_host_are_limited() -> None:
    async def main() -> None:
        core = await _router(quota={"joins_per_second": 1.0, "join_burst": 5,
                                    "connections_per_host": 3})
        try:
            ep = await RawEndpoint.connect(core, "burst")
            for j in range(8):
                ep.send_control(FlowID(0xB, LSID, j + 1).key, C.Join(j + 1, 1 << 40))
            acks = []
            while len(acks) < 8:
                _, payload = await ep.next_frame()
                msg = C.decode(payload)
                if isinstance(msg, C.JoinAck):
                    acks.append(msg.status)
            assert acks.count(C.JoinStatus.OK) == 5
            assert acks.count(C.JoinStatus.LIMIT) == 3
            assert core.core.counters["refused.join-rate"] == 3
            others = [await RawEndpoint.connect(core, f"c{i}") for i in range(2)]
            # the 4th from this host: counted (and refused) once its HELLO is accepted
            extra = await RawEndpoint.connect(core, "c3")
            text = await _refusal(extra)
            assert "connections" in text and "127.0.0.1" in text
            assert core.core.counters["refused.connections-per-host"] == 1
            for e in (ep, extra, *others):
                await e.close()
        finally:
            await core.stop()
    run(main())


# ---------------------------------------------------------------- slow consumers
class _Stuck:
    """A receiver that joins and then stops reading its socket (small receive buffer)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def connect(cls, node: RouterNode, flow: FlowID, band: int) -> _Stuck:
        return cls(blocking_member(node, flow, band))

    def drain_count(self, band: int, expect_more: float = 0.5) -> int:
        """Read everything that arrives (until quiet for *expect_more* s): data frames."""
        dec = FrameDecoder(1 << 20)
        self.sock.settimeout(expect_more)
        n = 0
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                return n
            if not data:
                return n
            n += sum(1 for h, _ in dec.feed(data) if h[20] == band)


async def _fan_out(core: RouterNode, flow: FlowID, receivers: list[RawEndpoint], n: int,
                   size: int) -> float:
    """Send *n* messages at full rate; seconds until every receiver has all of them."""
    tx = await RawEndpoint.connect(core, "tx")
    blob = b"m" * size
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def send() -> None:
        for i in range(n):
            tx.send(flow, blob, band=40)
            if i % 64 == 63:
                await tx.writer.drain()
        await tx.writer.drain()

    async def receive(ep: RawEndpoint) -> None:
        got = await ep.data(n, timeout=30)
        assert all(len(p) == size for _, p in got)

    await asyncio.gather(send(), *(receive(ep) for ep in receivers))
    elapsed = loop.time() - t0
    await tx.close()
    return elapsed


@pytest.mark.parametrize("queue_limit", [128 * 1024, 1024 * 1024],
                         ids=["queue-under-credit", "queue-over-credit"])
def test_stuck_receiver_does_not_slow_the_others(queue_limit: int) -> None:
    """4 receivers, one stops reading: the other 3 get every message at full rate; the
    stuck one's losses are counted exactly (what it got + drop.slow-consumer = sent). With
    a queue limit over the input's credit the stuck output could hold all of it: it must
    give it back once it is seen not draining (flowrouter.core.flowcontrol)."""
    n, size = 6000, 1024

    async def main() -> None:
        core = await _router(slow_consumer_bytes=queue_limit, slow_consumer_grace=120.0,
                             slow_consumer_stall=0.3, link_credit=256 * 1024)
        try:
            healthy = [await RawEndpoint.connect(core, f"rx{i}") for i in range(3)]
            base = FlowID(0xF00, LSID, 1)
            for ep in healthy:
                assert (await ep.join(base, 1 << 40)).status is C.JoinStatus.OK
            alone = await _fan_out(core, base, healthy, n, size)
            flow = FlowID(0xF00, LSID, 2)
            for ep in healthy:
                assert (await ep.join(flow, 1 << 40, req=2)).status is C.JoinStatus.OK
            stuck = _Stuck.connect(core, flow, 40)
            await until(lambda: len(core.core.flows.get(flow.key).down) == 4)  # type: ignore[union-attr]
            with_stuck = await _fan_out(core, flow, healthy, n, size)
            dropped = core.core.counters["drop.slow-consumer"]
            assert dropped > 0, "the stuck receiver's output should have overflowed"
            if queue_limit > 256 * 1024:  # it could hold all the input's credit: it was seen
                # not draining while its siblings drained, and holds none
                assert core.core.counters["credit.not-draining"] >= 1
                fc = core.flow.control
                stuck_outs = [o for o in fc.backlogged.values() if o.stuck]
                assert stuck_outs and all(o.credit(i) == 0 for o in stuck_outs for i in o.waiting)
                assert all(fc.pending(i) == sum(o.credit(i) for o in fc.outputs.values())
                           for i in fc.inputs)
            paused = core.core.counters["credit.paused"]
            got = await asyncio.get_running_loop().run_in_executor(
                None, stuck.drain_count, 40)
            assert got + dropped == n  # every loss counted, exactly
            rate_alone, rate_stuck = n / alone, n / with_stuck
            print(f"\n3 receivers: {rate_alone:.0f} msg/s each without a stuck receiver, "
                  f"{rate_stuck:.0f} msg/s with one ({rate_stuck / rate_alone:.0%}); the "
                  f"stuck one got {got}, {dropped} counted as drop.slow-consumer; the sender "
                  f"was paused {paused} time(s); "
                  f"{core.core.counters['credit.not-draining']} output(s) seen not draining")
            stuck.sock.close()
            for ep in healthy:
                await ep.close()
        finally:
            await core.stop()
    run(main())


def test_slow_consumer_is_closed_after_the_grace_time_with_a_fault_notice(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        core = await _router(slow_consumer_bytes=64 * 1024, slow_consumer_grace=0.3)
        try:
            flow = FlowID(0xF01, LSID, 1)
            rx = await RawEndpoint.connect(core, "rx")
            assert (await rx.join(flow, 1 << 40 | 1 << BAND_FAULT)).status is C.JoinStatus.OK
            stuck = _Stuck.connect(core, flow, 40)
            await until(lambda: len(core.core.flows[flow.key].down) == 2)
            tx = await RawEndpoint.connect(core, "tx")
            with caplog.at_level(logging.WARNING):
                deadline = time.monotonic() + 20
                while core.core.counters["links.slow-consumer"] == 0:
                    assert time.monotonic() < deadline
                    for _ in range(64):
                        tx.send(flow, b"x" * 4096, band=40)
                    await tx.writer.drain()
                    await asyncio.sleep(0.01)
            assert "slow consumer" in caplog.text
            fault = None
            while fault is None:
                hdr, payload = await rx.next_frame()
                if hdr.band == BAND_FAULT:
                    fault = C.decode(payload)
            assert isinstance(fault, C.Fault) and fault.extra["limit"] == "slow-consumer"
            await until(lambda: len(core.core.flows[flow.key].down) == 1)
            stuck.sock.close()
            for ep in (rx, tx):
                await ep.close()
        finally:
            await core.stop()
    run(main())


# ---------------------------------------------------------------- commands need proof
def test_control_commands_need_proof_when_a_token_is_set() -> None:
    async def main() -> None:
        # "x" is a router it knows (commands for unknown peers are refused: issue 17)
        core = await _router(control="127.0.0.1:0", control_token="s3cret-token-123",
                             accept_routers=["x@127.0.0.1"])
        try:
            ctl = "%s:%d" % core.control_address
            assert (await query_control(ctl, "status"))["status"]["name"] == "core"
            with pytest.raises(ConnectionError, match="not authorised"):
                await query_control(ctl, "link", peer="x", up=False)
            reply = await query_control(ctl, "link", peer="x", up=False,
                                        token="s3cret-token-123")
            assert reply["closed"] == 0
            with pytest.raises(ConnectionError, match="bad proof"):
                await query_control(ctl, "link", peer="x", up=True, token="guess")
            assert core.core.counters["refused.command"] == 2
        finally:
            await core.stop()
    run(main())


def test_command_interface_off_loopback_needs_a_token() -> None:
    cfg = NodeConfig("r1", listen="127.0.0.1:0", control="0.0.0.0:0")
    with pytest.raises(ConfigError, match="control_token"):
        asyncio.run(RouterNode(cfg).start())


# ---------------------------------------------------------------- progress time-outs
def test_half_sent_frames_are_reaped() -> None:
    async def main() -> None:
        core = await _router(frame_timeout=0.5)
        try:
            eps = [await RawEndpoint.connect(core, f"slowloris{i}") for i in range(5)]
            for ep in eps:  # a header announcing 64 KB, most of it, then silence
                ep.send_raw(pack_header(FlowID(0xA, LSID, 1).key, 65536, 40) + b"x" * 65000)
            for ep in eps:
                await within(ep.closed.wait())
            assert core.core.counters["reaped.stalled-frame"] == 5
            assert core.links_up(None) == 0
            for ep in eps:
                await ep.close()
        finally:
            await core.stop()
    run(main())


def test_slow_consumer_idle_is_a_checked_config_key() -> None:
    """How long an output that pushed back may wait before it stops holding credit: 0 (at
    once) by default, configurable, never negative."""
    base = {"router": {"name": "r"}}
    assert config_from_dict(base).slow_consumer_idle == 0.02
    cfg = config_from_dict({"router": {"name": "r", "slow_consumer_idle": 0.05}})
    assert cfg.slow_consumer_idle == 0.05
    with pytest.raises(ConfigError, match="slow_consumer_idle"):
        config_from_dict({"router": {"name": "r", "slow_consumer_idle": -1}})
