"""A timer wheel of epoch buckets: the core's scheduler for work that falls due later.

Holds nothing but opaque items filed under the time they fall due; imports nothing from the
project (it sits at the bottom of :mod:`flowrouter.core`).

Why buckets and not a sorted heap of every deadline: soft state re-arms the same timers
all the time (every echo, every refresh round), so a deadline is usually superseded before
it falls due. The wheel files an item in the bucket of ``int(at / granularity)`` (O(1)),
never removes it when it is superseded (*lazy cancellation*: whoever pops it checks that it
is still current), and :meth:`TimerWheel.pop_due` touches only the buckets that are due. The
work of a tick is therefore proportional to what is due, never to how much state exists,
which is what lets a router keep 10^6 flows with a few per cent of one core. A small heap of
bucket numbers lets a tick after a long pause jump over empty buckets.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable


class TimerWheel:
    """Items filed by due time, popped in bucket order once due.

    ``granularity`` (seconds) bounds how late an item may pop: an item due at ``t`` pops
    on the first :meth:`pop_due` with ``now >= t`` rounded up to its bucket's end, so choose
    it well below the shortest period scheduled (the router uses a quarter of it).
    """

    __slots__ = ("granularity", "_buckets", "_order", "_cursor", "scheduled")

    def __init__(self, granularity: float) -> None:
        if not granularity > 0:
            raise ValueError("timer granularity must be positive")
        self.granularity = granularity
        self._buckets: dict[int, list[Hashable]] = {}
        self._order: list[int] = []  #: heap of bucket numbers that hold items
        self._cursor: int | None = None  #: the first bucket not yet popped
        self.scheduled = 0  #: items filed and not yet popped (stale ones included)

    def schedule(self, item: Hashable, at: float) -> None:
        """File *item* to pop at *at* (or at the next :meth:`pop_due` if that has passed)."""
        b = int(at // self.granularity)
        if self._cursor is not None and b < self._cursor:
            b = self._cursor
        bucket = self._buckets.get(b)
        if bucket is None:
            bucket = self._buckets[b] = []
            heapq.heappush(self._order, b)
        bucket.append(item)
        self.scheduled += 1

    def pop_due(self, now: float) -> list[Hashable]:
        """Every item whose bucket ended by *now*, oldest bucket first (filing order inside
        a bucket). Items may be stale: the caller checks them against its state."""
        last = int(now // self.granularity) - 1  # buckets that have fully elapsed
        out: list[Hashable] = []
        order = self._order
        while order and order[0] <= last:
            out += self._buckets.pop(heapq.heappop(order))
        if self._cursor is None or last + 1 > self._cursor:
            self._cursor = last + 1
        self.scheduled -= len(out)
        return out

    def next_due(self) -> float | None:
        """When the earliest filed item becomes due (for shells that sleep until then)."""
        return (self._order[0] + 1) * self.granularity if self._order else None

    def __len__(self) -> int:
        return self.scheduled
