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

Plain object, composed into the site; imports only the standard library."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable


class StallWatch:
    """Per key (a peer's stream, the order stream): since when each missing message has
    been known to exist."""

    __slots__ = ("timeout", "_known")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._known: dict[Hashable, deque[tuple[int, float]]] = {}

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

    def reset(self, key: Hashable) -> None:
        """Forget *key* (it was declared stalled, or left the watched set)."""
        self._known.pop(key, None)
