"""The asyncio flow client: one TCP link to a flow router, flows joined and sent to over it.

How the pieces map onto the protocol (DESIGN.md sections 2-4 and 7):

* **Handshake.** Both sides open the link with a HELLO on the link-local flow. The router's
  HELLO tells us its name, the largest payload it takes, and the LSID it suggests for new
  flows. An ERROR instead means the router refuses us; :func:`connect` then tries the next
  address, and finally raises :class:`~flowlib.errors.ConnectError` naming every address and
  what each one answered.
* **Membership.** The router keeps *one* band mask per link and flow, so the client joins with
  the union of the masks of all its listeners on that flow. A repeated JOIN just replaces that
  mask and is acknowledged again, so adding a listener always sends a JOIN (its ack is the
  answer to that ``listen`` call), removing one narrows the mask with a new JOIN, and removing
  the last sends a LEAVE. An advertisement is a JOIN flagged ``ADVERTISE`` that keeps the path
  toward the core installed even with no listener.
* **Garbage collection.** Routers forget idle state by epochs and ping before they do; the
  client answers a PING only for flows it still listens on or advertises, so state it no
  longer wants is collected even if a LEAVE was lost.
* **Data.** Frames on bands 16..127 are delivered to the listeners whose mask has the band;
  the payload is copied out of the decoder's buffer once and shared by those listeners.

The receive path is an :class:`asyncio.Protocol` fed by a
:class:`~flowrouter.header.FrameDecoder` (no stream-reader task, no per-frame await), and
frames are written with ``transport.writelines([header, payload])``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from flowrouter import control as C
from flowrouter.bands import (BAND_GC, BAND_MEMBERSHIP, DEFAULT_DATA_BAND, NUM_BANDS,
                              ROUTER_BANDS_END, BandMask, mask_of)
from flowrouter.config import parse_address
from flowrouter.flowid import LINK_LOCAL_FLOW, FlowID, LocalIdAllocator
from flowrouter.header import (DEFAULT_MAX_PAYLOAD, DEFAULT_TTL, MAX_TTL, FrameDecoder,
                               Locality, MalformedFrame, pack_header)

from .errors import (ConnectError, ConnectionLost, FlowError, FlowTimeout, JoinRefused,
                     ListenerClosed, MessageTooLarge)
from .message import Message
from .queue import DEFAULT_QUEUE_SIZE, Listener, Overflow

log = logging.getLogger("flowlib")

_LINK_KEY = LINK_LOCAL_FLOW.key
_ZERO_LSID = b"\0\0\0\0"
_ROUTER_BANDS_MASK = (1 << ROUTER_BANDS_END) - 1

#: How long a JOIN may stay unanswered by default. A router gives up on an unanswered upstream
#: join after its ``join_timeout`` (5 s by default) but only notices when its incremental GC
#: visits the entry (about once per epoch), so its TIMEOUT answer can take two of those.
DEFAULT_REQUEST_TIMEOUT = 15.0

Address = str | tuple[str, int]
BandsSpec = BandMask | Iterable[int] | int | str
LocalitySpec = tuple[Locality | int | str, int] | None
DisconnectHook = Callable[[FlowError | None], Any]


def _parse_address(addr: Address) -> tuple[str, int]:
    if isinstance(addr, tuple):
        host, port = addr
        return str(host), int(port)
    return parse_address(str(addr), "router address")


def _address_text(addr: Address) -> str:
    if isinstance(addr, tuple):
        host, port = addr
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr).strip()


def _check_flow(flow: FlowID | str) -> FlowID:
    if isinstance(flow, str):
        flow = FlowID.parse(flow)
    elif not isinstance(flow, FlowID):
        raise TypeError(f"flow must be a FlowID (or its text form), not {type(flow).__name__}")
    if flow.is_link_local:
        raise ValueError(f"flow {flow} uses the reserved LSID {flow.lsid}; it is not routable")
    return flow


def _check_locality(locality: LocalitySpec) -> tuple[int, int]:
    """``None`` or ``(type, value)`` -> the two header bytes."""
    if locality is None:
        return 0, 0
    try:
        loc_type, value = locality
    except (TypeError, ValueError):
        raise ValueError(f"locality must be None or (type, value), e.g. "
                         f"(Locality.GEOGRAPHY, 2); got {locality!r}") from None
    try:
        kind = Locality.parse(loc_type)
    except ValueError:
        raise ValueError(f"unknown locality type {loc_type!r}; use one of "
                         + ", ".join(m.name.lower() for m in Locality)) from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError(f"locality value must be an integer 0..255, got {value!r}")
    if kind is Locality.NONE:
        return 0, 0
    return int(kind), value


def _check_data_band(band: int) -> int:
    if isinstance(band, bool) or not isinstance(band, int):
        raise ValueError(f"band must be an integer {ROUTER_BANDS_END}..{NUM_BANDS - 1}, "
                         f"got {band!r}")
    if not ROUTER_BANDS_END <= band < NUM_BANDS:
        if 0 <= band < ROUTER_BANDS_END:
            raise ValueError(f"band {band} is reserved for routers; applications send on "
                             f"bands {ROUTER_BANDS_END}..{NUM_BANDS - 1}")
        raise ValueError(f"band must be {ROUTER_BANDS_END}..{NUM_BANDS - 1}, got {band}")
    return band


def _check_ttl(ttl: int) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_TTL:
        raise ValueError(f"ttl must be an integer 1..{MAX_TTL}, got {ttl!r}")
    return ttl


def listen_mask(bands: BandsSpec) -> int:
    """Coerce a listener's band spec to the mask int, without the router bands.

    Bands below 16 are consumed by routers and never delivered, so they are dropped from the
    mask (which lets ``"all"`` mean "everything an application can see"); a spec with nothing
    left is an error, since such a listener could never receive anything.
    """
    try:
        bits = mask_of(bands)
    except TypeError:
        raise ValueError(f"bands must be a BandMask, band number, list of bands or text like "
                         f"'data' or '32-40,fault'; got {bands!r}") from None
    bits &= ~_ROUTER_BANDS_MASK
    if not bits:
        raise ValueError(f"band spec {bands!r} names no band an application can receive "
                         f"(bands {ROUTER_BANDS_END}..{NUM_BANDS - 1})")
    return bits


def _check_identity(name: str, credentials: bytes) -> None:
    """Refuse what the HELLO cannot carry intact (the control codec would truncate the name
    mid-character, and the router would drop the link as malformed)."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if len(name.encode("utf-8")) > 255:
        raise ValueError(f"name is {len(name.encode('utf-8'))} bytes in UTF-8; the HELLO "
                         "carries at most 255")
    if not isinstance(credentials, bytes) or len(credentials) > 0xFFFF:
        raise ValueError("credentials must be bytes, at most 65535 of them")


class _FlowState:
    """What this client holds on one flow: its listeners and whether it advertises it."""

    __slots__ = ("flow", "listeners", "advertised", "adv_locality", "on_router", "sent_mask")

    def __init__(self, flow: FlowID) -> None:
        self.flow = flow
        self.listeners: list[Listener] = []
        self.advertised = False
        self.adv_locality: tuple[int, int] = (0, 0)
        #: the router has (or is being asked to make) state for our link on this flow
        self.on_router = False
        #: the mask of the last JOIN we sent
        self.sent_mask: int | None = None

    def mask(self) -> int:
        bits = 0
        for lst in self.listeners:
            bits |= lst._mask
        return bits

    @property
    def wanted(self) -> bool:
        return bool(self.listeners) or self.advertised


class _Link(asyncio.Protocol):
    """The TCP link's receive path: bytes -> frames -> the client's handlers."""

    def __init__(self, client: FlowClient) -> None:
        self.client = client
        self.decoder = FrameDecoder(client._own_max_payload)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.client._connection_made(transport)

    def data_received(self, data: bytes) -> None:
        client = self.client
        try:
            frames = self.decoder.feed(data)
        except MalformedFrame as exc:
            client._protocol_error(f"malformed frame from the router: {exc}")
            return
        deliver = client._deliver
        for header, payload in frames:
            if header[20] >= ROUTER_BANDS_END:
                deliver(header, payload)
            else:
                client._on_control(header, payload)
            if client._dead:
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._connection_lost(exc)

    def pause_writing(self) -> None:
        self.client._paused = True

    def resume_writing(self) -> None:
        self.client._resume_writing()


class FlowClient:
    """A connection to one flow router. Make one with :func:`connect`.

    Use it as an async context manager (``async with client:``) or call :meth:`close`. All
    methods must be called from the event loop the client was connected on.
    """

    def __init__(self, *, name: str = "flowlib", state_dir: str | os.PathLike[str] | None = None,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 max_payload: int = DEFAULT_MAX_PAYLOAD, credentials: bytes = b"",
                 on_disconnect: DisconnectHook | None = None) -> None:
        self.name = name
        #: node ID sent in our HELLO; random per connection (endpoints need no stable identity,
        #: the FlowID creator ID is what must be stable and that lives in the state dir)
        self.node_id = secrets.randbits(64) or 1
        self.request_timeout = request_timeout
        #: called once when the link ends: with ConnectionLost, or None after close()
        self.on_disconnect = on_disconnect
        #: counters of things worth seeing that are not errors (unwanted frames, ...)
        self.counters: Counter[str] = Counter()
        self._state_path = Path(state_dir) / "creator" if state_dir is not None else None
        self._own_max_payload = max_payload
        self._credentials = credentials
        self._allocator: LocalIdAllocator | None = None
        self._alloc_lock = asyncio.Lock()
        self._transport: asyncio.Transport | None = None
        self._hello: asyncio.Future[C.Hello] | None = None
        self._flows: dict[bytes, _FlowState] = {}
        self._pending: dict[int, tuple[bytes, asyncio.Future[C.JoinAck]]] = {}
        self._next_req = 1
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closing = False  # close() was called
        self._lost = False  # the transport is gone
        self._dead = False  # we gave up on the link (protocol error, refusal): stop reading
        self._close_reason: str | None = None
        self._closed_event = asyncio.Event()
        # filled in from the router's HELLO
        self.address = ""
        self.router_name = ""
        self.router_node_id = 0
        self.max_payload = 0
        self.default_lsid = 0

    # ------------------------------------------------------------------ connection
    async def _open(self, addr: Address, timeout: float) -> None:
        """Connect and handshake with one router, or raise with a one-line reason."""
        host, port = _parse_address(addr)
        self.address = _address_text(addr)
        loop = asyncio.get_running_loop()
        self._hello = loop.create_future()
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: _Link(self), host, port)
                hello = await self._hello
        except BaseException:
            if self._transport is not None:
                self._transport.abort()
            raise
        self.router_name = hello.name
        self.router_node_id = hello.node_id
        self.max_payload = hello.max_payload
        self.default_lsid = hello.default_lsid
        log.info("connected to flow router %r at %s (max payload %d, default LSID %#x)",
                 hello.name, self.address, hello.max_payload, hello.default_lsid)

    def _connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        hello = C.Hello(self.node_id, C.Role.ENDPOINT, self.name, self._own_max_payload,
                        0, self._credentials).encode()
        transport.writelines([pack_header(_LINK_KEY, len(hello), BAND_MEMBERSHIP), hello])

    def _protocol_error(self, reason: str) -> None:
        """The router sent something we cannot trust: drop the link, say why."""
        log.warning("router %s: %s; closing the link", self.address, reason)
        self._fail(reason)

    def _fail(self, reason: str) -> None:
        self._dead = True
        if self._close_reason is None:
            self._close_reason = reason
        hello = self._hello
        if hello is not None and not hello.done():
            hello.set_exception(ConnectionLost(reason))
        if self._transport is not None:
            self._transport.abort()

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        if self._closing:
            reason = self._close_reason or "the client was closed"
        else:
            reason = self._close_reason or (
                f"{exc}" if exc else f"router {self.router_name or self.address} closed the "
                                     f"connection")
        self._close_reason = reason
        hello = self._hello
        if hello is not None and not hello.done():
            hello.set_exception(ConnectionLost(reason))
        user = self._closing

        def listener_error() -> FlowError:
            if user:
                return ListenerClosed("the flow client was closed")
            return ConnectionLost(reason)

        for fs in self._flows.values():
            for lst in fs.listeners:
                lst._close(listener_error)
        pending, self._pending = self._pending, {}
        for _key, fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLost(reason))
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(ConnectionLost(reason))
        self._closed_event.set()
        if hello is not None and hello.done() and not hello.cancelled() \
                and hello.exception() is None:
            # only a link that was up is "disconnected"; a failed attempt is a ConnectError
            if not user:
                log.warning("lost the flow router %s: %s", self.address, reason)
            self._call_hook(None if user else ConnectionLost(reason))

    def _call_hook(self, err: FlowError | None) -> None:
        hook = self.on_disconnect
        if hook is None:
            return
        try:
            result = hook(err)
            if inspect.isawaitable(result):
                asyncio.ensure_future(result)
        except Exception:  # the hook is the application's; its bug must not break ours
            log.exception("on_disconnect hook raised")

    @property
    def closed(self) -> bool:
        """True once the link to the router is gone (lost or closed)."""
        return self._lost or self._closing

    @property
    def close_reason(self) -> str | None:
        """Why the link ended (None while it is up)."""
        return self._close_reason if self.closed else None

    async def wait_closed(self) -> None:
        """Wait until the link to the router is gone."""
        await self._closed_event.wait()

    async def close(self, timeout: float = 5.0) -> None:
        """Leave every flow politely and close the link.

        LEAVEs go out first so routers drop our state at once (and do not report our link
        going down as a fault to the flows we were on). Listeners are closed: their queued
        messages can still be read, then iteration ends.
        """
        if not self._closing and not self._lost:
            self._closing = True
            transport = self._transport
            if transport is not None:
                for fs in self._flows.values():
                    if fs.on_router:
                        self._write_control(fs.flow.key, BAND_MEMBERSHIP, C.Leave())
                        fs.on_router = False
                transport.close()
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
        state = "closed" if self.closed else "up"
        return f"<FlowClient {self.name!r} -> {self.router_name!r} at {self.address} {state}>"

    def _check_open(self) -> None:
        if self._lost or self._closing:
            raise ConnectionLost(self._close_reason or "the client was closed")

    # ------------------------------------------------------------------ writing
    def _write_control(self, key: bytes, band: int, msg: C.ControlMessage,
                       loc: tuple[int, int] = (0, 0)) -> None:
        assert self._transport is not None
        body = msg.encode()
        self._transport.writelines([pack_header(key, len(body), band, loc[0], loc[1]), body])

    def _resume_writing(self) -> None:
        self._paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _drain(self) -> None:
        while self._paused and not self._lost:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter
        if self._lost:
            self._check_open()

    # ------------------------------------------------------------------ flows
    async def create(self, lsid: int | None = None) -> FlowID:
        """Name a new flow: our creator ID, the LSID of its core, a never-reused local ID.

        No message goes to the network: a flow exists once someone advertises, listens or
        sends. The LSID defaults to the one the router suggested in its HELLO. Local IDs come
        from :class:`~flowrouter.flowid.LocalIdAllocator`, persisted in ``state_dir`` (or
        ``$FLOWNET_STATE_DIR``), so they are unique across restarts of this host; its file I/O
        runs in a worker thread to keep the event loop responsive.
        """
        if lsid is None:
            lsid = self.default_lsid
            if not lsid:
                raise FlowError(f"router {self.router_name!r} suggests no LSID for new flows "
                                "(it knows no location service); pass lsid= explicitly")
        if isinstance(lsid, bool) or not isinstance(lsid, int) or not 0 < lsid < 1 << 32:
            raise ValueError(f"lsid must be an integer 1..0xffffffff (0 is reserved), "
                             f"got {lsid!r}")
        async with self._alloc_lock:
            if self._allocator is None:
                self._allocator = await asyncio.to_thread(LocalIdAllocator, self._state_path)
            allocator = self._allocator
            local = await asyncio.to_thread(allocator.allocate)
        return FlowID(allocator.creator, lsid, local)

    def _flow_state(self, flow: FlowID) -> _FlowState:
        fs = self._flows.get(flow.key)
        if fs is None:
            fs = self._flows[flow.key] = _FlowState(flow)
        return fs

    def _send_join(self, fs: _FlowState) -> tuple[int, asyncio.Future[C.JoinAck]]:
        req = self._next_req
        self._next_req = (req + 1) & 0xFFFFFFFF or 1
        fut: asyncio.Future[C.JoinAck] = asyncio.get_running_loop().create_future()
        key = fs.flow.key
        self._pending[req] = (key, fut)
        mask = fs.mask()
        flags = C.JOIN_FLAG_ADVERTISE if fs.advertised else 0
        self._write_control(key, BAND_MEMBERSHIP, C.Join(req, mask, flags),
                            fs.adv_locality if fs.advertised else (0, 0))
        fs.on_router = True
        fs.sent_mask = mask
        return req, fut

    async def _await_ack(self, req: int, fut: asyncio.Future[C.JoinAck], flow: FlowID,
                         timeout: float | None) -> C.JoinAck:
        limit = self.request_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(fut, limit)
        except TimeoutError:
            raise FlowTimeout(f"router {self.router_name!r} did not answer the join of flow "
                              f"{flow} within {limit}s") from None
        finally:
            self._pending.pop(req, None)

    def _sync_router(self, fs: _FlowState) -> tuple[int, asyncio.Future[C.JoinAck]] | None:
        """Bring the router's view of our membership in line with ``fs``.

        Returns the (request, future) of a JOIN if one was needed. A flow nobody here wants
        any more gets a LEAVE and is forgotten.
        """
        key = fs.flow.key
        if not fs.wanted:
            if fs.on_router and not self._lost and not self._closing:
                self._write_control(key, BAND_MEMBERSHIP, C.Leave())
            fs.on_router = False
            fs.sent_mask = None
            if self._flows.get(key) is fs:
                del self._flows[key]
            return None
        if self._lost or self._closing:
            return None
        if fs.on_router and fs.sent_mask == fs.mask():
            return None
        return self._send_join(fs)

    def _background_join(self, fs: _FlowState) -> None:
        """A JOIN nobody awaits (repairs after a failed request): log its outcome."""
        sent = self._sync_router(fs)
        if sent is None:
            return
        req, fut = sent
        flow = fs.flow

        def done(f: asyncio.Future[C.JoinAck]) -> None:
            self._pending.pop(req, None)
            if f.cancelled() or f.exception() is not None:
                return
            ack = f.result()
            if ack.status is not C.JoinStatus.OK:
                log.warning("re-join of flow %s refused: %s (%s)", flow, ack.status.name,
                            ack.reason)
                if self._flows.get(flow.key) is fs:
                    fs.on_router = False

        fut.add_done_callback(done)

    def _detach(self, fs: _FlowState, lst: Listener | None, router_forgot: bool) -> None:
        if lst is not None:
            if lst in fs.listeners:
                fs.listeners.remove(lst)
            lst._close()
        if router_forgot:
            # a refused JOIN leaves no state for our link at the router
            fs.on_router = False
            fs.sent_mask = None
        self._background_join(fs)

    async def advertise(self, flow: FlowID | str, locality: LocalitySpec = None, *,
                        timeout: float | None = None) -> None:
        """Install this flow's path toward its core so anyone can send to it (seed 3.4).

        Sent as a JOIN flagged ADVERTISE with the current listening mask (0 with no
        listener), acknowledged like a join; a refusal raises
        :class:`~flowlib.errors.JoinRefused`. The advertisement lasts until
        :meth:`unadvertise` or the client closes (the client keeps answering GC pings).

        *locality* is the seed's limit on how far the advertisement spreads; it travels in
        the JOIN's header, but the router core currently always advertises to the core (the
        seed's own retrospective recommendation).
        """
        flow = _check_flow(flow)
        loc = _check_locality(locality)
        self._check_open()
        fs = self._flow_state(flow)
        was = fs.advertised, fs.adv_locality
        fs.advertised, fs.adv_locality = True, loc
        req, fut = self._send_join(fs)
        try:
            ack = await self._await_ack(req, fut, flow, timeout)
        except BaseException:
            fs.advertised, fs.adv_locality = was
            self._detach(fs, None, router_forgot=False)
            raise
        if ack.status is not C.JoinStatus.OK:
            fs.advertised, fs.adv_locality = False, (0, 0)
            self._detach(fs, None, router_forgot=True)
            raise JoinRefused(ack.status, ack.reason, flow)

    async def unadvertise(self, flow: FlowID | str) -> None:
        """Withdraw an advertisement (listeners on the flow stay)."""
        flow = _check_flow(flow)
        fs = self._flows.get(flow.key)
        if fs is None or not fs.advertised:
            return
        fs.advertised, fs.adv_locality = False, (0, 0)
        await self._settle(fs)

    async def listen(self, flow: FlowID | str, bands: BandsSpec = "data", *,
                     size: int = DEFAULT_QUEUE_SIZE, overflow: str | Overflow = "drop-oldest",
                     timeout: float | None = None) -> Listener:
        """Attach a receive queue to *bands* of *flow* and join the flow with them.

        *bands* is a :class:`~flowrouter.bands.BandMask`, a band number, a list of bands or
        text (``"data"``, ``"32-40,fault"``); bands below 16 never reach applications and are
        ignored. The call returns once the router acknowledged the join (the tree toward the
        core is built by then, so messages sent afterwards arrive); it raises
        :class:`~flowlib.errors.JoinRefused` with the router's reason, or
        :class:`~flowlib.errors.FlowTimeout` after *timeout* seconds (default: the client's
        ``request_timeout``).
        """
        flow = _check_flow(flow)
        mask = listen_mask(bands)
        lst = Listener(flow, mask, size, overflow)
        self._check_open()
        fs = self._flow_state(flow)
        # Registered before the ack so nothing sent right after the join is missed.
        fs.listeners.append(lst)
        req, fut = self._send_join(fs)
        try:
            ack = await self._await_ack(req, fut, flow, timeout)
        except BaseException:
            self._detach(fs, lst, router_forgot=False)
            raise
        if ack.status is not C.JoinStatus.OK:
            self._detach(fs, lst, router_forgot=True)
            raise JoinRefused(ack.status, ack.reason, flow)
        return lst

    async def unlisten(self, listener: Listener, *, timeout: float | None = None) -> None:
        """Remove a listener: narrow our mask on its flow with a new JOIN, or LEAVE the flow
        when nothing else here listens on or advertises it.

        The listener is closed at once (queued messages stay readable, then iteration ends).
        Removing a listener never fails: if the router does not confirm the narrower mask,
        the extra bands cost traffic, not correctness, and are logged.
        """
        fs = self._flows.get(listener.flow.key)
        if fs is None or listener not in fs.listeners:
            listener._close()
            return
        fs.listeners.remove(listener)
        listener._close()
        await self._settle(fs, timeout)

    async def _settle(self, fs: _FlowState, timeout: float | None = None) -> None:
        sent = self._sync_router(fs)
        if sent is None:
            return
        req, fut = sent
        try:
            ack = await self._await_ack(req, fut, fs.flow, timeout)
        except (FlowTimeout, ConnectionLost) as exc:
            log.warning("membership change on flow %s not confirmed: %s", fs.flow, exc)
            return
        if ack.status is not C.JoinStatus.OK:
            log.warning("membership change on flow %s refused: %s (%s)", fs.flow,
                        ack.status.name, ack.reason)
            fs.on_router = False

    def listeners(self, flow: FlowID | str | None = None) -> list[Listener]:
        """The open listeners, all or those of one flow."""
        if flow is None:
            return [lst for fs in self._flows.values() for lst in fs.listeners]
        fs = self._flows.get(_check_flow(flow).key)
        return list(fs.listeners) if fs else []

    # ------------------------------------------------------------------ sending
    def send_nowait(self, flow: FlowID | str, payload: bytes | bytearray | memoryview,
                    band: int = DEFAULT_DATA_BAND, locality: LocalitySpec = None,
                    ttl: int = DEFAULT_TTL) -> None:
        """Write one message to *flow* now (no back-pressure; see :meth:`send`).

        Messages go to the flow's members, never back to this client. *band* must be an
        application band (16..127); *locality* is ``None`` or ``(type, value)`` such as
        ``(Locality.GEOGRAPHY, 2)``; *ttl* counts router hops (1..255). A payload larger than
        the router's maximum raises :class:`~flowlib.errors.MessageTooLarge` and sends
        nothing.
        """
        flow = _check_flow(flow)
        _check_data_band(band)
        loc_type, loc_value = _check_locality(locality)
        _check_ttl(ttl)
        if isinstance(payload, str):
            raise TypeError("payload must be bytes-like, not str (encode it first)")
        if isinstance(payload, memoryview):
            size = payload.nbytes
            if not payload.contiguous:
                raise ValueError("payload memoryview must be contiguous")
            if payload.ndim != 1 or payload.itemsize != 1:
                payload = payload.cast("B")
        elif isinstance(payload, (bytes, bytearray)):
            size = len(payload)
        else:
            raise TypeError(f"payload must be bytes-like, not {type(payload).__name__}")
        if size > self.max_payload:
            raise MessageTooLarge(size, self.max_payload)
        self._check_open()
        assert self._transport is not None
        self._transport.writelines([pack_header(flow.key, size, band, loc_type, loc_value, ttl),
                                    payload])

    async def send(self, flow: FlowID | str, payload: bytes | bytearray | memoryview,
                   band: int = DEFAULT_DATA_BAND, locality: LocalitySpec = None,
                   ttl: int = DEFAULT_TTL) -> None:
        """Like :meth:`send_nowait`, then wait while the link's write buffer is full, so a
        fast sender is slowed to what the router takes instead of growing memory."""
        self.send_nowait(flow, payload, band, locality, ttl)
        if self._paused:
            await self._drain()

    # ------------------------------------------------------------------ receiving
    def _deliver(self, header: memoryview, payload: memoryview) -> None:
        """A data frame (band >= 16): hand it to every listener whose mask has the band."""
        fs = self._flows.get(bytes(header[:16]))
        if fs is None:
            self.counters["drop.no-listener"] += 1
            return
        band = header[20]
        bit = 1 << band
        msg: Message | None = None
        for lst in fs.listeners:
            if lst._mask & bit:
                if msg is None:
                    msg = Message(fs.flow, band, bytes(payload), header[21], header[22],
                                  header[23])
                lst._put(msg)
        if msg is None:
            self.counters["drop.no-listener"] += 1
        else:
            self.counters["received"] += 1

    def _on_control(self, header: memoryview, payload: memoryview) -> None:
        """A router band (< 16): link-local HELLO/ERROR, join acks and GC pings.

        Other router bands (e.g. location-service coordination) are not meant for endpoints
        and are ignored rather than parsed.
        """
        key = bytes(header[:16])
        band = header[20]
        link_local = key[8:12] == _ZERO_LSID
        if not link_local and band not in (BAND_MEMBERSHIP, BAND_GC):
            self.counters["control.ignored-band"] += 1
            return
        try:
            msg = C.decode(payload)
        except MalformedFrame as exc:
            self._protocol_error(f"malformed control message: {exc}")
            return
        if link_local:
            self._on_link_control(msg)
            return
        hello = self._hello
        if hello is None or not hello.done():
            self._protocol_error("the router sent flow traffic before its HELLO")
            return
        if band == BAND_MEMBERSHIP and isinstance(msg, C.JoinAck):
            entry = self._pending.get(msg.req_id)
            if entry is None or entry[0] != key:
                self.counters["control.stale-ack"] += 1
                return
            fut = entry[1]
            if not fut.done():
                fut.set_result(msg)
        elif band == BAND_GC and isinstance(msg, C.Ping):
            fs = self._flows.get(key)
            if fs is not None and fs.wanted:
                self._write_control(key, BAND_GC, C.Pong(msg.epoch))
                self.counters["gc.pongs"] += 1
            else:
                self.counters["gc.pings-ignored"] += 1
        else:
            self.counters[f"control.ignored.{type(msg).__name__.lower()}"] += 1

    def _on_link_control(self, msg: C.ControlMessage) -> None:
        hello = self._hello
        if isinstance(msg, C.Error):
            self._fail(f"router refused us: {msg.text}")
            return
        if isinstance(msg, C.Hello):
            if hello is None or hello.done():
                self._protocol_error("the router sent a second HELLO")
            elif msg.role is not C.Role.ROUTER:
                self._fail(f"the peer is not a flow router (it says it is an "
                           f"{msg.role.name.lower()} named {msg.name!r})")
            else:
                hello.set_result(msg)
            return
        if hello is None or not hello.done():
            self._protocol_error(f"expected HELLO, got {type(msg).__name__}")
            return
        self.counters[f"control.ignored.{type(msg).__name__.lower()}"] += 1


async def connect(addresses: Address | Sequence[Address], *, name: str = "flowlib",
                  timeout: float = 5.0, state_dir: str | os.PathLike[str] | None = None,
                  request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                  max_payload: int = DEFAULT_MAX_PAYLOAD, credentials: bytes = b"",
                  on_disconnect: DisconnectHook | None = None) -> FlowClient:
    """Connect to the first router in *addresses* that completes the handshake.

    Addresses are ``"host:port"``, ``"[v6]:port"`` or ``(host, port)``, tried in order; each
    attempt gets *timeout* seconds for the TCP connect and the HELLO exchange together. When
    none works, :class:`~flowlib.errors.ConnectError` lists every address and what it
    answered (refused, timed out, refused us with the router's reason, ...).

    *name* is how routers log us; *state_dir* holds the creator-ID file for :meth:`create`
    (default ``$FLOWNET_STATE_DIR`` or ``~/.local/state/flownet``); *request_timeout* bounds
    each join; *max_payload* is the largest frame we accept; *on_disconnect* is called once
    when an established link ends (with :class:`~flowlib.errors.ConnectionLost`, or ``None``
    after :meth:`FlowClient.close`) and may be a coroutine function.
    """
    _check_identity(name, credentials)
    if isinstance(addresses, str) or (isinstance(addresses, tuple) and len(addresses) == 2
                                      and isinstance(addresses[1], int)):
        addrs: list[Address] = [addresses]
    else:
        addrs = list(addresses)
    attempts: list[tuple[str, str]] = []
    for addr in addrs:
        text = _address_text(addr)
        try:
            _parse_address(addr)
        except ValueError as exc:
            attempts.append((text, f"bad address ({exc})"))
            continue
        client = FlowClient(name=name, state_dir=state_dir, request_timeout=request_timeout,
                            max_payload=max_payload, credentials=credentials,
                            on_disconnect=on_disconnect)
        try:
            await client._open(addr, timeout)
            return client
        except TimeoutError:
            stage = "no HELLO from it" if client._transport is not None else "TCP connect"
            why = f"timed out after {timeout:g}s ({stage})"
        except ConnectionLost as exc:
            why = exc.reason
        except socket.gaierror as exc:
            why = f"cannot resolve the host name ({exc.strerror or exc})"
        except OSError as exc:
            # asyncio words a refusal as "Connect call failed (addr)": say what errno says
            why = (os.strerror(exc.errno).lower() if exc.errno else str(exc)) \
                or type(exc).__name__
        log.info("flow router %s: %s", text, why)
        attempts.append((text, why))
    raise ConnectError(attempts)

__all__ = ["FlowClient", "connect", "listen_mask", "DEFAULT_REQUEST_TIMEOUT"]
