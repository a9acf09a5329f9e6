"""Head-of-line stall detection: a peer that is heard (its heartbeats get through) but whose
messages, or the leader's order stream, cannot be had for ``stall_timeout`` seconds.

Failure detection by silence (missed heartbeats) misses a flapping link: heartbeats get
through in every short up window, so the peer never counts as disconnected, while the data
and the repairs that would fill its gaps are lost in the down windows and delivery waits
behind the gap for as long as the flapping lasts. A :class:`StallWatch` turns "a message
known to exist and missing for ``timeout``" into a disconnect (the site part raises the
``STALLED`` peer event, S1 -> S2), so the ordering goes on without the peer (hasten, leader) and its
messages are reconciled later, flagged late, as after any short-term disconnect. A slow,
congested link whose messages each arrive within the time-out is never declared stalled.

A *backlog* is not a stall either. After a partition heals, a site following a leader may
have a hundred order numbers to work through (the other sides' messages, fetched one
range at a time over saturated links) and its own messages queue on their way to the
leader: the oldest missing number or unacknowledged message can be older than the
time-out while the stream drains steadily. So the order stream and the leader's
acknowledgements of our messages count *progress* as well as age
(:meth:`StallWatch.backlog_stalled`, :meth:`StallWatch.acks_stalled`): they are stalled
only when, besides the age, nothing has advanced for ``window`` (half the time-out), or
(the order stream) the backlog has not shrunk over the window. A flapping link stops the
stream for whole down windows and its backlog grows; a large backlog that is being worked
through advances every few tenths of a second and shrinks.

Plain object, composed into the site; imports only the standard library."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable


class StallWatch:
    """Per key (a peer's stream, the order stream): since when each missing message has
    been known to exist."""

    __slots__ = ("timeout", "window", "_known", "_progress", "_backlog")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        #: how long a stream may go without advancing (or its backlog without shrinking)
        #: before an old missing message counts as a stall, for the progress-aware rules:
        #: longer than the heartbeat interval (acknowledgements come with heartbeats)
        self.window = timeout / 2
        self._known: dict[Hashable, deque[tuple[int, float]]] = {}
        self._progress: dict[Hashable, tuple[int, float]] = {}  #: key -> (done, since)
        #: key -> (time, backlog) samples over the last window, oldest first
        self._backlog: dict[Hashable, deque[tuple[float, int]]] = {}

    def missing_stalled(self, key: Hashable, known: int, done: int, now: float) -> bool:
        """A stream whose messages up to *known* exist and up to *done* are here: whether
        the first missing one has been known to exist for ``timeout`` seconds. Progress
        that trickles in does not reset this (each message counts from when it was known):
        a flapping link that repairs a little in each up window still leaves messages
        waiting for longer than the time-out, and is declared stalled; a link that is
        merely slow delivers each message within the time-out and is not."""
        q = self._known.setdefault(key, deque())
        if not q or known > q[-1][0]:
            q.append((known, now))
        while q and q[0][0] <= done:
            q.popleft()
        return bool(q) and now - q[0][1] >= self.timeout

    def backlog_stalled(self, key: Hashable, known: int, done: int, now: float) -> bool:
        """:meth:`missing_stalled`, and the stream is not draining: *done* has not
        advanced for ``window``, or the backlog (*known* - *done*) is no smaller than it
        was ``window`` ago. A large backlog worked through steadily is not a stall."""
        old = self.missing_stalled(key, known, done, now)
        idle = self._idle(key, done, now)
        samples = self._backlog.setdefault(key, deque())
        samples.append((now, known - done))
        while len(samples) > 1 and samples[1][0] <= now - self.window:
            samples.popleft()
        growing = samples[0][0] <= now - self.window and known - done >= samples[0][1]
        return old and (idle >= self.window or growing)

    def acks_stalled(self, key: Hashable, oldest: float, done: int, now: float) -> bool:
        """Messages of ours wait for a peer's acknowledgement, the oldest since *oldest*;
        the peer acknowledges up to *done*. Stalled when the oldest has waited
        ``timeout`` and the acknowledgements have not advanced for ``window`` (they come
        with heartbeats: a slow path still moves them every interval or two)."""
        idle = self._idle(key, done, now)
        return now - oldest >= self.timeout and idle >= self.window

    def _idle(self, key: Hashable, done: int, now: float) -> float:
        """Seconds since *done* last advanced for *key* (0 the first time it is seen)."""
        last = self._progress.get(key)
        if last is None or done > last[0]:
            self._progress[key] = (done, now)
            return 0.0
        return now - last[1]

    def reset(self, key: Hashable) -> None:
        """Forget *key* (it was declared stalled, or left the watched set)."""
        self._known.pop(key, None)
        self._progress.pop(key, None)
        self._backlog.pop(key, None)
