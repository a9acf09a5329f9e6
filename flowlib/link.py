"""One TCP connection to a flow router, as the asyncio protocol that reads it.

:class:`Link` turns bytes into frames with a
:class:`~flowrouter.wire.streamcodec.StreamCodec` (the stream reader the routers use too:
handshake frames, then sealed records or plain frames) and hands them to its client's
handlers; :class:`SealingTransport` seals every write once the link is encrypted. The
decisions (what a frame means, when the link is up or lost) are the client's
(:mod:`flowlib.connection`). Imports asyncio, socket and the wire layer of flowrouter.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any

from flowrouter.wire.bands import ROUTER_BANDS_END
from flowrouter.wire.header import MalformedFrame
from flowrouter.wire.streamcodec import BadRecord, StreamCodec

if TYPE_CHECKING:
    from .connection import Connection


class SealingTransport:
    """The link's transport once it is encrypted: every write becomes one sealed record
    (header and payload are joined for sealing anyway); everything else passes through."""

    def __init__(self, inner: Any, codec: StreamCodec) -> None:
        self._inner = inner
        self._codec = codec

    def write(self, data: Any) -> None:
        self._inner.write(self._codec.send_data(data))

    def writelines(self, buffers: Any) -> None:
        self._inner.write(self._codec.send_data(b"".join(buffers)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Link(asyncio.Protocol):
    """One TCP connection's receive path: bytes -> frames -> the client's handlers.

    A client makes a new one per connection attempt; callbacks from any link but the client's
    current one are ignored, so a failed attempt or a dead link can never disturb the next.
    """

    def __init__(self, client: Connection, address: str) -> None:
        self.client = client
        self.address = address
        #: bytes -> frames: the handshake, then sealed records or plain frames (the client
        #: ends the handshake, or installs keys, when the router's HELLO or AUTH says so)
        self.codec = StreamCodec(client._own_max_payload)
        self.transport: asyncio.Transport | None = None
        self.router_name = ""
        #: the feature bits of the router's HELLO (flowrouter.wire.control.FEATURES): no
        #: soft-state message goes to a router that does not announce them
        self.router_features = 0
        #: we gave up on this link (protocol error, refusal): stop reading it
        self.dead = False
        #: why this link ended, when we ended it
        self.reason: str | None = None
        #: reads so far: the soft-state layer's sign of life from the router (one increment
        #: per read, not per frame)
        self.reads = 0

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # duck-typed: uvloop's transports are not asyncio.Transport subclasses (an isinstance
        # check here made `flowrouter --uvloop demo` time out)
        transport: Any = base
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

    @property
    def secure(self) -> Any:
        """The record layer once the link is encrypted (None on a plain link)."""
        return self.codec.sealed

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        client = self.client
        if self.dead or client._link is not self:
            return
        deliver = client._deliver
        try:
            for header, payload in self.codec.receive_data(data):
                if header[20] >= ROUTER_BANDS_END:
                    deliver(header, payload)
                else:
                    client._on_control(self, header, payload)
                if self.dead:
                    return
        except BadRecord as exc:
            client._protocol_error(self, f"bad sealed record from the router: {exc.detail}")
        except MalformedFrame as exc:
            client._protocol_error(self, f"malformed frame from the router: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._connection_lost(self, exc)

    def pause_writing(self) -> None:
        if self.client._link is self:
            self.client._paused = True

    def resume_writing(self) -> None:
        if self.client._link is self:
            self.client._resume_writing()
