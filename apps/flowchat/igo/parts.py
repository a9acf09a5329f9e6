"""The narrow interfaces the parts of a site (:class:`~flowchat.igo.site.SiteOrdering`) use
to reach one another: each part holds the shared :class:`~flowchat.igo.core.SiteCore` and,
for every other part it needs, one of these protocols, which names only what the others may
ask of it. A part's other methods and fields are its own. Imports only the standard library
and the IGO records."""

from __future__ import annotations

from typing import Protocol

from .actions import PeerState
from .peerevents import PeerEvent
from .records import Msg, PeerRecord, Stream
from .wire import Nack


class Liveness(Protocol):
    """Peer states, membership and heartbeats (:class:`~flowchat.igo.states.PeerStates`)."""

    def reachable(self, p: PeerRecord, now: float) -> bool: ...

    def heard(self, i: int, now: float) -> None: ...

    def first_contact(self, p: PeerRecord, st: Stream, upto: int, now: float) -> None: ...

    def check_caught_up(self, p: PeerRecord, now: float) -> None: ...

    def peer_event(self, p: PeerRecord, event: PeerEvent, now: float) -> None: ...

    def in_ordering(self, p: PeerRecord) -> bool: ...

    def locally_connected(self, p: PeerRecord) -> bool: ...

    def update_membership(self, now: float) -> None: ...

    def view_bits(self) -> int: ...


class IncarnationTracking(Protocol):
    """Restarts of peers (:class:`~flowchat.igo.incarnations.Incarnations`)."""

    def incarnation(self, p: PeerRecord, st: Stream, inc: int, now: float) -> bool: ...


class StreamTransport(Protocol):
    """Per-origin FIFO streams (:class:`~flowchat.igo.transport.FifoTransport`)."""

    def holds(self, p: PeerRecord, o: int, first: int, inc: int) -> bool: ...

    def skip(self, o: int, st: Stream, upto: int, now: float, *, reason: str) -> None: ...

    def held_from(self, st: Stream) -> int: ...

    def advance(self, o: int, st: Stream, now: float) -> None: ...


class RepairRequests(Protocol):
    """Asking for missing messages (:class:`~flowchat.igo.repair.Repairs`)."""

    def want_nack(self, st: Stream, now: float, immediate: bool = False,
                  hint: bool = False) -> None: ...

    def gap_nacks_enabled(self) -> bool: ...

    def choose_target(self, st: Stream, first: int, now: float, tries: int) -> int | None: ...


class OrderingRule(Protocol):
    """Lamport order, causal order and delivery (:class:`~flowchat.igo.lamport.
    LamportOrdering`)."""

    def accept(self, msg: Msg, now: float, refill: bool = False) -> None: ...

    def frontier(self) -> tuple[int, int]: ...

    def deps_ok(self, msg: Msg, now: float, late: bool = False) -> bool: ...

    def deliverable(self, now: float) -> None: ...

    def deliver(self, msg: Msg, now: float, *, late: bool, gseq: int | None,
                local: bool) -> None: ...

    def settle(self, st: Stream) -> None: ...


class StabilityRule(Protocol):
    """Stability tracking (:class:`~flowchat.igo.stability.StabilityTracking`)."""

    def stable(self, msg: Msg, now: float) -> bool: ...


class ViewMembership(Protocol):
    """Agreed views (:class:`~flowchat.igo.viewsync.ViewSync`)."""

    enabled: bool

    @property
    def vid(self) -> int: ...

    @property
    def members(self) -> frozenset[int]: ...

    def member(self, p: PeerRecord) -> bool: ...

    def classify(self, msg: Msg) -> str: ...

    def on_peer_view(self, tx: int, vid: int, now: float) -> None: ...

    def try_install(self, now: float) -> bool: ...


class LeaderOrder(Protocol):
    """Leader mode (:class:`~flowchat.igo.leader.LeaderOrdering`)."""

    def leader_assign_ready(self, now: float) -> None: ...

    def leader_restarted(self, inc: int) -> None: ...

    def leader_seen_g(self, g: int, now: float) -> None: ...

    def leader_state_changed(self, old: PeerState, new: PeerState, now: float) -> None: ...

    def deliver_local(self, msg: Msg, now: float) -> None: ...

    def drain_orders(self, now: float) -> None: ...

    def order_nack(self, now: float) -> None: ...

    def answer_order_nack(self, tx: int, n: Nack, now: float) -> None: ...
