"""flowchat on real sockets: four site servers on four real routers (plus a hub router, the
core) over loopback exchange messages in one order; thin clients, the plain client and the
bot talk to them over the local line protocol; the room flow is found through the
directory; the CLI's help explains every command."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from flowchat import cli
from flowchat.client import ChatClient, run_bot, run_plain
from flowchat.igo import PeerState
from flowchat.server import ChatServer
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode

from .ports import free_port_block

LSID = 0x10
SITES = ("metropol", "commonwe", "kingdom", "republic")
FAST = {"heartbeat_interval": 0.25, "missed_heartbeats": 3, "disconnect_interval": 3.0}


def addr(node: RouterNode) -> str:
    return "%s:%d" % node.tcp_address


async def eventually(check: Callable[[], bool], timeout: float = 15.0,
                     what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def router_testbed(tmp_path) -> AsyncIterator[dict[str, RouterNode]]:
    """A hub router (core of LSID 0x10) and one router per site dialling it."""
    nodes: dict[str, RouterNode] = {}
    try:
        hub = RouterNode(NodeConfig("hub", listen="127.0.0.1:0", default_lsid=LSID,
                                    accept_routers=[f"{s}@127.0.0.1" for s in SITES],
                                    core_lsids=frozenset({LSID})))
        await hub.start()
        nodes["hub"] = hub
        for s in SITES:
            n = RouterNode(NodeConfig(s, listen="127.0.0.1:0", default_lsid=LSID,
                                      peers=[PeerConfig(addr(hub), "hub")]))
            await n.start()
            nodes[s] = n
        for n in nodes.values():
            await asyncio.wait_for(n.wait_routes(LSID), 10)
        yield nodes
    finally:
        for n in nodes.values():
            await n.stop()


@contextlib.asynccontextmanager
async def servers(nodes: dict[str, RouterNode], tmp_path, mode: str = "all-to-all",
                  **kw) -> AsyncIterator[dict[str, ChatServer]]:
    srv: dict[str, ChatServer] = {}
    try:
        for s in SITES:
            srv[s] = ChatServer(s, [addr(nodes[s])], sites=SITES, room="test", mode=mode,
                                listen="127.0.0.1:0", use_directory=kw.get("directory", False),
                                state_dir=str(tmp_path / "state"), **FAST)
            await srv[s].start()
        # every site sees every other: the ordering set is complete
        await eventually(lambda: all(len(x.igo.ordering.members) == 4 for x in srv.values()),
                         what="full membership")
        yield srv
    finally:
        for x in srv.values():
            await x.stop()


def server_addr(s: ChatServer) -> str:
    assert s.address is not None
    return "%s:%d" % s.address


def run(coro_fn: Callable[[], Awaitable[None]], timeout: float = 60.0) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), timeout))  # type: ignore[arg-type]


def test_four_sites_on_real_routers_deliver_in_one_order(tmp_path) -> None:
    async def main() -> None:
        async with router_testbed(tmp_path) as nodes, servers(nodes, tmp_path) as srv:
            clients = {s: await ChatClient.connect(server_addr(srv[s]), f"user-{s}")
                       for s in SITES}
            got: dict[str, list[tuple[str, str]]] = {s: [] for s in SITES}

            async def read(s: str) -> None:
                async for ev in clients[s]:
                    if ev["ev"] == "msg":
                        got[s].append((ev["site"], ev["text"]))

            readers = [asyncio.ensure_future(read(s)) for s in SITES]
            for i in range(5):
                for s in SITES:
                    await clients[s].say(f"{s} says {i}")
            await eventually(lambda: all(len(v) == 20 for v in got.values()),
                             what="every client to see all 20 messages")
            ref = got["metropol"]
            assert all(got[s] == ref for s in SITES)  # one global order
            for s in SITES:  # FIFO per site
                mine = [t for (o, t) in ref if o == s]
                assert mine == [f"{s} says {i}" for i in range(5)]
            # users travel in order too: every site knows every user
            await eventually(lambda: all(
                sorted(u for us in x.users.values() for u in us)
                == sorted(f"user-{s}" for s in SITES) for x in srv.values()),
                what="user lists")
            for r in readers:
                r.cancel()
            for c in clients.values():
                await c.close()

    run(main)


def test_plain_client_and_bot(tmp_path) -> None:
    async def main() -> None:
        async with router_testbed(tmp_path) as nodes, \
                servers(nodes, tmp_path, mode="hasten") as srv:
            watcher = await ChatClient.connect(server_addr(srv["kingdom"]), "watcher")
            seen: list[dict] = []

            async def watch() -> None:
                async for ev in watcher:
                    if ev["ev"] == "msg":
                        seen.append(ev)

            wtask = asyncio.ensure_future(watch())
            # the plain client reads stdin from a pipe we control
            r_fd, w_fd = os.pipe()
            stdin = os.fdopen(r_fd, "r")
            out = io.StringIO()
            try:
                plain = asyncio.ensure_future(run_plain(server_addr(srv["metropol"]), "alice",
                                                        stdin=stdin, stdout=out))
                await eventually(lambda: "welcome to room 'test'" in out.getvalue(),
                                 what="plain client welcome")
                # commands are handled by the client, never said to the room
                os.write(w_fd, b"/help\n")
                await eventually(lambda: "/help         this text" in out.getvalue(),
                                 what="the help text")
                os.write(w_fd, b"/nonsense\n")
                await eventually(lambda: "unknown command '/nonsense'" in out.getvalue(),
                                 what="an unknown command reported")
                await eventually(lambda: "metropol[alice]" in out.getvalue(),
                                 what="alice's login ordered")
                os.write(w_fd, b"/who\n")
                await eventually(lambda: "*   metropol [self]: alice" in out.getvalue(),
                                 what="/who listing metropol's user")
                assert "* who: site state S1" in out.getvalue()
                for s in ("commonwe", "kingdom", "republic"):
                    assert f"*   {s} [S1]: " in out.getvalue(), s
                os.write(w_fd, b"hello from the plain client\n")
                await eventually(lambda: any(e["text"] == "hello from the plain client"
                                             for e in seen), what="kingdom to see alice")
                await eventually(lambda: "[metropol:alice] hello from the plain client"
                                 in out.getvalue(), what="alice's own line")
                # the bot at commonwe: 5 messages, all come back, and reach the plain client
                bot_out = io.StringIO()
                summary = await run_bot(server_addr(srv["commonwe"]), "bot1", rate=20, count=5,
                                        seed=1, stdout=bot_out, quiet=True)
                assert summary["sent"] == 5 and summary["own_received"] == 5
                assert summary["mean_latency"] is not None and summary["mean_latency"] < 5
                await eventually(lambda: out.getvalue().count("[commonwe:bot1] bot1 #") == 5,
                                 what="plain client to show the bot's messages")
                assert "* members (S1, view 0):" in out.getvalue()  # the agreed view
                assert not any(e["text"].startswith("/") for e in seen)  # no command was sent
                os.write(w_fd, b"/quit\n")
                assert await asyncio.wait_for(plain, 10) == 0
            finally:  # a failure must not leave the client's reader thread blocked
                os.close(w_fd)
            stdin.close()
            wtask.cancel()
            await watcher.close()

    run(main)


def test_room_flow_found_through_the_directory(tmp_path) -> None:
    from flowdir import DirectoryMember

    async def main() -> None:
        async with router_testbed(tmp_path) as nodes:
            member = await DirectoryMember.connect([addr(nodes["hub"])], name="dir-hub")
            a = b = None
            try:
                a = ChatServer("metropol", [addr(nodes["metropol"])], sites=SITES, room="ops",
                               listen=None, state_dir=str(tmp_path / "s"), **FAST)
                await a.start()
                assert a.flow_source == "derived, registered in the directory"
                await eventually(lambda: any("chat:ops" in str(e) for e in member.entries()),
                                 what="the registration to reach the member")
                b = ChatServer("kingdom", [addr(nodes["kingdom"])], sites=SITES, room="ops",
                               listen=None, state_dir=str(tmp_path / "s"), **FAST)
                await b.start()
                assert b.flow_source == "directory" and b.flow == a.flow
            finally:
                for x in (a, b):
                    if x is not None:
                        await x.stop()
                await member.stop()

    run(main)


def test_cli_help_explains_every_command(capsys) -> None:
    for cmd in ([], ["server"], ["client"], ["bot"], ["experiment"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(cmd + ["--help"])
        assert exc.value.code == 0
    text = capsys.readouterr().out
    for word in ("--site", "--sites", "--router", "--room", "--mode", "hasten", "leader",
                 "--plain", "--rate", "--only", "--real", "--out", "--duration",
                 "--disconnect-interval", "--stability", "--long-term-reconcile",
                 "--display-rate", "directory"):
        assert word in text, word


def test_cli_experiment_runs_in_the_simulator(tmp_path, capsys) -> None:
    rc = cli.main(["experiment", "--only", "7", "--duration", "40", "--out", str(tmp_path),
                   "--no-plots"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| 7 | leader | L1 | 10/30 |" in out
    assert (tmp_path / "summary.md").exists()


def test_cli_server_passes_every_ordering_option_to_the_site() -> None:
    args = cli.build_parser().parse_args([
        "server", "--site", "kingdom", "--sites", "metropol,kingdom", "--router",
        "127.0.0.1:1", "--mode", "hasten", "--stability", "--long-term-reconcile",
        "--long-term-rate", "3", "--display-rate", "7", "--max-lag", "99", "--heartbeat", "0.5",
        "--missed", "4", "--disconnect-interval", "9"])
    srv = cli.make_server(args)
    c = srv.config
    assert (c.mode, c.stability, c.long_term_reconcile, c.long_term_rate, c.display_rate,
            c.max_lag, c.heartbeat_interval, c.missed_heartbeats, c.disconnect_interval) == \
        ("hasten", True, True, 3.0, 7.0, 99, 0.5, 4, 9.0)
    plain = cli.make_server(cli.build_parser().parse_args([
        "server", "--site", "kingdom", "--sites", "metropol,kingdom", "--router",
        "127.0.0.1:1"]))
    assert not plain.config.stability and plain.config.mode == "all-to-all"


def test_cli_experiment_stability_reaches_the_sites(tmp_path, capsys) -> None:
    rc = cli.main(["experiment", "--only", "5", "--duration", "30", "--out", str(tmp_path),
                   "--no-plots", "--stability"])
    assert rc == 0
    row = json.loads((tmp_path / "test5-hasten-A2" / "result.json").read_text())
    assert row["config"]["stability"] is True and row["config"]["mode"] == "hasten"
    # stability tracking sends acknowledgement heartbeats between the regular ones
    assert row["counters"]["sent.heartbeat"] > 4 * 30 / 2.0 * 2
    capsys.readouterr()


def _free_base(n: int = 5) -> int:
    """A port p with p .. p+n-1 free just now (the seed 003 topology's routers)."""
    return free_port_block(n)


def test_cli_experiment_real_runs_router_processes(tmp_path, capsys) -> None:
    """--real starts the topology's routers as processes on loopback and runs the sites on
    them in real time (a short run: every site delivers every site's messages)."""
    rc = cli.main(["experiment", "--real", "--only", "1", "--duration", "8", "--out",
                   str(tmp_path), "--no-plots", "--base-port", str(_free_base())])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Real routers on loopback, 8 s per run" in out
    row = json.loads((tmp_path / "test1-all-to-all-A1" / "result.json").read_text())
    assert row["run"] == "real"
    assert row["violations"] == {"fifo": 0, "order": 0, "agreement": 0, "global": 0,
                                 "causal": 0, "views": 0}
    assert set(row["delivered"]) == set(SITES)
    for site, n in row["delivered"].items():
        assert n >= 4 * 2, site  # every site heard from every site


def test_client_header_follows_the_site_state_to_s3(tmp_path) -> None:
    """Hasten mode: a silent site leaves the ordering set at S2, so S2 -> S3 changes no
    membership; clients must still be told the new state (the curses header shows it)."""
    async def main() -> None:
        async with router_testbed(tmp_path) as nodes, \
                servers(nodes, tmp_path, mode="hasten") as srv:
            c = await ChatClient.connect(server_addr(srv["metropol"]), "alice")
            states: list[tuple[str, str]] = []

            async def read() -> None:
                async for ev in c:
                    if ev["ev"] == "members":
                        states.append((ev["state"], ev["all"]["republic"]))

            task = asyncio.ensure_future(read())
            await srv["republic"].stop()
            await eventually(lambda: ("S3", "S3") in states, what="the S3 state announced")
            assert ("S2", "S2") in states  # first the short-term disconnect
            task.cancel()
            await c.close()

    run(main)


@pytest.mark.parametrize("down_for", [0.0, 2.5])
def test_server_survives_a_restart_of_its_router(tmp_path, down_for: float) -> None:
    """Issue 14: a site server whose router restarts reconnects and rejoins the room flow by
    default: at once through flowlib's failover when the router comes back quickly, and by
    dialling again (same ordering state) when it stays down longer than the failover
    time-out (1 s here). Messages then flow both ways again."""
    async def main() -> None:
        hub = RouterNode(NodeConfig("hub", listen="127.0.0.1:0", default_lsid=LSID,
                                    core_lsids=frozenset({LSID}),
                                    accept_routers=["ra@127.0.0.1", "rb@127.0.0.1"]))
        await hub.start()
        nodes = [hub]

        def site_router(name: str, listen: str = "127.0.0.1:0") -> RouterNode:
            return RouterNode(NodeConfig(name, listen=listen, default_lsid=LSID,
                                         peers=[PeerConfig(addr(hub), "hub")]))

        ra, rb = site_router("ra"), site_router("rb")
        for n in (ra, rb):
            await n.start()
            nodes.append(n)
        two = ("metropol", "kingdom")
        srv: dict[str, ChatServer] = {}
        clients: list[ChatClient] = []
        try:
            for n in (ra, rb):
                await asyncio.wait_for(n.wait_routes(LSID), 10)
            for s, n in zip(two, (ra, rb)):
                srv[s] = ChatServer(s, [addr(n)], sites=two, room="restart", mode="hasten",
                                    listen="127.0.0.1:0", use_directory=False,
                                    state_dir=str(tmp_path / "state"), failover_timeout=1.0,
                                    **FAST)
                await srv[s].start()
            await eventually(lambda: all(len(x.igo.ordering.members) == 2
                                         for x in srv.values()), what="both sites")
            got: dict[str, list[str]] = {s: [] for s in two}
            for s in two:
                c = await ChatClient.connect(server_addr(srv[s]), f"user-{s}")
                clients.append(c)

                async def read(c: ChatClient = c, s: str = s) -> None:
                    async for ev in c:
                        if ev["ev"] == "msg":
                            got[s].append(ev["text"])
                asyncio.ensure_future(read())
            # restart metropol's router on the same address
            listen = addr(ra)
            await ra.stop()
            nodes.remove(ra)
            await asyncio.sleep(down_for)  # the outage itself (what is being survived)
            ra2 = site_router("ra", listen)
            await ra2.start()
            nodes.append(ra2)
            await asyncio.wait_for(ra2.wait_routes(LSID), 10)
            await eventually(lambda: srv["metropol"].client is not None
                             and srv["metropol"].client.connected
                             and srv["metropol"].igo.ordering.peer_state("kingdom")
                             is PeerState.S1, timeout=30, what="metropol back in the room")
            await clients[0].say("after the restart, from metropol")
            await clients[1].say("after the restart, from kingdom")
            for s in two:
                await eventually(lambda s=s: {"after the restart, from metropol",
                                              "after the restart, from kingdom"}
                                 <= set(got[s]), timeout=30, what=f"{s} to hear both")
            m = srv["metropol"]
            if down_for > 1.0:  # longer than the failover time-out: dialled again
                assert m.reconnects >= 1 and m.igo.counters["flow.rejoined"] >= 1
            else:
                assert m.client.failovers >= 1 and m.reconnects == 0
        finally:
            for c in clients:
                await c.close()
            for x in srv.values():
                await x.stop()
            for n in nodes:
                await n.stop()

    run(main, timeout=90)


def test_cli_passes_the_stall_time_out_and_send_window() -> None:
    args = cli.build_parser().parse_args([
        "server", "--site", "kingdom", "--sites", "metropol,kingdom", "--router",
        "127.0.0.1:1", "--stall-timeout", "5", "--send-window", "4096"])
    c = cli.make_server(args).config
    assert (c.stall_timeout, c.send_window) == (5.0, 4096)
    off = cli.make_server(cli.build_parser().parse_args([
        "server", "--site", "kingdom", "--sites", "metropol,kingdom", "--router",
        "127.0.0.1:1", "--send-window", "0"])).config
    assert off.send_window is None and off.stall_after == 8.0


def test_a_restarted_server_shows_nothing_twice_on_real_routers(tmp_path) -> None:
    """metropol's server stops and starts again with the same state directory: it shows
    what was said while it was down (history, flagged late) and live traffic, and nothing
    it showed before (its display marks were kept beside its state)."""
    async def main() -> None:
        async with router_testbed(tmp_path) as nodes, servers(nodes, tmp_path,
                                                              mode="hasten") as srv:
            for i in range(3):
                for s in SITES:
                    srv[s].submit(1, f"bot-{s}", f"{s} before {i}")
            others = [s for s in SITES if s != "metropol"]
            await eventually(lambda: all(
                sum(1 for d in srv[s].igo.deliveries if d.origin != s) >= 9 for s in SITES),
                what="every site to show the first messages")
            old = srv["metropol"]
            shown_before = {(d.origin, d.incarnation, d.seq) for d in old.igo.deliveries}
            await old.stop()
            assert old.marks_file is not None and old.marks_file.exists()
            for i in range(2):
                for s in others:
                    srv[s].submit(1, f"bot-{s}", f"{s} while down {i}")
            await asyncio.sleep(0.5)
            new = srv["metropol"] = ChatServer(
                "metropol", [addr(nodes["metropol"])], sites=SITES, room="test",
                mode="hasten", listen="127.0.0.1:0", use_directory=False,
                state_dir=str(tmp_path / "state"), **FAST)
            await new.start()
            for s in others:
                srv[s].submit(1, f"bot-{s}", f"{s} after")
            await eventually(lambda: sum(1 for d in new.igo.deliveries
                                         if d.origin != "metropol") >= 9,
                             what="the restarted site to show history and live traffic")
            now = {(d.origin, d.incarnation, d.seq) for d in new.igo.deliveries}
            assert not now & shown_before
            assert new.igo.ordering.counters["history.shown-before"] >= 9

    run(main)
