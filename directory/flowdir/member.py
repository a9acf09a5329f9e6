"""DirectoryMember: the process role that holds directory entries and answers queries.

A member joins the directory flow on the register, remove and query bands. Registrations and
removals are broadcast on that flow, so every member within the registration's reach stores
every entry; a query travels only as far as its reach (TTL or locality), and the members it
reaches answer on the query's reply flow. Nothing is ever pushed to a member it did not hear:
entries live for the ``ttl`` their owner granted and are dropped when it runs out, so an owner
that dies disappears from the directory by itself, and a member that joins late catches up
from its neighbours (one ``sync`` query) and from the owners' refreshes.

A member can be embedded in any application (``await DirectoryMember.connect(...)``) or run
on its own with ``flowdir serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import flowlib
from flowlib import FlowClient, FlowError, FlowID, Listener, Message

from . import protocol as P
from .client import directory_lsid

log = logging.getLogger("flowdir.member")

Clock = Callable[[], float]
#: What a store update did to the entry it was given.
ADDED, UPDATED, REFRESHED, REFUSED = "added", "updated", "refreshed", "refused"


@dataclass(slots=True)
class Stored:
    entry: P.Entry
    expires_at: float


class EntryStore:
    """The entries one member holds, keyed by (name, kind, flow), each with its deadline.

    Separate from the network side so it can be tested alone, shared by a member that
    reconnects (``flowdir serve`` keeps its entries across a lost router), and given a fake
    clock.
    """

    def __init__(self, clock: Clock = time.monotonic, max_entries: int = 100_000,
                 max_ttl: float = P.MAX_TTL_SECONDS) -> None:
        self.clock = clock
        self.max_entries = max_entries
        self.max_ttl = max_ttl
        self._items: dict[tuple[str, str, FlowID], Stored] = {}
        #: name -> keys, so the common query (an exact name) does not scan every entry
        self._by_name: dict[str, set[tuple[str, str, FlowID]]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def put(self, entry: P.Entry, lifetime: float | None = None) -> str:
        """Store or refresh *entry* for *lifetime* seconds (default: its ttl, capped at
        ``max_ttl``). Returns ADDED, UPDATED (owner/attrs/ttl changed), REFRESHED or REFUSED
        (the store is full: a flood of registrations must not exhaust the member)."""
        now = self.clock()
        life = min(entry.ttl if lifetime is None else lifetime, self.max_ttl)
        old = self._items.get(entry.key)
        if old is None:
            if len(self._items) >= self.max_entries:
                self.sweep()
                if len(self._items) >= self.max_entries:
                    return REFUSED
            self._items[entry.key] = Stored(entry, now + life)
            self._by_name.setdefault(entry.name, set()).add(entry.key)
            return ADDED
        if old.expires_at <= now:
            old.entry, old.expires_at = entry, now + life
            return ADDED
        changed = old.entry != entry
        old.entry = entry
        old.expires_at = max(old.expires_at, now + life) if lifetime is not None \
            else now + life
        return UPDATED if changed else REFRESHED

    def _drop(self, entry: P.Entry) -> None:
        del self._items[entry.key]
        keys = self._by_name.get(entry.name)
        if keys is not None:
            keys.discard(entry.key)
            if not keys:
                del self._by_name[entry.name]

    def remove(self, spec: P.Remove) -> list[P.Entry]:
        keys = self._by_name.get(spec.name, set())
        gone = [self._items[k].entry for k in keys if spec.matches(self._items[k].entry)]
        for entry in gone:
            self._drop(entry)
        return gone

    def match(self, pattern: P.Pattern, unscoped_only: bool = False
              ) -> list[tuple[P.Entry, float]]:
        """Live entries matching *pattern*, each with the seconds it has left."""
        now = self.clock()
        out = []
        if not any(c in pattern.name for c in "*?\\"):
            candidates = [self._items[k] for k in self._by_name.get(pattern.name, ())]
        else:
            candidates = list(self._items.values())
        for s in candidates:
            if s.expires_at > now and pattern.matches(s.entry) \
                    and not (unscoped_only and s.entry.scoped):
                out.append((s.entry, s.expires_at - now))
        out.sort(key=lambda item: (item[0].name, item[0].kind, item[0].flow))
        return out

    def sweep(self) -> list[P.Entry]:
        """Drop every entry whose time is up; returns them."""
        now = self.clock()
        dead = [s.entry for s in self._items.values() if s.expires_at <= now]
        for entry in dead:
            self._drop(entry)
        return dead


def _rate_limited(count: int) -> bool:
    """Log the 1st, 2nd, 4th, 8th... occurrence: visible, but a flood cannot fill the log."""
    return count & (count - 1) == 0


class DirectoryMember:
    """Joins the directory flow, stores what is registered, answers queries, expires entries.

    Construct it on a connected :class:`flowlib.FlowClient` and ``await start()``, or use
    :meth:`connect`, which also owns (and closes) the connection. ``stats`` counts everything
    it did and everything it refused (``malformed.<op>``, ``refused.full``), so a member under
    a flood of bad messages says so instead of failing quietly.
    """

    def __init__(self, flow_client: FlowClient, *, name: str | None = None,
                 lsid: int | None = None, store: EntryStore | None = None,
                 clock: Clock = time.monotonic, sweep_interval: float = 1.0,
                 sync: bool = True, sync_window: float = 1.0, owns_client: bool = False
                 ) -> None:
        self.client = flow_client
        self.lsid = directory_lsid(flow_client, lsid)
        self.flow = P.directory_flow(self.lsid)
        self.name = name or f"member-{secrets.token_hex(3)}@{flow_client.router_name}"
        P.check_text(self.name, "member name")
        self.store = store if store is not None else EntryStore(clock)
        self.sweep_interval = sweep_interval
        self.sync_enabled = sync
        self.sync_window = sync_window
        self.stats: Counter[str] = Counter()
        self._owns_client = owns_client
        self._listener: Listener | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        #: set once the first sync finished (or was skipped): for tests and for `serve` output
        self.synced = asyncio.Event()

    @classmethod
    async def connect(cls, routers: str | Sequence[str], *, name: str | None = None,
                      lsid: int | None = None, state_dir: str | None = None,
                      timeout: float = 5.0, connect_options: Mapping[str, Any] | None = None,
                      **kwargs: object) -> DirectoryMember:
        """Connect to the first router that answers, join the directory and start serving.
        *connect_options* go to :func:`flowlib.connect` (``link_key``, ``capabilities``...)."""
        fc = await flowlib.connect(routers, name=name or "flowdir-member", timeout=timeout,
                                   state_dir=state_dir, **(connect_options or {}))
        try:
            member = cls(fc, name=name, lsid=lsid, owns_client=True,
                         **kwargs)  # type: ignore[arg-type]
            await member.start()
        except BaseException:
            await fc.close()
            raise
        return member

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Join the directory flow (returns once the router acknowledged) and start serving."""
        self._listener = await self.client.listen(self.flow, list(P.MEMBER_BANDS), size=4096)
        self._tasks.append(asyncio.ensure_future(self._serve(self._listener)))
        self._tasks.append(asyncio.ensure_future(self._sweeper()))
        if self.sync_enabled:
            self._tasks.append(asyncio.ensure_future(self._sync()))
        else:
            self.synced.set()
        log.info("directory member %s serving %s via router %s", self.name, self.flow,
                 self.client.router_name)

    async def stop(self) -> None:
        """Leave the directory (the entries are kept in ``store``) and close an owned client."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        if self._listener is not None and not self.client.closed:
            with contextlib.suppress(FlowError):
                await self.client.unlisten(self._listener)
        if self._owns_client:
            await self.client.close()
        self._stopped.set()

    async def wait_closed(self) -> None:
        """Return when the member stops serving: stopped, or its router connection lost."""
        lost = asyncio.ensure_future(self.client.wait_closed())
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait([lost, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            stopped.cancel()

    async def __aenter__(self) -> DirectoryMember:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def entries(self, pattern: P.Pattern | str = "*") -> list[tuple[P.Entry, float]]:
        """What this member holds now (entries matching *pattern*, with seconds left)."""
        if isinstance(pattern, str):
            pattern = P.Pattern(pattern)
        return self.store.match(pattern)

    # ------------------------------------------------------------------ serving
    async def _serve(self, listener: Listener) -> None:
        try:
            async for msg in listener:
                try:
                    await self._handle(msg)
                except flowlib.ConnectionLost:
                    raise
                except FlowError as exc:  # e.g. a reply too large for the link
                    self.stats["reply.failed"] += 1
                    log.info("member %s: could not answer: %s", self.name, exc)
                except Exception:  # a bug here must not take the whole member down
                    self.stats["errors.internal"] += 1
                    log.exception("member %s: failed to handle a message on band %d",
                                  self.name, msg.band)
        except flowlib.ConnectionLost as exc:
            log.warning("member %s: %s", self.name, exc)

    async def _handle(self, msg: Message) -> None:
        band = msg.band
        op = {P.BAND_REGISTER: "register", P.BAND_REMOVE: "remove",
              P.BAND_QUERY: "query"}.get(band)
        if op is None:
            self.stats["ignored.band"] += 1
            return
        try:
            decoded = P.decode(msg.payload, expect=op,
                               limit=P.MAX_QUERY_BYTES if op == "query" else None)
        except P.ProtocolError as exc:
            await self._malformed(op, msg.payload, exc)
            return
        if isinstance(decoded, P.Register):
            self._register(decoded)
        elif isinstance(decoded, P.Remove):
            gone = self.store.remove(decoded)
            self.stats["removes"] += 1
            self.stats["entries.removed"] += len(gone)
        elif isinstance(decoded, P.Query):
            await self._answer(decoded)

    def _register(self, reg: P.Register) -> None:
        self.stats["registers"] += 1
        for entry in reg.entries:
            outcome = self.store.put(entry)
            self.stats[f"entries.{outcome}"] += 1
            if outcome == REFUSED and _rate_limited(self.stats["entries.refused"]):
                log.warning("member %s: store full (%d entries); refused %r", self.name,
                            len(self.store), entry.name)

    async def _malformed(self, op: str, payload: bytes, exc: P.ProtocolError) -> None:
        """Count and log a bad message; answer it when it is a query we can answer.

        Only queries carry a reply flow; a bad register or remove has nobody to tell, so the
        counter and the log are all there is.
        """
        key = f"malformed.{op}"
        self.stats[key] += 1
        if _rate_limited(self.stats[key]):
            log.warning("member %s: malformed %s (%s): %s [%d so far]", self.name, op,
                        exc.reason, exc.detail, self.stats[key])
        if op != "query":
            return
        reply, qid = P.salvage_reply(payload)
        if reply is None:
            self.stats["malformed.unanswerable"] += 1
            return
        body = P.encode(P.Reply(qid, self.name, error=f"malformed query: {exc.detail}"))
        await self.client.send(reply, body, band=P.BAND_REPLY)
        self.stats["errors.sent"] += 1

    async def _answer(self, q: P.Query) -> None:
        self.stats["sync-queries" if q.sync else "queries"] += 1
        matches = self.store.match(q.pattern, unscoped_only=q.sync)
        if not matches and not q.empty:
            return
        limit = min(self.client.max_payload, 60_000)
        for body in P.encode_replies(q.qid, self.name, matches, q.ring, limit):
            await self.client.send(q.reply, body, band=P.BAND_REPLY)
            self.stats["replies.sent"] += 1
        self.stats["matches.sent"] += len(matches)

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            dead = self.store.sweep()
            if dead:
                self.stats["entries.expired"] += len(dead)
                log.debug("member %s: %d entries expired", self.name, len(dead))

    async def _sync(self) -> None:
        """Catch up with the members already serving: ask them for every entry that was
        registered without a scope, and keep those for the time they have left."""
        try:
            reply_flow = await self.client.create(self.lsid)
            listener = await self.client.listen(reply_flow, P.BAND_REPLY, size=4096)
        except (FlowError, OSError, ValueError) as exc:
            log.warning("member %s: cannot sync with the other members: %s", self.name, exc)
            self.synced.set()
            return
        try:
            qid = secrets.token_hex(8)
            await self.client.send(self.flow, P.encode(P.Query(
                qid, reply_flow, P.Pattern(), sync=True)), band=P.BAND_QUERY)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.sync_window
            while (left := deadline - loop.time()) > 0:
                try:
                    msg = await asyncio.wait_for(listener.get(), left)
                except TimeoutError:
                    break
                try:
                    reply = P.decode(msg.payload, expect="reply")
                except P.ProtocolError:
                    self.stats["malformed.sync-reply"] += 1
                    continue
                if not isinstance(reply, P.Reply) or reply.qid != qid or reply.error:
                    continue
                for entry, left_s in reply.matches:
                    if not entry.scoped and self.store.put(entry, left_s) == ADDED:
                        self.stats["entries.synced"] += 1
        except FlowError as exc:
            log.warning("member %s: sync failed: %s", self.name, exc)
        finally:
            self.synced.set()
            with contextlib.suppress(FlowError):
                await self.client.unlisten(listener)


__all__ = ["DirectoryMember", "EntryStore", "ADDED", "UPDATED", "REFRESHED", "REFUSED"]
