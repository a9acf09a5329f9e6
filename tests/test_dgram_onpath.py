"""Datagram links with someone on the path (issue 29): a relay between an application and
its router that loses, forges, replays or throttles datagrams. A lost handshake or JOIN
costs a repeat, not the link; sealed links refuse what the relay injects or replays; a
viewer behind a thin path loses frames instead of falling behind, and flowcat reaches its
router over a datagram link. Real sockets on loopback.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest

import flowlib
from flowrouter.wire import control as C
from flowrouter.wire.appdgram import prefix, split_frames
from flowrouter.wire.header import pack_header

from .dgramnet import KEY, arrives_from_tcp, one_router, udp
from .rawep import addr, get, run, until, within


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
            await within(until(lambda: node.core.counters["liveness.dead"] >= 1
                                and not app.connected and not node.core.flows), 5)
            await within(until(lambda: not node.appdgram.links), 5)  # type: ignore[union-attr]
            ghost.close()
            await app.close()
        finally:
            await node.stop()
    run(main())
