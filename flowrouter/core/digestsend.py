"""The refresh digest rounds a router sends to its upstream neighbours.

Owned by the soft state (:mod:`flowrouter.core.softstate`, which says what a round is for and
how the receiver reconciles it): when a link's round timer falls due the soft state has a
:class:`DigestSender` start a round toward that neighbour, and every tick it sends the chunks
that fell due. A round snapshots the keys only; each chunk is built from the entries as they
are when it goes out, and the chunks are spread over ``SPREAD`` of the round's period (no
bursts, and a round always ends before the next begins). Toward a fellow member of a location
service a round also lists the masks we told it along the members' tree
(``REFRESH_SIBLING`` entries), so a lost sibling MASK is repaired like a lost MASK.

May import :mod:`flowrouter.wire` and the core's shared modules (state, actions, tables);
imported by softstate only.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrouter.core.actions import Action
from flowrouter.core.state import RouterState, link_message
from flowrouter.core.tables import Link
from flowrouter.wire import control as C

#: share of the refresh interval a round's chunks are spread over (the rest is slack, so a
#: round always ends before the next begins)
SPREAD = 0.8


@dataclass(slots=True)
class TxRound:
    """A digest round being sent toward one upstream neighbour."""

    number: int
    keys: list[bytes]
    per_chunk: int
    count: int
    started: float
    period: float  #: this round's length (the refresh interval, longer for huge tables)
    sent: int = 0


class DigestSender:
    """The digest rounds being sent, one at most per link (see the module docs)."""

    def __init__(self, state: RouterState) -> None:
        #: the router's tables, read as each chunk is built (nothing here is per frame)
        self.state = state
        self.p = state.p
        self._round = 0
        self._tx: dict[int, TxRound] = {}

    def __bool__(self) -> bool:
        """Some round still has chunks to send."""
        return bool(self._tx)

    def forget(self, link_id: int) -> None:
        """The link closed: its round (if any) is not finished."""
        self._tx.pop(link_id, None)

    def start(self, link: Link, now: float) -> float:
        """Snapshot the flows we want from this upstream neighbour; chunks follow, spread
        over the round's period (returned: when the next round is due) and built from the
        entries as they are when sent."""
        lid = link.link_id
        # every flow that names this link; _chunk keeps those whose upstream it is (a few
        # downstream ones make chunks a little emptier, cheaper than filtering twice)
        keys = list(link.dependent)
        st = self.state
        told = st.routing.told_to(lid)
        if told:  # a fellow LS member: the masks we told it (our side of the tree)
            dep = link.dependent
            keys += [k for k in told if k not in dep]
        self._round = (self._round + 1) & 0xFFFFFFFF
        per = C.refresh_capacity(link.max_payload)
        count = max(1, -(-len(keys) // per))
        if count > 0xFFFF:  # pragma: no cover - over 67 million flows on one link
            per = -(-len(keys) // 0xFFFF)
            count = -(-len(keys) // per)
        period = C.refresh_period(len(keys), self.p.refresh_interval, self.p.max_refresh_rate)
        self._tx[lid] = TxRound(self._round, keys, per, count, now, period)
        st.counters["refresh.rounds-sent"] += 1
        if st.tracing:
            st.tracer.refresh(now, lid, "sent", len(keys), count)
        return period

    def send_due(self, now: float) -> list[Action]:
        """The chunks of every round that fell due by *now*."""
        out: list[Action] = []
        links, counters = self.state.links, self.state.counters
        for lid, tx in list(self._tx.items()):
            if lid not in links:
                del self._tx[lid]
                continue
            hold_ms = min(0xFFFFFFFF, int(self.p.hold_factor * tx.period * 1000))
            due = min(tx.count, 1 + int(tx.count * (now - tx.started) / (tx.period * SPREAD)))
            while tx.sent < due:
                out.append(link_message(lid, self._chunk(lid, tx, tx.sent, hold_ms)))
                tx.sent += 1
                counters["refresh.chunks-sent"] += 1
            if tx.sent >= tx.count:
                del self._tx[lid]
        return out

    def _chunk(self, lid: int, tx: TxRound, index: int, hold_ms: int) -> C.Refresh:
        """Chunk *index*, from the entries as they are now (not as at the snapshot)."""
        flows, routing = self.state.flows, self.state.routing
        told = routing.told_to(lid) if routing.trees else {}
        entries = []
        for key in tx.keys[index * tx.per_chunk:(index + 1) * tx.per_chunk]:
            e = flows.get(key)
            if e is not None and e.upstream == lid:
                entries.append((key, e.agg, 0 if e.agg else C.REFRESH_ADVERTISE))
            elif (mask := told.get(key)) and (e is None or e.upstream is None):
                entries.append((key, mask, C.REFRESH_SIBLING))
        return C.Refresh(tx.number, index, tx.count, hold_ms, tuple(entries))
