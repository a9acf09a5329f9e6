"""Stability tracking (beyond the seed): deliver a message only once every site of the
ordering set holds it and everything below it. Sans-I/O: imports only the standard library,
flowrouter.wire and the other IGO modules."""

from __future__ import annotations

from .core import SiteCore
from .records import Msg, PeerRecord


class StabilityTracking(SiteCore):
    """The stability rule (a part of SiteOrdering)."""

    def _stable(self, msg: Msg, now: float) -> bool:
        """Stability tracking: every peer of the ordering set (1) has the message, (2) has
        everything its own ordering set sent below it (its frontier is past it), and (3) we
        hold every message any of them holds. Then all of us deliver the same messages
        below it, in the same order, whether or not connectivity is transitive."""
        key = (msg.lamport, msg.origin)
        need: dict[int, int] = {}
        for p in self.peers.values():
            if not self._in_ordering(p):
                continue
            if len(p.acks) != self.n or len(p.ack_incs) != self.n or p.frontier <= key:
                return False
            if p.idx != msg.origin and not self._acknowledged(p, msg):
                return False
            for o, a in enumerate(p.acks):
                if p.ack_incs[o] == self.streams[o].inc and a > need.get(o, 0):
                    need[o] = a
        for o, a in need.items():
            if o == self.me:
                continue
            st = self.streams[o]
            if st.synced and st.contiguous < a:
                if a > st.known_high:
                    st.known_high = a
                self._want_nack(st, now)
                return False
        return True

    @staticmethod
    def _acknowledged(p: PeerRecord, msg: Msg) -> bool:
        """Peer *p*'s acknowledgements cover *msg*: they are about its run and reach it, or
        about a later run of its origin (p moved on: it settled the earlier run; an
        approximation, acknowledgements carry each origin's current run only)."""
        inc = p.ack_incs[msg.origin]
        return inc > msg.inc or inc == msg.inc and p.acks[msg.origin] >= msg.seq
