"""The reused receive buffer and the gathered write (flowrouter.net.streamio) inside links.

A TCP link reads every chunk into the same buffer and forwards frames from it in place, so
two things must hold: frames split across reads at any position arrive whole, and nothing
that outlives a read (a queued frame, a transport's pending write) points into the buffer.
Reads are injected straight into a live router's link (``get_buffer``/``buffer_updated``,
as asyncio does) so that every split position is hit deterministically.
"""

from __future__ import annotations

import socket
import threading

import pytest

from flowrouter.net.streamio import SHRINK_AFTER, RecvBuffer, write_gathered
from flowrouter.net.tcp import TcpLink
from flowrouter.wire import control as C
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import HEADER_SIZE, pack_header
from tests.fastpath_support import use_engine

from .rawep import RawEndpoint, chain, run

FLOW = FlowID(0xB3, 0x10, 9)
ENGINES = ["native", "twin", "0"]


def _inject(link: TcpLink, data: bytes) -> None:
    """Deliver *data* to the link as asyncio does (as many reads as its buffer needs)."""
    while data:
        space = link.get_buffer(-1)
        assert len(space) > 0
        n = min(len(space), len(data))
        space[:n] = data[:n]
        del space
        link.buffer_updated(n)
        data = data[n:]


def _link_of(node, ep: RawEndpoint) -> TcpLink:  # type: ignore[no-untyped-def]
    host, port = ep.writer.get_extra_info("sockname")[:2]
    (link,) = [lk for lk in node.links.values()
               if isinstance(lk, TcpLink) and lk.address == f"{host}:{port}"]
    return link


def _frames(sizes: list[int], tag: int) -> tuple[list[bytes], list[bytes]]:
    """Data frames of the given payload sizes (distinct contents per *tag*) and a control
    frame (A's mask, unchanged) among them; returns (frames, payloads expected)."""
    frames, want = [], []
    for i, size in enumerate(sizes):
        body = bytes((tag * 31 + i * 7 + j) & 0xFF for j in range(size))
        frames.append(pack_header(FLOW.key, len(body), 40) + body)
        want.append(body)
        if i == 1:
            mask = C.Mask(1).encode()
            frames.append(pack_header(FLOW.key, len(mask), 0) + mask)
    return frames, want


async def _pair(nodes):  # type: ignore[no-untyped-def]
    a = await RawEndpoint.connect(nodes[0], "A")
    b = await RawEndpoint.connect(nodes[-1], "B")
    assert (await a.join(FLOW, 1)).status is C.JoinStatus.OK
    assert (await b.join(FLOW, 1 << 40)).status is C.JoinStatus.OK
    return a, b


@pytest.mark.parametrize("engine", ENGINES)
def test_frames_split_at_every_position_arrive_whole(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    use_engine(engine, monkeypatch)

    async def main() -> None:
        async with chain(1) as nodes:
            a, b = await _pair(nodes)
            link = _link_of(nodes[0], a)
            small, want_small = _frames([0, 5, 100, 3], 1)
            blob = b"".join(small)
            for cut in range(1, len(blob)):  # every position of a small stream
                _inject(link, blob[:cut])
                _inject(link, blob[cut:])
                got = [p for _, p in await b.data(len(want_small))]
                assert got == want_small, cut
            # large frames (past the receive buffer's first size, forwarded by reference
            # where the engine does that): every position around each frame boundary
            big, want_big = _frames([65536, 30000, 9000, 65000], 2)
            blob = b"".join(big)
            bounds, at = [], 0
            for f in big:
                at += len(f)
                bounds.append(at)
            cuts = sorted({c for e in [0, *bounds] for c in range(e - 30, e + 31)
                           if 0 < c < len(blob)} | set(range(1, len(blob), 4099)))
            for cut in cuts:
                _inject(link, blob[:cut])
                _inject(link, blob[cut:])
                got = [p for _, p in await b.data(len(want_big))]
                assert got == want_big, cut
            assert nodes[0].core.counters["malformed"] == 0
            assert link.rx.pending == 0 and link.pending() == 0
            for ep in (a, b):
                await ep.close()
    run(main(), 120)


@pytest.mark.parametrize("engine", ENGINES)
def test_queued_frames_survive_the_buffer_being_reused(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """B's output is paused, so A's frames wait in B's queue while A's link reads on into
    the same buffer: what B finally gets must be what A sent, not later reads' bytes."""
    use_engine(engine, monkeypatch)

    async def main() -> None:
        async with chain(1) as nodes:
            a, b = await _pair(nodes)
            node = nodes[0]
            link = _link_of(node, a)
            out_b = _link_of(node, b).out
            assert out_b is not None
            out_b.pause()
            want = []
            for tag in range(6):  # each round overwrites the buffer the last one used
                frames, payloads = _frames([20000, 10, 64000, 9000], tag)
                want += payloads
                _inject(link, b"".join(frames))
            assert out_b.waiting > 0  # held whole or queued, owned copies either way
            out_b.resume()
            got = [p for _, p in await b.data(len(want), timeout=20)]
            assert got == want
            for ep in (a, b):
                await ep.close()
    run(main(), 120)


def test_receive_buffer_keeps_grows_and_moves_an_incomplete_frame() -> None:
    rx = RecvBuffer(initial=64, most=256)
    space = rx.space()
    space[:64] = bytes(range(64))
    rx.filled(64)  # a full read: the buffer may grow
    rx.keep(40, HEADER_SIZE)
    assert rx.pending == 24 and len(rx.buf) == 128
    assert bytes(rx.view[rx.start:rx.end]) == bytes(range(40, 64))
    rx.keep(rx.start, 1000)  # a frame larger than the buffer: grows to hold it whole
    assert len(rx.buf) >= 1000 and bytes(rx.view[rx.start:rx.end]) == bytes(range(40, 64))
    rx.filled(len(rx.space()))
    rx.keep(rx.end - 3, 500)  # little room behind: moved to the front
    assert rx.start == 0 and rx.pending == 3
    assert rx.take() == bytes(rx.buf[:3]) and rx.pending == 0


def test_receive_buffer_grows_while_reads_fill_it_and_shrinks_when_they_stay_small() -> None:
    rx = RecvBuffer(initial=64, most=256)

    def read(n: int) -> None:
        rx.filled(n)
        rx.keep(rx.end, HEADER_SIZE)  # every frame whole: nothing kept

    for _ in range(4):
        read(len(rx.space()))
    assert len(rx.buf) == 256  # doubled up to its most, no further
    for _ in range(SHRINK_AFTER - 1):
        read(10)
    assert len(rx.buf) == 256
    read(64)  # a read of a quarter or more starts the count again
    for _ in range(SHRINK_AFTER):
        read(10)
    assert len(rx.buf) == 128
    for _ in range(3 * SHRINK_AFTER):
        read(10)
    assert len(rx.buf) == 64  # never under its first size


def test_the_tail_of_a_bytes_object_is_queued_without_a_copy() -> None:
    """Bytes cannot change: what the socket did not take of one (a fan-out's shared run,
    written to a hundred receivers) is queued as a view of it, not copied per receiver."""
    a, b = socket.socketpair()
    a.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    queued: list[object] = []

    class Transport:
        def get_write_buffer_size(self) -> int:
            return 0

        def write(self, data: object) -> None:
            queued.append(data)

    try:
        run_bytes = bytes(range(256)) * 4096
        write_gathered(Transport(), a.fileno(), [run_bytes])
        (tail,) = queued
        assert type(tail) is memoryview and tail.obj is run_bytes
        assert 0 < len(tail) < len(run_bytes) and bytes(tail) == run_bytes[-len(tail):]
    finally:
        a.close()
        b.close()


def test_gathered_write_leaves_nothing_pointing_into_the_buffer() -> None:
    """A socket that takes only part of a write: the rest is queued as owned copies, so
    overwriting the source buffer afterwards changes nothing that is sent."""
    a, b = socket.socketpair()
    a.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    class Transport:
        def __init__(self) -> None:
            self.queued: list[bytes] = []

        def get_write_buffer_size(self) -> int:
            return sum(map(len, self.queued))

        def write(self, data: bytes) -> None:
            assert type(data) is bytes
            self.queued.append(data)

        def writelines(self, data: list[bytes]) -> None:
            for d in data:
                self.write(d)

    try:
        src = bytearray(bytes(range(256)) * 4096)  # 1 MiB: far more than the socket takes
        view = memoryview(src)
        pieces = [b"head", *(view[i:i + 65536] for i in range(0, len(src), 65536)), b"tail"]
        expect = b"".join(bytes(p) for p in pieces)
        t = Transport()
        write_gathered(t, a.fileno(), pieces)
        assert t.queued, "the socket took everything: the test proves nothing"
        view[:] = bytes(len(src))  # the buffer is reused
        write_gathered(t, a.fileno(), [b"more"])  # something queued: all goes behind it
        got = bytearray()

        def reader() -> None:
            while chunk := b.recv(1 << 20):
                got.extend(chunk)

        th = threading.Thread(target=reader)
        th.start()
        a.setblocking(True)
        for q in t.queued:
            a.sendall(q)
        a.shutdown(socket.SHUT_WR)
        th.join(60)
        assert bytes(got) == expect + b"more"
    finally:
        a.close()
        b.close()


def test_receive_buffer_waits_for_the_whole_frame_it_keeps() -> None:
    rx = RecvBuffer(initial=256, most=256)
    assert not rx.waiting
    rx.filled(30)
    rx.keep(10, 100)  # a 100-byte frame starts at 10; 20 bytes of it are in
    assert rx.waiting and rx.need == 100
    rx.filled(79)
    assert rx.waiting
    rx.filled(1)
    assert not rx.waiting
    rx.keep(rx.end, 24)  # all consumed
    assert rx.pending == 0 and not rx.waiting
