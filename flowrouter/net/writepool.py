"""The socket writes of one batch (a forwarding pass's outputs, or the outputs a read
gathered), made together: on more than one core when they are many.

A pass whose frames go to many links (a fan-out) ends in one ``writev`` per link, and on
loopback or a fast LAN the kernel's copy into each socket is nearly all of the router's
time (a profile of one sender to 100 receivers put 99% of the router in ``writev``). One
thread leaves the other cores idle while it copies, where nats-server's flushers write to
their clients on every core. :class:`GatheredWrites` keeps the writes a batch's links ask
for (:func:`~flowrouter.net.streamio.write_gathered`'s work, deferred to the batch's end),
and then writes them: itself when they are few or small, else split between the loop's
thread and ``write_threads`` helper threads, each making its links' ``writev`` calls (the
GIL is free while the kernel copies). The loop's thread waits for the helpers, so nothing
else runs: no transport is closed, written or read meanwhile, and the receive buffer the
writes may point into is not reused until they are done. What a socket does not take is
then handed to its transport, in link order, as
:func:`~flowrouter.net.streamio.write_gathered` does (its transport may push back then).

Per link, writes keep their order: a link's next write in a batch joins its first, and a
link closed or sealed meanwhile writes its share first (:meth:`GatheredWrites.settle`).
Flow control therefore sees a batch's push backs after every output of it was given its
frames (one at a time, the first full socket paused before its later siblings got any).

May import only the standard library and :mod:`flowrouter.net.streamio`.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

from flowrouter.net.streamio import keep_rest, write_direct, write_gathered

#: a batch's writes go to helper threads only when they come to this many bytes in all (a
#: hand-off costs two thread wake-ups: small writes are cheaper made at once)
PARALLEL_BYTES = 256 * 1024
#: ... and go to at least this many links
PARALLEL_LINKS = 4


def _joined(parts: list[list[Any]]) -> list[Any]:
    """One link's buffers of a batch, in order (its writes' lists, one after another)."""
    return parts[0] if len(parts) == 1 else [b for part in parts for b in part]


def default_threads() -> int:
    """Helper threads by default: one fewer than the cores this process may use, at most 3
    (the senders and receivers on the host need cores too)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(0, min(cores - 1, 3))


class _Helper:
    """One helper thread: takes a share of writes, answers each with write_direct's result."""

    __slots__ = ("inbox", "outbox", "thread")

    def __init__(self, number: int) -> None:
        self.inbox: queue.SimpleQueue[list[tuple[Any, int, list[Any]]] | None] = (
            queue.SimpleQueue())
        self.outbox: queue.SimpleQueue[list[tuple[int, int]] | BaseException] = (
            queue.SimpleQueue())
        self.thread = threading.Thread(target=self._serve, name=f"flowrouter-writer-{number}",
                                       daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            share = self.inbox.get()
            if share is None:
                return
            try:
                self.outbox.put([write_direct(fd, bufs) for _, fd, bufs in share])
            except BaseException as exc:  # handed back: the loop's thread raises it  # noqa: BLE001
                self.outbox.put(exc)


class GatheredWrites:
    """The writes of the batch in progress (see the module docstring).

    :meth:`begin` opens a batch, :meth:`write` takes a link's buffers (at once when none
    is open), :meth:`run` writes what the batch gathered and closes it."""

    __slots__ = ("threads", "open", "jobs", "size", "helpers", "parallel")

    def __init__(self, threads: int) -> None:
        #: helper threads at most (0: the loop's thread writes everything)
        self.threads = threads
        self.open = False
        #: fd -> (transport, the buffer lists its writes gave, in order), links in the
        #: order they first wrote
        self.jobs: dict[int, tuple[Any, list[list[Any]]]] = {}
        self.size = 0  #: bytes gathered
        self.helpers: list[_Helper] = []
        #: batches whose writes were shared with helpers (status)
        self.parallel = 0

    def begin(self) -> None:
        self.open = True

    def write(self, transport: Any, fd: int, buffers: list[Any], size: int) -> None:
        """*buffers* (*size* bytes) for the socket *fd* of *transport*, written when the batch
        ends, or now if none is open (or *fd* < 0: no direct writes on that transport)."""
        if not self.open or fd < 0:
            write_gathered(transport, fd, buffers)
            return
        self.size += size
        job = self.jobs.get(fd)
        if job is None:
            self.jobs[fd] = (transport, [buffers])
        else:  # its next write in this batch: after the first, on the same thread
            job[1].append(buffers)

    def settle(self, fd: int) -> None:
        """Write now what the batch gathered for the socket *fd*: its transport is about to
        be written directly (a sealed record, a queue's drain) or closed, and must have
        these bytes first."""
        job = self.jobs.pop(fd, None)
        if job is not None:
            write_gathered(job[0], fd, _joined(job[1]))

    def run(self) -> None:
        """Write what the batch gathered, and close it."""
        self.open = False
        jobs = self.jobs
        if not jobs:
            return
        self.jobs = {}
        size, self.size = self.size, 0
        share = self.threads and len(jobs) >= PARALLEL_LINKS and size >= PARALLEL_BYTES
        direct = []
        for fd, (transport, parts) in jobs.items():
            if transport.is_closing():
                continue  # closed meanwhile: its writes are moot, as before
            if share and not transport.get_write_buffer_size():
                direct.append((transport, fd, _joined(parts)))
            else:  # few or small, or its transport has a backlog (copied behind it)
                write_gathered(transport, fd, _joined(parts))
        if direct:
            self._share(direct)

    def _share(self, direct: list[tuple[Any, int, list[Any]]]) -> None:
        """Write *direct* (links whose transports hold nothing) on this thread and helpers."""
        ways = min(self.threads, len(direct) - 1) + 1
        if ways < 2:
            for job in direct:
                write_gathered(*job)
            return
        self.parallel += 1
        while len(self.helpers) < ways - 1:
            self.helpers.append(_Helper(len(self.helpers) + 1))
        shares = [direct[k::ways] for k in range(ways)]
        for k in range(1, ways):
            self.helpers[k - 1].inbox.put(shares[k])
        results: list[Any] = []
        try:
            results.append([write_direct(fd, bufs) for _, fd, bufs in shares[0]])
        finally:  # every helper's answer, whatever happens: none is left for the next batch
            results += [self.helpers[k - 1].outbox.get() for k in range(1, ways)]
        for answer in results:
            if isinstance(answer, BaseException):
                raise answer  # a bug in write_direct, not a socket's error (those it keeps)
        for share, answers in zip(shares, results, strict=True):
            for (transport, _, buffers), (i, sent) in zip(share, answers, strict=True):
                if i < len(buffers):
                    keep_rest(transport, buffers, i, sent)

    def status(self) -> dict[str, int]:
        return {"threads": self.threads, "parallel_batches": self.parallel}

    def close(self) -> None:
        """Stop the helper threads (the node is closing)."""
        for helper in self.helpers:
            helper.inbox.put(None)
        self.helpers = []
