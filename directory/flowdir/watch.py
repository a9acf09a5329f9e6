"""Watching the directory: :class:`Watcher` follows registrations and removals of entries
matching a pattern (and notices their expiry) as a stream of :class:`Change`.

A watcher works through a :class:`WatchSource`, the few things it needs of the client that
made it (:class:`flowdir.client.DirectoryClient` is one), so this module does not import the
client; imports asyncio, flowlib and :mod:`flowdir.protocol`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from flowlib import FlowClient, FlowError, FlowID, Listener

from . import protocol as P

log = logging.getLogger("flowdir.client")


@dataclass(frozen=True, slots=True)
class Change:
    """One change seen by :meth:`DirectoryClient.watch`.

    ``event`` is ``present`` (already registered when the watch began, with ``initial``),
    ``added``, ``updated`` (owner, attributes or ttl changed), ``removed`` or ``expired``
    (its owner stopped refreshing it). A removal of an entry the watcher never saw has
    ``entry`` None and ``kind``/``flow`` as the removal gave them (``"*"``/None for any).
    """

    event: str
    name: str
    kind: str
    flow: FlowID | None
    entry: P.Entry | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"event": self.event, "name": self.name, "kind": self.kind,
                                  "flow": str(self.flow) if self.flow else None}
        if self.entry is not None:
            out.update(attrs=list(self.entry.attrs), owner=self.entry.owner,
                       ttl=self.entry.ttl)
        return out


class Listed(Protocol):
    """One entry a listing found (:class:`flowdir.client.Match` is one)."""

    @property
    def entry(self) -> P.Entry: ...

    @property
    def expires_in(self) -> float: ...


class Listing(Protocol):
    """What :meth:`WatchSource.list` returns (:class:`flowdir.client.LookupResult` is one)."""

    @property
    def matches(self) -> Sequence[Listed]: ...


class WatchSource(Protocol):
    """What a :class:`Watcher` needs of the directory client it watches through.

    The connection and the directory flow to listen on; the set of live watchers, which the
    watcher joins when it starts and leaves when it closes (the client shows its own
    registrations to them, as those never come back over the network, and closes them when
    it closes); and :meth:`list`, for the entries already registered when a watch begins.
    """

    @property
    def flow_client(self) -> FlowClient: ...

    @property
    def flow(self) -> FlowID: ...

    @property
    def watchers(self) -> set[Watcher]: ...

    async def list(self, pattern: P.Pattern, *, window: float) -> Listing: ...


class Watcher:
    """Async iterator of :class:`Change` (from :meth:`DirectoryClient.watch`).

    It listens to the register and remove bands of the directory flow and keeps its own view
    of the matching entries, so it can report expiries (nobody announces those: an entry
    expires where it is stored when its owner stops refreshing it). Close it with
    :meth:`close` or use ``async with``.
    """

    def __init__(self, client: WatchSource, pattern: P.Pattern, initial: bool,
                 list_window: float) -> None:
        self.client = client
        self.pattern = pattern
        self.initial = initial
        self.list_window = list_window
        self._view: dict[tuple[str, str, FlowID], tuple[P.Entry, float]] = {}
        self._queue: asyncio.Queue[P.Register | P.Remove | None] = asyncio.Queue()
        self._pending: list[Change] = []
        self._listener: Listener | None = None
        self._pump: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self.malformed = 0

    async def start(self) -> None:
        """Subscribe (returns once the router acknowledged), then, with ``initial``, list
        what is already registered. Subscribing first means no change falls in between."""
        if self._started:
            return
        self._started = True
        client = self.client
        self._listener = await client.flow_client.listen(client.flow, list(P.WATCH_BANDS),
                                                         size=4096)
        self._pump = asyncio.ensure_future(self._read(self._listener))
        client.watchers.add(self)
        if self.initial:
            result = await client.list(self.pattern, window=self.list_window)
            loop = asyncio.get_running_loop()
            for m in result.matches:
                self._view[m.entry.key] = (m.entry, loop.time() + m.expires_in)
                self._pending.append(Change("present", m.entry.name, m.entry.kind,
                                            m.entry.flow, m.entry))

    async def _read(self, listener: Listener) -> None:
        try:
            async for msg in listener:
                op = "register" if msg.band == P.BAND_REGISTER else "remove"
                try:
                    decoded = P.decode(msg.payload, expect=op)
                except P.ProtocolError as exc:
                    self.malformed += 1
                    log.debug("watch: malformed %s: %s", op, exc)
                    continue
                assert isinstance(decoded, (P.Register, P.Remove))
                self._queue.put_nowait(decoded)
        except FlowError as exc:
            log.warning("watch stopped: %s", exc)
        finally:
            self._queue.put_nowait(None)

    def inject(self, msg: P.Register | P.Remove) -> None:
        """Our own registrations never come back to us over the network; show them too."""
        self._queue.put_nowait(msg)

    def _apply(self, msg: P.Register | P.Remove, now: float) -> list[Change]:
        out: list[Change] = []
        if isinstance(msg, P.Register):
            for e in msg.entries:
                if not self.pattern.matches(e):
                    continue
                old = self._view.get(e.key)
                self._view[e.key] = (e, now + e.ttl)
                if old is None or old[1] <= now:
                    out.append(Change("added", e.name, e.kind, e.flow, e))
                elif old[0] != e:
                    out.append(Change("updated", e.name, e.kind, e.flow, e))
            return out
        gone = [e for e, _ in self._view.values() if msg.matches(e)]
        for e in gone:
            del self._view[e.key]
            out.append(Change("removed", e.name, e.kind, e.flow, e))
        if not gone and P.glob_match(self.pattern.name, msg.name):
            out.append(Change("removed", msg.name, msg.kind,
                              None if msg.flow == "*" else FlowID.parse(msg.flow)))
        return out

    def _expire(self, now: float) -> list[Change]:
        dead = [e for e, t in self._view.values() if t <= now]
        for e in dead:
            del self._view[e.key]
        return [Change("expired", e.name, e.kind, e.flow, e) for e in dead]

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> Change:
        if not self._started:
            await self.start()
        loop = asyncio.get_running_loop()
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            now = loop.time()
            self._pending.extend(self._expire(now))
            if self._pending:
                break
            next_expiry = min((t for _, t in self._view.values()), default=None)
            try:
                if next_expiry is None:
                    msg = await self._queue.get()
                else:
                    msg = await asyncio.wait_for(self._queue.get(), max(0.0, next_expiry - now))
            except TimeoutError:
                continue
            if msg is None:
                self._closed = True
                continue
            self._pending.extend(self._apply(msg, loop.time()))
        return self._pending.pop(0)

    async def close(self) -> None:
        self._closed = True
        self.client.watchers.discard(self)
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
        if self._listener is not None and not self.client.flow_client.closed:
            with contextlib.suppress(FlowError):
                await self.client.flow_client.unlisten(self._listener)

    async def __aenter__(self) -> Watcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
