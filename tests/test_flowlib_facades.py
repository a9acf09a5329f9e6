"""flowlib's other faces against real routers over loopback: a listener's circular queue,
the synchronous facade (a plain threaded program), the public exports, the ``flowcat``
shell tool and the options every entry point takes. The asyncio client itself is tested
in test_flowlib.py and test_flowlib_faults.py; the router chain these tests borrow is in
flowlibnet.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable
from typing import TypeVar

import pytest

import flowlib
from flowlib import (
    ConnectError,
    ConnectionLost,
    Empty,
    FlowID,
    ListenerClosed,
    Locality,
    Message,
    MessageTooLarge,
)
from flowlib.queue import Listener
from flowrouter.net.runtime import RouterNode

from .flowlibnet import LSID, chain
from .ports import free_port
from .rawep import addr, get, run

T = TypeVar("T")


# ================================================================== the circular queue
def _msg(i: int) -> Message:
    return Message(FlowID(1, LSID, 1), 32, str(i).encode())


def test_queue_overflow_policies_unit() -> None:
    oldest = Listener(FlowID(1, LSID, 1), 1 << 32, size=3)
    newest = Listener(FlowID(1, LSID, 1), 1 << 32, size=3, overflow="drop-newest")
    for i in range(10):
        oldest.feed(_msg(i))
        newest.feed(_msg(i))
    assert [oldest.get_nowait().payload for _ in range(3)] == [b"7", b"8", b"9"]
    assert [newest.get_nowait().payload for _ in range(3)] == [b"0", b"1", b"2"]
    assert oldest.dropped == newest.dropped == 7
    assert oldest.received == newest.received == 10
    with pytest.raises(Empty):
        oldest.get_nowait()


def test_queue_get_wakes_and_cancel_loses_nothing() -> None:
    async def main() -> None:
        lst = Listener(FlowID(1, LSID, 1), 1 << 32, size=4)
        waiter = asyncio.ensure_future(lst.get())
        lst.feed(_msg(1))
        assert (await asyncio.wait_for(waiter, 1)).payload == b"1"
        # a timed-out get() must not swallow a message
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(lst.get(), 0.01)
        lst.feed(_msg(2))
        assert lst.get_nowait().payload == b"2"
        # closing drains first, then ends iteration
        lst.feed(_msg(3))
        lst.end()
        assert [m.payload async for m in lst] == [b"3"]
        with pytest.raises(ListenerClosed):
            lst.get_nowait()
    run(main())


@pytest.mark.parametrize("policy,expected", [("drop-oldest", [7, 8, 9]),
                                             ("drop-newest", [0, 1, 2])])
def test_queue_overflow_end_to_end(policy: str, expected: list[int]) -> None:
    async def main() -> None:
        async with chain(1) as (r0,):
            async with (await flowlib.connect(addr(r0), name="rx") as rx,
                        await flowlib.connect(addr(r0), name="tx") as tx):
                flow = await tx.create()
                small = await rx.listen(flow, [32], size=3, overflow=policy)
                witness = await rx.listen(flow, [32], size=100)
                for i in range(10):
                    tx.send_nowait(flow, str(i).encode())
                for _ in range(10):  # all ten have reached the client
                    await get(witness)
                got = [int(small.get_nowait().payload) for _ in range(len(small))]
                assert got == expected and small.dropped == 7
    run(main())


# ================================================================== synchronous facade
class RouterThread:
    """Routers on their own loop thread, so a plain (threaded) program can use them."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.nodes: list[RouterNode] = []
        self._chain: contextlib.AbstractAsyncContextManager[list[RouterNode]] | None = None

    def call(self, coro: Awaitable[T]) -> T:
        async def wrap() -> T:
            return await coro
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(wrap(), 20),
                                                self.loop).result()

    def __enter__(self) -> list[RouterNode]:
        self.thread.start()
        self._chain = chain(2)
        self.nodes = self.call(self._chain.__aenter__())
        return self.nodes

    def __exit__(self, *exc: object) -> None:
        assert self._chain is not None
        self.call(self._chain.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_sync_facade_end_to_end() -> None:
    with RouterThread() as (r0, r1):
        host, port = r1.tcp_address
        with flowlib.flow_connect(host, port, name="sync-rx") as rx, \
                flowlib.flow_connect([addr(r0)], name="sync-tx") as tx:
            flow = tx.flow_create()
            assert flow.lsid == LSID
            tx.flow_advertise(flow)
            q = rx.flow_addlistener(flow, [32, 33], size=8)
            assert rx.flow_get(q) is None
            tx.flow_send(flow, b"one")
            tx.flow_send(flow, b"two", band=33, locality=(Locality.GEOGRAPHY, 9), ttl=5)
            tx.flow_send(flow, b"not for q", band=34)
            tx.flow_flush(timeout=5)  # r0 has read all three
            first = rx.flow_get_blocked(q, timeout=5)
            second = rx.flow_get_blocked(q, timeout=5)
            assert first is not None and second is not None
            assert (first.payload, first.band) == (b"one", 32)
            assert (second.payload, second.band, second.ttl) == (b"two", 33, 3)
            assert rx.flow_get_blocked(q, timeout=0.05) is None
            with pytest.raises(ValueError):
                tx.flow_send(flow, b"x", band=3)
            with pytest.raises(MessageTooLarge):  # past max_message_size (larger than
                tx.flow_send(flow, bytes(tx.client.max_message_size + 1))  # a frame: fragmented)
            rx.flow_removelistener(q)
            with pytest.raises(ListenerClosed):
                rx.flow_get(q)
        assert rx.closed and tx.closed
        with pytest.raises(ConnectionLost):
            tx.flow_send(flow, b"after close")
        rx.close()  # idempotent


def test_sync_connect_error() -> None:
    with pytest.raises(ConnectError, match="refused"):
        flowlib.flow_connect("127.0.0.1", free_port(), timeout=2)


def test_sync_blocked_get_sees_connection_loss() -> None:
    router = RouterThread()
    with router as (r0, r1):
        with flowlib.flow_connect(addr(r1), name="rx") as rx:
            flow = rx.flow_create()
            q = rx.flow_addlistener(flow)
            router.call(r1.stop())
            with pytest.raises(ConnectionLost):
                rx.flow_get_blocked(q, timeout=5)
            with pytest.raises(ConnectionLost):
                rx.flow_get(q)


def test_public_api_exports() -> None:
    for name in flowlib.__all__:
        assert hasattr(flowlib, name), name
    assert issubclass(flowlib.FlowTimeout, TimeoutError)
    assert all(issubclass(getattr(flowlib, n), flowlib.FlowError) for n in
               ("ConnectError", "JoinRefused", "FlowTimeout", "MessageTooLarge",
                "ConnectionLost", "Empty", "ListenerClosed"))


def test_flowcat_create_send_listen(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The shell tool from the README quick start, against a real router."""
    from flowlib.cli import main as flowcat
    from flowrouter.net.config import NodeConfig
    from flowrouter.net.runtime import RouterNode

    monkeypatch.setenv("FLOWNET_STATE_DIR", str(tmp_path))

    async def scenario() -> None:
        node = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", core_lsids=frozenset({0x10}),
                                     default_lsid=0x10))
        await node.start()
        try:
            router = "%s:%d" % node.tcp_address
            assert await asyncio.to_thread(flowcat, ["create", "--router", router]) == 0
            flow = capsys.readouterr().out.strip()
            assert flow.endswith(":00000010:00000001")
            listener = asyncio.ensure_future(asyncio.to_thread(
                flowcat, ["listen", "--router", router, "--bands", "40", "--count", "1",
                          "--timeout", "20", "--json", flow]))
            while not node.core.flows:  # the listener's join has reached the router
                await asyncio.sleep(0.01)
            assert await asyncio.to_thread(
                flowcat, ["send", "-r", router, "--band", "40", flow, "hi there"]) == 0
            assert await asyncio.wait_for(listener, 30) == 0
            out = capsys.readouterr().out
            assert '"payload": "hi there"' in out and '"band": 40' in out
            rc = await asyncio.to_thread(flowcat, ["send", "-r", router, "--band", "3", flow, "x"])
            assert rc == 1 and "band" in capsys.readouterr().err
        finally:
            await node.stop()
    asyncio.run(asyncio.wait_for(scenario(), 60))


# ================================================================== options
def test_options_are_one_dataclass_built_from_the_same_keywords() -> None:
    """FlowClient and connect take ClientOptions or its fields as keywords; a wrong value or
    an unknown keyword is refused before anything connects."""
    opts = flowlib.ClientOptions(name="app", dead_after=9.0, addresses=["127.0.0.1:1"])
    assert opts.addresses == ("127.0.0.1:1",)
    client = flowlib.FlowClient(opts, request_timeout=2.0)
    assert (client.name, client.dead_after, client.request_timeout) == ("app", 9.0, 2.0)
    assert client.addresses == ["127.0.0.1:1"] and not client.failover
    with pytest.raises(TypeError, match="no_such_option"):
        flowlib.FlowClient(no_such_option=1)
    with pytest.raises(ValueError, match="dead_after must be longer"):
        flowlib.ClientOptions(liveness_interval=2.0, dead_after=1.0)
    with pytest.raises(ValueError, match="needs a link_key"):
        run(flowlib.connect("127.0.0.1:1", encrypt=True))
    with pytest.raises(TypeError, match="no_such_option"):
        run(flowlib.connect("127.0.0.1:1", no_such_option=1))


def test_connect_takes_options_too() -> None:
    async def main() -> None:
        async with chain(1) as (r1,):
            opts = flowlib.ClientOptions(name="from-options", request_timeout=3.0)
            async with await flowlib.connect(addr(r1), options=opts) as c:
                assert c.name == "from-options" and c.request_timeout == 3.0
                assert c.options.connect_timeout == 5.0 and c.connected
    run(main())
