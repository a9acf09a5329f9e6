"""``FlowClient.flush``: wait until the router has read every message sent before it.

The protocol's part (an ECHO out of turn, its reply as an event) on virtual time; the
client's against a scripted fake router (what is read before the ECHO, an answer that never
comes, a link lost while waiting, a router from before soft state) and a real one (the
router's count of frames read from the link when the flush returns).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import flowlib
from flowlib import ConnectionLost, FailoverInProgress, FlowTimeout
from flowlib.events import EchoAnswered
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_MEMBERSHIP
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import HEADER_SIZE, FrameDecoder, parse_header

from .flowlibnet import LSID, FakeConn, FakeRouter, endpoint_link, fake_client
from .rawep import addr, get, router, run
from .test_client_protocol import control, events, up_protocol

QUIET: dict[str, Any] = dict(liveness_interval=3600.0, dead_after=7200.0, refresh_interval=3600.0,
                             request_timeout=10)


# ================================================================== the protocol
def test_a_flush_echo_is_written_after_what_came_before_and_its_reply_is_an_event() -> None:
    proto = up_protocol(0.0)
    proto.data_to_send()
    flow = FlowID(7, LSID, 1)
    proto.send_message(flow.key, b"first", 5, 0, 32, 0, 0, 8)
    seq = proto.flush_echo(1.0)
    frames = list(FrameDecoder(1 << 20).feed(b"".join(bytes(b) for b in proto.data_to_send())))
    assert [bytes(h[:16]) for h, _p in frames] == [flow.key, LINK_LOCAL_FLOW.key]
    assert bytes(frames[0][1]) == b"first"
    echo = C.decode(bytes(frames[1][1]))
    assert isinstance(echo, C.Echo) and echo.seq == seq
    # a reply to another ECHO (the periodic ones) is no flush's; the flush's is, once
    proto.receive_data(control(LINK_LOCAL_FLOW.key, C.EchoReply(seq + 7, 0)), 1.1)
    assert events(proto) == []
    proto.receive_data(control(LINK_LOCAL_FLOW.key, C.EchoReply(seq, echo.stamp)), 1.2)
    assert events(proto) == [EchoAnswered(seq)]
    proto.receive_data(control(LINK_LOCAL_FLOW.key, C.EchoReply(seq, echo.stamp)), 1.3)
    assert events(proto) == []
    assert proto.liveness.rtt is not None and 0 < proto.liveness.rtt < 1


def test_flush_echoes_awaited_at_once_are_bounded() -> None:
    proto = up_protocol(0.0)
    for i in range(3000):
        proto.flush_echo(float(i))
    assert len(proto.liveness.flushes) <= 1024


# ================================================================== the client, a fake router
async def _read_until_echo(conn: FakeConn, want: int) -> tuple[list[bytes], C.Echo]:
    """The payloads of the data frames the fake router reads, and the first ECHO after
    *want* of them (the client's first periodic ECHO goes out when the link comes up)."""
    payloads: list[bytes] = []
    while True:
        raw = await asyncio.wait_for(conn.reader.readexactly(HEADER_SIZE), 5)
        hdr = parse_header(raw)
        body = await asyncio.wait_for(conn.reader.readexactly(hdr.size), 5)
        if hdr.key == LINK_LOCAL_FLOW.key:
            msg = C.decode(body)
            if isinstance(msg, C.Echo) and len(payloads) >= want:
                return payloads, msg
        elif hdr.band >= 32:
            payloads.append(body)


def test_flush_returns_when_the_router_answers_the_echo_after_the_messages() -> None:
    async def main() -> None:
        async with FakeRouter() as fake:
            client, conn = await fake_client(fake, features=C.FEATURES, **QUIET)
            async with client:
                flow = FlowID(7, LSID, 1)
                for i in range(20):
                    client.send_nowait(flow, b"m%d" % i)
                task = asyncio.ensure_future(client.flush())
                payloads, echo = await _read_until_echo(conn, 20)
                assert payloads == [b"m%d" % i for i in range(20)]
                assert not task.done()  # no answer yet: nothing the router read is known
                conn.control(LINK_LOCAL_FLOW.key, BAND_MEMBERSHIP,
                             C.EchoReply(echo.seq, echo.stamp))
                await asyncio.wait_for(task, 5)
            conn.close()
    run(main())


def test_an_unanswered_flush_times_out() -> None:
    async def main() -> None:
        async with FakeRouter() as fake:
            client, conn = await fake_client(fake, features=C.FEATURES, **QUIET)
            async with client:
                with pytest.raises(FlowTimeout, match="did not answer the flush"):
                    await client.flush(timeout=0.2)
            conn.close()
    run(main())


@pytest.mark.parametrize("failover", [False, True])
def test_a_flush_fails_when_the_link_is_lost_first(failover: bool) -> None:
    """Without failover the client ends (ConnectionLost); with it, the messages sent on the
    lost link may be lost, and the flush says so (FailoverInProgress)."""
    async def main() -> None:
        async with FakeRouter() as fake:
            client, conn = await fake_client(fake, features=C.FEATURES, failover=failover,
                                             failover_timeout=1.0, **QUIET)
            try:
                client.send_nowait(FlowID(7, LSID, 1), b"m")
                task = asyncio.ensure_future(client.flush())
                await _read_until_echo(conn, 1)
                conn.writer.transport.abort()
                with pytest.raises(FailoverInProgress if failover else ConnectionLost,
                                   match="flush" if failover else None):
                    await asyncio.wait_for(task, 5)
            finally:
                await client.close(timeout=1)
    run(main())


def test_flush_on_a_closed_client_raises() -> None:
    async def main() -> None:
        async with FakeRouter() as fake:
            client, conn = await fake_client(fake, features=C.FEATURES, **QUIET)
            await client.close(timeout=1)
            with pytest.raises(ConnectionLost):
                await client.flush()
            conn.close()
    run(main())


def test_a_router_from_before_soft_state_gets_no_echo() -> None:
    """It would drop the link on one: the flush only hands what was written to the link."""
    async def main() -> None:
        async with FakeRouter() as fake:
            client, conn = await fake_client(fake, features=0, **QUIET)
            async with client:
                client.send_nowait(FlowID(7, LSID, 1), b"m")
                await asyncio.wait_for(client.flush(), 5)
                hdr, payload = await conn.read()
                assert payload == b"m"
                assert conn.soft == []
            conn.close()
    run(main())


# ================================================================== the client, a real router
def test_when_flush_returns_the_router_has_read_every_message_sent_before() -> None:
    """The router runs on the test's loop, so it reads only while the test waits: its count
    of frames read from the sender's link, taken when flush returns, is exact."""
    async def main() -> None:
        node = await router("r0", core=True, lsid=LSID)
        try:
            async with await flowlib.connect(addr(node), name="rx", **QUIET) as rx, \
                    await flowlib.connect(addr(node), name="tx", **QUIET) as tx:
                flow = await rx.create()
                lst = await rx.listen(flow, "data", size=4096)
                await tx.flush()
                link = node.core.links[endpoint_link(node, tx)]
                before = link.rx
                for i in range(2000):
                    tx.send_nowait(flow, b"%d" % i)
                await tx.flush()
                assert link.rx - before >= 2001  # the messages and the flush's ECHO
                got = [(await get(lst)).payload for _ in range(2000)]
                assert got == [b"%d" % i for i in range(2000)]
        finally:
            await node.stop()
    run(main())
