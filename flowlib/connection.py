"""The connection layer of the flow client: one router link at a time, its handshake, its
state (up, failing over, lost for good) and the writing of control frames.

:class:`Connection` is the bottom of the client's layers (:mod:`flowlib.client` lists them);
the layers above extend its hooks: ``_on_flow_control`` (join acks and GC pings),
``_deliver`` (data frames), ``_link_lost_cleanup`` and ``_after_link_lost`` (what losing the
link means to them) and ``_release_all`` (failing what waits when the client is done).

* **Handshake.** Both sides open the link with a HELLO on the link-local flow. The router's
  HELLO tells us its name, the largest payload it takes, and the LSID it suggests for new
  flows. An ERROR instead means the router refuses us. With a link key both sides then prove
  they hold it (AUTH) and may switch to sealed records.

Imports asyncio, socket and the wire layer of flowrouter.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_GC, BAND_MEMBERSHIP
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import MalformedFrame, pack_header

from .checks import Address, address_text, parse_router_address
from .errors import ConnectionLost, FailoverInProgress, FlowError
from .link import Link, SealingTransport

log = logging.getLogger("flowlib")

LINK_KEY = LINK_LOCAL_FLOW.key
_ZERO_LSID = b"\0\0\0\0"

#: How long a JOIN may stay unanswered by default. A router gives up on an unanswered upstream
#: join after its ``join_timeout`` (5 s by default) but only notices when its incremental GC
#: visits the entry (about once per epoch), so its TIMEOUT answer can take two of those.
DEFAULT_REQUEST_TIMEOUT = 15.0

DisconnectHook = Callable[[FlowError | None], Any]


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


def requires_auth(credentials: bytes) -> bool:
    from flowrouter.wire.linkauth import FLAG_REQUIRE_ENDPOINTS, AuthError, parse_hello_credentials

    try:
        return bool(parse_hello_credentials(credentials).flags & FLAG_REQUIRE_ENDPOINTS)
    except AuthError:
        return False


class Connection:
    """The router link and its life cycle; the base of :class:`flowlib.client.FlowClient`."""

    def _init_connection(self, *, name: str, request_timeout: float, max_payload: int,
                         credentials: bytes, on_disconnect: DisconnectHook | None,
                         addresses: Sequence[Address], connect_timeout: float, failover: bool,
                         link_key: tuple[str, str | bytes] | None, encrypt: bool) -> None:
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
        self.name = name
        #: node ID sent in our HELLO; random per client (endpoints need no stable identity,
        #: the FlowID creator ID is what must be stable and that lives in the state dir)
        self.node_id = secrets.randbits(64) or 1
        self.request_timeout = request_timeout
        #: called once when the client is disconnected for good: with ConnectionLost, or
        #: None after close()
        self.on_disconnect = on_disconnect
        #: counters of things worth seeing that are not errors (unwanted frames, ...)
        self.counters: Counter[str] = Counter()
        self._own_max_payload = max_payload
        self._credentials = credentials
        # --- the routers (the failover layer moves between them)
        self._addresses: list[Address] = list(addresses)
        self._addr_index = 0
        self.connect_timeout = connect_timeout
        self._failover = failover
        #: loop time the current failover began (None when not failing over)
        self._failing_since: float | None = None
        # --- the current link
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link: Link | None = None
        self._transport: asyncio.Transport | None = None
        self._hello: asyncio.Future[C.Hello] | None = None
        self._attempt_stage = "TCP connect"
        self._up = False  # a link is established (HELLO exchanged)
        self._up_event = asyncio.Event()
        self._gen = 0  # bumped at every established link
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # --- lifecycle
        self._closing = False  # close() was called
        self._lost = False  # disconnected for good
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
        """Connect and handshake with one router, or raise."""
        host, port = parse_router_address(addr)
        text = address_text(addr)
        loop = self._loop = asyncio.get_running_loop()
        link = Link(self, text)
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
            return attempt_failure(exc, timeout, self._attempt_stage)
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
        transport.writelines([C.hello_header(len(hello)), hello])  # announces our features

    def _protocol_error(self, link: Link, reason: str) -> None:
        """The router sent something we cannot trust: drop the link, say why."""
        log.warning("router %s: %s; closing the link", link.address, reason)
        self._fail(link, reason)

    def _fail(self, link: Link, reason: str) -> None:
        link.dead = True
        if link.reason is None:
            link.reason = reason
        hello = self._hello
        if self._link is link and hello is not None and not hello.done():
            hello.set_exception(ConnectionLost(reason))
        if link.transport is not None:
            link.transport.abort()

    def _connection_lost(self, link: Link, exc: Exception | None) -> None:
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
        self._link_lost_cleanup()
        self._after_link_lost(link, reason)

    def _link_lost_cleanup(self) -> None:
        """The link is gone (not necessarily for good): drop what belonged to it. Each layer
        adds its own part and calls up."""
        self._paused = False
        self._release_drain_waiters()

    def _after_link_lost(self, link: Link, reason: str) -> None:
        """Decide what losing the link means; the failover layer may look for another
        router instead."""
        if self._closing:
            self._finish(self._close_reason or "the client was closed", user=True)
        else:
            self._finish(reason, user=False)

    def _finish(self, reason: str, user: bool) -> None:
        """The client is disconnected for good: wake and fail everything that waits."""
        if self._lost:
            return
        self._lost = True
        self._up = False
        self._close_reason = reason
        self._failing_since = None
        self._release_all(reason, user)
        self._up_event.set()  # wakes senders waiting out a failover: they see the end
        self._closed_event.set()
        if not user:
            log.warning("lost the flow router %s: %s", self.address, reason)
        self._call_hook(self.on_disconnect, None if user else ConnectionLost(reason),
                        "on_disconnect")

    def _release_all(self, reason: str, user: bool) -> None:
        """Fail everything that waits on the connection (*user*: close() was called). Each
        layer adds its own waiters and calls up."""
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(ConnectionLost(reason))

    def _call_hook(self, hook: Callable[[Any], Any] | None, arg: Any, what: str) -> None:
        if hook is None:
            return
        try:
            result = hook(arg)
            if inspect.isawaitable(result):
                asyncio.ensure_future(result)
        except Exception:  # the hook is the application's; its bug must not break ours
            log.exception("%s hook raised", what)

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
        return [address_text(a) for a in self._addresses]

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

    # ------------------------------------------------------------------ control frames
    def _on_control(self, link: Link, header: memoryview, payload: memoryview) -> None:
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
        except C.UnknownControlType:
            # a newer router's message: counted and ignored (flowrouter.wire.control)
            self.counters["control.unknown-type"] += 1
            return
        except MalformedFrame as exc:
            self._protocol_error(link, f"malformed control message: {exc}")
            return
        if link_local:
            if isinstance(msg, C.Hello):
                link.router_features = C.hello_features(header)
            self._on_link_control(link, msg)
            return
        hello = self._hello
        if hello is None or not hello.done():
            self._protocol_error(link, "the router sent flow traffic before its HELLO")
            return
        self._on_flow_control(key, band, msg)

    def _on_flow_control(self, key: bytes, band: int, msg: C.ControlMessage) -> None:
        """A control message on a flow (the membership layer answers acks and pings)."""
        self.counters[f"control.ignored.{type(msg).__name__.lower()}"] += 1

    def _deliver(self, header: memoryview, payload: memoryview) -> None:
        """A data frame (band >= 16); the receiving layer hands it to listeners."""
        self.counters["drop.no-listener"] += 1

    def _on_link_control(self, link: Link, msg: C.ControlMessage) -> None:
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
            elif self._auth is None and msg.credentials and requires_auth(msg.credentials):
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
                self._write_control(LINK_KEY, BAND_MEMBERSHIP, C.Auth(proof))
            else:
                link.codec.end_handshake()
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

                link.codec.start_sealed(SecureStream(cipher))
                self._transport = SealingTransport(  # type: ignore[assignment]
                    self._transport, link.codec)
            link.codec.end_handshake()
            hello.set_result(self._auth_hello)
            return
        if hello is None or not hello.done():
            self._protocol_error(link, f"expected HELLO, got {type(msg).__name__}")
            return
        self.counters[f"control.ignored.{type(msg).__name__.lower()}"] += 1
