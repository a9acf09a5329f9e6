"""Datagram links to a router (``udp://host:port``): the UDP shell beside the TCP one.

The client protocol (:class:`~flowlib.protocol.ClientProtocol`) does not care how its
bytes travel, and neither does :class:`~flowlib.link.Link`, which drives it: it writes to a
transport and is told what was read. :class:`DatagramChannel` is that transport over a
connected UDP socket made with asyncio-dgram (``asyncio_dgram.connect``): what the link
writes (whole frames) is packed into numbered datagrams of one or more whole frames
(:mod:`flowrouter.wire.appdgram`), and each datagram read is checked and handed to the link
as its frames. So a datagram link has the TCP link's API, liveness (echoes, dead-after),
failover and handshake, link keys included; what differs:

* it loses instead of queueing: nothing is retransmitted but JOINs (an unanswered JOIN goes
  out again every :data:`JOIN_RESEND` seconds; the refresh digests repair the rest); a
  datagram the socket cannot take now is dropped, and gaps in the router's datagram
  numbers are counted (``client.counters["dgram.lost"]``), so under a constrained path a
  viewer loses pictures but never falls behind;
* link keys work as on TCP: the handshake proves both ends, and when either end asks for
  encryption every datagram after it is sealed alone (ChaCha20-Poly1305, an anti-replay
  window: a datagram may be lost or late, never forged, altered or replayed); a plain
  datagram is then taken only if it holds handshake repeats;
* until the handshake is over, what we sent in it (our HELLO, then our AUTH) is sent again
  every :data:`REPEAT` seconds, so a lost handshake datagram either way costs that, not a
  time-out; the router answers repeats of a HELLO (or AUTH) it took;
* the socket is connected: the kernel hands it only the router's datagrams, and a datagram
  that is not whole, valid frames (or fails its seal) is dropped alone
  (``dgram.refused.<why>``).

Imports asyncio, asyncio-dgram, the wire layer and flowlib's link.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter, deque
from typing import Any

import asyncio_dgram

from flowrouter.wire.appdgram import (
    MAX_PAYLOAD,
    DatagramPacker,
    DatagramSequence,
    frame_spans,
    open_datagram,
)
from flowrouter.wire.header import MalformedFrame

from .checks import Address
from .link import Link as _Link
from .link import open_link
from .protocol import ClientProtocol

log = logging.getLogger("flowlib")

#: seconds between repeats of our handshake datagrams until the handshake is over
REPEAT = 0.25
#: seconds after which an unanswered JOIN goes out again on a datagram link
JOIN_RESEND = 0.5
#: datagrams waiting for the socket at most; past it the oldest are dropped (counted)
SEND_QUEUE = 256
#: the socket buffers asked of the kernel (a burst of large messages must not overflow the
#: default ~200 KiB while the loop is busy; the kernel may grant less)
SOCKET_BUFFER = 4 << 20


class DatagramChannel:
    """A link's transport over a connected UDP socket (asyncio-dgram)."""

    def __init__(self, stream: Any, link: _Link, counters: Counter[str]) -> None:
        self.stream = stream
        self.link = link
        self.counters = counters
        self.packer = DatagramPacker()
        self._loop = asyncio.get_running_loop()
        self.rx = DatagramSequence()
        self._queue: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._ended = False
        #: what we sent during the handshake (our HELLO, then our AUTH), sent again until
        #: the handshake is over (the router's first datagram may be an echo, its HELLO lost)
        self._opening: list[bytes] | None = []
        self._tasks = [asyncio.ensure_future(self._read()), asyncio.ensure_future(self._write()),
                       asyncio.ensure_future(self._repeat())]

    # ------------------------------------------------------------------ the transport API
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.stream.peername
        if name == "sockname":
            return self.stream.sockname
        return default  # no TCP socket options to set

    def is_closing(self) -> bool:
        return self._closing

    def writelines(self, buffers: list[Any]) -> None:
        """Whole frames, back to back: packed into datagrams, sent in order."""
        packer = self.packer
        now = self._loop.time()
        packer.seal_with(self.link.protocol.datagram_cipher, now)
        datagrams = packer.pack(frame_spans(buffers), now)
        if self._opening is not None:
            self._opening += datagrams
        if self._closing:
            return
        queue = self._queue
        queue.extend(datagrams)
        while len(queue) > SEND_QUEUE:
            queue.popleft()
            self.counters["dgram.send-dropped"] += 1
        self._wake.set()

    def write(self, data: bytes) -> None:
        self.writelines([data])

    def close(self) -> None:
        """Close once what was written has been sent (the LEAVEs of a polite close)."""
        if self._closing:
            return
        self._closing = True
        self._tasks[0].cancel()
        self._tasks[2].cancel()
        self._wake.set()  # the writer sends what is queued, then ends the link

    def abort(self) -> None:
        self._closing = True
        for task in self._tasks:
            task.cancel()
        self._end()

    def _end(self, error: Exception | None = None) -> None:
        """The link is over: close the socket, tell the link (once)."""
        if self._ended:
            return
        self._ended = True
        self.stream.close()
        asyncio.get_running_loop().call_soon(self.link.connection_lost, error)

    # ------------------------------------------------------------------ tasks
    async def _read(self) -> None:
        link, counters, rx = self.link, self.counters, self.rx
        error: Exception | None = None
        try:
            while True:
                data, _addr = await self.stream.recv()
                try:
                    seq, frames = open_datagram(data, link.protocol.datagram_cipher)
                except MalformedFrame as exc:
                    counters[f"dgram.refused.{exc.reason}"] += 1
                    log.debug("router %s: datagram dropped: %s", link.address, exc)
                    continue
                lost = rx.seen(seq)
                if lost:
                    counters["dgram.lost"] += lost
                counters["dgram.received"] += 1
                link.data_received(bytes(frames))
                if self._opening is not None and link.protocol.hello is not None:
                    self._opening = None  # the handshake is over: no more repeats
        except asyncio.CancelledError:
            raise
        except asyncio_dgram.TransportClosed:
            pass
        except OSError as exc:  # e.g. ICMP port unreachable: no router listens there
            error = exc
        if not self._closing:
            self._closing = True
            for task in self._tasks[1:]:
                task.cancel()
            self._end(error)

    async def _write(self) -> None:
        queue, stream = self._queue, self.stream
        while True:
            await self._wake.wait()
            self._wake.clear()
            while queue:
                try:
                    await stream.send(queue.popleft())
                except OSError:
                    self.counters["dgram.send-errors"] += 1
                except asyncio_dgram.TransportClosed:
                    queue.clear()
                    break
                self.counters["dgram.sent"] += 1
            if self._closing:
                self._end()
                return

    async def _repeat(self) -> None:
        while self._opening is not None:
            await asyncio.sleep(REPEAT)
            if self._opening:
                self.counters["dgram.hello-repeated"] += 1
                self._queue.extend(self._opening)
                self._wake.set()


async def dial_datagram(link: _Link, host: str, port: int) -> None:
    """Connect a UDP socket to the router (asyncio-dgram) and give *link* its channel."""
    stream = await asyncio_dgram.connect((host, port))
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            stream.socket.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass  # the kernel's default then
    link.connection_made(DatagramChannel(stream, link,  # type: ignore[arg-type]
                                         link.protocol.counters))


async def open_datagram_link(addr: Address, protocol: ClientProtocol, timeout: float,
                             **kw: Any) -> _Link:
    """:func:`flowlib.link.open_link` over a datagram link (the same keywords)."""
    return await open_link(addr, protocol, timeout, dial=dial_datagram, what="UDP connect",
                           **kw)


__all__ = ["DatagramChannel", "dial_datagram", "open_datagram_link", "MAX_PAYLOAD", "REPEAT"]
