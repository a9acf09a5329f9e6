"""Head-of-line stall detection: a peer that is heard (its heartbeats get through) but whose
messages, or the leader's order stream, cannot be had for ``stall_timeout`` seconds.

Failure detection by silence (missed heartbeats) misses a flapping link: heartbeats get
through in every short up window, so the peer never counts as disconnected, while the data
and the repairs that would fill its gaps are lost in the down windows and delivery waits
behind the gap for as long as the flapping lasts. A :class:`StallWatch` turns "blocked
without progress for ``timeout``" into a disconnect (the site part raises the ``STALLED``
peer event, S1 -> S2), so the ordering goes on without the peer (hasten, leader) and its
messages are reconciled later, flagged late, as after any short-term disconnect. A stream
that trickles in (a slow, congested link) makes progress and is never declared stalled.

Plain object, composed into the site; imports only the standard library."""

from __future__ import annotations

from collections.abc import Hashable


class StallWatch:
    """Per key (a peer's stream, the order stream): since when it has been blocked."""

    __slots__ = ("timeout", "_since")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._since: dict[Hashable, float] = {}

    def stalled(self, key: Hashable, blocked: bool, progress_at: float, now: float) -> bool:
        """Whether *key*, *blocked* now (something known to exist is missing), has gone
        ``timeout`` seconds since it became blocked and since its last progress."""
        if not blocked:
            self._since.pop(key, None)
            return False
        since = self._since.setdefault(key, now)
        return now - max(since, progress_at) >= self.timeout

    def reset(self, key: Hashable) -> None:
        """Forget *key*'s blocked time (it was declared stalled, or left the watched set)."""
        self._since.pop(key, None)

    def blocked_for(self, key: Hashable, now: float) -> float:
        """How long *key* has been blocked (0: not blocked)."""
        since = self._since.get(key)
        return 0.0 if since is None else now - since
