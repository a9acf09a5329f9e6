"""Location services with two members on real loopback sockets: sibling cores share masks,
and a member's death is survived (its subtrees re-graft onto the other member)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import flowlib
from flowls import LocationServiceConfig, flows_of, lookup, member_config
from flowls.service import main as flowls_main
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, mask_of
from flowrouter.wire.flowid import FlowID

from .checkout import PYTHONPATH
from .ports import free_port
from .rawep import RawEndpoint, addr, within
from .seqstream import SeqSender

LSID = 0x10


async def _overlay() -> tuple[list[RouterNode], list[RouterNode]]:
    """Members m1, m2 (linked); edge routers r1, r2 each linked to both members."""
    m1 = RouterNode(member_config(LocationServiceConfig(
        "m1", frozenset({LSID}), listen="127.0.0.1:0", control="127.0.0.1:0", epoch=1.0,
        accept_routers=["m2@127.0.0.1", "r1@127.0.0.1", "r2@127.0.0.1"])))
    await m1.start()
    m2 = RouterNode(member_config(LocationServiceConfig(
        "m2", frozenset({LSID}), listen="127.0.0.1:0", control="127.0.0.1:0", epoch=1.0,
        members=[PeerConfig(addr(m1), "m1")],
        accept_routers=["r1@127.0.0.1", "r2@127.0.0.1"])))
    await m2.start()
    edges = []
    for name in ("r1", "r2"):
        node = RouterNode(NodeConfig(name, listen="127.0.0.1:0", control="127.0.0.1:0",
                                     epoch=1.0, peers=[PeerConfig(addr(m1), "m1"),
                                                       PeerConfig(addr(m2), "m2")]))
        await node.start()
        edges.append(node)
    for node in (m1, m2, *edges):
        await within(node.wait_peers_up(3 if node in (m1, m2) else 2))
        await within(node.wait_routes(LSID))
    for m in (m1, m2):
        while not m.core.routing.siblings(LSID):
            await within(m.wait_changed())
    return [m1, m2], edges


def test_two_members_share_masks_and_survive_a_member_failure() -> None:
    async def main() -> None:
        members, edges = await _overlay()
        r1, r2 = edges
        try:
            a = await flowlib.connect([addr(r1)], name="A")
            b = await flowlib.connect([addr(r2)], name="B")
            s = await flowlib.connect([addr(r2)], name="S")
            flow = await s.create()
            la = await a.listen(flow, [32, BAND_FAULT])
            lb = await b.listen(flow, [33])
            # r1 and r2 may root their subtrees at different members; both must deliver.
            await s.send(flow, b"to-a", band=32)
            await s.send(flow, b"to-b", band=33)
            await s.send(flow, b"nobody", band=34)
            assert (await within(la.get())).payload == b"to-a"
            assert (await within(lb.get())).payload == b"to-b"
            # Whatever member roots each subtree, band 34 crossed no member-to-member link.
            for m in members:
                for lk in m.core.links.values():
                    assert lk.peer_name in ("m1", "m2", "r1", "r2")
            total_34_drops = sum(n.core.counters["drop.no-receivers"]
                                 + n.core.counters["drop.band-filtered"]
                                 for n in (*members, *edges))
            assert total_34_drops >= 1
            up_link = r1.core.flows[flow.key].upstream
            victim_name = r1.core.links[up_link].peer_name
            victim = next(m for m in members if m.config.name == victim_name)
            survivor = next(m for m in members if m is not victim)

            # LS lookups and flow listing through the control interface.
            row = await lookup("%s:%d" % r1.control_address, LSID)
            assert row["lsid"] == "0x10" and not row["core"]
            rows = await flows_of("%s:%d" % survivor.control_address, lsid=LSID,
                                  creator=flow.creator)
            assert [r["flow"] for r in rows] == [str(flow)]

            # Kill r1's member while S streams; A must resume through the survivor.
            sender = SeqSender(s, flow, interval=0.005)
            assert (await within(la.get())).payload.startswith(b"seq")
            t_kill = time.perf_counter()
            await victim.stop()
            fault = None
            resumed_at = None
            while resumed_at is None:
                msg = await within(la.get())
                if msg.band == BAND_FAULT:
                    fault = flowlib.decode_fault(msg)
                elif time.perf_counter() > t_kill and r1.core.flows[flow.key].upstream in (
                        lid for lid, lk in r1.core.links.items()
                        if lk.peer_name == survivor.config.name):
                    resumed_at = time.perf_counter()
            # after the re-graft the stream continues without loss: 20 consecutive numbers
            after: list[int] = []
            while len(after) < 20:
                msg = await within(la.get())
                if msg.band == BAND_FAULT:
                    fault = fault or flowlib.decode_fault(msg)  # may come after the re-graft
                elif msg.payload.startswith(b"seq "):
                    after.append(int(msg.payload[4:]))
            await sender.stop()
            while fault is None:  # not yet: it is on its way (it may trail the data)
                msg = await within(la.get())
                if msg.band == BAND_FAULT:
                    fault = flowlib.decode_fault(msg)
            interruption = resumed_at - t_kill
            print(f"\ndelivery interrupted for {interruption * 1000:.0f} ms by a member failure")
            assert after == list(range(after[0], after[0] + 20)), after
            # a closed link is noticed at once; bounded generously for a loaded machine
            assert 0 < interruption < 10.0, interruption
            assert fault is not None and victim_name in fault.detail
            assert r1.core.flows[flow.key].joined
            # B still gets its band through the survivor too.
            await s.send(flow, b"after", band=33)
            assert (await within(lb.get())).payload == b"after"
            for c in (a, b, s):
                await c.close()
        finally:
            for node in (*edges, *members):
                await node.stop()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_flowls_cli_lookup(capsys) -> None:  # type: ignore[no-untyped-def]
    async def start() -> RouterNode:
        node = RouterNode(member_config(LocationServiceConfig(
            "m1", frozenset({LSID}), listen="127.0.0.1:0", control="127.0.0.1:0")))
        await node.start()
        return node

    async def main() -> None:
        node = await start()
        try:
            ctl = "%s:%d" % node.control_address
            rc = await asyncio.to_thread(flowls_main, ["lookup", "0x10", "--control", ctl])
            assert rc == 0
            assert "this router is a member" in capsys.readouterr().out
            rc = await asyncio.to_thread(flowls_main, ["lookup", "0x99", "--control", ctl])
            assert rc == 1
            assert "knows no location service 0x99" in capsys.readouterr().err
        finally:
            await node.stop()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_flowls_flows_filters_by_creator_and_lsid(capsys) -> None:  # type: ignore[no-untyped-def]
    mine = [FlowID(0xA1, LSID, 1), FlowID(0xA1, LSID, 2)]
    other = FlowID(0xB2, LSID, 1)

    async def main() -> None:
        node = RouterNode(member_config(LocationServiceConfig(
            "m1", frozenset({LSID}), listen="127.0.0.1:0", control="127.0.0.1:0")))
        await node.start()
        ep = None
        try:
            ep = await RawEndpoint.connect(node)
            for req, flow in enumerate((*mine, other), 1):
                ack = await ep.join(flow, mask_of([32]), req=req)
                assert ack.status is C.JoinStatus.OK
            ctl = "%s:%d" % node.control_address
            rows = await flows_of(ctl, creator=0xA1)
            assert sorted(r["flow"] for r in rows) == sorted(str(f) for f in mine)
            assert len(await flows_of(ctl, lsid=LSID)) == 3
            assert await flows_of(ctl, lsid=0x99) == []
            rc = await asyncio.to_thread(flowls_main, ["flows", "--control", ctl,
                                                       "--creator", "b2", "--json"])
            assert rc == 0
            assert [r["flow"] for r in json.loads(capsys.readouterr().out)] == [str(other)]
            rc = await asyncio.to_thread(flowls_main, ["flows", "--control", ctl])
            assert rc == 0
            assert capsys.readouterr().out.strip().endswith("3 flow(s)")
        finally:
            if ep is not None:
                await ep.close()
            await node.stop()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_flowls_run_starts_a_member_that_answers_and_stops_on_sigint(capsys) -> None:  # type: ignore[no-untyped-def]
    root = Path(__file__).resolve().parent.parent
    listen, control = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowls.service", "run", "--name", "lsm",
         "--lsid", "0x10", "--lsid", "0x11", "--listen", f"127.0.0.1:{listen}",
         "--control", f"127.0.0.1:{control}"],
        cwd=root, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH})
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the daemon logs once it listens
            seen.append(line)
            if "running (core for 0x10, 0x11)" in line:
                break
        else:
            raise AssertionError("flowls run exited before running: " + "".join(seen))
        ctl = f"127.0.0.1:{control}"
        assert flowls_main(["lookup", "0x11", "--control", ctl]) == 0
        assert "LSID 0x11 at router lsm: this router is a member" in capsys.readouterr().out
        assert flowls_main(["flows", "--control", ctl, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == []
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130  # Ctrl-C: a clean stop, then the shell convention
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
