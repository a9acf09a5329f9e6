"""A burst of control messages past an application's budget waits for the next tick, on
either forwarding path.

A router handles ``control_per_tick`` control messages of one application a tick; the first
one past that is dropped (and trips the work budget), and the link is not read again until
the next tick, so that the rest wait in the router's input (and the socket pushes back)
instead of being read, decoded and dropped. The fast path held them so on a plain link.
Without it (``FLOWNET_NATIVE=0``), and on a sealed link with it, the router once went on
through the rest of the read and dropped every one: 40 JOINs at a budget of 4 got 4 answers
and 36 drops, and a 200,000-JOIN flood cost the loop 60-100 ms a read where the plain fast
path's cost 30.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import flowlib
from flowrouter.net.config import NodeConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import pack_header

from .rawep import RawEndpoint, addr, run, until

JOINS = 40
BUDGET = 4
KEY = bytes(range(32))
ENGINES = pytest.mark.parametrize("native", ["0", ""], ids=["python-core", "fast-path"])


@contextlib.asynccontextmanager
async def _router(**extra: Any) -> AsyncIterator[RouterNode]:
    """A started router whose applications have BUDGET control messages a tick."""
    node = RouterNode(NodeConfig("r", listen="127.0.0.1:0", http="off",
                                 core_lsids=frozenset({0x10}), default_lsid=0x10,
                                 limits={"control_per_tick": BUDGET}, **extra))
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


def _burst() -> bytes:
    """JOINS joins of flows nobody else has, request ids 1..JOINS, as one write."""
    out = b""
    for i in range(JOINS):
        body = C.Join(i + 1, 1 << 32).encode()
        out += pack_header(FlowID(0xF10D, 0x10, i).key, len(body), 0) + body
    return out


@ENGINES
def test_a_burst_past_the_control_budget_waits_for_the_next_tick(
        native: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWNET_NATIVE", native)

    async def main() -> None:
        async with _router() as node:
            assert (node.fast is None) == (native == "0")
            ep = await RawEndpoint.connect(node)
            ep.send_raw(_burst())  # one write: the router reads it whole
            acks: set[int] = set()
            counters = node.core.counters

            def settled() -> bool:
                while not ep.frames.empty():
                    hdr, payload = ep.frames.get_nowait()
                    if hdr.band == 0:
                        msg = C.decode(payload)
                        if isinstance(msg, C.JoinAck) and msg.status is C.JoinStatus.OK:
                            acks.add(msg.req_id)
                return len(acks) + counters["drop.control-budget"] >= JOINS

            await until(settled, 60, "every JOIN answered or dropped")
            dropped = counters["drop.control-budget"]
            # a tick takes BUDGET and drops the one that trips it: about JOINS / 5 dropped
            # (a release that comes before the tick drops one more); never all but BUDGET
            assert len(acks) >= JOINS // 2, (len(acks), dropped)
            assert len(acks) + dropped == JOINS
            assert counters["work.budget-tripped"] >= 2  # tripped again at later ticks
            await ep.close()

    run(main(), 90)


@ENGINES
def test_a_sealed_links_burst_waits_for_the_next_tick_too(
        native: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLOWNET_NATIVE", native)

    async def main() -> None:
        async with _router(link_keys={"app": KEY}) as node:
            client = await flowlib.connect([addr(node)], name="busy", state_dir=str(tmp_path),
                                           link_key=("app", KEY), encrypt=True)
            assert client.encrypted
            counters = node.core.counters
            joins = [asyncio.ensure_future(client.listen(FlowID(0xF10D, 0x10, i), 32))
                     for i in range(JOINS)]
            await until(lambda: counters["control.join"] + counters["drop.control-budget"]
                        >= JOINS, 60, "every JOIN handled or dropped")
            joined, dropped = counters["control.join"], counters["drop.control-budget"]
            assert joined >= JOINS // 2, (joined, dropped)
            assert counters["work.budget-tripped"] >= 2
            for j in joins:
                j.cancel()
            await asyncio.gather(*joins, return_exceptions=True)
            await client.close()

    run(main(), 90)


@ENGINES
def test_frames_held_when_the_link_breaks_are_counted_not_called_truncated(
        native: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The application resets its connection while the router holds the rest of its burst:
    those frames were read and never handled, and are counted so (``drop.unread-at-close``),
    where they once made a "truncated frame" (``malformed.truncated``) of whole frames."""
    monkeypatch.setenv("FLOWNET_NATIVE", native)

    async def main() -> None:
        async with _router() as node:
            ep = await RawEndpoint.connect(node)
            counters = node.core.counters
            ep.send_raw(_burst())
            await until(lambda: counters["drop.control-budget"] >= 1, 20, "the budget trips")
            sock = ep.writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await ep.close()  # a reset: the router learns of it at its next read or write
            await until(lambda: not node.core.links, 20, "the link closed")
            unread = counters["drop.unread-at-close"]
            assert unread > 0
            assert counters["malformed.truncated"] == 0
            # every frame of the burst is accounted for: handled, dropped, or unread
            handled = counters["control.join"] + counters["drop.control-budget"]
            assert handled + unread == JOINS, (handled, unread)

    run(main(), 90)


@ENGINES
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_data_behind_a_held_burst_arrives_whole_and_in_order(
        native: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data frames mixed into a burst of JOINs past the budget wait with the JOINs and then
    reach the flow's member, every one and in the order sent (the budget drops control
    messages only), in writes cut at random places."""
    monkeypatch.setenv("FLOWNET_NATIVE", native)
    rng = random.Random(seed)
    flow = FlowID(0xDA7A, 0x10, 1)

    async def main() -> None:
        async with _router() as node:
            member = await RawEndpoint.connect(node, "member")
            assert (await member.join(flow, 1 << 32)).status is C.JoinStatus.OK
            sender = await RawEndpoint.connect(node, "sender")
            stream, joins, sent = b"", 0, 0
            for _ in range(60):
                if rng.random() < 0.4:
                    joins += 1
                    body = C.Join(joins, 1 << 32).encode()
                    stream += pack_header(FlowID(0xF10D, 0x10, joins).key, len(body),
                                          0) + body
                else:
                    payload = sent.to_bytes(4, "big") * rng.randint(1, 64)
                    stream += pack_header(flow.key, len(payload), 32) + payload
                    sent += 1
            cuts = sorted(rng.sample(range(1, len(stream)), 5))
            for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
                sender.send_raw(stream[a:b])
                await sender.writer.drain()
            got = [int.from_bytes(p[:4], "big") for _, p in await member.data(sent, 30)]
            assert got == list(range(sent))
            counters = node.core.counters
            await until(lambda: counters["control.join"] + counters["drop.control-budget"]
                        >= joins + 1, 20, "every JOIN handled or dropped")
            assert counters["work.budget-tripped"] >= 1
            await sender.close()
            await member.close()

    run(main(), 90)
