"""Operating a running router (issue 28): reload (SIGHUP, ``flowrouter ctl reload``), log
reopen (SIGUSR1) and drain (``flowrouter ctl drain``, SIGUSR2). SIGHUP used to kill the
router; there was no drain."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flowlib
from flowrouter.net.config import ConfigError, Emulation, NodeConfig, PeerConfig
from flowrouter.net.observe import router_health
from flowrouter.net.runtime import RouterNode, query_control
from flowrouter.wire import control as C

from .ports import free_port
from .rawep import run, within


def _cfg(name: str, **kw: object) -> NodeConfig:
    return NodeConfig(name, listen="127.0.0.1:0", **kw)  # type: ignore[arg-type]


async def _both_up(hub: RouterNode, edge: RouterNode) -> None:
    """Up on both sides: a link the hub refused before its reload may come up at the edge
    for a moment, until the hub's refusal arrives; wait for the one the hub kept (a link
    coming up has no event on both routers at once: a bounded poll)."""
    for _ in range(1000):
        if hub.links_up() == 1 and edge.links_up() == 1:
            break
        await asyncio.sleep(0.01)
    assert hub.links_up() == 1 and edge.links_up() == 1


def test_reload_changes_peers_accept_lists_limits_and_emulation_live() -> None:
    async def go() -> None:
        hub = RouterNode(_cfg("hub", core_lsids=frozenset({0x10})))
        await hub.start()
        hub_addr = "%s:%d" % hub.tcp_address
        edge = RouterNode(_cfg("edge", reconnect_min=0.05, reconnect_max=0.2))
        await edge.start()
        try:
            # a peer added by a reload is dialled; the hub refuses it until its accept list
            # is reloaded too
            peer = PeerConfig(hub_addr, "hub")
            diff = edge.ops.reload(_cfg("edge", reconnect_min=0.05, reconnect_max=0.2,
                                        peers=[peer]))
            assert diff == [f"peer added: hub at {hub_addr}"]
            for _ in range(500):
                if hub.core.counters["refused.router-claim"]:
                    break
                await asyncio.sleep(0.01)
            assert hub.core.counters["refused.router-claim"] >= 1
            diff = hub.ops.reload(_cfg("hub", core_lsids=frozenset({0x10}),
                                       accept_routers=["edge@127.0.0.1"], max_flows=10,
                                       quota={"flows": 7}))
            assert "accept_routers: [] -> ['edge@127.0.0.1']" in diff
            assert "max_flows: 1000000 -> 10" in diff
            assert hub.core.p.max_flows == 10 and hub.core.trust.limits.flows == 7
            await _both_up(hub, edge)
            # emulation defaults: a delay toward the hub, live on the link that is up
            diff = edge.ops.reload(_cfg("edge", reconnect_min=0.05, reconnect_max=0.2,
                                        peers=[peer], emulation={"hub": Emulation(delay=0.2)}))
            assert diff == ["emulation toward hub: none -> 200 ms delay"]
            row: dict = {}  # type: ignore[type-arg]
            for _ in range(500):  # (the link the hub kept: emulated too, once up)
                row = next((r for r in edge.status()["links"] if r["peer"] == "hub"
                            and r["state"] == "up" and "output" in r), {})
                if "emulation" in row.get("output", {}):
                    break
                await asyncio.sleep(0.01)
            assert "emulation" in row["output"]
            # the hub takes edge off its accept list: the link is cut, and stays refused
            diff = hub.ops.reload(_cfg("hub", core_lsids=frozenset({0x10}), max_flows=10,
                                       quota={"flows": 7}))
            assert "closed 1 router link(s) no longer accepted" in diff
            assert hub.links_up() == 0
            refused = hub.core.counters["refused.router-claim"]
            for _ in range(500):
                if hub.core.counters["refused.router-claim"] > refused:
                    break
                await asyncio.sleep(0.01)
            assert hub.core.counters["refused.router-claim"] > refused and hub.links_up() == 0
            hub.ops.reload(_cfg("hub", core_lsids=frozenset({0x10}), max_flows=10,
                                quota={"flows": 7}, accept_routers=["edge@127.0.0.1"]))
            await _both_up(hub, edge)
            # the peer removed: its link closes and is not dialled again
            diff = edge.ops.reload(_cfg("edge", reconnect_min=0.05, reconnect_max=0.2))
            assert f"peer removed: hub at {hub_addr}" in diff
            await asyncio.sleep(0.5)  # several back-off periods: no re-dial may happen
            assert edge.links_up() == 0 and hub.links_up() == 0
        finally:
            await edge.stop()
            await hub.stop()

    run(go())


def test_ctl_drain_timeout_is_the_drains_own() -> None:
    from flowrouter.tools.ctl import _arguments

    assert _arguments(["timeout=60"], "drain") == {"grace": 60}
    with pytest.raises(Exception, match="not a command argument"):
        _arguments(["timeout=60"], "link")


def test_reload_refuses_what_needs_a_restart_and_keeps_the_running_config() -> None:
    async def go() -> None:
        node = RouterNode(_cfg("r1", max_flows=5))
        await node.start()
        try:
            running = node.config
            with pytest.raises(ConfigError, match="only a restart can change name, listen"):
                node.ops.reload(NodeConfig("r9", listen="127.0.0.1:1", max_flows=6))
            assert node.config is running and node.core.p.max_flows == 5
            with pytest.raises(ConfigError, match=r"\[limits\] work_per_tick"):
                node.ops.reload(_cfg("r1", max_flows=5, limits={"work_per_tick": 10}))
            diff = node.ops.reload(_cfg("r1", max_flows=5, limits={"listen_connections": 3}))
            assert diff == ["[limits] listen_connections: 4096 -> 3"]
            assert node.gate.limits.listen_connections == 3  # admission reads it now
            reply = node.ops.reload_logged()  # no source: built in code
            assert not reply["ok"] and "not started from a config file" in reply["error"]
        finally:
            await node.stop()

    run(go())


def _start(tmp: Path, text: str, *extra: str) -> subprocess.Popen[bytes]:
    (tmp / "r1.toml").write_text(text)
    return subprocess.Popen([sys.executable, "-m", "flowrouter.tools.cli", "--log-level",
                             "info", "--log-file", str(tmp / "r1.log"), "run", "--config",
                             str(tmp / "r1.toml"), *extra])


def _wait_log(path: Path, text: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while True:  # a process's log has no event here: a bounded poll
        body = path.read_text() if path.exists() else ""
        if text in body:
            return body
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{body[-3000:]}"
        time.sleep(0.05)


def test_sighup_reloads_ctl_reload_reports_a_bad_file_sigusr1_reopens_the_log(
        tmp_path: Path) -> None:
    port, ctl = free_port(), free_port()
    base = (f'[router]\nname = "r1"\nlisten = "127.0.0.1:{port}"\n'
            f'control = "127.0.0.1:{ctl}"\nhttp = "off"\n')
    proc = _start(tmp_path, base + "max_flows = 100\n")
    log = tmp_path / "r1.log"
    try:
        _wait_log(log, "running")
        (tmp_path / "r1.toml").write_text(base + "max_flows = 50\n"
                                          '[[peer]]\nname = "r2"\naddress = "127.0.0.1:9"\n')
        proc.send_signal(signal.SIGHUP)
        body = _wait_log(log, "reload: peer added: r2 at 127.0.0.1:9")
        assert "reload: max_flows: 100 -> 50" in body and proc.poll() is None
        # a broken file: the router runs on with what it had, and says why
        (tmp_path / "r1.toml").write_text(base + "max_flows = -3\n")
        with pytest.raises(ConnectionError, match="reload failed, the running "
                                                  "configuration stays: .*max_flows"):
            asyncio.run(query_control(f"127.0.0.1:{ctl}", "reload"))
        assert proc.poll() is None
        st = asyncio.run(query_control(f"127.0.0.1:{ctl}"))["status"]
        assert st["name"] == "r1"
        _wait_log(log, "reload failed, the running configuration stays")
        (tmp_path / "r1.toml").write_text(base + "max_flows = 50\n")
        reply = asyncio.run(query_control(f"127.0.0.1:{ctl}", "reload"))
        assert reply["changes"] == ["peer removed: r2 at 127.0.0.1:9"]
        # logrotate: the file moves away, SIGUSR1, new lines go to a new file
        rotated = tmp_path / "r1.log.1"
        log.rename(rotated)
        proc.send_signal(signal.SIGUSR1)
        _wait_log(log, "reopened 1 log file(s)")
        assert "reopened" not in rotated.read_text()
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_drain_moves_applications_to_another_router_then_exits() -> None:
    async def go() -> None:
        r2 = RouterNode(_cfg("r2", core_lsids=frozenset({0x10}), default_lsid=0x10,
                             accept_routers=["r1@127.0.0.1"]))
        await r2.start()
        r1 = RouterNode(_cfg("r1", default_lsid=0x10, peers=[
            PeerConfig("%s:%d" % r2.tcp_address, "r2")]))
        await r1.start()
        await within(r1.wait_routes(0x10))
        a1, a2 = "%s:%d" % r1.tcp_address, "%s:%d" % r2.tcp_address
        try:
            events: list[flowlib.FailoverEvent] = []
            app = await within(flowlib.connect([a1, a2], name="app", reconnect_min=0.01))
            app.on_failover = events.append
            tx = await within(flowlib.connect([a2], name="tx"))
            flow = await tx.create()
            listener = await app.listen(flow, "data")
            assert app.router_name == "r1" and router_health(r1)[0]
            reply = r1.ops.drain(10.0)
            assert reply == {"ok": True, "draining": True, "applications": 1, "timeout": 10.0}
            assert router_health(r1) == (False, "draining: applications are asked to move "
                                                "to another router")
            await within(r1.ops.wait_drained(), 5.0)  # the app left on its own, at once
            assert app.router_name == "r2" and len(events) == 1
            assert "draining" in events[0].reason
            await tx.send(flow, b"after")  # and it still gets its flow, from r2
            assert bytes((await within(listener.get())).payload) == b"after"
            with pytest.raises(flowlib.FlowError):  # r1 accepts nobody now
                await flowlib.connect([a1], name="late", timeout=1.0)
            assert r1.links_up() == 1  # its router link stayed for the traffic
            await app.close()
            await tx.close()
        finally:
            await r1.stop()
            await r2.stop()

    run(go())


def test_drain_times_out_on_applications_that_stay() -> None:
    async def go() -> None:
        node = RouterNode(_cfg("r1", control="127.0.0.1:0", core_lsids=frozenset({0x10}),
                               default_lsid=0x10))
        await node.start()
        try:
            # a single-router client: it cannot move, so it loses its router at once; a raw
            # application that ignores the notice stays until the time-out
            reader, writer = await asyncio.open_connection(*node.tcp_address)
            hello = C.Hello(7, C.Role.ENDPOINT, "stubborn", 65536).encode()
            writer.write(C.hello_header(len(hello)) + hello)
            await within(node.wait_peers_up(1, role=C.Role.ENDPOINT))
            reply = await query_control("%s:%d" % node.control_address, "drain", timeout=2.0,
                                        grace=0.3)
            assert reply["applications"] == 1
            t0 = asyncio.get_running_loop().time()
            await within(node.ops.wait_drained())
            assert asyncio.get_running_loop().time() - t0 >= 0.25
            assert node.links_up(None) == 0  # closed at the time-out
            assert b"draining" in await within(reader.read())
            writer.close()
        finally:
            await node.stop()

    run(go())


def test_sigusr2_drains_and_the_process_exits_0(tmp_path: Path) -> None:
    port = free_port()
    proc = _start(tmp_path, f'[router]\nname = "r1"\nlisten = "127.0.0.1:{port}"\n'
                            'http = "off"\n')
    try:
        _wait_log(tmp_path / "r1.log", "running")
        proc.send_signal(signal.SIGUSR2)
        assert proc.wait(15) == 0
        body = (tmp_path / "r1.log").read_text()
        assert "draining: no new connections" in body and "drained" in body
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
