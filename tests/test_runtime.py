"""The asyncio router over real loopback sockets: forwarding rules end to end and bad input."""

from __future__ import annotations

import asyncio
import logging

import pytest

from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode, query_control
from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import HEADER, Locality, pack_header

from .rawep import RawEndpoint, chain, within

FLOW = FlowID(0xA1, 0x10, 1)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 60))


def bands(*bs: int) -> int:
    out = 0
    for b in bs:
        out |= 1 << b
    return out


async def _members(nodes: list[RouterNode]) -> tuple[RawEndpoint, RawEndpoint, RawEndpoint]:
    """A on r1 (bands 32,33), B on r2 (33,34), C on r3 (all data) joined to FLOW."""
    a = await RawEndpoint.connect(nodes[0], "A")
    b = await RawEndpoint.connect(nodes[1], "B")
    c = await RawEndpoint.connect(nodes[2], "C")
    for ep, mask in ((a, bands(32, 33)), (b, bands(33, 34)), (c, bands(32, 33, 34, 35))):
        ack = await ep.join(FLOW, mask)
        assert ack.status is C.JoinStatus.OK
    return a, b, c


def test_multicast_band_filtering_and_no_echo() -> None:
    async def main() -> None:
        async with chain(3) as nodes:
            a, b, c = await _members(nodes)
            s = await RawEndpoint.connect(nodes[2], "S")  # non-member sender on the core
            for band in (32, 33, 34, 35):
                s.send(FLOW, f"b{band}".encode(), band=band)
            got_a = [p for _, p in await a.data(2)]
            got_b = [p for _, p in await b.data(2)]
            got_c = [p for _, p in await c.data(4)]
            assert got_a == [b"b32", b"b33"]
            assert got_b == [b"b33", b"b34"]
            assert got_c == [b"b32", b"b33", b"b34", b"b35"]
            # A member sending reaches the others but never itself.
            a.send(FLOW, b"from-a", band=33)
            assert [p for _, p in await b.data(1)] == [b"from-a"]
            assert [p for _, p in await c.data(1)] == [b"from-a"]
            s.send(FLOW, b"marker", band=32)
            assert [p for _, p in await a.data(1)] == [b"marker"]  # not b"from-a"
            # Filtered traffic did not cross r2 -> r1: only bands 32/33 went that way.
            r2 = nodes[1].core
            to_r1 = next(lk for lk in r2.links.values() if lk.peer_name == "r1")
            data_to_r1 = 3  # b32, b33, marker (from-a came from r1 itself)
            # tx also counts control (join acks, masks); bound it tightly
            assert to_r1.tx - data_to_r1 <= 2
            assert nodes[0].core.counters["drop.band-filtered"] == 0
            for ep in (a, b, c, s):
                await ep.close()
    run(main())


def test_non_member_sender_far_from_core_reaches_members() -> None:
    async def main() -> None:
        async with chain(3) as nodes:
            b = await RawEndpoint.connect(nodes[1], "B")
            assert (await b.join(FLOW, bands(40))).status is C.JoinStatus.OK
            s = await RawEndpoint.connect(nodes[0], "S")
            s.send(FLOW, b"hello", band=40)
            (hdr, payload), = await b.data(1)
            assert payload == b"hello"
            assert hdr.ttl == 32 - 2  # crossed r1 and r2
            assert nodes[0].core.counters["forward.toward-core"] == 1
            await b.close()
            await s.close()
    run(main())


def test_ttl_and_locality_expiry() -> None:
    async def main() -> None:
        async with chain(3) as nodes:
            a, b, c = await _members(nodes)
            s = await RawEndpoint.connect(nodes[2], "S")
            # TTL 1: only endpoints of the first router (r3: C) get it.
            s.send(FLOW, b"ttl1", band=33, ttl=1)
            s.send(FLOW, b"ttl2", band=33, ttl=2)
            s.send(FLOW, b"ttl3", band=33, ttl=3)
            assert [p for _, p in await c.data(3)] == [b"ttl1", b"ttl2", b"ttl3"]
            assert [p for _, p in await b.data(2)] == [b"ttl2", b"ttl3"]
            assert [p for _, p in await a.data(1)] == [b"ttl3"]
            assert nodes[2].core.counters["drop.ttl"] >= 1
            for ep in (a, b, c, s):
                await ep.close()
    run(main())


def test_locality_budget_per_link() -> None:
    async def main() -> None:
        # r2 -> r1 costs 3 (geography: another site); r3 -> r2 costs 1 (same site).
        core = RouterNode(NodeConfig("r3", listen="127.0.0.1:0", core_lsids=frozenset({0x10}),
                                     accept_routers=["r2@127.0.0.1"]))
        await core.start()
        from flowrouter.core.tables import Modifiers
        mid = RouterNode(NodeConfig("r2", listen="127.0.0.1:0", accept_routers=["r1@127.0.0.1"],
                                    peers=[
            PeerConfig("%s:%d" % core.tcp_address, "r3", modifiers=Modifiers(geography=1))]))
        await mid.start()
        edge = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", peers=[
            PeerConfig("%s:%d" % mid.tcp_address, "r2", modifiers=Modifiers(geography=3))]))
        await edge.start()
        nodes = [edge, mid, core]
        try:
            for n in nodes:
                await within(n.wait_routes(0x10))
            # Modifiers are per direction: r1's dial config sets r1->r2; r2 sees r1 at 0.
            # So send from r1's side: a copy to r2 costs 3, to r3 a further 1.
            b = await RawEndpoint.connect(mid, "B")
            c = await RawEndpoint.connect(core, "C")
            for ep in (b, c):
                assert (await ep.join(FLOW, bands(32))).status is C.JoinStatus.OK
            s = await RawEndpoint.connect(edge, "S")
            s.send(FLOW, b"geo2", band=32, loc_type=Locality.GEOGRAPHY, loc_value=2)
            s.send(FLOW, b"geo3", band=32, loc_type=Locality.GEOGRAPHY, loc_value=3)
            s.send(FLOW, b"geo4", band=32, loc_type=Locality.GEOGRAPHY, loc_value=4)
            got_b = await b.data(2)
            assert [p for _, p in got_b] == [b"geo3", b"geo4"]
            assert [h.loc_value for h, _ in got_b] == [0, 1]
            got_c = await c.data(1)
            assert [p for _, p in got_c] == [b"geo4"]
            assert got_c[0][0].loc_value == 0
            assert edge.core.counters["drop.locality"] == 1
            assert mid.core.counters["drop.locality"] == 1
            # The accepting side adopted the costs the dialler announced in its HELLO, so
            # locality is charged the other way too: r3 -> r2 costs 1, r2 -> r1 costs 3.
            to_r2 = next(lk for lk in core.core.links.values() if lk.peer_name == "r2")
            assert to_r2.modifiers[Locality.GEOGRAPHY] == 1
            a = await RawEndpoint.connect(edge, "A")
            assert (await a.join(FLOW, bands(32))).status is C.JoinStatus.OK
            s3 = await RawEndpoint.connect(core, "S3")
            s3.send(FLOW, b"back0", band=32, loc_type=Locality.GEOGRAPHY, loc_value=0)
            s3.send(FLOW, b"back3", band=32, loc_type=Locality.GEOGRAPHY, loc_value=3)
            s3.send(FLOW, b"back4", band=32, loc_type=Locality.GEOGRAPHY, loc_value=4)
            assert [p for _, p in await b.data(2)] == [b"back3", b"back4"]
            assert [p for _, p in await a.data(1)] == [b"back4"]
            for ep in (a, b, c, s, s3):
                await ep.close()
        finally:
            for n in nodes:
                await n.stop()
    run(main())


BAD_FRAMES = {
    "truncated": pack_header(FLOW.key, 100, 32) + b"only ten b",
    "oversized": pack_header(FLOW.key, 10_000_000, 32),
    "bad-band": HEADER.pack(0xA1, 0x10, 1, 3, 200, 0, 0, 32) + b"abc",
    "bad-locality": HEADER.pack(0xA1, 0x10, 1, 3, 40, 9, 0, 32) + b"abc",
    "bad-control": pack_header(FLOW.key, 5, 0) + b"\x01\x0azzz",  # a JOIN cut short
    "garbage": b"\xff" * 64,
}


@pytest.mark.parametrize("kind", sorted(BAD_FRAMES))
def test_malformed_frame_drops_only_that_link(kind: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with chain(3) as nodes:
            a, b, c = await _members(nodes)
            bad = await RawEndpoint.connect(nodes[1], "bad")
            bad.send_raw(BAD_FRAMES[kind])
            if kind == "truncated":
                bad.writer.write_eof()
            await within(bad.closed.wait())
            r2 = nodes[1].core
            expected = {"garbage": "oversized"}.get(kind, kind)
            assert r2.counters[f"malformed.{expected}"] == 1
            assert not any(lk.peer_name == "bad" for lk in r2.links.values())
            # Everyone else is still served, through the router that saw the bad frame.
            s = await RawEndpoint.connect(nodes[0], "S")
            s.send(FLOW, b"still-alive", band=33)
            assert [p for _, p in await b.data(1)] == [b"still-alive"]
            assert [p for _, p in await c.data(1)] == [b"still-alive"]
            for ep in (a, b, c, s):
                await ep.close()
    with caplog.at_level(logging.WARNING):
        run(main())
    assert any("bad" in r.getMessage() and ("malformed" in r.getMessage()
                                            or "truncated" in r.getMessage())
               for r in caplog.records)


def test_data_before_hello_is_refused_with_error() -> None:
    async def main() -> None:
        async with chain(1) as nodes:
            ep = await RawEndpoint.connect(nodes[0], "nohello", hello=False)
            ep.send(FLOW, b"x", band=32)
            hdr, payload = await ep.next_frame()  # the router's own HELLO
            assert isinstance(C.decode(payload), C.Hello)
            hdr, payload = await ep.next_frame()
            err = C.decode(payload)
            assert isinstance(err, C.Error) and "HELLO" in err.text
            await within(ep.closed.wait())
            assert nodes[0].core.counters["malformed.no-hello"] == 1
    run(main())


def test_join_refused_without_route_and_status_query() -> None:
    async def main() -> None:
        async with chain(2, control="127.0.0.1:0") as nodes:
            ep = await RawEndpoint.connect(nodes[0], "E")
            ack = await ep.join(FlowID(1, 0x99, 1), bands(32))
            assert ack.status is C.JoinStatus.NO_ROUTE and "0x99" in ack.reason
            assert (await ep.join(FLOW, bands(32), req=2)).status is C.JoinStatus.OK
            addr = "%s:%d" % nodes[0].control_address
            st = (await query_control(addr))["status"]
            assert st["name"] == "r1"
            assert {lk["peer"] for lk in st["links"]} == {"r2", "E"}
            assert [f["flow"] for f in st["flows"]] == [str(FLOW)]
            assert st["flows"][0]["aggregate"] == "32"
            await ep.close()
    run(main())


def test_router_link_redialled_after_drop() -> None:
    async def main() -> None:
        async with chain(2, reconnect_min=0.05) as nodes:
            r1 = nodes[0]
            link = next(lid for lid, lk in r1.core.links.items() if lk.peer_name == "r2")
            r1.links[link].close("test drops it")  # type: ignore[union-attr]
            await within(r1.wait_peers_up(1))
            while r1.links_up() < 1 or link in r1.core.links:
                await asyncio.sleep(0.01)
            assert r1.core.counters["links.down"] >= 1
            assert r1.core.counters["links.up"] >= 2
    run(main())


def test_udp_links_between_routers() -> None:
    async def main() -> None:
        core = RouterNode(NodeConfig("u2", listen="127.0.0.1:0", udp="127.0.0.1:0",
                                     accept_routers=["u1@127.0.0.1"],
                                     core_lsids=frozenset({0x10})))
        await core.start()
        edge = RouterNode(NodeConfig("u1", listen="127.0.0.1:0", udp="127.0.0.1:0", peers=[
            PeerConfig("%s:%d" % core.udp_address, "u2", transport="udp")]))
        await edge.start()
        try:
            await within(edge.wait_routes(0x10))
            c = await RawEndpoint.connect(core, "C")
            assert (await c.join(FLOW, bands(50))).status is C.JoinStatus.OK
            s = await RawEndpoint.connect(edge, "S")
            s.send(FLOW, b"over-udp", band=50)
            (hdr, payload), = await c.data(1)
            assert payload == b"over-udp"
            udp_links = [lk for lk in edge.core.links.values() if lk.transport == "udp"]
            assert len(udp_links) == 1 and udp_links[0].tx >= 1
            await c.close()
            await s.close()
        finally:
            await edge.stop()
            await core.stop()
    run(main())


def test_hello_is_required_on_link_local_flow() -> None:
    async def main() -> None:
        async with chain(1) as nodes:
            ep = await RawEndpoint.connect(nodes[0], "E")
            # A JOIN on the link-local flow is nonsense: link dropped, router fine.
            ep.send_control(LINK_LOCAL_FLOW.key, C.Join(1, 0))
            await within(ep.closed.wait())
            assert nodes[0].core.counters["malformed.bad-control"] == 1
    run(main())


def test_soft_state_collects_a_member_that_never_refreshes_over_real_sockets() -> None:
    """An application that stays connected but never sends a refresh digest loses its state
    on every router of its branch after the hold time, and is told (PRUNE)."""
    async def main() -> None:
        async with chain(3, refresh_interval=0.2, hold_factor=3.0,
                         tick_interval=0.02) as nodes:
            ghost = await RawEndpoint.connect(nodes[0], "ghost")  # an older client
            assert (await ghost.join(FLOW, bands(40))).status is C.JoinStatus.OK
            assert all(FLOW.key in n.core.flows for n in nodes)
            while True:  # echoes come first (unanswered: fine for an older client)
                msg = await within(ghost.soft.get())
                if isinstance(msg, C.Prune):
                    break
            assert msg.keys == (FLOW.key,)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while any(FLOW.key in n.core.flows for n in nodes):
                assert loop.time() < deadline, "the branch was never collected"
                await asyncio.sleep(0.05)
            assert nodes[0].core.counters["gc.links-collected"] == 1
            assert nodes[1].core.counters["refresh.rounds-received"] >= 1
            await ghost.close()
    run(main())


def test_forwarding_on_uvloop() -> None:
    """The runtime is loop-agnostic: the same overlay works on uvloop (flowrouter --uvloop)."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        async with chain(3) as nodes:
            a, b, c = await _members(nodes)
            s = await RawEndpoint.connect(nodes[0], "S")
            for band in (32, 34):
                s.send(FLOW, f"u{band}".encode(), band=band)
            assert [p for _, p in await a.data(1)] == [b"u32"]
            assert [p for _, p in await b.data(1)] == [b"u34"]
            assert [p for _, p in await c.data(2)] == [b"u32", b"u34"]
            # Large frames in a burst, on a band only C takes (a lone receiver: B would be a
            # slow consumer beside r2's link to r3): written straight to uvloop's sockets
            # (one writev per read), tails the socket does not take queued as copies,
            # inputs held while the outputs push back; all of it arrives, in order.
            assert all(lk.fd >= 0 for n in nodes for lk in n.links.values()
                       if hasattr(lk, "fd") and lk.transport is not None)
            n = 400
            for i in range(n):
                s.send(FLOW, i.to_bytes(4, "big") + bytes(65532), band=35)
                if i % 8 == 7:
                    await s.writer.drain()
            got = [int.from_bytes(p[:4], "big") for _, p in await c.data(n, timeout=60)]
            assert got == list(range(n))
            assert not any(k.startswith("drop.") and v for nd in nodes
                           for k, v in nd.core.counters.items())
            for ep in (a, b, c, s):
                await ep.close()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(main(), 60))
