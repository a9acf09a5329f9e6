"""flowlib against real routers (flowrouter.net.runtime.RouterNode) over loopback, plus a scripted
fake router for the protocol corners a real router does not produce on demand (refusals, a peer
that is no router): connect and the handshake, create, listen and send. Faults, GC and the
protocol corners are in test_flowlib_faults.py; a listener's queue, the synchronous facade,
flowcat and the options in test_flowlib_facades.py; the router chain and the fake router in
flowlibnet.py.

Every test runs its own event loop with ``asyncio.run`` under a hard ``wait_for`` bound, and
synchronises on events (acks, received messages, frame order on one TCP link), never on sleeps.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import flowlib
from flowlib import (
    BandMask,
    ConnectError,
    ConnectionLost,
    FlowID,
    JoinRefused,
    ListenerClosed,
    Locality,
    Message,
    MessageTooLarge,
)
from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, LocalIdAllocator

from .flowlibnet import LSID, FakeRouter, chain, endpoint_link, fake_client
from .ports import free_port
from .rawep import addr, get, run


# ================================================================== connect / handshake
def test_no_soft_state_to_a_router_that_does_not_announce_it() -> None:
    """A router from before soft state (its HELLO announces no features) would drop the link
    on the first ECHO or digest: the client sends it none and never declares it dead for its
    silence, while a router that announces them gets both. A control message of a type the
    client does not know (a newer router's) is counted and ignored."""
    async def main() -> None:
        soft = dict(liveness_interval=0.05, dead_after=0.2, refresh_interval=0.05,
                    request_timeout=5)
        async with FakeRouter() as fake:
            for features in (0, C.FEATURES):
                client, conn = await fake_client(fake, features=features, **soft)
                assert conn.features & C.FEATURE_SOFT_STATE  # the client announces them
                async with client:
                    raw = bytes([C.CONTROL_VERSION, 0xEE]) + b"a newer router's message"
                    conn.write(LINK_LOCAL_FLOW.key, 0, raw)
                    loop = asyncio.get_running_loop()
                    start = loop.time()
                    while (client.counters["control.unknown-type"] < 1
                           or loop.time() - start < 0.5):  # ten liveness intervals
                        await asyncio.sleep(0.05)
                    flow = await client.create()
                    task = asyncio.ensure_future(client.listen(flow, "data"))
                    _, join = await conn.read_join()  # what the client sent before it: soft
                    conn.control(flow.key, 0, C.JoinAck(join.req_id, C.JoinStatus.OK))
                    await task
                    kinds = {type(m) for m in conn.soft}
                    if features:
                        assert {C.Echo, C.Refresh} <= kinds
                    else:
                        assert not kinds and not client.closed  # silent, yet not dead
                conn.close()
    run(main())


def test_connect_handshake_and_close() -> None:
    async def main() -> None:
        async with chain(2) as (r0, r1):
            seen: list[object] = []
            client = await flowlib.connect([addr(r1)], name="app", on_disconnect=seen.append)
            async with client:
                assert client.router_name == "r1"
                assert client.max_payload == r1.config.max_payload
                assert client.default_lsid == LSID
                assert not client.closed
                link = r1.core.links[endpoint_link(r1, client)]
                assert link.role is C.Role.ENDPOINT
            assert client.closed and seen == [None]
            with pytest.raises(ConnectionLost):
                await client.send(FlowID(1, LSID, 1), b"x")
    run(main())


def test_connect_tries_addresses_in_order() -> None:
    async def main() -> None:
        async with chain(1) as (r0,):
            dead = f"127.0.0.1:{free_port()}"
            client = await flowlib.connect([dead, addr(r0)], name="app")
            async with client:
                assert client.router_name == "r0" and client.address == addr(r0)
    run(main())


def test_connect_error_names_every_address() -> None:
    async def main() -> None:
        dead1, dead2 = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        with pytest.raises(ConnectError) as info:
            await flowlib.connect([dead1, "no-port-here", dead2], timeout=2)
        err = info.value
        assert [a for a, _ in err.attempts] == [dead1, "no-port-here", dead2]
        assert "refused" in err.attempts[0][1]
        assert "bad address" in err.attempts[1][1]
        assert dead1 in str(err) and dead2 in str(err)
        assert isinstance(err, ConnectionError)
        with pytest.raises(ConnectError, match="no router address"):
            await flowlib.connect([])
    run(main())


def test_connect_refused_by_router_error_message() -> None:
    async def main() -> None:
        async with FakeRouter() as fake:
            task = asyncio.ensure_future(flowlib.connect(fake.address, timeout=5))
            conn = await fake.accept()
            await conn.read_control()
            conn.control(LINK_LOCAL_FLOW.key, 0, C.Error(3, "endpoint quota exceeded"))
            with pytest.raises(ConnectError, match="endpoint quota exceeded") as info:
                await task
            assert "refused us" in info.value.attempts[0][1]
    run(main())


def test_connect_rejects_non_router_and_silent_peer() -> None:
    async def main() -> None:
        async with FakeRouter() as fake:
            task = asyncio.ensure_future(flowlib.connect(fake.address, timeout=5))
            conn = await fake.accept()
            await conn.read_control()
            conn.control(LINK_LOCAL_FLOW.key, 0, C.Hello(9, C.Role.ENDPOINT, "imposter", 1024))
            with pytest.raises(ConnectError, match="not a flow router"):
                await task
            # a peer that accepts TCP but never says HELLO: the attempt times out
            task = asyncio.ensure_future(flowlib.connect(fake.address, timeout=0.3))
            conn = await fake.accept()
            with pytest.raises(ConnectError, match="timed out after 0.3s") as info:
                await task
            assert "no HELLO" in str(info.value)
            conn.close()
    run(main())


# ================================================================== create
def test_create_ids_unique_and_persisted(tmp_path: Path) -> None:
    state = tmp_path / "mine"

    async def main() -> None:
        async with chain(1) as (r0,):
            async with await flowlib.connect(addr(r0), state_dir=state) as c1:
                first = [await c1.create() for _ in range(5)]
                other = await c1.create(lsid=0x20)
            async with await flowlib.connect(addr(r0), state_dir=state) as c2:
                second = [await c2.create() for _ in range(5)]
                with pytest.raises(ValueError):
                    await c2.create(lsid=0)
            everything = first + [other] + second
            assert len({f.local for f in everything}) == len(everything)
            assert {f.creator for f in everything} == {first[0].creator}
            assert {f.lsid for f in first + second} == {LSID} and other.lsid == 0x20
    run(main())
    # a third allocator instance on the same file continues, never reusing an ID
    alloc = LocalIdAllocator(state / "creator")
    assert alloc.allocate() > 11


def test_create_uses_env_state_dir(_state_dir: Path) -> None:
    async def main() -> FlowID:
        async with chain(1) as (r0,):
            async with await flowlib.connect(addr(r0)) as c:
                return await c.create()
    flow = run(main())
    assert (_state_dir / "creator").exists()
    assert LocalIdAllocator(_state_dir / "creator").creator == flow.creator


# ================================================================== listen / send
def test_listen_and_send_across_routers() -> None:
    async def main() -> None:
        async with chain(3) as (r0, r1, r2):
            async with (await flowlib.connect(addr(r2), name="rx") as rx,
                        await flowlib.connect(addr(r0), name="tx0") as tx0,
                        await flowlib.connect(addr(r1), name="tx1") as tx1):
                flow = await tx0.create()
                lst = await rx.listen(flow, "data")
                # the join built the tree: r2 -> r1 -> r0 (core)
                assert all(flow.key in r.core.flows for r in (r0, r1, r2))
                await tx0.send(flow, b"from the core", band=40)
                msg = await get(lst)
                assert msg == Message(flow, 40, b"from the core", 0, 0, 32 - 3)
                tx1.send_nowait(flow, bytearray(b"via r1"), band=32,
                                locality=(Locality.GEOGRAPHY, 5), ttl=10)
                msg = await get(lst)
                assert (msg.band, msg.payload, msg.loc_type, msg.loc_value, msg.ttl) == \
                    (32, b"via r1", Locality.GEOGRAPHY, 5, 10 - 2)
                assert isinstance(msg.payload, bytes)
                await tx1.send(str(flow), memoryview(b"as text flow"))
                assert (await get(lst)).payload == b"as text flow"
    run(main())


def test_advertised_sender_and_no_loopback() -> None:
    async def main() -> None:
        async with chain(2) as (r0, r1):
            async with (await flowlib.connect(addr(r1), name="a") as a,
                        await flowlib.connect(addr(r1), name="b") as b):
                flow = await a.create()
                await a.advertise(flow)
                link = endpoint_link(r1, a)
                assert r1.core.flows[flow.key].down[link] == 0  # advertised, no bands
                la = await a.listen(flow, "data")
                assert r1.core.flows[flow.key].down[link] == BandMask.data().bits
                lb = await b.listen(flow, [33])
                await a.send(flow, b"mine", band=33)
                assert (await get(lb)).payload == b"mine"
                await b.send(flow, b"theirs", band=33)
                # one TCP link carries both, in order: had a's own message come back it
                # would be queued before b's
                assert (await get(la)).payload == b"theirs"
                assert la.empty()
    run(main())


def test_several_listeners_union_mask() -> None:
    async def main() -> None:
        async with chain(2) as (r0, r1):
            async with (await flowlib.connect(addr(r1), name="rx") as rx,
                        await flowlib.connect(addr(r0), name="tx") as tx):
                flow = await tx.create()
                l1, l2 = await asyncio.gather(rx.listen(flow, [32, 33]),
                                              rx.listen(flow, "33-40"))
                l3 = await rx.listen(flow, BandMask([99]))
                link = endpoint_link(r1, rx)
                union = BandMask([32, 33, 99]) | BandMask.parse("33-40")
                assert r1.core.flows[flow.key].down[link] == union.bits
                assert set(rx.listeners(flow)) == {l1, l2, l3}
                for band in (32, 33, 40, 50, 99):
                    await tx.send(flow, f"b{band}".encode(), band=band)
                got1 = [(await get(l1)).band for _ in range(2)]
                got2 = [(await get(l2)).band for _ in range(2)]
                got3 = [(await get(l3)).band]
                assert (got1, got2, got3) == ([32, 33], [33, 40], [99])
                # band 50 was filtered by the routers, not delivered late: l3's band 99 was
                # sent after it on the same path
                assert l1.empty() and l2.empty() and l3.empty()
                assert rx.counters["drop.no-listener"] == 0
    run(main())


def test_unlisten_narrows_then_leaves() -> None:
    async def main() -> None:
        async with chain(2) as (r0, r1):
            async with (await flowlib.connect(addr(r1), name="rx") as rx,
                        await flowlib.connect(addr(r0), name="tx") as tx):
                flow, other = await tx.create(), await tx.create()
                wide = await rx.listen(flow, "32-40")
                narrow = await rx.listen(flow, [32])
                link = endpoint_link(r1, rx)
                await tx.send(flow, b"before", band=35)
                assert (await get(wide)).payload == b"before"

                await rx.unlisten(wide)  # narrowing JOIN, acked
                assert r1.core.flows[flow.key].down[link] == 1 << 32
                assert wide.closed
                with pytest.raises(ListenerClosed):
                    await wide.get()
                assert [m async for m in wide] == []
                await tx.send(flow, b"filtered", band=35)
                await tx.send(flow, b"kept", band=32)
                assert (await get(narrow)).payload == b"kept"
                assert r0.core.counters["drop.no-receivers"] >= 1  # the core filtered it

                await rx.unlisten(narrow)  # last one: LEAVE, no ack
                assert rx.listeners(flow) == []
                # a later acked join on the same link proves the LEAVE was processed
                await rx.listen(other, "data")
                assert flow.key not in r1.core.flows and flow.key not in r0.core.flows
                await rx.unlisten(narrow)  # idempotent
    run(main())


def test_listen_refused_no_route() -> None:
    async def main() -> None:
        async with chain(2) as (r0, r1):
            async with await flowlib.connect(addr(r1), name="rx") as rx:
                flow = await rx.create(lsid=0x99)  # no router serves LSID 0x99
                with pytest.raises(JoinRefused) as info:
                    await rx.listen(flow, "data")
                err = info.value
                assert err.status is C.JoinStatus.NO_ROUTE
                assert "no route" in err.reason and "0x99" in err.reason
                assert err.reason in str(err) and err.flow == flow
                assert rx.listeners(flow) == []
                with pytest.raises(JoinRefused):
                    await rx.advertise(flow)
                # the client is still fine
                good = await rx.create()
                await rx.listen(good, "data")
    run(main())


def test_send_and_listen_validation() -> None:
    async def main() -> None:
        async with chain(1, max_payload=1024) as (r0,):
            async with await flowlib.connect(addr(r0)) as c:
                flow = await c.create()
                assert c.max_payload == 1024
                for band in (0, 1, 15, 128, -1, True, "32"):
                    with pytest.raises(ValueError):
                        c.send_nowait(flow, b"x", band=band)  # type: ignore[arg-type]
                with pytest.raises(ValueError, match="reserved for routers"):
                    await c.send(flow, b"x", band=5)
                for ttl in (0, 256, -1):
                    with pytest.raises(ValueError, match="ttl"):
                        c.send_nowait(flow, b"x", ttl=ttl)
                for loc in ((9, 1), (Locality.DELAY, 256), ("bogus", 1), (1,), 5):
                    with pytest.raises(ValueError, match="locality"):
                        c.send_nowait(flow, b"x", locality=loc)  # type: ignore[arg-type]
                c.send_nowait(flow, b"x", locality=("geography", 3))
                with pytest.raises(TypeError):
                    c.send_nowait(flow, "text")  # type: ignore[arg-type]
                with pytest.raises(MessageTooLarge) as info:  # larger ones are fragmented
                    await c.send(flow, bytes(1025), fragment=False)  # unless refused
                assert (info.value.size, info.value.limit) == (1025, 1024)
                assert isinstance(info.value, ValueError)
                c.send_nowait(flow, bytes(1024))  # exactly the limit is fine
                with pytest.raises(ValueError, match="not routable"):
                    c.send_nowait(LINK_LOCAL_FLOW, b"x")
                for bands in ([3], "gc", "none", []):
                    with pytest.raises(ValueError):
                        await c.listen(flow, bands)
                with pytest.raises(ValueError):
                    await c.listen(flow, "data", size=0)
                with pytest.raises(ValueError, match="overflow"):
                    await c.listen(flow, "data", overflow="drop-random")
                assert c.listeners() == [] and not c.closed
                # "all" means every band an application can see
                lst = await c.listen(flow, "all")
                assert lst.mask == BandMask.parse("16-127")
    run(main())
