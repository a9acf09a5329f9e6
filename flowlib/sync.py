"""The seed's synchronous API (seed 002, Table 4.1) on top of the asyncio client.

``flow_connect`` starts a private event loop in a daemon thread (as the seed's library started
a thread to attach to the router) and every ``flow_*`` call runs the matching coroutine on that
loop and waits for it. So a plain threaded program gets the same behaviour as an asyncio one:
one receive path, the same listeners and errors, and back-pressure on ``flow_send``. All
methods are safe to call from any thread.

Differences from the seed, kept small on purpose: ``flow_create`` returns a new FlowID
instead of taking one (the library owns the local-ID space); ``flow_removelistener`` takes
the queue handle; ``flow_get_blocked`` accepts an optional timeout.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from flowrouter.wire.bands import DEFAULT_DATA_BAND
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import DEFAULT_TTL

from .client import Address, BandsSpec, FlowClient, LocalitySpec, connect
from .errors import ConnectionLost, Empty
from .message import Message
from .queue import DEFAULT_QUEUE_SIZE, Listener, Overflow

T = TypeVar("T")


def _get_now(queue: Listener) -> Message | None:
    try:
        return queue.get_nowait()
    except Empty:
        return None


async def _get_within(queue: Listener, timeout: float | None) -> Message | None:
    if timeout is None:
        return await queue.get()
    try:
        return await asyncio.wait_for(queue.get(), timeout)
    except TimeoutError:
        return None


class SyncFlowClient:
    """A :class:`~flowlib.client.FlowClient` driven from ordinary threads.

    Made by :func:`flow_connect`; close it with :meth:`close` or a ``with`` block, which also
    stops its loop thread.
    """

    def __init__(self, client: FlowClient, loop: asyncio.AbstractEventLoop,
                 thread: threading.Thread) -> None:
        self._client = client
        self._loop = loop
        self._thread = thread
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def client(self) -> FlowClient:
        """The underlying asyncio client (use it only from :attr:`loop`)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def closed(self) -> bool:
        return self._stopped or self._client.closed

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._stopped:
            coro.close()
            raise ConnectionLost("the flow client was closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except BaseException:
            # e.g. KeyboardInterrupt while blocked: do not leave the coroutine running
            fut.cancel()
            raise

    def _run(self, fn: Any, *args: Any) -> Any:
        """Run a plain function on the loop thread (listeners are not thread-safe)."""
        async def call() -> Any:
            return fn(*args)
        return self._call(call())

    # --- seed API ---------------------------------------------------------------------------
    def flow_create(self, lsid: int | None = None) -> FlowID:
        """A new FlowID (never reused on this host), LSID defaulting to the router's."""
        return self._call(self._client.create(lsid))

    def flow_advertise(self, flow: FlowID | str, locality: LocalitySpec = None) -> None:
        """Install the flow's path toward its location service so others can send to it."""
        self._call(self._client.advertise(flow, locality))

    def flow_addlistener(self, flow: FlowID | str, bandmask: BandsSpec = "data",
                         size: int = DEFAULT_QUEUE_SIZE,
                         overflow: str | Overflow = "drop-oldest") -> Listener:
        """Join *flow* on *bandmask* and return the circular queue handle that receives."""
        return self._call(self._client.listen(flow, bandmask, size=size, overflow=overflow))

    def flow_removelistener(self, queue: Listener) -> None:
        """Detach the queue (narrowing or leaving the flow at the router)."""
        self._call(self._client.unlisten(queue))

    def flow_get(self, queue: Listener) -> Message | None:
        """The next queued message, or None if there is none (never blocks).

        Raises :class:`~flowlib.errors.ConnectionLost` / ``ListenerClosed`` once the queue is
        drained after the link or listener ended, so a polling loop does not spin forever.
        """
        result: Message | None = self._run(_get_now, queue)
        return result

    def flow_get_blocked(self, queue: Listener, timeout: float | None = None
                         ) -> Message | None:
        """Wait for the next message; None if *timeout* seconds pass first."""
        return self._call(_get_within(queue, timeout))

    def flow_send(self, flow: FlowID | str, msg: bytes | bytearray | memoryview,
                  band: int = DEFAULT_DATA_BAND, locality: LocalitySpec = None,
                  ttl: int = DEFAULT_TTL) -> None:
        """Send *msg* on *band* of *flow*; blocks while the router link is congested or the
        client fails over to another router. Messages larger than the router's maximum
        payload are fragmented (and reassembled by flowlib receivers)."""
        self._call(self._client.send(flow, msg, band, locality, ttl))

    def flow_flush(self, timeout: float | None = None) -> None:
        """Block until the router has read every message sent before (see
        :meth:`flowlib.FlowClient.flush`)."""
        self._call(self._client.flush(timeout))

    # --- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the client and stop its loop thread (idempotent)."""
        with self._lock:
            if self._stopped:
                return
            try:
                if self._loop.is_running():
                    asyncio.run_coroutine_threadsafe(self._client.close(),
                                                     self._loop).result()
            finally:
                self._stopped = True
                _stop_loop(self._loop, self._thread)

    def __enter__(self) -> SyncFlowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SyncFlowClient {self._client!r}>"


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    if loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():
        thread.join(timeout=10.0)
    if not loop.is_running() and not loop.is_closed():
        loop.close()


def flow_connect(server: str | Sequence[Address], port: int | None = None, *,
                 name: str = "flowlib", timeout: float = 5.0,
                 state_dir: str | os.PathLike[str] | None = None,
                 **kw: Any) -> SyncFlowClient:
    """Connect to a flow router and return a :class:`SyncFlowClient`.

    ``flow_connect("127.0.0.1", 7001)`` as in the seed, or ``flow_connect(["h1:7001",
    "h2:7001"])`` to try several routers in order (and fail over between them). Other
    keyword arguments go to :func:`flowlib.connect`. Raises
    :class:`~flowlib.errors.ConnectError` if none answers.
    """
    if port is not None:
        if not isinstance(server, str):
            raise TypeError("with a port, server must be one host name or address")
        addresses: list[Address] = [(server, port)]
    elif isinstance(server, str):
        addresses = [server]
    else:
        addresses = list(server)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    thread = threading.Thread(target=run, name=f"flowlib-{name}", daemon=True)
    thread.start()
    ready.wait()
    fut = asyncio.run_coroutine_threadsafe(
        connect(addresses, name=name, timeout=timeout, state_dir=state_dir, **kw), loop)
    try:
        client = fut.result()
    except BaseException:
        fut.cancel()
        _stop_loop(loop, thread)
        raise
    return SyncFlowClient(client, loop, thread)


__all__ = ["SyncFlowClient", "flow_connect"]
