"""Listener: a bounded, circular receive queue attached to some bands of one flow.

The seed's queues are circular: when the application falls behind, the queue keeps the most
recent window and forgets the oldest messages, because for live data (video, telemetry, chat
presence) fresh beats complete. Some consumers prefer the opposite (keep what was queued first,
refuse the newest), so the policy is a choice. Either way every discarded message is counted in
:attr:`Listener.dropped`: drops are never silent. The client also reports them with a
rate-limited notice on the overflow band (band 18) to the listeners of the flow that listen to
it (see :mod:`flowlib.notices`).

A listener lives on its client's event loop and is not thread-safe; the synchronous facade
(:mod:`flowlib.sync`) reaches it through the loop.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable

from flowrouter.wire.bands import BandMask
from flowrouter.wire.flowid import FlowID

from .errors import Empty, FlowError, ListenerClosed
from .message import Message
from .notices import NoticeLimiter


class Overflow(enum.StrEnum):
    """What a full listener does with a new message."""

    DROP_OLDEST = "drop-oldest"  #: circular: keep the most recent window (the default)
    DROP_NEWEST = "drop-newest"  #: keep the queued messages, discard the arriving one

    @classmethod
    def parse(cls, value: str | Overflow) -> Overflow:
        if isinstance(value, Overflow):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(f"unknown overflow policy {value!r}; use "
                             + " or ".join(repr(m.value) for m in cls)) from None


DEFAULT_QUEUE_SIZE = 1024


class Listener:
    """A receive queue for the bands ``mask`` of ``flow``; made by ``FlowClient.listen``.

    Read with ``await get()``, ``get_nowait()`` or ``async for msg in listener``. The loop ends
    once the listener is removed (``unlisten``) or its client closed and the queue is drained;
    if the connection to the router is lost for good it raises
    :class:`~flowlib.errors.ConnectionLost` instead, because an application usually has to act
    on that (reconnect, alert) rather than quietly stop. A failover to another router is not
    a loss: readers keep waiting and the listener keeps receiving once the client re-joined.
    """

    __slots__ = ("flow", "name", "bits", "size", "overflow", "dropped", "received", "_items",
                 "_getters", "_error", "notices", "__weakref__")

    def __init__(self, flow: FlowID, mask: int, size: int = DEFAULT_QUEUE_SIZE,
                 overflow: str | Overflow = Overflow.DROP_OLDEST, name: str = "") -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"listener size must be a positive integer, got {size!r}")
        self.flow = flow
        #: how overflow notices name this listener (``listen(name=...)``, else numbered)
        self.name = name
        #: the bands as a bit mask (bit n: band n)
        self.bits = mask
        self.size = size
        self.overflow = Overflow.parse(overflow)
        #: messages discarded because the queue was full (either policy)
        self.dropped = 0
        #: messages that arrived for this listener (queued or dropped)
        self.received = 0
        self._items: deque[Message] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        #: set once closed: builds the error a reader gets after draining the queue
        self._error: Callable[[], FlowError] | None = None
        #: rate limiter of this listener's overflow notices (made at its first drop)
        self.notices: NoticeLimiter | None = None

    # --- properties -------------------------------------------------------------------------
    @property
    def mask(self) -> BandMask:
        """The bands this listener receives."""
        return BandMask(self.bits)

    @property
    def closed(self) -> bool:
        """True once the listener was removed or its connection ended (it may still hold
        queued messages, which can be read)."""
        return self._error is not None

    def qsize(self) -> int:
        return len(self._items)

    __len__ = qsize

    def empty(self) -> bool:
        return not self._items

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        name = f" {self.name}" if self.name else ""
        return (f"<Listener{name} {self.flow} bands={self.mask} {len(self._items)}/{self.size} "
                f"dropped={self.dropped} {state}>")

    # --- reading -----------------------------------------------------------------------------
    def get_nowait(self) -> Message:
        """Return the oldest queued message; raise :class:`Empty` if there is none.

        After the listener is closed and drained this raises the closing error instead
        (:class:`ListenerClosed` or :class:`ConnectionLost`), so a polling loop notices.
        """
        if self._items:
            return self._items.popleft()
        if self._error is not None:
            raise self._error()
        raise Empty(f"no message queued on {self.flow} bands {self.mask}")

    async def get(self) -> Message:
        """Wait for the next message.

        Cancelling a waiting ``get()`` (e.g. by ``asyncio.wait_for``) never loses a message:
        the queue hands out a message only to a reader that is still running.
        """
        while not self._items:
            if self._error is not None:
                raise self._error()
            getter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass
                if self._items and not getter.cancelled():
                    self._wake_one()
                raise
        return self._items.popleft()

    def __aiter__(self) -> Listener:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.get()
        except ListenerClosed:
            raise StopAsyncIteration from None

    # --- feeding (the client's receive path) ------------------------------------------------
    def feed(self, msg: Message) -> bool:
        """Queue *msg*; return True if a message was dropped to make room (or *msg* itself),
        so the client can send an overflow notice."""
        if self._error is not None:
            return False
        self.received += 1
        items = self._items
        dropped = False
        if len(items) >= self.size:
            self.dropped += 1
            if self.overflow is Overflow.DROP_NEWEST:
                return True
            items.popleft()
            dropped = True
        items.append(msg)
        if self._getters:
            self._wake_one()
        return dropped

    def _wake_one(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def end(self, error: Callable[[], FlowError] | None = None) -> None:
        """Stop accepting messages and wake every waiting reader.

        *error* builds the exception readers get once the queue is drained (a fresh instance
        each time, so tracebacks do not pile up); by default :class:`ListenerClosed`.
        """
        if self._error is not None:
            return
        flow = self.flow
        self._error = error or (lambda: ListenerClosed(f"listener on {flow} was removed"))
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)


__all__ = ["Listener", "Overflow", "DEFAULT_QUEUE_SIZE"]
