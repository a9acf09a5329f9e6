"""What every benchmark worker process shares (workers.py): its side of the conversation with
the parent, and the clock and counters of its measurement.

The parent reads JSON lines on the worker's stdout (:func:`emit`) and writes words on its
stdin (``go``, ``exit``: :func:`wait_for_command`, read on the event loop, so a profile of
the worker shows only the work measured). A receiver counts into a :class:`Tally` and stops
when traffic stops (:func:`watch_idle`); a sender reports what it sent once it has left the
process (:func:`drain_transport`, :func:`report_sent`); ping-pong roles time their round
trips with :func:`timed_rounds`. CPU and scheduling times come from the process itself.

Imports the standard library only (no flowlib, no nats-py: the roles import those).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any


def emit(event: str, **data: Any) -> None:
    data["event"] = event
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


_stdin: asyncio.StreamReader | None = None


async def read_line() -> str:
    """One line from stdin without blocking the loop ('' at end of input). A pipe reader on
    the loop, not a thread, so profiles of the worker show only the work measured."""
    global _stdin
    if _stdin is None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        _stdin = reader
    return (await _stdin.readline()).decode().strip()


async def wait_for_command(word: str, timeout: float) -> bool:
    try:
        async with asyncio.timeout(timeout):
            while True:
                line = await read_line()
                if line == word or line == "":
                    return line == word
    except TimeoutError:
        return False


def cpu() -> float:
    return time.process_time()


def sched() -> tuple[float, float]:
    """(on-CPU seconds, runnable-but-waiting seconds) of this process's main thread."""
    try:
        with open("/proc/self/schedstat") as f:
            run_ns, wait_ns, _ = f.read().split()
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def sched_since(start: tuple[float, float]) -> dict[str, float]:
    run, wait = sched()
    return {"run_s": run - start[0], "wait_s": wait - start[1]}


class Tally:
    """Messages and payload bytes seen by one receiver, with first/last arrival times."""

    __slots__ = ("count", "nbytes", "first", "last")

    def __init__(self) -> None:
        self.count = 0
        self.nbytes = 0
        self.first = 0.0
        self.last = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "bytes": self.nbytes, "first": self.first,
                "last": self.last}


async def watch_idle(tallies: list[Tally], idle: float, first_timeout: float,
                     max_time: float) -> str:
    """Return once traffic stopped: *idle* s with nothing new after the first message, no
    message within *first_timeout*, or *max_time* in total."""
    start = time.monotonic()
    while True:
        await asyncio.sleep(min(0.05, idle / 4))
        now = time.monotonic()
        if now - start > max_time:
            return "max-time"
        lasts = [t.last for t in tallies if t.count]
        if lasts:
            if now - max(lasts) > idle:
                return "idle"
        elif now - start > first_timeout:
            return "no-message"


def merge(tallies: list[Tally]) -> dict[str, Any]:
    got = [t for t in tallies if t.count]
    return {
        "count": sum(t.count for t in tallies), "bytes": sum(t.nbytes for t in tallies),
        "first": min((t.first for t in got), default=0.0),
        "last": max((t.last for t in got), default=0.0),
    }


async def ready_for_go(p: dict[str, Any]) -> bool:
    """Tell the parent we are ready, then wait for its ``go`` (False, with an error for the
    parent, when none comes within ``p["max_time"]``)."""
    emit("ready")
    if await wait_for_command("go", p["max_time"]):
        return True
    emit("error", error="no 'go' from the parent")
    return False


async def report_sent(p: dict[str, Any], sent: int, nbytes: int, t0: float, t1: float,
                      cpu0: float, sch0: tuple[float, float]) -> None:
    """A sender's result for the parent, once what it wrote has left this process (sent in
    ``t0..t1``, measured from *cpu0*/*sch0*); then wait for the parent's ``exit``."""
    emit("result", sent=sent, bytes=nbytes, start=t0, end=t1, seconds=t1 - t0,
         drained=time.monotonic(), cpu_s=cpu() - cpu0, sched=sched_since(sch0))
    await wait_for_command("exit", p["max_time"])


async def until_idle(p: dict[str, Any], tally: Tally) -> dict[str, Any]:
    """A single-connection receiver's run: wait (see :func:`watch_idle`) until traffic
    stopped; the why, CPU and scheduling of the wait, for its result."""
    cpu0 = cpu()
    sch0 = sched()
    why = await watch_idle([tally], p["idle"], p["first_timeout"], p["max_time"])
    return {"stop": why, "cpu_s": cpu() - cpu0, "sched": sched_since(sch0)}


async def drain_transport(transport: asyncio.Transport | None, timeout: float) -> None:
    end = time.monotonic() + timeout
    while transport is not None and transport.get_write_buffer_size() \
            and time.monotonic() < end:
        await asyncio.sleep(0.002)


async def timed_rounds(rounds: Any, p: dict[str, Any], what: str) -> bool:
    """Warm up, then time ``p["rounds"]`` round trips within ``p["max_time"]``; emit the
    result (or the stall) for the parent. ``rounds(n, out)`` runs n round trips, appending
    each round trip's nanoseconds to *out* unless it is None. True if it finished."""
    rtts: list[int] = []
    try:
        async with asyncio.timeout(p["max_time"]):
            await rounds(p["warmup"], None)
            cpu0 = cpu()
            await rounds(p["rounds"], rtts)
    except TimeoutError:
        emit("error", error=f"{what} stalled after {len(rtts)} rounds (lost message?)")
        return False
    emit("result", rtt_ns=rtts, cpu_s=cpu() - cpu0)
    return True
