"""Batched datagram I/O (flowrouter.net.udpio): the compiled recvmmsg/sendmmsg twin gives the
same datagrams and results as the Python loops, and a UDP chain carries a burst through the
batched receive, the fast path and the gathered sends with exact counts (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrouter.net import udpio
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import pack_header

from .rawep import run, within
from .udpsock import NATIVE, cut, drain, udp_sockets

needs_native = pytest.mark.skipif(not NATIVE, reason="flowrouter.net._udpio not built")
FLOW = FlowID(0xB2, 0x10, 7)


def _frame(payload: bytes, band: int = 40) -> bytes:
    return pack_header(FLOW.key, len(payload), band) + payload


def test_split_frames_gives_one_list_per_frame() -> None:
    a, b, c = _frame(b"x" * 10), _frame(b""), _frame(b"y" * 300)
    grams = udpio.split_frames([a + b, c[:5], c[5:30], c[30:]])
    assert [b"".join(bytes(s) for s in g) for g in grams] == [a, b, c]
    with pytest.raises(ValueError):
        udpio.split_frames([a, c[:-1]])


@needs_native
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(st.binary(max_size=1500), min_size=1, max_size=12),
       cuts=st.lists(st.integers(min_value=0, max_value=20000), max_size=8),
       groups=st.integers(min_value=1, max_value=3))
def test_send_twins_send_the_same_datagrams(payloads: list[bytes], cuts: list[int],
                                            groups: int) -> None:
    frames = [_frame(p, 16 + i % 100) for i, p in enumerate(payloads)]
    got: dict[str, Any] = {}
    with udp_sockets(3) as (tx, rx1, rx2):
        for cls in (udpio.PyDatagramIO, udpio.NativeDatagramIO):
            io = cls(tx)
            items = []
            for g in range(groups):  # the frames dealt over items to two receivers
                part = frames[g::groups]
                if part:
                    dest = io.dest((rx1 if g % 2 == 0 else rx2).getsockname())
                    items.append((dest, cut(b"".join(part), cuts)))
            result = io.send(items)
            got[cls.__name__] = (result, drain(rx1), drain(rx2))
    py, native = got["PyDatagramIO"], got["NativeDatagramIO"]
    assert py == native
    assert py[0] == (len(frames), 0, 0, 0)
    assert sorted(py[1] + py[2]) == sorted(frames)


@needs_native
def test_twins_refuse_frames_cut_short_before_sending_anything() -> None:
    with udp_sockets(2) as (tx, rx):
        for cls in (udpio.PyDatagramIO, udpio.NativeDatagramIO):
            io = cls(tx)
            whole = _frame(b"fine")
            with pytest.raises(ValueError):
                io.send([(io.dest(rx.getsockname()), [whole]),
                         (io.dest(rx.getsockname()), [_frame(b"cut")[:-1]])])
            assert drain(rx) == []


@needs_native
def test_twins_count_send_errors_alike() -> None:
    with udp_sockets(2) as (tx, rx):
        results = []
        for cls in (udpio.PyDatagramIO, udpio.NativeDatagramIO):
            io = cls(tx)
            # port 0 cannot be sent to: an error for that datagram only, the rest go
            results.append(io.send([(io.dest(rx.getsockname()), [_frame(b"a")]),
                                    (io.dest(("127.0.0.1", 0)), [_frame(b"b")]),
                                    (io.dest(rx.getsockname()), [_frame(b"c")])]))
            assert drain(rx) == [_frame(b"a"), _frame(b"c")]
        assert results[0] == results[1]
        sent, congested, failed, err = results[0]
        assert (sent, congested, failed) == (2, 0, 1) and err != 0


@needs_native
def test_recv_twins_return_the_same_batches() -> None:
    with udp_sockets(3) as (rx, s1, s2):
        batches: dict[str, list[Any]] = {}
        for cls in (udpio.PyDatagramIO, udpio.NativeDatagramIO):
            io = cls(rx, batch=4)
            assert io.recv() == (b"", [], 0)  # nothing waiting
            f1, f2 = _frame(b"x" * 10), _frame(b"")
            sent = [(s1, b"one"), (s1, b"two" * 100), (s2, b""), (s1, b"four"), (s2, b"5"),
                    (s2, b"six"), (s1, b"seven"), (s1, b"8"), (s2, b"nine" * 3000),
                    (s1, f1), (s2, f1 + f2 + f1), (s1, f1 + f2[:-1])]
            for s, data in sent:
                s.sendto(data, rx.getsockname())
            out = []
            while True:
                blob, grams, drops = io.recv()
                if not grams:
                    break
                assert len(grams) <= 4 and drops == 0  # the batch bound; nothing lost
                assert sum(n for _a, n, _f in grams) == len(blob)
                out.append((bytes(blob), grams))  # the next recv reuses the buffer
            assert b"".join(b for b, _g in out) == b"".join(d for _s, d in sent)
            addrs = [a for _b, g in out for a, _n, _f in g]
            assert addrs == [s.getsockname() for s, _d in sent]
            frames = [f for _b, g in out for _a, _n, f in g]
            assert frames == [0] * 9 + [1, 3, 0]  # whole frames each datagram holds
            batches[cls.__name__] = out
        assert batches["PyDatagramIO"] == batches["NativeDatagramIO"]


def test_io_choice_follows_flownet_native() -> None:
    for value in ("0", "twin"):
        cls, why = udpio.io_choice(value)
        assert cls is udpio.PyDatagramIO and f"FLOWNET_NATIVE={value}" in why
    cls, why = udpio.io_choice("", "py")
    assert cls is udpio.PyDatagramIO and "FLOWNET_UDP_IO=py" in why
    cls, why = udpio.io_choice("", "")
    assert cls is (udpio.NativeDatagramIO if NATIVE else udpio.PyDatagramIO)


@needs_native
def test_native_dest_resolves_names_and_refuses_junk() -> None:
    with udp_sockets(1) as (s,):
        io = udpio.NativeDatagramIO(s)
        assert io.dest(("localhost", 4000)) == io.dest(("127.0.0.1", 4000))
        from flowrouter.net import _udpio  # type: ignore[attr-defined]

        with pytest.raises(ValueError):
            _udpio.sockaddr("not an address", 1)


# ----------------------------------------------------------------------------- runtime
class UdpEndpoint:
    """An application speaking the wire protocol over UDP, one frame per datagram."""

    def __init__(self, router: tuple[str, int]) -> None:
        self.router = router
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)

    def send(self, frame: bytes) -> None:
        self.sock.sendto(frame, self.router)

    def control(self, key: bytes, msg: C.ControlMessage) -> None:
        body = msg.encode()
        self.send(pack_header(key, len(body), 0) + body)

    async def frame(self) -> bytes:
        loop = asyncio.get_running_loop()
        data, _ = await within(loop.sock_recvfrom(self.sock, 65536))
        return data

    async def attach(self, name: str, mask: int) -> None:
        self.control(LINK_LOCAL_FLOW.key, C.Hello(11, C.Role.ENDPOINT, name, 65000))
        while not isinstance(C.decode((await self.frame())[24:]), C.Hello):
            pass
        self.control(FLOW.key, C.Join(1, mask))
        while True:
            data = await self.frame()
            if data[:16] == FLOW.key and data[20] == 0:
                msg = C.decode(data[24:])
                if isinstance(msg, C.JoinAck):
                    assert msg.status is C.JoinStatus.OK
                    return


@pytest.mark.parametrize("n,size", [(120, 100), (24, 20_000)])
def test_udp_chain_carries_a_burst_through_the_batched_path(n: int, size: int) -> None:
    """pub -udp- r1 -udp- r2 -udp- sub: a burst sent while the routers cannot run lands in
    their socket buffers and is taken in batches; every frame arrives, once, in order
    (large payloads leave the engine as views of the received datagrams)."""

    async def main() -> None:
        core = RouterNode(NodeConfig("b2", listen="", udp="127.0.0.1:0",
                                     accept_routers=["b1@127.0.0.1"],
                                     core_lsids=frozenset({0x10})))
        await core.start()
        edge = RouterNode(NodeConfig("b1", listen="", udp="127.0.0.1:0", peers=[
            PeerConfig("%s:%d" % core.udp_address, "b2", transport="udp")]))
        await edge.start()
        pub, sub = UdpEndpoint(edge.udp_address), UdpEndpoint(core.udp_address)
        try:
            await within(edge.wait_routes(0x10))
            await sub.attach("sub", 1 | 1 << 40)
            await pub.attach("pub", 1)
            before = [r.core.counters["forwarded"] for r in (edge, core)]
            calls = [r.fast.stats["calls"] if r.fast else 0 for r in (edge, core)]
            frames = [_frame(i.to_bytes(4, "big") * (size // 4)) for i in range(n)]
            for f in frames:  # no await: all of it waits in the edge's socket buffer
                pub.send(f)
            got = []
            while len(got) < n:
                data = await sub.frame()
                if data[20] == 40:
                    got.append(data)
            assert [g[24:] for g in got] == [f[24:] for f in frames]
            for r, b in zip((edge, core), before):
                assert r.core.counters["forwarded"] - b == n
                assert r.core.counters["drop.link-congested"] == 0
                assert r.core.counters["drop.udp-error"] == 0
                st = r.status()
                assert st["udp_io"]["io"] == r.udp_io_info
            if edge.fast is not None:  # batches of up to 64 datagrams, a call per run
                assert edge.fast.stats["calls"] - calls[0] <= 2 * (n // udpio.BATCH + 1) + 4
                assert core.fast.stats["calls"] - calls[1] < n  # type: ignore[union-attr]
        finally:
            pub.sock.close()
            sub.sock.close()
            await edge.stop()
            await core.stop()
    run(main())


def test_malformed_datagrams_in_a_batch_drop_only_their_link() -> None:
    """A bad datagram among good ones from another sender: its link is dropped and
    counted; the other sender's frames in the same batch are all forwarded."""
    async def main() -> None:
        core = RouterNode(NodeConfig("m1", listen="", udp="127.0.0.1:0",
                                     core_lsids=frozenset({0x10})))
        await core.start()
        pub, sub = UdpEndpoint(core.udp_address), UdpEndpoint(core.udp_address)
        bad = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        bad.bind(("127.0.0.1", 0))
        try:
            await sub.attach("sub", 1 | 1 << 40)
            await pub.attach("pub", 1)
            before = core.core.counters["forwarded"]
            malformed = core.core.counters["malformed"]
            for i in range(30):
                pub.send(_frame(bytes([i]) * 8))
                if i in (5, 20):
                    f = _frame(b"x" * 8)
                    bad.sendto(f + f if i == 5 else f[:-1], core.udp_address)
            got = []
            while len(got) < 30:
                data = await sub.frame()
                if data[20] == 40:
                    got.append(data[24])
            assert got == list(range(30))
            assert core.core.counters["forwarded"] - before == 30
            assert core.core.counters["malformed"] - malformed == 2
        finally:
            pub.sock.close()
            sub.sock.close()
            bad.close()
            await core.stop()
    run(main())


def test_udp_socket_buffer_is_a_checked_config_key() -> None:
    from flowrouter.net.config import ConfigError
    from flowrouter.net.configfile import config_from_dict

    cfg = config_from_dict({"router": {"name": "x", "udp_socket_buffer": 1 << 20}})
    assert cfg.udp_socket_buffer == 1 << 20
    assert config_from_dict({"router": {"name": "x"}}).udp_socket_buffer == 32 << 20
    with pytest.raises(ConfigError, match="udp_socket_buffer"):
        config_from_dict({"router": {"name": "x", "udp_socket_buffer": -1}})


def test_status_reports_the_udp_socket_buffers() -> None:
    async def main() -> None:
        small = 64 * 1024
        node = RouterNode(NodeConfig("sb", listen="", udp="127.0.0.1:0",
                                     udp_socket_buffer=small))
        await node.start()
        try:
            io = node.status()["udp_io"]
            # Linux doubles what it is asked for (bookkeeping), within rmem_max
            assert 0 < io["rcvbuf"] <= 2 * small and 0 < io["sndbuf"] <= 2 * small
        finally:
            await node.stop()
    run(main())
