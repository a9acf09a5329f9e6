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

The view is soft state: members reported by a router that has stopped sending snapshots for
three of its refresh intervals are dropped (a ``leave`` event with ``expired=True``). Until
every router's first snapshot came the view may miss members that joined before the watch
started; a notice that says it omitted changes (a router's notice was full) makes the view
incomplete until that router's next snapshot (``incomplete`` tells). Malformed notices are
counted in ``errors`` and ignored. May import only :mod:`flowrouter.wire` and flowlib.
"""

from __future__ import annotations

import asyncio
import time
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
    time: float  #: local monotonic time the notice arrived
    expired: bool = False  #: a leave because its router went silent, not a reported leave


class MemberView:
    """The sans-I/O part: notices in, the view and its changes out (no loop, no clock)."""

    def __init__(self) -> None:
        self._by_router: dict[int, dict[int, Member]] = {}
        self._heard: dict[int, tuple[float, int]] = {}  #: router -> (last notice, refresh)
        self._incomplete: set[int] = set()
        self.notices = 0  #: notices applied

    @property
    def members(self) -> dict[int, Member]:
        """node id -> member: the union over reporting routers."""
        out: dict[int, Member] = {}
        for rid in sorted(self._by_router):
            out.update(self._by_router[rid])
        return out

    @property
    def incomplete(self) -> bool:
        return bool(self._incomplete)

    def next_expiry(self) -> float | None:
        """Seconds of silence after which some router's members expire (None: never)."""
        refreshes = [r for _, r in self._heard.values() if r]
        return EXPIRE_AFTER * min(refreshes) if refreshes else None

    def apply(self, notice: MemberNotice, now: float) -> list[MemberUpdate]:
        """Fold one notice into the view; return the changes it made."""
        before = self.members
        rid = notice.router
        self._heard[rid] = (now, notice.refresh)
        table = self._by_router.setdefault(rid, {})
        if notice.kind is NoticeKind.SNAPSHOT:
            table.clear()
            self._incomplete.discard(rid)
        if notice.omitted:
            self._incomplete.add(rid)
        for c in notice.changes:
            if c.event is MemberEvent.LEAVE:
                table.pop(c.member, None)
            else:
                table[c.member] = Member(c.member, c.name, BandMask(c.mask), rid)
        if not table:
            self._by_router.pop(rid, None)
        self.notices += 1
        return self._diff(before, now, set())

    def expire(self, now: float) -> list[MemberUpdate]:
        """Drop members of routers silent for EXPIRE_AFTER of their refresh intervals."""
        before = self.members
        expired: set[int] = set()
        for rid, (at, refresh) in list(self._heard.items()):
            if refresh and now - at > EXPIRE_AFTER * refresh:
                del self._heard[rid]
                expired.add(rid)
                self._by_router.pop(rid, None)
                self._incomplete.discard(rid)
        return self._diff(before, now, expired) if expired else []

    def _diff(self, before: dict[int, Member], now: float, expired: set[int]
              ) -> list[MemberUpdate]:
        after = self.members
        out = [MemberUpdate("leave", m, now, expired=m.router in expired)
               for nid, m in before.items() if nid not in after]
        for nid, m in after.items():
            old = before.get(nid)
            if old is None:
                out.append(MemberUpdate("join", m, now))
            elif old.mask != m.mask:
                out.append(MemberUpdate("mask", m, now))
        return out


class MemberWatch:
    """The members of one flow, kept current from band-19 notices. Use
    :meth:`flowlib.FlowClient.watch_members` to make one; iterate it for changes."""

    def __init__(self, flow: FlowID, listener: Listener, *,
                 max_events: int = MAX_PENDING_EVENTS,
                 on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.flow = flow
        self.view = MemberView()
        self._listener = listener
        self._on_close = on_close
        self._events: deque[MemberUpdate] = deque(maxlen=max_events)
        self._wake = asyncio.Event()
        self.errors = 0  #: malformed notices ignored
        self.events_dropped = 0  #: changes not kept because nobody read them in time
        self._closed = False
        self._task = asyncio.ensure_future(self._run())

    @property
    def members(self) -> dict[int, Member]:
        """The current view: node id -> member (the union over reporting routers)."""
        self._push(self.view.expire(time.monotonic()))
        return self.view.members

    @property
    def incomplete(self) -> bool:
        """True while some router said its notice omitted changes (until its snapshot)."""
        return self.view.incomplete

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
        try:
            while True:
                try:
                    msg = await asyncio.wait_for(self._listener.get(), self.view.next_expiry())
                except TimeoutError:
                    self._push(self.view.expire(time.monotonic()))
                    continue
                if msg.band != BAND_APP_MEMBERSHIP:
                    continue
                try:
                    notice = decode_notice(msg.payload)
                except ValueError:
                    self.errors += 1
                    continue
                now = time.monotonic()
                self._push(self.view.expire(now) + self.view.apply(notice, now))
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
