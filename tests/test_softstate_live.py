"""Soft state over real sockets on 127.0.0.1 (issue 14): a hung router (SIGSTOP) is noticed
by its neighbours and its applications, which fail over and route around it within
dead_after + 1 s, and it rejoins cleanly after SIGCONT; a UDP link whose first HELLO is lost
still comes up."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import flowlib
from flowlib import FlowID
from flowrouter.core.tables import LinkState
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode, query_control
from flowrouter.wire.control import Role

from .checkout import PYTHONPATH
from .ports import free_port
from .rawep import addr, core_and_edge, get, run, until

LSID = 0x10
ROOT = Path(__file__).resolve().parent.parent
LIVENESS = dict(liveness_interval=0.5, dead_after=2.0)
ACCEPT = ["*@127.0.0.1"]  #: routers dialling these test routers are accepted as routers


def peer_up(node: RouterNode, peer: str) -> bool:
    return any(lk.peer_name == peer and lk.state is LinkState.UP
               for lk in node.core.links.values())


def test_udp_link_whose_first_hello_is_lost_comes_up() -> None:
    async def main() -> None:
        port = free_port(kind=socket.SOCK_DGRAM)
        a = RouterNode(NodeConfig("ua", listen="", udp="127.0.0.1:0", **LIVENESS,
                                  peers=[PeerConfig(f"127.0.0.1:{port}", "ub",
                                                    transport="udp")]))
        await a.start()
        b = None
        try:
            # ua's first HELLO goes to a port nobody has bound yet: it is lost
            await until(lambda: a.core.counters["links.up"] == 0 and bool(a.core.links))
            await asyncio.sleep(0.3)
            b = RouterNode(NodeConfig("ub", listen="", udp=f"127.0.0.1:{port}",
                                      core_lsids=frozenset({LSID}), accept_routers=ACCEPT,
                                      **LIVENESS))
            await b.start()
            await a.wait_peers_up(1, timeout=20)
            await b.wait_peers_up(1, timeout=20)
            assert peer_up(a, "ub") and peer_up(b, "ua")
            await a.wait_routes(LSID)  # and the link carries the LS routes
        finally:
            await a.stop()
            if b is not None:
                await b.stop()
    run(main())


def _router_process(tmp: Path, name: str, listen: int, control: int,
                    peers: list[tuple[str, str]]) -> subprocess.Popen[str]:
    cfg = tmp / f"{name}.toml"
    lines = ["[router]", f'name = "{name}"', f'listen = "127.0.0.1:{listen}"',
             f'control = "127.0.0.1:{control}"', "tick_interval = 0.05",
             "[gc]", f"liveness_interval = {LIVENESS['liveness_interval']}",
             f"dead_after = {LIVENESS['dead_after']}"]
    for pname, paddr in peers:
        lines += ["[[peer]]", f'name = "{pname}"', f'address = "{paddr}"']
    cfg.write_text("\n".join(lines) + "\n")
    return subprocess.Popen(
        [sys.executable, "-m", "flowrouter.tools.cli", "--log-level", "warning", "run",
         "--config", str(cfg)], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": PYTHONPATH})


def test_a_hung_router_is_routed_around_and_rejoins_after_sigcont(tmp_path: Path) -> None:
    """core <- hung -> edge and core <- edge: the application on the router that hangs
    fails over to edge, and core and edge drop their links to it within dead_after + 1 s;
    after SIGCONT it comes back and the tree still delivers."""
    async def main() -> None:
        async with core_and_edge(LSID, tick_interval=0.05, accept_routers=ACCEPT,
                                 **LIVENESS) as (core, edge):
            hung_port, hung_ctl = free_port(), free_port()
            proc = _router_process(tmp_path, "hung", hung_port, hung_ctl,
                                   [("core", addr(core)), ("edge", addr(edge))])
            try:
                await until(lambda: peer_up(core, "hung") and peer_up(edge, "hung"), 30)
                app = await flowlib.connect([f"127.0.0.1:{hung_port}", addr(edge)], name="app",
                                            state_dir=str(tmp_path / "s1"), **LIVENESS)
                sender = await flowlib.connect(addr(core), name="sender",
                                               state_dir=str(tmp_path / "s2"))
                flow = FlowID(0xABC, LSID, 1)
                lst = await app.listen(flow, [32])
                sender.send_nowait(flow, b"before")
                assert (await get(lst)).payload == b"before"
                assert app.router_name == "hung"

                loop = asyncio.get_running_loop()
                t0 = loop.time()
                proc.send_signal(signal.SIGSTOP)  # hung: its kernel still holds the sockets
                await until(lambda: not peer_up(core, "hung") and not peer_up(edge, "hung"))
                noticed = loop.time() - t0
                await until(lambda: app.failovers == 1 and app.router_name == "edge")
                failed_over = loop.time() - t0
                bound = LIVENESS["dead_after"] + 1.0 + 0.5  # + one echo interval of phase
                assert noticed <= bound, f"neighbours noticed after {noticed:.2f}s"
                assert failed_over <= bound, f"the application failed over after {failed_over:.2f}s"
                assert core.core.counters["liveness.dead"] >= 1
                assert app.counters["liveness.dead"] == 1
                sender.send_nowait(flow, b"around")  # core -> edge -> app, not via hung
                assert (await get(lst)).payload == b"around"

                proc.send_signal(signal.SIGCONT)
                await until(lambda: peer_up(core, "hung") and peer_up(edge, "hung"), 30)
                st = (await query_control(f"127.0.0.1:{hung_ctl}", timeout=5.0))["status"]
                assert not any(k.startswith("malformed") for k in st["counters"])
                assert sum(1 for lk in st["links"] if lk["role"] == "router"
                           and lk["state"] == "up") == 2
                sender.send_nowait(flow, b"after")
                assert (await get(lst)).payload == b"after"
                await app.close()
                await sender.close()
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
    run(main(), timeout=120)


def test_router_liveness_and_rtt_show_in_status() -> None:
    async def main() -> None:
        async with core_and_edge(LSID, tick_interval=0.05, accept_routers=ACCEPT,
                                 **LIVENESS) as (core, edge):
            app = await flowlib.connect(addr(edge), name="app", **LIVENESS)
            await until(lambda: app.rtt is not None and all(
                lk.rtt is not None for lk in edge.core.links.values()))
            rows = edge.status()["links"]
            assert {r["role"] for r in rows} == {"router", "endpoint"}
            assert all(r["rtt_ms"] is not None and r["rtt_ms"] >= 0 for r in rows)
            assert all(r["silent_s"] is not None for r in rows)
            assert edge.links_up(Role.ENDPOINT) == 1
            await app.close()
    run(main())
