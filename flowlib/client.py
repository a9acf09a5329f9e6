"""The asyncio flow client: a TCP link to a flow router (failing over to another router when
that one dies), flows joined and sent to over it.

:class:`FlowClient` is a thin coordinator: it takes the options, closes politely, and
inherits one layer per concern, each in its own module and each building on the one below
(README "Wire format" and :mod:`flowrouter.wire` describe the protocol):

=============================  ==============================================================
:mod:`flowlib.link`            one TCP connection: bytes -> frames, sealed records
:mod:`flowlib.connection`      the router link's life cycle: HELLO/AUTH handshake, up, lost
:mod:`flowlib.membership`      flows and listeners: JOIN/LEAVE/acks, advertise,
                               capability policies
:mod:`flowlib.receiving`       data frames to listeners, reassembly, overflow notices
:mod:`flowlib.failover`        the next router after a loss, and re-joining there
:mod:`flowlib.sending`         ``send``/``send_nowait``, back-pressure, fragmentation
:mod:`flowlib.softstate`       router liveness (ECHO, dead-router detection), refresh
                               digests of our joins, re-joins on NOT_ON_TREE / PRUNE
:mod:`flowlib.checks`          argument checks and the public type aliases
=============================  ==============================================================

:func:`connect` tries the given router addresses in order and raises
:class:`~flowlib.errors.ConnectError` naming every address and what each one answered when
none completes the handshake.

The receive path is an :class:`asyncio.Protocol` fed by a
:class:`~flowrouter.wire.header.FrameDecoder` (no stream-reader task, no per-frame await), and
frames are written with ``transport.writelines([header, payload])``.

Imports asyncio and the wire layer of flowrouter.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Sequence
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_APP_MEMBERSHIP, BAND_MEMBERSHIP
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import DEFAULT_MAX_PAYLOAD

from .checks import (
    Address,
    BandsSpec,
    LocalitySpec,
    address_text,
    check_identity,
    listen_mask,
    parse_router_address,
)
from .connection import DEFAULT_REQUEST_TIMEOUT, DisconnectHook, log
from .errors import ConnectError
from .failover import (
    DEFAULT_FAILOVER_TIMEOUT,
    DEFAULT_RECONNECT_MAX,
    DEFAULT_RECONNECT_MIN,
    FailoverEvent,
    FailoverHook,
)
from .fragment import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_REASSEMBLY_BYTES,
    DEFAULT_REASSEMBLY_TIMEOUT,
    FRAGMENT_HEADER_SIZE,
)
from .members import MemberWatch
from .notices import DEFAULT_NOTICE_EVERY, DEFAULT_NOTICE_INTERVAL, NoticeLimiter
from .queue import DEFAULT_QUEUE_SIZE
from .softstate import SoftState


class FlowClient(SoftState):
    """A connection to the flow overlay through one router at a time. Make one with
    :func:`connect`.

    Use it as an async context manager (``async with client:``) or call :meth:`close`. All
    methods must be called from the event loop the client was connected on.
    """

    def __init__(self, *, name: str = "flowlib", state_dir: str | os.PathLike[str] | None = None,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 max_payload: int = DEFAULT_MAX_PAYLOAD, credentials: bytes = b"",
                 on_disconnect: DisconnectHook | None = None,
                 addresses: Sequence[Address] = (), connect_timeout: float = 5.0,
                 failover: bool = False,
                 failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT,
                 failover_send_timeout: float | None = None,
                 reconnect_min: float = DEFAULT_RECONNECT_MIN,
                 reconnect_max: float = DEFAULT_RECONNECT_MAX,
                 on_failover: FailoverHook | None = None,
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 max_reassembly_bytes: int = DEFAULT_MAX_REASSEMBLY_BYTES,
                 reassembly_timeout: float = DEFAULT_REASSEMBLY_TIMEOUT,
                 fragment_size: int | None = None,
                 overflow_notice_every: int | None = DEFAULT_NOTICE_EVERY,
                 overflow_notice_interval: float = DEFAULT_NOTICE_INTERVAL,
                 link_key: tuple[str, str | bytes] | None = None,
                 encrypt: bool = False, capabilities: Iterable[Any] = (),
                 liveness_interval: float = C.DEFAULT_LIVENESS_INTERVAL,
                 dead_after: float = C.DEFAULT_DEAD_AFTER,
                 refresh_interval: float = C.DEFAULT_REFRESH_INTERVAL) -> None:
        for what, value in (("failover_timeout", failover_timeout),
                            ("reconnect_min", reconnect_min), ("reconnect_max", reconnect_max),
                            ("reassembly_timeout", reassembly_timeout),
                            ("connect timeout", connect_timeout)):
            if not value > 0:
                raise ValueError(f"{what} must be positive, got {value!r}")
        if failover_send_timeout is not None and failover_send_timeout < 0:
            raise ValueError("failover_send_timeout must be >= 0 or None")
        if fragment_size is not None and not fragment_size > FRAGMENT_HEADER_SIZE:
            raise ValueError(f"fragment_size must exceed the {FRAGMENT_HEADER_SIZE}-byte "
                             f"fragment header, got {fragment_size!r}")
        if max_message_size < 1 or max_reassembly_bytes < 1:
            raise ValueError("max_message_size and max_reassembly_bytes must be positive")
        if overflow_notice_every is not None:
            NoticeLimiter(overflow_notice_every, overflow_notice_interval)  # validates
        self._init_connection(name=name, request_timeout=request_timeout,
                              max_payload=max_payload, credentials=credentials,
                              on_disconnect=on_disconnect, addresses=addresses,
                              connect_timeout=connect_timeout, failover=failover,
                              link_key=link_key, encrypt=encrypt)
        self._init_membership(state_dir=state_dir, capabilities=capabilities)
        self._init_receiving(max_message_size=max_message_size,
                             max_reassembly_bytes=max_reassembly_bytes,
                             reassembly_timeout=reassembly_timeout,
                             overflow_notice_every=overflow_notice_every,
                             overflow_notice_interval=overflow_notice_interval)
        self._init_failover(failover_timeout=failover_timeout,
                            failover_send_timeout=failover_send_timeout,
                            reconnect_min=reconnect_min, reconnect_max=reconnect_max,
                            on_failover=on_failover)
        self._init_sending(fragment_size=fragment_size)
        self._init_softstate(liveness_interval=liveness_interval, dead_after=dead_after,
                             refresh_interval=refresh_interval)

    async def watch_members(self, flow: FlowID | str, *, timeout: float | None = None,
                            size: int = DEFAULT_QUEUE_SIZE) -> MemberWatch:
        """Follow *flow*'s members: listen on band 19 (application membership), where the
        routers report their applications' joins, mask changes and leaves, and return a
        :class:`~flowlib.members.MemberWatch` holding the current view (``.members``) and
        yielding each change (``async for change in watch``). ``watch.close()`` stops it.
        """
        lst = await self.listen(flow, BAND_APP_MEMBERSHIP, size=size, timeout=timeout,
                                name="members")

        async def unlisten() -> None:
            if not self.closed:
                await self.unlisten(lst)

        return MemberWatch(lst.flow, lst, on_close=unlisten)

    async def close(self, timeout: float = 5.0) -> None:
        """Leave every flow politely and close the link.

        LEAVEs go out first so routers drop our state at once (and do not report our link
        going down as a fault to the flows we were on). Listeners are closed: their queued
        messages can still be read, then iteration ends. Closing stops a failover in progress.
        """
        if not self._closing and not self._lost:
            self._closing = True
            task = self._failover_task
            if task is not None:
                task.cancel()
            transport = self._transport
            if transport is not None and self._up:
                for fs in self._flows.values():
                    if fs.on_router:
                        self._write_control(fs.flow.key, BAND_MEMBERSHIP, C.Leave())
                        fs.on_router = False
                transport.close()
            else:
                if transport is not None:
                    transport.abort()
                self._link = None
                self._transport = None
                self._finish("the client was closed", user=True)
        self._closing = True
        try:
            await asyncio.wait_for(self._closed_event.wait(), timeout)
        except TimeoutError:
            if self._transport is not None:
                self._transport.abort()
            await self._closed_event.wait()

    async def __aenter__(self) -> FlowClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = ("closed" if self.closed else "failing over" if self.failing_over
                 else "up")
        return f"<FlowClient {self.name!r} -> {self.router_name!r} at {self.address} {state}>"


async def connect(addresses: Address | Sequence[Address], *, name: str = "flowlib",
                  timeout: float = 5.0, state_dir: str | os.PathLike[str] | None = None,
                  request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                  max_payload: int = DEFAULT_MAX_PAYLOAD, credentials: bytes = b"",
                  on_disconnect: DisconnectHook | None = None,
                  failover: bool | None = None,
                  failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT,
                  failover_send_timeout: float | None = None,
                  reconnect_min: float = DEFAULT_RECONNECT_MIN,
                  reconnect_max: float = DEFAULT_RECONNECT_MAX,
                  on_failover: FailoverHook | None = None,
                  max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                  max_reassembly_bytes: int = DEFAULT_MAX_REASSEMBLY_BYTES,
                  reassembly_timeout: float = DEFAULT_REASSEMBLY_TIMEOUT,
                  fragment_size: int | None = None,
                  overflow_notice_every: int | None = DEFAULT_NOTICE_EVERY,
                  overflow_notice_interval: float = DEFAULT_NOTICE_INTERVAL,
                  link_key: tuple[str, str | bytes] | None = None,
                  encrypt: bool = False, capabilities: Iterable[Any] = (),
                  liveness_interval: float = C.DEFAULT_LIVENESS_INTERVAL,
                  dead_after: float = C.DEFAULT_DEAD_AFTER,
                  refresh_interval: float = C.DEFAULT_REFRESH_INTERVAL) -> FlowClient:
    """Connect to the first router in *addresses* that completes the handshake.

    Addresses are ``"host:port"``, ``"[v6]:port"`` or ``(host, port)``, tried in order; each
    attempt gets *timeout* seconds for the TCP connect and the HELLO exchange together. When
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

    Soft state (:mod:`flowlib.softstate`): an ECHO to the router every *liveness_interval*
    seconds; a router silent for *dead_after* seconds (hung, or cut off without a reset) is
    dropped like a lost link (and failed over from); a digest of our joins and
    advertisements every *refresh_interval* keeps the router's state and repairs it.
    """
    check_identity(name, credentials)
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
    client = FlowClient(
        name=name, state_dir=state_dir, request_timeout=request_timeout,
        max_payload=max_payload, credentials=credentials, on_disconnect=on_disconnect,
        addresses=valid, connect_timeout=timeout,
        failover=len(valid) > 1 if failover is None else failover,
        failover_timeout=failover_timeout, failover_send_timeout=failover_send_timeout,
        reconnect_min=reconnect_min, reconnect_max=reconnect_max, on_failover=on_failover,
        max_message_size=max_message_size, max_reassembly_bytes=max_reassembly_bytes,
        reassembly_timeout=reassembly_timeout, fragment_size=fragment_size,
        overflow_notice_every=overflow_notice_every,
        overflow_notice_interval=overflow_notice_interval, link_key=link_key,
        encrypt=encrypt, capabilities=capabilities, liveness_interval=liveness_interval,
        dead_after=dead_after, refresh_interval=refresh_interval)
    attempts: list[tuple[str, str]] = []
    vi = 0
    for i, addr in enumerate(addrs):
        text = address_text(addr)
        if i in bad:
            attempts.append((text, bad[i]))
            continue
        why = await client._try_open(addr, timeout)
        if why is None:
            client._addr_index = vi
            return client
        vi += 1
        log.info("flow router %s: %s", text, why)
        attempts.append((text, why))
    raise ConnectError(attempts)

__all__ = ["FlowClient", "FailoverEvent", "connect", "listen_mask", "DEFAULT_REQUEST_TIMEOUT",
           "DEFAULT_FAILOVER_TIMEOUT", "Address", "BandsSpec", "LocalitySpec"]
