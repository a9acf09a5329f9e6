"""What the IGO state machine hands back: actions to carry out (send, deliver) and the
events an application shows (membership and state changes). Imports only the standard library."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to the application at ``site``."""

    site: str  #: where it was delivered
    origin: str  #: the site that sent it
    seq: int  #: the origin's sequence number
    lamport: int
    gseq: int | None  #: leader mode: the leader's order number (None if delivered locally)
    send_time: float
    delivery_time: float
    late: bool  #: delivered out of the order its ordering rule would give (reconciled)
    local: bool  #: leader mode: delivered while cut off from the leader (intra-site order)
    payload: bytes
    incarnation: int = 0  #: the origin's run the message belongs to: (origin, incarnation,
    #: seq) names a message; seq alone does not once a site has restarted
    view: int = 0  #: the view (vid, see views.py) this site was in when it showed it

    @property
    def latency(self) -> float:
        return self.delivery_time - self.send_time


class Send(NamedTuple):
    band: int
    payload: bytes
    kind: str


class Deliver(NamedTuple):
    delivery: Delivery


class MembershipChange(NamedTuple):
    time: float
    members: tuple[str, ...]  #: sites this site's ordering includes (always itself)


class StateChange(NamedTuple):
    time: float
    peer: str | None  #: the peer whose state changed, or None for the site's overall state
    old: str
    new: str
    reason: str = ""  #: what caused it, when not plain silence or contact ("stalled")


class Conflict(NamedTuple):
    """Two frames gave different content for one message ``(origin, incarnation, seq)``:
    someone on the room flow forged one (a room without keys), or the origin signed two
    (keyed room). The first version stays (what was shown cannot be unshown, and in a room
    without keys nothing tells which is genuine); the conflict is counted
    (``conflict.data``) and handed to the application to show, never resolved silently."""

    time: float
    origin: str
    incarnation: int
    seq: int
    transmitter: str  #: the site named as transmitter of the second frame (claimed, unkeyed)
    kept: bytes  #: the payload kept (delivered or waiting)
    other: bytes  #: the conflicting payload, not delivered


class Congestion(NamedTuple):
    """This site's own sending became congested (more offered than its links take: new
    messages wait in the outbox; tell users to slow down) or clear again."""

    time: float
    congested: bool
    queued: int  #: messages waiting in the outbox
    in_flight: int  #: bytes sent and not yet acknowledged by every connected peer


class ViewChange(NamedTuple):
    """A view change began here (this site adopted a proposal): own messages wait until
    the new view is installed (all-to-all modes, see :mod:`~flowchat.igo.views`)."""

    time: float
    proposal: int  #: the proposed view's id (vid)
    number: int  #: its number (the counter part of the vid)
    members: tuple[str, ...]


class ViewInstalled(NamedTuple):
    """An agreed view was installed, after every message of the previous one up to the
    agreed cut. *transitional* is the transitional notice: the members that came from
    the same previous view (they showed the same messages in it, in the same order)."""

    time: float
    view: int  #: vid
    number: int
    members: tuple[str, ...]
    transitional: tuple[str, ...]
    previous: int  #: the vid of the view left


Action = (Send | Deliver | MembershipChange | StateChange | Conflict | Congestion | ViewChange
          | ViewInstalled)


class PeerState(enum.StrEnum):
    UNKNOWN = "unknown"  #: never heard
    S1 = "S1"
    S2 = "S2"
    S3 = "S3"

