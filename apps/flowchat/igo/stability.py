"""Stability tracking (beyond the seed): deliver a message only once every site of the
ordering set holds it and everything below it. Sans-I/O: imports only the standard library,
flowrouter.wire and the other IGO modules."""

from __future__ import annotations

from .core import SiteCore
from .parts import Liveness, RepairRequests
from .records import Msg, PeerRecord


class StabilityTracking:
    """The stability rule; a part of SiteOrdering, holding the shared SiteCore."""

    _liveness: Liveness
    _repair: RepairRequests

    def __init__(self, core: SiteCore) -> None:
        self.core = core

    def connect(self, *, liveness: Liveness, repairs: RepairRequests) -> None:
        """The other parts this one asks (set once, by the coordinator)."""
        self._liveness = liveness
        self._repair = repairs

    def stable(self, msg: Msg, now: float) -> bool:
        """Stability tracking: every peer of the ordering set (1) has the message, (2) has
        everything its own ordering set sent below it (its frontier is past it), and (3) we
        hold every message any of them holds. Then all of us deliver the same messages
        below it, in the same order, whether or not connectivity is transitive."""
        key = (msg.lamport, msg.origin)
        need: dict[int, int] = {}
        for p in self.core.peers.values():
            if not self._liveness.in_ordering(p):
                continue
            if len(p.acks) != self.core.n or len(p.ack_incs) != self.core.n or p.frontier <= key:
                return False
            if p.idx != msg.origin and not self._acknowledged(p, msg):
                return False
            for o, a in enumerate(p.acks):
                if p.ack_incs[o] == self.core.streams[o].inc and a > need.get(o, 0):
                    need[o] = a
        for o, a in need.items():
            if o == self.core.me:
                continue
            st = self.core.streams[o]
            if st.synced and st.contiguous < a:
                if a > st.known_high:
                    st.known_high = a
                self._repair.want_nack(st, now)
                return False
        return True

    @staticmethod
    def _acknowledged(p: PeerRecord, msg: Msg) -> bool:
        """Peer *p*'s acknowledgements cover *msg*: they are about its run and reach it, or
        about a later run of its origin (p moved on: it settled the earlier run; an
        approximation, acknowledgements carry each origin's current run only)."""
        inc = p.ack_incs[msg.origin]
        return inc > msg.inc or inc == msg.inc and p.acks[msg.origin] >= msg.seq
