"""A work budget per tick: per-entry work bounded per step and shared fairly among links.

Some messages cost the router work per *entry* they list: a refresh digest chunk lists up to
a thousand flows, each looked up, reconciled and maybe answered NOT_ON_TREE. One message is
bounded by the frame size, but an application can send them back to back: 10^6 digest
entries for flows it does not hold once stalled a router's event loop for seconds, so long
that its neighbours declared it dead. The budget bounds what all links together can make
the router do between two ticks (``per_tick`` entries): work that fits is done at once, the
rest waits in a queue per link and the next ticks serve those queues round robin, each link
an equal share, so one busy link delays itself and not the others.

An application link may keep at most ``backlog`` entries waiting; past that its further
messages are dropped (the caller counts them and raises an alert). Router links are never
dropped: a proven neighbour's digests are paced by its own ``max_refresh_rate`` and only
wait. Each waiting item remembers when it arrived, so work done late is dated as received
(a digest round is as old as its first chunk, not as its processing).

Sans-I/O (the clock is passed in, nothing here reads it); generic over the work item, so
the part that owns the work (the soft state) decides what one entry costs. May import only
the standard library.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Waiting(Generic[T]):
    """One deferred item: its work, its size in entries, how far it got, when it came."""

    item: T
    size: int
    at: float
    done: int = 0


class WorkBudget(Generic[T]):
    """Entries of work per tick, and the per-link queues of what did not fit."""

    __slots__ = ("per_tick", "backlog", "left", "_queues", "_waiting", "_turn")

    def __init__(self, per_tick: int, backlog: int) -> None:
        if per_tick < 1 or backlog < 0:
            raise ValueError("a work budget needs per_tick >= 1 and backlog >= 0")
        self.per_tick = per_tick
        self.backlog = backlog
        #: entries still allowed before the next tick
        self.left = per_tick
        self._queues: dict[int, deque[Waiting[T]]] = {}
        self._waiting: dict[int, int] = {}
        self._turn = 0  #: rotates which link is served first

    def __bool__(self) -> bool:
        """Work is waiting."""
        return bool(self._queues)

    def waiting(self, link_id: int | None = None) -> int:
        """Entries waiting on *link_id* (all links: None)."""
        if link_id is None:
            return sum(self._waiting.values())
        return self._waiting.get(link_id, 0)

    def try_now(self, link_id: int, size: int) -> bool:
        """May *size* entries from *link_id* be done at once? (Nothing of that link waits,
        and the budget holds them: then they are charged.)"""
        if link_id in self._queues or size > self.left:
            return False
        self.left -= size
        return True

    def defer(self, link_id: int, item: T, size: int, at: float, *, capped: bool) -> bool:
        """Queue *item* behind *link_id*'s waiting work; False (nothing queued) when a
        *capped* link already has ``backlog`` entries waiting."""
        held = self._waiting.get(link_id, 0)
        if capped and held + size > self.backlog:
            return False
        self._queues.setdefault(link_id, deque()).append(Waiting(item, size, at))
        self._waiting[link_id] = held + size
        return True

    def forget(self, link_id: int) -> None:
        """The link is gone: its waiting work goes with it."""
        self._queues.pop(link_id, None)
        self._waiting.pop(link_id, None)

    def serve(self, do: Callable[[int, Waiting[T], int], None]) -> int:
        """A new tick: refill the budget and spend it on the waiting work, round robin, an
        equal share per link (what a link does not use goes to the others). ``do(link,
        waiting, n)`` does the next *n* entries of *waiting* (``waiting.done`` says how
        many were done before). Returns the entries done."""
        self.left = self.per_tick
        spent = 0
        while self._queues and self.left > 0:
            order = list(self._queues)
            start = self._turn % len(order)
            self._turn += 1
            share = max(1, self.left // len(order))
            for lid in order[start:] + order[:start]:
                if self.left <= 0:
                    break
                n = self._serve_link(lid, min(share, self.left), do)
                self.left -= n
                spent += n
        return spent

    def _serve_link(self, lid: int, quota: int, do: Callable[[int, Waiting[T], int], None]
                    ) -> int:
        queue = self._queues[lid]
        spent = 0
        while queue and spent < quota:
            w = queue[0]
            n = min(quota - spent, w.size - w.done)
            do(lid, w, n)
            w.done += n
            spent += n
            if w.done >= w.size:
                queue.popleft()
        self._waiting[lid] -= spent
        if not queue:
            del self._queues[lid]
            del self._waiting[lid]
        return spent

    def links(self) -> Iterator[int]:
        """Links with work waiting."""
        return iter(list(self._queues))
