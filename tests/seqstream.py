"""A numbered stream for the failover tests on real sockets (test_location_service,
test_ls_tree_live): a sender that sends ``b"seq N"`` on a flow at a steady pace until told
to stop, and a receiver that notes when each number arrived, so a test can kill a router
mid-stream and measure the longest silence after the kill and the numbers lost.
Imports flowlib's public interface, the wire's band names and tests.rawep only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from flowlib import FlowClient, FlowID, Listener
from flowrouter.wire.bands import BAND_FAULT

from .rawep import within


class SeqSender:
    """Sends ``b"seq 0"``, ``b"seq 1"``, ... on *flow* (band *band*) every *interval*
    seconds from the moment it is made until :meth:`stop`."""

    def __init__(self, client: FlowClient, flow: FlowID, *, band: int = 32,
                 interval: float = 0.002) -> None:
        self._client, self._flow = client, flow
        self._band, self._interval = band, interval
        self._stop = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            await self._client.send(self._flow, b"seq %d" % i, band=self._band)
            i += 1
            await asyncio.sleep(self._interval)

    async def stop(self) -> None:
        """Stop sending and wait for the sender to finish (its error, if any, is raised)."""
        self._stop.set()
        await self._task


class SeqReceiver:
    """The numbers a listener got, each with the time it arrived (``time.perf_counter``);
    fault notices and anything that is not ``seq N`` are passed over."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self.got: list[tuple[float, int]] = []

    async def until(self, n: int) -> None:
        """Until *n* numbers have arrived in all (each wait bounded)."""
        while len(self.got) < n:
            msg = await within(self._listener.get())
            if msg.band != BAND_FAULT and msg.payload.startswith(b"seq "):
                self.got.append((time.perf_counter(), int(msg.payload[4:])))

    async def across(self, kill: Awaitable[None], more: int = 100) -> float:
        """Await *kill* (a router stopping), then *more* numbers; returns when the kill
        began, for :meth:`silence_after`."""
        t_kill = time.perf_counter()
        await kill
        await self.until(len(self.got) + more)
        return t_kill

    @property
    def numbers(self) -> list[int]:
        return [n for _, n in self.got]

    def silence_after(self, t: float) -> float:
        """The longest time without a number from *t* on (the first arrival after *t*
        counts from *t*)."""
        after = [at for at, _ in self.got if at > t]
        return max(b - a for a, b in zip([t, *after], after))

    def lost(self) -> int:
        """How many numbers between the first and the last that arrived never did."""
        nums = self.numbers
        return len(set(range(nums[0], nums[-1] + 1)) - set(nums))
