"""A raw endpoint for runtime tests: speaks the wire protocol by hand, so tests can send
exactly the bytes they want (including bad ones) and see exactly what arrives."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from flowrouter.core.tables import Modifiers
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import FrameDecoder, Header, pack_header, parse_header

T = TypeVar("T")
TIMEOUT = 10.0


async def within(aw: Awaitable[T], timeout: float = TIMEOUT) -> T:
    return await asyncio.wait_for(aw, timeout)


async def until(cond: Callable[[], object], timeout: float = 20.0, what: str = "",
                step: float = 0.02) -> None:
    """Poll *cond*, a condition with no event of its own (a counter, a table, a flag), every
    *step* seconds (0: only yield to the loop) until it holds. Bounded: an AssertionError after
    *timeout* seconds, naming *what* was awaited (a caller may bound it tighter, with
    ``within``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        await asyncio.sleep(step)


def run(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Run a test's coroutine on a fresh loop, bounded so a hang fails instead of stalling."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def addr(node: RouterNode) -> str:
    return "%s:%d" % node.tcp_address


async def get(listener: Any, timeout: float = 10.0) -> Any:
    """The next message of a flowlib listener, bounded."""
    return await asyncio.wait_for(listener.get(), timeout)


_SOFT = {C.MsgType.ECHO, C.MsgType.ECHO_REPLY, C.MsgType.REFRESH, C.MsgType.PRUNE,
         C.MsgType.NOT_ON_TREE}


class RawEndpoint:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(1 << 24)
        self.frames: asyncio.Queue[tuple[Header, bytes]] = asyncio.Queue()
        #: the router's soft-state messages (ECHO, PRUNE, ...), kept apart: this raw client
        #: is an "older" application that speaks none of it
        self.soft: asyncio.Queue[C.ControlMessage] = asyncio.Queue()
        self.closed = asyncio.Event()
        self._task = asyncio.ensure_future(self._pump())

    @classmethod
    async def connect(cls, node: RouterNode, name: str = "raw", hello: bool = True,
                      features: int = C.FEATURES) -> RawEndpoint:
        """Connect and say HELLO announcing *features* (0: a client from before soft state,
        which the router sends no soft-state message)."""
        reader, writer = await within(asyncio.open_connection(*node.tcp_address))
        ep = cls(reader, writer)
        if hello:
            body = C.Hello(7, C.Role.ENDPOINT, name, 65536).encode()
            ep.writer.write(C.hello_header(len(body), features) + body)
            hdr, payload = await ep.next_frame()
            assert isinstance(C.decode(payload), C.Hello)
        return ep

    async def _pump(self) -> None:
        try:
            while data := await self.reader.read(65536):
                for h, p in self.decoder.feed(data):
                    if bytes(h[:16]) == LINK_LOCAL_FLOW.key and p[1:2] and p[1] in _SOFT:
                        self.soft.put_nowait(C.decode(p))
                        continue
                    self.frames.put_nowait((parse_header(h, max_payload=1 << 24), bytes(p)))
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def send_control(self, key: bytes, msg: C.ControlMessage, band: int = 0) -> None:
        body = msg.encode()
        self.writer.write(pack_header(key, len(body), band) + body)

    def send(self, flow: FlowID, payload: bytes, band: int = 32, loc_type: int = 0,
             loc_value: int = 0, ttl: int = 32) -> None:
        self.writer.write(pack_header(flow.key, len(payload), band, loc_type, loc_value, ttl)
                          + payload)

    async def next_frame(self, timeout: float = TIMEOUT) -> tuple[Header, bytes]:
        return await within(self.frames.get(), timeout)

    async def join(self, flow: FlowID, mask: int, req: int = 1) -> C.JoinAck:
        self.send_control(flow.key, C.Join(req, mask))
        while True:
            hdr, payload = await self.next_frame()
            if hdr.band == 0:
                msg = C.decode(payload)
                if isinstance(msg, C.JoinAck) and msg.req_id == req:
                    return msg

    async def data(self, n: int, timeout: float = TIMEOUT) -> list[tuple[Header, bytes]]:
        """The next *n* application frames (band >= 16), skipping router control."""
        out: list[tuple[Header, bytes]] = []
        while len(out) < n:
            hdr, payload = await self.next_frame(timeout)
            if hdr.band >= 16:
                out.append((hdr, payload))
        return out

    async def close(self) -> None:
        self.writer.close()
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


async def router(name: str, peers: Sequence[RouterNode] = (), core: bool = False,
                 listen: str = "127.0.0.1:0", lsid: int = 0x10) -> RouterNode:
    """A started loopback router *name* dialling *peers*: the core for *lsid* if *core*, and
    suggesting *lsid* for new flows; it accepts any loopback router (the routers created
    after it dial it)."""
    node = RouterNode(NodeConfig(
        name, listen=listen, core_lsids=frozenset({lsid}) if core else frozenset(),
        default_lsid=lsid, peers=[PeerConfig(addr(p), p.config.name) for p in peers],
        accept_routers=["*@127.0.0.1"]))
    await node.start()
    return node


@contextlib.asynccontextmanager
async def mesh(dials: dict[str, Sequence[str]], lsid: int = 0x10
               ) -> AsyncIterator[list[RouterNode]]:
    """Loopback routers (see :func:`router`) named by *dials*'s keys, started in that order,
    each dialling the earlier routers its value names; the first is the core for *lsid*.
    Yields them in that order once all their links are up and each has a route to the core;
    stops them, last first, after."""
    nodes: dict[str, RouterNode] = {}
    try:
        for name, peers in dials.items():
            nodes[name] = await router(name, [nodes[p] for p in peers], core=not nodes,
                                       lsid=lsid)
        for name, node in nodes.items():
            await node.wait_peers_up(len(dials[name])
                                     + sum(name in peers for peers in dials.values()))
            await node.wait_routes(lsid)
        yield list(nodes.values())
    finally:
        for node in reversed(list(nodes.values())):
            await node.stop()


@contextlib.asynccontextmanager
async def core_and_edge(core_lsid: int = 0x10, **extra: Any
                        ) -> AsyncIterator[tuple[RouterNode, RouterNode]]:
    """Routers ``core`` (the core for *core_lsid*) and ``edge`` (dialling it) on loopback,
    both suggesting *core_lsid* for new flows; *extra* NodeConfig fields go to both (the
    core accepts the edge as a router besides any ``accept_routers`` given). Yields
    ``(core, edge)`` once the edge has a route to the core, and stops both after."""
    accept = list(extra.pop("accept_routers", ()))
    core = RouterNode(NodeConfig("core", listen="127.0.0.1:0",
                                 accept_routers=["edge@127.0.0.1", *accept],
                                 core_lsids=frozenset({core_lsid}), default_lsid=core_lsid,
                                 **extra))
    await core.start()
    edge: RouterNode | None = None
    try:
        node = RouterNode(NodeConfig("edge", listen="127.0.0.1:0", default_lsid=core_lsid,
                                     peers=[PeerConfig(addr(core), "core")],
                                     accept_routers=accept, **extra))
        await node.start()
        edge = node
        await within(edge.wait_routes(core_lsid))
        yield core, edge
    finally:
        if edge is not None:
            await edge.stop()
        await core.stop()


@contextlib.asynccontextmanager
async def chain(n: int = 3, core_lsid: int = 0x10, *, geography: int = 0, **extra: object
                ) -> AsyncIterator[list[RouterNode]]:
    """Routers r1 - r2 - ... - rN on loopback; rN is the core for *core_lsid*. Each ri dials
    r(i+1), and that direction costs *geography*; *extra* NodeConfig fields go to all."""
    nodes: list[RouterNode] = []
    try:
        prev: RouterNode | None = None
        for i in range(n, 0, -1):
            peers = [PeerConfig("%s:%d" % prev.tcp_address, prev.config.name,
                                modifiers=Modifiers(geography=geography))] if prev else []
            # r(i-1) dials this one: without link keys it must be listed to be a router
            accept = [f"r{i - 1}@127.0.0.1"] if i > 1 else []
            cfg = NodeConfig(f"r{i}", listen="127.0.0.1:0", peers=peers,
                             core_lsids=frozenset({core_lsid}) if i == n else frozenset(),
                             accept_routers=[*accept, *extra.get("accept_routers", [])],
                             **{k: v for k, v in extra.items() if k != "accept_routers"}
                             )  # type: ignore[arg-type]
            node = RouterNode(cfg)
            await node.start()
            nodes.insert(0, node)
            prev = node
        await within(nodes[0].wait_routes(core_lsid))
        for node in nodes:
            await within(node.wait_routes(core_lsid))
        yield nodes
    finally:
        for node in nodes:
            await node.stop()


def blocking_member(node: RouterNode, flow: FlowID, band: int, name: str = "stuck",
                    node_id: int = 5) -> socket.socket:
    """A blocking socket joined to *flow* on *band* with a small receive buffer, that reads
    only when a test tells it to (a stuck or paused receiver)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(node.tcp_address)
    hello = C.Hello(node_id, C.Role.ENDPOINT, name, 65536).encode()
    join = C.Join(1, 1 << band).encode()
    s.sendall(pack_header(LINK_LOCAL_FLOW.key, len(hello), 0) + hello
              + pack_header(flow.key, len(join), 0) + join)
    return s
