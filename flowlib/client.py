"""The asyncio flow client: a TCP link to a flow router (failing over to another router when
that one dies), flows joined and sent to over it.

How the pieces map onto the protocol (DESIGN.md sections 2-4, 7 and 12):

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
* **Failover** (seed 002, 4.1.2 leaves it open). With several router addresses (or
  ``failover=True``), losing the link for any reason but :meth:`FlowClient.close` makes the
  client connect to the next router of its list that answers (round robin starting after the
  lost one; each round tries every address once, rounds are separated by an exponential
  back-off from ``reconnect_min`` to ``reconnect_max``), then re-send every flow's JOIN (with
  the listeners' union mask and the advertisement flag), so the new router grafts us onto each
  tree. Listeners stay open and readers keep waiting; each flow's listeners on the fault band
  get a local FAILOVER notice naming both routers and the gap. Only when no router answered
  for ``failover_timeout`` seconds does the client give up: then everything fails with
  :class:`~flowlib.errors.ConnectionLost`, exactly as a single-router client does at once.
  During the gap ``send_nowait`` raises :class:`~flowlib.errors.FailoverInProgress`,
  ``send`` waits (at most ``failover_send_timeout``), and ``listen``/``advertise`` wait (at
  most their request time-out). Messages in flight on the lost link are lost (flows are best
  effort); a fragmented message interrupted by a failover is sent again whole.
  With failover on, the socket also gets TCP keep-alives, so a router *host* that vanishes
  without closing the connection is noticed in about 11 s.
* **Large messages.** A payload larger than the router's maximum is fragmented and
  reassembled by receiving clients (:mod:`flowlib.fragment` documents the format and bounds).
* **Notices.** Receive-queue overflows and dropped large messages are reported by local,
  rate-limited notices on the overflow band (:mod:`flowlib.notices`).

The receive path is an :class:`asyncio.Protocol` fed by a
:class:`~flowrouter.wire.header.FrameDecoder` (no stream-reader task, no per-frame await), and
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.address import parse_address
from flowrouter.wire.bands import (
    BAND_FAULT,
    BAND_GC,
    BAND_MEMBERSHIP,
    BAND_OVERFLOW,
    DEFAULT_DATA_BAND,
    NUM_BANDS,
    ROUTER_BANDS_END,
    BandMask,
    mask_of,
)
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID, LocalIdAllocator
from flowrouter.wire.header import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_TTL,
    MAX_TTL,
    FrameDecoder,
    Locality,
    MalformedFrame,
    pack_header,
    take_frame,
)

from .errors import (
    ConnectError,
    ConnectionLost,
    FailoverInProgress,
    FlowError,
    FlowTimeout,
    JoinRefused,
    ListenerClosed,
    MessageTooLarge,
)
from .fragment import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_REASSEMBLY_BYTES,
    DEFAULT_REASSEMBLY_TIMEOUT,
    ESCAPE_PREFIX,
    ESCAPE_SIZE,
    FRAGMENT_HEADER_SIZE,
    KIND_ESCAPE,
    KIND_FRAGMENT,
    MAGIC,
    FragmentDropped,
    Reassembler,
    iter_fragments,
    needs_escape,
)
from .message import Message
from .notices import (
    DEFAULT_NOTICE_EVERY,
    DEFAULT_NOTICE_INTERVAL,
    NoticeLimiter,
    failover_fault,
    overflow_fault,
)
from .queue import DEFAULT_QUEUE_SIZE, Listener, Overflow

log = logging.getLogger("flowlib")

_LINK_KEY = LINK_LOCAL_FLOW.key
_ZERO_LSID = b"\0\0\0\0"
_ROUTER_BANDS_MASK = (1 << ROUTER_BANDS_END) - 1
_FAULT_BIT = 1 << BAND_FAULT
_OVERFLOW_BIT = 1 << BAND_OVERFLOW

#: How long a JOIN may stay unanswered by default. A router gives up on an unanswered upstream
#: join after its ``join_timeout`` (5 s by default) but only notices when its incremental GC
#: visits the entry (about once per epoch), so its TIMEOUT answer can take two of those.
DEFAULT_REQUEST_TIMEOUT = 15.0
#: How long a client keeps trying its routers after losing one before it gives up.
DEFAULT_FAILOVER_TIMEOUT = 30.0
DEFAULT_RECONNECT_MIN = 0.05  #: back-off after the first round of failed attempts (seconds)
DEFAULT_RECONNECT_MAX = 2.0  #: longest back-off between rounds (seconds)

Address = str | tuple[str, int]
BandsSpec = BandMask | Iterable[int] | int | str
LocalitySpec = tuple[Locality | int | str, int] | None
DisconnectHook = Callable[[FlowError | None], Any]


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """One completed failover, as given to ``on_failover`` and kept in ``last_failover``."""

    old_router: str
    old_address: str
    new_router: str
    new_address: str
    reason: str  #: why the old link ended
    reconnect_ms: float  #: from noticing the loss to the new router's HELLO
    attempts: tuple[tuple[str, str], ...]  #: failed attempts before success: (address, why)


FailoverHook = Callable[[FailoverEvent], Any]


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


def _attempt_failure(exc: BaseException, timeout: float, stage: str) -> str:
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


def _check_payload(payload: Any) -> tuple[bytes | bytearray | memoryview, int]:
    if isinstance(payload, str):
        raise TypeError("payload must be bytes-like, not str (encode it first)")
    if isinstance(payload, memoryview):
        if not payload.contiguous:
            raise ValueError("payload memoryview must be contiguous")
        if payload.ndim != 1 or payload.itemsize != 1:
            payload = payload.cast("B")
        return payload, payload.nbytes
    if isinstance(payload, (bytes, bytearray)):
        return payload, len(payload)
    raise TypeError(f"payload must be bytes-like, not {type(payload).__name__}")


class _SealingTransport:
    """The link's transport once it is encrypted: every write becomes one sealed record
    (header and payload are joined for sealing anyway); everything else passes through."""

    def __init__(self, inner: Any, secure: Any) -> None:
        self._inner = inner
        self._secure = secure

    def write(self, data: Any) -> None:
        self._inner.write(self._secure.encode(data))

    def writelines(self, buffers: Any) -> None:
        self._inner.write(self._secure.encode(b"".join(buffers)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _requires_auth(credentials: bytes) -> bool:
    from flowrouter.wire.linkauth import FLAG_REQUIRE_ENDPOINTS, AuthError, parse_hello_credentials

    try:
        return bool(parse_hello_credentials(credentials).flags & FLAG_REQUIRE_ENDPOINTS)
    except AuthError:
        return False


def _set_capability(fs: _FlowState, capability: Any) -> None:
    if capability is None:
        return
    raw = capability.encode() if hasattr(capability, "encode") else bytes(capability)
    if len(raw) > 0xFFFF:
        raise ValueError("a capability token is at most 65535 bytes")
    fs.capability = raw


class _FlowState:
    """What this client holds on one flow: its listeners and whether it advertises it."""

    __slots__ = ("flow", "listeners", "advertised", "adv_locality", "on_router", "sent_mask",
                 "notices", "capability")

    def __init__(self, flow: FlowID) -> None:
        self.flow = flow
        self.listeners: list[Listener] = []
        self.advertised = False
        self.adv_locality: tuple[int, int] = (0, 0)
        #: the router has (or is being asked to make) state for our link on this flow
        self.on_router = False
        #: the mask of the last JOIN we sent
        self.sent_mask: int | None = None
        #: rate limiter of this flow's dropped-large-message notices
        self.notices: NoticeLimiter | None = None
        #: capability token presented with every JOIN of this flow (flows under a policy)
        self.capability = b""

    def mask(self) -> int:
        bits = 0
        for lst in self.listeners:
            bits |= lst._mask
        return bits

    @property
    def wanted(self) -> bool:
        return bool(self.listeners) or self.advertised


class _Link(asyncio.Protocol):
    """One TCP connection's receive path: bytes -> frames -> the client's handlers.

    A client makes a new one per connection attempt; callbacks from any link but the client's
    current one are ignored, so a failed attempt or a dead link can never disturb the next.
    """

    def __init__(self, client: FlowClient, address: str) -> None:
        self.client = client
        self.address = address
        self.decoder = FrameDecoder(client._own_max_payload)
        self.transport: asyncio.Transport | None = None
        self.router_name = ""
        #: the handshake's bytes, parsed one frame at a time: after the router's AUTH the
        #: rest of the stream may be sealed records (None once the handshake is over)
        self.hs: bytearray | None = bytearray()
        #: the record layer once the link is encrypted
        self.secure: Any = None
        #: we gave up on this link (protocol error, refusal): stop reading it
        self.dead = False
        #: why this link ended, when we ended it
        self.reason: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        client = self.client
        if client._link is not self:
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if client._failover:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                    for opt, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2),
                                       ("TCP_KEEPCNT", 3)):
                        if hasattr(socket, opt):
                            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
            except OSError:
                pass
        client._connection_made(transport)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if self.dead or client._link is not self:
            return
        if self.secure is not None:
            from flowrouter.wire.linkauth import LinkSecurityError

            try:
                chunks = self.secure.decode(data)
            except LinkSecurityError as exc:
                client._protocol_error(self, f"bad sealed record from the router: {exc}")
                return
            for chunk in chunks:
                self._frames(chunk)
                if self.dead:
                    return
            return
        if self.hs is not None:
            self._handshake_bytes(data)
            return
        self._frames(data)

    def _handshake_bytes(self, data: bytes) -> None:
        client = self.client
        buf = self.hs
        assert buf is not None
        buf += data
        while True:
            try:
                frame = take_frame(buf, client._own_max_payload)
            except MalformedFrame as exc:
                client._protocol_error(self, f"malformed frame from the router: {exc}")
                return
            if frame is None:
                return
            self._frames(frame)
            if self.dead:
                return
            hello = client._hello
            if self.secure is not None or (hello is not None and hello.done()):
                rest = bytes(buf)
                self.hs = None
                if rest:
                    self.data_received(rest)
                return

    def _frames(self, data: bytes) -> None:
        client = self.client
        try:
            frames = self.decoder.feed(data)
        except MalformedFrame as exc:
            client._protocol_error(self, f"malformed frame from the router: {exc}")
            return
        deliver = client._deliver
        for header, payload in frames:
            if header[20] >= ROUTER_BANDS_END:
                deliver(header, payload)
            else:
                client._on_control(self, header, payload)
            if self.dead:
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._connection_lost(self, exc)

    def pause_writing(self) -> None:
        if self.client._link is self:
            self.client._paused = True

    def resume_writing(self) -> None:
        if self.client._link is self:
            self.client._resume_writing()


class FlowClient:
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
                 encrypt: bool = False) -> None:
        self._encrypt = encrypt
        if encrypt and link_key is None:
            raise ValueError("encrypt=True needs a link_key (the keys come from it)")
        self._keyring: Any = None
        self._key_id: str | None = None
        if link_key is not None:
            from flowrouter.wire.linkauth import KeyRing, parse_secret

            key_id, secret = link_key
            raw = secret if isinstance(secret, bytes) else parse_secret(secret)
            self._keyring, self._key_id = KeyRing({key_id: raw}, key_id), key_id
        #: the link's authenticator while a handshake with link_key is in progress
        self._auth: Any = None
        self._auth_hello: C.Hello | None = None
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
        self.name = name
        #: node ID sent in our HELLO; random per client (endpoints need no stable identity,
        #: the FlowID creator ID is what must be stable and that lives in the state dir)
        self.node_id = secrets.randbits(64) or 1
        self.request_timeout = request_timeout
        #: called once when the client is disconnected for good: with ConnectionLost, or
        #: None after close()
        self.on_disconnect = on_disconnect
        #: called after each successful failover with a :class:`FailoverEvent`
        self.on_failover = on_failover
        #: counters of things worth seeing that are not errors (unwanted frames, ...)
        self.counters: Counter[str] = Counter()
        self._state_path = Path(state_dir) / "creator" if state_dir is not None else None
        self._own_max_payload = max_payload
        self._credentials = credentials
        self._allocator: LocalIdAllocator | None = None
        self._alloc_lock = asyncio.Lock()
        # --- the routers and failover
        self._addresses: list[Address] = list(addresses)
        self._addr_index = 0
        self.connect_timeout = connect_timeout
        self._failover = failover
        self.failover_timeout = failover_timeout
        self.failover_send_timeout = failover_send_timeout
        self.reconnect_min = reconnect_min
        self.reconnect_max = max(reconnect_max, reconnect_min)
        self._failover_task: asyncio.Task[None] | None = None
        self._failing_since: float | None = None
        self._resync_tasks: set[asyncio.Task[None]] = set()
        #: completed failovers, and the last one
        self.failovers = 0
        self.last_failover: FailoverEvent | None = None
        # --- the current link
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link: _Link | None = None
        self._transport: asyncio.Transport | None = None
        self._hello: asyncio.Future[C.Hello] | None = None
        self._attempt_stage = "TCP connect"
        self._up = False  # a link is established (HELLO exchanged)
        self._up_event = asyncio.Event()
        self._gen = 0  # bumped at every established link
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # --- requests
        self._flows: dict[bytes, _FlowState] = {}
        self._pending: dict[int, tuple[bytes, asyncio.Future[C.JoinAck]]] = {}
        #: requests in flight when a link was lost; answered by the re-join after failover
        self._carried: dict[int, tuple[bytes, asyncio.Future[C.JoinAck]]] = {}
        self._next_req = 1
        self._listener_seq = 0
        # --- lifecycle
        self._closing = False  # close() was called
        self._lost = False  # disconnected for good
        self._close_reason: str | None = None
        self._closed_event = asyncio.Event()
        # --- large messages
        self.max_message_size = max_message_size
        self.fragment_size = fragment_size
        self._origin = secrets.randbits(64)
        self._next_msg_id = secrets.randbits(32)
        self._reasm = Reassembler(max_message_size, max_reassembly_bytes, reassembly_timeout)
        self._reasm_timer: asyncio.TimerHandle | None = None
        # --- notices
        self._notice_every = overflow_notice_every
        self._notice_interval = overflow_notice_interval
        # filled in from the router's HELLO
        self.address = ""
        self.router_name = ""
        self.router_node_id = 0
        self.max_payload = 0
        self.default_lsid = 0

    # ------------------------------------------------------------------ connection
    async def _open(self, addr: Address, timeout: float) -> None:
        """Connect and handshake with one router, or raise."""
        host, port = _parse_address(addr)
        text = _address_text(addr)
        loop = self._loop = asyncio.get_running_loop()
        link = _Link(self, text)
        hello_fut: asyncio.Future[C.Hello] = loop.create_future()
        self._link, self._hello, self._transport, self._paused = link, hello_fut, None, False
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: link, host, port)
                hello = await hello_fut
            if self._link is not link:  # lost right after its HELLO
                raise ConnectionLost(link.reason or f"router {hello.name} closed the "
                                                    f"connection during the handshake")
        except BaseException:
            self._attempt_stage = ("no HELLO from it" if link.transport is not None
                                   else "TCP connect")
            link.dead = True
            if link.transport is not None:
                link.transport.abort()
            if self._link is link:
                self._link = None
                self._transport = None
            if hello_fut.done() and not hello_fut.cancelled():
                hello_fut.exception()  # retrieved: the caller reports it
            raise
        link.router_name = hello.name
        self.address = text
        self.router_name = hello.name
        self.router_node_id = hello.node_id
        self.max_payload = hello.max_payload
        self.default_lsid = hello.default_lsid
        self._up = True
        self._gen += 1
        self._up_event.set()
        log.info("connected to flow router %r at %s (max payload %d, default LSID %#x)",
                 hello.name, self.address, hello.max_payload, hello.default_lsid)

    async def _try_open(self, addr: Address, timeout: float) -> str | None:
        """:meth:`_open`, returning None on success or why it failed."""
        try:
            await self._open(addr, timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _attempt_failure(exc, timeout, self._attempt_stage)
        return None

    def _connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        creds = self._credentials
        self._auth = self._auth_hello = None
        if self._keyring is not None:
            from flowrouter.wire.linkauth import LinkAuthenticator

            self._auth = LinkAuthenticator(self._keyring, my_name=self.name,
                                           my_role=C.Role.ENDPOINT, key_id=self._key_id,
                                           encrypt=self._encrypt)
            creds = self._auth.hello_credentials()
        hello = C.Hello(self.node_id, C.Role.ENDPOINT, self.name, self._own_max_payload,
                        0, creds).encode()
        transport.writelines([pack_header(_LINK_KEY, len(hello), BAND_MEMBERSHIP), hello])

    def _protocol_error(self, link: _Link, reason: str) -> None:
        """The router sent something we cannot trust: drop the link, say why."""
        log.warning("router %s: %s; closing the link", link.address, reason)
        self._fail(link, reason)

    def _fail(self, link: _Link, reason: str) -> None:
        link.dead = True
        if link.reason is None:
            link.reason = reason
        hello = self._hello
        if self._link is link and hello is not None and not hello.done():
            hello.set_exception(ConnectionLost(reason))
        if link.transport is not None:
            link.transport.abort()

    def _connection_lost(self, link: _Link, exc: Exception | None) -> None:
        if link is not self._link:
            return  # an abandoned attempt, or a link we already replaced
        self._link = None
        self._transport = None
        reason = link.reason or (
            f"{exc}" if exc else f"router {link.router_name or link.address} closed the "
                                 f"connection")
        hello = self._hello
        if hello is not None and not hello.done():
            hello.set_exception(ConnectionLost(reason))  # a failed attempt: _open raises
            return
        if not self._up:
            return
        self._up = False
        self._up_event.clear()
        self._paused = False
        self._release_drain_waiters()
        for task in list(self._resync_tasks):
            task.cancel()
        for fs in self._flows.values():
            fs.on_router = False
            fs.sent_mask = None
        if self._closing:
            self._finish(self._close_reason or "the client was closed", user=True)
        elif self._failover and self._addresses:
            self._start_failover(link, reason)
        else:
            self._finish(reason, user=False)

    def _finish(self, reason: str, user: bool) -> None:
        """The client is disconnected for good: wake and fail everything that waits."""
        if self._lost:
            return
        self._lost = True
        self._up = False
        self._close_reason = reason
        task = self._failover_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self._failover_task = None
        self._failing_since = None
        for t in list(self._resync_tasks):
            t.cancel()
        if self._reasm_timer is not None:
            self._reasm_timer.cancel()
            self._reasm_timer = None

        def listener_error() -> FlowError:
            if user:
                return ListenerClosed("the flow client was closed")
            return ConnectionLost(reason)

        for fs in self._flows.values():
            for lst in fs.listeners:
                lst._close(listener_error)
        for table in (self._pending, self._carried):
            entries = list(table.values())
            table.clear()
            for _key, fut in entries:
                if not fut.done():
                    fut.set_exception(ConnectionLost(reason))
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(ConnectionLost(reason))
        self._up_event.set()  # wakes senders waiting out a failover: they see the end
        self._closed_event.set()
        if not user:
            log.warning("lost the flow router %s: %s", self.address, reason)
        self._call_hook(self.on_disconnect, None if user else ConnectionLost(reason),
                        "on_disconnect")

    def _call_hook(self, hook: Callable[[Any], Any] | None, arg: Any, what: str) -> None:
        if hook is None:
            return
        try:
            result = hook(arg)
            if inspect.isawaitable(result):
                asyncio.ensure_future(result)
        except Exception:  # the hook is the application's; its bug must not break ours
            log.exception("%s hook raised", what)

    # ------------------------------------------------------------------ failover
    def _start_failover(self, link: _Link, reason: str) -> None:
        assert self._loop is not None
        t0 = self._loop.time()
        self._failing_since = t0
        # requests in flight are answered by the re-join on the next router
        self._carried.update(self._pending)
        self._pending.clear()
        old_name = link.router_name or self.router_name
        self.counters["failover.started"] += 1
        log.warning("lost flow router %r at %s (%s); failing over (%d router address(es), "
                    "giving up after %gs)", old_name, link.address, reason,
                    len(self._addresses), self.failover_timeout)
        self._failover_task = asyncio.ensure_future(
            self._failover_loop(old_name, link.address, reason, t0))

    async def _failover_loop(self, old_name: str, old_address: str, reason: str,
                             t0: float) -> None:
        loop = asyncio.get_running_loop()
        n = len(self._addresses)
        start = (self._addr_index + 1) % n
        delay = self.reconnect_min
        failed: list[tuple[str, str]] = []
        rnd = 0
        while True:
            rnd += 1
            for k in range(n):
                left = self.failover_timeout - (loop.time() - t0)
                if left <= 0:
                    break
                idx = (start + k) % n
                addr = self._addresses[idx]
                text = _address_text(addr)
                why = await self._try_open(addr, min(self.connect_timeout, left))
                if why is None:
                    self._addr_index = idx
                    self._failover_task = None
                    self._failed_over(old_name, old_address, reason, t0, failed)
                    return
                log.info("failover round %d: router %s: %s", rnd, text, why)
                failed.append((text, why))
            left = self.failover_timeout - (loop.time() - t0)
            if left <= 0:
                break
            pause = min(delay, left)
            log.info("failover round %d: no router answered; next round in %.2fs", rnd, pause)
            await asyncio.sleep(pause)
            delay = min(delay * 2, self.reconnect_max)
        self._failover_task = None
        tail = "; ".join(f"{a}: {w}" for a, w in failed[-n:])
        self.counters["failover.gave-up"] += 1
        self._finish(f"lost router {old_name or old_address} ({reason}) and no router "
                     f"answered for {self.failover_timeout:g}s ({tail})", user=False)

    def _failed_over(self, old_name: str, old_address: str, reason: str, t0: float,
                     failed: list[tuple[str, str]]) -> None:
        assert self._loop is not None
        reconnect_ms = (self._loop.time() - t0) * 1000
        self._failing_since = None
        self.failovers += 1
        self.counters["failover.done"] += 1
        event = FailoverEvent(old_name, old_address, self.router_name, self.address, reason,
                              reconnect_ms, tuple(failed))
        self.last_failover = event
        log.warning("failed over from router %r (%s) to %r (%s) in %.1f ms; re-joining %d "
                    "flow(s)", old_name, old_address, self.router_name, self.address,
                    reconnect_ms, sum(1 for fs in self._flows.values() if fs.wanted))
        for fs in list(self._flows.values()):
            if fs.wanted:
                task = asyncio.ensure_future(self._rejoin(fs, event, t0))
                self._resync_tasks.add(task)
                task.add_done_callback(self._resync_tasks.discard)
        self._call_hook(self.on_failover, event, "on_failover")

    async def _rejoin(self, fs: _FlowState, event: FailoverEvent, t0: float) -> None:
        """Re-establish our membership of one flow on the new router, then tell its listeners.

        A refusal (e.g. the new router has not learned the way to the flow's location service
        yet) is retried with back-off until ``failover_timeout`` after the loss.
        """
        assert self._loop is not None
        loop = self._loop
        key = fs.flow.key
        gen = self._gen
        deadline = t0 + self.failover_timeout
        delay = 0.1
        last: C.JoinAck | None = None
        why = "no answer"
        while True:
            if self._gen != gen or not self._up:
                return  # lost this router too: the next failover re-joins
            if self._flows.get(key) is not fs or not fs.wanted:
                self._answer_carried(key, C.JoinAck(0, C.JoinStatus.OK))
                return
            req, fut = self._send_join(fs)
            try:
                ack: C.JoinAck | None = await asyncio.wait_for(
                    fut, max(0.1, min(self.request_timeout, deadline - loop.time())))
            except TimeoutError:
                ack = None
                why = "no answer to the re-join"
            finally:
                self._forget_req(req)
            if ack is not None and ack.status is C.JoinStatus.OK:
                gap_ms = (loop.time() - t0) * 1000
                self._answer_carried(key, ack)
                self.counters["failover.rejoined"] += 1
                self._local_notice(fs, BAND_FAULT, failover_fault(
                    self.name,
                    f"router {event.old_router} ({event.old_address}) lost ({event.reason}); "
                    f"failed over to router {event.new_router} ({event.new_address}); flow "
                    f"{fs.flow} resumed after a {gap_ms:.1f} ms gap",
                    state="resumed", flow=fs.flow, old=event.old_router,
                    old_address=event.old_address, new=event.new_router,
                    new_address=event.new_address, reason=event.reason,
                    reconnect_ms=f"{event.reconnect_ms:.1f}", gap_ms=f"{gap_ms:.1f}"))
                return
            if ack is not None:
                last = ack
                why = f"{ack.status.name}: {ack.reason}" if ack.reason else ack.status.name
                fs.on_router = False
            if loop.time() + delay >= deadline:
                break
            log.info("re-join of flow %s at router %r failed (%s); retrying in %.1fs",
                     fs.flow, self.router_name, why, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        gap_ms = (loop.time() - t0) * 1000
        self.counters["failover.rejoin-failed"] += 1
        log.warning("flow %s: could not re-join at router %r after the failover: %s", fs.flow,
                    self.router_name, why)
        self._answer_carried(key, last or C.JoinAck(0, C.JoinStatus.TIMEOUT, why))
        self._local_notice(fs, BAND_FAULT, failover_fault(
            self.name,
            f"router {event.old_router} ({event.old_address}) lost ({event.reason}); failed "
            f"over to router {event.new_router} ({event.new_address}), but flow {fs.flow} "
            f"could not be re-joined there: {why}",
            state="rejoin-failed", flow=fs.flow, old=event.old_router,
            old_address=event.old_address, new=event.new_router,
            new_address=event.new_address, reason=event.reason,
            reconnect_ms=f"{event.reconnect_ms:.1f}", gap_ms=f"{gap_ms:.1f}", error=why))

    def _answer_carried(self, key: bytes, ack: C.JoinAck) -> None:
        """Answer the requests on *key* that were in flight when the old link died."""
        for req, (k, fut) in list(self._carried.items()):
            if k == key:
                del self._carried[req]
                if not fut.done():
                    fut.set_result(ack)

    def _forget_req(self, req: int) -> None:
        self._pending.pop(req, None)
        self._carried.pop(req, None)

    # ------------------------------------------------------------------ state
    @property
    def closed(self) -> bool:
        """True once the client is disconnected for good (lost or closed)."""
        return self._lost or self._closing

    @property
    def connected(self) -> bool:
        """True while a router link is up (False during a failover and once closed)."""
        return self._up and not self._closing

    @property
    def failing_over(self) -> bool:
        """True while the client looks for a new router after losing one."""
        return self._failing_since is not None and not self.closed

    @property
    def addresses(self) -> list[str]:
        """The routers this client may use, in order."""
        return [_address_text(a) for a in self._addresses]

    @property
    def close_reason(self) -> str | None:
        """Why the client was disconnected (None while it is usable)."""
        return self._close_reason if self.closed else None

    async def wait_closed(self) -> None:
        """Wait until the client is disconnected for good."""
        await self._closed_event.wait()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until a router link is up (returns at once when it is); raises
        :class:`~flowlib.errors.ConnectionLost` if the client is disconnected for good and
        :class:`~flowlib.errors.FailoverInProgress` if *timeout* passes first."""
        await self._ready(timeout)

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

    def _check_open(self) -> None:
        """Raise unless a router link is up right now (for calls that never wait)."""
        if self._lost or self._closing:
            raise ConnectionLost(self._close_reason or "the client was closed")
        if not self._up:
            raise self._failover_error("send() waits for the next router; send_nowait() "
                                       "does not")

    def _failover_error(self, hint: str = "") -> FailoverInProgress:
        since = 0.0
        if self._failing_since is not None and self._loop is not None:
            since = self._loop.time() - self._failing_since
        return FailoverInProgress(self.router_name or self.address, since, hint)

    async def _ready(self, timeout: float | None) -> None:
        """Return once a router link is up: at once, or after a failover (at most *timeout*
        seconds; None waits as long as the failover goes on)."""
        if self._lost or self._closing:
            raise ConnectionLost(self._close_reason or "the client was closed")
        if self._up:
            return
        if self._failing_since is None:
            raise ConnectionLost("the client is not connected")
        try:
            await asyncio.wait_for(self._up_event.wait(), timeout)
        except TimeoutError:
            raise self._failover_error(f"still not connected after waiting {timeout:g}s"
                                       ) from None
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
        self._release_drain_waiters()

    def _release_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _drain(self) -> None:
        """Wait while the link's write buffer is full (returns at once if the link is lost:
        what was buffered went with it)."""
        while self._paused and self._up:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter
        if self._lost or self._closing:
            raise ConnectionLost(self._close_reason or "the client was closed")

    # ------------------------------------------------------------------ flows
    async def create(self, lsid: int | None = None) -> FlowID:
        """Name a new flow: our creator ID, the LSID of its core, a never-reused local ID.

        No message goes to the network: a flow exists once someone advertises, listens or
        sends. The LSID defaults to the one the router suggested in its HELLO. Local IDs come
        from :class:`~flowrouter.wire.flowid.LocalIdAllocator`, persisted in ``state_dir`` (or
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
        self._write_control(key, BAND_MEMBERSHIP, C.Join(req, mask, flags, fs.capability),
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
            self._forget_req(req)

    def _sync_router(self, fs: _FlowState) -> tuple[int, asyncio.Future[C.JoinAck]] | None:
        """Bring the router's view of our membership in line with ``fs``.

        Returns the (request, future) of a JOIN if one was needed. A flow nobody here wants
        any more gets a LEAVE and is forgotten. Between routers (failover) only our own state
        changes; the re-join after the failover sends what is current then.
        """
        key = fs.flow.key
        if not fs.wanted:
            if fs.on_router and self._up and not self._closing:
                self._write_control(key, BAND_MEMBERSHIP, C.Leave())
            fs.on_router = False
            fs.sent_mask = None
            if self._flows.get(key) is fs:
                del self._flows[key]
                self._reasm.drop_flow(key)
            return None
        if not self._up or self._closing:
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
            self._forget_req(req)
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
        flow = _check_flow(flow)
        loc = _check_locality(locality)
        await self._ready(self.request_timeout if timeout is None else timeout)
        fs = self._flow_state(flow)
        _set_capability(fs, capability)
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

    def publish_policy(self, policy: Any) -> None:
        """Give the router a creator-signed flow policy
        (:class:`flowrouter.wire.capabilities.Policy` or its bytes); routers pass it to each
        other and keep it, so from then on joins and sends on the flows it covers need
        capabilities. Publishing a newer version replaces it (e.g. to revoke tokens)."""
        raw = policy.encode() if hasattr(policy, "encode") else bytes(policy)
        self._check_open()
        self._write_control(_LINK_KEY, BAND_MEMBERSHIP, C.PolicyMsg(raw))

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
        flow = _check_flow(flow)
        mask = listen_mask(bands)
        self._listener_seq += 1
        lst = Listener(flow, mask, size, overflow, name or f"listener-{self._listener_seq}")
        await self._ready(self.request_timeout if timeout is None else timeout)
        fs = self._flow_state(flow)
        _set_capability(fs, capability)
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
    def _plan(self, payload: bytes | bytearray | memoryview, size: int,
              fragment: bool | None) -> int:
        """How to send: 0 plain, -1 plain with the escape prefix, n > 0 in fragments of n
        data bytes. Raises MessageTooLarge."""
        escape = needs_escape(payload)
        wire = size + ESCAPE_SIZE if escape else size
        if fragment is None:
            fragment = wire > self.max_payload
        if not fragment or size == 0:
            if wire > self.max_payload:
                raise MessageTooLarge(size, self.max_payload)
            return -1 if escape else 0
        if size > self.max_message_size:
            raise MessageTooLarge(size, self.max_message_size, "max_message_size")
        limit = self.max_payload if self.fragment_size is None \
            else min(self.fragment_size, self.max_payload)
        data = limit - FRAGMENT_HEADER_SIZE
        if data < 1:
            raise MessageTooLarge(size, self.max_payload)
        return data

    def _new_msg_id(self) -> int:
        msg_id = self._next_msg_id
        self._next_msg_id = (msg_id + 1) & 0xFFFFFFFF
        return msg_id

    def _write(self, key: bytes, payload: bytes | bytearray | memoryview, size: int, plan: int,
               band: int, loc_type: int, loc_value: int, ttl: int) -> None:
        """Write a message that needs no waiting: plain, escaped, or all its fragments."""
        transport = self._transport
        assert transport is not None
        if plan == 0:
            transport.writelines([pack_header(key, size, band, loc_type, loc_value, ttl),
                                  payload])
        elif plan < 0:
            transport.writelines([pack_header(key, size + ESCAPE_SIZE, band, loc_type,
                                              loc_value, ttl), ESCAPE_PREFIX, payload])
        else:
            view = memoryview(payload)
            for fh, chunk in iter_fragments(view, self._origin, self._new_msg_id(), plan):
                transport.writelines([pack_header(key, len(fh) + len(chunk), band, loc_type,
                                                  loc_value, ttl), fh, chunk])
            self.counters["fragments.sent-messages"] += 1

    def send_nowait(self, flow: FlowID | str, payload: bytes | bytearray | memoryview,
                    band: int = DEFAULT_DATA_BAND, locality: LocalitySpec = None,
                    ttl: int = DEFAULT_TTL, *, fragment: bool | None = None) -> None:
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
        flow = _check_flow(flow)
        _check_data_band(band)
        loc_type, loc_value = _check_locality(locality)
        _check_ttl(ttl)
        payload, size = _check_payload(payload)
        if size > self.max_message_size:
            raise MessageTooLarge(size, self.max_message_size, "max_message_size")
        self._check_open()
        plan = self._plan(payload, size, fragment)
        self._write(flow.key, payload, size, plan, band, loc_type, loc_value, ttl)

    async def send(self, flow: FlowID | str, payload: bytes | bytearray | memoryview,
                   band: int = DEFAULT_DATA_BAND, locality: LocalitySpec = None,
                   ttl: int = DEFAULT_TTL, *, fragment: bool | None = None) -> None:
        """Like :meth:`send_nowait`, then wait while the link's write buffer is full, so a
        fast sender is slowed to what the router takes instead of growing memory.

        Large messages are sent fragment by fragment at the pace the link takes them. During
        a failover this waits for the next router (at most ``failover_send_timeout`` seconds
        if set, else as long as the failover lasts) and then raises
        :class:`~flowlib.errors.FailoverInProgress` or, if every router failed,
        :class:`~flowlib.errors.ConnectionLost`. A fragmented message cut by a failover is
        sent again whole on the new router.
        """
        flow = _check_flow(flow)
        _check_data_band(band)
        loc_type, loc_value = _check_locality(locality)
        _check_ttl(ttl)
        payload, size = _check_payload(payload)
        if size > self.max_message_size:
            raise MessageTooLarge(size, self.max_message_size, "max_message_size")
        if not self._up or self._closing:
            await self._ready(self.failover_send_timeout)
        plan = self._plan(payload, size, fragment)
        if plan <= 0:
            self._write(flow.key, payload, size, plan, band, loc_type, loc_value, ttl)
            if self._paused:
                await self._drain()
            return
        await self._send_fragments(flow.key, memoryview(payload), plan, fragment, band,
                                   loc_type, loc_value, ttl)

    async def _send_fragments(self, key: bytes, view: memoryview, fsize: int,
                              fragment: bool | None, band: int, loc_type: int, loc_value: int,
                              ttl: int) -> None:
        msg_id = self._new_msg_id()
        while True:
            gen = self._gen
            complete = True
            for fh, chunk in iter_fragments(view, self._origin, msg_id, fsize):
                if self._gen != gen or not self._up:
                    complete = False
                    break
                assert self._transport is not None
                self._transport.writelines([pack_header(key, len(fh) + len(chunk), band,
                                                        loc_type, loc_value, ttl), fh, chunk])
                if self._paused:
                    await self._drain()
            if complete and self._gen == gen and self._up:
                self.counters["fragments.sent-messages"] += 1
                return
            # The link changed under us: fragments may have died with it. Send the message
            # again on the new router; receivers ignore the fragments they already hold.
            self.counters["fragments.resent-messages"] += 1
            log.info("router link changed while sending a %d-byte message in fragments; "
                     "sending it again", len(view))
            await self._ready(self.failover_send_timeout)
            new_size = self._plan(view, len(view), True if fragment is None else fragment)
            if new_size != fsize:  # different router maximum: a differently cut message
                fsize, msg_id = new_size, self._new_msg_id()

    # ------------------------------------------------------------------ receiving
    def _deliver(self, header: memoryview, payload: memoryview) -> None:
        """A data frame (band >= 16): hand it to every listener whose mask has the band."""
        fs = self._flows.get(bytes(header[:16]))
        if fs is None:
            self.counters["drop.no-listener"] += 1
            return
        band = header[20]
        bit = 1 << band
        if payload and payload[0] == 0xFF and len(payload) > 4 and payload[:4] == MAGIC:
            kind = payload[4]
            if kind == KIND_FRAGMENT:
                self._on_fragment(fs, header, payload, band, bit)
                return
            if kind == KIND_ESCAPE:
                payload = payload[ESCAPE_SIZE:]
            else:
                self.counters["fragments.unknown-kind"] += 1  # delivered as it came
        msg: Message | None = None
        for lst in fs.listeners:
            if lst._mask & bit:
                if msg is None:
                    msg = Message(fs.flow, band, bytes(payload), header[21], header[22],
                                  header[23])
                if lst._put(msg) and self._notice_every is not None:
                    self._overflowed(fs, lst)
        if msg is None:
            self.counters["drop.no-listener"] += 1
        else:
            self.counters["received"] += 1

    def _on_fragment(self, fs: _FlowState, header: memoryview, payload: memoryview,
                     band: int, bit: int) -> None:
        for lst in fs.listeners:
            if lst._mask & bit:
                break
        else:
            self.counters["drop.no-listener"] += 1
            return
        assert self._loop is not None
        reasm = self._reasm
        try:
            data = reasm.feed(fs.flow.key, band, payload, self._loop.time())
        except FragmentDropped as exc:
            self.counters[f"fragments.{exc.reason}"] += 1
            log.info("flow %s band %d: dropped a fragmented message: %s", fs.flow, band,
                     exc.detail)
            self._reassembly_notice(fs, exc.reason, band, exc.detail, exc.origin, exc.msg_id,
                                    exc.total)
            return
        self.counters["fragments.received"] += 1
        if data is None:
            if reasm.partials and self._reasm_timer is None:
                self._schedule_sweep()
            return
        self.counters["fragments.messages"] += 1
        msg = Message(fs.flow, band, data, header[21], header[22], header[23])
        for lst in fs.listeners:
            if lst._mask & bit and lst._put(msg) and self._notice_every is not None:
                self._overflowed(fs, lst)
        self.counters["received"] += 1

    def _schedule_sweep(self) -> None:
        assert self._loop is not None
        self._reasm_timer = self._loop.call_later(max(0.02, self._reasm.timeout / 4),
                                                  self._sweep)

    def _sweep(self) -> None:
        """Drop incomplete messages that stopped receiving fragments (seed 000, 5.1)."""
        self._reasm_timer = None
        if self._lost or self._loop is None:
            return
        for ex in self._reasm.expire(self._loop.time()):
            self.counters["fragments.reassembly-timeout"] += 1
            fs = self._flows.get(ex.flow_key)
            detail = (f"incomplete message of {ex.total} bytes timed out with {ex.received} "
                      f"of {ex.count} fragments")
            log.info("flow %s band %d: %s", fs.flow if fs else "?", ex.band, detail)
            if fs is not None:
                self._reassembly_notice(fs, "reassembly-timeout", ex.band, detail, ex.origin,
                                        ex.msg_id, ex.total,
                                        fragments=f"{ex.received}/{ex.count}")
        if self._reasm.partials:
            self._schedule_sweep()

    # ------------------------------------------------------------------ local notices
    def _local_notice(self, fs: _FlowState, band: int, fault: C.Fault) -> None:
        """Deliver a notice of our own to this flow's listeners on *band* (never sent out).

        A full listener drops it like any message (counted), without a notice about that.
        """
        bit = 1 << band
        msg: Message | None = None
        for lst in fs.listeners:
            if lst._mask & bit:
                if msg is None:
                    msg = Message(fs.flow, band, fault.encode())
                lst._put(msg)
        self.counters[f"notices.{'fault' if band == BAND_FAULT else 'overflow'}"] += 1

    def _overflowed(self, fs: _FlowState, lst: Listener) -> None:
        """*lst* dropped a message: maybe notify (rate-limited, see :mod:`flowlib.notices`)."""
        assert self._loop is not None and self._notice_every is not None
        lim = lst._notices
        if lim is None:
            lim = lst._notices = NoticeLimiter(self._notice_every, self._notice_interval)
        n = lim.hit(self._loop.time())
        if not n:
            return
        self._local_notice(fs, BAND_OVERFLOW, overflow_fault(
            self.name, f"listener {lst.name} on flow {fs.flow} (bands {lst.mask}) dropped {n} "
                       f"message(s), {lst.dropped} in all (queue of {lst.size}, "
                       f"{lst.overflow.value})",
            reason="queue-full", flow=fs.flow, listener=lst.name, bands=lst.mask, dropped=n,
            total=lst.dropped, size=lst.size, policy=lst.overflow.value))

    def _reassembly_notice(self, fs: _FlowState, reason: str, band: int, detail: str,
                           origin: int, msg_id: int, total: int, **extra: object) -> None:
        if self._notice_every is None:
            return
        assert self._loop is not None
        lim = fs.notices
        if lim is None:
            lim = fs.notices = NoticeLimiter(1, self._notice_interval)
        n = lim.hit(self._loop.time())
        if not n:
            return
        self._local_notice(fs, BAND_OVERFLOW, overflow_fault(
            self.name, f"flow {fs.flow} band {band}: {detail}"
                       + (f" ({n} such drops since the last notice)" if n > 1 else ""),
            reason=reason, flow=fs.flow, band=band, dropped=n, sender=f"{origin:016x}",
            message=msg_id, bytes=total, **extra))

    # ------------------------------------------------------------------ control frames
    def _on_control(self, link: _Link, header: memoryview, payload: memoryview) -> None:
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
            self._protocol_error(link, f"malformed control message: {exc}")
            return
        if link_local:
            self._on_link_control(link, msg)
            return
        hello = self._hello
        if hello is None or not hello.done():
            self._protocol_error(link, "the router sent flow traffic before its HELLO")
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

    def _on_link_control(self, link: _Link, msg: C.ControlMessage) -> None:
        hello = self._hello
        if isinstance(msg, C.Error):
            self._fail(link, f"router refused us: {msg.text}")
            return
        if isinstance(msg, C.Hello):
            if hello is None or hello.done():
                self._protocol_error(link, "the router sent a second HELLO")
            elif msg.role is not C.Role.ROUTER:
                self._fail(link, f"the peer is not a flow router (it says it is an "
                                 f"{msg.role.name.lower()} named {msg.name!r})")
            elif self._auth is None and msg.credentials and _requires_auth(msg.credentials):
                self._fail(link, f"router {msg.name!r} requires applications to authenticate "
                                 "(link authentication); connect with link_key=(key_id, "
                                 "secret)")
            elif self._auth is not None:
                # Prove we hold the key; the router proves it too before we trust it.
                from flowrouter.wire.linkauth import AuthError

                try:
                    proof = self._auth.on_peer_hello(msg.name, msg.role, msg.credentials)
                except AuthError as exc:
                    self._fail(link, f"router {msg.name!r} failed link authentication: {exc}")
                    return
                self._auth_hello = msg
                self._write_control(_LINK_KEY, BAND_MEMBERSHIP, C.Auth(proof))
            else:
                hello.set_result(msg)
            return
        if isinstance(msg, C.Auth) and self._auth_hello is not None and hello is not None \
                and not hello.done():
            from flowrouter.wire.linkauth import AuthError

            try:
                self._auth.on_peer_auth(msg.body)
            except AuthError as exc:
                self._fail(link, f"router {self._auth_hello.name!r} failed link "
                                 f"authentication: {exc}")
                return
            cipher = self._auth.cipher()  # either side asked for encryption
            if cipher is not None:
                from flowrouter.wire.linkauth import SecureStream

                link.secure = SecureStream(cipher)
                self._transport = _SealingTransport(  # type: ignore[assignment]
                    self._transport, link.secure)
            hello.set_result(self._auth_hello)
            return
        if hello is None or not hello.done():
            self._protocol_error(link, f"expected HELLO, got {type(msg).__name__}")
            return
        self.counters[f"control.ignored.{type(msg).__name__.lower()}"] += 1


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
                  encrypt: bool = False) -> FlowClient:
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
    """
    _check_identity(name, credentials)
    if isinstance(addresses, str) or (isinstance(addresses, tuple) and len(addresses) == 2
                                      and isinstance(addresses[1], int)):
        addrs: list[Address] = [addresses]
    else:
        addrs = list(addresses)
    valid: list[Address] = []
    bad: dict[int, str] = {}
    for i, addr in enumerate(addrs):
        try:
            _parse_address(addr)
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
        encrypt=encrypt)
    attempts: list[tuple[str, str]] = []
    vi = 0
    for i, addr in enumerate(addrs):
        text = _address_text(addr)
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
           "DEFAULT_FAILOVER_TIMEOUT"]
