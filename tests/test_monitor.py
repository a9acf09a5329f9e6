"""HTTP monitoring: /healthz, /status and /metrics of a live router, scraped and parsed with
prometheus_client's own parser; hostile requests get an HTTP error, not a traceback."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import flowlib
from flowrouter.monitor import MAX_REQUEST_HEAD, Monitored, MonitorServer, start_monitor
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.observe import router_source
from flowrouter.net.runtime import RouterNode

from .ports import free_port
from .rawep import run, within


async def http(url_host: tuple[str, int], raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection(*url_host)
    writer.write(raw)
    data = await within(reader.read())
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


async def get(addr: tuple[str, int], path: str) -> tuple[int, dict[str, str], bytes]:
    return await http(addr, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def test_router_status_health_and_metrics() -> None:
    async def go() -> None:
        ghost = f"127.0.0.1:{free_port()}"
        hub = RouterNode(NodeConfig("hub", listen="127.0.0.1:0", core_lsids=frozenset({0x10}),
                                    default_lsid=0x10, accept_routers=["edge@127.0.0.1"]))
        await hub.start()
        edge = RouterNode(NodeConfig("edge", listen="127.0.0.1:0", default_lsid=0x10,
                                     reconnect_min=0.05, reconnect_max=0.2, peers=[
                                         PeerConfig("%s:%d" % hub.tcp_address, name="hub"),
                                         PeerConfig(ghost, name="ghost")]))
        await edge.start()
        mon = await start_monitor(router_source(edge), "127.0.0.1:0")
        assert mon is not None
        try:
            await edge.wait_peers_up(1)
            app = await within(flowlib.connect(["%s:%d" % edge.tcp_address], name="app"))
            flow = await app.create()
            await app.listen(flow, [32])
            for _ in range(200):  # until the ghost's dial has failed at least once
                if ghost in edge.peer_errors:
                    break
                await asyncio.sleep(0.01)

            code, _, body = await get(mon.address, "/healthz")
            assert code == 200 and json.loads(body)["status"] == "ok"
            assert "ghost" in json.loads(body)["detail"]

            code, headers, body = await get(mon.address, "/status")
            st = json.loads(body)
            assert code == 200 and headers["Content-Type"] == "application/json"
            assert st["name"] == "edge" and st["kind"] == "router" and st["version"]
            assert st["uptime"] >= 0 and st["flow_count"] >= 1
            peers = {p["peer"]: p for p in st["peers"]}
            assert peers["hub"]["up"] is True
            assert peers["ghost"]["up"] is False
            assert "cannot connect" in peers["ghost"]["last_error"]
            assert "counters" in st and "alerts" in st

            code, headers, body = await get(mon.address, "/metrics")
            assert code == 200 and headers["Content-Type"].startswith("text/plain")
            samples: dict[str, list[Any]] = {}
            for family in text_string_to_metric_families(body.decode()):
                for s in family.samples:
                    samples.setdefault(s.name, []).append(s)
            info = samples["flownet_info"][0]
            assert info.labels["kind"] == "router" and info.labels["name"] == "edge"
            up = {s.labels["peer"]: s.value for s in samples["flownet_router_peer_up"]}
            assert up == {"hub": 1.0, "ghost": 0.0}
            assert samples["flownet_router_flows"][0].value >= 1
            links = {(s.labels["role"], s.labels["state"]): s.value
                     for s in samples["flownet_router_links"]}
            assert links[("router", "up")] == 1 and links[("endpoint", "up")] == 1
            assert any(s.labels["direction"] == "rx" and s.value > 0
                       for s in samples["flownet_router_link_frames_total"])
            assert "flownet_router_events_total" in samples
            await app.close()
        finally:
            await mon.stop()
            await edge.stop()
            await hub.stop()

    run(go())


def test_hostile_requests_get_http_errors() -> None:
    async def go() -> None:
        src = Monitored(kind="test", name="t", status=lambda: {"x": 1})
        mon = MonitorServer(src, ("127.0.0.1", 0))
        await mon.start()
        try:
            addr = mon.address
            assert (await get(addr, "/nope"))[0] == 404
            assert (await http(addr, b"POST /status HTTP/1.1\r\n\r\n"))[0] == 405
            assert (await http(addr, b"garbage\r\n\r\n"))[0] == 400
            big = b"GET / HTTP/1.1\r\nX: " + b"a" * (2 * MAX_REQUEST_HEAD) + b"\r\n\r\n"
            assert (await http(addr, big))[0] == 431
            assert mon.rejected == 2
            code, _, body = await get(addr, "/status")  # and it still serves
            assert code == 200 and json.loads(body)["x"] == 1
        finally:
            await mon.stop()

    run(go())


def test_port_in_use_leaves_the_process_running_without_http(
        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            src = Monitored(kind="test", name="t", status=dict)
            assert await start_monitor(src, "127.0.0.1:%d" % s.getsockname()[1]) is None

    run(go())
    assert any("no HTTP monitoring" in r.getMessage() for r in caplog.records)


def test_directory_member_and_chat_server_serve_metrics() -> None:
    from flowchat.cli import chat_source
    from flowchat.server import ChatServer
    from flowdir.cli import _member_source
    from flowdir.member import DirectoryMember

    async def scrape(source: Monitored) -> dict[str, Any]:
        mon = await start_monitor(source, "127.0.0.1:0")
        assert mon is not None
        try:
            code, _, body = await get(mon.address, "/metrics")
            assert code == 200
            health = json.loads((await get(mon.address, "/healthz"))[2])
        finally:
            await mon.stop()
        samples = {s.name: s for f in text_string_to_metric_families(body.decode())
                   for s in f.samples}
        return {"samples": samples, "health": health}

    async def go() -> None:
        async with RouterNode(NodeConfig("hub", listen="127.0.0.1:0",
                                         core_lsids=frozenset({0x10}), default_lsid=0x10)
                              ) as hub:
            addr = "%s:%d" % hub.tcp_address
            member = await within(DirectoryMember.connect([addr], lsid=0x10))
            try:
                got = await scrape(_member_source(member))
                assert got["samples"]["flownet_info"].labels["kind"] == "directory"
                assert got["samples"]["flownet_directory_entries"].value == 0
                assert got["health"]["status"] == "ok"
            finally:
                await member.stop()
            srv = ChatServer("a", [addr], sites=["a"], room="r", listen="127.0.0.1:0",
                             use_directory=False)
            await within(srv.start())
            try:
                got = await scrape(chat_source(srv))
                assert got["samples"]["flownet_info"].labels["kind"] == "chat-server"
                assert got["samples"]["flownet_chat_clients"].value == 0
                assert got["samples"]["flownet_chat_router_connected"].value == 1
            finally:
                await srv.stop()

    run(go())
