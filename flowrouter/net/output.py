"""LinkOutput: the sending side of one link, whatever its transport.

A copy-free fast path straight to the transport (batched per read), and the slow path once
the transport pushes back or the link is shaped: a fair, bounded
:class:`~flowrouter.core.linkqueue.OutputQueue` (control first, deficit round robin between
flows, drops from the longest flow queue, counted and announced), input credits, the
slow-consumer policy (an output that cannot keep up holds no credit and is closed after a
grace time: :class:`~flowrouter.core.linkqueue.SlowConsumerPolicy`), and link emulation
(bandwidth, delay, loss, administrative down). Which input stops reading when an output
pushes back is the node's flow control's (:mod:`flowrouter.net.backpressure`).

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

from flowrouter.core.linkqueue import OutputQueue, SlowConsumerPolicy
from flowrouter.core.measured import BusyRate
from flowrouter.net.config import Emulation
from flowrouter.wire.header import HEADER_SIZE

log = logging.getLogger("flowrouter.net.runtime")

if TYPE_CHECKING:
    from flowrouter.net.nodeapi import FlowShell, Node, ReadBatch


#: frames with payloads this large are written at once rather than batched: joining them
#: would copy them again and overrun the transport buffer
BATCH_MAX = 8192


class LinkOutput:
    """The sending side of one link: a copy-free fast path, and the slow path described in
    the module docstring (queue, fairness, shaping, credits, emulated loss)."""

    __slots__ = ("node", "reads", "flow", "link_id", "write", "write_many", "queue", "paused",
                 "timer", "emu", "rng", "batch", "slow", "stuck", "held", "fed", "fed_read",
                 "paused_read", "rate")

    def __init__(self, node: Node, link_id: int, write: Callable[[bytes, Any], None],
                 write_many: Callable[[list[Any]], None] | None = None) -> None:
        self.node = node
        #: the node's read in progress (which input, its number, the outputs to flush)
        self.reads: ReadBatch = node.reads
        #: the node's flow control (credit, holds, backlogged outputs)
        self.flow: FlowShell = node.flow
        self.link_id = link_id
        self.write = write
        #: writes a batch of buffers at once (None: the link writes frame by frame, UDP)
        self.write_many = write_many
        #: buffers gathered while the node processes one read (one write per link per read)
        self.batch: list[Any] | None = None
        self.queue: OutputQueue | None = None
        self.paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.emu: Emulation | None = None
        self.rng: random.Random | None = None
        cfg = node.config
        #: when this output falls behind (flowrouter.core.linkqueue.SlowConsumerPolicy), and
        #: whether it is stuck: then its frames hold no credit on the inputs feeding it
        self.slow = SlowConsumerPolicy(cfg.slow_consumer_bytes, cfg.slow_consumer_grace,
                                       cfg.slow_consumer_stall)
        self.stuck = False
        #: input link -> credit bytes its frames waiting here hold (Backpressure.unblock)
        self.held: dict[int, int] = {}
        #: the input link whose frames this output last wrote, the last read (ReadBatch.number)
        #: each input gave it frames in, and the read in which its transport last pushed
        #: back (backpressure.feeds: whether a sibling still takes an input's frames)
        self.fed = 0
        self.fed_read: dict[int, int] = {}
        self.paused_read = 0
        #: measured locality: the send rate while backlogged (capacity, not utilisation);
        #: the node's tick turns it into Router.measure_throughput samples
        self.rate = BusyRate()

    def _take(self, origin: int, size: int) -> None:
        if origin and not self.stuck:
            self.held[origin] = self.held.get(origin, 0) + size
            self.flow.take(origin, size)

    def _give(self, origin: int, size: int) -> None:
        if origin and not self.stuck:
            left = self.held.get(origin, 0) - size
            if left > 0:
                self.held[origin] = left
            else:
                self.held.pop(origin, None)
            self.flow.give(origin, size)

    def _new_queue(self, now: float, **shaping: Any) -> OutputQueue:
        self.flow.backlogged.add(self)
        self.slow.progress(0, now)  # the stall clock starts with the backlog
        return OutputQueue(self.node.config.queue_bound, now=now, **shaping)

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
                while (fr := old.pop(now)) is not None:
                    self.queue.push(bytes(fr[0][:16]), fr[0], fr[1], fr[0][20] < 16, now, fr[2])
        elif old is not None and old.shaped:
            self.queue = None
            self._requeue(old)
        self._drain()

    def _requeue(self, old: OutputQueue) -> None:
        now = self.node.now()
        while (fr := old.pop(now)) is not None:
            self._give(fr[2], len(fr[0]) + len(fr[1]))
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
                self.fed = rx
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
        elif self.stuck and header[20] >= 16 and self._shed(1, len(header) + len(payload), now):
            return True
        # A frame holds its input's credit (pushing back on a sender faster than its
        # receivers), unless this output is stuck: then it holds none, and one stuck
        # receiver never makes its input wait (slow consumers hurt only themselves); if it
        # moves again, its frames take their credit back (_drain).
        origin = self.reads.link
        dropped = q.push(bytes(header[:16]), header, payload, header[20] < 16, now, origin)
        self._take(origin, len(header) + len(payload))
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
            self.fed = rx
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
        if self.stuck and self._shed(count, len(frames), self.node.now()):
            return
        if self.emu is None and (self.queue is not None or self.paused):
            self._queue_frames(frames)
            return
        # emulated loss or shaping, or a datagram link: the frames take the ordinary way
        # one by one (credits, fairness, drops all apply)
        view = memoryview(frames)
        pos, n = 0, len(view)
        while pos < n:
            end = pos + HEADER_SIZE + int.from_bytes(view[pos + 16:pos + 20], "big")
            self.send(bytes(view[pos:pos + HEADER_SIZE]), view[pos + HEADER_SIZE:end])
            pos = end

    def _queue_frames(self, frames: bytes) -> None:
        """A forwarding batch for a queue (or a transport that pushed back): queued in one
        pass (:meth:`OutputQueue.push_frames`), credit taken as :meth:`_queue_frame` does,
        then one drain."""
        now = self.node.now()
        q = self.queue
        if q is None:
            q = self.queue = self._new_queue(now)
        origin = self.reads.link
        dropped = q.push_frames(frames, now, origin)
        self._take(origin, len(frames))
        if dropped:
            self._dropped(dropped, now)
            if self.queue is None:  # closed as a slow consumer
                return
        self._drain()

    def _dropped(self, dropped: list[tuple[bytes, int, int]], now: float) -> None:
        """Frames dropped to keep the queue bounded: count, alert their flows, and handle
        the link as a slow consumer (it holds no credit; closed after the grace time)."""
        node = self.node
        kind = node.config.drop_kind
        for _, n, org in dropped:
            self._give(org, n)
        node.core.counters["drop." + kind] += len(dropped)
        link = node.core.links.get(self.link_id)
        desc = link.describe() if link else f"link {self.link_id}"
        if self.slow.note_drops(len(dropped), now):
            log.warning("router %s: %s cannot keep up (%d bytes queued); dropping its frames "
                        "(%s)", node.config.name, desc, node.config.queue_bound, kind)
        for key in sorted({k for k, _, _ in dropped}):
            node.execute(node.core.alert(
                kind, f"output to {desc} is full ({node.config.queue_bound} bytes); dropping the "
                "longest flow's frames", now, key))
        if self.slow.expired(now):
            node.close_slow_consumer(self)

    def _shed(self, count: int, size: int, now: float) -> bool:
        """A stuck output (nothing sent for the stall time) already over its limit drops
        new data frames at once (counted like any other drop) instead of queueing and
        trimming them one by one: a stuck receiver must cost the router as little as
        possible (fairness between its flows is moot while nothing moves). True if they
        were dropped."""
        q = self.queue
        if q is None or self.slow.over_since is None or q.bytes + size <= q.max_bytes:
            return False
        node = self.node
        node.core.counters["drop." + node.config.drop_kind] += count
        self.slow.dropped += count
        q.dropped += count
        q.dropped_bytes += size
        if self.slow.expired(now):
            node.close_slow_consumer(self)
        return True

    def become_stuck(self) -> None:
        """Give back the credit this output's waiting frames hold."""
        if self.stuck:
            return
        held, self.held = self.held, {}
        self.stuck = True
        for org, n in held.items():
            self.flow.give(org, n)

    def flush(self) -> None:
        batch, self.batch = self.batch, None
        if batch and self.write_many is not None:
            self.write_many(batch)

    def pause(self) -> None:
        """The transport pushed back (anything it could not write at once is buffered)."""
        self.paused = True
        self.paused_read = self.reads.number
        self.flow.hold(self)

    def resume(self) -> None:
        self.paused = False
        if self.queue is None:
            self.stuck = False  # it moves again and nothing of it waits to retake credit
        self.flow.release(self)
        self._drain()
        # Its transport takes frames again: if the input it was fed by is paused for credit,
        # this is a sibling draining, and an output that is not may be holding that input
        # (with no queue of its own here, _drain gave no credit back and looked at nothing).
        fed = self.fed
        if fed and not self.paused and fed in self.flow.paused_inputs:
            self.flow.unblock(fed)

    def _drain(self) -> None:
        q = self.queue
        if q is None or self.timer is not None:
            return
        node = self.node
        now = node.now()
        sent = False
        waiting = self.flow.paused_inputs  # inputs paused for credit
        freed: set[int] = set()  # which of them this output just gave credit back to
        while not self.paused:
            fr = q.pop(now)
            if fr is None:
                break
            sent = True
            if fr[2] in waiting:
                freed.add(fr[2])
                self.fed = fr[2]
            elif fr[2] and fr[0][20] >= 16:  # what feeds it now (backpressure.hold)
                self.fed = fr[2]
            size = len(fr[0]) + len(fr[1])
            self._give(fr[2], size)
            self.rate.wrote(size)
            self.write(fr[0], fr[1])
        self.rate.backlog(q.backlogged, now)
        if sent or q.empty():
            self.slow.progress(q.bytes, now)
            if self.stuck:  # moving again: its frames hold credit again, so that a receiver
                self.stuck = False  # only briefly behind pushes back before it overflows
                for org, n in q.origins().items():
                    self._take(org, n)
        for origin in freed:  # is an output that does not move what still holds them back?
            self.flow.unblock(origin)
        if q.empty() and not q.shaped:
            self.queue = None  # back to the fast path
            self.flow.backlogged.discard(self)
            return
        if not self.paused:
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
        q, self.queue = self.queue, None
        self.flow.backlogged.discard(self)
        if q is not None:
            now = self.node.now()
            while (fr := q.pop(now)) is not None:
                self._give(fr[2], len(fr[0]) + len(fr[1]))

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"paused": self.paused, "stuck": self.stuck}
        out.update(self.slow.stats())
        if self.queue is not None:
            out.update(self.queue.stats())
        if self.emu is not None:
            out["emulation"] = self.emu.describe()
        return out

