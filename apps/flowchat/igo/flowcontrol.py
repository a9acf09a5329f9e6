"""Sender flow control: congestion is a state, not a collapse. Own messages in flight (sent
but not yet acknowledged by every connected peer) are bounded by a byte window; beyond it
new messages wait in a bounded outbox, the site is *congested* (the application tells its
users to slow down) and an outbox that is full refuses more.

Without it a site offered more than its links carry multicasts everything at once: router
queues overflow, heartbeats (which overtake data) announce messages that are still queued,
receivers ask for them again, the repairs add to the queues, and latency grows without
bound. With it the data in the network stays near the window, so latency stays near
window / link rate (about 4.5 s for the default 32 KiB on a 56 kbit/s link).

Acknowledgements ride on heartbeats (each peer's contiguous position in our stream, for
our current run). A peer that is not connected (S2/S3) does not hold the window: it is
reconciled later, as the seed does. Plain object, composed into the site; imports only
the standard library."""

from __future__ import annotations

from collections import deque


class OutboxFull(Exception):
    """The site is congested and its outbox is full: the message was not taken."""


class SendWindow:
    """The bytes of own messages in flight and the outbox of messages waiting to go."""

    __slots__ = ("window", "limit", "_inflight", "_inflight_bytes", "_outbox", "_acked",
                 "waited", "paused")

    def __init__(self, window: int | None, outbox_limit: int) -> None:
        self.window = window  #: bytes in flight at most (None: no flow control)
        self.limit = outbox_limit
        self._inflight: deque[tuple[int, int]] = deque()  #: (seq, bytes), oldest first
        self._inflight_bytes = 0
        self._outbox: deque[tuple[bytes, float]] = deque()  #: (payload, submitted at)
        self._acked = 0
        self.waited = 0.0  #: the longest a released message waited in the outbox (s)
        #: a view change is under way: messages wait in the outbox (not congestion: they go
        #: as soon as the new view is installed)
        self.paused = False

    @property
    def congested(self) -> bool:
        """More is offered than the network takes: messages wait, or the window is full."""
        if self.paused:  # a view change: congested only if it lasts and the outbox fills
            return len(self._outbox) >= self.limit // 2 or self._full()
        return bool(self._outbox) or self._full()

    @property
    def queued(self) -> int:
        return len(self._outbox)

    @property
    def in_flight(self) -> int:
        return self._inflight_bytes

    def _full(self) -> bool:
        return self.window is not None and self._inflight_bytes >= self.window

    def offer(self, payload: bytes, now: float) -> bool:
        """A new message: True if it may go now; False if it was queued (congested).
        Raises :class:`OutboxFull` when it can be neither sent nor queued."""
        if not self._outbox and not self._full() and not self.paused:
            return True
        if len(self._outbox) >= self.limit:
            raise OutboxFull(f"congested: {len(self._outbox)} messages already wait")
        self._outbox.append((payload, now))
        return False

    def sent(self, seq: int, size: int) -> None:
        self._inflight.append((seq, size))
        self._inflight_bytes += size

    def acked(self, upto: int) -> None:
        """Every connected peer holds our messages up to *upto*."""
        if upto <= self._acked:
            return
        self._acked = upto
        while self._inflight and self._inflight[0][0] <= upto:
            self._inflight_bytes -= self._inflight.popleft()[1]

    def restart_acks(self) -> None:
        """Forget every acknowledgement (nothing to wait for: e.g. no connected peer)."""
        self._inflight.clear()
        self._inflight_bytes = 0

    def next_ready(self, now: float) -> bytes | None:
        """The oldest queued message if the window lets it go now (the caller sends it and
        reports it with :meth:`sent`), else None."""
        if not self._outbox or self._full() or self.paused:
            return None
        payload, t = self._outbox.popleft()
        self.waited = max(self.waited, now - t)
        return payload
