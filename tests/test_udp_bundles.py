"""Bundled UDP datagrams (flowrouter.net.udpio, flowrouter.net.udp): several whole frames per
datagram between peers that announce FEATURE_DGRAM_BUNDLE. The compiled send and receive
give the same datagrams and counts as the Python reference for any frames, cuts and bundle
sizes; packing then splitting gives the frames back; the receive splitter survives any
bytes (fuzzed); routers bundle between themselves, never toward a peer that did not
announce it, and count what the kernel dropped for a full receive buffer (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrouter.net import udpio
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.configfile import config_from_dict
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import pack_header

from .rawep import run, until, within
from .udpsock import NATIVE, cut, drain, udp_sockets

needs_native = pytest.mark.skipif(not NATIVE, reason="flowrouter.net._udpio not built")
FLOW = FlowID(0xB3, 0x10, 9)
TWINS = [udpio.PyDatagramIO, *([udpio.NativeDatagramIO] if NATIVE else [])]


def _frame(payload: bytes, band: int = 40) -> bytes:
    return pack_header(FLOW.key, len(payload), band) + payload


def _split(datagram: bytes) -> list[bytes]:
    """The frames of a datagram (a test oracle: walks the size fields)."""
    out, pos = [], 0
    while pos < len(datagram):
        end = pos + 24 + int.from_bytes(datagram[pos + 16:pos + 20], "big")
        out.append(datagram[pos:end])
        pos = end
    return out


# ----------------------------------------------------------------------------- packing
frames_st = st.lists(st.binary(max_size=3000), min_size=1, max_size=40).map(
    lambda ps: [_frame(p, 16 + i % 100) for i, p in enumerate(ps)])
bundle_st = st.sampled_from([0, 1, 24, 100, 1472, 4000, 65507])


@settings(max_examples=200, deadline=None)
@given(frames=frames_st, bundle=bundle_st, cuts=st.lists(st.integers(0, 200_000), max_size=8))
def test_packing_then_splitting_gives_the_frames_back(frames: list[bytes], bundle: int,
                                                      cuts: list[int]) -> None:
    grams = udpio.bundle_frames(udpio.split_frames(cut(b"".join(frames), cuts)), bundle)
    datagrams = [b"".join(bytes(s) for s in g) for g in grams]
    assert [f for d in datagrams for f in _split(d)] == frames  # in order, nothing lost
    assert [udpio.frames_in(d) for d in datagrams] == [len(_split(d)) for d in datagrams]
    for d, g in zip(datagrams, grams):
        assert len(d) <= bundle or udpio.frames_in(d) == 1  # only a lone frame is larger
        assert len(g) <= udpio.MAX_SEGMENTS
    for d, nxt in zip(datagrams, datagrams[1:]):  # greedy: the next frame did not fit
        assert bundle == 0 or len(d) + len(_split(nxt)[0]) > bundle
    if bundle == 0:
        assert datagrams == frames


def test_a_bundle_holds_at_most_max_segments_pieces() -> None:
    tiny = [_frame(b"")] * 3000  # 72,000 bytes of 24-byte frames, each its own piece
    grams = udpio.bundle_frames(udpio.split_frames(tiny), 65507)
    assert [len(g) for g in grams] == [udpio.MAX_SEGMENTS, udpio.MAX_SEGMENTS, 952]


@needs_native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=frames_st, bundle=bundle_st, cuts=st.lists(st.integers(0, 200_000), max_size=8),
       groups=st.integers(min_value=1, max_value=3))
def test_send_twins_bundle_alike(frames: list[bytes], bundle: int, cuts: list[int],
                                 groups: int) -> None:
    got: dict[str, Any] = {}
    with udp_sockets(3) as (tx, rx1, rx2):
        for cls in (udpio.PyDatagramIO, udpio.NativeDatagramIO):
            io = cls(tx)
            items: list[tuple[Any, ...]] = []
            for g in range(groups):  # the frames dealt over items to two receivers
                part = frames[g::groups]
                if part:
                    dest = io.dest((rx1 if g % 2 == 0 else rx2).getsockname())
                    items.append((dest, cut(b"".join(part), cuts), bundle))
            result = io.send(items)
            got[cls.__name__] = (result, drain(rx1), drain(rx2))
    py, native = got["PyDatagramIO"], got["NativeDatagramIO"]
    assert py == native
    assert py[0][1:] == (0, 0, 0)
    assert sorted(f for d in py[1] + py[2] for f in _split(d)) == sorted(frames)


# ----------------------------------------------------------------------------- receiving
def _mangled(frames: list[bytes], how: int, at: int) -> bytes:
    """A bundle broken in one of the ways a wire or an attacker may break it."""
    blob = bytearray(b"".join(frames))
    at %= len(blob) + 1
    if how == 0:  # truncated
        return bytes(blob[:at])
    if how == 1 and len(blob) >= 20:  # a size field made larger or smaller
        pos = at % max(1, len(blob) - 20)
        blob[pos:pos + 4] = (int.from_bytes(blob[pos:pos + 4], "big") ^ 0x5A5).to_bytes(4, "big")
        return bytes(blob)
    if how == 2:  # junk appended
        return bytes(blob) + bytes(at % 30)
    return bytes(blob)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.lists(st.one_of(
    st.binary(max_size=200),
    st.tuples(frames_st, st.integers(0, 3), st.integers(0, 100_000)).map(
        lambda t: _mangled(t[0][:6], t[1], t[2]))), min_size=1, max_size=12))
def test_receive_twins_split_any_bytes_alike(data: list[bytes]) -> None:
    """Fuzz: whatever arrives, each twin reports the same datagrams and the same count of
    whole frames (0 for anything that is not whole frames), and never fails."""
    results = []
    with udp_sockets(2) as (rx, tx):
        for cls in TWINS:
            io = cls(rx, batch=8)
            for d in data:
                tx.sendto(d[:65000], rx.getsockname())
            out: list[Any] = []
            while True:
                blob, grams, drops = io.recv()
                if not grams:
                    break
                assert drops == 0
                out += [(a, n, f) for a, n, f in grams]
                pos = 0
                for _a, n, f in grams:
                    d = blob[pos:pos + n]
                    assert f == udpio.frames_in(d)
                    if f:
                        assert b"".join(_split(d)) == d and len(_split(d)) == f
                    pos += n
            assert [n for _a, n, _f in out] == [len(d[:65000]) for d in data]
            results.append(out)
    assert all(r == results[0] for r in results)


# ----------------------------------------------------------------------------- routers
class UdpEndpoint:
    """An application on a router's UDP socket; announces bundles when *features* says."""

    def __init__(self, router: tuple[str, int], features: int = 0) -> None:
        self.router = router
        self.features = features
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.datagrams: list[bytes] = []

    def send(self, datagram: bytes) -> None:
        self.sock.sendto(datagram, self.router)

    async def datagram(self) -> bytes:
        loop = asyncio.get_running_loop()
        data, _ = await within(loop.sock_recvfrom(self.sock, 65536))
        self.datagrams.append(data)
        return data

    async def frames(self) -> list[bytes]:
        return _split(await self.datagram())

    async def attach(self, name: str, mask: int) -> None:
        body = C.Hello(12, C.Role.ENDPOINT, name, 65000).encode()
        self.send(C.hello_header(len(body), self.features) + body)
        while not any(f[20] == 0 and isinstance(C.decode(f[24:]), C.Hello)
                      for f in await self.frames()):
            pass
        join = C.Join(1, mask).encode()
        self.send(pack_header(FLOW.key, len(join), 0) + join)
        while True:
            for f in await self.frames():
                if f[:16] == FLOW.key and f[20] == 0:
                    msg = C.decode(f[24:])
                    if isinstance(msg, C.JoinAck):
                        assert msg.status is C.JoinStatus.OK
                        return

    def close(self) -> None:
        self.sock.close()


@contextlib.asynccontextmanager
async def _chain(name: str, pub_features: int, sub_features: int, **kw: Any
                 ) -> AsyncIterator[tuple[RouterNode, RouterNode, UdpEndpoint, UdpEndpoint]]:
    """pub -udp- edge -udp- core -udp- sub, the endpoints attached (sub to band 40)."""
    core = RouterNode(NodeConfig(f"{name}2", listen="", udp="127.0.0.1:0",
                                 accept_routers=[f"{name}1@127.0.0.1"],
                                 core_lsids=frozenset({0x10}), **kw))
    await core.start()
    edge = RouterNode(NodeConfig(f"{name}1", listen="", udp="127.0.0.1:0", peers=[
        PeerConfig("%s:%d" % core.udp_address, f"{name}2", transport="udp")], **kw))
    await edge.start()
    pub = UdpEndpoint(edge.udp_address, pub_features)
    sub = UdpEndpoint(core.udp_address, sub_features)
    try:
        await within(edge.wait_routes(0x10))
        await sub.attach("sub", 1 | 1 << 40)
        await pub.attach("pub", 1)
        yield edge, core, pub, sub
    finally:
        pub.close()
        sub.close()
        await edge.stop()
        await core.stop()


@contextlib.asynccontextmanager
async def _with_a_bad_peer(name: str) -> AsyncIterator[
        tuple[RouterNode, UdpEndpoint, UdpEndpoint, UdpEndpoint]]:
    """One router; pub, sub (band 40) and *bad* attached to it straight, pub and bad
    announcing bundles (bad is the peer that will send broken ones)."""
    core = RouterNode(NodeConfig(name, listen="", udp="127.0.0.1:0",
                                 core_lsids=frozenset({0x10})))
    await core.start()
    pub, sub = UdpEndpoint(core.udp_address, C.FEATURES), UdpEndpoint(core.udp_address)
    bad = UdpEndpoint(core.udp_address, C.FEATURES)
    try:
        await sub.attach("sub", 1 | 1 << 40)
        await pub.attach("pub", 1)
        await bad.attach("bad", 1)
        yield core, pub, sub, bad
    finally:
        for ep in (pub, sub, bad):
            ep.close()
        await core.stop()


@pytest.mark.parametrize("size", [100, 3000])
def test_routers_bundle_between_themselves_and_not_toward_a_peer_that_did_not_ask(
        size: int) -> None:
    """pub (bundles) -udp- r1 -udp- r2 -udp- sub (one frame per datagram): every frame
    arrives once, in order; r1 -> r2 carries many frames per datagram, r2 -> sub one."""
    n = 300

    async def main() -> None:
        async with _chain("bd", C.FEATURES, 0) as (edge, core, pub, sub):
            grams0 = core.udp.datagrams_in  # type: ignore[union-attr]
            frames = [_frame(i.to_bytes(4, "big") * (size // 4)) for i in range(n)]
            per = max(1, 60_000 // len(frames[0]))
            for k in range(0, n, per):  # bundles from the publisher too
                pub.send(b"".join(frames[k:k + per]))
            got: list[bytes] = []
            sub.datagrams.clear()
            while len(got) < n:
                got += [f for f in await sub.frames() if f[20] == 40]
            assert [g[24:] for g in got] == [f[24:] for f in frames]
            assert all(len(_split(d)) == 1 for d in sub.datagrams)  # not announced
            into_core = core.udp.datagrams_in - grams0  # type: ignore[union-attr]
            assert into_core <= n // 10 + 5, into_core  # bundled r1 -> r2
            for r in (edge, core):
                assert r.status()["udp_io"]["links_bundling"] >= 1
                assert not any(k.startswith("malformed") for k in r.core.counters)
    run(main())


def test_udp_bundle_zero_sends_a_frame_per_datagram() -> None:
    n = 50

    async def main() -> None:
        async with _chain("bz", 0, C.FEATURES, udp_bundle=0) as (_edge, core, pub, sub):
            grams0 = core.udp.datagrams_in  # type: ignore[union-attr]
            for i in range(n):
                pub.send(_frame(bytes([i]) * 10))
            got: list[bytes] = []
            while len(got) < n:
                got += [f for f in await sub.frames() if f[20] == 40]
            assert [g[24] for g in got] == list(range(n))
            assert core.udp.datagrams_in - grams0 >= n  # type: ignore[union-attr]
            assert core.status()["udp_io"]["links_bundling"] == 0
    run(main())


def test_malformed_bundles_drop_only_their_link_and_are_counted() -> None:
    """From a peer that announced bundles: a truncated bundle and one with a frame of a bad
    band drop that peer's link (counted); the frames of a good sender in between all go
    through, and the router serves on."""
    async def main() -> None:
        async with _with_a_bad_peer("mb") as (core, pub, sub, bad):
            c = core.core.counters
            malformed = c["malformed"]
            good = _frame(b"g" * 8)
            pub.send(b"".join(_frame(bytes([i]) * 8) for i in range(10)))
            bad.send((good * 3)[:-5])  # truncated
            pub.send(b"".join(_frame(bytes([i]) * 8) for i in range(10, 20)))
            await bad.attach("bad", 1)  # a new link for the same address
            bad.send(good + _frame(b"x", band=200) + good)  # a frame of a bad band
            pub.send(b"".join(_frame(bytes([i]) * 8) for i in range(20, 30)))
            got: list[int] = []
            while len(got) < 30:
                got += [f[24] for f in await sub.frames() if f[20] == 40 and f[24] != 0x67]
            assert got == list(range(30))
            assert c["malformed"] - malformed == 2
            assert c["malformed.bad-datagram"] == 1 and c["malformed.bad-band"] == 1
    run(main())


def test_a_full_receive_buffer_is_counted_not_silent() -> None:
    """A burst larger than the router's receive buffer while it cannot run: what the
    kernel drops is counted as drop.udp-rcvbuf, exactly the frames that never arrive."""
    n = 400

    async def main() -> None:
        core = RouterNode(NodeConfig("rb", listen="", udp="127.0.0.1:0",
                                     core_lsids=frozenset({0x10}),
                                     udp_socket_buffer=16 * 1024))
        await core.start()
        pub, sub = UdpEndpoint(core.udp_address), UdpEndpoint(core.udp_address)
        try:
            io = core.status()["udp_io"]
            if not io["kernel_drops_visible"]:
                pytest.skip("this kernel does not report socket drops (SO_RXQ_OVFL)")
            await sub.attach("sub", 1 | 1 << 40)
            await pub.attach("pub", 1)
            for i in range(n):  # no await: the router cannot read meanwhile
                pub.send(_frame(i.to_bytes(2, "big") * 500))
            got = 0
            while True:
                with contextlib.suppress(TimeoutError):
                    payloads = [f[24:] for f in await within(sub.frames(), 0.5) if f[20] == 40]
                    got += sum(1 for p in payloads if p != b"last")
                    if b"last" in payloads:
                        break
                    continue
                pub.send(_frame(b"last"))  # drained: one more carries the kernel's count
            dropped = core.core.counters["drop.udp-rcvbuf"]
            assert 0 < dropped == n - got
            assert core.status()["udp_io"]["kernel_drops"] == dropped
        finally:
            pub.close()
            sub.close()
            await core.stop()
    run(main())


def test_udp_bundle_is_a_checked_config_key() -> None:
    from flowrouter.net.config import ConfigError

    assert config_from_dict({"router": {"name": "x"}}).udp_bundle == "auto"
    assert config_from_dict({"router": {"name": "x", "udp_bundle": 1472}}).udp_bundle == 1472
    assert config_from_dict({"router": {"name": "x", "udp_bundle": 0}}).udp_bundle == 0
    for bad in (-1, 70000, "big"):
        with pytest.raises(ConfigError, match="udp_bundle"):
            config_from_dict({"router": {"name": "x", "udp_bundle": bad}})


def test_status_shows_the_udp_side() -> None:
    from flowrouter.tools.cli import format_status

    async def main() -> None:
        async with _chain("st", C.FEATURES, 0) as (edge, _core, pub, _sub):
            pub.send(_frame(b"x" * 10) * 3)
            st = edge.status()
            io = st["udp_io"]
            assert io["links_bundling"] >= 2 and io["datagrams_in"] > 0
            text = format_status(st)
            line = next(ln for ln in text.splitlines() if ln.startswith("udp: "))
            assert "bundles up to auto bytes" in line and "dropped by the kernel" in line
            assert ("GSO on" in line) is bool(io["gso"])
    run(main())


garbage_st = st.lists(st.one_of(
    st.binary(max_size=100),
    st.tuples(frames_st, st.integers(0, 3), st.integers(0, 100_000)).map(
        lambda t: _mangled(t[0][:5], t[1], t[2]))), min_size=1, max_size=25)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage=garbage_st)
def test_a_router_fed_any_datagrams_serves_on(garbage: list[bytes]) -> None:
    """Fuzz: a peer that announced bundles sends anything at all: the router raises
    nothing, counts every datagram that is not whole frames as malformed, and forwards a
    good sender's frames sent after it, all of them, in order."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[Any] = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        async with _with_a_bad_peer("fz") as (core, pub, sub, bad):
            malformed = core.core.counters["malformed"]
            for d in garbage:
                bad.send(d[:60_000])
            pub.send(b"".join(_frame(bytes([i]) * 8) for i in range(10)))
            got: list[int] = []
            while len(got) < 10:
                got += [f[24] for f in await sub.frames()
                        if f[20] == 40 and f[24:] == bytes([f[24]]) * 8]
            assert got == list(range(10))
            not_frames = sum(1 for d in garbage if not udpio.frames_in(d[:60_000]))
            assert core.core.counters["malformed"] - malformed >= not_frames
            assert not errors, errors
    run(main())


def test_what_a_tick_sends_over_a_udp_link_leaves_bundled() -> None:
    """Frames the core emits on a timer tick (soft-state digests, echoes) toward a UDP peer
    are gathered like a read's and leave in one datagram, not one each."""
    from flowrouter.core.actions import Send

    async def main() -> None:
        async with _chain("tk", 0, 0, tick_interval=0.05) as (edge, core, _pub, _sub):
            link_id = next(lid for lid, lk in edge.core.links.items() if lk.peer_name == "tk2")
            tick = edge.core.tick
            frames = [_frame(bytes([i]) * 20, band=16) for i in range(6)]
            sent = asyncio.Event()
            grams0 = edge.udp.datagrams_out  # type: ignore[union-attr]

            def one_tick(now: float) -> list[Any]:
                if sent.is_set():
                    return tick(now)
                sent.set()
                extra = [Send(link_id, f[:24], f[24:]) for f in frames]
                return extra + tick(now)

            edge.core.tick = one_tick  # type: ignore[method-assign]
            await within(sent.wait())
            out = edge.udp.datagrams_out - grams0  # type: ignore[union-attr]
            assert out <= 2, out  # the six frames and whatever the tick sent: bundled
    run(main())


def test_bundle_sizes_follow_the_peer_and_the_path() -> None:
    from types import SimpleNamespace

    async def main() -> None:
        for conf, expect in (("auto", {"127.0.0.1": 65507, "::1": 65507, "10.1.2.3": 1472,
                                       "2001:db8::1": 1452, "fe80::1%eth0": 1452}),
                             (9000, {"127.0.0.1": 9000, "10.1.2.3": 9000}),
                             (0, {"127.0.0.1": 0, "10.1.2.3": 0})):
            node = RouterNode(NodeConfig("bs", listen="", udp="127.0.0.1:0", udp_bundle=conf))
            await node.start()
            try:
                udp = node.udp
                assert udp is not None
                for host, size in expect.items():
                    link: Any = SimpleNamespace(link_id=-1, addr=(host, 7000))
                    udp.peer_features = lambda _lk: C.FEATURE_DGRAM_BUNDLE  # type: ignore
                    assert udp.bundle_for(link) == size, (conf, host)
                    udp.peer_features = lambda _lk: C.FEATURE_SOFT_STATE  # type: ignore
                    assert udp.bundle_for(link) == 0  # the peer did not announce bundles
            finally:
                await node.stop()
    run(main())


@pytest.mark.parametrize("bundle", ["auto", 0])
def test_bundles_carry_a_burst_that_single_datagrams_lose(bundle: Any) -> None:
    """20,000 16-byte messages at once between two routers whose receive buffers are 1 MiB:
    bundled (a few dozen datagrams) every one arrives; one frame per datagram, the kernel
    charges each datagram far more than its 40 bytes, the core's buffer overflows while the
    edge sends, and what is lost is counted (drop.udp-rcvbuf), never silent."""
    n = 20_000

    async def main() -> None:
        async with _chain("bb", C.FEATURES, C.FEATURES, udp_bundle=bundle,
                          udp_socket_buffer=1 << 20) as (_edge, core, pub, sub):
            frames = [_frame(i.to_bytes(2, "big") * 8) for i in range(n)]
            for k in range(0, n, 1500):  # the publisher's own bundles, all at once
                pub.send(b"".join(frames[k:k + 1500]))
            got = 0
            while True:
                try:
                    got += sum(1 for f in await within(sub.frames(), 1.0)
                               if f[20] == 40 and len(f) == 40)
                except TimeoutError:
                    break
                if got == n:
                    break
            if bundle == "auto":
                assert got == n and core.core.counters["drop.udp-rcvbuf"] == 0
                return
            assert got < n  # lost in the core's socket: now the count must say so
            pub.send(_frame(b"last"))
            await within(until(lambda: core.core.counters["drop.udp-rcvbuf"] > 0))
            assert core.core.counters["drop.udp-rcvbuf"] >= 1
    run(main())
