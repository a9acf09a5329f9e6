"""The flow client's router connection: which link is current, whether it is up, failing
over or lost for good, and waiting for it.

:class:`Connection` opens links (:func:`flowlib.link.open_link`, each around a fresh
:class:`~flowlib.protocol.ClientProtocol` built over the client's flow table and
reassembler), keeps the current one, and ends the client for good (:meth:`finish`), waking
every waiter. What losing a link means (fail over or finish) is decided by its owner through
the ``on_link_lost`` callable; the protocol's events go to ``on_event``. Part of the asyncio
shell; imports asyncio and flowlib's protocol layer and its two link shells (TCP,
:mod:`flowlib.link`; datagrams, :mod:`flowlib.dgram`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from typing import Any

from .checks import Address, address_text, is_datagram
from .dgram import JOIN_RESEND, open_datagram_link
from .dgram import MAX_PAYLOAD as DATAGRAM_MAX_PAYLOAD
from .errors import ConnectionLost, FailoverInProgress, FlowError
from .events import Event, MessageReceived, MessageSink
from .flowtable import FlowTable
from .fragment import Reassembler
from .handshake import Handshake, make_keyring
from .link import Link, attempt_failure, failure_stage, open_link
from .options import ClientOptions
from .protocol import ClientProtocol

log = logging.getLogger("flowlib")


def call_hook(hook: Callable[[Any], Any] | None, arg: Any, what: str) -> None:
    """Call an application's hook (maybe a coroutine function); its bug must not break
    ours."""
    if hook is None:
        return
    try:
        result = hook(arg)
        if inspect.isawaitable(result):
            asyncio.ensure_future(result)
    except Exception:
        log.exception("%s hook raised", what)


class Connection:
    """The current router link and the client's life cycle."""

    def __init__(self, options: ClientOptions, flows: FlowTable, reassembler: Reassembler,
                 counters: Counter[str]) -> None:
        self.options = options
        self.flows = flows
        self.reassembler = reassembler
        self.counters = counters
        self.keyring, self.key_id = make_keyring(options.link_key)
        #: node ID sent in our HELLO; random per client (endpoints need no stable identity,
        #: the FlowID creator ID is what must be stable and that lives in the state dir)
        self.node_id = secrets.randbits(64) or 1
        self.addresses: list[Address] = list(options.addresses)
        self.addr_index = 0
        #: the protocol's events, and what losing an established link means (set by the
        #: client)
        self.on_event: Callable[[Event], None] = lambda event: None
        #: received messages (the receive path's one call into the client)
        self.on_message: Callable[[MessageReceived], None] = lambda event: None
        #: the messages of one read at once (what most reads bring; given to each protocol)
        self.on_messages: MessageSink = lambda received: None
        self.on_link_lost: Callable[[Link, str], None] = lambda link, reason: None
        #: told when an established link ended, after ``on_link_lost`` (a failover has
        #: started, or the client has finished): what waited on that link in particular
        #: (a flush)
        self.on_link_down: list[Callable[[Link, str], None]] = []
        #: called with (reason, user) when the client ends for good, before the hook
        self.on_finish: list[Callable[[str, bool], None]] = []
        self.link: Link | None = None
        self.up = False  # a link is established (HELLO exchanged)
        self.up_event = asyncio.Event()
        self.gen = 0  # bumped at every established link
        self.closing = False  # close() was called
        self.lost = False  # disconnected for good
        self.close_reason: str | None = None
        self.closed_event = asyncio.Event()
        #: loop time the current failover began (None when not failing over)
        self.failing_since: float | None = None
        self.rtt: float | None = None
        #: the application's hooks (FlowClient.on_disconnect / on_failover may be set later)
        self.on_disconnect = options.on_disconnect
        self.on_failover = options.on_failover
        self._next_req = 1
        # filled in from the router's HELLO
        self.address = ""
        self.router_name = ""
        self.router_node_id = 0
        self.max_payload = 0
        self.default_lsid = 0

    # ------------------------------------------------------------------ opening
    def new_protocol(self, address: str, datagram: bool = False) -> ClientProtocol:
        o = self.options
        cap = DATAGRAM_MAX_PAYLOAD if datagram else None
        hs = Handshake(name=o.name, node_id=self.node_id,
                       max_payload=o.max_payload if cap is None else min(cap, o.max_payload),
                       credentials=o.credentials, keyring=self.keyring, key_id=self.key_id,
                       encrypt=o.encrypt, datagram=datagram)
        return ClientProtocol(hs, self.flows, self.reassembler, payload_cap=cap,
                              join_resend=JOIN_RESEND if datagram else None,
                              now=asyncio.get_running_loop().time(),
                              liveness_interval=o.liveness_interval, dead_after=o.dead_after,
                              refresh_interval=o.refresh_interval, counters=self.counters,
                              rtt=self.rtt, address=address, first_request=self._next_req,
                              sink=self.on_messages)

    async def open(self, addr: Address, timeout: float) -> None:
        """Connect and handshake with one router (over TCP, or a datagram link for a
        ``udp://`` address), or raise."""
        datagram = is_datagram(addr)
        protocol = self.new_protocol(address_text(addr), datagram)
        opener = open_datagram_link if datagram else open_link
        attempt: list[Link] = []

        def started(link: Link) -> None:
            attempt.append(link)
            self.link = link

        try:
            link = await opener(addr, protocol, timeout, keepalive=self.options.failover,
                                   on_event=self._link_event, on_lost=self._link_lost,
                                   started=started, on_message=self.on_message)
            if link.dead:  # lost right after its HELLO
                raise ConnectionLost(link.reason or f"router {link.router_name} closed the "
                                                    f"connection during the handshake")
        except BaseException:
            if attempt and self.link is attempt[0]:
                self.link = None
            raise
        hello = link.protocol.hello
        assert hello is not None
        self.address = link.address
        self.router_name = hello.name
        self.router_node_id = hello.node_id
        self.max_payload = link.protocol.max_payload  # within what the link carries
        self.default_lsid = hello.default_lsid
        self.up = True
        self.gen += 1
        self.up_event.set()
        log.info("connected to flow router %r at %s (max payload %d, default LSID %#x)",
                 hello.name, self.address, hello.max_payload, hello.default_lsid)

    async def try_open(self, addr: Address, timeout: float) -> str | None:
        """:meth:`open`, returning None on success or why it failed."""
        try:
            await self.open(addr, timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return attempt_failure(exc, timeout, failure_stage(exc))
        return None

    # ------------------------------------------------------------------ the link's reports
    def _link_event(self, link: Link, event: Event) -> None:
        if link is self.link:
            self.on_event(event)

    def _link_lost(self, link: Link, reason: str) -> None:
        if link is not self.link:
            return  # an abandoned attempt, or a link we already replaced
        self.link = None
        self.rtt = link.protocol.liveness.rtt
        self._next_req = link.protocol.next_request
        if not self.up:
            return
        self.up = False
        self.up_event.clear()
        self.flows.link_lost()
        self.on_link_lost(link, reason)
        for hook in self.on_link_down:
            hook(link, reason)

    def finish(self, reason: str, user: bool) -> None:
        """The client is disconnected for good: wake and fail everything that waits."""
        if self.lost:
            return
        self.lost = True
        self.up = False
        self.close_reason = reason
        self.failing_since = None
        for release in self.on_finish:
            release(reason, user)
        self.up_event.set()  # wakes senders waiting out a failover: they see the end
        self.closed_event.set()
        if not user:
            log.warning("lost the flow router %s: %s", self.address, reason)
        call_hook(self.on_disconnect, None if user else ConnectionLost(reason),
                  "on_disconnect")

    # ------------------------------------------------------------------ state
    @property
    def closed(self) -> bool:
        return self.lost or self.closing

    def check_open(self, hint: str = "send() waits for the next router; send_nowait() "
                                      "does not") -> Link:
        """The current link, or raise (for calls that never wait; *hint* ends the
        failover's message)."""
        if self.lost or self.closing:
            raise ConnectionLost(self.close_reason or "the client was closed")
        link = self.link
        if not self.up or link is None:
            raise self.failover_error(hint)
        return link

    def failover_error(self, hint: str = "") -> FailoverInProgress:
        since = 0.0
        if self.failing_since is not None:
            since = asyncio.get_running_loop().time() - self.failing_since
        return FailoverInProgress(self.router_name or self.address, since, hint)

    async def ready(self, timeout: float | None) -> Link:
        """The current link once one is up: at once, or after a failover (at most *timeout*
        seconds; None waits as long as the failover goes on)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self.lost or self.closing:
                raise ConnectionLost(self.close_reason or "the client was closed")
            if self.up and self.link is not None:
                return self.link
            if self.failing_since is None:
                raise ConnectionLost("the client is not connected")
            # (again after a wake-up: the new link may have been lost before we ran)
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                await asyncio.wait_for(self.up_event.wait(), left)
            except TimeoutError:
                raise self.failover_error(f"still not connected after waiting {timeout:g}s"
                                          ) from None

    def stopped(self) -> FlowError:
        return ConnectionLost(self.close_reason or "the client was closed")
