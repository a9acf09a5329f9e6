"""Flow control between a router's inputs and outputs, as one sans-I/O object: which input
stops reading and when, which output holds credit, which is a slow consumer.

:class:`FlowControl` takes events from the runtime's links and outputs (frames queued on an
output, frames written from its queue or dropped, its transport pushed back or resumed, a
link closed, the time passing) with the clock passed in, and answers with decisions
(:mod:`flowrouter.core.flowstates`: stop or start reading an input, log a slow consumer,
evict one). It arms no timers: :meth:`FlowControl.next_deadline` says when it next wants
:meth:`FlowControl.tick`. The rules, tuned against the live tests and benchmarks:

* **Holding.** When an output's transport pushes back while it writes an input's latest
  read, and every other output that got frames of that read has pushed back too (a chain, a
  lone receiver, receivers all behind together), the input stops reading at once
  (``credit.held``): its frames wait in the kernel, not copied into queues, and TCP pushes
  back on the sender. Which outputs took an input's frames is decided per read (the read
  number each output last got that input's frames in), never by time or by the last
  writer: a sibling that took the input's frames once, long ago, is no evidence that they
  flow now. The input reads again as soon as one holder takes frames again or closes, or
  after ``slow_consumer_stall`` seconds (``credit.hold-stalled``: its holders are stuck).
* **Credit.** Frames that wait in output queues hold their input's credit; past
  ``link_credit`` bytes the input stops reading (``credit.paused``) until they fall to half.
  Only outputs that drain hold credit: an output whose transport pushed back (idle for
  ``slow_consumer_idle`` seconds, default 0.02) while a sibling took the same input's frames
  *after* that push back gives its credit back (``credit.not-draining``) and takes none
  until it moves again. The fastest output of an input sets its pace; a lone receiver, or
  receivers all behind together, push back and lose nothing. An output that sends nothing
  for ``slow_consumer_stall`` seconds while frames wait gives its credit back too.
* **Slow consumers.** An output's queue is bounded; what it drops is counted
  (``drop.slow-consumer`` or ``drop.link-congested``) and said once (:class:`SlowConsumer`);
  a stuck output over its bound sheds new data at once; one that stays over the bound for
  ``slow_consumer_grace`` seconds is evicted (:class:`Evict`, its reason for the fault
  notice).

Per input, the states are :mod:`flowrouter.core.flowstates`' transition table. Per output,
:class:`OutputFlow` holds what the rules need; its ``fed`` and ``fed_read`` are the one
thing the output writes itself, on its hot path, with stores rather than calls (the
forwarding fast path adds no Python call per frame for flow control).

May import only :mod:`flowrouter.core.flowstates` and :mod:`flowrouter.core.linkqueue`.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from flowrouter.core.flowstates import (
    HOLDING,
    NOT_READING,
    OVER_CREDIT,
    Decision,
    Evict,
    InputEvent,
    InputState,
    ReadAgain,
    SlowConsumer,
    StopReading,
    next_state,
)
from flowrouter.core.linkqueue import SlowConsumerPolicy

_NONE: list[Decision] = []  # returned, never changed, when an event decides nothing


@dataclass(frozen=True)
class FlowLimits:
    """The configuration keys flow control reads (``[router]`` in a node's config)."""

    link_credit: int = 1024 * 1024
    max_link_buffer: int = 16 * 1024 * 1024
    slow_consumer_bytes: int = 8 * 1024 * 1024
    slow_consumer_grace: float = 10.0
    slow_consumer_stall: float = 0.5
    slow_consumer_idle: float = 0.02

    @property
    def queue_bound(self) -> int:
        """Bytes an output queue may hold before it drops frames."""
        return min(self.max_link_buffer, self.slow_consumer_bytes)

    @property
    def drop_kind(self) -> str:
        """What its drops are counted as (``drop.<kind>``, and the alert's kind)."""
        return ("slow-consumer" if self.slow_consumer_bytes < self.max_link_buffer
                else "link-congested")


class OutputFlow:
    """One output (the sending side of a link) as flow control sees it.

    The output writes ``fed`` (the input whose frames it last wrote) and ``fed_read`` (input
    -> the last read that input gave it frames in) itself as it writes; the rest changes
    only through :class:`FlowControl`'s events."""

    __slots__ = ("link", "fed", "fed_read", "paused", "paused_read", "stuck", "waiting",
                 "backlogged", "recheck_fed", "slow")

    def __init__(self, link: int, limits: FlowLimits) -> None:
        self.link = link
        self.fed = 0
        self.fed_read: dict[int, int] = {}
        #: its transport pushed back, and in which read
        self.paused = False
        self.paused_read = 0
        #: holds no credit (not draining, or nothing sent for the stall time)
        self.stuck = False
        #: input -> bytes of its frames waiting in this output's queue (the credit this
        #: output holds on it, unless stuck)
        self.waiting: dict[int, int] = {}
        #: it has a queue (frames wait, or a shaper is on): the stall and grace clocks run
        self.backlogged = False
        #: resumed with a queue: once it has drained, look at the input it is fed by
        self.recheck_fed = False
        self.slow = SlowConsumerPolicy(limits.slow_consumer_bytes, limits.slow_consumer_grace,
                                       limits.slow_consumer_stall)

    def feeds(self, origin: int, since: int) -> bool:
        """Whether this output took frames of input *origin* in read *since* or later."""
        return self.fed_read.get(origin, -1) >= since

    def credit(self, origin: int) -> int:
        """Credit this output holds on input *origin*."""
        return 0 if self.stuck else self.waiting.get(origin, 0)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"paused": self.paused, "stuck": self.stuck}
        out.update(self.slow.stats())
        return out


class InputFlow:
    """One input (the receiving side of a link) as flow control sees it."""

    __slots__ = ("link", "pausable", "state", "pending", "holders", "held_since", "recheck_at")

    def __init__(self, link: int, pausable: bool) -> None:
        self.link = link
        #: a TCP link can stop reading; a UDP peer shares the socket with all others
        self.pausable = pausable
        self.state = InputState.READING
        #: bytes of its frames waiting in output queues that hold credit
        self.pending = 0
        #: while held: the outputs whose moving releases it, and since when
        self.holders: set[int] = set()
        self.held_since = 0.0
        #: while over credit: when to look again for outputs not draining
        self.recheck_at: float | None = None


class FlowControl:
    """The flow control of one router: events in, decisions out (module docstring)."""

    def __init__(self, limits: FlowLimits, counters: MutableMapping[str, int]) -> None:
        self.limits = limits
        #: the router's counters (credit.*, drop.*), shared with the core's
        self.counters = counters
        self.inputs: dict[int, InputFlow] = {}
        self.outputs: dict[int, OutputFlow] = {}
        #: outputs with a queue, in the order they got one
        self.backlogged: dict[int, OutputFlow] = {}

    # links ------------------------------------------------------------------------------------
    def open(self, link: int, *, pausable: bool) -> OutputFlow:
        """A new link, input and output; returns the output's record (its hot path writes
        ``fed`` and ``fed_read`` there)."""
        self.inputs[link] = InputFlow(link, pausable)
        rec = self.outputs[link] = OutputFlow(link, self.limits)
        return rec

    def closed(self, link: int) -> list[Decision]:
        """*link* is gone (or its output closed, its queue emptied): as an output it holds
        nothing and no credit; as an input it is held by nobody and feeds nothing. Safe to
        repeat."""
        out: list[Decision] = []
        inp = self.inputs.pop(link, None)
        if inp is not None:  # first: nothing below may decide about a link that is gone
            inp.state = next_state(inp.state, InputEvent.CLOSE)
            inp.holders.clear()
            inp.recheck_at = None
            for other in self.outputs.values():
                other.fed_read.pop(link, None)
        rec = self.outputs.pop(link, None)
        if rec is not None:
            self.backlogged.pop(link, None)
            waiting, rec.waiting = rec.waiting, {}
            if not rec.stuck:
                for origin, n in waiting.items():
                    self._credit_release(origin, n, out)
            self._release(link, out)
        return out

    # events from an output --------------------------------------------------------------------
    def queue_started(self, link: int, now: float) -> None:
        """Output *link* got a queue (its transport pushed back, or a shaper): the stall
        clock starts with the backlog."""
        rec = self.outputs.get(link)
        if rec is not None:
            rec.backlogged = True
            self.backlogged[link] = rec
            rec.slow.progress(0, now)

    def queued(self, link: int, origin: int, size: int, now: float) -> list[Decision]:
        """*size* bytes of input *origin*'s frames (0: the router's own) wait in output
        *link*'s queue: they hold the input's credit unless the output is stuck (one stuck
        receiver never makes its input wait)."""
        rec = self.outputs.get(link)
        if rec is None or not origin:
            return _NONE
        rec.waiting[origin] = rec.waiting.get(origin, 0) + size
        if rec.stuck:
            return _NONE
        out: list[Decision] = []
        self._credit_take(origin, size, now, out)
        return out

    def shed(self, link: int, count: int, size: int, queued: int, now: float
             ) -> list[Decision] | None:
        """A stuck output already over its bound drops new data frames at once (*count*
        frames, *size* bytes; *queued*: bytes its queue holds) instead of queueing and
        trimming them one by one: a stuck receiver must cost the router as little as
        possible. None if they are to be queued; otherwise they are counted as dropped
        and the list says what else to do."""
        rec = self.outputs.get(link)
        if (rec is None or not rec.stuck or rec.slow.over_since is None
                or queued + size <= self.limits.queue_bound):
            return None
        self.counters["drop." + self.limits.drop_kind] += count
        rec.slow.dropped += count
        out: list[Decision] = []
        if self._expired(rec, now):
            self._evict(rec, out)
        return out

    def dropped(self, link: int, drops: Iterable[tuple[Any, int, int]], now: float
                ) -> list[Decision]:
        """Output *link*'s queue dropped frames to stay bounded: (flow key, bytes, input)
        each. They are counted; they hold no credit any more; the first drop says the
        output is a slow consumer, and one over its bound for the grace time is evicted."""
        rec = self.outputs.get(link)
        if rec is None:
            return _NONE
        out: list[Decision] = []
        count = 0
        for _, n, origin in drops:
            count += 1
            if origin:
                self._unwait(rec, origin, n, out)
        self.counters["drop." + self.limits.drop_kind] += count
        if rec.slow.note_drops(count, now):
            out.append(SlowConsumer(link))
        if self._expired(rec, now):
            self._evict(rec, out)
        return out

    def written(self, link: int, gone: dict[int, int], queued: int, now: float, *,
                moved: bool, backlog: bool) -> list[Decision]:
        """Output *link* drained its queue: *gone* bytes per input left it (written, or
        taken out to be sent another way), *queued* bytes still wait; *moved*: it sent
        something or has nothing left; *backlog*: it keeps a queue. Credit goes back; an
        output moving again holds credit again (a receiver only briefly behind pushes back
        before it overflows); inputs waiting for credit look again for outputs that do
        not drain."""
        rec = self.outputs.get(link)
        if rec is None:
            return _NONE
        out: list[Decision] = []
        freed = [origin for origin in gone if self.over_credit(origin)]
        for origin, n in gone.items():
            if origin:
                self._unwait(rec, origin, n, out)
        if moved:
            rec.slow.progress(queued, now)
            if rec.stuck:
                rec.stuck = False
                for origin, n in list(rec.waiting.items()):
                    self._credit_take(origin, n, now, out)
        for origin in freed:
            self._unblock(origin, now, out)
        if not backlog and rec.backlogged:
            rec.backlogged = False
            self.backlogged.pop(link, None)
        if rec.recheck_fed:  # the drain after a resume: a sibling that drains, unless it
            rec.recheck_fed = False  # pushed back again meanwhile
            if not rec.paused and self.over_credit(rec.fed):
                self._unblock(rec.fed, now, out)
        return out

    def pushed_back(self, link: int, read: int, now: float) -> list[Decision]:
        """Output *link*'s transport pushed back (in the router's read number *read*): hold
        the input it was writing, if that was the input's latest read and nothing else
        takes the input's frames (every other output that got frames of that read has
        pushed back too). An input held already gains one more holder; one waiting for
        credit, or a push back while draining an older backlog, is left to credit."""
        rec = self.outputs.get(link)
        if rec is None:
            return _NONE
        rec.paused = True
        rec.paused_read = read
        origin = rec.fed
        if not origin or rec.stuck:
            return _NONE
        inp = self.inputs.get(origin)
        if inp is None or not inp.pausable:
            return _NONE
        if inp.state in HOLDING:
            inp.holders.add(link)
            return _NONE
        if inp.state is not InputState.READING or rec.fed_read.get(origin) != read:
            return _NONE
        holders = {link}
        for sib in self.outputs.values():
            if sib is rec or sib.link == origin or not sib.feeds(origin, read):
                continue
            if not sib.paused:
                return _NONE  # a sibling still takes this input's frames: credit decides
            if not sib.stuck:
                holders.add(sib.link)  # pushed back too: either moving releases the input
        out: list[Decision] = []
        self.counters["credit.held"] += 1
        inp.holders, inp.held_since = holders, now
        self._fire(inp, InputEvent.HOLD, out)
        return out

    def resumed(self, link: int, now: float) -> list[Decision]:
        """Output *link*'s transport takes frames again: every input it holds reads again
        (unless over its credit). If it has a queue, the runtime drains it next and reports
        :meth:`written`; then (or now, without a queue) the input it was fed by, if waiting
        for credit, looks again for outputs that do not drain (this one is a sibling that
        drains)."""
        rec = self.outputs.get(link)
        if rec is None:
            return _NONE
        out: list[Decision] = []
        rec.paused = False
        if not rec.backlogged:
            rec.stuck = False  # it moves again, and nothing of it waits to retake credit
        self._release(link, out)
        if rec.backlogged:
            rec.recheck_fed = True
        elif self.over_credit(rec.fed):
            self._unblock(rec.fed, now, out)
        return out

    # time -------------------------------------------------------------------------------------
    def tick(self, now: float) -> list[Decision]:
        """Do what is due at *now*: holds that lasted the stall time end (their holders are
        stuck), outputs silent for the stall time give their credit back, outputs over
        their bound for the grace time are evicted, inputs waiting for credit look again
        for outputs that do not drain."""
        out: list[Decision] = []
        stall = self.limits.slow_consumer_stall
        for inp in list(self.inputs.values()):
            if inp.state in HOLDING and now >= inp.held_since + stall:
                self.counters["credit.hold-stalled"] += 1
                for link in sorted(inp.holders):
                    rec = self.outputs.get(link)
                    if rec is not None:
                        self._become_stuck(rec, out)
                self._end_hold(inp, out)
        for rec in list(self.backlogged.values()):
            if self._expired(rec, now):
                self._evict(rec, out)
            elif not rec.stuck and now >= rec.slow.last_progress + stall:
                self._become_stuck(rec, out)
        for inp in list(self.inputs.values()):
            if inp.recheck_at is not None and inp.recheck_at <= now:
                inp.recheck_at = None
                if inp.state in OVER_CREDIT:
                    self._unblock(inp.link, now, out)
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do (None: nothing is pending)."""
        stall, grace = self.limits.slow_consumer_stall, self.limits.slow_consumer_grace
        best: float | None = None
        for inp in self.inputs.values():
            if inp.state in HOLDING:
                t = inp.held_since + stall
                best = t if best is None or t < best else best
            if inp.recheck_at is not None:
                t = inp.recheck_at
                best = t if best is None or t < best else best
        for rec in self.backlogged.values():
            if rec.slow.over_since is not None:
                t = rec.slow.over_since + grace
                best = t if best is None or t < best else best
            if not rec.stuck:
                t = rec.slow.last_progress + stall
                best = t if best is None or t < best else best
        return best

    # views ------------------------------------------------------------------------------------
    def state(self, link: int) -> InputState:
        """Input *link*'s state (CLOSED if unknown)."""
        inp = self.inputs.get(link)
        return inp.state if inp is not None else InputState.CLOSED

    def reading(self, link: int) -> bool:
        """Whether input *link* is to be read."""
        inp = self.inputs.get(link)
        return inp is not None and inp.state not in NOT_READING

    def over_credit(self, origin: int) -> bool:
        """Whether input *origin* waits for credit (over it, held or not)."""
        inp = self.inputs.get(origin)
        return inp is not None and inp.state in OVER_CREDIT

    def holders(self, link: int) -> frozenset[int]:
        """The outputs holding input *link* (empty: not held)."""
        inp = self.inputs.get(link)
        return frozenset(inp.holders) if inp is not None and inp.state in HOLDING \
            else frozenset()

    def held_since(self, link: int) -> float | None:
        inp = self.inputs.get(link)
        return inp.held_since if inp is not None and inp.state in HOLDING else None

    def pending(self, link: int) -> int:
        """Bytes of input *link*'s frames waiting in output queues that hold its credit."""
        inp = self.inputs.get(link)
        return inp.pending if inp is not None else 0

    def output(self, link: int) -> OutputFlow | None:
        return self.outputs.get(link)

    def held_inputs(self) -> list[int]:
        return [inp.link for inp in self.inputs.values() if inp.state in HOLDING]

    # the rules --------------------------------------------------------------------------------
    def _fire(self, inp: InputFlow, event: InputEvent, out: list[Decision]) -> None:
        """Move *inp* by the transition table; a change in whether it reads is a decision."""
        was = inp.state not in NOT_READING
        inp.state = next_state(inp.state, event)
        now_reads = inp.state not in NOT_READING
        if was and not now_reads:
            out.append(StopReading(inp.link, "held" if event is InputEvent.HOLD else "credit"))
        elif now_reads and not was:
            out.append(ReadAgain(inp.link))

    def _expired(self, rec: OutputFlow, now: float) -> bool:
        """Over its bound for the grace time (deadlines are compared as next_deadline
        computes them, so that a tick at a deadline always finds it due)."""
        since = rec.slow.over_since
        return since is not None and now >= since + self.limits.slow_consumer_grace

    def _end_hold(self, inp: InputFlow, out: list[Decision]) -> None:
        inp.holders = set()
        self._fire(inp, InputEvent.RELEASE, out)

    def _release(self, link: int, out: list[Decision]) -> None:
        """Output *link* moved or is gone: every input it holds is released."""
        for inp in list(self.inputs.values()):
            if inp.state in HOLDING and link in inp.holders:
                self._end_hold(inp, out)

    def _unwait(self, rec: OutputFlow, origin: int, n: int, out: list[Decision]) -> None:
        left = rec.waiting.get(origin, 0) - n
        if left > 0:
            rec.waiting[origin] = left
        else:
            rec.waiting.pop(origin, None)
        if not rec.stuck:
            self._credit_release(origin, n, out)

    def _credit_take(self, origin: int, size: int, now: float, out: list[Decision]) -> None:
        inp = self.inputs.get(origin)
        if inp is None:
            return
        inp.pending += size
        credit = self.limits.link_credit
        if inp.pending <= credit or not inp.pausable:
            return
        if inp.state is InputState.READING:
            # First, outputs that do not drain give their credit back; only if the others
            # still hold it over half does the input stop reading.
            due = self._unblock(origin, now, out)
            if inp.state is not InputState.READING or inp.pending <= credit // 2:
                return
            self.counters["credit.paused"] += 1
            self._fire(inp, InputEvent.OVER_CREDIT, out)
            inp.recheck_at = due
        elif inp.state is InputState.HELD:
            self._fire(inp, InputEvent.OVER_CREDIT, out)

    def _credit_release(self, origin: int, size: int, out: list[Decision]) -> None:
        inp = self.inputs.get(origin)
        if inp is None:
            return
        inp.pending = max(inp.pending - size, 0)
        if inp.pending <= self.limits.link_credit // 2 and inp.state in OVER_CREDIT:
            inp.recheck_at = None
            self._fire(inp, InputEvent.CREDIT_BACK, out)

    def _become_stuck(self, rec: OutputFlow, out: list[Decision]) -> None:
        """*rec* holds no credit any more: give back what its waiting frames hold."""
        if rec.stuck:
            return
        rec.stuck = True
        for origin, n in list(rec.waiting.items()):
            self._credit_release(origin, n, out)

    def _unblock(self, origin: int, now: float, out: list[Decision]) -> float | None:
        """Outputs that do not drain hold no credit on input *origin* (slow consumers hurt
        only themselves).

        An output is *not draining* when its transport has pushed back and it has sent
        nothing for ``slow_consumer_idle`` seconds, while a sibling took the input's frames
        since it pushed back and still drains. If such outputs keep the input waiting (the
        others hold under an eighth of its credit), they give their credit back. If one is
        not idle long enough yet, returns when it will be (and, for an input waiting for
        credit already, looks again then)."""
        idle_for = self.limits.slow_consumer_idle
        stalled: list[OutputFlow] = []
        due: float | None = None
        for rec in self.backlogged.values():
            if not rec.paused or rec.stuck or not rec.waiting.get(origin):
                continue
            at = rec.slow.last_progress + idle_for
            if now >= at:
                stalled.append(rec)
            elif due is None or at < due:
                due = at
        inp = self.inputs.get(origin)
        if stalled and inp is not None:
            held = sum(rec.waiting[origin] for rec in stalled)
            since = min(rec.paused_read for rec in stalled)
            if inp.pending - held <= self.limits.link_credit // 8 and any(
                    sib not in stalled and sib.feeds(origin, since)
                    and (not sib.paused or now < sib.slow.last_progress + idle_for)
                    for sib in self.outputs.values()):
                for rec in stalled:
                    self.counters["credit.not-draining"] += 1
                    self._become_stuck(rec, out)
                return None
        if (due is not None and inp is not None and inp.state in OVER_CREDIT
                and inp.recheck_at is None):
            inp.recheck_at = due
        return due

    def _evict(self, rec: OutputFlow, out: list[Decision]) -> None:
        """Over its bound for the grace time: the runtime closes it (and reports
        :meth:`closed`); meanwhile its clocks stop."""
        self.backlogged.pop(rec.link, None)
        rec.backlogged = False
        lim = self.limits
        out.append(Evict(rec.link, f"over {lim.queue_bound} bytes queued for "
                                   f"{lim.slow_consumer_grace:g}s"))
