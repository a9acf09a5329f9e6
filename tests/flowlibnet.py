"""Routers for the flowlib tests: a chain of real routers (flowrouter.net.runtime.RouterNode)
over loopback, and a scripted fake router that lets a test play the router side of one link
frame by frame (refusals, malformed frames, GC pings at will, an older router that speaks no
soft state).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import flowlib
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import HEADER_SIZE, pack_header, parse_header

from .rawep import addr

LSID = 0x10


@contextlib.asynccontextmanager
async def chain(n: int = 3, **kw: Any) -> AsyncIterator[list[RouterNode]]:
    """Routers r0 - r1 - ... in a line over loopback; r0 is the core of LSID 0x10."""
    nodes: list[RouterNode] = []
    try:
        for i in range(n):
            peers = [PeerConfig(address=addr(nodes[-1]), name=nodes[-1].config.name)] \
                if nodes else []
            node = RouterNode(NodeConfig(
                name=f"r{i}", listen="127.0.0.1:0",
                core_lsids=frozenset({LSID}) if i == 0 else frozenset(),
                default_lsid=LSID, peers=peers, **kw,
                accept_routers=[f"r{i + 1}@127.0.0.1"] if i < n - 1 else []))
            await node.start()
            nodes.append(node)
        for i, node in enumerate(nodes):
            await node.wait_peers_up(min(2, n - 1) if 0 < i < n - 1 else min(1, n - 1))
            await node.wait_routes(LSID)
        yield nodes
    finally:
        for node in reversed(nodes):
            await node.stop()


def endpoint_link(node: RouterNode, client: flowlib.FlowClient) -> int:
    """The router's link id for *client* (found by the name in its HELLO)."""
    for lid, link in node.core.links.items():
        if link.role is C.Role.ENDPOINT and link.peer_name == client.name:
            return lid
    raise AssertionError(f"{client.name} has no link on {node.config.name}")


# ------------------------------------------------------------------ a scripted fake router
class FakeRouter:
    """A TCP server that lets a test play the router side of one link frame by frame."""

    def __init__(self) -> None:
        self.conns: asyncio.Queue[FakeConn] = asyncio.Queue()
        self.all: list[FakeConn] = []
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> FakeRouter:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = FakeConn(reader, writer)
            self.all.append(conn)
            await self.conns.put(conn)
        self.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for conn in self.all:
            conn.close()
            with contextlib.suppress(ConnectionError):
                await conn.writer.wait_closed()
        await self.server.wait_closed()

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def accept(self) -> FakeConn:
        return await asyncio.wait_for(self.conns.get(), 5)


_SOFT = {C.MsgType.ECHO, C.MsgType.ECHO_REPLY, C.MsgType.REFRESH, C.MsgType.PRUNE,
         C.MsgType.NOT_ON_TREE}


class FakeConn:
    """A fake router's end of one client connection: an "older" router that speaks no soft
    state (the client's ECHOs and digests are kept in ``soft``, never answered)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.soft: list[C.ControlMessage] = []

    async def read(self) -> tuple[Any, bytes]:
        while True:
            raw = await asyncio.wait_for(self.reader.readexactly(HEADER_SIZE), 5)
            hdr = parse_header(raw)
            payload = await asyncio.wait_for(self.reader.readexactly(hdr.size), 5)
            if hdr.key == LINK_LOCAL_FLOW.key and payload[1:2] and payload[1] in _SOFT:
                self.soft.append(C.decode(payload))
                continue
            return hdr, payload

    async def read_control(self) -> tuple[Any, C.ControlMessage]:
        hdr, payload = await self.read()
        return hdr, C.decode(payload)

    async def read_join(self) -> tuple[Any, C.Join]:
        hdr, msg = await self.read_control()
        assert isinstance(msg, C.Join), msg
        return hdr, msg

    def write(self, key: bytes, band: int, payload: bytes, **kw: int) -> None:
        self.writer.write(pack_header(key, len(payload), band, **kw) + payload)

    def control(self, key: bytes, band: int, msg: C.ControlMessage) -> None:
        self.write(key, band, msg.encode())

    async def handshake(self, max_payload: int = 65536, default_lsid: int = LSID,
                        features: int = 0) -> C.Hello:
        """The router's half of the handshake; its HELLO announces *features* (0, an older
        router's: the client sends it no soft-state message)."""
        hdr, hello = await self.read_control()
        assert isinstance(hello, C.Hello) and hdr.key == LINK_LOCAL_FLOW.key
        self.features = C.hello_features(hdr.pack())
        self.write(LINK_LOCAL_FLOW.key, 0, C.Hello(7, C.Role.ROUTER, "fake", max_payload,
                                                   default_lsid).encode(), loc_value=features)
        return hello

    def close(self) -> None:
        self.writer.close()


async def fake_client(fake: FakeRouter, features: int = 0, **kw: Any
                      ) -> tuple[flowlib.FlowClient, FakeConn]:
    """Connect a client to the fake and do the router's half of the handshake."""
    task = asyncio.ensure_future(flowlib.connect(fake.address, name="app", **kw))
    conn = await fake.accept()
    hello = await conn.handshake(features=features)
    assert hello.role is C.Role.ENDPOINT and hello.name == "app" and hello.max_payload > 0
    return await task, conn

