"""Holding an input whose outputs all pushed back, credit, and slow consumers, end to end.

When every output an input feeds has pushed back, the router stops reading that input at
once: its frames wait in the kernel's socket buffers instead of being copied into queues,
and TCP pushes back on the sender. It reads again as soon as one of those outputs moves, or
after ``slow_consumer_stall`` seconds (a hung receiver must not hold its sender for long).
The rules themselves are flowrouter.core.flowcontrol's, tested on a virtual clock in
test_flowcontrol. Here, first a router's real LinkOutputs with stand-in links, driven
through the node interface (``register``, ``begin_read``, the outputs' sends and their
transports' push back), with what flow control decided read from ``node.flow.control``;
then on real sockets.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flowrouter.core.flowstates import InputState
from flowrouter.net.config import Emulation, NodeConfig
from flowrouter.net.output import LinkOutput
from flowrouter.net.runtime import RouterNode
from flowrouter.net.tcp import TcpLink, reap_stalled_frames
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import FrameDecoder, pack_header

from .rawep import RawEndpoint, blocking_member, until

LSID = 0x10
FLOW = FlowID(0xB1, LSID, 1)


class _Link:
    """Stands in for a TcpLink (flowrouter.net.nodeapi.Link): whether it reads, and its
    output, which writes nowhere. Registered with the node, which numbers links from 1."""

    address = "stand-in"

    def __init__(self, node: RouterNode, link_id: int) -> None:
        self.reading = True
        self.link_id = node.register(self)
        assert self.link_id == link_id
        self.out = LinkOutput(node, link_id, lambda h, p: None, lambda bufs: None)

    def set_reading(self, on: bool) -> None:
        self.reading = on

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        self.out.send(header, payload)

    def close(self, reason: str) -> None:
        self.out.close()

    abort = close


MakeNode = Callable[..., RouterNode]


@pytest.fixture
def make_node() -> Iterator[MakeNode]:
    """Routers that are never started: their outputs and links are driven by hand (each
    gets a loop of its own only for its clock)."""
    loops: list[asyncio.AbstractEventLoop] = []

    def make(**extra: Any) -> RouterNode:
        loops.append(asyncio.new_event_loop())
        return RouterNode(NodeConfig("bp", **extra), loop=loops[-1])

    yield make
    for loop in loops:
        loop.close()


def _read(node: RouterNode, origin: int, *outs: _Link, size: int = 2) -> None:
    """One read of input *origin* that gives each of *outs* a data frame of *size* bytes."""
    reads = node.begin_read(origin)
    for link in outs:
        link.out.send(pack_header(FLOW.key, size, 40), bytes(size))
    reads.end()


def test_input_is_held_only_when_every_output_it_feeds_pushed_back(make_node: MakeNode) -> None:
    node = make_node()
    fc = node.flow.control
    src, a, b = (_Link(node, i) for i in (1, 2, 3))
    _read(node, 1, a, b)
    a.out.pause()
    assert src.reading and not fc.holders(1)  # b still takes the input's frames
    b.out.pause()
    assert not src.reading and fc.holders(1) == {2, 3}
    assert node.core.counters["credit.held"] == 1
    a.out.resume()  # the fastest output sets the pace: one moving is enough
    assert src.reading and not fc.holders(1)


def test_replies_to_the_sender_and_outputs_fed_by_others_do_not_count(
        make_node: MakeNode) -> None:
    node = make_node()
    src, a, idle, other = (_Link(node, i) for i in (1, 2, 3, 4))
    _read(node, 4, idle)  # fed by another input
    _read(node, 1, src, a)  # the router answered the sender on its own link too
    a.out.pause()
    assert not src.reading and node.flow.control.holders(1) == {2}
    assert other.reading


def test_a_sibling_that_took_the_inputs_frames_lately_still_counts(make_node: MakeNode) -> None:
    """Y carries input 1's flow and input 2's: its last frame may be 2's while it still
    takes 1's, and then 1 must not be held for X (one slow receiver)."""
    node = make_node()
    fc = node.flow.control
    src, _, x, y = (_Link(node, i) for i in (1, 2, 3, 4))
    _read(node, 1, x, y)
    y.out.track.fed = 2  # what its hot path notes when 2's frame goes last
    x.out.pause()
    assert src.reading and not fc.holders(1)
    reads = node.begin_read(1)  # a later read of input 1 gives X frames and Y none
    x.out.resume()
    x.out.send(pack_header(FLOW.key, 2, 40), b"x1")
    x.out.pause()
    reads.end()
    assert not src.reading and fc.holders(1) == {3}
    node.unregister(1)
    assert 1 not in y.out.fed_read  # a closed input feeds nothing


def test_only_a_sibling_that_took_the_frames_since_the_stall_frees_the_credit(
        make_node: MakeNode) -> None:
    """An output that once took the input's frames (another band, long ago) is no evidence
    that they flow: a lone receiver behind must push back on its sender, not be taken for
    a slow consumer and lose frames."""
    node = make_node(link_credit=4096, slow_consumer_idle=0.0)  # (not-draining at once)
    src, out, once = _Link(node, 1), _Link(node, 2), _Link(node, 3)
    _read(node, 1, once)  # input 1's frames, many reads ago
    for _ in range(5):
        _read(node, 2)
    out.out.pause()  # its socket pushed back (in another input's read)
    reads = node.begin_read(1)
    for _ in range(2):
        out.out.send(pack_header(FLOW.key, 3000, 40), bytes(3000))
    assert not src.reading and not out.out.stuck  # paused for credit: pushed back
    assert node.core.counters["credit.not-draining"] == 0
    once.out.send(pack_header(FLOW.key, 2, 40), b"o1")  # now a sibling does take its frames
    reads.end()
    once.out.pause()
    once.out.resume()  # ... and drains
    assert out.out.stuck and node.core.counters["credit.not-draining"] == 1
    assert src.reading  # the slow output gave its credit back
    assert node.flow.control.pending(1) == 0


def test_a_held_input_over_its_credit_waits_for_both(make_node: MakeNode) -> None:
    node = make_node(link_credit=4096)
    fc = node.flow.control
    src, a, slow = _Link(node, 1), _Link(node, 2), _Link(node, 3)
    slow.out.emulate(Emulation(delay=10.0))  # frames wait here for the emulated delay
    reads = node.begin_read(1)
    a.out.send(pack_header(FLOW.key, 2, 40), b"a1")
    a.out.pause()
    assert fc.state(1) is InputState.HELD
    slow.out.send(pack_header(FLOW.key, 10_000, 40), bytes(10_000))  # the rest of the read
    reads.end()
    assert fc.state(1) is InputState.HELD_OVER_CREDIT
    a.out.resume()
    assert not src.reading and fc.state(1) is InputState.PAUSED  # credit still says no
    slow.out.emulate(None)  # its frames leave the queue
    assert src.reading and fc.pending(1) == 0


def test_frames_in_an_emulated_delay_line_go_on_when_emulation_ends(make_node: MakeNode) -> None:
    node = make_node(link_credit=4096)
    src, x = _Link(node, 1), _Link(node, 2)
    sent: list[bytes] = []
    x.out.write = lambda h, p: sent.append(bytes(p))
    x.out.emulate(Emulation(delay=10.0))
    for size in (3000, 3000):  # they wait out the delay, holding the input's credit
        _read(node, 1, x, size=size)
    assert not src.reading and not sent
    x.out.emulate(None)
    assert [len(p) for p in sent] == [3000, 3000]  # none lost in the old queue
    assert src.reading and node.flow.control.pending(1) == 0


def test_a_paused_output_queues_a_batch_whole_and_drains_in_one_write(
        make_node: MakeNode) -> None:
    """A receiver behind: what the fast path gathered for it from one flow waits in its
    queue as one entry (no work per frame), holding its input's credit, and the queue
    drains in gathered writes (one system call, not one per frame)."""
    node = make_node(link_credit=64 * 1024)
    fc = node.flow.control
    src, x = _Link(node, 1), _Link(node, 2)
    writes: list[bytes] = []
    x.out.write_many = x.out.write_now = (  # a queue drains with write_now
        lambda bufs: writes.append(b"".join(bytes(b) for b in bufs)))
    x.out.pause()

    def batch(n: int, tag: int) -> bytes:
        return b"".join(pack_header(FLOW.key, 16, 40) + bytes([tag, i % 256]) * 8
                        for i in range(n))

    for rnd, (n, pending) in enumerate([(100, 4000), (1000, 40_000)]):
        sent = [batch(n, 2 * rnd), batch(n, 2 * rnd + 1)]
        for b in sent:
            reads = node.begin_read(1)
            x.out.send_frames(b, n)
            reads.end()
        q = x.out.queue
        entries = 2 if node.fast is not None else 2 * n  # the engine tells one flow's batch
        assert q is not None and sum(map(len, q.flows.values())) == entries
        assert len(q) == 2 * n
        assert x.out.waiting == fc.pending(1) == 2 * pending and not writes
        assert src.reading == (rnd == 0)  # the second round is over the input's credit
        x.out.resume()
        assert writes == [b"".join(sent)] and x.out.queue is None
        assert src.reading and fc.pending(1) == 0
        writes.clear()
        x.out.pause()


def test_fed_follows_the_frames_written_not_the_routers_own(make_node: MakeNode) -> None:
    """What an output was last fed by decides holds: frames drained from its queue count,
    the router's own notices (no input) do not."""
    node = make_node()
    a, b, x = _Link(node, 1), _Link(node, 2), _Link(node, 3)
    _read(node, 1, x)  # straight through: fed by a
    assert x.out.track.fed == 1
    x.out.send(pack_header(FLOW.key, 2, 17), b"nt")  # a fault notice of the router's
    assert x.out.track.fed == 1
    x.out.pause()
    assert node.flow.control.holders(1) == {3} and not a.reading
    _read(node, 2, x)  # queued: b feeds it now
    x.out.resume()
    assert x.out.track.fed == 2 and b.reading and a.reading


def test_credit_does_not_resume_a_held_input(make_node: MakeNode) -> None:
    node = make_node(link_credit=4096)
    src, a, slow = _Link(node, 1), _Link(node, 2), _Link(node, 3)
    slow.out.emulate(Emulation(delay=10.0))
    _read(node, 1, slow, size=100)  # waits there, holding a little credit
    _read(node, 1, a)
    a.out.pause()
    slow.out.emulate(None)  # queued frames elsewhere drained
    assert not src.reading and node.flow.control.holders(1) == {2}


def test_a_hold_ends_after_the_stall_time_and_its_holders_are_stuck(make_node: MakeNode) -> None:
    node = make_node(slow_consumer_stall=0.5)
    fc = node.flow.control
    src, a = _Link(node, 1), _Link(node, 2)
    _read(node, 1, a)
    a.out.pause()
    since = fc.held_since(1)
    assert since is not None and fc.next_deadline() == since + 0.5
    node.flow.check(since + 0.4)
    assert not src.reading
    node.flow.check(since + 0.5)
    assert src.reading and not fc.holders(1) and a.out.stuck
    assert node.core.counters["credit.hold-stalled"] == 1
    a.out.pause()
    assert src.reading, "a stuck output holds nothing"
    a.out.resume()  # it moved: it may hold its input again
    assert not a.out.stuck
    _read(node, 1, a)
    a.out.pause()
    assert not src.reading


def test_a_closed_link_ends_its_holds(make_node: MakeNode) -> None:
    node = make_node()
    fc = node.flow.control
    src, a = _Link(node, 1), _Link(node, 2)
    _read(node, 1, a)
    a.out.pause()
    node.unregister(2)  # the output's link is gone
    assert src.reading and not fc.holders(1)
    c = _Link(node, 3)
    _read(node, 1, c)
    c.out.pause()
    assert fc.holders(1) == {3}
    node.unregister(1)  # the held input is gone
    assert not fc.held_inputs()


class _UnconnectedTcp(TcpLink):
    """A TCP link with no connection: it notes what it is asked to abort."""

    def __init__(self, node: RouterNode) -> None:
        super().__init__(node, None)
        self.link_id = node.register(self)
        self.aborted: list[str] = []

    def abort(self, reason: str) -> None:
        self.aborted.append(reason)


def test_no_stalled_frame_reaping_while_the_router_does_not_read(make_node: MakeNode) -> None:
    node = make_node(frame_timeout=1.0)
    link = _UnconnectedTcp(node)
    closed = link.aborted
    link.partial_since = 0.0  # a frame started at 0 and is still incomplete
    link.reading = False  # held (or paused for credit): the frame cannot progress
    reap_stalled_frames(node, 5.0)
    assert not closed and node.core.counters["reaped.stalled-frame"] == 0
    link.reading = True
    reap_stalled_frames(node, 5.0)
    assert closed == ["stalled frame"]


# ---------------------------------------------------------------- on real sockets
class _Receiver:
    """An application that joins a flow with a blocking socket and reads only when told."""

    def __init__(self, node: RouterNode, flow: FlowID, band: int) -> None:
        self.sock, self.band = blocking_member(node, flow, band, "rx", 7), band

    def read(self, n: int, quiet: float) -> list[int]:
        """Sequence numbers of data frames, until *n* arrived or none for *quiet* s."""
        dec = FrameDecoder(1 << 20)
        self.sock.settimeout(quiet)
        seqs: list[int] = []
        while len(seqs) < n:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                break
            if not data:
                break
            seqs += [struct.unpack_from("!I", p)[0] for h, p in dec.feed(data)
                     if h[20] == self.band]
        return seqs


async def _setup(**extra: Any) -> tuple[RouterNode, FlowID, _Receiver, RawEndpoint]:
    node = RouterNode(NodeConfig("core", listen="127.0.0.1:0", core_lsids=frozenset({LSID}),
                                 default_lsid=LSID, **extra))
    await node.start()
    flow = FlowID(0xB0, LSID, 1)
    rx = _Receiver(node, flow, 40)
    await until(lambda: flow.key in node.core.flows and len(node.core.flows[flow.key].down) == 1)
    tx = await RawEndpoint.connect(node, "tx")
    return node, flow, rx, tx


def test_a_receiver_that_stops_reading_holds_the_sender_and_loses_nothing() -> None:
    """The receiver stops reading: the router stops reading the sender (held, not queued),
    the sender blocks; when the receiver reads again, every frame arrives, in order."""
    n, size = 3000, 16 * 1024

    async def main() -> None:
        node, flow, rx, tx = await _setup(slow_consumer_stall=60.0)
        try:
            async def send() -> None:
                for i in range(n):
                    tx.send(flow, struct.pack("!I", i) + bytes(size - 4), band=40)
                    if i % 16 == 15:
                        await tx.writer.drain()
                await tx.writer.drain()
            sending = asyncio.ensure_future(send())
            await until(lambda: node.flow.control.held_inputs())
            assert not sending.done(), "the sender should be pushed back"
            queued = sum(link.out.waiting for link in node.links.values()
                         if link.out is not None)
            assert queued < 4 * 1024 * 1024, f"{queued} bytes queued: the input was not held"
            seqs = await asyncio.get_running_loop().run_in_executor(None, rx.read, n, 5.0)
            await sending
            assert seqs == list(range(n))
            assert node.core.counters["credit.held"] >= 1
            assert not any(k.startswith("drop.") and v for k, v in node.core.counters.items())
            await until(lambda: not node.flow.control.held_inputs())
        finally:
            rx.sock.close()
            await tx.close()
            await node.stop()
    asyncio.run(asyncio.wait_for(main(), 90))


def test_a_hung_receiver_holds_its_sender_no_longer_than_the_stall_time() -> None:
    """The receiver never reads: after slow_consumer_stall the sender goes on; what the
    receiver could not take is dropped and counted, exactly."""
    n, size = 2000, 16 * 1024

    async def main() -> None:
        node, flow, rx, tx = await _setup(slow_consumer_stall=0.3,
                                          slow_consumer_bytes=1024 * 1024,
                                          slow_consumer_grace=120.0)
        try:
            for i in range(n):
                tx.send(flow, struct.pack("!I", i) + bytes(size - 4), band=40)
                if i % 16 == 15:
                    await tx.writer.drain()  # returns only because the hold ends
            await tx.writer.drain()
            assert node.core.counters["credit.hold-stalled"] >= 1
            await until(lambda: node.links[tx_link(node)].reading)  # type: ignore[union-attr]
            got = await asyncio.get_running_loop().run_in_executor(None, rx.read, n, 1.0)
            dropped = node.core.counters["drop.slow-consumer"]
            assert dropped > 0
            assert len(got) + dropped == n and got == sorted(got)  # every loss counted
        finally:
            rx.sock.close()
            await tx.close()
            await node.stop()
    asyncio.run(asyncio.wait_for(main(), 90))


def tx_link(node: RouterNode) -> int:
    """The link id of the application named tx."""
    for lid, lk in node.core.links.items():
        if lk.peer_name == "tx":
            return lid
    raise AssertionError("no link from tx")
