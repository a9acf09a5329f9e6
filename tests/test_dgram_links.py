"""Datagram links for applications (issue 29): flowlib reaches its router over UDP
(``udp://host:port``, the router's ``app_udp`` listener) with the TCP link's API, liveness,
failover and link keys; a viewer behind a constrained path loses frames instead of falling
behind, and the loss is counted. Real sockets on loopback; the framing alone sans-I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import flowlib
from flowlib.checks import is_datagram, parse_router_address, router_transport
from flowrouter.net.config import NodeConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.appdgram import (
    MAX_PAYLOAD,
    PREFIX_SIZE,
    DatagramPacker,
    DatagramSequence,
    frame_spans,
    open_datagram,
    prefix,
    split_frames,
)
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import MalformedFrame, pack_header
from flowrouter.wire.linkrecords import LinkCipher

from .rawep import addr, core_and_edge, get, run, within

KEY = "hex:" + "5a" * 32


def udp(node: RouterNode) -> str:
    assert node.appdgram is not None
    return "udp://%s:%d" % node.appdgram.address


def one_router(**extra: Any) -> RouterNode:
    return RouterNode(NodeConfig("r", listen="127.0.0.1:0", app_udp="127.0.0.1:0",
                                 default_lsid=0x10, core_lsids=frozenset({0x10}), http=None,
                                 **extra))


# ---------------------------------------------------------------- the framing, sans-I/O
def test_datagrams_carry_whole_frames_numbered() -> None:
    frames = [pack_header(b"k" * 16, n, 32) + bytes(n) for n in (0, 10, 30_000, 40_000)]
    packer = DatagramPacker()
    grams = packer.pack(frame_spans([f[:24] for f in frames[:1]] + [frames[0][24:]]
                                    + frames[1:]))
    assert len(grams) == 2 and all(len(g) <= 65507 for g in grams)
    seqs, got = [], b""
    for g in grams:
        seq, body = split_frames(g)
        seqs.append(seq)
        got += bytes(body)
    assert seqs == [1, 2] and got == b"".join(frames)
    # anything but a prefix and whole frames is refused as a whole
    for bad in (b"", grams[0][:PREFIX_SIZE + 10], grams[0][:-1], b"XX" + grams[0][2:],
                grams[0] + b"\0"):
        with pytest.raises(MalformedFrame):
            split_frames(bad)


def test_gaps_in_datagram_numbers_are_counted() -> None:
    seq = DatagramSequence()
    assert [seq.seen(n) for n in (1, 2, 5, 6, 4, 9)] == [0, 0, 2, 0, 0, 2]
    assert (seq.lost, seq.late, seq.highest) == (3, 1, 9)
    wrap = DatagramSequence()
    assert [wrap.seen(n) for n in (0xFFFFFFFE, 0xFFFFFFFF, 2)] == [0, 0, 1]


def test_sealed_datagrams_cannot_be_forged_altered_replayed_or_sent_in_clear() -> None:
    key_a, key_b = os.urandom(32), os.urandom(32)
    tx, rx = LinkCipher(key_a, key_b, ordered=False), LinkCipher(key_b, key_a, ordered=False)
    packer = DatagramPacker(rekey_interval=10.0)
    packer.seal_with(tx, 0.0)
    data = pack_header(b"k" * 16, 5, 32) + b"hello"
    first, second = packer.pack([data]), packer.pack([data])
    assert open_datagram(second[0], rx)[1].tobytes() == data
    assert open_datagram(first[0], rx)[1].tobytes() == data  # late is fine, once
    for bad, why in ((first[0], "bad-record"),  # a replay
                     (first[0][:-1] + bytes([first[0][-1] ^ 1]), "bad-record"),  # altered
                     (prefix(9) + data, "unsealed")):  # injected in clear
        with pytest.raises(MalformedFrame) as info:
            open_datagram(bad, rx)
        assert info.value.reason == why
    # handshake repeats may still come in clear
    body = C.Hello(1, C.Role.ROUTER, "r", 4096, 0).encode()
    hello = pack_header(LINK_LOCAL_FLOW.key, len(body), 0) + body
    assert open_datagram(prefix(10) + hello, rx)[1].tobytes() == hello
    # the sending key moves on with the clock; the receiver follows
    later = packer.pack([data], 11.0)
    assert tx.tx_generation == 1 and open_datagram(later[0], rx)[1].tobytes() == data
    assert rx.rx_generation == 1


def test_router_addresses_name_their_transport() -> None:
    assert router_transport("udp://127.0.0.1:7011") == ("udp", "127.0.0.1:7011")
    assert router_transport("127.0.0.1:7001") == ("tcp", "127.0.0.1:7001")
    assert router_transport("TCP://[::1]:7001") == ("tcp", "[::1]:7001")
    assert is_datagram("udp://h:1") and not is_datagram(("h", 1))
    assert parse_router_address("udp://10.0.0.1:7011") == ("10.0.0.1", 7011)
    with pytest.raises(ValueError, match="scheme"):
        router_transport("quic://h:1")


# ---------------------------------------------------------------- real sockets
@contextlib.asynccontextmanager
async def _clients(node: RouterNode, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    """A datagram client and a TCP client of *node*."""
    sd = str(tmp_path)
    async with (await flowlib.connect(udp(node), name="dg", state_dir=sd) as dg,
                await flowlib.connect(addr(node), name="tcp", state_dir=sd) as tc):
        yield dg, tc


def test_a_datagram_client_has_the_tcp_api(tmp_path: Path) -> None:
    """Listen, send, large messages (fragments in datagrams), both directions, with a TCP
    client on the same flow."""

    async def main() -> None:
        node = one_router()
        await node.start()
        try:
            async with _clients(node, tmp_path) as (dg, tc):
                assert dg.connected and dg.address == udp(node)
                assert dg.max_payload <= MAX_PAYLOAD
                flow = await tc.create()
                rx_dg = await dg.listen(flow, "data")
                rx_tc = await tc.listen(flow, "data")
                big = os.urandom(300_000)
                await tc.send(flow, b"to the datagram client")
                await tc.send(flow, big)
                assert (await get(rx_dg)).payload == b"to the datagram client"
                assert (await get(rx_dg)).payload == big
                await dg.send(flow, big[:100_000], band=33)
                await dg.send(flow, b"back")
                assert (await get(rx_tc)).payload == big[:100_000]
                assert (await get(rx_tc)).payload == b"back"
                assert dg.counters["dgram.received"] > 0 and dg.counters["dgram.lost"] == 0
                assert node.core.counters["appdgram.lost"] == 0
                # liveness: echoes go both ways and keep the link up
                assert node.appdgram is not None and len(node.appdgram.links) == 1
                assert node.status()["app_udp"] == {"address": udp(node)[6:], "links": 1}
            # closing leaves the flow politely; the router forgets the link
            await within(_until(lambda: not node.appdgram.links))  # type: ignore[union-attr]
        finally:
            await node.stop()
    run(main())


def test_a_datagram_clients_frames_go_through_the_forwarding_engine(tmp_path: Path) -> None:
    """After its handshake, an application's datagrams are forwarded by the fast path in
    one pass each (as a TCP read is), not frame by frame through the core; in order."""
    async def main() -> None:
        node = one_router()
        await node.start()
        try:
            async with _clients(node, tmp_path) as (dg, tc):
                flow = await tc.create()
                rx_tc = await tc.listen(flow, "data")
                await dg.send(flow, b"warm")  # the flow's first frame may be the core's
                assert (await get(rx_tc)).payload == b"warm"
                fast = node.fast
                calls = fast.stats["calls"] if fast is not None else 0
                forwarded = node.core.counters["forwarded"]
                for i in range(50):
                    await dg.send(flow, i.to_bytes(2, "big"))
                for i in range(50):
                    assert (await get(rx_tc)).payload == i.to_bytes(2, "big")
                assert node.core.counters["forwarded"] - forwarded >= 50
                if fast is not None:
                    assert fast.stats["calls"] > calls  # the engine took them
        finally:
            await node.stop()
    run(main())


async def arrives_from_tcp(node: RouterNode, flow: Any, lst: Any, payload: bytes,
                           **kw: Any) -> None:
    """A TCP client of *node* sends *payload* on *flow*; *lst* receives it."""
    async with await flowlib.connect(addr(node), **kw) as tx:
        await tx.send(flow, payload)
        assert (await get(lst)).payload == payload


def refused(node: RouterNode) -> int:
    """Datagrams the router's app_udp listener dropped (any reason)."""
    return sum(v for k, v in node.core.counters.items() if k.startswith("appdgram.refused"))


async def _until(cond: Any, step: float = 0.02) -> None:
    while not cond():
        await asyncio.sleep(step)


def test_datagram_links_fail_over_to_the_next_router(tmp_path: Path) -> None:
    """Two routers; a listener on udp:// addresses of both loses its router and carries on
    at the other: the same failover as over TCP."""

    async def main() -> None:
        async with core_and_edge(app_udp="127.0.0.1:0", liveness_interval=0.2,
                                 dead_after=0.8) as (core, edge):
            sd = str(tmp_path)
            events: list[flowlib.FailoverEvent] = []
            rx = await flowlib.connect([udp(edge), udp(core)], name="rx", state_dir=sd,
                                       liveness_interval=0.2, dead_after=0.8,
                                       on_failover=events.append)
            tx = await flowlib.connect(addr(core), name="tx", state_dir=sd)
            flow = await tx.create()
            lst = await rx.listen(flow, 32)
            await tx.send(flow, b"one")
            assert (await get(lst)).payload == b"one"
            await edge.stop()
            await within(_until(lambda: rx.failovers == 1 and rx.connected))
            assert rx.address == udp(core) and events[0].new_address == udp(core)
            await tx.send(flow, b"two")
            assert (await get(lst)).payload == b"two"
            await rx.close()
            await tx.close()
    run(main())


def test_datagram_links_take_link_keys_and_seal_when_asked(tmp_path: Path) -> None:
    """With link keys a datagram link is taken only sealed: encryption asked for by the
    application (or by the router, link_encrypt); one that neither end seals is refused as
    udp-unsealed, as the routers' own UDP links are."""

    async def main() -> None:
        sd = str(tmp_path)
        for router_asks in (False, True):
            node = one_router(link_keys={"app": KEY}, link_auth_endpoints=True,
                              link_encrypt=router_asks)
            await node.start()
            try:
                with pytest.raises(flowlib.ConnectError, match="authenticate"):
                    await flowlib.connect(udp(node), name="anon", state_dir=sd, timeout=2)
                if not router_asks:
                    with pytest.raises(flowlib.ConnectError, match="encryption"):
                        await flowlib.connect(udp(node), name="plain", state_dir=sd,
                                              link_key=("app", KEY), timeout=2)
                    assert node.core.counters["refused.udp-unsealed"] == 1
                async with await flowlib.connect(udp(node), name="alice", state_dir=sd,
                                                 link_key=("app", KEY),
                                                 encrypt=not router_asks) as alice:
                    assert alice.encrypted
                    # the router lists alice's datagram link as sealed (once our AUTH is in)
                    await within(_until(
                        lambda n=node: len(n.status()["link_auth"]["sealed_links"]) == 1))
                    flow = await alice.create()
                    lst = await alice.listen(flow, 32)
                    await arrives_from_tcp(node, flow, lst, b"x" * 200_000, name="bob",
                                           state_dir=sd, link_key=("app", KEY))
                    await alice.send(flow, b"from alice")
                assert node.core.counters["auth.ok"] >= 2
                assert not [k for k in node.core.counters
                            if k.startswith("appdgram.refused")]
            finally:
                await node.stop()
    run(main())


def test_the_router_drops_an_application_that_went_silent(tmp_path: Path) -> None:
    """Liveness as on TCP: when the path to a datagram client is cut (no LEAVE, no close:
    a datagram link has no connection to lose), the router declares it dead after
    dead_after and the client finds its router silent too; an address that said HELLO and
    never spoke liveness is reaped after udp_idle_timeout."""

    async def main() -> None:
        node = one_router(liveness_interval=0.1, dead_after=0.5, udp_idle_timeout=1.0)
        await node.start()
        try:
            assert node.appdgram is not None
            ghost = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            ghost.setblocking(False)
            ghost.connect(node.appdgram.address)
            body = C.Hello(77, C.Role.ENDPOINT, "ghost", 4096, 0).encode()
            ghost.send(prefix(1) + C.hello_header(len(body)) + body)
            path = await OnPath.start(node.appdgram.address)
            app = await flowlib.connect(path.address, name="app", state_dir=str(tmp_path),
                                        liveness_interval=0.1, dead_after=0.5)
            flow = await app.create()
            await app.listen(flow, 32)
            assert len(node.appdgram.links) == 2 and node.core.flows
            path.close()  # the path is cut
            await within(_until(lambda: node.core.counters["liveness.dead"] >= 1
                                and not app.connected and not node.core.flows), 5)
            await within(_until(lambda: not node.appdgram.links), 5)  # type: ignore[union-attr]
            ghost.close()
            await app.close()
        finally:
            await node.stop()
    run(main())


def test_the_app_listener_refuses_routers_and_garbage(tmp_path: Path) -> None:
    """Only applications link on app_udp; a datagram that is not whole frames is dropped
    alone (the link beside it carries on); garbage from a new address costs no state."""

    async def main() -> None:
        node = one_router()
        await node.start()
        try:
            assert node.appdgram is not None
            host, port = node.appdgram.address
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.connect((host, port))
            sock.send(b"\x00" * 64)  # garbage: no link for it
            body = C.Hello(77, C.Role.ROUTER, "sneaky", 4096, 0x10).encode()
            hello = pack_header(LINK_LOCAL_FLOW.key, len(body), 0) + body
            sock.send(struct.pack("!2sBBI", b"Fd", 1, 0, 1) + hello)
            await within(_until(lambda: refused(node) >= 1))
            await within(_until(lambda: not node.appdgram.links  # type: ignore[union-attr]
                                and node.core.counters["appdgram.no-hello"] == 0
                                and not any(lk.role is C.Role.ROUTER
                                            for lk in node.core.links.values())))
            sock.close()
            async with await flowlib.connect(udp(node), name="app",
                                             state_dir=str(tmp_path)) as app:
                flow = await app.create()
                lst = await app.listen(flow, 32)
                other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                other.sendto(struct.pack("!2sBBI", b"Fd", 1, 0, 9) + b"\x01" * 30,
                             (host, port))
                other.close()
                await arrives_from_tcp(node, flow, lst, b"still here", name="tx",
                                       state_dir=str(tmp_path))
            assert refused(node) >= 2
        finally:
            await node.stop()
    run(main())


class OnPath(asyncio.DatagramProtocol):
    """A host on the path between an application and its router: the application talks to
    :attr:`address`, the router sees the relay's address as the application's. Subclasses
    change what passes (:meth:`to_app`, :meth:`to_router`)."""

    def __init__(self) -> None:
        self.app: Any = None
        self.transport: Any = None
        self.up: Any = None

    @classmethod
    async def start(cls, router: tuple[str, int], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        me = cls(*args)
        await loop.create_datagram_endpoint(lambda: me, local_addr=("127.0.0.1", 0))
        me.up, _ = await loop.create_datagram_endpoint(lambda: _Up(me), remote_addr=router)
        return me

    @property
    def address(self) -> str:
        return "udp://%s:%d" % self.transport.get_extra_info("sockname")[:2]

    def close(self) -> None:
        self.transport.close()
        self.up.close()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.app = addr
        self.to_router(data)

    def to_router(self, data: bytes) -> None:
        self.up.sendto(data)

    def to_app(self, data: bytes) -> None:
        if self.app is not None:
            self.transport.sendto(data, self.app)


class _Up(asyncio.DatagramProtocol):
    def __init__(self, path: OnPath) -> None:
        self.path = path

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.path.to_app(data)


class ThinPath(OnPath):
    """A constrained path: datagrams toward the application leave at *rate* bytes/s
    through a queue of *depth* datagrams (a small bottleneck buffer: what does not fit is
    lost); the other way is free."""

    def __init__(self, rate: float, depth: int) -> None:
        super().__init__()
        self.rate = rate
        self.depth = depth
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.lost = 0
        self.pump = asyncio.ensure_future(self._pump())

    def to_app(self, data: bytes) -> None:
        if self.queue.qsize() >= self.depth:
            self.lost += 1
            return
        self.queue.put_nowait(data)

    async def _pump(self) -> None:
        while True:
            data = await self.queue.get()
            await asyncio.sleep(len(data) / self.rate)
            super().to_app(data)

    def close(self) -> None:
        self.pump.cancel()
        super().close()


class Forger(OnPath):
    """An attacker on the path: replays every datagram it passes, both ways, and sends
    its own plain datagrams carrying a message for *flow* each way (:meth:`inject`)."""

    def to_router(self, data: bytes) -> None:
        super().to_router(data)
        super().to_router(data)

    def to_app(self, data: bytes) -> None:
        super().to_app(data)
        super().to_app(data)

    def inject(self, flow: Any, text: bytes) -> None:
        datagram = prefix(77) + pack_header(flow.key, len(text), 32) + text
        super().to_router(datagram)
        super().to_app(datagram)


class LosesFirst(OnPath):
    """Loses the first *n* datagrams each way (the handshake's)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.up_left = self.down_left = n

    def to_router(self, data: bytes) -> None:
        if self.up_left:
            self.up_left -= 1
            return
        super().to_router(data)

    def to_app(self, data: bytes) -> None:
        if self.down_left:
            self.down_left -= 1
            return
        super().to_app(data)


@pytest.mark.parametrize("keys", [False, True])
def test_a_lost_handshake_datagram_costs_a_repeat_not_the_link(tmp_path: Path,
                                                                keys: bool) -> None:
    async def main() -> None:
        node = one_router(**({"link_keys": {"app": KEY}, "link_auth_endpoints": True,
                              "liveness_interval": 0.3} if keys else {}))
        await node.start()
        try:
            assert node.appdgram is not None
            path = await LosesFirst.start(node.appdgram.address, 1)
            kw: dict[str, Any] = {"link_key": ("app", KEY), "encrypt": True} if keys else {}
            start = time.monotonic()
            async with await flowlib.connect(path.address, name="app", timeout=5,
                                             state_dir=str(tmp_path), **kw) as app:
                assert time.monotonic() - start < 3.0
                assert app.counters["dgram.hello-repeated"] >= 1
                flow = await app.create()
                lst = await app.listen(flow, 32)
                await arrives_from_tcp(node, flow, lst, b"up", state_dir=str(tmp_path),
                                       **kw)
            path.close()
        finally:
            await node.stop()
    run(main())


class LosesFirstJoin(OnPath):
    """Loses the application's first datagram that carries a JOIN (plain links)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost_join = False

    def to_router(self, data: bytes) -> None:
        if not self.lost_join and _has_join(data):
            self.lost_join = True
            return
        super().to_router(data)


def _has_join(datagram: bytes) -> bool:
    _seq, frames = split_frames(datagram)
    pos = 0
    while pos < len(frames):
        size = int.from_bytes(frames[pos + 16:pos + 20], "big")
        if frames[pos + 20] == 0 and frames[pos + 25] == C.MsgType.JOIN:
            return True
        pos += 24 + size
    return False


def test_a_lost_join_is_sent_again(tmp_path: Path) -> None:
    """listen() over a datagram link whose JOIN is lost returns after a resend, not after
    the request time-out."""

    async def main() -> None:
        node = one_router()
        await node.start()
        try:
            assert node.appdgram is not None
            path = await LosesFirstJoin.start(node.appdgram.address)
            async with await flowlib.connect(path.address, name="app",
                                             state_dir=str(tmp_path)) as app:
                flow = await app.create()
                start = time.monotonic()
                lst = await app.listen(flow, 32, timeout=5)
                assert path.lost_join and time.monotonic() - start < 2.0
                assert app.counters["join.resent"] >= 1
                await arrives_from_tcp(node, flow, lst, b"joined", state_dir=str(tmp_path))
            path.close()
        finally:
            await node.stop()
    run(main())


def test_an_on_path_attacker_cannot_inject_or_replay_on_a_sealed_datagram_link(
        tmp_path: Path) -> None:
    """Link security as on TCP: with keys and encryption, a host on the path cannot make
    either end take a datagram it forged, nor a second copy of a real one (each is counted
    and dropped); the application sees exactly what was sent."""

    async def main() -> None:
        node = one_router(link_keys={"app": KEY}, link_auth_endpoints=True)
        await node.start()
        try:
            assert node.appdgram is not None
            mallory = await Forger.start(node.appdgram.address)
            sd = str(tmp_path)
            async with (await flowlib.connect(mallory.address, name="alice", state_dir=sd,
                                              link_key=("app", KEY), encrypt=True) as alice,
                        await flowlib.connect(addr(node), name="bob", state_dir=sd,
                                              link_key=("app", KEY)) as bob):
                flow = await bob.create()
                at_alice = await alice.listen(flow, 32)
                at_bob = await bob.listen(flow, 32)
                mallory.inject(flow, b"forged")
                for i in range(5):
                    await bob.send(flow, b"to alice %d" % i)
                    await alice.send(flow, b"to bob %d" % i)
                    mallory.inject(flow, b"forged")
                for i in range(5):
                    assert (await get(at_alice)).payload == b"to alice %d" % i
                    assert (await get(at_bob)).payload == b"to bob %d" % i
                await bob.send(flow, b"end")
                await alice.send(flow, b"end")
                assert (await get(at_alice)).payload == b"end"
                assert (await get(at_bob)).payload == b"end"
                assert at_alice.empty() and at_bob.empty()
                assert alice.counters["dgram.refused.unsealed"] >= 6
                assert alice.counters["dgram.refused.bad-record"] >= 5  # the replays
                assert node.core.counters["appdgram.refused.unsealed"] >= 6
                assert node.core.counters["appdgram.refused.bad-record"] >= 5
            mallory.close()
        finally:
            await node.stop()
    run(main())


def test_a_viewer_behind_a_thin_path_loses_frames_instead_of_falling_behind(
        tmp_path: Path) -> None:
    """About 200 kbit/s of 1 KB pictures toward a viewer behind a 100 kbit/s path: over a
    datagram link the viewer gets about half of them, each late by no more than the path's
    small buffer (delay bounded, not growing), and counts the rest lost from the gaps in
    the datagram numbers."""

    async def main() -> None:
        node = one_router()
        await node.start()
        try:
            assert node.appdgram is not None
            path = await ThinPath.start(node.appdgram.address, 12_500, 4)
            via = path.address
            sd = str(tmp_path)
            viewer = await flowlib.connect(via, name="viewer", state_dir=sd)
            streamer = await flowlib.connect(addr(node), name="streamer", state_dir=sd)
            flow = await streamer.create()
            pictures = await viewer.listen(flow, 32)
            delays: list[float] = []

            async def watch() -> None:
                async for msg in pictures:
                    (sent,) = struct.unpack_from("!d", msg.payload)
                    delays.append(time.monotonic() - sent)

            watching = asyncio.ensure_future(watch())
            sent = 0
            end = time.monotonic() + 3.0
            while time.monotonic() < end:  # 25 pictures a second, 1 KB each
                await streamer.send(flow, struct.pack("!d", time.monotonic()) + bytes(1000))
                sent += 1
                await asyncio.sleep(0.04)
            await asyncio.sleep(0.5)
            watching.cancel()
            got = len(delays)
            assert sent * 0.25 < got < sent * 0.8, (got, sent)
            assert max(delays) < 1.0, max(delays)  # bounded by the path's 4-datagram buffer
            late = delays[len(delays) // 2:]
            assert max(late) < 1.0  # not growing with time
            assert viewer.counters["dgram.lost"] >= path.lost * 0.8 > 0
            path.close()
            await viewer.close()
            await streamer.close()
        finally:
            await node.stop()
    run(main())


def test_flowcat_reaches_its_router_over_a_datagram_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tools take udp:// wherever they take a router address (and say so in --help)."""
    from flowlib.cli import main as flowcat

    monkeypatch.setenv("FLOWNET_STATE_DIR", str(tmp_path))

    async def scenario() -> None:
        node = one_router()
        await node.start()
        try:
            router = udp(node)
            assert await asyncio.to_thread(flowcat, ["create", "--router", router]) == 0
            flow = capsys.readouterr().out.strip()
            listener = asyncio.ensure_future(asyncio.to_thread(
                flowcat, ["listen", "--router", router, "--count", "1", "--timeout", "20",
                          flow]))
            while not node.core.flows:
                await asyncio.sleep(0.01)
            assert await asyncio.to_thread(flowcat, ["send", "-r", router, flow, "hi"]) == 0
            assert await asyncio.wait_for(listener, 30) == 0
            assert "hi" in capsys.readouterr().out
        finally:
            await node.stop()
    asyncio.run(asyncio.wait_for(scenario(), 60))
    with pytest.raises(SystemExit):
        flowcat(["listen", "--help"])
    assert "udp://HOST:PORT" in capsys.readouterr().out
