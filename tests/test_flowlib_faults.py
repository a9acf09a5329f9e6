"""flowlib's faults, GC and protocol corners: the fault band, the exact frames the client
sends (checked on a scripted fake router), a malformed frame or an ERROR from the router, and a
lost connection waking whoever waits on it. Real routers over loopback and the fake router come
from flowlibnet.py; the rest of the asyncio client is tested in test_flowlib.py.

Every test runs its own event loop with ``asyncio.run`` under a hard ``wait_for`` bound, and
synchronises on events (acks, received messages, frame order on one TCP link), never on sleeps.
"""

from __future__ import annotations

import asyncio

import pytest

import flowlib
from flowlib import ConnectionLost, FlowID, FlowTimeout, JoinRefused, Locality, Message
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_GC, BAND_MEMBERSHIP
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import pack_header

from .flowlibnet import LSID, FakeRouter, chain, fake_client
from .rawep import addr, get, run


# ================================================================== faults, GC, protocol corners
def test_fault_band_delivered_and_decoded() -> None:
    async def main() -> None:
        async with chain(3) as (r0, r1, r2):
            async with await flowlib.connect(addr(r2), name="rx") as rx:
                flow = await rx.create()
                faults = await rx.listen(flow, "fault")
                await r0.stop()  # r1 loses its way to the core
                msg = await get(faults)
                assert msg.is_fault and msg.band == BAND_FAULT
                fault = msg.fault()
                assert fault.kind is C.FaultKind.LINK_DOWN and fault.origin == "r1"
                assert flowlib.decode_fault(msg.payload) == fault
                with pytest.raises(ValueError):
                    flowlib.decode_fault(b"not a fault")
    run(main())


def test_join_frames_ping_pong_and_ack_timeout() -> None:
    """The exact frames the client sends, checked on a scripted router."""
    async def main() -> None:
        async with FakeRouter() as fake:
            client, conn = await fake_client(fake, request_timeout=5)
            async with client:
                flow, idle = await client.create(), await client.create()
                # advertise: JOIN flagged ADVERTISE with mask 0, locality in the header
                adv = asyncio.ensure_future(client.advertise(flow, (Locality.GEOGRAPHY, 4)))
                hdr, join = await conn.read_join()
                assert hdr.key == flow.key
                assert hdr.band == BAND_MEMBERSHIP and hdr.loc_value == 4
                assert (join.mask, join.flags) == (0, C.JOIN_FLAG_ADVERTISE)
                conn.control(flow.key, 0, C.JoinAck(join.req_id, C.JoinStatus.OK))
                await adv
                # listen: a JOIN with the listener's bands, still flagged (advertised)
                listening = asyncio.ensure_future(client.listen(flow, [40]))
                _, join = await conn.read_join()
                assert join.mask == 1 << 40 and join.flags == C.JOIN_FLAG_ADVERTISE
                # a stale ack (unknown request) is ignored, the real one completes
                conn.control(flow.key, 0, C.JoinAck(join.req_id + 1000, C.JoinStatus.OK))
                conn.control(flow.key, 0, C.JoinAck(join.req_id, C.JoinStatus.OK))
                lst = await listening
                # GC: a ping on a flow we do not hold is ignored, one on ours is answered;
                # frames stay in order, so the first pong we read answers the second ping
                conn.control(idle.key, BAND_GC, C.Ping(41))
                conn.control(flow.key, BAND_GC, C.Ping(42))
                hdr, pong = await conn.read_control()
                assert isinstance(pong, C.Pong) and pong.epoch == 42
                assert hdr.key == flow.key and hdr.band == BAND_GC
                # data on a band we listen to, and one we do not
                conn.write(flow.key, 41, b"unwanted")
                conn.write(flow.key, 40, b"wanted", ttl=3)
                assert (await get(lst)) == Message(flow, 40, b"wanted", 0, 0, 3)
                assert client.counters["drop.no-listener"] == 1
                # unlisten of the last listener on an advertised flow: JOIN mask 0, no LEAVE
                removing = asyncio.ensure_future(client.unlisten(lst))
                _, join = await conn.read_join()
                assert join.mask == 0 and join.flags == C.JOIN_FLAG_ADVERTISE
                conn.control(flow.key, 0, C.JoinAck(join.req_id, C.JoinStatus.OK))
                await removing
                # a join nobody answers times out, and the client then leaves the flow
                with pytest.raises(FlowTimeout):
                    await client.listen(idle, "data", timeout=0.2)
                await conn.read_join()
                _, leave = await conn.read_control()
                assert isinstance(leave, C.Leave)
                # refusal carries the router's reason
                listening = asyncio.ensure_future(client.listen(idle, "data"))
                _, join = await conn.read_join()
                conn.control(idle.key, 0, C.JoinAck(join.req_id, C.JoinStatus.LIMIT, "full"))
                with pytest.raises(JoinRefused, match="LIMIT.*full"):
                    await listening
            # close(): a polite LEAVE for the advertised flow, then EOF
            _, leave = await conn.read_control()
            assert isinstance(leave, C.Leave)
            assert await conn.reader.read() == b""
    run(main())


def test_malformed_frame_from_router_drops_link() -> None:
    async def main() -> None:
        async with FakeRouter() as fake:
            lost: list[object] = []
            client, conn = await fake_client(fake, on_disconnect=lost.append)
            flow = await client.create()
            task = asyncio.ensure_future(client.listen(flow, "data"))
            _, join = await conn.read_join()
            conn.control(flow.key, 0, C.JoinAck(join.req_id, C.JoinStatus.OK))
            lst = await task
            conn.writer.write(pack_header(flow.key, 1, 200))  # band 200 does not exist
            with pytest.raises(ConnectionLost, match="malformed"):
                await get(lst)
            await client.wait_closed()
            assert client.closed and "bad-band" in (client.close_reason or "")
            assert len(lost) == 1 and isinstance(lost[0], ConnectionLost)
            conn.close()
    run(main())


def test_router_error_after_handshake_is_reported() -> None:
    async def main() -> None:
        async with FakeRouter() as fake:
            client, conn = await fake_client(fake)
            conn.control(LINK_LOCAL_FLOW.key, 0, C.Error(2, "shutting down for maintenance"))
            await asyncio.wait_for(client.wait_closed(), 5)
            with pytest.raises(ConnectionLost, match="maintenance"):
                client.send_nowait(FlowID(1, LSID, 1), b"x")
            conn.close()
    run(main())


def test_connection_loss_wakes_waiting_get() -> None:
    async def main() -> None:
        async with chain(1) as (r0,):
            lost = asyncio.Event()
            reasons: list[object] = []

            async def hook(err: flowlib.FlowError | None) -> None:
                reasons.append(err)
                lost.set()

            rx = await flowlib.connect(addr(r0), name="rx", on_disconnect=hook)
            tx = await flowlib.connect(addr(r0), name="tx")
            flow = await tx.create()
            lst = await rx.listen(flow, "data")
            other = await rx.listen(flow, "data")
            await tx.send(flow, b"queued before the loss")
            assert (await get(other)).payload == b"queued before the loss"
            waiter = asyncio.ensure_future(other.get())

            async def iterate() -> list[bytes]:
                return [m.payload async for m in lst]

            iterating = asyncio.ensure_future(iterate())
            await r0.stop()
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(waiter, 5)
            with pytest.raises(ConnectionLost):  # iteration reports the loss, not a clean end
                await asyncio.wait_for(iterating, 5)
            await asyncio.wait_for(lost.wait(), 5)
            assert rx.closed and isinstance(reasons[0], ConnectionLost)
            with pytest.raises(ConnectionLost):
                await rx.send(flow, b"x")
            with pytest.raises(ConnectionLost):
                await rx.listen(flow, "data")
            await rx.close()  # closing a lost client is fine
            await tx.close()
    run(main())


def test_pending_listen_fails_on_connection_loss() -> None:
    async def main() -> None:
        async with FakeRouter() as fake:
            client, conn = await fake_client(fake)
            flow = await client.create()
            task = asyncio.ensure_future(client.listen(flow, "data"))
            await conn.read_join()
            conn.writer.transport.abort()
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(task, 5)
            assert client.listeners() == []
    run(main())
