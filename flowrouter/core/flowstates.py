"""The states of a router's inputs under flow control, as one transition table, and the
decisions flow control hands the runtime.

An input link (a neighbour or an application sending to us) is in one of five states:

* ``READING`` — the runtime reads it;
* ``HELD`` — every output that took its latest read has pushed back: it stops reading at
  once, so its frames wait in the kernel and TCP pushes back on the sender;
* ``PAUSED`` — its frames waiting in output queues are over its credit;
* ``HELD_OVER_CREDIT`` — held, and over its credit meanwhile: when the hold ends, credit
  decides whether it reads;
* ``CLOSED`` — gone.

Events move it, and :data:`TRANSITIONS` says where to: a pair missing from the table is a
bug in the caller and raises :class:`FlowControlError` (as h11's connection states do).
Which event fires when is :class:`~flowrouter.core.flowcontrol.FlowControl`'s business; an
event that changes nothing (a second holder joining a hold, credit coming back to an input
that reads) is not an event.

The decisions are small frozen objects; the runtime carries them out (pause or resume a
transport's reading, log, close a link).

Imports only the standard library.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class InputState(enum.Enum):
    READING = "reading"
    HELD = "held"
    PAUSED = "paused"
    HELD_OVER_CREDIT = "held-over-credit"
    CLOSED = "closed"


class InputEvent(enum.Enum):
    #: the output writing its latest read pushed back, and so did every other that took it
    HOLD = "hold"
    #: a holder took frames again, closed, or the hold lasted ``slow_consumer_stall``
    RELEASE = "release"
    #: its frames waiting in output queues went over its credit
    OVER_CREDIT = "over-credit"
    #: they fell back to half its credit
    CREDIT_BACK = "credit-back"
    #: the link is gone
    CLOSE = "close"


S, E = InputState, InputEvent

#: (state, event) -> next state: every transition an input may make, and no other
TRANSITIONS: dict[tuple[InputState, InputEvent], InputState] = {
    (S.READING, E.HOLD): S.HELD,
    (S.READING, E.OVER_CREDIT): S.PAUSED,
    (S.HELD, E.RELEASE): S.READING,
    (S.HELD, E.OVER_CREDIT): S.HELD_OVER_CREDIT,
    (S.PAUSED, E.CREDIT_BACK): S.READING,
    (S.HELD_OVER_CREDIT, E.RELEASE): S.PAUSED,
    (S.HELD_OVER_CREDIT, E.CREDIT_BACK): S.HELD,
    (S.READING, E.CLOSE): S.CLOSED,
    (S.HELD, E.CLOSE): S.CLOSED,
    (S.PAUSED, E.CLOSE): S.CLOSED,
    (S.HELD_OVER_CREDIT, E.CLOSE): S.CLOSED,
}

#: the states in which the runtime does not read the input
NOT_READING = frozenset({S.HELD, S.PAUSED, S.HELD_OVER_CREDIT})
#: the states in which a hold is on (holders, and the stall clock)
HOLDING = frozenset({S.HELD, S.HELD_OVER_CREDIT})
#: the states in which the input waits for credit (outputs not draining are looked for)
OVER_CREDIT = frozenset({S.PAUSED, S.HELD_OVER_CREDIT})


class FlowControlError(RuntimeError):
    """An event an input in its state cannot take: the caller's bookkeeping is wrong."""


def next_state(state: InputState, event: InputEvent) -> InputState:
    """Where *event* takes an input in *state*; raises :class:`FlowControlError` if the
    table has no such transition."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise FlowControlError(f"an input that is {state.value} cannot take "
                               f"'{event.value}'") from None


# decisions -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StopReading:
    """Stop reading input *link* (``why``: "held" or "credit"); while it does not read, the
    peer's silence proves nothing to liveness."""

    link: int
    why: str


@dataclass(frozen=True, slots=True)
class ReadAgain:
    """Input *link* reads again: nothing stops it any more."""

    link: int


@dataclass(frozen=True, slots=True)
class SlowConsumer:
    """Output *link* has just gone over its queue bound and drops frames (counted): say so
    once (the log)."""

    link: int


@dataclass(frozen=True, slots=True)
class Evict:
    """Close output *link*: it stayed over its bound for the grace time. *reason* goes into
    the log line and the fault notice on band 17 of its flows."""

    link: int
    reason: str


Decision = StopReading | ReadAgain | SlowConsumer | Evict
