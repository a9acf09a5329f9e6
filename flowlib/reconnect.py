"""Which router to try next after a loss, and when to give up (sans-I/O).

:class:`ReconnectPlan` is the failover's schedule (:mod:`flowlib.failover` runs it): rounds
that try every address once, round robin from the one after the lost router; between rounds
an exponential back-off from ``reconnect_min`` to ``reconnect_max``; every attempt bounded by
``connect_timeout`` and by what is left of ``failover_timeout`` since the loss, after which
the client gives up. It takes the time and answers with the next step, so it is tested on
virtual time. Imports nothing of the network.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Attempt:
    """Try the router at *index* for at most *timeout* seconds."""

    index: int
    timeout: float
    round: int


@dataclass(frozen=True, slots=True)
class Pause:
    """No router of this round answered: wait *delay* seconds before the next round."""

    delay: float
    round: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """``failover_timeout`` passed since the loss without a router."""


Step = Attempt | Pause | GiveUp


class ReconnectPlan:
    """The attempts of one failover, from the loss at *started*."""

    def __init__(self, addresses: int, lost_index: int, started: float, *, timeout: float,
                 connect_timeout: float, reconnect_min: float, reconnect_max: float) -> None:
        if addresses < 1:
            raise ValueError("a failover needs at least one router address")
        self.n = addresses
        self.start = (lost_index + 1) % addresses
        self.started = started
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.delay = reconnect_min
        self.reconnect_max = max(reconnect_max, reconnect_min)
        self.round = 1
        self.tried = 0  # attempts made in this round

    def left(self, now: float) -> float:
        """Seconds left before the client gives up."""
        return self.timeout - (now - self.started)

    def next(self, now: float) -> Step:
        """What to do at *now* (after the previous step's attempt failed or pause ended)."""
        left = self.left(now)
        if left <= 0:
            return GiveUp()
        if self.tried < self.n:
            index = (self.start + self.tried) % self.n
            self.tried += 1
            return Attempt(index, min(self.connect_timeout, left), self.round)
        pause = Pause(min(self.delay, left), self.round)
        self.delay = min(self.delay * 2, self.reconnect_max)
        self.round += 1
        self.tried = 0
        return pause
