"""The asyncio flow client: a link to a flow router, TCP or UDP (failing over to another
router when that one dies), flows joined and sent to over it.

:class:`FlowClient` is the asyncio shell around the sans-I/O client protocol
(:mod:`flowlib.protocol`); it composes small parts, each an object of its own:

=============================  ==============================================================
:mod:`flowlib.options`         :class:`ClientOptions`, every keyword a client takes, checked
:mod:`flowlib.connection`      the current router link and the client's life cycle
:mod:`flowlib.link`            one router link: feeds the protocol, writes its output,
                               keeps its timer (over TCP, or :mod:`flowlib.dgram` over UDP)
:mod:`flowlib.membership`      create, listen, advertise: JOIN/LEAVE requests and their acks
:mod:`flowlib.delivery`        listeners, and local notices (overflow, drops, failovers)
:mod:`flowlib.failover`        the next router after a loss, replaying the flow table there
:mod:`flowlib.sending`         ``send``/``send_nowait``, back-pressure, paced fragments
=============================  ==============================================================

Below them the protocol owns its parts (the routers' stream codec,
:mod:`flowrouter.wire.streamcodec`; :mod:`flowlib.handshake`; :mod:`flowlib.liveness`) and
is given the two that outlive a link (:mod:`flowlib.flowtable`, the reassembler of
:mod:`flowlib.fragment`).

:func:`connect` tries the given router addresses in order and raises
:class:`~flowlib.errors.ConnectError` naming every address and what each one answered when
none completes the handshake.

Imports asyncio and flowlib's shell parts.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

from flowrouter.wire.bands import BAND_APP_MEMBERSHIP, BAND_FAULT, DEFAULT_DATA_BAND
from flowrouter.wire.control import Fault
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import DEFAULT_TTL

from .checks import (
    Address,
    BandsSpec,
    LocalitySpec,
    address_text,
    check_identity,
    listen_mask,
    parse_router_address,
)
from .connection import Connection, call_hook, log
from .credentials import load_capability
from .delivery import Delivery
from .errors import ConnectError
from .events import EchoAnswered, Event, JoinAnswered, MessageDropped, RejoinNeeded, RouterFault
from .failover import Failover, FailoverEvent
from .flowtable import FlowTable
from .fragment import Reassembler
from .members import MemberWatch
from .membership import Membership
from .notices import NoticeLimiter
from .options import (
    DEFAULT_FAILOVER_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    ClientOptions,
    DisconnectHook,
    FailoverHook,
    RouterFaultHook,
)
from .queue import DEFAULT_QUEUE_SIZE, Listener, Overflow
from .sending import Payload, Sender


class FlowClient:
    """A connection to the flow overlay through one router at a time. Make one with
    :func:`connect`.

    Takes a :class:`~flowlib.options.ClientOptions` or its fields as keywords (the same
    keywords as :func:`connect`, with ``addresses`` and ``connect_timeout``). Use it as an
    async context manager (``async with client:``) or call :meth:`close`. All methods must be
    called from the event loop the client was connected on.
    """

    def __init__(self, options: ClientOptions | None = None, **keywords: Any) -> None:
        o = self.options = ClientOptions.build(options, **keywords)
        self.name = o.name
        self.request_timeout = o.request_timeout
        self.connect_timeout = o.connect_timeout
        self.failover_timeout = o.failover_timeout
        self.failover_send_timeout = o.failover_send_timeout
        self.reconnect_min = o.reconnect_min
        self.reconnect_max = max(o.reconnect_max, o.reconnect_min)
        self.max_message_size = o.max_message_size
        self.fragment_size = o.fragment_size
        self.liveness_interval = o.liveness_interval
        self.dead_after = o.dead_after
        self.refresh_interval = o.refresh_interval
        #: counters of things worth seeing that are not errors (unwanted frames, ...)
        self.counters: Counter[str] = Counter()
        #: capabilities presented by default with the joins of the flows they cover
        self.capabilities = [load_capability(c) for c in o.capabilities]
        self._flows = FlowTable(o.name, self.capabilities)
        self._reassembler = Reassembler(o.max_message_size, o.max_reassembly_bytes,
                                        o.reassembly_timeout)
        self._conn = Connection(o, self._flows, self._reassembler, self.counters)
        self._delivery = Delivery(o.name, self.counters, o.overflow_notice_every,
                                  o.overflow_notice_interval,
                                  lambda: asyncio.get_running_loop().time())
        self._members = Membership(self._conn, self._flows, self._delivery, o.state_dir)
        self._failover = Failover(self._conn, self._members, self._delivery)
        self._sender = Sender(self._conn)
        #: called with each fault the router reports about this client's link (a
        #: :class:`~flowlib.Fault`, e.g. kind ``LIMIT`` with ``extra["limit"]`` =
        #: ``"work-budget"``: it held back or dropped some of our requests)
        self.on_router_fault: RouterFaultHook | None = o.on_router_fault
        #: the last such fault, and how many came
        self.last_router_fault: Fault | None = None
        self.router_faults = 0
        self._conn.on_event = self._on_event
        self._conn.on_message = self._delivery.deliver
        self._conn.on_messages = self._delivery.deliver_all
        self.node_id = self._conn.node_id

    def _on_event(self, event: Event) -> None:
        """The current link's protocol events (the link handles the handshake's and
        failures itself, and hands received messages to the delivery directly)."""
        if isinstance(event, JoinAnswered):
            self._members.on_join_answered(event)
        elif isinstance(event, MessageDropped):
            fe = self._flows.get(event.key)
            if fe is not None:
                self._delivery.dropped(event, fe)
        elif isinstance(event, RejoinNeeded):
            self._members.rejoin(event.key)
        elif isinstance(event, RouterFault):
            self._router_fault(event.fault)
        elif isinstance(event, EchoAnswered):
            self._sender.on_echo_answered(event.seq)

    def _router_fault(self, fault: Fault) -> None:
        """The router's fault about our link: logged, kept, given to ``on_router_fault``
        and, as a message on the fault band, to every listener whose mask has that band."""
        self.router_faults += 1
        self.last_router_fault = fault
        log.warning("router %s reports a fault about this link: %s: %s",
                    self.router_name, fault.kind.name, fault.detail)
        self._delivery.link_notice(BAND_FAULT, fault)
        call_hook(self.on_router_fault, fault, "on_router_fault")

    # ------------------------------------------------------------------ state
    @property
    def on_disconnect(self) -> DisconnectHook | None:
        """Called once when the client is disconnected for good: with
        :class:`~flowlib.errors.ConnectionLost`, or None after :meth:`close`."""
        return self._conn.on_disconnect

    @on_disconnect.setter
    def on_disconnect(self, hook: DisconnectHook | None) -> None:
        self._conn.on_disconnect = hook

    @property
    def on_failover(self) -> FailoverHook | None:
        """Called after each successful failover with a :class:`FailoverEvent`."""
        return self._conn.on_failover

    @on_failover.setter
    def on_failover(self, hook: FailoverHook | None) -> None:
        self._conn.on_failover = hook

    @property
    def address(self) -> str:
        """The current (or last) router's address."""
        return self._conn.address

    @property
    def router_name(self) -> str:
        return self._conn.router_name

    @property
    def router_node_id(self) -> int:
        return self._conn.router_node_id

    @property
    def max_payload(self) -> int:
        """The router's largest payload (from its HELLO)."""
        return self._conn.max_payload

    @property
    def default_lsid(self) -> int:
        """The LSID the router suggests for new flows (from its HELLO)."""
        return self._conn.default_lsid

    @property
    def closed(self) -> bool:
        """True once the client is disconnected for good (lost or closed)."""
        return self._conn.closed

    @property
    def connected(self) -> bool:
        """True while a router link is up (False during a failover and once closed)."""
        return self._conn.up and not self._conn.closing

    @property
    def failing_over(self) -> bool:
        """True while the client looks for a new router after losing one."""
        return self._conn.failing_since is not None and not self.closed

    @property
    def failover(self) -> bool:
        """Whether losing the router makes this client look for another."""
        return self._failover.enabled

    @property
    def failovers(self) -> int:
        """Completed failovers."""
        return self._failover.count

    @property
    def last_failover(self) -> FailoverEvent | None:
        return self._failover.last

    @property
    def addresses(self) -> list[str]:
        """The routers this client may use, in order."""
        return [address_text(a) for a in self._conn.addresses]

    @property
    def close_reason(self) -> str | None:
        """Why the client was disconnected (None while it is usable)."""
        return self._conn.close_reason if self.closed else None

    @property
    def rtt(self) -> float | None:
        """Smoothed round trip of our echoes to the router (seconds; None before the
        first)."""
        link = self._conn.link
        return link.protocol.liveness.rtt if link is not None else self._conn.rtt

    @property
    def encrypted(self) -> bool:
        """True while the router link travels in sealed records."""
        link = self._conn.link
        return link is not None and link.protocol.sealed

    @property
    def reassembler(self) -> Reassembler:
        """The reassembly of fragmented messages (its bounds and what it holds now)."""
        return self._reassembler

    async def wait_closed(self) -> None:
        """Wait until the client is disconnected for good."""
        await self._conn.closed_event.wait()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until a router link is up (returns at once when it is); raises
        :class:`~flowlib.errors.ConnectionLost` if the client is disconnected for good and
        :class:`~flowlib.errors.FailoverInProgress` if *timeout* passes first."""
        await self._conn.ready(timeout)

    async def open(self, addresses: Sequence[Address], timeout: float) -> list[tuple[str, str]]:
        """Try *addresses* in order until one completes the handshake; the failed attempts
        (address, why), or raise :class:`~flowlib.errors.ConnectError` naming them all."""
        attempts: list[tuple[str, str]] = []
        for i, addr in enumerate(addresses):
            text = address_text(addr)
            why = await self._conn.try_open(addr, timeout)
            if why is None:
                self._conn.addr_index = i
                return attempts
            log.info("flow router %s: %s", text, why)
            attempts.append((text, why))
        raise ConnectError(attempts)

    # ------------------------------------------------------------------ flows
    async def create(self, lsid: int | None = None) -> FlowID:
        """Name a new flow: our creator ID, the LSID of its core, a never-reused local ID.

        No message goes to the network: a flow exists once someone advertises, listens or
        sends. The LSID defaults to the one the router suggested in its HELLO. Local IDs come
        from :class:`~flowrouter.wire.flowid.LocalIdAllocator`, persisted in ``state_dir`` (or
        ``$FLOWNET_STATE_DIR``), so they are unique across restarts of this host; its file I/O
        runs in a worker thread to keep the event loop responsive.
        """
        return await self._members.create(lsid)

    async def advertise(self, flow: FlowID | str, locality: LocalitySpec = None, *,
                        timeout: float | None = None, capability: Any = None) -> None:
        """Install this flow's path toward its core so anyone can send to it (seed 3.4).

        Sent as a JOIN flagged ADVERTISE with the current listening mask (0 with no
        listener), acknowledged like a join; a refusal raises
        :class:`~flowlib.errors.JoinRefused`. The advertisement lasts until
        :meth:`unadvertise` or the client closes (the client keeps answering GC pings, and
        re-advertises after a failover).

        *locality* is the seed's limit on how far the advertisement spreads; it travels in
        the JOIN's header, but the router core currently always advertises to the core (the
        seed's own retrospective recommendation).
        """
        await self._members.advertise(flow, locality, timeout, capability)

    def publish_policy(self, policy: Any) -> None:
        """Give the router a creator-signed flow policy
        (:class:`flowrouter.wire.capabilities.Policy` or its bytes); routers pass it to each
        other and keep it, so from then on joins and sends on the flows it covers need
        capabilities. Publishing a newer version replaces it (e.g. to revoke tokens)."""
        raw = policy.encode() if hasattr(policy, "encode") else bytes(policy)
        link = self._conn.check_open()
        link.protocol.publish_policy(raw)
        link.flush()

    async def unadvertise(self, flow: FlowID | str) -> None:
        """Withdraw an advertisement (listeners on the flow stay)."""
        await self._members.unadvertise(flow)

    async def listen(self, flow: FlowID | str, bands: BandsSpec = "data", *,
                     size: int = DEFAULT_QUEUE_SIZE, overflow: str | Overflow = "drop-oldest",
                     timeout: float | None = None, name: str | None = None,
                     capability: Any = None) -> Listener:
        """Attach a receive queue to *bands* of *flow* and join the flow with them.

        *bands* is a :class:`~flowrouter.wire.bands.BandMask`, a band number, a list of bands or
        text (``"data"``, ``"32-40,fault"``); bands below 16 never reach applications and are
        ignored. The call returns once the router acknowledged the join (the tree toward the
        core is built by then, so messages sent afterwards arrive); it raises
        :class:`~flowlib.errors.JoinRefused` with the router's reason, or
        :class:`~flowlib.errors.FlowTimeout` after *timeout* seconds (default: the client's
        ``request_timeout``). *name* names the listener in overflow notices (default
        ``listener-N``). Add ``"fault"`` to hear about failovers and router faults, and
        ``"overflow"`` to hear about messages this client dropped.

        *capability* (a :class:`flowrouter.wire.capabilities.Capability` or its bytes) is
        presented with the join for flows whose creator published a policy; it stays with
        the flow (re-joins after a failover present it again). ``advertise`` takes one too,
        which is what lets this client send on a protected flow.
        """
        return await self._members.listen(flow, bands, size, overflow, timeout, name,
                                          capability)

    async def unlisten(self, listener: Listener, *, timeout: float | None = None) -> None:
        """Remove a listener: narrow our mask on its flow with a new JOIN, or LEAVE the flow
        when nothing else here listens on or advertises it.

        The listener is closed at once (queued messages stay readable, then iteration ends).
        Removing a listener never fails: if the router does not confirm the narrower mask,
        the extra bands cost traffic, not correctness, and are logged.
        """
        await self._members.unlisten(listener, timeout)

    def listeners(self, flow: FlowID | str | None = None) -> list[Listener]:
        """The open listeners, all or those of one flow."""
        return self._members.listeners(flow)

    # ------------------------------------------------------------------ sending
    def send_nowait(self, flow: FlowID | str, payload: Payload, band: int = DEFAULT_DATA_BAND,
                    locality: LocalitySpec = None, ttl: int = DEFAULT_TTL, *,
                    fragment: bool | None = None) -> None:
        """Write one message to *flow* now (no back-pressure; see :meth:`send`).

        Messages go to the flow's members, never back to this client. *band* must be an
        application band (16..127); *locality* is ``None`` or ``(type, value)`` such as
        ``(Locality.GEOGRAPHY, 2)``; *ttl* counts router hops (1..255).

        A payload larger than the router's maximum is fragmented (all fragments are written at
        once: prefer :meth:`send` for large messages, which paces them); *fragment* ``False``
        refuses to and raises :class:`~flowlib.errors.MessageTooLarge` instead, ``True``
        fragments even a message that would fit. A message over ``max_message_size`` raises
        :class:`~flowlib.errors.MessageTooLarge` and sends nothing. During a failover this
        raises :class:`~flowlib.errors.FailoverInProgress` (nothing is sent).
        """
        self._sender.send_nowait(flow, payload, band, locality, ttl, fragment)

    async def send(self, flow: FlowID | str, payload: Payload, band: int = DEFAULT_DATA_BAND,
                   locality: LocalitySpec = None, ttl: int = DEFAULT_TTL, *,
                   fragment: bool | None = None) -> None:
        """Like :meth:`send_nowait`, then wait while the link's write buffer is full, so a
        fast sender is slowed to what the router takes instead of growing memory.

        Large messages are sent fragment by fragment at the pace the link takes them. During
        a failover this waits for the next router (at most ``failover_send_timeout`` seconds
        if set, else as long as the failover lasts) and then raises
        :class:`~flowlib.errors.FailoverInProgress` or, if every router failed,
        :class:`~flowlib.errors.ConnectionLost`. A fragmented message cut by a failover is
        sent again whole on the new router.
        """
        await self._sender.send(flow, payload, band, locality, ttl, fragment)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until the router has read every message sent before this call.

        What is buffered is written, then an ECHO: the router answers it when it reads it,
        after everything written before it on the link, so the answer means the router has
        taken those messages (forwarded them, or queued them for its outputs). It says
        nothing of the receivers. On a datagram link messages lost on the way stay lost
        (the ECHO is sent again every second until answered). A router from before soft
        state takes no ECHO: then this only waits until the link's write buffer has room.

        Raises :class:`~flowlib.errors.FlowTimeout` after *timeout* seconds (default: the
        client's ``request_timeout``), :class:`~flowlib.errors.FailoverInProgress` at once
        during a failover or when the link is lost before the answer (what was sent on it
        may be lost), and :class:`~flowlib.errors.ConnectionLost` once the client is closed
        or lost.
        """
        await self._sender.flush(timeout)

    async def watch_members(self, flow: FlowID | str, *, timeout: float | None = None,
                            size: int = DEFAULT_QUEUE_SIZE) -> MemberWatch:
        """Follow *flow*'s members: listen on band 19 (application membership), where the
        routers report their applications' joins, mask changes and leaves, and return a
        :class:`~flowlib.members.MemberWatch` holding the current view (``.members``) and
        yielding each change (``async for change in watch``). ``watch.close()`` stops it.

        Only notices from routers count, as whole frames from this client's router
        (:mod:`flowlib.members` says how their origin is checked). The view holds at most
        the client's ``max_members``; members past that are counted
        (``watch.overflowed``), make ``watch.incomplete`` true, and are reported on the
        overflow band (reason ``member-view-full``) to this client's listeners of *flow*.
        """
        lst = await self.listen(flow, BAND_APP_MEMBERSHIP, size=size, timeout=timeout,
                                name="members")

        async def unlisten() -> None:
            if not self.closed:
                await self.unlisten(lst)

        lim = NoticeLimiter(1, self.options.overflow_notice_interval)

        def overflow(refused: int) -> None:
            self.counters["members.overflowed"] += refused
            self._delivery.view_overflowed(lst.flow, watch.view, refused, lim)

        watch = MemberWatch(lst.flow, lst, max_members=self.options.max_members,
                            on_close=unlisten, on_overflow=overflow)
        return watch

    async def close(self, timeout: float = 5.0) -> None:
        """Leave every flow politely and close the link.

        LEAVEs go out first so routers drop our state at once (and do not report our link
        going down as a fault to the flows we were on). Listeners are closed: their queued
        messages can still be read, then iteration ends. Closing stops a failover in progress.
        """
        conn = self._conn
        if not conn.closing and not conn.lost:
            conn.closing = True
            self._failover.stop()
            link = conn.link
            if link is not None and conn.up:
                self._members.leave_all()
                link.close()
            else:
                if link is not None:
                    link.abort()
                conn.link = None
                conn.finish("the client was closed", user=True)
        conn.closing = True
        try:
            await asyncio.wait_for(conn.closed_event.wait(), timeout)
        except TimeoutError:
            if conn.link is not None:
                conn.link.abort()
            await conn.closed_event.wait()

    async def __aenter__(self) -> FlowClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = ("closed" if self.closed else "failing over" if self.failing_over
                 else "up")
        return f"<FlowClient {self.name!r} -> {self.router_name!r} at {self.address} {state}>"


async def connect(addresses: Address | Sequence[Address], *, timeout: float = 5.0,
                  failover: bool | None = None, options: ClientOptions | None = None,
                  **keywords: Any) -> FlowClient:
    """Connect to the first router in *addresses* that completes the handshake.

    Addresses are ``"host:port"``, ``"[v6]:port"`` or ``(host, port)`` (TCP), or
    ``"udp://host:port"`` (a datagram link to the router's ``app_udp`` address:
    :mod:`flowlib.dgram`), tried in order; each attempt gets *timeout* seconds for the
    connect and the HELLO exchange together. When
    none works, :class:`~flowlib.errors.ConnectError` lists every address and what it
    answered (refused, timed out, refused us with the router's reason, ...).

    *name* is how routers log us; *state_dir* holds the creator-ID file for :meth:`create`
    (default ``$FLOWNET_STATE_DIR`` or ``~/.local/state/flownet``); *request_timeout* bounds
    each join; *max_payload* is the largest frame we accept; *on_disconnect* is called once
    when the client is disconnected for good (with :class:`~flowlib.errors.ConnectionLost`,
    or ``None`` after :meth:`FlowClient.close`) and may be a coroutine function.

    Failover (on by default when more than one address is given; ``failover=True`` also
    makes a single-router client reconnect to it): when the router link is lost, the client
    moves to the next router that answers and re-joins its flows; see the module docs.
    *failover_timeout* is how long every router may fail before the client gives up with
    ConnectionLost; *reconnect_min*/*reconnect_max* bound the back-off between rounds of
    attempts; *failover_send_timeout* bounds how long ``send`` waits during a failover (None:
    as long as it lasts); *on_failover* is called with a :class:`FailoverEvent` after each.

    Router faults: when the router reports trouble with this client's link itself (a
    ``LIMIT`` fault when its per-tick work budget held back or dropped our requests,
    ``extra["limit"]`` naming which), the client logs a warning, counts it
    (``router_faults``, ``last_router_fault``), calls *on_router_fault* with the
    :class:`~flowlib.Fault` (it may be a coroutine function), and hands it, as a message on
    the fault band (17), to every listener of every flow whose mask has that band.

    Large messages: *max_message_size* is the largest message sent or reassembled,
    *max_reassembly_bytes* the reassembly memory, *reassembly_timeout* how long an incomplete
    message may go without a new fragment, *fragment_size* the largest fragment (default the
    router's maximum payload; set it to the smallest ``max_payload`` of the overlay if routers
    differ). Overflow notices: one per *overflow_notice_every* drops per listener, at most one
    per *overflow_notice_interval* seconds (None disables them); see :mod:`flowlib.notices`.

    *link_key* ``(key_id, secret)`` authenticates this application to routers that require
    it (``[link_auth] require_endpoints``) and checks that the router holds the key too;
    the secret is written as in a router config (``"hex:..."``, ``"base64:..."``,
    ``"file:PATH"``) or given as 32 raw bytes. With *encrypt* (or when the router asks
    for it) everything after the handshake travels in ChaCha20-Poly1305 records.

    *capabilities* (:class:`~flowrouter.wire.capabilities.Capability` objects, their bytes, or
    capability file paths, see :mod:`flowlib.credentials`) are presented with the joins of
    every flow one of them covers for this client's *name* (unless ``listen``/``advertise``
    is given its own); a file that cannot be read raises ``ValueError`` before connecting.

    *max_members* bounds each :meth:`FlowClient.watch_members` view (members past it are
    counted and reported, not kept).

    Soft state (:mod:`flowlib.liveness`): an ECHO to the router every *liveness_interval*
    seconds; a router silent for *dead_after* seconds (hung, or cut off without a reset) is
    dropped like a lost link (and failed over from); a digest of our joins and
    advertisements every *refresh_interval* keeps the router's state and repairs it.
    """
    o = ClientOptions.build(options, **keywords)
    check_identity(o.name, o.credentials)
    if isinstance(addresses, str) or (isinstance(addresses, tuple) and len(addresses) == 2
                                      and isinstance(addresses[1], int)):
        addrs: list[Address] = [addresses]
    else:
        addrs = list(addresses)
    valid: list[Address] = []
    bad: dict[int, str] = {}
    for i, addr in enumerate(addrs):
        try:
            parse_router_address(addr)
            valid.append(addr)
        except ValueError as exc:
            bad[i] = f"bad address ({exc})"
    client = FlowClient(o, addresses=valid, connect_timeout=timeout,
                        failover=len(valid) > 1 if failover is None else failover)
    try:
        await client.open(valid, timeout)
    except ConnectError as exc:
        tried = iter(exc.attempts)
        attempts = [(address_text(addr), bad[i]) if i in bad else next(tried)
                    for i, addr in enumerate(addrs)]
        raise ConnectError(attempts) from None
    return client

__all__ = ["FlowClient", "FailoverEvent", "ClientOptions", "connect", "listen_mask",
           "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_FAILOVER_TIMEOUT", "Address", "BandsSpec",
           "LocalitySpec"]
