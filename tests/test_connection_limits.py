"""Connections: caps per port, idle time-outs, and a descriptor budget that keeps room for
routers.

Attacks (1,100 idle connections to the HTTP monitor or the control port exhausted a router
started with 1024 descriptors; idle control connections never timed out; neither port
capped connections): the control port and the HTTP monitor take at most so many
connections at once and answer the rest with the reason; idle ones are closed; once the
descriptors in use reach the limit minus the reserve, applications are refused with the
reason while a router still gets in after a link cut. Every limit is configurable
(``[limits]``) and reported (counters, the status's ``connections``).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from flowrouter.monitor import start_monitor
from flowrouter.net.config import ConfigError, NodeConfig, PeerConfig
from flowrouter.net.configfile import config_from_dict
from flowrouter.net.connlimits import (
    CONTROL,
    DIAL,
    HTTP,
    ConnectionGate,
    ServerLimits,
    descriptors_open,
)
from flowrouter.net.observe import router_source
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C

from .rawep import RawEndpoint, addr, run, until, within


# ---------------------------------------------------------------- the gate on its own
def test_gate_caps_ports_keeps_a_reserve_and_reports() -> None:
    told: list[str | None] = []
    counters: Counter[str] = Counter()
    lim = ServerLimits(listen_connections=3, control_connections=2, http_connections=1,
                       descriptor_reserve=4)
    # 22 descriptors, 10 in use before serving: applications up to 18, routers up to 20
    gate = ConnectionGate(lim, counters, descriptors=22, baseline=10, on_budget=told.append)
    port = "listen 127.0.0.1:7000"
    assert [gate.admit(port, 0.0) for _ in range(3)] == [None] * 3
    assert "3 connections at once" in str(gate.admit(port, 0.0))
    gate.proven_router(port)  # a router does not count against the port
    assert gate.admit(port, 0.0) is None
    assert gate.admit(CONTROL, 0.0) is None and gate.admit(HTTP, 0.0) is None
    assert "1 connections at once" in str(gate.admit(HTTP, 0.0))
    assert counters["refused.port-connections"] == 2
    assert gate.in_use == 16 and told == []
    other = "listen 127.0.0.1:7002"
    assert gate.admit(other, 0.0) is None and gate.admit(other, 0.0) is None
    # 18 in use: applications are refused from now on (the core is told why)
    assert told and told[-1] is not None and "descriptor budget" in told[-1]
    assert "descriptor budget" in str(gate.admit(CONTROL, 0.0))
    assert "descriptor budget" in str(gate.admit("listen 127.0.0.1:7001", 0.0, routers=False))
    assert gate.admit(other, 0.0) is None  # a router may still come: 19
    third = "listen 127.0.0.1:7003"
    assert gate.admit(third, 0.0) is None  # 20: the hard limit
    assert "descriptor budget" in str(gate.admit(third, 0.0))
    assert gate.admit(DIAL, 0.0) is None  # dialling out is never refused here
    assert counters["refused.descriptors"] == 3
    for _ in range(3):
        gate.release(other)
    gate.release(third)
    assert told[-1] is None  # under the application limit again
    st = gate.status()
    assert st["descriptors"] == 22 and st["reserve"] == 4 and st["in_use"] == 17
    assert st["open"][DIAL] == 1 and st["applications_refused"] is None


def test_limits_are_configurable_and_checked() -> None:
    cfg = config_from_dict({"router": {"name": "r"}, "limits": {
        "listen_connections": 100, "control_connections": 5, "http_connections": 6,
        "control_idle": 2.5, "http_idle": 1.5, "descriptor_reserve": 32, "descriptors": 500,
        "work_per_tick": 1000, "work_backlog": 2000, "control_per_tick": 300}})
    assert cfg.limits.control_connections == 5 and cfg.limits.descriptors == 500
    assert cfg.params().work_per_tick == 1000 and cfg.params().work_backlog == 2000
    assert cfg.params().control_per_tick == 300
    for bad, match in (({"control_idle": 0}, "control_idle"),
                       ({"nope": 1}, "unknown"),
                       ({"descriptors": 10, "descriptor_reserve": 20}, "descriptors"),
                       ({"work_per_tick": 0}, "work_per_tick")):
        with pytest.raises(ConfigError, match=match):
            config_from_dict({"router": {"name": "r"}, "limits": bad})


# ---------------------------------------------------------------- control port
def test_control_port_caps_connections() -> None:
    async def main() -> None:
        node = RouterNode(NodeConfig("r", listen="127.0.0.1:0", control="127.0.0.1:0",
                                     limits={"control_connections": 3}))
        await node.start()
        try:
            host, port = node.control_address
            idle = [await asyncio.open_connection(host, port) for _ in range(3)]
            await until(lambda: node.gate.open_by_port.get(CONTROL) == 3)
            r4, w4 = await asyncio.open_connection(host, port)
            reply = json.loads(await within(r4.readline()))
            assert not reply["ok"] and "3 connections at once" in reply["error"]
            assert await within(r4.read()) == b""  # and closed
            assert node.core.counters["refused.port-connections"] == 1
            assert [a["kind"] for a in node.status()["alerts"]] == ["port-connections"]
            for _r, w in idle:  # room again once they go
                w.close()
            await until(lambda: CONTROL not in node.gate.open_by_port)
            r5, w5 = await asyncio.open_connection(host, port)
            w5.write(b'{"cmd": "ping"}\n')
            assert json.loads(await within(r5.readline()))["name"] == "r"
            w5.close()
            w4.close()
        finally:
            await node.stop()

    run(within(main(), 60))


def test_idle_control_connections_are_closed() -> None:
    async def main() -> None:
        node = RouterNode(NodeConfig("r", listen="127.0.0.1:0", control="127.0.0.1:0",
                                     limits={"control_idle": 0.3}))
        await node.start()
        try:
            host, port = node.control_address
            idle = [await asyncio.open_connection(host, port) for _ in range(3)]
            for r, _w in idle:  # each told why, then closed
                line = json.loads(await within(r.readline(), 10))
                assert "idle for 0.3s" in line["error"]
                assert await within(r.read()) == b""
            await until(lambda: CONTROL not in node.gate.open_by_port)
            assert node.core.counters["closed.idle-control"] == 3
            # a client that keeps talking is not cut off
            r, w = await asyncio.open_connection(host, port)
            for _ in range(4):
                w.write(b'{"cmd": "ping"}\n')
                assert json.loads(await within(r.readline()))["ok"]
                await asyncio.sleep(0.1)
            w.close()
            for _r, w in idle:
                w.close()
        finally:
            await node.stop()

    run(within(main(), 60))


# ---------------------------------------------------------------- HTTP monitor
def test_http_monitor_caps_connections_and_times_out_idle_ones() -> None:
    async def main() -> None:
        node = RouterNode(NodeConfig("r", listen="127.0.0.1:0",
                                     limits={"http_connections": 4}))
        await node.start()
        lim = node.config.limits
        capped = await start_monitor(router_source(node), "127.0.0.1:0",
                                     max_connections=lim.http_connections, check=node.gate)
        quick = await start_monitor(router_source(node), "127.0.0.1:0",
                                    request_timeout=0.3)  # its own cap, the default
        assert capped is not None and quick is not None
        try:
            host, port = capped.address
            idle = [await asyncio.open_connection(host, port) for _ in range(4)]
            await until(lambda: node.gate.open_by_port.get(HTTP) == 4)
            r5, w5 = await asyncio.open_connection(host, port)
            head = await within(r5.read())
            assert head.startswith(b"HTTP/1.1 503") and b"4 connections at once" in head
            assert node.core.counters["refused.port-connections"] == 1
            for _r, w in idle:
                w.close()
            await until(lambda: HTTP not in node.gate.open_by_port)
            r6, w6 = await asyncio.open_connection(host, port)
            w6.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert (await within(r6.read())).startswith(b"HTTP/1.1 200")
            # an idle connection is answered 408 and closed after the request time-out
            qr, qw = await asyncio.open_connection(*quick.address)
            assert (await within(qr.read(), 10)).startswith(b"HTTP/1.1 408")
            assert quick.rejected == 1
            for w in (w5, w6, qw):
                w.close()
        finally:
            await capped.stop()
            await quick.stop()
            await node.stop()

    run(within(main(), 60))


# ---------------------------------------------------------------- descriptor budget
def test_descriptor_budget_refuses_applications_and_keeps_room_for_routers() -> None:
    async def main() -> None:
        budget = descriptors_open() + 40
        core = RouterNode(NodeConfig(
            "core", listen="127.0.0.1:0", core_lsids=frozenset({0x10}), default_lsid=0x10,
            accept_routers=["edge@127.0.0.1"], control="127.0.0.1:0",
            limits={"descriptors": budget, "descriptor_reserve": 16}))
        await core.start()
        edge = RouterNode(NodeConfig("edge", listen="127.0.0.1:0", default_lsid=0x10,
                                     peers=[PeerConfig(addr(core), "core")],
                                     reconnect_min=0.05, reconnect_max=0.2))
        await edge.start()
        idle: list[asyncio.StreamWriter] = []
        gate = core.gate
        try:
            await within(core.wait_peers_up(1))
            host, port = core.tcp_address
            while gate.in_use < gate.app_limit:  # idle connections up to the app budget
                _r, w = await asyncio.open_connection(host, port)
                idle.append(w)
                n = len(idle)
                await until(lambda n=n: core.core.counters["links.up"] >= 1
                            and gate.open_by_port.get(f"listen {host}:{port}", 0) >= n)
            assert core.status()["connections"]["applications_refused"]
            # an application is refused with the reason, after its HELLO
            app = await RawEndpoint.connect(core, "app")
            text = ""
            while not text:
                _h, payload = await app.next_frame()
                msg = C.decode(payload)
                if isinstance(msg, C.Error):
                    text = msg.text
            assert "descriptor budget" in text
            assert core.core.counters["refused.descriptors"] >= 1
            await app.close()
            # the control port takes no new connection now (told why)
            cr, cw = await asyncio.open_connection(*core.control_address)
            assert "descriptor budget" in json.loads(await within(cr.readline()))["error"]
            cw.close()
            assert {a["kind"] for a in core.status()["alerts"]} == {"descriptors"}
            # a router that lost its link comes back, from the reserve
            for lid, lk in list(edge.core.links.items()):
                if lk.role is C.Role.ROUTER:
                    edge.links[lid].close("cable cut")
            await until(lambda: core.core.counters["links.down"] >= 2)
            await within(core.wait_peers_up(1))
        finally:
            for w in idle:
                w.close()
            await edge.stop()
            await core.stop()

    run(within(main(), 90))


def test_a_monitor_without_a_gate_caps_connections_itself() -> None:
    """Every process's HTTP monitor (directory, chat) is capped, not only a router's."""
    from flowrouter.monitor import Monitored, MonitorServer

    async def main() -> None:
        mon = MonitorServer(Monitored(kind="test", name="t", status=lambda: {}),
                            ("127.0.0.1", 0), max_connections=2)
        await mon.start()
        try:
            idle = [await asyncio.open_connection(*mon.address) for _ in range(2)]
            await until(lambda: mon.open == 2)
            r, w = await asyncio.open_connection(*mon.address)
            assert (await within(r.read())).startswith(b"HTTP/1.1 503")
            assert mon.rejected == 1
            for _r, iw in idle:
                iw.close()
            w.close()
        finally:
            await mon.stop()

    run(within(main(), 30))


def test_a_configured_descriptor_count_never_exceeds_the_process_limit() -> None:
    gate = ConnectionGate(ServerLimits(descriptors=10**6), Counter(), descriptors=1024,
                          baseline=0)
    assert gate.descriptors == 1024
    gate = ConnectionGate(ServerLimits(descriptors=500), Counter(), descriptors=1024,
                          baseline=0)
    assert gate.descriptors == 500
