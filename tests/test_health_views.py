"""Health that means something, and list views (issue 28).

* ``/healthz`` answered 200 "ok; configured peers down: r2" with every peer down: now
  readiness (``/readyz``, ``/healthz`` its alias) is 503 until a configured peer is up, and
  liveness (``/livez``) is separate;
* per-link bytes in and out, and per-flow members, in status and ``/metrics``;
* lists that sort and limit: ``/status?sort=&limit=``, ``/links``, ``/flows``, the control
  ``status`` command and ``flowrouter status --sort --limit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import flowlib
from flowrouter.monitor import MonitorServer, render_metrics, start_monitor
from flowrouter.net import listviews
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.observe import router_health, router_live, router_source
from flowrouter.net.runtime import RouterNode, query_control

from .ports import free_port
from .rawep import run, within
from .test_monitor import get


def test_ready_only_with_a_configured_peer_up_live_regardless() -> None:
    async def go() -> None:
        hub = RouterNode(NodeConfig("hub", listen="127.0.0.1:0", core_lsids=frozenset({0x10}),
                                    accept_routers=["edge@127.0.0.1"]))
        edge = RouterNode(NodeConfig("edge", listen="127.0.0.1:0", reconnect_min=0.05,
                                     reconnect_max=0.1, peers=[
                                         PeerConfig(f"127.0.0.1:{free_port()}", "hub"),
                                         PeerConfig(f"127.0.0.1:{free_port()}", "ghost")]))
        await edge.start()
        mon = await start_monitor(router_source(edge), "127.0.0.1:0")
        assert mon is not None
        try:
            for path in ("/readyz", "/healthz"):
                code, _, body = await get(mon.address, path)
                doc = json.loads(body)
                assert code == 503 and doc["ready"] is False, (path, doc)
                assert "no configured peer is up" in doc["detail"]
                assert "hub" in doc["detail"] and "ghost" in doc["detail"]
            code, _, body = await get(mon.address, "/livez")
            assert code == 200 and json.loads(body)["live"] is True
            code, _, body = await get(mon.address, "/peers?sort=attempts")
            peers = json.loads(body)["peers"]
            assert all(p["up"] is False and p["attempts"] >= 1 and p["backoff"] > 0
                       for p in peers), peers  # how hard it has been trying, and how often
            # the hub comes up where edge dials it: ready with one of two peers up
            await hub.start()
            await edge.stop()
            edge2 = RouterNode(NodeConfig("edge", listen="127.0.0.1:0", peers=[
                PeerConfig("%s:%d" % hub.tcp_address, "hub"),
                PeerConfig(f"127.0.0.1:{free_port()}", "ghost")]))
            await edge2.start()
            await edge2.wait_peers_up(1)
            ok, why = router_health(edge2)
            assert ok and "ghost" in why
            await edge2.stop()
            assert router_health(edge2) == (False, "stopping")
            assert router_live(edge2) == (False, "stopped")
        finally:
            await mon.stop()
            await hub.stop()

    run(go())


def test_without_peers_ready_means_listening() -> None:
    async def go() -> None:
        node = RouterNode(NodeConfig("solo", listen="127.0.0.1:0"))
        await node.start()
        assert router_health(node) == (True, "ok") and node.listening
        await node.stop()
        assert not node.listening and not router_health(node)[0]

    run(go())


@contextlib.asynccontextmanager
async def _pair_with_traffic(monitored: str
                             ) -> AsyncIterator[tuple[RouterNode, RouterNode, MonitorServer]]:
    """hub (the core) and edge (dialling it), an application on each, three flows (two
    listened to on hub, twenty 1000-byte messages on the first), and HTTP monitoring of
    the *monitored* one."""
    hub = RouterNode(NodeConfig("hub", listen="127.0.0.1:0", core_lsids=frozenset({0x10}),
                                default_lsid=0x10, accept_routers=["edge@127.0.0.1"]))
    await hub.start()
    edge = RouterNode(NodeConfig("edge", listen="127.0.0.1:0", default_lsid=0x10, peers=[
        PeerConfig("%s:%d" % hub.tcp_address, "hub")]))
    await edge.start()
    mon = None
    try:
        await edge.wait_peers_up(1)
        await within(edge.wait_routes(0x10))
        tx = await within(flowlib.connect(["%s:%d" % edge.tcp_address], name="tx"))
        rx = await within(flowlib.connect(["%s:%d" % hub.tcp_address], name="rx"))
        flows = [await tx.create() for _ in range(3)]
        listeners = [await rx.listen(f, "data") for f in flows[:2]]
        for _ in range(20):
            await tx.send(flows[0], bytes(1000))
        for _ in range(20):
            await within(listeners[0].get())
        mon = await start_monitor(router_source(hub if monitored == "hub" else edge),
                                  "127.0.0.1:0")
        assert mon is not None
        yield hub, edge, mon
        await tx.close()
        await rx.close()
    finally:
        if mon is not None:
            await mon.stop()
        await edge.stop()
        await hub.stop()


def test_link_bytes_and_flow_members_in_status_and_metrics() -> None:
    async def go() -> None:
        async with _pair_with_traffic("edge") as (hub, edge, mon):
            def router_row(node: RouterNode) -> dict[str, Any]:
                return next(r for r in node.status()["links"] if r["role"] == "router")

            # all of it has arrived: what edge wrote on the link is what hub read
            for _ in range(200):
                if router_row(edge)["bytes_out"] == router_row(hub)["bytes_in"]:
                    break
                await asyncio.sleep(0.01)  # no event for "the kernel delivered it"
            out, into = router_row(edge)["bytes_out"], router_row(hub)["bytes_in"]
            assert out == into and out > 20 * 1000
            app = next(r for r in edge.status()["links"] if r["role"] == "endpoint")
            assert app["bytes_in"] > 20 * 1000 and app["bytes_out"] > 0
            code, _, body = await get(mon.address, "/metrics")
            samples = [s for f in text_string_to_metric_families(body.decode())
                       for s in f.samples]
            link_bytes = {(s.labels["peer"], s.labels["direction"]): s.value
                          for s in samples if s.name == "flownet_router_link_bytes_total"}
            assert link_bytes[("hub", "tx")] >= out
            flows = hub.status()["flows"]
            assert {f["members"] for f in flows} >= {1}
            busy = max(flows, key=lambda f: f["bytes"])  # per-flow counters: 20 x 1000 B
            assert busy["frames"] == 20 and busy["bytes"] >= 20 * (1000 + 24)
            assert sorted(f["frames"] for f in flows) == [0, 20]  # the other: no traffic
            hub_samples = [s for f in text_string_to_metric_families(
                render_metrics(router_source(hub)).decode()) for s in f.samples]
            members = {s.labels["flow"]: s.value for s in hub_samples
                       if s.name == "flownet_router_flow_members"}
            assert members == {f["flow"]: f["members"] for f in flows}
            by_flow = {s.labels["flow"]: s.value for s in hub_samples
                       if s.name == "flownet_router_flow_bytes_total"}
            assert by_flow[busy["flow"]] == busy["bytes"]

    run(go())


def test_lists_sort_and_limit_over_http_control_and_cli() -> None:
    async def go() -> None:
        async with _pair_with_traffic("hub") as (hub, _edge, mon):
            code, _, body = await get(mon.address, "/links?sort=bytes_in&limit=1")
            doc = json.loads(body)
            assert code == 200 and len(doc["links"]) == 1 and doc["links_total"] == 2
            everyone = hub.status()["links"]
            assert doc["links"][0]["bytes_in"] == max(r["bytes_in"] for r in everyone)
            code, _, body = await get(mon.address, "/links?sort=-bytes_in")
            rows = json.loads(body)["links"]
            assert [r["bytes_in"] for r in rows] == sorted(r["bytes_in"] for r in rows)
            code, _, body = await get(mon.address, "/status?sort=members&limit=1")
            st = json.loads(body)
            assert code == 200 and st["name"] == "hub" and len(st["flows"]) == 1
            assert st["flows_total"] >= 2 and len(st["links"]) == 1
            assert st["flows"][0]["members"] == max(f["members"] for f in hub.status()["flows"])
            code, _, body = await get(mon.address, "/flows?sort=bytes&limit=1")
            doc = json.loads(body)  # per-flow counters sort: the busy flow first
            assert code == 200 and len(doc["flows"]) == 1 and doc["flows_total"] >= 2
            assert doc["flows"][0]["frames"] == 20 and doc["flows"][0]["bytes"] == max(
                f["bytes"] for f in hub.status()["flows"])
            code, _, body = await get(mon.address, "/flows?sort=-frames")
            assert json.loads(body)["flows"][0]["frames"] == 0
            code, _, body = await get(mon.address, "/flows?sort=nonsense")
            assert code == 400 and "cannot sort by 'nonsense'" in json.loads(body)["error"]
            assert (await get(mon.address, "/peers?limit=x"))[0] == 400

    run(go())


def test_control_status_and_the_cli_sort_and_limit() -> None:
    async def go() -> None:
        node = RouterNode(NodeConfig("solo", listen="127.0.0.1:0", control="127.0.0.1:0",
                                     core_lsids=frozenset({0x10}), default_lsid=0x10,
                                     peers=[PeerConfig(f"127.0.0.1:{free_port()}", "ghost")]))
        await node.start()
        try:
            apps = [await within(flowlib.connect(["%s:%d" % node.tcp_address], name=f"a{i}"))
                    for i in range(3)]
            await apps[2].send(await apps[2].create(), bytes(5000))
            ctl = "%s:%d" % node.control_address
            reply = await query_control(ctl, "status", sort="bytes_in", limit=2)
            st = reply["status"]
            assert len(st["links"]) == 2 and st["links_total"] == 3
            assert st["links"][0]["peer"] == "a2"
            with pytest.raises(ConnectionError, match="cannot sort by"):
                await query_control(ctl, "status", sort="bogus")
            out = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "flowrouter.tools.cli", "status", "--control", ctl,
                "--sort", "bytes_in", "--limit", "1"], capture_output=True, text=True,
                check=False)
            assert out.returncode == 0, out.stderr
            assert "bytes in" in out.stdout and "(1 of 3 links)" in out.stdout
            assert " a2 " in out.stdout and " a0 " not in out.stdout
            # the configured peer that is down, why, and how the re-dialling goes
            assert "CONFIGURED PEERS DOWN" in out.stdout
            assert re.search(r"ghost +127\.0\.0\.1:\d+ +cannot connect: .* failed attempts",
                             out.stdout), out.stdout
            assert st["peers"][0]["peer"] == "ghost" and st["peers"][0]["attempts"] >= 1
            for app in apps:
                await app.close()
        finally:
            await node.stop()

    run(go())


def test_views_are_pure() -> None:
    rows = [{"id": 1, "peer": "b", "rx": 5}, {"id": 2, "peer": "a", "rx": 9},
            {"id": 3, "peer": None, "rx": 1}]
    assert [r["id"] for r in listviews.view(rows, "rx", None)] == [2, 1, 3]
    assert [r["id"] for r in listviews.view(rows, "-rx", 2)] == [3, 1]
    assert [r["id"] for r in listviews.view(rows, "peer", None)] == [2, 1, 3]  # None last
    assert listviews.apply({"links": rows}, None, "0")["links"] == []
    with pytest.raises(listviews.ViewError):
        listviews.check_view(None, -1)


def test_stopping_with_open_http_and_control_connections_logs_no_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 28: stopping a router with open HTTP connections logged a CancelledError
    traceback per connection (about 1,100 with many open)."""
    async def go() -> None:
        node = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", control="127.0.0.1:0"))
        await node.start()
        mon = await start_monitor(router_source(node), "127.0.0.1:0")
        assert mon is not None
        held = [await asyncio.open_connection(*mon.address) for _ in range(20)]
        held += [await asyncio.open_connection(*node.control_address) for _ in range(20)]
        await asyncio.sleep(0.05)  # the server has taken them (no event for an accept)
        await mon.stop()
        await node.stop()
        for _, writer in held:
            writer.close()

    asyncio.run(go())  # asyncio.run cancels what is left, as a process stopping does
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_flow_counters_survive_the_fast_paths_mirror_being_rebuilt() -> None:
    """The forwarding fast path counts a flow's frames in its copy of the entry and hands
    them to the core's entry when a change makes it forget that copy (a member joining)."""
    async def go() -> None:
        node = RouterNode(NodeConfig("solo", listen="127.0.0.1:0",
                                     core_lsids=frozenset({0x10}), default_lsid=0x10))
        await node.start()
        try:
            addr = "%s:%d" % node.tcp_address
            tx = await within(flowlib.connect([addr], name="tx"))
            rx1 = await within(flowlib.connect([addr], name="rx1"))
            flow = await tx.create()
            first = await rx1.listen(flow, "data")
            for _ in range(10):
                await tx.send(flow, b"x" * 100)
            for _ in range(10):
                await within(first.get())
            rx2 = await within(flowlib.connect([addr], name="rx2"))
            second = await rx2.listen(flow, "data")  # the entry changes: the copy goes
            for _ in range(5):
                await tx.send(flow, b"y" * 100)
            for _ in range(5):
                await within(second.get())
            row = next(f for f in node.status()["flows"] if f["flow"] == str(flow))
            assert row["frames"] == 15 and row["bytes"] == 15 * (100 + 24)
            for app in (tx, rx1, rx2):
                await app.close()
        finally:
            await node.stop()

    run(go())
