"""LinkOutput: the sending side of one link, whatever its transport.

A copy-free fast path straight to the transport (batched per read), and the slow path once
the transport pushes back or the link is shaped: a fair, bounded
:class:`~flowrouter.core.linkqueue.OutputQueue` (control first, deficit round robin between
flows, drops from the longest flow queue, announced on the flows' fault band), and link
emulation (bandwidth, delay, loss, administrative down). What flow control decides (which
input stops reading, which output holds credit, when a stuck one sheds frames at once, when
a slow consumer is evicted) is
:class:`flowrouter.core.flowcontrol.FlowControl`'s: the output reports its events to the
node's flow control (:mod:`flowrouter.net.backpressure`) and notes which input's frames it
writes, in which read, on its record there (stores, not calls: the hot path).

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire`, :mod:`flowrouter.net.config` and
:mod:`flowrouter.net.nodeapi`: the node it serves, and the node's flow control, are seen only
through that interface (:class:`~flowrouter.net.nodeapi.Node`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flowrouter.core.linkqueue import OutputQueue
from flowrouter.core.measured import BusyRate
from flowrouter.net.config import Emulation
from flowrouter.wire.header import HEADER_SIZE

log = logging.getLogger("flowrouter.net.runtime")

if TYPE_CHECKING:
    from flowrouter.net.nodeapi import FlowShell, Node, ReadBatch


#: frames with payloads this large are written at once rather than batched: joining them
#: would copy them again and overrun the transport buffer
BATCH_MAX = 8192
#: bytes at most a queue drain gathers into one write (the transport's high-water mark)
DRAIN_BATCH = 256 * 1024


class LinkOutput:
    """The sending side of one link: a copy-free fast path, and the slow path described in
    the module docstring (queue, fairness, shaping, credits, emulated loss)."""

    __slots__ = ("node", "reads", "flow", "link_id", "write", "write_many", "write_now",
                 "queue", "paused", "timer", "emu", "rng", "batch", "track", "fed_read", "rate")

    def __init__(self, node: Node, link_id: int, write: Callable[[bytes, Any], None],
                 write_many: Callable[[list[Any]], None] | None = None,
                 write_now: Callable[[list[Any]], None] | None = None) -> None:
        self.node = node
        #: the node's read in progress (which input, its number, the outputs to flush)
        self.reads: ReadBatch = node.reads
        #: the node's flow control (credit, holds, backlogged outputs)
        self.flow: FlowShell = node.flow
        self.link_id = link_id
        self.write = write
        #: writes a batch of buffers at once (None: the link writes frame by frame, UDP)
        self.write_many = write_many
        #: writes a batch at once even while the link's writes are gathered (the queue's
        #: drain: it stops when the transport pushes back, so it must see that at once)
        self.write_now = write_now or write_many
        #: buffers gathered while the node processes one read (one write per link per read)
        self.batch: list[Any] | None = None
        self.queue: OutputQueue | None = None
        self.paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.emu: Emulation | None = None
        self.rng: random.Random | None = None
        #: what flow control keeps of this output (flowrouter.core.flowcontrol.OutputFlow):
        #: whether it is stuck, its slow-consumer clocks; this output writes its ``fed`` (the
        #: input whose frames it last wrote) and ``fed_read`` (input -> the last read that
        #: input gave it frames in; the same dict, kept here too for the hot path)
        self.track = node.flow.output(link_id)
        self.fed_read = self.track.fed_read
        #: measured locality: the send rate while backlogged (capacity, not utilisation);
        #: the node's tick turns it into Router.measure_throughput samples
        self.rate = BusyRate()

    @property
    def waiting(self) -> int:
        """Bytes waiting here for the transport (in the fair queue)."""
        return self.queue.bytes if self.queue is not None else 0

    @property
    def stuck(self) -> bool:
        """It stopped moving: its waiting frames hold no credit (flow control says)."""
        return self.track.stuck

    def _new_queue(self, now: float, **shaping: Any) -> OutputQueue:
        self.flow.queue_started(self.link_id, now)  # the stall clock starts with the backlog
        return OutputQueue(self.flow.limits.queue_bound, now=now, **shaping)

    def emulate(self, emu: Emulation | None) -> None:
        """(Re)configure emulation; frames already waiting keep their order."""
        self.emu = emu if emu is not None and emu.active else None
        old = self.queue
        if self.emu is not None:
            self.rng = random.Random(f"{self.node.config.name}:{self.link_id}")
            self.queue = self._new_queue(
                self.node.now(), rate=self.emu.bandwidth / 8 if self.emu.bandwidth else None,
                delay=self.emu.delay)
            if old is not None:
                now = self.node.now()
                for fr in old.take_all():
                    q = self.queue
                    if q is None:
                        break  # closed as a slow consumer
                    dropped = q.push(bytes(fr[0][:16]), fr[0], fr[1], fr[0][20] < 16, now, fr[2])
                    if dropped:
                        self._dropped(dropped, now)
        elif old is not None and old.shaped:
            self.queue = None
            self._requeue(old)
        self._drain()

    def _requeue(self, old: OutputQueue) -> None:
        now = self.node.now()
        frames = old.take_all()
        gone: dict[int, int] = {}
        for fr in frames:
            if fr[2]:
                gone[fr[2]] = gone.get(fr[2], 0) + len(fr[0]) + len(fr[1])
        self.flow.written(self.link_id, gone, 0, now, moved=False, backlog=False)
        for fr in frames:
            self.send(fr[0], fr[1])

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        reads = self.reads
        rx = reads.link if header[20] >= 16 else 0  # forwarded, not the router's own
        if rx:
            self.fed_read[rx] = reads.number
        emu = self.emu
        if emu is not None:
            if emu.down or (emu.loss and self.rng.random() < emu.loss):  # type: ignore[union-attr]
                self.node.core.counters["drop.emulated-loss" if not emu.down
                                        else "drop.emulated-down"] += 1
                return
        elif self.queue is None and not self.paused:
            if rx:
                self.track.fed = rx
            if reads.open and self.write_many is not None and len(payload) < BATCH_MAX:
                batch = self.batch
                if batch is None:
                    batch = self.batch = []
                    reads.dirty.append(self)
                batch.append(header)
                batch.append(payload)
            else:
                if self.batch:
                    self.flush()  # keep the link's order
                self.write(header, payload)
            return
        if self._queue_frame(header, payload, self.node.now()):
            self._drain()

    def _queue_frame(self, header: bytes, payload: bytes | memoryview, now: float) -> bool:
        """Queue one frame (the caller drains); False if the link was just closed as a slow
        consumer."""
        q = self.queue
        if q is None:
            q = self.queue = self._new_queue(now)
        elif (self.track.stuck and header[20] >= 16
              and self._shed(1, len(header) + len(payload), now)):
            return True
        # A frame holds its input's credit (pushing back on a sender faster than its
        # receivers), unless this output is stuck (flow control keeps the credit).
        origin = self.reads.link
        dropped = q.push(bytes(header[:16]), header, payload, header[20] < 16, now, origin)
        self.flow.queued(self.link_id, origin, len(header) + len(payload), now)
        if dropped:
            self._dropped(dropped, now)
            if self.queue is None:  # closed as a slow consumer
                return False
        return True

    def send_frames(self, frames: Any, count: int) -> None:
        """Whole frames the forwarding fast path gathered for this link from one read: bytes,
        or a list of buffers that may point into the received buffer (written with the
        read's batch, before that buffer is reused; copied if they must wait)."""
        reads = self.reads
        rx = reads.link
        self.fed_read[rx] = reads.number
        if (self.emu is None and self.queue is None and not self.paused
                and self.write_many is not None):
            self.track.fed = rx
            if type(frames) is list:
                if reads.open:
                    batch = self.batch
                    if batch is None:
                        batch = self.batch = []
                        reads.dirty.append(self)
                    batch += frames
                else:
                    if self.batch:
                        self.flush()
                    self.write_many(frames)
            elif reads.open and len(frames) < BATCH_MAX:
                batch = self.batch
                if batch is None:
                    batch = self.batch = []
                    reads.dirty.append(self)
                batch.append(frames)
            else:  # large: written at once, so no join copies it again
                if self.batch:
                    self.flush()
                self.write_many([frames])
            return
        if type(frames) is list:
            frames = b"".join(frames)  # owned: these frames may wait
        elif type(frames) is not bytes:
            frames = bytes(frames)  # a view of the received buffer, which is reused
        if self.track.stuck and self._shed(count, len(frames), self.node.now()):
            return
        if self.emu is None and (self.queue is not None or self.paused):
            self._queue_frames(frames, self.reads.link, count)
            return
        # emulated loss or shaping, or a datagram link: the frames take the ordinary way
        # one by one (credits, fairness, drops all apply)
        view = memoryview(frames)
        pos, n = 0, len(view)
        while pos < n:
            end = pos + HEADER_SIZE + int.from_bytes(view[pos + 16:pos + 20], "big")
            self.send(bytes(view[pos:pos + HEADER_SIZE]), view[pos + HEADER_SIZE:end])
            pos = end

    def _queue_frames(self, frames: bytes, origin: int, count: int) -> None:
        """A forwarding batch of *count* frames for a queue (or a transport that pushed
        back): queued in one pass (:meth:`OutputQueue.push_frames`; as one entry when they
        are all one flow's data, :meth:`OutputQueue.push_run`: no work per frame), credit
        taken as :meth:`_queue_frame` does, then one drain."""
        now = self.node.now()
        q = self.queue
        if q is None:
            q = self.queue = self._new_queue(now)
        fast = self.node.fast
        if count > 1 and fast is not None and fast.one_flow(frames):
            dropped = q.push_run(frames, count, now, origin)
        else:
            dropped = q.push_frames(frames, now, origin)
        self.flow.queued(self.link_id, origin, len(frames), now)
        if dropped:
            self._dropped(dropped, now)
            if self.queue is None:  # closed as a slow consumer
                return
        self._drain()

    def _dropped(self, dropped: list[tuple[bytes, int, int]], now: float) -> None:
        """Frames dropped to keep the queue bounded: alert their flows, and tell flow
        control (it counts them, says once that the link cannot keep up, and evicts it
        after the grace time)."""
        node = self.node
        lim = self.flow.limits
        link = node.core.links.get(self.link_id)
        desc = link.describe() if link else f"link {self.link_id}"
        for key in sorted({k for k, _, _ in dropped}):
            node.execute(node.core.alert(
                lim.drop_kind, f"output to {desc} is full ({lim.queue_bound} bytes); dropping "
                "the longest flow's frames", now, key))
        self.flow.dropped(self.link_id, dropped, now)

    def _shed(self, count: int, size: int, now: float) -> bool:
        """A stuck output already over its bound drops new data frames at once (counted
        like any other drop; flow control decides) instead of queueing and trimming them
        one by one. True if they were dropped."""
        q = self.queue
        if q is None or not self.flow.shed(self.link_id, count, size, q.bytes, now):
            return False
        q.dropped += count
        q.dropped_bytes += size
        return True

    def flush(self) -> None:
        batch, self.batch = self.batch, None
        if batch and self.write_many is not None:
            self.write_many(batch)

    def pause(self) -> None:
        """The transport pushed back (anything it could not write at once is buffered)."""
        self.paused = True
        self.flow.pushed_back(self.link_id)

    def resume(self) -> None:
        """The transport takes frames again: flow control first (inputs this output held
        read again), then what waits here goes."""
        self.paused = False
        self.flow.resumed(self.link_id)
        self._drain()

    def _drain(self) -> None:
        q = self.queue
        if q is None or self.timer is not None:
            return
        node = self.node
        now = node.now()
        sent = False
        track, flow = self.track, self.flow
        gone: dict[int, int] = {}  # bytes per input that left the queue
        # frames go in gathered writes of up to DRAIN_BATCH bytes (one system call, not
        # one per frame: a receiver catching up gets large reads); the transport may push
        # back during one, which ends the drain
        many = self.write_now
        while not self.paused:
            buffers: list[Any] = []
            batch = 0
            while batch < DRAIN_BATCH:
                fr = q.pop(now)
                if fr is None:
                    break
                origin = fr[2]
                size = len(fr[0]) + len(fr[1])
                if origin:
                    gone[origin] = gone.get(origin, 0) + size
                    # what feeds it now: forwarded data, or an input waiting for this credit
                    if fr[0][20] >= 16 or flow.waits_for_credit(origin):
                        track.fed = origin
                batch += size
                if many is None:
                    self.write(fr[0], fr[1])
                    if self.paused:
                        break
                else:
                    buffers.append(fr[0])
                    buffers.append(fr[1])
            if not batch:
                break
            sent = True
            self.rate.wrote(batch)
            if buffers:
                many(buffers)  # type: ignore[misc]
        self.rate.backlog(q.backlogged, now)
        ends = q.empty() and not q.shaped
        flow.written(self.link_id, gone, q.bytes, now, moved=sent or q.empty(),
                     backlog=not ends)
        if ends:
            if self.queue is q:
                self.queue = None  # back to the fast path
            return
        if not self.paused and self.queue is q:
            wait = q.next_ready(now)
            if wait is not None:
                self.timer = node.loop.call_later(max(wait, 0.0005), self._wake)

    def _wake(self) -> None:
        self.timer = None
        self._drain()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue = None
        self.flow.forget(self.link_id)  # what waited here holds no credit any more

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = self.track.stats()
        out["paused"] = self.paused
        if self.queue is not None:
            out.update(self.queue.stats())
        if self.emu is not None:
            out["emulation"] = self.emu.describe()
        return out

