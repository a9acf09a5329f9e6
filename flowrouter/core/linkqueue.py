"""Per-link output scheduling: bounded, fair between flows, optionally shaped; the
slow-consumer policy. Sans-I/O; imports only the standard library.

A link's output normally goes straight to the transport. Only when the transport pushes back
(or a shaper says "not yet") do frames wait here, and then:

* **fairness** — each flow has its own FIFO and the queue is served by deficit round robin
  with a byte quantum, so a flow that floods the link gets its share and no more: a
  well-behaved flow on the same link keeps its rate (seed 000 ch. 4, seed 001's fairness);
* **bounded memory** — when the total would exceed ``max_bytes``, frames are dropped from the
  *longest* flow queue, in frames (the flooder pays for its own excess), and every drop is
  counted;
* **runs** — a fast-path batch of one flow's data frames (a fan-out's, to a receiver that fell
  behind) may wait as one entry (:meth:`OutputQueue.push_run`): no work per frame to queue
  or serve it; it counts as its frames, and is dropped whole;
* **shaping** — an optional token bucket (``rate`` bytes/s) emulates a slow link (the 56 kbit/s
  links of the seed 003 test-bed) and an optional fixed delay emulates propagation; loss is
  applied by the caller before queueing.

Router control frames (bands below 16) wait in their own FIFO, served first and never dropped,
so a congested data plane never starves joins, acks and pings. Application administration
(bands 16..31: heartbeats, faults, repairs) comes next in a second FIFO, so a data backlog
cannot make heartbeats late enough to look like a disconnect; that FIFO counts as one more
queue for the longest-queue drop rule, so it cannot be used to flood past the bound.

Everything takes ``now`` from the caller; :meth:`OutputQueue.next_ready` says when to look
again, so the runtime only arms a timer when shaping or delay demand one.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from typing import Any

#: (header, payload, origin: the input link it came from, 0 local); a run of one flow's
#: frames queued whole (:meth:`OutputQueue.push_run`) is (first header, the rest, origin,
#: frames in it)
Frame = tuple[Any, ...]

_LENGTH = struct.Struct(">I")  #: a frame header's payload length, at offset 16 (wire.header)
#: payloads of a batch larger than this wait as views of it, not copies (push_frames)
VIEW_MIN = 8192


class TokenBucket:
    """Bytes per second with a burst allowance; ``delay(size, now)`` says how long to wait."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(rate / 10, 2048.0))
        self.tokens = self.burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait_for(self, size: int, now: float) -> float:
        """Seconds until *size* bytes may go (0 if now)."""
        self._refill(now)
        need = min(size, self.burst) - self.tokens
        return 0.0 if need <= 0 else need / self.rate

    def take(self, size: int, now: float) -> None:
        self._refill(now)
        self.tokens -= size


class OutputQueue:
    """Waiting frames of one link: control FIFO first, then DRR over per-flow FIFOs."""

    __slots__ = ("max_bytes", "quantum", "bytes", "ctl", "adm", "flows", "frames", "active",
                 "deficit",
                 "dropped", "dropped_bytes", "bucket", "delay", "_delayed")

    def __init__(self, max_bytes: int, quantum: int = 16 * 1024,
                 rate: float | None = None, delay: float = 0.0, now: float = 0.0) -> None:
        self.max_bytes = max_bytes
        self.quantum = quantum
        self.bytes = 0
        self.ctl: deque[Frame] = deque()
        self.adm: deque[tuple[bytes, Frame]] = deque()  #: (flow key, frame), bands 16..31
        self.flows: dict[bytes, deque[Frame]] = {}
        #: frames waiting per flow (a run counts all of its own): the longest-queue rule
        self.frames: dict[bytes, int] = {}
        self.active: deque[bytes] = deque()  #: flows with frames, in service order
        self.deficit: dict[bytes, int] = {}
        self.dropped = 0
        self.dropped_bytes = 0
        self.bucket = TokenBucket(rate, now=now) if rate else None
        self.delay = delay
        #: frames held for the propagation delay: (due time, control?, key, frame)
        self._delayed: deque[tuple[float, bool, bytes, Frame]] = deque()

    @property
    def shaped(self) -> bool:
        return self.bucket is not None or self.delay > 0

    @property
    def backlogged(self) -> bool:
        """Frames past their (emulated) propagation delay still wait: for the rate limit or
        a transport that pushed back. Measured throughput counts only such time, so a frame
        merely held for its delay does not make the link look slow."""
        return bool(self.ctl or self.adm or self.active)

    def __len__(self) -> int:
        return (len(self.ctl) + len(self.adm) + sum(self.frames.values())
                + len(self._delayed))

    def empty(self) -> bool:
        return not self.ctl and not self.adm and not self.active and not self._delayed

    def push(self, key: bytes, header: bytes, payload: Any, control: bool, now: float,
             origin: int = 0) -> list[tuple[bytes, int, int]]:
        """Queue a frame (``control``: a router band; the band byte picks the admin FIFO)."""
        return self._push(key, header, payload, control, now, origin)

    def _push(self, key: bytes, header: bytes, payload: Any, control: bool, now: float,
              origin: int) -> list[tuple[bytes, int, int]]:
        """Queue a frame; return (flow key, size, origin) of every frame dropped to make room.

        The payload is copied here: a view would pin the whole receive buffer it came from
        for as long as the frame waits, defeating the byte bound.
        """
        frame = (header, bytes(payload), origin)
        size = len(header) + len(frame[1])
        if self.delay > 0:
            self._delayed.append((now + self.delay, control, key, frame))
            self.bytes += size
            return self._trim(key, size)
        self._enqueue(key, frame, control)
        self.bytes += size
        return self._trim(key, size)

    def push_frames(self, frames: bytes, now: float, origin: int = 0
                    ) -> list[tuple[bytes, int, int]]:
        """Queue whole frames laid back to back (what the forwarding fast path gathered for
        this link from one read): exactly :meth:`push` for each in turn, in one pass. A
        stuck output takes thousands of frames before it overflows, so each costs little
        here. Returns what push would have: every frame dropped to make room.

        *frames* is owned by the queue from here on (nobody writes to it again), so large
        payloads wait as views of it rather than copies; a view pins the whole batch, so
        small ones, which a copy costs little, are copied."""
        frames = bytes(frames)
        view = memoryview(frames)
        unpack = _LENGTH.unpack_from
        flows, active, deficit = self.flows, self.active, self.deficit
        delay = self.delay
        dropped: list[tuple[bytes, int, int]] = []
        pos, n = 0, len(frames)
        while pos < n:
            end = pos + 24 + unpack(frames, pos + 16)[0]
            key = frames[pos:pos + 16]
            header = frames[pos:pos + 24]
            frame = (header, view[pos + 24:end] if end - pos > VIEW_MIN
                     else frames[pos + 24:end], origin)
            band = header[20]
            if delay > 0:
                self._delayed.append((now + delay, band < 16, key, frame))
            elif band < 32:
                self._enqueue(key, frame, band < 16)
            else:
                q = flows.get(key)
                if q is None:
                    q = flows[key] = deque()
                    self.frames[key] = 0
                if not q:
                    active.append(key)
                    deficit.setdefault(key, 0)
                q.append(frame)
                self.frames[key] += 1
            self.bytes += end - pos
            if self.bytes > self.max_bytes:
                dropped += self._trim(key, end - pos)
            pos = end
        return dropped

    def push_run(self, frames: bytes, count: int, now: float, origin: int = 0
                 ) -> list[tuple[bytes, int, int]]:
        """Queue *count* whole data frames (band 32 or more) of one flow, laid back to back
        (a fast-path batch the caller checked), as one entry: no work per frame. It is
        served in its flow's order and counts *count* frames and all its bytes for the fair
        share and the longest-queue rule; when that rule drops it, it goes whole (every
        frame reported). Under an emulated delay it is :meth:`push_frames`."""
        if self.delay > 0 or self.bytes + len(frames) > self.max_bytes:
            # over the bound: frame by frame, so that what is dropped is the excess, not
            # a whole run (the queue stays at its bound, as the slow-consumer rule expects)
            return self.push_frames(frames, now, origin)
        key = bytes(frames[:16])
        self._flow_append(key, (bytes(frames[:24]), memoryview(frames)[24:], origin, count),
                          count)
        self.bytes += len(frames)
        return self._trim(key, len(frames))

    def _flow_append(self, key: bytes, frame: Frame, count: int) -> None:
        """Append to *key*'s FIFO (a run: *count* frames), activating the flow."""
        q = self.flows.get(key)
        if q is None:
            q = self.flows[key] = deque()
            self.frames[key] = 0
        if not q:
            self.active.append(key)
            self.deficit.setdefault(key, 0)
        q.append(frame)
        self.frames[key] += count

    def _enqueue(self, key: bytes, frame: Frame, control: bool) -> None:
        if control:
            self.ctl.append(frame)
            return
        if frame[0][20] < 32:
            self.adm.append((key, frame))
            return
        self._flow_append(key, frame, 1)

    def _trim(self, key: bytes, size: int) -> list[tuple[bytes, int, int]]:
        if self.bytes <= self.max_bytes:
            return []
        dropped: list[tuple[bytes, int, int]] = []
        while self.bytes > self.max_bytes:
            victim = self._longest()
            if victim is None and self.adm:
                k, fr = self.adm.pop()
                n = len(fr[0]) + len(fr[1])
                self.bytes -= n
                dropped.append((k, n, fr[2]))
                continue
            if victim is None:  # only control or delayed frames: drop the newest delayed one
                if self._delayed and not self._delayed[-1][1]:
                    _, _, k, fr = self._delayed.pop()
                    n = len(fr[0]) + len(fr[1])
                    self.bytes -= n
                    dropped.append((k, n, fr[2]))
                    continue
                break
            q = self.flows[victim]
            fr = q.pop()  # newest of the longest queue
            n = len(fr[0]) + len(fr[1])
            self.bytes -= n
            if len(fr) > 3:  # a run: every frame in it
                self.frames[victim] -= fr[3]
                dropped += _frames_of(victim, fr, n)
            else:
                self.frames[victim] -= 1
                dropped.append((victim, n, fr[2]))
            if not q:
                self.active.remove(victim)
        self.dropped += len(dropped)
        self.dropped_bytes += sum(d[1] for d in dropped)
        return dropped

    def _longest(self) -> bytes | None:
        """The flow with the longest queue; None when the admin FIFO is longer still."""
        best, best_len = None, len(self.adm)
        frames = self.frames
        for key in self.active:
            n = frames[key]
            if n > best_len:
                best, best_len = key, n
        return best

    def _release_delayed(self, now: float) -> None:
        d = self._delayed
        while d and d[0][0] <= now:
            _, control, key, frame = d.popleft()
            self._enqueue(key, frame, control)

    def pop(self, now: float) -> Frame | None:
        """The next frame to write now, or None (empty, or the shaper says wait)."""
        if self._delayed:
            self._release_delayed(now)
        if self.ctl:
            frame = self.ctl[0]
        elif self.adm:
            frame = self.adm[0][1]
        elif self.active:
            frame = self._peek_drr()
        else:
            return None
        size = len(frame[0]) + len(frame[1])
        bucket = self.bucket
        if bucket is not None and bucket.wait_for(size, now) > 0:
            return None
        if self.ctl and frame is self.ctl[0]:
            self.ctl.popleft()
        elif self.adm and frame is self.adm[0][1]:
            self.adm.popleft()
        else:
            self._take_drr(size)
        if bucket is not None:
            bucket.take(size, now)
        self.bytes -= size
        return frame

    def take_all(self) -> list[Frame]:
        """Every waiting frame, in the order they would have gone, shaping and delay
        ignored: the link's emulation changes, and they go on under the new one (none is
        lost in the old queue's delay line). Leaves the queue empty and unshaped."""
        self.bucket = None
        self._release_delayed(math.inf)
        frames: list[Frame] = []
        while (fr := self.pop(0.0)) is not None:
            frames.append(fr)
        return frames

    def _peek_drr(self) -> Frame:
        # Rotate until the head flow has deficit for its head frame.
        while True:
            key = self.active[0]
            frame = self.flows[key][0]
            if self.deficit[key] >= len(frame[0]) + len(frame[1]):
                return frame
            self.deficit[key] += self.quantum
            self.active.rotate(-1)

    def _take_drr(self, size: int) -> None:
        key = self.active[0]
        q = self.flows[key]
        fr = q.popleft()
        self.frames[key] -= fr[3] if len(fr) > 3 else 1
        self.deficit[key] -= size
        if not q:
            self.active.popleft()
            self.deficit[key] = 0
            del self.flows[key]
            del self.frames[key]

    def next_ready(self, now: float) -> float | None:
        """Seconds until :meth:`pop` may return a frame (None: nothing waiting)."""
        candidates: list[float] = []
        if self.ctl or self.adm or self.active:
            frame = (self.ctl[0] if self.ctl else self.adm[0][1] if self.adm
                     else self.flows[self.active[0]][0])
            size = len(frame[0]) + len(frame[1])
            candidates.append(self.bucket.wait_for(size, now) if self.bucket else 0.0)
        if self._delayed:
            candidates.append(max(0.0, self._delayed[0][0] - now))
        return min(candidates) if candidates else None

    def stats(self) -> dict[str, int]:
        return {"queued_frames": len(self), "queued_bytes": self.bytes,
                "flows_waiting": len(self.active), "dropped": self.dropped,
                "dropped_bytes": self.dropped_bytes}


def _frames_of(key: bytes, run: Frame, size: int) -> list[tuple[bytes, int, int]]:
    """(key, bytes, origin) of every frame in a run entry of *size* bytes."""
    whole = bytes(run[0]) + bytes(run[1])
    out = []
    pos = 0
    while pos < size:
        n = 24 + _LENGTH.unpack_from(whole, pos + 16)[0]
        out.append((key, n, run[2]))
        pos += n
    return out


class SlowConsumerPolicy:
    """When an output link that cannot keep up is a *slow consumer*, and when to give up on it.

    As in NATS, a slow consumer hurts only itself. The caller bounds the link's queue at
    ``limit`` bytes (dropping from the longest flow queue, counted as ``drop.slow-consumer``)
    and tells the policy about each drop and each drain. Two clocks start when the link falls
    behind:

    * **stall** — an output that has had frames waiting without sending any for ``stall``
      seconds is :meth:`stuck` and holds no credit: the inputs feeding it must not wait for
      it (the caller releases the credit its frames held, until it moves again);
    * **grace** — an output that stays over the limit for ``grace`` seconds (it has not
      drained to half the limit since its first drop) has :meth:`expired`: the caller closes
      it with a fault notice and a log line.
    """

    __slots__ = ("dropped", "grace", "last_progress", "limit", "over_since", "stall")

    def __init__(self, limit: int, grace: float, stall: float = 1.0, now: float = 0.0) -> None:
        if limit <= 0 or grace <= 0 or stall <= 0:
            raise ValueError("slow-consumer limit, grace and stall must be positive")
        self.limit = limit
        self.grace = grace
        self.stall = stall
        self.over_since: float | None = None  #: when the link last went over the limit
        self.last_progress = now  #: last time the link sent something (or had nothing to)
        self.dropped = 0

    def note_drops(self, n: int, now: float) -> bool:
        """*n* frames were dropped to keep the queue under the limit; True if the link has
        just gone over (log it once)."""
        self.dropped += n
        if self.over_since is None:
            self.over_since = now
            return True
        return False

    def progress(self, queued: int, now: float) -> None:
        """The link sent frames and *queued* bytes still wait; at half the limit it has
        recovered."""
        self.last_progress = now
        if self.over_since is not None and queued <= self.limit // 2:
            self.over_since = None

    def stuck(self, now: float) -> bool:
        """Frames wait and nothing has moved for the stall time."""
        return now - self.last_progress >= self.stall

    def expired(self, now: float) -> bool:
        """Over the limit for the whole grace time: close the link as a slow consumer."""
        return self.over_since is not None and now - self.over_since >= self.grace

    def stats(self) -> dict[str, float | int | None]:
        return {"slow_consumer_dropped": self.dropped,
                "over_limit_since": self.over_since}
