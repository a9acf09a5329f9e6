"""The asyncio shell around the sans-I/O router: sockets, timers, reconnects, control queries.

Everything protocol-shaped happens in :class:`flowrouter.core.router.Router`; this module only moves
bytes and time in and actions out:

* TCP links (routers and endpoints) use an :class:`asyncio.Protocol` per connection and a
  :class:`~flowrouter.wire.header.FrameDecoder`; frames are handed to the core as views into the
  received buffer and written with ``writelines([header, payload])``, so a forwarded payload is
  never copied by Python code.
* UDP links share one socket bound with asyncio-dgram; each remote address is a link. Sends use
  ``socket.sendmsg`` scatter/gather (again no copy); a full socket buffer is a counted drop.
* Each link's output goes straight to the transport until the transport pushes back (or the
  link is shaped for emulation); then frames wait in an :class:`~flowrouter.core.linkqueue.
  OutputQueue`: control first, data fair between flows (deficit round robin), bounded by
  ``max_link_buffer`` with drops taken from the longest flow queue, counted as
  ``drop.link-congested`` and announced on the flow's fault band. Each input link has a credit
  (``link_credit`` bytes waiting in output queues); past it the router stops reading from that
  neighbour, so TCP pushes back on the sender that causes the congestion and only on it.
* Link emulation (bandwidth, delay, loss per direction, and administrative down/up) happens
  here, so outage rehearsals need no kernel traffic control.
* Dialled peers are re-dialled with exponential back-off when their link drops.
* The control interface speaks JSON lines on TCP: ``{"cmd": "status"}`` returns the link table,
  flow table, LS routes and counters (``flowrouter status`` prints them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import time
from collections.abc import Callable
from typing import Any

import asyncio_dgram

from flowrouter.core.linkqueue import OutputQueue
from flowrouter.core.router import Action, Close, Router, Secure, Send
from flowrouter.core.tables import LinkState, Modifiers
from flowrouter.core.traces import NULL_TRACER, TraceWriter
from flowrouter.net.config import ConfigError, Emulation, NodeConfig, PeerConfig, parse_address
from flowrouter.wire.control import Role
from flowrouter.wire.header import (
    HEADER_SIZE,
    UDP_MAX_PAYLOAD,
    FrameDecoder,
    MalformedFrame,
    split_datagram,
    take_frame,
)
from flowrouter.wire.linkauth import LinkSecurityError, SecureStream

log = logging.getLogger("flowrouter.net.runtime")


#: frames with payloads this large are written at once rather than batched: joining them
#: would copy them again and overrun the transport buffer
_BATCH_MAX = 8192


class _LinkOutput:
    """The sending side of one link: a copy-free fast path, and the slow path described in
    the module docstring (queue, fairness, shaping, credits, emulated loss)."""

    __slots__ = ("node", "link_id", "write", "write_many", "queue", "paused", "timer", "emu",
                 "rng", "batch")

    def __init__(self, node: RouterNode, link_id: int, write: Callable[[bytes, Any], None],
                 write_many: Callable[[list[Any]], None] | None = None) -> None:
        self.node = node
        self.link_id = link_id
        self.write = write
        #: writes a batch of buffers at once (None: the link writes frame by frame, UDP)
        self.write_many = write_many
        #: buffers gathered while the node processes one read (one write per link per read)
        self.batch: list[Any] | None = None
        self.queue: OutputQueue | None = None
        self.paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.emu: Emulation | None = None
        self.rng: random.Random | None = None

    def emulate(self, emu: Emulation | None) -> None:
        """(Re)configure emulation; frames already waiting keep their order."""
        self.emu = emu if emu is not None and emu.active else None
        old = self.queue
        if self.emu is not None:
            self.rng = random.Random(f"{self.node.config.name}:{self.link_id}")
            self.queue = OutputQueue(self.node.config.max_link_buffer,
                                     rate=self.emu.bandwidth / 8 if self.emu.bandwidth else None,
                                     delay=self.emu.delay, now=self.node.now())
            if old is not None:
                now = self.node.now()
                while (fr := old.pop(now)) is not None:
                    self.queue.push(bytes(fr[0][:16]), fr[0], fr[1], fr[0][20] < 16, now, fr[2])
        elif old is not None and old.shaped:
            self.queue = None
            self._requeue(old)
        self._drain()

    def _requeue(self, old: OutputQueue) -> None:
        now = self.node.now()
        while (fr := old.pop(now)) is not None:
            self.node._credit_release(fr[2], len(fr[0]) + len(fr[1]))
            self.send(fr[0], fr[1])

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        emu = self.emu
        if emu is not None:
            if emu.down or (emu.loss and self.rng.random() < emu.loss):  # type: ignore[union-attr]
                self.node.core.counters["drop.emulated-loss" if not emu.down
                                        else "drop.emulated-down"] += 1
                return
        elif self.queue is None and not self.paused:
            node = self.node
            if node._batching and self.write_many is not None and len(payload) < _BATCH_MAX:
                batch = self.batch
                if batch is None:
                    batch = self.batch = []
                    node._dirty.append(self)
                batch.append(header)
                batch.append(payload)
            else:
                if self.batch:
                    self.flush()  # keep the link's order
                self.write(header, payload)
            return
        node = self.node
        q = self.queue
        if q is None:
            q = self.queue = OutputQueue(node.config.max_link_buffer)
        origin = node._rx_link
        now = node.now()
        size = len(header) + len(payload)
        dropped = q.push(bytes(header[:16]), header, payload, header[20] < 16, now, origin)
        node._credit_take(origin, size)
        for key, n, org in dropped:
            node._credit_release(org, n)
            node.core.counters["drop.link-congested"] += 1
            link = node.core.links.get(self.link_id)
            node.execute(node.core.alert(
                "link-congested", f"output to {link.describe() if link else self.link_id} "
                f"is full ({node.config.max_link_buffer} bytes); dropping the longest flow's "
                "frames", now, key))
        self._drain()

    def flush(self) -> None:
        batch, self.batch = self.batch, None
        if batch and self.write_many is not None:
            self.write_many(batch)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._drain()

    def _drain(self) -> None:
        q = self.queue
        if q is None or self.timer is not None:
            return
        node = self.node
        now = node.now()
        while not self.paused:
            fr = q.pop(now)
            if fr is None:
                break
            node._credit_release(fr[2], len(fr[0]) + len(fr[1]))
            self.write(fr[0], fr[1])
        if q.empty() and not q.shaped:
            self.queue = None  # back to the fast path
            return
        if not self.paused:
            wait = q.next_ready(now)
            if wait is not None:
                self.timer = node._loop.call_later(max(wait, 0.0005), self._wake)  # type: ignore[union-attr]

    def _wake(self) -> None:
        self.timer = None
        self._drain()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        q, self.queue = self.queue, None
        if q is not None:
            now = self.node.now()
            while (fr := q.pop(now)) is not None:
                self.node._credit_release(fr[2], len(fr[0]) + len(fr[1]))

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"paused": self.paused}
        if self.queue is not None:
            out.update(self.queue.stats())
        if self.emu is not None:
            out["emulation"] = self.emu.describe()
        return out


class _TcpLink(asyncio.Protocol):
    __slots__ = ("node", "peer", "link_id", "transport", "decoder", "out", "address",
                 "reading", "hs", "secure")

    def __init__(self, node: RouterNode, peer: PeerConfig | None) -> None:
        self.node = node
        self.peer = peer
        self.link_id = 0
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(node.config.max_payload)
        self.out: _LinkOutput | None = None
        self.address = "?"
        self.reading = True
        #: bytes of the handshake, parsed one frame at a time: after the peer's AUTH the
        #: rest of the stream may be sealed records, not frames
        self.hs: bytearray | None = bytearray()
        self.secure: SecureStream | None = None

    # asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # duck-typed: uvloop's transports are not asyncio.Transport subclasses
        self.transport = transport  # type: ignore[assignment]
        node = self.node
        # A small transport buffer (a few large frames): beyond it frames wait in our fair
        # queue, not in asyncio's.
        self.transport.set_write_buffer_limits(high=256 * 1024)  # type: ignore[union-attr]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peername = transport.get_extra_info("peername")
        self.address = f"{peername[0]}:{peername[1]}" if peername else "?"
        self.link_id = node._register(self)
        self.out = _LinkOutput(node, self.link_id, self._write, self._write_many)
        mods = self.peer.modifiers if self.peer else None  # accepted: learnt at HELLO
        node.execute(node.core.open_link(
            self.link_id, node.now(), transport="tcp", address=self.address, modifiers=mods,
            expected_peer=self.peer.name if self.peer else None))

    def data_received(self, data: bytes) -> None:
        if self.secure is not None:
            try:
                chunks = self.secure.decode(data)
            except LinkSecurityError as exc:
                node = self.node
                node.execute(node.core.drop_link(
                    self.link_id, MalformedFrame("bad-record", str(exc)), node.now()))
                return
            for chunk in chunks:
                self._frames(chunk)
            return
        if self.hs is not None:
            self._handshake_bytes(data)
            return
        self._frames(data)

    def _handshake_bytes(self, data: bytes) -> None:
        node = self.node
        buf = self.hs
        assert buf is not None
        buf += data
        while True:
            try:
                frame = take_frame(buf, node.config.max_payload)
            except MalformedFrame as exc:
                node.execute(node.core.drop_link(self.link_id, exc, node.now()))
                return
            if frame is None:
                return
            node.execute(node.core.receive(self.link_id, frame[:HEADER_SIZE],
                                           frame[HEADER_SIZE:], node.now()))
            link = node.core.links.get(self.link_id)
            if link is None:
                return  # refused or dropped
            if self.secure is not None or link.state is LinkState.UP:
                rest = bytes(buf)
                self.hs = None
                node._link_state_changed()
                if rest:
                    self.data_received(rest)
                return

    def _frames(self, data: bytes) -> None:
        node = self.node
        try:
            frames = self.decoder.feed(data)
        except MalformedFrame as exc:
            node.execute(node.core.drop_link(self.link_id, exc, node.now()))
            return
        if not frames:
            return
        core, now, link_id, execute = node.core, node.now(), self.link_id, node.execute
        node._rx_link = link_id
        node._batching = True
        try:
            for header, payload in frames:
                actions = core.receive(link_id, header, payload, now)
                if actions:
                    execute(actions)
        finally:
            node._batching = False
            node._rx_link = 0
            node._flush()
        if core.generation != node._seen_generation:
            node._link_state_changed()

    def connection_lost(self, exc: Exception | None) -> None:
        node = self.node
        reason = f"connection lost: {exc}" if exc else "connection closed by peer"
        if self.decoder.pending and self.link_id in node.core.links:  # not yet counted
            node.core.counters["malformed"] += 1
            node.core.counters["malformed.truncated"] += 1
            reason = f"truncated frame ({self.decoder.pending} bytes of an incomplete frame)"
            link = node.core.links.get(self.link_id)
            log.warning("%s: malformed input: %s; dropping the link",
                        link.describe() if link else f"link {self.link_id}", reason)
        if self.out is not None:
            self.out.close()
        node.execute(node.core.close_link(self.link_id, node.now(), reason))
        node._unregister(self.link_id)
        if self.peer is not None:
            node._redial(self.peer)

    def pause_writing(self) -> None:
        if self.out is not None:
            self.out.pause()

    def resume_writing(self) -> None:
        if self.out is not None:
            self.out.resume()

    # link interface ---------------------------------------------------------------------------
    def _write(self, header: bytes, payload: Any) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if self.secure is not None:  # sealing needs the bytes together anyway
                transport.write(self.secure.encode(header + bytes(payload)))
            else:
                transport.writelines((header, payload))

    def _write_many(self, buffers: list[Any]) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if self.secure is not None:
                transport.write(self.secure.encode(b"".join(buffers)))
            else:
                transport.writelines(buffers)

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        self.out.send(header, payload)  # type: ignore[union-attr]

    def set_reading(self, on: bool) -> None:
        if self.transport is None or on == self.reading:
            return
        self.reading = on
        if on:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def close(self, reason: str) -> None:
        if self.transport is not None:
            self.transport.close()


class _UdpLink:
    __slots__ = ("node", "addr", "link_id", "peer", "last_rx", "address", "out")

    def __init__(self, node: RouterNode, addr: tuple[str, int], peer: PeerConfig | None) -> None:
        self.node = node
        self.addr = addr
        self.peer = peer
        self.link_id = 0
        self.last_rx = node.now()
        self.address = f"{addr[0]}:{addr[1]}"
        self.out: _LinkOutput | None = None

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        self.out.send(header, payload)  # type: ignore[union-attr]

    def set_reading(self, on: bool) -> None:
        pass  # one socket serves every UDP peer: nothing to pause per link

    def _write(self, header: bytes, payload: Any) -> None:
        sock = self.node._udp_sock
        if sock is None:
            return
        try:
            sock.sendmsg((header, payload), (), 0, self.addr)
        except BlockingIOError:
            self.node.core.counters["drop.link-congested"] += 1
        except OSError as exc:
            self.node.core.counters["drop.udp-error"] += 1
            log.debug("UDP send to %s failed: %s", self.address, exc)

    def close(self, reason: str) -> None:
        if self.out is not None:
            self.out.close()
        self.node._udp_links.pop(self.addr, None)


class RouterNode:
    """One router process: the core plus its sockets. ``await start()``, ``await stop()``."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.core = Router(config.params())
        self._links: dict[int, _TcpLink | _UdpLink] = {}
        self._next_link = 1
        self._server: asyncio.base_events.Server | None = None
        self._control: asyncio.base_events.Server | None = None
        self._udp: Any = None  #: an asyncio-dgram stream bound to our own socket
        self._udp_sock: socket.socket | None = None
        self._udp_links: dict[tuple[str, int], _UdpLink] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backoff: dict[str, float] = {}
        self._seen_generation = 0
        self._tracer: TraceWriter | None = None
        #: the input link whose frames are being processed (0: none / locally generated)
        self._rx_link = 0
        #: while a read is processed, fast-path sends gather per link and ``_flush`` writes
        #: each link's batch once: one system call per link per read, not per frame
        self._batching = False
        self._dirty: list[_LinkOutput] = []
        #: bytes from each input link waiting in output queues, and who is paused for it
        self._pending_in: dict[int, int] = {}
        #: emulation per peer name (from config and the control interface)
        self._emulation: dict[str, Emulation] = {
            name: emu for name, emu in config.emulation.items()}
        for peer in config.peers:
            if peer.name and peer.emulation.active:
                self._emulation.setdefault(peer.name, peer.emulation)
        #: peers administratively down: their links are closed and not re-dialled
        self._blocked: set[str] = set()

    # lifecycle --------------------------------------------------------------------------------
    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        cfg = self.config
        tracer: Any = NULL_TRACER
        if cfg.trace_dir:
            # Wall-clock times in the records, so traces of several routers line up.
            tracer = self._tracer = TraceWriter(
                cfg.trace_dir + "/", cfg.name, sample_rate=cfg.trace_sample,
                rotate_bytes=cfg.trace_rotate_bytes, t_offset=time.time() - loop.time())
            log.info("router %s writes traces to %s (sampling %.3g of forwarding)", cfg.name,
                     tracer.path, cfg.trace_sample)
        self.core = Router(cfg.params(), loop.time(), tracer=tracer)
        self.core.wall_offset = time.time() - loop.time()  # capability expiry is Unix time
        if cfg.listen:
            host, port = parse_address(cfg.listen, "listen")
            self._server = await loop.create_server(lambda: _TcpLink(self, None), host, port,
                                                    reuse_address=True)
            log.info("router %s listening for TCP links on %s", cfg.name, self.tcp_address)
        if cfg.udp:
            host, port = parse_address(cfg.udp, "udp")
            # Our own socket object: asyncio's wrapper would forbid the zero-copy sendmsg.
            info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
            sock = socket.socket(info[0], socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.bind(info[4])
            self._udp = await asyncio_dgram.from_socket(sock)
            self._udp_sock = sock
            self._spawn(self._udp_loop())
            log.info("router %s listening for UDP links on %s:%d", cfg.name,
                     *self._udp.sockname[:2])
        if cfg.control:
            host, port = parse_address(cfg.control, "control")
            self._control = await asyncio.start_server(self._control_client, host, port)
            log.info("router %s control interface on %s:%d", cfg.name, *self.control_address)
        for peer in cfg.peers:
            self._dial_soon(peer, 0.0)
        self._spawn(self._ticker())

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        for server in (self._server, self._control):
            if server is not None:
                server.close()
        for link in list(self._links.values()):
            link.close("router stopping")
        if self._udp is not None:
            self._udp.close()
        if self._tracer is not None:
            self._tracer.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in (self._server, self._control):
            if server is not None:
                await server.wait_closed()
        log.info("router %s stopped", self.config.name)

    async def __aenter__(self) -> RouterNode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def tcp_address(self) -> tuple[str, int]:
        assert self._server is not None, "this router has no TCP listener"
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    @property
    def udp_address(self) -> tuple[str, int]:
        assert self._udp is not None, "this router has no UDP socket"
        host, port = self._udp.sockname[:2]
        return host, port

    @property
    def control_address(self) -> tuple[str, int]:
        assert self._control is not None, "this router has no control interface"
        host, port = self._control.sockets[0].getsockname()[:2]
        return host, port

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # links ------------------------------------------------------------------------------------
    def _register(self, link: _TcpLink | _UdpLink) -> int:
        link_id = self._next_link
        self._next_link += 1
        self._links[link_id] = link
        return link_id

    def _unregister(self, link_id: int) -> None:
        self._links.pop(link_id, None)
        self._pending_in.pop(link_id, None)
        self._link_state_changed()

    def _flush(self) -> None:
        dirty, self._dirty = self._dirty, []
        for out in dirty:
            out.flush()

    def _credit_take(self, origin: int, size: int) -> None:
        if not origin:
            return
        pending = self._pending_in.get(origin, 0) + size
        self._pending_in[origin] = pending
        if pending > self.config.link_credit:
            link = self._links.get(origin)
            if link is not None and getattr(link, "reading", False):
                self.core.counters["credit.paused"] += 1
                link.set_reading(False)

    def _credit_release(self, origin: int, size: int) -> None:
        if not origin:
            return
        pending = self._pending_in.get(origin, 0) - size
        if pending <= 0:
            self._pending_in.pop(origin, None)
        else:
            self._pending_in[origin] = pending
        if pending <= self.config.link_credit // 2:
            link = self._links.get(origin)
            if link is not None and not getattr(link, "reading", True):
                link.set_reading(True)

    def _apply_emulation(self) -> None:
        """Give every up link the emulation configured for its peer (by name)."""
        for lid, lk in self.core.links.items():
            if lk.state is not LinkState.UP:
                continue
            link = self._links.get(lid)
            if link is None or link.out is None:
                continue
            emu = self._emulation.get(lk.peer_name)
            if link.out.emu is not (emu if emu is not None and emu.active else None):
                link.out.emulate(emu)
                if emu is not None:
                    log.info("router %s: %s emulates %s", self.config.name, lk.describe(),
                             emu.describe())

    def _link_state_changed(self) -> None:
        if self._emulation:
            self._apply_emulation()
        if self._blocked:
            self._close_blocked()
        self._seen_generation = self.core.generation
        self._changed.set()
        self._changed = asyncio.Event()

    def execute(self, actions: list[Action]) -> None:
        """Carry out the core's actions (the forwarding hot path ends here)."""
        links = self._links
        for action in actions:
            link = links.get(action.link)
            if link is None:
                continue
            if type(action) is Send:
                link.send(action.header, action.payload)
            elif type(action) is Secure:
                if isinstance(link, _TcpLink):
                    link.secure = SecureStream(action.cipher)
            elif type(action) is Close:
                link.close(action.reason)
                if isinstance(link, _UdpLink):
                    self._unregister(action.link)

    def _dial_soon(self, peer: PeerConfig, delay: float) -> None:
        self._spawn(self._dial(peer, delay))

    def _redial(self, peer: PeerConfig) -> None:
        if self._stopping:
            return
        cfg = self.config
        delay = self._backoff.get(peer.address, cfg.reconnect_min)
        self._backoff[peer.address] = min(delay * 2, cfg.reconnect_max)
        log.info("router %s: re-dialling %s (%s) in %.1fs", cfg.name, peer.name or "peer",
                 peer.address, delay)
        self._dial_soon(peer, delay)

    async def _dial(self, peer: PeerConfig, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        if self._stopping:
            return
        if peer.name in self._blocked:
            self._redial(peer)  # keep trying; it goes through once the link is set up again
            return
        loop = asyncio.get_running_loop()
        host, port = parse_address(peer.address, "peer address")
        if peer.transport == "udp":
            if self._udp_sock is None:
                log.error("peer %s uses UDP but this router has no [router] udp address",
                          peer.address)
                return
            self._udp_link((host, port), peer)
            return
        try:
            await loop.create_connection(lambda: _TcpLink(self, peer), host, port)
            self._backoff.pop(peer.address, None)
        except OSError as exc:
            log.info("router %s: cannot reach %s (%s): %s", self.config.name,
                     peer.name or "peer", peer.address, exc.strerror or exc)
            self._redial(peer)

    # UDP ---------------------------------------------------------------------------------------
    def _udp_link(self, addr: tuple[str, int], peer: PeerConfig | None) -> _UdpLink:
        link = _UdpLink(self, addr, peer)
        link.link_id = self._register(link)
        link.out = _LinkOutput(self, link.link_id, link._write)
        self._udp_links[addr] = link
        mods = peer.modifiers if peer else None  # accepted: learnt at HELLO
        actions = self.core.open_link(link.link_id, self.now(), transport="udp",
                                      address=link.address, modifiers=mods,
                                      expected_peer=peer.name if peer else None)
        self.core.links[link.link_id].max_payload = min(self.config.max_payload,
                                                        UDP_MAX_PAYLOAD)
        self.execute(actions)
        return link

    async def _udp_loop(self) -> None:
        assert self._udp is not None
        max_payload = min(self.config.max_payload, UDP_MAX_PAYLOAD)
        while True:
            try:
                data, addr = await self._udp.recv()
            except asyncio_dgram.TransportClosed:
                return
            peer_addr: tuple[str, int] = (addr[0], addr[1])
            link = self._udp_links.get(peer_addr)
            if link is None:
                link = self._udp_link(peer_addr, None)
            link.last_rx = self.now()
            try:
                header, payload = split_datagram(data, max_payload)
            except MalformedFrame as exc:
                self.execute(self.core.drop_link(link.link_id, exc, self.now()))
                continue
            actions = self.core.receive(link.link_id, header, payload, self.now())
            if actions:
                self.execute(actions)
            if self.core.generation != self._seen_generation:
                self._link_state_changed()

    # administration (fault schedules) ---------------------------------------------------------
    def set_emulation(self, peer: str, emu: Emulation | None) -> None:
        """Change the emulation of links toward *peer* now (None: a plain link again)."""
        if emu is None or not emu.active:
            self._emulation.pop(peer, None)
        else:
            self._emulation[peer] = emu
        for lid, lk in self.core.links.items():
            link = self._links.get(lid)
            if lk.peer_name == peer and link is not None and link.out is not None:
                link.out.emulate(self._emulation.get(peer))
        log.info("router %s: links to %s now: %s", self.config.name, peer,
                 emu.describe() if emu else "no emulation")

    def set_link(self, peer: str, up: bool) -> int:
        """Administratively cut (or restore) every link to router *peer*; returns links cut.

        A cut link is closed as a real failure would be (faults, re-grafting, LS re-routing);
        while the peer is blocked it is neither re-dialled nor accepted.
        """
        if up:
            self._blocked.discard(peer)
            log.info("router %s: link to %s administratively up", self.config.name, peer)
            for p in self.config.peers:
                if p.name == peer:
                    self._backoff.pop(p.address, None)
            return 0
        self._blocked.add(peer)
        log.info("router %s: link to %s administratively down", self.config.name, peer)
        return self._close_blocked()

    def _close_blocked(self) -> int:
        n = 0
        now = self.now()
        for lid, lk in list(self.core.links.items()):
            if lk.peer_name in self._blocked and lk.state is LinkState.UP:
                link = self._links.get(lid)
                self.execute(self.core.close_link(lid, now, "administratively down"))
                if link is not None:
                    link.close("administratively down")
                n += 1
        if n:
            self._link_state_changed()
        return n

    # time ---------------------------------------------------------------------------------------
    async def _ticker(self) -> None:
        interval = self.config.tick_interval
        while True:
            await asyncio.sleep(interval)
            now = self.now()
            self.execute(self.core.tick(now))
            idle = self.config.udp_idle_timeout
            for addr, link in list(self._udp_links.items()):
                if now - link.last_rx > idle:
                    log.info("UDP link %d (%s) idle for %.0fs; closing", link.link_id,
                             link.address, idle)
                    self.execute(self.core.close_link(link.link_id, now, "UDP peer silent"))
                    self._udp_links.pop(addr, None)
                    self._unregister(link.link_id)
                    if link.peer is not None:
                        self._redial(link.peer)

    # waiting helpers (tests, launcher) -----------------------------------------------------------
    def links_up(self, role: Role | None = Role.ROUTER) -> int:
        return sum(1 for lk in self.core.links.values()
                   if lk.state is LinkState.UP and (role is None or lk.role is role))

    async def wait_peers_up(self, count: int, timeout: float = 10.0,
                            role: Role | None = Role.ROUTER) -> None:
        """Wait until *count* links of *role* are up (routers by default)."""
        async def _wait() -> None:
            while self.links_up(role) < count:
                await self._changed.wait()
        try:
            await asyncio.wait_for(_wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"router {self.config.name}: {self.links_up(role)} of {count} "
                               f"links up after {timeout}s") from None

    async def wait_routes(self, lsid: int, timeout: float = 10.0) -> None:
        """Wait until this router knows a way to the core of *lsid*."""
        async def _wait() -> None:
            while lsid not in self.core.p.core_lsids and self.core.routing.link_for(lsid) is None:
                await self._changed.wait()
        try:
            await asyncio.wait_for(_wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"router {self.config.name}: no route to LSID {lsid:#x} "
                               f"after {timeout}s") from None

    # control interface ----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        st = self.core.status()
        for row in st["links"]:
            link = self._links.get(row["id"])
            if link is not None and link.out is not None:
                row["output"] = link.out.stats()
        st["listen"] = "%s:%d" % self.tcp_address if self._server else None
        st["udp"] = "%s:%d" % self.udp_address if self._udp else None
        return st

    def _control_command(self, cmd: Any, req: Any) -> dict[str, Any]:
        if cmd == "status":
            return {"ok": True, "status": self.status()}
        if cmd == "ping":
            return {"ok": True, "name": self.config.name}
        if cmd == "emulate":
            emu = Emulation.from_mapping({k: v for k, v in req.items() if k != "cmd"},
                                         "emulate")
            self.set_emulation(str(req["peer"]), emu)
            return {"ok": True, "emulation": emu.describe()}
        if cmd == "link":
            up = req["up"]
            if not isinstance(up, bool):
                raise ValueError('"up" must be true or false')
            return {"ok": True, "closed": self.set_link(str(req["peer"]), up)}
        return {"ok": False, "error": "unknown or malformed command; send one JSON line: "
                '{"cmd": "status"}, {"cmd": "ping"}, {"cmd": "link", "peer": NAME, '
                '"up": BOOL} or {"cmd": "emulate", "peer": NAME, "bandwidth": BPS, '
                '"delay": S, "loss": P, "down": BOOL}'}

    async def _control_client(self, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    req = json.loads(line)
                    cmd = req.get("cmd") if isinstance(req, dict) else None
                except ValueError:
                    cmd, req = None, None
                try:
                    reply = self._control_command(cmd, req)
                except (ConfigError, KeyError, TypeError, ValueError) as exc:
                    reply = {"ok": False, "error": f"bad {cmd} command: {exc}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def query_control(address: str, cmd: str = "status", timeout: float = 5.0,
                        **args: Any) -> dict[str, Any]:
    """Ask a running router's control interface; raises ConnectionError with a clear text."""
    host, port = parse_address(address, "control address")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (TimeoutError, OSError) as exc:
        raise ConnectionError(f"no router control interface answers at {address}: "
                              f"{exc}") from None
    try:
        writer.write(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
    if not line:
        raise ConnectionError(f"router at {address} closed the control connection")
    reply: dict[str, Any] = json.loads(line)
    if not reply.get("ok"):
        raise ConnectionError(f"router at {address}: {reply.get('error')}")
    return reply


__all__ = ["RouterNode", "query_control", "Modifiers"]
