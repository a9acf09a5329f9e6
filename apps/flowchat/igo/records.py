"""The IGO state machine's internal records: a message, what is known of one origin's
stream, of one peer site, and a token bucket for pacing. Imports only the standard library."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .actions import PeerState


class Msg:
    __slots__ = ("origin", "inc", "seq", "lamport", "send_time", "deps", "payload", "rx", "sig",
                 "view")

    def __init__(self, origin: int, inc: int, seq: int, lamport: int, send_time: float,
                 deps: tuple[tuple[int, int, int], ...], payload: bytes, rx: float,
                 sig: bytes = b"", view: int = 0) -> None:
        self.origin = origin
        self.inc = inc
        self.seq = seq
        self.lamport = lamport
        self.send_time = send_time
        self.deps = deps  #: (origin, incarnation, seq) entries: what its sender had delivered
        self.payload = payload
        self.rx = rx
        self.sig = sig  #: the origin's signature (keyed rooms; resent unchanged)
        self.view = view  #: the view (vid) its origin sent it in

    def same_content(self, other: Msg) -> bool:
        """Whether *other* (same origin, incarnation and seq) says the same thing: two
        frames that differ here are a conflict (a forgery, or an origin equivocating)."""
        return (self.lamport == other.lamport and self.send_time == other.send_time
                and self.deps == other.deps and self.payload == other.payload
                and self.view == other.view)


class Stream:
    """What this site knows about one origin's sequence of messages in one of its
    incarnations (runs): ``(origin, inc)`` names the stream, never the origin alone."""

    __slots__ = ("origin", "retired_at", "successor", "inc", "contiguous", "pending",
                 "known_high", "bound", "hb_high", "hb_clock", "delivered", "settled", "skipped",
                 "store", "store_order", "nack_due", "nack_tries", "lt_wanted", "synced",
                 "asked_high", "asked_at", "progress_at", "rx_at", "history", "lt_asked",
                 "lt_rx_at")

    def __init__(self, origin: int, inc: int = 0) -> None:
        self.origin = origin
        self.inc = inc  #: 0 until the first frame of the origin names its incarnation
        #: when a newer incarnation of the origin replaced this stream (None: current)
        self.retired_at: float | None = None
        #: this stream replaced an earlier incarnation: it begins at 1 and all of it is
        #: wanted (a restart is not a long-term reconnect of the same stream)
        self.successor = False
        self.contiguous = 0  #: every seq <= this was received or skipped
        self.pending: dict[int, Msg] = {}  #: received beyond a gap
        self.known_high = 0  #: highest seq known to exist
        self.bound = 0  #: the origin's future messages have lamport >= bound
        self.hb_high = 0  #: from its last heartbeat: its highest seq ...
        self.hb_clock = 0  #: ... and its clock then (usable once contiguous >= hb_high)
        self.delivered: set[int] = set()  #: delivered seqs above `settled`
        self.settled = 0  #: every seq <= this was delivered or skipped
        self.skipped: list[list[int]] = []  #: [lo, hi] ranges never to be delivered (gaps)
        self.store: dict[int, Msg] = {}  #: messages kept to answer repairs
        self.store_order: deque[int] = deque()
        self.nack_due: float | None = None
        self.nack_tries = 0
        self.asked_high = 0  #: highest seq a repair request already named
        self.asked_at = float("-inf")  #: when every missing seq was last requested
        self.progress_at = float("-inf")  #: when `contiguous` last advanced
        self.rx_at = float("-inf")  #: when a message of the stream last arrived (any seq)
        #: [lo, hi] ranges skipped at a restart and fetched in the background (history)
        self.history: list[list[int]] = []
        self.lt_wanted: list[list[int]] = []  #: skipped ranges still to fetch (long-term)
        #: low-priority requests sent and not answered yet (retried, see history.py)
        self.lt_asked: list[LowAsk] = []
        self.lt_rx_at = float("-inf")  #: when a low-priority answer last filled a gap here
        self.synced = False  #: the stream's position is established (first contact done)

    def awaiting_history(self, seq: int) -> bool:
        """*seq* is history still being fetched (skipped for now, not given up)."""
        return (any(lo <= seq <= hi for lo, hi in self.history)
                and any(lo <= seq <= hi for lo, hi in self.skipped))

    def still_skipped(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The parts of [*lo*, *hi*] that are still gaps here (not received since)."""
        out = [(max(lo, a), min(hi, b)) for a, b in self.skipped if a <= hi and b >= lo]
        return sorted(out)

    def stop_low_fetch(self, below: int | None = None) -> None:
        """Stop fetching (in the background) what lies below *below* (None: all of it):
        it cannot be had. It is no longer history being fetched either, so late messages
        do not wait for it."""
        cut = below if below is not None else 1 << 62
        for ranges in (self.lt_wanted, self.history):
            for r in ranges:
                if r[0] < cut:
                    r[0] = min(cut, r[1] + 1)
        self.lt_wanted = [r for r in self.lt_wanted if r[0] <= r[1]]
        self.history = [r for r in self.history if r[0] <= r[1]]
        self.lt_asked = [a for a in self.lt_asked if a.hi >= cut]
        for a in self.lt_asked:
            a.lo = max(a.lo, cut)


class LowAsk:
    """One low-priority request (history, long-term reconciliation) awaiting its answer:
    the numbers [lo, hi] of a stream, when it was (last) sent and how often."""

    __slots__ = ("lo", "hi", "asked_at", "tries")

    def __init__(self, lo: int, hi: int, asked_at: float) -> None:
        self.lo = lo
        self.hi = hi
        self.asked_at = asked_at
        self.tries = 0


class PeerRecord:
    __slots__ = ("idx", "name", "state", "reconciling", "last_heard", "since", "acks", "view",
                 "g", "inc", "frontier", "held_from", "ack_incs")

    def __init__(self, idx: int, name: str) -> None:
        self.idx = idx
        self.name = name
        self.state = PeerState.UNKNOWN
        self.reconciling = False
        self.last_heard = float("-inf")
        self.since = 0.0  #: when the current state began
        self.acks: tuple[int, ...] = ()
        self.view = 0
        self.g = 0
        self.inc = 0
        self.frontier: tuple[int, int] = (0, 0)
        self.held_from: tuple[int, ...] = ()
        self.ack_incs: tuple[int, ...] = ()  #: per origin: the stream acks/held_from are about


class TokenBucket:
    """Token bucket: ``take()`` succeeds at most ``rate`` times a second (burst ``burst``)."""

    __slots__ = ("rate", "burst", "tokens", "t")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.t = now

    def refill(self, now: float) -> None:
        if now > self.t:
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now

    def take(self, now: float, amount: float = 1.0) -> bool:
        """Take *amount* tokens (one message, or its bytes) if the bucket holds them; an
        amount beyond the burst is taken from a full bucket (it goes, alone)."""
        self.refill(now)
        need = min(amount, self.burst)
        if self.tokens >= need:
            self.tokens -= need
            return True
        return False


def seq_ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in sorted(seqs):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out

