"""A peer site's states as seen from this site: the named events and the transition table
(S1/S2/S3, :data:`TRANSITIONS`). Its own module so the site core, the peer-state part, the
incarnations part and the leader all name the same events without importing one another.
Sans-I/O: imports only the standard library and the IGO actions.

Seed 003 Figure 10, per peer site::

    UNKNOWN --CONTACT--> S1            UNKNOWN --SILENT--> S3 (never heard at start-up)
    S1 --SILENT (detect_after)--> S2   S1 --STALLED (heard, but blocked, see stall.py)--> S2
    S2 --RECONCILED (every message it sent is here)--> S1
    S2 --LONG_SILENCE (disconnect_interval)--> S3       S3 --CONTACT--> S1 (no reconciliation)
    S1/S2/S3 --RESTARTED (new incarnation)--> S3 (then CONTACT: a new stream, fetched from 1;
    the earlier run's stream is retired, see incarnations.py)

While in S2 a peer heard again is *reconciling* (a flag of S2: repairs under way).
"""

from __future__ import annotations

import enum

from .actions import PeerState


class PeerEvent(enum.Enum):
    """What can happen to a peer, as seen from this site."""

    CONTACT = "contact"  #: heard while unknown / long-term disconnected: resume its stream
    SILENT = "silent"  #: silent for detect_after (missed heartbeats)
    LONG_SILENCE = "long-silence"  #: silent for disconnect_interval
    RECONCILED = "reconciled"  #: back in S2 and every message it sent has arrived
    RESTARTED = "restarted"  #: a new incarnation of the peer
    STALLED = "stalled"  #: heard, but its messages (or the order stream) blocked for
    #: stall_timeout, though known to exist (a flapping link): a short-term disconnect


_S = PeerState
#: (state, event) -> next state; a pair not listed leaves the state unchanged
TRANSITIONS: dict[tuple[PeerState, PeerEvent], PeerState] = {
    (_S.UNKNOWN, PeerEvent.CONTACT): _S.S1,
    (_S.UNKNOWN, PeerEvent.SILENT): _S.S3,
    (_S.S1, PeerEvent.SILENT): _S.S2,
    (_S.S1, PeerEvent.STALLED): _S.S2,
    (_S.S2, PeerEvent.RECONCILED): _S.S1,
    (_S.S2, PeerEvent.LONG_SILENCE): _S.S3,
    (_S.S3, PeerEvent.CONTACT): _S.S1,
    (_S.S2, PeerEvent.CONTACT): _S.S1,  # a stream resynchronised while in S2 (restart)
    (_S.S1, PeerEvent.RESTARTED): _S.S3,
    (_S.S2, PeerEvent.RESTARTED): _S.S3,
}
