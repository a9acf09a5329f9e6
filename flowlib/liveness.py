"""Liveness of the router link and refresh digests of what the client holds (sans-I/O).

* **Liveness** (:class:`Liveness`). The router sends an ECHO every second or so; the client
  answers it and sends its own every ``liveness_interval``. Anything read from the router
  counts as a sign of life; a router silent for ``dead_after`` seconds is hung or cut off (a
  stopped process whose kernel still holds the socket answers TCP, so TCP alone never
  notices), and the link is dropped like a lost one. ``rtt`` is the smoothed round trip of
  the echoes. A router that never sent an ECHO or ECHO_REPLY (one from before soft state) is
  never declared dead for silence.
* **Refresh** (:class:`RefreshDigests`). Every ``refresh_interval`` the client sends its
  router one digest (chunked, spread over the interval) of the flows it listens on or
  advertises and their band masks. The router reconciles its table from it, so a lost JOIN,
  mask change or LEAVE is repaired by the next round, and what the client stopped listing is
  collected.

* **JOIN resends** (:class:`JoinResends`). On a datagram link a JOIN may be lost, and the
  caller waiting for its answer would wait out its whole time-out. A JOIN not answered
  within ``interval`` is sent again (the same request: the router answers a repeat as the
  first, a JOIN only ever replaces the link's mask), until answered or given up.

All take the time as an argument and say when they next need it (``next_deadline``), so
tests drive them on virtual time. Imports only the wire layer of flowrouter.
"""

from __future__ import annotations

from collections.abc import Callable

from flowrouter.wire import control as C

SPREAD = 0.8  #: share of the refresh interval a digest round is spread over


class Liveness:
    """ECHOs both ways and the dead-router check of one link."""

    def __init__(self, interval: float, dead_after: float, now: float,
                 rtt: float | None = None) -> None:
        self.interval = interval
        self.dead_after = dead_after
        #: smoothed round trip of our echoes (seconds; None before the first)
        self.rtt = rtt
        #: the router has sent an ECHO or ECHO_REPLY on this link: it speaks liveness, so
        #: its silence means something
        self.router_speaks = False
        self.heard = now
        self.echo_due = now
        self.seq = 0
        #: sequence numbers of the flush ECHOs not answered yet (see :meth:`flush_echo`)
        self.flushes: set[int] = set()

    def heard_from(self, now: float) -> None:
        """Something was read from the router."""
        self.heard = now

    def on_echo(self, msg: C.Echo) -> C.EchoReply:
        self.router_speaks = True
        return C.EchoReply(msg.seq, msg.stamp)

    def on_echo_reply(self, msg: C.EchoReply, now: float) -> bool:
        """Take the router's reply; True when it answers a flush ECHO."""
        self.router_speaks = True
        sample = now - msg.stamp / 1e6
        if 0 <= sample < 3600:
            self.rtt = sample if self.rtt is None else 0.875 * self.rtt + 0.125 * sample
        if msg.seq in self.flushes:
            self.flushes.discard(msg.seq)
            return True
        return False

    def flush_echo(self, now: float) -> C.Echo:
        """An ECHO sent now, out of turn, whose reply tells that the router has read
        everything written before it (a router answers an ECHO when it reads it, and reads
        a stream link in order). At most 1,024 are awaited at once: older ones are
        forgotten (their flushes time out)."""
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        if len(self.flushes) >= 1024:
            self.flushes.clear()
        self.flushes.add(self.seq)
        return C.Echo(self.seq, int(now * 1e6) & 0xFFFFFFFFFFFFFFFF)

    def silent_for(self, now: float) -> float | None:
        """How long a router that speaks liveness has been silent, once that is longer than
        ``dead_after`` (None while it is alive, or cannot be judged)."""
        silent = now - self.heard
        if self.router_speaks and silent > self.dead_after:
            return silent
        return None

    def echo(self, now: float) -> C.Echo | None:
        """Our ECHO if one is due at *now*."""
        if now < self.echo_due:
            return None
        self.echo_due = now + self.interval
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return C.Echo(self.seq, int(now * 1e6) & 0xFFFFFFFFFFFFFFFF)

    def next_deadline(self, echoing: bool) -> float:
        """When to look again: the next ECHO (when *echoing*) or the dead-after limit."""
        due = self.heard + self.dead_after if self.router_speaks else float("inf")
        if echoing:
            due = min(due, self.echo_due)
        # a hair past the limit, so the check at that time sees it passed
        return due + 1e-6 if due != float("inf") else due


class RefreshDigests:
    """Digest rounds: a snapshot of what we hold, sent in chunks spread over the round."""

    def __init__(self, interval: float, now: float) -> None:
        self.interval = interval
        self.round = 0
        self.round_due = now + interval
        self.keys: list[bytes] = []
        self.sent = 0
        self.count = 0
        self.started = 0.0
        self.period = interval
        #: rounds begun on this link
        self.rounds = 0

    def poll(self, now: float, snapshot: Callable[[], list[bytes]],
             entry: Callable[[bytes], tuple[bytes, int, int] | None],
             max_payload: int) -> list[C.Refresh]:
        """The digest chunks due at *now*. *snapshot* lists the flows the router holds for
        us; *entry* gives a flow's digest line (None when it is no longer held)."""
        per = C.refresh_capacity(max_payload)
        if now >= self.round_due:
            self.round = (self.round + 1) & 0xFFFFFFFF
            self.keys = snapshot()
            self.count = max(1, -(-len(self.keys) // per))
            self.sent = 0
            self.started = now
            self.period = C.refresh_period(len(self.keys), self.interval)
            self.round_due = now + self.period
            self.rounds += 1
        out: list[C.Refresh] = []
        if self.sent >= self.count:
            return out
        span = self.period * SPREAD
        due = min(self.count, 1 + int(self.count * (now - self.started) / span))
        hold_ms = int(self.period * C.DEFAULT_HOLD_FACTOR * 1000)
        while self.sent < due:
            i = self.sent
            lines = []
            for key in self.keys[i * per:(i + 1) * per]:
                line = entry(key)
                if line is not None:
                    lines.append(line)
            out.append(C.Refresh(self.round, i, self.count, hold_ms, tuple(lines)))
            self.sent += 1
        return out

    def next_deadline(self) -> float:
        if self.sent < self.count:
            # a hair late, so the poll at that time finds the chunk due
            return min(self.round_due,
                       self.started + self.sent * self.period * SPREAD / self.count + 1e-6)
        return self.round_due


Resend = tuple[bytes, C.ControlMessage, tuple[int, int]]  #: flow key, the JOIN, locality


class JoinResends:
    """The JOINs of a datagram link not answered yet, and when each goes out again."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._due: dict[int, tuple[float, Resend]] = {}

    def sent(self, req: int, what: Resend, now: float) -> None:
        self._due[req] = (now + self.interval, what)

    def answered(self, req: int) -> None:
        """JOIN *req* was answered (or nobody waits for it any more)."""
        self._due.pop(req, None)

    def next_deadline(self) -> float:
        return min((due for due, _ in self._due.values()), default=float("inf"))

    def poll(self, now: float) -> list[Resend]:
        """The JOINs to send again now (each is due again an interval later)."""
        out = []
        for req, (due, what) in list(self._due.items()):
            if now >= due:
                out.append(what)
                self._due[req] = (now + self.interval, what)
        return out
