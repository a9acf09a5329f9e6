"""A location service of four members that are not a full mesh (a ring: m1-m2-m3-m4-m1,
no diagonals), on real loopback sockets: the members agree on one spanning tree, a flow
whose members hang off opposite corners is delivered across it, and when the member a
receiver's router was attached to dies, the stream resumes as with a full mesh (the
longest silence and the messages lost are printed: the lead's failover numbers)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import flowlib
from flowls import LocationServiceConfig, member_config, members_of
from flowls.service import main as flowls_main
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire.bands import BAND_FAULT

from .rawep import addr, within
from .seqstream import SeqReceiver, SeqSender

LSID = 0x10
NAMES = ("m1", "m2", "m3", "m4")
RING = (("m2", "m1"), ("m3", "m2"), ("m4", "m3"), ("m4", "m1"))  #: (dialler, dialled)
#: the same four as a full mesh (what a location service needed before): the baseline
MESH = (*RING, ("m3", "m1"), ("m4", "m2"))


async def _agreed(members: list[RouterNode], mesh: bool) -> None:
    """Until every member sees all four and the same root with three tree links in all
    (a ring), or each the other three directly (a full mesh keeps its one-hop paths).
    (The tree has no event of its own: a bounded poll of the members' tables.)"""
    deadline = time.monotonic() + 10
    while True:
        views = [m.core.routing.trees[LSID] for m in members]
        if (all(v.members() == list(NAMES) and v.root == "m1" and v.mesh is mesh
                for v in views)
                and sum(len(v.tree) for v in views) == (12 if mesh else 6)):
            return
        assert time.monotonic() < deadline, [v.status() for v in views]
        await asyncio.sleep(0.01)


async def _overlay(graph: tuple[tuple[str, str], ...]
                   ) -> tuple[list[RouterNode], list[RouterNode]]:
    accept = ["m1@127.0.0.1", "m2@127.0.0.1", "m3@127.0.0.1", "m4@127.0.0.1",
              "r1@127.0.0.1", "r2@127.0.0.1"]
    members: dict[str, RouterNode] = {}
    for name in NAMES:
        dials = [PeerConfig(addr(members[b]), b) for a, b in graph if a == name]
        node = RouterNode(member_config(LocationServiceConfig(
            name, frozenset({LSID}), listen="127.0.0.1:0", control="127.0.0.1:0", epoch=1.0,
            members=dials, accept_routers=accept)))
        await node.start()
        members[name] = node
    # r1 hangs off m1 and m3, r2 off m2 and m4: opposite corners of the ring
    edges = []
    for name, ups in (("r1", ("m1", "m3")), ("r2", ("m2", "m4"))):
        node = RouterNode(NodeConfig(name, listen="127.0.0.1:0", control="127.0.0.1:0",
                                     epoch=1.0, peers=[PeerConfig(addr(members[u]), u)
                                                       for u in ups]))
        await node.start()
        edges.append(node)
    ms = [members[n] for n in NAMES]
    for node in (*ms, *edges):
        degree = sum(node.config.name in pair for pair in graph)
        await within(node.wait_peers_up(degree + 1 if node in ms else 2))
        await within(node.wait_routes(LSID))
    await _agreed(ms, graph is MESH)
    return ms, edges


@pytest.mark.parametrize("graph", [RING, MESH], ids=["ring", "mesh"])
def test_four_members_deliver_and_survive_a_member_failure(
        graph: tuple[tuple[str, str], ...], capsys: pytest.CaptureFixture[str]) -> None:
    shape = "ring" if graph is RING else "full mesh"

    async def main() -> None:
        members, (r1, r2) = await _overlay(graph)
        by_name = {m.config.name: m for m in members}
        try:
            for m in members:  # in the ring no member is linked to all the others
                peers = {lk.peer_name for lk in m.core.links.values()}
                assert len(peers & set(NAMES)) == (2 if graph is RING else 3), peers
            a = await flowlib.connect([addr(r1)], name="A")
            s = await flowlib.connect([addr(r2)], name="S")
            flow = await s.create()
            la = await a.listen(flow, [32, BAND_FAULT])
            await s.advertise(flow)
            await s.send(flow, b"hello", band=32)
            assert (await within(la.get())).payload == b"hello"

            sender, rx = SeqSender(s, flow), SeqReceiver(la)
            await rx.until(20)
            victim = by_name[r1.core.links[r1.core.flows[flow.key].upstream].peer_name]
            t_kill = await rx.across(victim.stop())
            await sender.stop()
            gap, lost, nums = rx.silence_after(t_kill), rx.lost(), rx.numbers
            with capsys.disabled():
                print(f"\n{shape} of 4 members, {victim.config.name} killed: longest "
                      f"silence {gap * 1000:.1f} ms, {lost} message(s) lost")
            survivors = [m for m in members if m is not victim]
            await _agreed_without(survivors, victim.config.name, graph is MESH)
            # flowls members: a survivor's view, and a one-line error for the lost member
            ctl = "%s:%d" % survivors[0].control_address
            row = await members_of(ctl, LSID, [m.config.name for m in survivors])
            assert row["members"] == sorted(m.config.name for m in survivors)
            capsys.readouterr()
            handlers, level = logging.root.handlers[:], logging.root.level
            try:  # the command sets up logging on the captured stderr: undone after it
                rc = await asyncio.to_thread(flowls_main, ["members", "0x10", "--control",
                                                           ctl, "--expect", ",".join(NAMES)])
            finally:
                logging.root.handlers[:], logging.root.level = handlers, level
            err = capsys.readouterr().err.strip()
            assert rc == 1 and "\n" not in err, err
            assert f"member(s) {victim.config.name} not reachable" in err
            assert lost <= 5, lost
            assert gap < 2.0, gap  # loopback: milliseconds; bounded for a loaded machine
            assert nums[-20:] == list(range(nums[-20], nums[-20] + 20))
            for c in (a, s):
                await c.close()
        finally:
            for node in (r1, r2, *members):
                await node.stop()
    asyncio.run(asyncio.wait_for(main(), 60))


async def _agreed_without(members: list[RouterNode], gone: str, mesh: bool = False) -> None:
    """Until the survivors agree: a tree of two links (a ring lost a member), or each the
    other two directly (a full mesh lost one: still a mesh)."""
    deadline = time.monotonic() + 10
    live = sorted(m.config.name for m in members)
    while True:
        views = [m.core.routing.trees[LSID] for m in members]
        if all(v.members() == live and v.mesh is mesh for v in views) and \
                sum(len(v.tree) for v in views) == (6 if mesh else 4):
            return
        assert time.monotonic() < deadline, (gone, [v.status() for v in views])
        await asyncio.sleep(0.01)


def test_traffic_crosses_a_member_in_the_middle_and_goes_round_when_it_dies(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A on member m1, S on m3 (opposite corners: no link between them). S's stream crosses
    the tree's middle member, m2 (m3's parent toward the root m1); m2 dies and the members'
    tree takes the other way round (m3-m4-m1). Before the tree, members passed a sibling's
    traffic only to their own subtrees: A got nothing at all."""
    async def main() -> None:
        members, edges = await _overlay(RING)
        by_name = {m.config.name: m for m in members}
        try:
            assert by_name["m1"].core.routing.trees[LSID].tree_names == {"m2", "m4"}
            a = await flowlib.connect([addr(by_name["m1"])], name="A")
            s = await flowlib.connect([addr(by_name["m3"])], name="S")
            flow = await s.create()
            la = await a.listen(flow, [32])
            await s.advertise(flow)
            sender, rx = SeqSender(s, flow), SeqReceiver(la)
            await rx.until(20)
            t_kill = await rx.across(by_name["m2"].stop())
            await sender.stop()
            gap, lost, nums = rx.silence_after(t_kill), rx.lost(), rx.numbers
            with capsys.disabled():
                print(f"\nring of 4 members, the middle member m2 killed: longest silence "
                      f"{gap * 1000:.1f} ms, {lost} message(s) lost")
            assert len(nums) == len(set(nums))  # nothing twice
            assert lost <= 5, lost
            assert gap < 2.0, gap
            assert by_name["m1"].core.routing.trees[LSID].tree_names == {"m4"}
            for c in (a, s):
                await c.close()
        finally:
            for node in (*edges, *members):
                await node.stop()
    asyncio.run(asyncio.wait_for(main(), 60))
