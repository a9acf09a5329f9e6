"""Fetching in the background: the history a restarted site did not show, and (with
``long_term_reconcile``) what a long-term disconnect skipped. Low-priority requests
(NACK with ``F_LOW``), a few numbers each, at ``long_term_rate`` requests a second, the
streams in turn (so every stream's history advances together and causes fetched from one
stream are not stuck behind all of another's). Sans-I/O: imports only the standard
library, flowrouter.wire and the other IGO modules.

**Retried on their own timer.** The answerer serves low-priority requests only when no
ordinary repair waits, at ``long_term_rate`` messages a second, so an answer may be slow;
it may also be lost (a flapping or saturated link), and nothing newer would ever ask for
those numbers again: they stayed gaps for good. So each request is remembered
(:class:`~flowchat.igo.records.LowAsk`) until every number it named has arrived, and one
that got no answer for ``retry_after`` (the time the answerer needs for a full window of
requests, plus ``nack_retry``, growing with each try) is asked again, for the numbers
still missing only, of the next holder. Retries share the requests' pace (one token
bucket), come before new requests of their stream, and at most ``WINDOW`` requests per
stream are out at once, so a slow answerer is not buried under requests (the answerer
also drops a request it has queued already). After ``MAX_TRIES`` the numbers are given up
(``history.given-up``): they stay gaps, and late messages no longer wait for them.

**Our own tail.** A site keeps no message of its earlier runs, but the messages it had sent
and not shown itself when it stopped (still waiting for the ordering) reached the others.
With the last run's sent mark (:meth:`~flowchat.igo.site.SiteOrdering.sent_mark`, kept
beside the display marks) the next run fetches them like history (:meth:`HistoryFetch.
own_tail`) and shows them once, flagged late."""

from __future__ import annotations

from flowrouter.wire.bands import BAND_REPAIR

from .actions import Send
from .core import SiteCore
from .parts import RepairRequests, StreamTransport
from .records import LowAsk, Stream, TokenBucket
from .wire import F_LOW, MAX_RANGES, Nack, encode_nack

#: numbers per low-priority request
CHUNK = 5
#: low-priority requests per stream out at once (sent, not fully answered)
WINDOW = 2
#: tries of one request before its numbers are given up
MAX_TRIES = 5


class HistoryFetch:
    """Low-priority fetches and their retries; a part of SiteOrdering, holding the shared
    SiteCore."""

    _repair: RepairRequests
    _transport: StreamTransport

    def __init__(self, core: SiteCore, now: float) -> None:
        self.core = core
        self._bucket = TokenBucket(core.cfg.long_term_rate, 1.0, now)
        self._turn = 0  #: the stream whose low-priority fetch goes next (round robin)

    def connect(self, *, repairs: RepairRequests, transport: StreamTransport) -> None:
        """The other parts this one asks (set once, by the coordinator)."""
        self._repair = repairs
        self._transport = transport

    def own_tail(self, inc: int, sent: int, now: float) -> None:
        """This site's previous run (incarnation *inc*) had sent up to *sent* when it
        stopped, and shown its own messages up to its display mark: the rest reached the
        others but was never shown here. Fetched from them in the background, like the
        peers' history, and shown once, flagged late. (Not in leader mode: there the
        leader's order decides, and a restarted site resumes it at its current number.)"""
        core = self.core
        mark = core.shown_before.get((core.me, inc), 0)
        if core.mode == "leader" or not 0 < inc < core.inc or sent <= mark:
            return
        st = Stream(core.me, inc)
        st.synced = True
        core.retired.setdefault(core.me, []).append(st)
        self._transport.skip(core.me, st, mark, now, reason="history")
        st.lt_wanted.append([mark + 1, sent])
        st.history.append([mark + 1, sent])
        core.counters["history.own-tail"] += sent - mark
        self._transport.skip(core.me, st, sent, now, reason="history")

    def retry_after(self, tries: int) -> float:
        """How long a request waits for its answer before it is asked again."""
        cfg = self.core.cfg
        return (cfg.nack_retry + WINDOW * CHUNK / cfg.long_term_rate) * (1 + min(tries, 3))

    def fetch(self, now: float) -> None:
        """One round: per stream in turn, a due retry, else a new request (window
        permitting), as long as the pace allows."""
        streams = self.core.all_streams()
        own = self.core.streams[self.core.me]
        turn = self._turn % len(streams)
        for k, st in enumerate(streams[turn:] + streams[:turn]):
            if st is own or not (st.lt_wanted or st.lt_asked):
                continue
            self._settle_asks(st)
            ask = next((a for a in st.lt_asked
                        if now - max(a.asked_at, st.lt_rx_at) >= self.retry_after(a.tries)),
                       None)
            if ask is not None and ask.tries + 1 >= MAX_TRIES:
                self._give_up(st, ask)
                continue
            if ask is None and (len(st.lt_asked) >= WINDOW or not st.lt_wanted):
                continue
            first = ask.lo if ask is not None else st.lt_wanted[0][0]
            tries = ask.tries + 1 if ask is not None else 0
            target = self._repair.choose_target(st, first, now, tries)
            if target is None or not self._bucket.take(now):
                continue
            if ask is not None:
                ranges = st.still_skipped(ask.lo, ask.hi)[:MAX_RANGES]
                ask.tries = tries
                ask.asked_at = now
                self.core.counters["history.retry"] += 1
            else:
                r = st.lt_wanted[0]
                hi = min(r[1], r[0] + CHUNK - 1)
                ranges = [(r[0], hi)]
                st.lt_asked.append(LowAsk(r[0], hi, now))
                r[0] = hi + 1
                if r[0] > r[1]:
                    st.lt_wanted.pop(0)
            self.core.emit(Send(BAND_REPAIR, encode_nack(
                self.core.tag, self.core.me,
                Nack(target, st.origin, F_LOW, tuple(ranges), st.inc)), "nack-low"))
            self.core.counters["sent.nack-low"] += 1
            self._turn = turn + k + 1

    @staticmethod
    def _settle_asks(st: Stream) -> None:
        """Requests whose every number has arrived (or was given up) are done."""
        st.lt_asked = [a for a in st.lt_asked if st.still_skipped(a.lo, a.hi)]

    def _give_up(self, st: Stream, ask: LowAsk) -> None:
        missing = st.still_skipped(ask.lo, ask.hi)
        self.core.counters["history.given-up"] += sum(hi - lo + 1 for lo, hi in missing)
        st.lt_asked.remove(ask)
        # no longer history being fetched: late messages do not wait for it
        trimmed: list[list[int]] = []
        for lo, hi in st.history:
            if lo <= ask.hi and hi >= ask.lo:  # split around the given-up numbers
                if lo < ask.lo:
                    trimmed.append([lo, ask.lo - 1])
                if hi > ask.hi:
                    trimmed.append([ask.hi + 1, hi])
            else:
                trimmed.append([lo, hi])
        st.history = trimmed
