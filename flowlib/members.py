"""Membership events and the current member view of a flow, from routers' band-19 notices.

Routers report their own applications' joins, mask changes and leaves of a flow on band 19
(application membership), batched per interval, with a snapshot of their local members when a
local application starts listening on band 19 and every refresh interval (format and rules:
:mod:`flowrouter.wire.appmembers`, :mod:`flowrouter.core.appmembers`).
:class:`MemberView` (sans-I/O) keeps one member set per reporting router (a
snapshot replaces it, a delta edits it) and presents their union as the current view, and
turns every difference into a :class:`MemberUpdate` event; :class:`MemberWatch` feeds it
from a band-19 listener and queues the events for the application.

Members are named by their node id (the 64-bit id an application announces in its HELLO:
one per client) and, where the router authenticated the application's link, its name.
The watcher itself listens on band 19, so it is a member too (with a mask of band 19).

The view is soft state, and bounded. Members reported by a router that has stopped sending
notices for three of its refresh intervals are dropped (a ``leave`` event with
``expired=True``); the refresh a notice claims is clamped to 1 .. :data:`MAX_REFRESH` seconds
(a claim of 0, "no snapshots", or of hours would otherwise keep its members for ever), and
expiry runs on the clock the caller passes in (:meth:`MemberView.next_deadline`,
:meth:`MemberView.expire`). A view holds at most ``max_members`` members (the client's
``max_members`` option): members past it are not kept, each one counted in ``overflowed``, and
the view says it is ``incomplete`` until it has room again (:class:`MemberWatch` also reports
it on the overflow band). Until every router's first snapshot came the view may miss members
that joined before the watch started; a notice that says it omitted changes (a router's
notice was full) makes the view incomplete until that router's next snapshot. Malformed
notices are counted in ``errors`` and ignored.

Who may speak: notices originate only at routers, and routers drop band-19 frames that
applications send. flowlib takes a notice only as a whole frame from its router's link
(:class:`flowlib.protocol.ClientProtocol` refuses fragments and escaped payloads on band 19,
notices that claim no router, this client, or a router they cannot come from: its own
router's notices reach it straight, every other router's through at least one more router),
and nothing else feeds a watch. May import only :mod:`flowrouter.wire` and flowlib.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flowrouter.wire.appmembers import MemberEvent, MemberNotice, NoticeKind, decode_notice
from flowrouter.wire.bands import BAND_APP_MEMBERSHIP, BandMask
from flowrouter.wire.flowid import FlowID

from .errors import ConnectionLost, ListenerClosed

if TYPE_CHECKING:  # pragma: no cover
    from .queue import Listener

#: receivers drop a router's members after this many of its refresh intervals of silence
EXPIRE_AFTER = 3
#: the longest refresh interval a notice may claim (seconds); 0 ("none") counts as this too
MAX_REFRESH = 300
#: members one view keeps at most, by default (ClientOptions.max_members)
DEFAULT_MAX_MEMBERS = 10_000
MAX_PENDING_EVENTS = 10_000


@dataclass(frozen=True, slots=True)
class Member:
    """One application on the flow, as its router reports it."""

    node_id: int
    name: str  #: empty unless its router authenticated its link
    mask: BandMask
    router: int  #: node id of the router that reports it


@dataclass(frozen=True, slots=True)
class MemberUpdate:
    """A difference in the view: ``kind`` is ``"join"``, ``"mask"`` or ``"leave"``."""

    kind: str
    member: Member
    time: float  #: the clock's time when the notice arrived (as the caller gave it)
    expired: bool = False  #: a leave because its router went silent, not a reported leave


def clamp_refresh(refresh: int) -> int:
    """The refresh interval a notice is held to: 1 .. MAX_REFRESH (0, "none", is the max)."""
    return MAX_REFRESH if refresh <= 0 else min(refresh, MAX_REFRESH)


class MemberView:
    """The sans-I/O part: notices and the time in, the view and its changes out.

    One member table per reporting router; the view is their union (where two routers
    report one node, the higher router id wins). Each notice costs the members it names,
    not the size of the view.
    """

    def __init__(self, max_members: int = DEFAULT_MAX_MEMBERS) -> None:
        if isinstance(max_members, bool) or not isinstance(max_members, int) \
                or max_members < 1:
            raise ValueError(f"max_members must be a positive integer, got {max_members!r}")
        self.max_members = max_members
        self._by_router: dict[int, dict[int, Member]] = {}
        self._holders: dict[int, set[int]] = {}  #: node id -> routers that report it
        self._expires: dict[int, float] = {}  #: router -> when its members expire
        self._incomplete: set[int] = set()
        self._entries = 0  #: members held, summed over routers (what the bound counts)
        self._union: dict[int, Member] | None = None
        self.notices = 0  #: notices applied
        #: members not kept because the view was full (each time one was refused)
        self.overflowed = 0
        #: the view refused members since it last had room for all it was told
        self.full = False

    @property
    def members(self) -> dict[int, Member]:
        """node id -> member: the union over reporting routers."""
        if self._union is None:
            self._union = {nid: self._winner(nid) for nid in self._holders}
        return dict(self._union)

    @property
    def incomplete(self) -> bool:
        """Some router said its notice omitted changes, or the view was full."""
        return bool(self._incomplete) or self.full

    def __len__(self) -> int:
        return len(self._holders)

    def next_deadline(self) -> float | None:
        """When some router's members expire unless it speaks again (None: no members)."""
        return min(self._expires.values(), default=None)

    def _winner(self, nid: int) -> Member:
        return self._by_router[max(self._holders[nid])][nid]

    def apply(self, notice: MemberNotice, now: float) -> list[MemberUpdate]:
        """Fold one notice into the view at time *now*; return the changes it made."""
        rid = notice.router
        table = self._by_router.get(rid, {})
        touched = {c.member for c in notice.changes}
        if notice.kind is NoticeKind.SNAPSHOT:
            touched.update(table)
        before = {nid: self._winner(nid) for nid in touched if nid in self._holders}
        if notice.kind is NoticeKind.SNAPSHOT:
            for nid in list(table):
                self._remove(rid, table, nid)
            self._incomplete.discard(rid)
        if notice.omitted:
            self._incomplete.add(rid)
        refused = 0
        for c in notice.changes:
            nid = c.member
            if c.event is MemberEvent.LEAVE:
                if nid in table:
                    self._remove(rid, table, nid)
            elif nid in table or self._entries < self.max_members:
                if nid not in table:
                    self._entries += 1
                    self._holders.setdefault(nid, set()).add(rid)
                table[nid] = Member(nid, c.name, BandMask(c.mask), rid)
            else:
                refused += 1
        self.overflowed += refused
        self.full = refused > 0 or (self.full and self._entries >= self.max_members)
        if table:
            self._by_router[rid] = table
            self._expires[rid] = now + EXPIRE_AFTER * clamp_refresh(notice.refresh)
        else:
            self._forget_router(rid)
        self.notices += 1
        return self._diff(before, touched, now, set())

    def _remove(self, rid: int, table: dict[int, Member], nid: int) -> None:
        del table[nid]
        self._entries -= 1
        holders = self._holders[nid]
        holders.discard(rid)
        if not holders:
            del self._holders[nid]

    def _forget_router(self, rid: int) -> None:
        self._by_router.pop(rid, None)
        self._expires.pop(rid, None)
        self._incomplete.discard(rid)

    def expire(self, now: float) -> list[MemberUpdate]:
        """Drop the members of routers silent past their expiry (see :meth:`next_deadline`)."""
        gone = [rid for rid, at in self._expires.items() if now >= at]
        if not gone:
            return []
        touched: set[int] = set()
        for rid in gone:
            touched.update(self._by_router.get(rid, ()))
        before = {nid: self._winner(nid) for nid in touched}
        for rid in gone:
            table = self._by_router.get(rid, {})
            for nid in list(table):
                self._remove(rid, table, nid)
            self._forget_router(rid)
        if self._entries < self.max_members:
            self.full = False
        return self._diff(before, touched, now, set(gone))

    def _diff(self, before: dict[int, Member], touched: set[int], now: float,
              expired: set[int]) -> list[MemberUpdate]:
        if not touched:
            return []
        self._union = None
        leaves: list[MemberUpdate] = []
        out: list[MemberUpdate] = []
        for nid in sorted(touched):
            old = before.get(nid)
            new = self._winner(nid) if nid in self._holders else None
            if new is None:
                if old is not None:
                    leaves.append(MemberUpdate("leave", old, now,
                                               expired=old.router in expired))
            elif old is None:
                out.append(MemberUpdate("join", new, now))
            elif old.mask != new.mask:
                out.append(MemberUpdate("mask", new, now))
        return leaves + out


class MemberWatch:
    """The members of one flow, kept current from band-19 notices. Use
    :meth:`flowlib.FlowClient.watch_members` to make one; iterate it for changes.

    *on_overflow* is called with the number of members just refused when a notice finds
    the view full (the client turns it into a rate-limited notice on the overflow band).
    """

    def __init__(self, flow: FlowID, listener: Listener, *,
                 max_events: int = MAX_PENDING_EVENTS,
                 max_members: int = DEFAULT_MAX_MEMBERS,
                 on_close: Callable[[], Awaitable[None]] | None = None,
                 on_overflow: Callable[[int], None] | None = None) -> None:
        self.flow = flow
        self.view = MemberView(max_members)
        self._listener = listener
        self._on_close = on_close
        self._on_overflow = on_overflow
        self._events: deque[MemberUpdate] = deque(maxlen=max_events)
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self.errors = 0  #: malformed notices ignored
        self.events_dropped = 0  #: changes not kept because nobody read them in time
        self._closed = False
        self._task = asyncio.ensure_future(self._run())

    @property
    def members(self) -> dict[int, Member]:
        """The current view: node id -> member (the union over reporting routers)."""
        self._push(self.view.expire(self._loop.time()))
        return self.view.members

    @property
    def incomplete(self) -> bool:
        """True while some router said its notice omitted changes (until its snapshot), or
        while the view is full (members were refused: see :attr:`overflowed`)."""
        return self.view.incomplete

    @property
    def overflowed(self) -> int:
        """Members refused because the view held ``max_members`` already."""
        return self.view.overflowed

    def names(self) -> list[str]:
        """The members' names (authenticated ones only), sorted."""
        return sorted({m.name for m in self.members.values() if m.name})

    async def next_change(self, timeout: float | None = None) -> MemberUpdate:
        """The next change (oldest first); ListenerClosed once closed and drained,
        TimeoutError after *timeout* seconds."""
        while not self._events:
            if self._closed:
                raise ListenerClosed("membership watch closed")
            self._wake.clear()
            await asyncio.wait_for(self._wake.wait(), timeout)
        return self._events.popleft()

    async def wait_for(self, predicate: Callable[[dict[int, Member]], bool],
                       timeout: float | None = None) -> dict[int, Member]:
        """Wait until *predicate(view)* holds; return the view (TimeoutError after
        *timeout*). Changes are consumed while waiting."""
        async def until() -> dict[int, Member]:
            while not predicate(self.members):
                await self.next_change()
            return self.members
        return await asyncio.wait_for(until(), timeout)

    def __aiter__(self) -> MemberWatch:
        return self

    async def __anext__(self) -> MemberUpdate:
        try:
            return await self.next_change()
        except ListenerClosed:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        """Stop watching (and stop listening on band 19, which makes us leave the view)."""
        if self._task.done() and self._closed:
            return
        self._closed = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._wake.set()
        if self._on_close is not None:
            await self._on_close()

    async def _run(self) -> None:
        view = self.view
        loop = self._loop
        try:
            while True:
                due = view.next_deadline()
                try:
                    msg = await asyncio.wait_for(
                        self._listener.get(),
                        None if due is None else max(0.0, due - loop.time()))
                except TimeoutError:
                    self._push(view.expire(loop.time()))
                    continue
                if msg.band != BAND_APP_MEMBERSHIP:
                    continue
                try:
                    notice = decode_notice(msg.payload)
                except ValueError:
                    self.errors += 1
                    continue
                now = loop.time()
                refused = view.overflowed
                self._push(view.expire(now) + view.apply(notice, now))
                refused = view.overflowed - refused
                if refused and self._on_overflow is not None:
                    self._on_overflow(refused)
        except (ListenerClosed, ConnectionLost):
            pass
        finally:
            self._closed = True
            self._wake.set()

    def _push(self, changes: list[MemberUpdate]) -> None:
        for change in changes:
            if len(self._events) == self._events.maxlen:
                self.events_dropped += 1
            self._events.append(change)
        if changes:
            self._wake.set()
