"""A batch of socket writes (a forwarding pass's), made together, shared with helper threads
when they are many (flowrouter.net.writepool): every link gets its bytes whole and in
order, what a socket does not take is queued as owned copies behind it, and nothing is left
for the next batch."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from flowrouter.net import writepool
from flowrouter.net.writepool import PARALLEL_BYTES, GatheredWrites, default_threads
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import pack_header
from tests.fastpath_support import use_engine

from .rawep import RawEndpoint, chain, run


class Transport:
    """What GatheredWrites sees of an asyncio transport: its queue, and whether it closes."""

    def __init__(self, backlog: bytes = b"") -> None:
        self.queued: list[Any] = [backlog] if backlog else []
        self.closing = False

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.queued))

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: Any) -> None:
        self.queued.append(data)


class Pair:
    """A socket pair: the router's side (non-blocking, *sndbuf*), a reader thread draining the
    other side once :meth:`drain` starts it."""

    def __init__(self, sndbuf: int = 0) -> None:
        self.a, self.b = socket.socketpair()
        self.a.setblocking(False)
        if sndbuf:
            self.a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.got = bytearray()
        self.transport = Transport()
        self.reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        while chunk := self.b.recv(1 << 20):
            self.got.extend(chunk)

    def drain(self) -> bytes:
        """Everything that reached the far side: what the socket took, then the queue."""
        self.reader.start()
        self.a.setblocking(True)
        for q in self.transport.queued:
            assert type(q) in (bytes, memoryview)
            if type(q) is memoryview:
                assert type(q.obj) is bytes, "a view into a reusable buffer was queued"
            self.a.sendall(q)
        self.a.shutdown(socket.SHUT_WR)
        self.reader.join(30)
        return bytes(self.got)

    def close(self) -> None:
        self.a.close()
        self.b.close()


def _writers(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Names of the threads write_direct runs on (recorded)."""
    names: set[str] = set()
    real = writepool.write_direct

    def record(fd: int, buffers: list[Any]) -> tuple[int, int]:
        names.add(threading.current_thread().name)
        return real(fd, buffers)

    monkeypatch.setattr(writepool, "write_direct", record)
    return names


def test_a_large_fan_out_is_written_on_helper_threads_whole_and_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    threads = _writers(monkeypatch)
    pairs = [Pair(sndbuf=1 << 20) for _ in range(8)]
    writes = GatheredWrites(threads=2)
    try:
        src = bytearray(range(256)) * 1024  # 256 KiB, a receive buffer the views point into
        view = memoryview(src)
        want = []
        writes.begin()
        for n, p in enumerate(pairs):
            first = [b"head%d" % n, view[:65536]]
            second = [view[65536 * (n % 4):65536 * (n % 4 + 1)], b"tail%d" % n]
            writes.write(p.transport, p.a.fileno(), first, sum(map(len, first)))
            writes.write(p.transport, p.a.fileno(), second, sum(map(len, second)))
            want.append(b"".join(bytes(b) for b in first + second))
        assert writes.size >= PARALLEL_BYTES
        writes.run()
        assert writes.parallel == 1 and not writes.jobs and not writes.open
        assert {"MainThread", "flowrouter-writer-1", "flowrouter-writer-2"} <= threads
        view[:] = bytes(len(src))  # the read's buffer is reused
        for p, expect in zip(pairs, want, strict=True):
            assert p.drain() == expect
    finally:
        writes.close()
        for p in pairs:
            p.close()


def test_what_a_full_socket_does_not_take_is_queued_as_owned_copies_in_order() -> None:
    pairs = [Pair(sndbuf=4096) for _ in range(6)]
    writes = GatheredWrites(threads=1)
    try:
        src = bytearray(bytes(range(256)) * 4096)  # 1 MiB: far more than a socket takes
        view = memoryview(src)
        writes.begin()
        for p in pairs:
            bufs = [b"h", *(view[i:i + 65536] for i in range(0, len(src), 65536)), b"t"]
            writes.write(p.transport, p.a.fileno(), bufs, len(src) + 2)
        writes.run()
        assert writes.parallel == 1
        expect = b"h" + bytes(src) + b"t"
        view[:] = bytes(len(src))
        for p in pairs:
            assert p.transport.queued, "the socket took everything: the test proves nothing"
            assert p.drain() == expect
    finally:
        writes.close()
        for p in pairs:
            p.close()


def test_a_backlogged_transport_gets_its_writes_queued_and_a_closing_one_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    threads = _writers(monkeypatch)
    pairs = [Pair() for _ in range(6)]
    backlogged, closing = pairs[0], pairs[1]
    backlogged.transport = Transport(backlog=b"earlier")
    closing.transport.closing = True
    writes = GatheredWrites(threads=3)
    try:
        run_bytes = bytes(PARALLEL_BYTES // 4)
        writes.begin()
        for p in pairs:
            writes.write(p.transport, p.a.fileno(), [run_bytes], len(run_bytes))
        writes.run()
        assert backlogged.transport.queued == [b"earlier", run_bytes]  # behind its backlog
        assert closing.transport.queued == []
        assert backlogged.drain() == b"earlier" + run_bytes
        assert closing.drain() == b""  # nothing written to a closing transport's socket
        for p in pairs[2:]:
            assert p.drain() == run_bytes
        assert len(threads) == 4  # the four others: this thread and three helpers
    finally:
        writes.close()
        for p in pairs:
            p.close()


@pytest.mark.parametrize(("threads", "links", "size"), [
    (0, 8, PARALLEL_BYTES),  # turned off
    (2, 8, 1000),  # small: a helper's wake-up would cost more than the writes
    (2, 2, PARALLEL_BYTES),  # few links
])
def test_few_or_small_writes_stay_on_the_loops_thread(
        threads: int, links: int, size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    names = _writers(monkeypatch)
    pairs = [Pair() for _ in range(links)]
    writes = GatheredWrites(threads=threads)
    try:
        data = bytes(size // links)
        writes.begin()
        for p in pairs:
            writes.write(p.transport, p.a.fileno(), [data], len(data))
        writes.run()
        assert writes.parallel == 0 and writes.helpers == [] and names <= {"MainThread"}
        for p in pairs:
            assert p.drain() == data
    finally:
        for p in pairs:
            p.close()


def test_outside_a_read_a_write_goes_at_once() -> None:
    p = Pair()
    writes = GatheredWrites(threads=2)
    try:
        writes.write(p.transport, p.a.fileno(), [b"now"], 3)
        assert not writes.jobs
        assert p.drain() == b"now"
    finally:
        p.close()


def test_a_helper_that_fails_leaves_no_answer_behind_for_the_next_read() -> None:
    pairs = [Pair() for _ in range(4)]
    writes = GatheredWrites(threads=1)
    try:
        big = bytes(PARALLEL_BYTES)
        writes.begin()
        for n, p in enumerate(pairs):
            bad: list[Any] = [big, 12345] if n == 1 else [big]  # n == 1: the helper's share
            writes.write(p.transport, p.a.fileno(), bad, len(big))
        with pytest.raises(TypeError):
            writes.run()
        assert not writes.open and not writes.jobs
        writes.begin()  # the next read: its own answers, not the failed one's
        for p in pairs:
            writes.write(p.transport, p.a.fileno(), [big], len(big))
        writes.run()
        assert writes.parallel == 2
    finally:
        writes.close()
        for p in pairs:
            p.close()


def test_close_ends_the_helper_threads() -> None:
    pairs = [Pair() for _ in range(4)]
    writes = GatheredWrites(threads=2)
    try:
        writes.begin()
        for p in pairs:
            writes.write(p.transport, p.a.fileno(), [bytes(PARALLEL_BYTES)], PARALLEL_BYTES)
        writes.run()
        helpers = [h.thread for h in writes.helpers]
        assert len(helpers) == 2 and all(t.is_alive() for t in helpers)
        writes.close()
        for t in helpers:
            t.join(10)
            assert not t.is_alive()
    finally:
        for p in pairs:
            p.close()


def test_default_threads_leave_a_core_to_the_rest() -> None:
    n = default_threads()
    assert 0 <= n <= 3


FLOW = FlowID(0xB3, 0x10, 21)


@pytest.mark.parametrize("engine", ["native", "twin", "0"])
def test_a_router_fans_out_on_helper_threads_and_every_receiver_gets_every_frame(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    use_engine(engine, monkeypatch)

    async def main() -> None:
        async with chain(1, write_threads=2) as nodes:
            node = nodes[0]
            sender = await RawEndpoint.connect(node, "S")
            receivers = [await RawEndpoint.connect(node, f"R{i}") for i in range(6)]
            for r in receivers:
                assert (await r.join(FLOW, 1 << 40)).status.name == "OK"  # band 40
            assert (await sender.join(FLOW, 1)).status.name == "OK"
            frames, want = [], []
            for i in range(64):  # 64 x ~16 KiB in one write: reads of many frames
                body = i.to_bytes(4, "big") + bytes([i]) * 16380
                frames.append(pack_header(FLOW.key, len(body), 40) + body)
                want.append(body)
            sender.send_raw(b"".join(frames))
            for r in receivers:
                got = [p for _, p in await r.data(len(want), timeout=30)]
                assert got == want
            st = node.status()
            assert st["writes"]["threads"] == 2
            if node.fast is not None:  # the fast path's passes (the core writes frame by frame)
                assert st["writes"]["parallel_batches"] > 0, "none was shared: proves nothing"
            for ep in (sender, *receivers):
                await ep.close()
    run(main(), 120)


def test_settle_writes_a_links_gathered_bytes_before_its_socket_is_used_directly() -> None:
    """A link closed, or sealed, during a read writes what the read gave it first (the
    refusal that closes it, the plain HELLO before sealed records)."""
    p, q = Pair(), Pair()
    writes = GatheredWrites(threads=1)
    try:
        writes.begin()
        writes.write(p.transport, p.a.fileno(), [b"first"], 5)
        writes.write(q.transport, q.a.fileno(), [b"other"], 5)
        writes.settle(p.a.fileno())
        p.a.send(b" then direct")
        writes.run()
        assert p.drain() == b"first then direct" and q.drain() == b"other"
    finally:
        p.close()
        q.close()
