"""The client's asyncio shell on virtual time: a link's timer drives the protocol's liveness,
and failover follows its schedule, gives up or succeeds, without a router or a wall clock.

The loop of tests/virtualtime.py jumps to the next timer when idle, so the times asserted
here are exact. The live tests (test_failover, test_softstate_live) prove the same over real
routers.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from flowlib.connection import Connection
from flowlib.delivery import Delivery
from flowlib.events import FailoverEvent
from flowlib.failover import Failover
from flowlib.flowtable import FlowTable
from flowlib.fragment import Reassembler
from flowlib.link import Link
from flowlib.membership import Membership
from flowlib.options import ClientOptions
from flowrouter.wire import control as C
from flowrouter.wire.header import FrameDecoder

from .test_client_protocol import LINK_KEY, control, new_protocol, router_hello
from .virtualtime import run_virtual


class FakeTransport:
    """What a Link writes; abort() ends the connection the way asyncio does (soon)."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.written = bytearray()
        self.closed = False

    def writelines(self, buffers: list[Any]) -> None:
        for b in buffers:
            self.written += b

    def get_extra_info(self, name: str) -> None:
        return None

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.link.connection_lost, None)

    close = abort

    def messages(self) -> list[C.ControlMessage]:
        return [C.decode(p) for h, p in FrameDecoder(1 << 20).feed(bytes(self.written))
                if h[20] < 16]


def test_link_timer_sends_echoes_and_drops_a_silent_router() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[tuple[float, str]] = loop.create_future()
        link = Link(new_protocol(loop.time()), "r1:1", keepalive=False,
                    on_event=lambda link, ev: None,
                    on_lost=lambda link, why: lost.set_result((loop.time(), why)))
        transport = FakeTransport(link)
        link.connection_made(transport)  # type: ignore[arg-type]
        link.data_received(router_hello() + control(LINK_KEY, C.Echo(1, 0)))
        assert (await link.hello).name == "r1"
        await asyncio.sleep(2.5)
        link.data_received(control(LINK_KEY, C.EchoReply(0, 0)))  # heard at 2.5
        at, why = await lost
        assert at == pytest.approx(5.5, abs=0.01)  # dead_after (3 s) after the last read
        assert "silent for 3.0s" in why and link.dead and transport.closed
        echoes = [m for m in transport.messages() if isinstance(m, C.Echo)]
        assert len(echoes) == 6  # at 0, 1, ..., 5: one per liveness_interval
    run_virtual(main())


def failover_parts(**kw: Any) -> tuple[Connection, Failover, list[tuple[float, str, float]]]:
    opts = ClientOptions(addresses=("a:1", "b:2", "c:3"), failover=True, connect_timeout=1.0,
                         failover_timeout=5.0, reconnect_min=0.5, reconnect_max=1.0, **kw)
    flows = FlowTable("app")
    conn = Connection(opts, flows, Reassembler(), Counter())
    delivery = Delivery("app", conn.counters, None, 1.0, asyncio.get_running_loop().time)
    members = Membership(conn, flows, delivery, None)
    failover = Failover(conn, members, delivery)
    tried: list[tuple[float, str, float]] = []
    return conn, failover, tried


def test_failover_gives_up_after_failover_timeout() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        conn, failover, tried = failover_parts()
        hooks: list[object] = []
        conn.on_disconnect = hooks.append

        async def never(addr: str, timeout: float) -> str:
            tried.append((loop.time(), addr, timeout))
            await asyncio.sleep(timeout)
            return f"timed out after {timeout:g}s"

        conn.try_open = never  # type: ignore[method-assign]
        conn.addr_index = 0
        failover.link_lost(SimpleNamespace(router_name="r0", address="a:1"),  # type: ignore
                           "connection reset")
        assert conn.failing_since == 0.0
        await conn.closed_event.wait()
        assert loop.time() == pytest.approx(5.0)
        # rounds start after the lost router; 1 s attempts, then back-off 0.5 s, 1 s
        assert [(t, a) for t, a, _ in tried] == [
            (0.0, "b:2"), (1.0, "c:3"), (2.0, "a:1"), (3.5, "b:2"), (4.5, "c:3")]
        assert tried[-1][2] == pytest.approx(0.5)  # the last attempt gets what is left
        reason = conn.close_reason or ""
        assert reason.startswith("lost router r0 (connection reset) and no router answered "
                                 "for 5s") and "c:3: timed out after 0.5s" in reason
        assert conn.counters["failover.gave-up"] == 1 and failover.count == 0
        assert len(hooks) == 1
    run_virtual(main())


def test_failover_to_the_first_router_that_answers() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        conn, failover, tried = failover_parts()
        events: list[FailoverEvent] = []
        conn.on_failover = events.append

        async def second_round_c(addr: str, timeout: float) -> str | None:
            tried.append((loop.time(), addr, timeout))
            await asyncio.sleep(0.2)
            if addr == "c:3" and loop.time() > 1.0:
                conn.up, conn.router_name, conn.address = True, "r2", addr
                return None
            return "connection refused"

        conn.try_open = second_round_c  # type: ignore[method-assign]
        failover.link_lost(SimpleNamespace(router_name="r0", address="a:1"),  # type: ignore
                           "reset")
        while not events:
            await asyncio.sleep(0.05)
        (event,) = events
        # round 1: b, c, a refused (0.6 s); pause 0.5 s; round 2: b refused, c answers
        assert event.reconnect_ms == pytest.approx(1500.0)
        assert event.attempts == (("b:2", "connection refused"), ("c:3", "connection refused"),
                                  ("a:1", "connection refused"), ("b:2", "connection refused"))
        assert (event.old_router, event.new_router, event.new_address) == ("r0", "r2", "c:3")
        assert conn.addr_index == 2 and conn.failing_since is None and failover.count == 1
        assert failover.last == event and not conn.closed
    run_virtual(main())
