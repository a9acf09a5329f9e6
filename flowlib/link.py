"""One TCP connection to a flow router: the asyncio shell around one
:class:`~flowlib.protocol.ClientProtocol`.

:class:`Link` is an :class:`asyncio.Protocol`: it feeds each read to the protocol with the
loop's time, writes what the protocol has to send, keeps one timer armed at the protocol's
``next_deadline()``, and hands the protocol's events to its owner (the client) through the
two callables it was given. It also keeps the transport's flow control (``drain``). The
handshake's end resolves :attr:`Link.hello`, which :func:`open_link` awaits. Imports
asyncio, socket and flowlib's protocol layer.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from flowrouter.wire import control as C

from .checks import Address, address_text, parse_router_address
from .errors import ConnectionLost
from .events import Event, HandshakeDone, LinkFailed, MessageReceived
from .protocol import ClientProtocol

EventHandler = Callable[["Link", Event], None]
MessageHandler = Callable[[MessageReceived], None]
LostHandler = Callable[["Link", str], None]


def attempt_failure(exc: BaseException, timeout: float, stage: str) -> str:
    """One line saying why a connection attempt failed."""
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout:g}s ({stage})"
    if isinstance(exc, ConnectionLost):
        return exc.reason
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror or exc})"
    if isinstance(exc, OSError):
        # asyncio words a refusal as "Connect call failed (addr)": say what errno says
        return (os.strerror(exc.errno).lower() if exc.errno else str(exc)) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


class Link(asyncio.Protocol):
    """One router connection: bytes to the protocol, its output to the socket, its timer.

    The client makes a new one per connection attempt; a link reports to its owner only
    while the owner still holds it, so a failed attempt or a dead link cannot disturb the
    next.
    """

    def __init__(self, protocol: ClientProtocol, address: str, *, keepalive: bool,
                 on_event: EventHandler, on_lost: LostHandler,
                 on_message: MessageHandler | None = None) -> None:
        self.protocol = protocol
        self.address = address
        self.keepalive = keepalive
        self.on_event = on_event
        #: received messages, the common event, go straight here (default: on_event)
        self.on_message: MessageHandler = on_message or (lambda event: on_event(self, event))
        self.on_lost = on_lost
        self.loop = asyncio.get_running_loop()
        #: the loop's clock, read once per read (asyncio's own loop reads time.monotonic
        #: through a Python method: call that directly; any other loop's clock as it is)
        self._clock: Callable[[], float] = time.monotonic \
            if type(self.loop).time is asyncio.BaseEventLoop.time else self.loop.time
        #: the router's HELLO once the handshake is over
        self.hello: asyncio.Future[C.Hello] = self.loop.create_future()
        self.transport: Any = None
        #: we gave up on this link (protocol error, refusal, silence): stop reading it
        self.dead = False
        #: why this link ended, when we ended it
        self.reason: str | None = None
        #: the transport's write buffer is full
        self.paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    @property
    def router_name(self) -> str:
        hello = self.protocol.hello
        return hello.name if hello is not None else ""

    @property
    def up(self) -> bool:
        return self.protocol.up and not self.dead

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # duck-typed: uvloop's transports are not asyncio.Transport subclasses
        transport: Any = base
        self.transport = transport
        if self.dead:
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.keepalive:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                    for opt, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2),
                                       ("TCP_KEEPCNT", 3)):
                        if hasattr(socket, opt):
                            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
            except OSError:
                pass
        self.pump()

    def data_received(self, data: bytes) -> None:
        if self.dead:
            return
        # a read of data frames only (handed to the protocol's sink) leaves nothing to pump
        if self.protocol.receive_data(data, self._clock()) or self._timer_at is None:
            self.pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._cancel_timer()
        self.paused = False
        self.release_drain_waiters()
        reason = self.reason or (f"{exc}" if exc else f"router {self.router_name or self.address}"
                                                      f" closed the connection")
        self.reason = reason
        self.dead = True
        if not self.hello.done():
            self.hello.set_exception(ConnectionLost(reason))  # a failed attempt
            return
        self.on_lost(self, reason)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.release_drain_waiters()

    # ------------------------------------------------------------------ driving the protocol
    def pump(self) -> None:
        """Act on the protocol's events, write its output, re-arm its timer."""
        protocol = self.protocol
        for event in protocol.events():
            if self.dead:
                continue  # a link we gave up on reports nothing more
            if type(event) is MessageReceived:
                self.on_message(event)
            elif isinstance(event, HandshakeDone):
                if not self.hello.done():
                    self.hello.set_result(event.hello)
            elif isinstance(event, LinkFailed):
                self.fail(event.reason)
            else:
                self.on_event(self, event)
        self.flush()
        if (self._timer_at is None or protocol.deadline_moved) and not self.dead:
            # one timer at the protocol's deadline; a later deadline lets it fire early
            # and be re-armed then
            deadline = protocol.next_deadline()
            if deadline is None:
                if self._timer is None:
                    self._timer_at = math.inf  # asked: nothing is due
            elif self._timer_at is None or deadline < self._timer_at:
                self._cancel_timer()
                self._timer_at = deadline
                self._timer = self.loop.call_at(deadline, self._on_timer)

    def flush(self) -> None:
        """Write what the protocol has to send (dropped once the transport is gone)."""
        out = self.protocol.data_to_send()
        if out and self.transport is not None and not self.dead:
            self.transport.writelines(out)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        if self.dead:
            return
        self.protocol.handle_timer(self.loop.time())
        self.pump()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None

    def fail(self, reason: str) -> None:
        """Give up on this link: say why, wake the handshake's waiter, drop the connection."""
        if self.reason is None:
            self.reason = reason
        self.flush()
        self.dead = True
        self._cancel_timer()
        if not self.hello.done():
            self.hello.set_exception(ConnectionLost(reason))
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close politely: what was written goes out first."""
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.dead = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------------ flow control
    def release_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def drain(self) -> None:
        """Wait while the write buffer is full (returns at once once the link is lost: what
        was buffered went with it)."""
        while self.paused and not self.dead and self.transport is not None:
            waiter: asyncio.Future[None] = self.loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter


#: makes *link*'s connection to (host, port) and calls its ``connection_made`` (TCP by
#: default; :func:`flowlib.dgram.dial_datagram` for datagram links)
Dial = Callable[["Link", str, int], Awaitable[None]]


async def _dial_tcp(link: Link, host: str, port: int) -> None:
    await asyncio.get_running_loop().create_connection(lambda: link, host, port)


async def open_link(addr: Address, protocol: ClientProtocol, timeout: float, *,
                    keepalive: bool, on_event: EventHandler, on_lost: LostHandler,
                    started: Callable[[Link], None],
                    on_message: MessageHandler | None = None,
                    dial: Dial = _dial_tcp, what: str = "TCP connect") -> Link:
    """Connect to one router and complete the handshake, or raise (``ConnectionLost``,
    ``TimeoutError``, ``OSError``); the exception's ``stage`` note says how far it got
    (*what*: the connection's own stage). *started* is told the link before the
    connection is made (the owner holds it from then on)."""
    host, port = parse_router_address(addr)
    link = Link(protocol, address_text(addr), keepalive=keepalive, on_event=on_event,
                on_lost=on_lost, on_message=on_message)
    started(link)
    try:
        async with asyncio.timeout(timeout):
            await dial(link, host, port)
            await link.hello
    except BaseException as exc:
        stage = "no HELLO from it" if link.transport is not None else what
        exc.add_note(f"stage: {stage}")
        link.abort()
        if link.hello.done() and not link.hello.cancelled():
            link.hello.exception()  # retrieved: the caller reports it
        raise
    return link


def failure_stage(exc: BaseException) -> str:
    """How far an attempt of :func:`open_link` got before *exc*."""
    for note in getattr(exc, "__notes__", ()):
        if note.startswith("stage: "):
            return note[7:]
    return "TCP connect"
