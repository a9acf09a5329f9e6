"""The discrete-event core: a heap of callbacks in virtual time.

Entries are ``(time, seq, callback, args)``. ``seq`` is a global counter, so two events at the
same time run in the order they were scheduled and the heap never compares callbacks: the
same inputs always give the same run, which is what makes the simulator reproducible.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventQueue:
    __slots__ = ("now", "_heap", "_seq", "processed")

    def __init__(self) -> None:
        self.now = 0.0
        #: pending events (time, sequence number, callback, args), a heap
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.processed = 0  #: callbacks run so far

    def schedule(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at virtual time *t* (not before the current time)."""
        if t < self.now:
            raise ValueError(f"cannot schedule at t={t:g}, the clock is already at "
                             f"{self.now:g}")
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def push(self, t: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run ``fn(*args)`` at virtual time *t*, unchecked: the per-frame form of
        :meth:`schedule` for sim links, whose arrival times never lie before the clock."""
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def run_until(self, t_end: float) -> int:
        """Run every event due at or before *t_end*; the clock ends at *t_end*."""
        q = self._heap
        pop = heapq.heappop
        n = 0
        while q and q[0][0] <= t_end:
            t, _, fn, args = pop(q)
            self.now = t
            fn(*args)
            n += 1
        self.processed += n
        if t_end > self.now:
            self.now = t_end
        return n

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
