"""Flow control as one sans-I/O object (flowrouter.core.flowcontrol), on a virtual clock
with no sockets: one test per rule, then random event sequences against its invariants.

Link ids are small numbers; each link is an input and an output. Where a test says "read
*r* of input *i* gave output *o* frames", it writes what the output's hot path writes
(``fed``, ``fed_read``) on the output's record, as the runtime does.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from flowrouter.core.flowcontrol import FlowControl, FlowLimits
from flowrouter.core.flowstates import (
    TRANSITIONS,
    Decision,
    Evict,
    FlowControlError,
    InputEvent,
    InputState,
    ReadAgain,
    SlowConsumer,
    StopReading,
    next_state,
)


def _fc(*links: int, **limits: Any) -> FlowControl:
    """Flow control over *links*; outputs not draining give their credit back at once
    unless a test gives ``slow_consumer_idle`` (the default waits 20 ms)."""
    limits.setdefault("slow_consumer_idle", 0.0)
    fc = FlowControl(FlowLimits(**limits), Counter())
    for link in links:
        fc.open(link, pausable=True)
    return fc


def _direct(fc: FlowControl, origin: int, read: int, *outs: int) -> None:
    """Read *read* of input *origin* gave each of *outs* frames, written straight through."""
    for link in outs:
        rec = fc.output(link)
        assert rec is not None
        rec.fed, rec.fed_read[origin] = origin, read


def _queue(fc: FlowControl, out: int, origin: int, read: int, size: int, now: float
           ) -> list[Decision]:
    """Read *read* of input *origin* gave output *out* frames that wait in its queue."""
    rec = fc.output(out)
    assert rec is not None
    rec.fed_read[origin] = read
    if not rec.backlogged:
        fc.queue_started(out, now)
    return fc.queued(out, origin, size, now)


# ---------------------------------------------------------------- the transition table
def test_every_transition_is_in_the_table_and_others_raise() -> None:
    assert next_state(InputState.READING, InputEvent.HOLD) is InputState.HELD
    assert next_state(InputState.HELD_OVER_CREDIT, InputEvent.RELEASE) is InputState.PAUSED
    with pytest.raises(FlowControlError, match="paused cannot take 'hold'"):
        next_state(InputState.PAUSED, InputEvent.HOLD)
    for event in InputEvent:  # a closed input takes nothing
        assert (InputState.CLOSED, event) not in TRANSITIONS
    for state in InputState:
        if state is not InputState.CLOSED:
            assert next_state(state, InputEvent.CLOSE) is InputState.CLOSED


# ---------------------------------------------------------------- holding
def test_a_lone_receiver_pushes_back_and_loses_nothing() -> None:
    fc = _fc(1, 2, link_credit=4096)
    _direct(fc, 1, 1, 2)
    assert fc.pushed_back(2, 1, 0.0) == [StopReading(1, "held")]  # frames wait in the kernel
    assert fc.holders(1) == {2} and fc.counters["credit.held"] == 1
    assert fc.resumed(2, 0.2) == [ReadAgain(1)]
    # Frames that do wait in its queue (pushed back in another input's read) are held by
    # credit: over it, the input stops reading; nobody else takes them, so nothing is
    # dropped and the output is not taken for a slow consumer.
    _direct(fc, 1, 2, 2)
    fc.pushed_back(2, 3, 0.3)
    assert _queue(fc, 2, 1, 4, 3000, 0.3) == []
    assert _queue(fc, 2, 1, 4, 3000, 0.3) == [StopReading(1, "credit")]
    assert fc.state(1) is InputState.PAUSED and fc.pending(1) == 6000
    assert fc.resumed(2, 0.35) == []
    assert fc.written(2, {1: 6000}, 0, 0.4, moved=True, backlog=False) == [ReadAgain(1)]
    assert not any(k.startswith("drop.") for k in fc.counters)
    assert fc.counters["credit.not-draining"] == 0 and fc.next_deadline() is None


def test_a_held_input_reads_again_when_one_holder_moves() -> None:
    fc = _fc(1, 2, 3)
    _direct(fc, 1, 1, 2, 3)
    assert fc.pushed_back(2, 1, 0.0) == []  # 3 still takes the input's frames
    assert fc.pushed_back(3, 1, 0.0) == [StopReading(1, "held")]
    assert fc.holders(1) == {2, 3}
    assert fc.resumed(3, 0.1) == [ReadAgain(1)]  # the fastest output sets the pace
    assert fc.holders(1) == frozenset()


def test_a_hold_ends_after_the_stall_and_its_holders_are_stuck() -> None:
    fc = _fc(1, 2, slow_consumer_stall=0.5)
    _direct(fc, 1, 1, 2)
    fc.pushed_back(2, 1, 1.0)
    assert fc.next_deadline() == 1.5
    assert fc.tick(1.4) == [] and not fc.reading(1)
    assert fc.tick(1.5) == [ReadAgain(1)]
    assert fc.counters["credit.hold-stalled"] == 1 and fc.output(2).stuck  # type: ignore[union-attr]
    assert fc.next_deadline() is None
    _direct(fc, 1, 2, 2)
    assert fc.pushed_back(2, 2, 1.6) == []  # a stuck output holds nothing
    fc.resumed(2, 1.7)  # it moved: it may hold its input again
    assert not fc.output(2).stuck  # type: ignore[union-attr]
    _direct(fc, 1, 3, 2)
    assert fc.pushed_back(2, 3, 1.8) == [StopReading(1, "held")]


def test_replies_to_the_sender_and_outputs_fed_by_others_do_not_count() -> None:
    fc = _fc(1, 2, 3)
    _direct(fc, 1, 5, 1)  # the router answered the sender on its own link
    _direct(fc, 9, 5, 3)  # fed by another input
    fc.output(3).paused = False  # type: ignore[union-attr]
    _direct(fc, 1, 5, 2)
    assert fc.pushed_back(2, 5, 0.0) == [StopReading(1, "held")]


def test_a_push_back_while_draining_an_older_read_is_left_to_credit() -> None:
    fc = _fc(1, 2)
    _direct(fc, 1, 1, 2)
    assert fc.pushed_back(2, 2, 0.0) == []  # read 2 gave it nothing of input 1
    assert fc.reading(1)


# ---------------------------------------------------------------- two inputs, one receiver
def test_two_inputs_into_one_receiver_hold_only_the_one_it_cannot_take() -> None:
    """X takes inputs 1 and 2, Y only 1. X's push back holds input 2 (X is all it has), never
    input 1, which Y still takes, though X's last frame was 2's."""
    fc = _fc(1, 2, 3, 4)
    x, y = 3, 4
    _direct(fc, 1, 5, x, y)
    _direct(fc, 2, 6, x)
    assert fc.pushed_back(x, 6, 0.0) == [StopReading(2, "held")]
    assert fc.reading(1)
    _queue(fc, x, 1, 7, 1000, 0.01)  # input 1 reads on: X queues, Y writes
    _direct(fc, 1, 7, y)
    assert fc.reading(1) and fc.holders(2) == {x}
    assert fc.resumed(x, 0.02) == [ReadAgain(2)]
    assert fc.written(x, {1: 1000}, 0, 0.02, moved=True, backlog=False) == []


def test_a_sibling_that_took_the_inputs_frames_in_that_read_still_counts() -> None:
    fc = _fc(1, 2, 3, 4)
    x, y = 3, 4
    _direct(fc, 1, 8, x, y)
    _direct(fc, 2, 8, y)  # Y's last frame was input 2's
    assert fc.pushed_back(x, 8, 0.0) == [] and fc.reading(1)


# ---------------------------------------------------------------- credit and slow consumers
def test_a_stuck_receiver_is_isolated_and_its_siblings_never_paused() -> None:
    """Input 1 feeds a stuck receiver (2) and a healthy one (3): the stuck one gives its
    credit back at once, queues up to its bound, then drops (counted, said once), sheds
    new data once stuck and over, and is evicted after the grace time; input 1 never stops
    reading."""
    fc = _fc(1, 2, 3, link_credit=4096, slow_consumer_bytes=12_000,
             slow_consumer_grace=2.0)
    seen: list[Decision] = []
    _direct(fc, 1, 1, 2, 3)
    seen += fc.pushed_back(2, 1, 0.0)
    for read in range(2, 6):
        seen += _queue(fc, 2, 1, read, 3000, 0.01 * read)
        _direct(fc, 1, read, 3)
    assert fc.counters["credit.not-draining"] == 1 and fc.output(2).stuck  # type: ignore[union-attr]
    assert fc.pending(1) == 0  # the stuck receiver holds no credit
    seen += fc.dropped(2, [(b"k", 3000, 1)], 0.1)  # its queue went over the bound
    assert seen == [SlowConsumer(2)]
    assert fc.counters["drop.slow-consumer"] == 1
    assert fc.shed(2, 3, 9000, 12_000, 0.2) == []  # stuck and over: dropped at once
    assert fc.counters["drop.slow-consumer"] == 4
    assert fc.shed(2, 1, 10, 100, 0.2) is None  # room again: queued
    assert fc.next_deadline() == pytest.approx(2.1)
    assert fc.tick(2.0) == []
    assert fc.tick(2.1) == [Evict(2, "over 12000 bytes queued for 2s")]
    assert fc.closed(2) == [] and fc.reading(1) and fc.reading(3)


def test_by_default_a_receiver_a_moment_behind_keeps_its_credit() -> None:
    """Receivers that share a process or a core fall behind their siblings for a moment
    all the time; taken for slow consumers at once, they shed frames they would have read
    (3 routers x 100 receivers x 16 B lost 10-40%). By default an output must have sent
    nothing for 20 ms while a sibling drains before it gives its credit back."""
    assert FlowLimits().slow_consumer_idle == 0.02
    fc = FlowControl(FlowLimits(link_credit=4096), Counter())
    for link in (1, 2, 3):
        fc.open(link, pausable=True)
    _direct(fc, 1, 1, 2, 3)
    fc.pushed_back(2, 1, 1.0)
    _queue(fc, 2, 1, 2, 3000, 1.0)
    _direct(fc, 1, 2, 3)
    assert _queue(fc, 2, 1, 2, 3000, 1.01) == [StopReading(1, "credit")]
    assert fc.counters["credit.not-draining"] == 0 and not fc.output(2).stuck  # type: ignore[union-attr]
    # it moves within the 20 ms: nothing shed, the input reads again as it drains
    assert fc.resumed(2, 1.015) == []
    assert fc.written(2, {1: 6000}, 0, 1.015, moved=True, backlog=False) == [ReadAgain(1)]
    assert fc.counters["credit.not-draining"] == 0
    # one that stays silent past the 20 ms is a slow consumer, as before
    fc.pushed_back(2, 3, 2.0)
    _queue(fc, 2, 1, 3, 3000, 2.0)
    _direct(fc, 1, 3, 3)
    _queue(fc, 2, 1, 3, 3000, 2.0)
    assert not fc.reading(1) and fc.next_deadline() == pytest.approx(2.02)
    assert fc.tick(2.02) == [ReadAgain(1)] and fc.output(2).stuck  # type: ignore[union-attr]
    assert fc.counters["credit.not-draining"] == 1


def test_credit_is_freed_only_by_siblings_that_took_frames_after_the_push_back() -> None:
    """An output that once took the input's frames (another band, long ago) is no evidence
    that they flow: a lone receiver behind pushes back on its sender, and is not taken for
    a slow consumer."""
    fc = _fc(1, 2, 3, link_credit=4096)
    out, once = 2, 3
    _direct(fc, 1, 3, once)
    fc.pushed_back(out, 10, 0.0)
    _queue(fc, out, 1, 10, 3000, 0.0)
    assert _queue(fc, out, 1, 10, 3000, 0.0) == [StopReading(1, "credit")]
    assert fc.counters["credit.not-draining"] == 0
    _direct(fc, 1, 10, once)  # now a sibling does take its frames
    assert fc.resumed(once, 0.1) == [ReadAgain(1)]  # it drains: the slow one gives back
    assert fc.counters["credit.not-draining"] == 1 and fc.output(out).stuck  # type: ignore[union-attr]
    # moving again, it takes its frames' credit back
    assert fc.written(out, {1: 3000}, 3000, 0.2, moved=True, backlog=True) == []
    assert fc.pending(1) == 3000 and not fc.output(out).stuck  # type: ignore[union-attr]


def test_an_output_not_yet_idle_long_enough_is_looked_at_again_at_its_deadline() -> None:
    fc = _fc(1, 2, 3, link_credit=4096, slow_consumer_idle=0.2)
    _direct(fc, 1, 1, 3)
    fc.pushed_back(2, 1, 1.0)
    _queue(fc, 2, 1, 1, 3000, 1.0)
    assert _queue(fc, 2, 1, 1, 3000, 1.05) == [StopReading(1, "credit")]
    assert fc.next_deadline() == pytest.approx(1.2)  # not a timer: a deadline
    assert fc.tick(1.2) == [ReadAgain(1)]
    assert fc.counters["credit.not-draining"] == 1


def test_an_output_silent_for_the_stall_time_gives_its_credit_back() -> None:
    fc = _fc(1, 2, link_credit=4096, slow_consumer_stall=0.5)
    fc.pushed_back(2, 0, 0.0)
    _queue(fc, 2, 1, 1, 5000, 0.0)
    assert not fc.reading(1) and fc.next_deadline() == 0.5
    assert fc.tick(0.5) == [ReadAgain(1)] and fc.output(2).stuck  # type: ignore[union-attr]


def test_a_held_input_over_its_credit_waits_for_both() -> None:
    fc = _fc(1, 2, 3, link_credit=4096)
    _direct(fc, 1, 1, 2)
    fc.pushed_back(2, 1, 0.0)
    assert _queue(fc, 3, 1, 0, 10_000, 0.0) == []  # shaped: 3 waits, it did not push back
    assert fc.state(1) is InputState.HELD_OVER_CREDIT
    assert fc.resumed(2, 0.1) == [] and fc.state(1) is InputState.PAUSED
    assert fc.written(3, {1: 10_000}, 0, 0.2, moved=True, backlog=False) == [ReadAgain(1)]


def test_credit_does_not_resume_a_held_input() -> None:
    fc = _fc(1, 2, 3, link_credit=4096)
    _direct(fc, 1, 1, 2)
    fc.pushed_back(2, 1, 0.0)
    fc.pushed_back(3, 0, 0.0)
    _queue(fc, 3, 1, 0, 100, 0.0)
    assert fc.written(3, {1: 100}, 0, 0.1, moved=True, backlog=False) == []
    assert fc.holders(1) == {2}


def test_a_udp_input_is_never_paused() -> None:
    fc = _fc(2, link_credit=4096)
    fc.open(1, pausable=False)
    _direct(fc, 1, 1, 2)
    assert fc.pushed_back(2, 1, 0.0) == []
    assert _queue(fc, 2, 1, 1, 10_000, 0.0) == [] and fc.reading(1)


# ---------------------------------------------------------------- closing
def test_closing_a_link_releases_everything_it_held() -> None:
    fc = _fc(1, 2, 3, link_credit=4096)
    _direct(fc, 1, 1, 2)
    fc.pushed_back(2, 1, 0.0)  # holds input 1
    _queue(fc, 2, 3, 0, 5000, 0.0)  # and input 3's credit
    assert not fc.reading(1) and not fc.reading(3)
    assert sorted(fc.closed(2), key=lambda d: d.link) == [ReadAgain(1), ReadAgain(3)]
    assert fc.pending(3) == 0 and fc.closed(2) == []  # closing twice is harmless
    _direct(fc, 1, 2, 3)
    fc.pushed_back(3, 2, 0.1)
    assert fc.closed(1) == [] and fc.state(1) is InputState.CLOSED  # the held input is gone
    assert 1 not in fc.output(3).fed_read  # type: ignore[union-attr]
    assert fc.pushed_back(2, 3, 0.2) == [] and fc.queued(2, 1, 10, 0.2) == []  # gone


def test_a_closing_link_decides_nothing_about_itself() -> None:
    fc = _fc(1, link_credit=4096)
    fc.pushed_back(1, 0, 0.0)
    _queue(fc, 1, 1, 0, 5000, 0.0)  # replies to input 1 wait on its own output
    assert not fc.reading(1)
    assert fc.closed(1) == []


# ---------------------------------------------------------------- random event sequences
LIMITS = FlowLimits(link_credit=8000, max_link_buffer=1 << 30, slow_consumer_bytes=20_000,
                    slow_consumer_grace=2.0, slow_consumer_stall=0.5)


class FlowMachine(RuleBasedStateMachine):
    """A runtime that carries out every decision, with model queues; checks the invariants
    after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = FlowControl(LIMITS, Counter())
        self.now, self.read, self.next_id = 0.0, 0, 1
        self.open: dict[int, bool] = {}  # link -> pausable
        self.reading: dict[int, bool] = {}
        self.paused: set[int] = set()  # transports that pushed back
        self.queues: dict[int, list[tuple[int, int]]] = {}  # output -> [(origin, bytes)]
        self.drops = 0
        for _ in range(3):
            self.new_link(True)
        self.new_link(False)

    def apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, StopReading):
                assert self.open[d.link], "a UDP input cannot stop reading"
                assert self.reading[d.link]
                self.reading[d.link] = False
            elif isinstance(d, ReadAgain):
                assert not self.reading[d.link]
                self.reading[d.link] = True
            elif isinstance(d, Evict):
                self.close(d.link)

    def link(self, i: int) -> int | None:
        links = sorted(self.open)
        return links[i % len(links)] if links else None

    @rule(pausable=st.booleans())
    def new_link(self, pausable: bool) -> None:
        if len(self.open) < 6:
            link, self.next_id = self.next_id, self.next_id + 1
            self.fc.open(link, pausable=pausable)
            self.open[link], self.reading[link] = pausable, True

    @rule(i=st.integers(0, 9), outs=st.lists(st.integers(0, 9), max_size=4),
          size=st.integers(1, 6000))
    def read_some(self, i: int, outs: list[int], size: int) -> None:
        origin = self.link(i)
        if origin is None or not self.reading[origin]:
            return  # the runtime does not read it
        self.read += 1
        for j in outs:
            out = self.link(j)
            if out is None:
                return
            rec = self.fc.output(out)
            assert rec is not None
            rec.fed_read[origin] = self.read
            if out not in self.paused and out not in self.queues:
                rec.fed = origin  # written straight through
                continue
            q = self.queues.get(out)
            if q is None:
                q = self.queues[out] = []
                self.fc.queue_started(out, self.now)
            shed = self.fc.shed(out, 1, size, sum(n for _, n in q), self.now)
            if shed is not None:
                self.drops += 1
                self.apply(shed)
                continue
            q.append((origin, size))
            self.apply(self.fc.queued(out, origin, size, self.now))
            while out in self.queues and sum(n for _, n in q) > LIMITS.queue_bound:
                org, n = q.pop()
                self.drops += 1
                self.apply(self.fc.dropped(out, [(b"key", n, org)], self.now))

    @rule(i=st.integers(0, 9))
    def push_back(self, i: int) -> None:
        out = self.link(i)
        if out is not None and out not in self.paused:
            self.paused.add(out)
            self.apply(self.fc.pushed_back(out, self.read, self.now))

    @rule(i=st.integers(0, 9), k=st.integers(0, 8))
    def resume(self, i: int, k: int) -> None:
        """The transport takes frames again; the output writes up to *k* waiting frames
        before it pushes back again (all if it has fewer)."""
        out = self.link(i)
        if out is None or out not in self.paused:
            return
        self.paused.discard(out)
        self.apply(self.fc.resumed(out, self.now))
        q = self.queues.get(out)
        if q is None or out not in self.open:
            return
        rec = self.fc.output(out)
        assert rec is not None
        gone: dict[int, int] = {}
        for origin, n in q[:k]:
            gone[origin] = gone.get(origin, 0) + n
            rec.fed = origin
        del q[:k]
        if q:
            self.paused.add(out)
            self.apply(self.fc.pushed_back(out, self.read, self.now))
        else:
            del self.queues[out]
        self.apply(self.fc.written(out, gone, sum(n for _, n in q), self.now,
                                   moved=bool(gone) or not q, backlog=bool(q)))

    @rule(dt=st.floats(0.01, 1.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.apply(self.fc.tick(self.now))

    @rule()
    def until_the_deadline(self) -> None:
        due = self.fc.next_deadline()
        if due is not None:
            self.now = max(self.now, due)
            self.apply(self.fc.tick(self.now))
            after = self.fc.next_deadline()
            assert after is None or after > self.now, "a tick left something due"

    @rule(i=st.integers(0, 9))
    def close_link(self, i: int) -> None:
        link = self.link(i)
        if link is not None:
            self.close(link)

    def close(self, link: int) -> None:
        self.open.pop(link, None)
        self.reading.pop(link, None)
        self.paused.discard(link)
        self.queues.pop(link, None)
        self.apply(self.fc.closed(link))

    @invariant()
    def never_held_by_a_closed_output(self) -> None:
        for link in self.fc.held_inputs():
            holders = self.fc.holders(link)
            assert holders and holders <= set(self.open), (link, holders)

    @invariant()
    def credit_is_what_draining_outputs_hold_and_never_negative(self) -> None:
        for link in self.open:
            pending = self.fc.pending(link)
            assert pending >= 0
            assert pending == sum(rec.credit(link) for rec in self.fc.outputs.values())

    @invariant()
    def outputs_know_what_waits_in_their_queues(self) -> None:
        for out in self.open:
            q = self.queues.get(out, [])
            want: dict[int, int] = {}
            for origin, n in q:
                want[origin] = want.get(origin, 0) + n
            rec = self.fc.output(out)
            assert rec is not None and rec.waiting == want

    @invariant()
    def every_drop_is_counted(self) -> None:
        assert self.fc.counters["drop.slow-consumer"] == self.drops

    @invariant()
    def the_runtime_reads_what_flow_control_says(self) -> None:
        for link, pausable in self.open.items():
            assert self.reading[link] == self.fc.reading(link)
            assert pausable or self.fc.state(link) is InputState.READING


FlowMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60,
                                         deadline=None)
test_flow_control_keeps_its_invariants = FlowMachine.TestCase
