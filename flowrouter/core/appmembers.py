"""Application membership: joins and leaves of a router's applications, told on band 19.

Seed 002 section 3.4 wants membership changes visible to applications. Each router reports
only its *own* applications (endpoint links) of a flow; the notices travel as ordinary frames
of the flow on :data:`~flowrouter.wire.bands.BAND_APP_MEMBERSHIP`, so the routers' usual
forwarding (band masks, the shared tree) takes them to every application listening on band
19 and to no one else downstream. Format: :mod:`flowrouter.wire.appmembers`.

Aggregation, so a large flow does not flood: changes are collected per flow and sent at most
once per ``member_notice_interval`` seconds per flow and router, one batch holding every
change of the interval (the latest change per application wins: a join and a leave within
one interval are reported as the leave). A notice holds at most ``member_notice_max``
changes, so a larger batch goes as several notices. At most ``member_notices_per_tick``
notices leave per tick; what does not fit waits for the next interval (counted
``appmembers.deferred``; the last notice sent says how many changes it left out).

Snapshots (every local member) go out when a local application starts listening on band 19
(so a new listener learns this router's members at once) and every ``member_refresh``
seconds while the flow has local members (so listeners elsewhere learn of them within one
refresh: soft state, as everything else in the router). A snapshot replaces what a receiver
held for this router; members of a router whose snapshots stop coming expire at receivers
after three refresh intervals.

The work of one interval is bounded as well as its notices: flows owing a notice wait in
one queue, first come first served, and one interval looks at no more than
``KEYS_PER_INTERVAL`` of them; snapshot clocks are kept in the order they fall due, so an
interval finds the due ones without a walk of every flow. A flow whose notices would reach
no one (no band-19 listener below, no upstream, no listening sibling) costs its bookkeeping
only. With 10^5 flows of local members, walking and sorting them all each interval cost a
tenth of a core, and ticks of 0.4 s.

A part of the router (see :mod:`flowrouter.core.router`): its own object, owning the pending
changes and the snapshot clocks, over the shared :class:`~flowrouter.core.state.RouterState`;
membership tells it of changes (:class:`~flowrouter.core.interfaces.MemberLog`), the Router's
``tick`` asks it for the notices due. May import :mod:`flowrouter.wire` and the core's shared
modules (state, actions, tables); never another part.
"""

from __future__ import annotations

from collections import deque

from flowrouter.core.actions import Action, Send
from flowrouter.core.state import RouterState
from flowrouter.core.tables import FlowEntry, Link
from flowrouter.wire import control as C
from flowrouter.wire.appmembers import (
    MemberChange,
    MemberEvent,
    MemberNotice,
    NoticeKind,
)
from flowrouter.wire.bands import BAND_APP_MEMBERSHIP
from flowrouter.wire.header import DEFAULT_TTL, pack_header

_BIT = 1 << BAND_APP_MEMBERSHIP
#: flows one interval looks at, at most (the rest wait their turn, in order)
KEYS_PER_INTERVAL = 4096


class AppMembership:
    """Collects local membership changes per flow and sends them as band-19 notices."""

    def __init__(self, state: RouterState, now: float) -> None:
        self.state = state
        self.p = state.p
        self.counters = state.counters
        #: pending changes per flow (link -> latest change), flows owing a snapshot, when
        #: each flow's last snapshot went (and those times and keys in the order they were
        #: set, two deques rather than one of tuples: 16 bytes a flow, not 72; an entry is
        #: stale when the key's time has moved on since)
        self._changes: dict[bytes, dict[int, MemberChange]] = {}
        self._snapshot_due: set[bytes] = set()
        self._refresh_at: dict[bytes, float] = {}
        self._order_at: deque[float] = deque()
        self._order_key: deque[bytes] = deque()
        #: flows owing a notice (changes or a snapshot), in the order they came to owe it
        self._due: deque[bytes] = deque()
        self._queued: set[bytes] = set()
        self._last = now
        self._clock = now
        self._seq = 0

    def member_changed(self, key: bytes, link: Link | None, event: MemberEvent, mask: int,
                        old_mask: int = 0) -> None:
        """An application link joined, changed its mask on, or left flow *key*."""
        if (link is None or link.role is not C.Role.ENDPOINT
                or not self.p.member_notice_interval):
            return
        auth = link.auth
        name = link.peer_name if auth is not None and auth.authenticated else ""
        changes = self._changes.setdefault(key, {})
        if event is MemberEvent.MASK and link.link_id in changes:
            prev = changes[link.link_id].event
            if prev is MemberEvent.JOIN:
                event = MemberEvent.JOIN
        changes[link.link_id] = MemberChange(event, link.peer_node_id, mask, name)
        if mask & _BIT and not old_mask & _BIT:
            self._snapshot_due.add(key)  # a new local listener: tell it who is here
        self._queue(key)
        if key not in self._refresh_at:
            self._refresh_from(key, self._clock)

    def _queue(self, key: bytes) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._due.append(key)

    def _refresh_from(self, key: bytes, at: float) -> None:
        """The flow's next snapshot is due ``member_refresh`` after *at*."""
        self._refresh_at[key] = at
        self._order_at.append(at)
        self._order_key.append(key)

    def _snapshots_due(self, now: float, refresh: float) -> None:
        """Queue a snapshot of the flows whose refresh fell due, oldest first: it stops at
        the first not due, or when an interval's worth wait (the rest stay in order)."""
        ats, keys, times = self._order_at, self._order_key, self._refresh_at
        while ats and now - ats[0] >= refresh and len(self._due) < KEYS_PER_INTERVAL:
            at, key = ats.popleft(), keys.popleft()
            if times.get(key) != at:
                continue  # set again since, or gone
            del times[key]
            self._snapshot_due.add(key)
            self._queue(key)

    def notices(self, now: float) -> list[Action]:
        """Called every tick: send what is due (batched per interval, bounded per tick)."""
        p = self.p
        self._clock = now
        if not p.member_notice_interval:
            return []
        if now - self._last < p.member_notice_interval:
            return []
        self._last = now
        if p.member_refresh:
            self._snapshots_due(now, p.member_refresh)
        out: list[Action] = []
        budget = p.member_notices_per_tick
        due, queued = self._due, self._queued
        for _ in range(min(len(due), KEYS_PER_INTERVAL)):
            if budget <= 0:
                break
            key = due.popleft()
            queued.discard(key)
            entry = self.state.flows.get(key)
            changes = self._changes.pop(key, None) or {}
            snapshot = key in self._snapshot_due
            self._snapshot_due.discard(key)
            if entry is None:
                self._refresh_at.pop(key, None)
                continue
            targets = self._targets(entry)
            if not targets:
                # nobody would get it: the snapshot clock is all it costs (a listener
                # may appear, and hear of these members at the next refresh)
                if snapshot or changes:
                    self._seq = (self._seq + 1) & 0xFFFFFFFF
                if not self._has_local(entry):
                    self._refresh_at.pop(key, None)
                elif snapshot:
                    self._refresh_from(key, now)
                continue
            local = self._local_members(entry)
            if snapshot:
                self._refresh_from(key, now)
                items = local
            else:
                items = list(changes.values())
            if not local:
                self._refresh_at.pop(key, None)
            if not items and not snapshot:
                continue
            # one batch per interval; a batch larger than a notice goes as several notices
            # (a snapshot's first part replaces, the rest add), as many as the tick allows
            step = p.member_notice_max
            chunks = [items[i:i + step] for i in range(0, len(items), step)] or [[]]
            if len(chunks) > budget:
                self.counters["appmembers.deferred"] += 1
                rest = [c for chunk in chunks[budget:] for c in chunk]
                omitted = len(rest)
                chunks = chunks[:budget]
                if snapshot:
                    self._snapshot_due.add(key)  # all again next time
                else:
                    # negative keys: never confused with the link ids of later changes
                    self._changes[key] = {-1 - i: c for i, c in enumerate(rest)}
                self._queue(key)
            else:
                omitted = 0
            for i, chunk in enumerate(chunks):
                kind = NoticeKind.SNAPSHOT if snapshot and i == 0 else NoticeKind.DELTA
                self._seq = (self._seq + 1) & 0xFFFFFFFF
                last = i == len(chunks) - 1
                notice = MemberNotice(kind, p.node_id, self._seq,
                                      int(p.member_refresh), omitted if last else 0,
                                      tuple(chunk))
                hdr = pack_header(key, len(body := notice.encode()), BAND_APP_MEMBERSHIP, 0,
                                  0, DEFAULT_TTL)
                budget -= 1
                self.counters["appmembers.notices"] += 1
                self.counters["appmembers.changes"] += len(chunk)
                out += [Send(t, hdr, body) for t in targets]
        if due:
            self.counters["appmembers.deferred"] += len(due)
        return out

    def _has_local(self, entry: FlowEntry) -> bool:
        """Whether an application of this router is a member of the flow."""
        links = self.state.links
        return any((lk := links.get(lid)) is not None and lk.role is C.Role.ENDPOINT
                   for lid in entry.down_links())

    def _local_members(self, entry: FlowEntry) -> list[MemberChange]:
        out = []
        for lid, mask in entry.down_items():
            lk = self.state.links.get(lid)
            if lk is None or lk.role is not C.Role.ENDPOINT:
                continue
            auth = lk.auth
            name = lk.peer_name if auth is not None and auth.authenticated else ""
            out.append(MemberChange(MemberEvent.JOIN, lk.peer_node_id, mask, name))
        return out

    def _targets(self, entry: FlowEntry) -> list[int]:
        """Where a notice of this router goes, as data it originates: to band-19 listeners
        below, and up the tree (or to sibling LS members listening on band 19, at a
        core)."""
        targets = entry.targets(_BIT)
        if entry.upstream is not None:
            targets.append(entry.upstream)
        elif entry.sib:
            targets += [lk for lk, m in entry.sib.items() if m & _BIT]
        links = self.state.links
        return [t for t in targets if t in links]
