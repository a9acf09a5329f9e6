"""The asyncio shell around the sans-I/O router: sockets, timers, reconnects, control queries.

Everything protocol-shaped happens in :class:`flowrouter.router.Router`; this module only moves
bytes and time in and actions out:

* TCP links (routers and endpoints) use an :class:`asyncio.Protocol` per connection and a
  :class:`~flowrouter.header.FrameDecoder`; frames are handed to the core as views into the
  received buffer and written with ``writelines([header, payload])``, so a forwarded payload is
  never copied by Python code.
* UDP links share one socket bound with asyncio-dgram; each remote address is a link. Sends use
  ``socket.sendmsg`` scatter/gather (again no copy); a full socket buffer is a counted drop.
* Each link's output is bounded (``max_link_buffer`` bytes); past it data frames are dropped
  and counted as ``drop.link-congested`` while control frames still go through, so a slow
  neighbour cannot grow the router's memory or starve the control plane.
* Dialled peers are re-dialled with exponential back-off when their link drops.
* The control interface speaks JSON lines on TCP: ``{"cmd": "status"}`` returns the link table,
  flow table, LS routes and counters (``flowrouter status`` prints them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any

import asyncio_dgram

from .config import NodeConfig, PeerConfig, parse_address
from .control import Role
from .header import (OFF_BAND, UDP_MAX_PAYLOAD, FrameDecoder, MalformedFrame,
                     split_datagram)
from .router import Action, Close, Router, Send
from .tables import LinkState, Modifiers

log = logging.getLogger("flowrouter.runtime")


class _TcpLink(asyncio.Protocol):
    __slots__ = ("node", "peer", "link_id", "transport", "decoder", "paused", "address")

    def __init__(self, node: RouterNode, peer: PeerConfig | None) -> None:
        self.node = node
        self.peer = peer
        self.link_id = 0
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(node.config.max_payload)
        self.paused = False
        self.address = "?"

    # asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        node = self.node
        transport.set_write_buffer_limits(high=node.config.max_link_buffer)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peername = transport.get_extra_info("peername")
        self.address = f"{peername[0]}:{peername[1]}" if peername else "?"
        self.link_id = node._register(self)
        mods = self.peer.modifiers if self.peer else node.config.endpoint_modifiers
        node.execute(node.core.open_link(
            self.link_id, node.now(), transport="tcp", address=self.address, modifiers=mods,
            expected_peer=self.peer.name if self.peer else None))

    def data_received(self, data: bytes) -> None:
        node = self.node
        try:
            frames = self.decoder.feed(data)
        except MalformedFrame as exc:
            node.execute(node.core.drop_link(self.link_id, exc, node.now()))
            return
        if not frames:
            return
        core, now, link_id, execute = node.core, node.now(), self.link_id, node.execute
        for header, payload in frames:
            actions = core.receive(link_id, header, payload, now)
            if actions:
                execute(actions)
        if core.generation != node._seen_generation:
            node._link_state_changed()

    def connection_lost(self, exc: Exception | None) -> None:
        node = self.node
        reason = f"connection lost: {exc}" if exc else "connection closed by peer"
        if self.decoder.pending:
            node.core.counters["malformed"] += 1
            node.core.counters["malformed.truncated"] += 1
            reason = f"truncated frame ({self.decoder.pending} bytes of an incomplete frame)"
            link = node.core.links.get(self.link_id)
            log.warning("%s: malformed input: %s; dropping the link",
                        link.describe() if link else f"link {self.link_id}", reason)
        node.execute(node.core.close_link(self.link_id, node.now(), reason))
        node._unregister(self.link_id)
        if self.peer is not None:
            node._redial(self.peer)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    # link interface ---------------------------------------------------------------------------
    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.paused and header[OFF_BAND] >= 16:
            self.node.core.counters["drop.link-congested"] += 1
            return
        transport.writelines((header, payload))

    def close(self, reason: str) -> None:
        if self.transport is not None:
            self.transport.close()


class _UdpLink:
    __slots__ = ("node", "addr", "link_id", "peer", "last_rx", "address")

    def __init__(self, node: RouterNode, addr: tuple[str, int], peer: PeerConfig | None) -> None:
        self.node = node
        self.addr = addr
        self.peer = peer
        self.link_id = 0
        self.last_rx = node.now()
        self.address = f"{addr[0]}:{addr[1]}"

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
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
        self._udp: asyncio_dgram.aio.DatagramServer | None = None
        self._udp_sock: socket.socket | None = None
        self._udp_links: dict[tuple[str, int], _UdpLink] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backoff: dict[str, float] = {}
        self._seen_generation = 0

    # lifecycle --------------------------------------------------------------------------------
    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        cfg = self.config
        self.core = Router(cfg.params(), loop.time())
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
        self._link_state_changed()

    def _link_state_changed(self) -> None:
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
        self._udp_links[addr] = link
        mods = peer.modifiers if peer else self.config.endpoint_modifiers
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
            addr = addr[:2]
            link = self._udp_links.get(addr)
            if link is None:
                link = self._udp_link(addr, None)
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
        except asyncio.TimeoutError:
            raise TimeoutError(f"router {self.config.name}: {self.links_up(role)} of {count} "
                               f"links up after {timeout}s") from None

    async def wait_routes(self, lsid: int, timeout: float = 10.0) -> None:
        """Wait until this router knows a way to the core of *lsid*."""
        async def _wait() -> None:
            while lsid not in self.core.p.core_lsids and self.core.routing.link_for(lsid) is None:
                await self._changed.wait()
        try:
            await asyncio.wait_for(_wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"router {self.config.name}: no route to LSID {lsid:#x} "
                               f"after {timeout}s") from None

    # control interface ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        st = self.core.status()
        st["listen"] = "%s:%d" % self.tcp_address if self._server else None
        st["udp"] = "%s:%d" % self.udp_address if self._udp else None
        return st

    async def _control_client(self, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    req = json.loads(line)
                    cmd = req.get("cmd") if isinstance(req, dict) else None
                except ValueError:
                    cmd, req = None, None
                if cmd == "status":
                    reply: dict[str, Any] = {"ok": True, "status": self.status()}
                elif cmd == "ping":
                    reply = {"ok": True, "name": self.config.name}
                else:
                    reply = {"ok": False, "error": "unknown or malformed command; send "
                             '{"cmd": "status"} or {"cmd": "ping"} as one JSON line'}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def query_control(address: str, cmd: str = "status", timeout: float = 5.0
                        ) -> dict[str, Any]:
    """Ask a running router's control interface; raises ConnectionError with a clear text."""
    host, port = parse_address(address, "control address")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        raise ConnectionError(f"no router control interface answers at {address}: "
                              f"{exc}") from None
    try:
        writer.write(json.dumps({"cmd": cmd}).encode() + b"\n")
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
