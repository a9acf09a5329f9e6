"""DirectoryClient: register names, look them up with an expanding-ring search, watch changes.

The client needs no member nearby and no configuration beyond a router: it derives the
directory flow from the LSID (see :func:`flowdir.protocol.directory_flow`), sends
registrations and removals on it (every member within reach stores them), and sends queries
with a growing reach. Answers come back on a reply flow the client creates for itself, so
several lookups can run at once over one connection (they are told apart by query id).

**Expanding ring.** A lookup first asks with the smallest reach (TTL 1 reaches only the
applications on our own router; locality budget *v* stops where the link modifiers add up to
more than *v*), waits a short window for answers, and widens the reach (1, 2, 4, ... up to
the limit) only while nobody answered. The nearest match is therefore found first, and the
far members are never disturbed when a near one can answer. Members reached by a ring that
have nothing to say stay silent, except on the widest ring, where every member answers (also
with nothing): that is how "nothing matches" is told apart from "no member answered".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import flowlib
from flowlib import FlowClient, FlowError, FlowID, Listener, Locality

from . import protocol as P
from .watch import Change, Watcher

log = logging.getLogger("flowdir.client")

DEFAULT_TTL = 60.0  #: seconds an entry lives unless refreshed
DEFAULT_WINDOW = 0.5  #: seconds to collect answers per ring
DEFAULT_SETTLE = 0.15  #: once a ring answered, how much longer to wait for its other members
DEFAULT_MAX_RING = 32  #: the widest ring (TTL 32 is the routers' default reach)


class DirectoryError(FlowError):
    """Base class of the directory's own errors (a :class:`flowlib.FlowError` too)."""


class NoDirectoryMember(DirectoryError, TimeoutError):
    """No directory member answered, not even on the widest ring."""


class QueryRejected(DirectoryError):
    """Members answered the query with errors only; ``errors`` is [(member, text)]."""

    def __init__(self, errors: Sequence[tuple[str, str]]) -> None:
        self.errors = list(errors)
        detail = "; ".join(f"{m}: {t}" for m, t in self.errors)
        super().__init__(f"directory members rejected the query ({detail})")


@dataclass(frozen=True, slots=True)
class Match:
    """One entry found, with where it was found: the members that hold it and the ring
    (TTL or locality budget) of the query that reached them."""

    entry: P.Entry
    expires_in: float
    members: tuple[str, ...]
    ring: int

    @property
    def flow(self) -> FlowID:
        return self.entry.flow

    def to_json(self) -> dict[str, object]:
        out = self.entry.to_json(self.expires_in)
        out["members"] = list(self.members)
        out["ring"] = self.ring
        return out


@dataclass(slots=True)
class LookupResult:
    """What a lookup found and how: ``ring`` is the ring that answered (None if none did),
    ``rings`` every ring queried (one query message each), ``members`` everyone who
    answered, ``errors`` members' error answers."""

    pattern: P.Pattern
    matches: list[Match] = field(default_factory=list)
    ring: int | None = None
    rings: list[int] = field(default_factory=list)
    members: set[str] = field(default_factory=set)
    errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def flows(self) -> list[FlowID]:
        return [m.entry.flow for m in self.matches]

    @property
    def queries(self) -> int:
        return len(self.rings)

    def __bool__(self) -> bool:
        return bool(self.matches)

    def __len__(self) -> int:
        return len(self.matches)

    def __iter__(self) -> Iterator[Match]:
        return iter(self.matches)


class Registration:
    """A registered entry; with ``keep`` it is re-registered every ``refresh`` seconds until
    :meth:`cancel` (so it never expires while its owner lives, and expires soon after the
    owner dies)."""

    def __init__(self, client: DirectoryClient, entry: P.Entry, reach: P.Reach,
                 refresh: float | None) -> None:
        self.client = client
        self.entry = entry
        self.reach = reach
        self.refresh = refresh
        self.refreshes = 0
        #: why refreshing stopped early (e.g. the router connection was lost)
        self.error: FlowError | None = None
        self._task: asyncio.Task[None] | None = None
        if refresh is not None:
            self._task = asyncio.ensure_future(self._keep())

    @property
    def active(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _keep(self) -> None:
        assert self.refresh is not None
        while True:
            await asyncio.sleep(self.refresh)
            try:
                await self.client.send_register((self.entry,), self.reach)
                self.refreshes += 1
            except FlowError as exc:
                if self.client.flow_client.closed:  # the connection is gone for good
                    self.error = exc
                    log.warning("stopped refreshing %r: %s", self.entry.name, exc)
                    return
                # transient (e.g. the client is failing over to another router): the entry
                # outlives a missed refresh or two, so just try again next period
                log.info("refresh of %r failed, retrying: %s", self.entry.name, exc)

    async def cancel(self, remove: bool = True) -> None:
        """Stop refreshing; with *remove*, also withdraw the entry now instead of letting it
        expire."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        self.client.registrations.discard(self)
        if remove and not self.client.flow_client.closed:
            await self.client.remove(self.entry.name, kind=self.entry.kind,
                                     flow=self.entry.flow)

    async def wait(self) -> None:
        """Wait while refreshing (returns if it stops, e.g. the connection was lost)."""
        task = self._task
        if task is not None:
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.cancelled():  # it is us who were cancelled, not the refresher
                    raise




@dataclass(slots=True)
class _Found:
    """An entry being collected during a lookup (several members may report it)."""

    entry: P.Entry
    expires_in: float
    members: list[str]
    ring: int

    def add(self, member: str, expires_in: float, ring: int) -> None:
        if member not in self.members:
            self.members.append(member)
        self.expires_in = max(self.expires_in, expires_in)
        self.ring = min(self.ring, ring)


def directory_lsid(flow_client: FlowClient, lsid: int | None) -> int:
    """The LSID whose directory flow to use: *lsid*, else the one *flow_client*'s router
    suggests; FlowError when there is neither (members and clients alike need one)."""
    lsid = lsid if lsid is not None else flow_client.default_lsid
    if not lsid:
        raise FlowError(f"router {flow_client.router_name!r} suggests no LSID, so the "
                        "directory flow is unknown; pass its LSID (lsid=, flowdir --lsid)")
    return lsid


class DirectoryClient:
    """Register, look up, list, watch and remove directory entries over one flow client.

    Build it on a connected :class:`flowlib.FlowClient` or with :meth:`connect` (which owns
    and closes the connection). ``lsid`` picks the directory (default: the router's suggested
    LSID); ``owner`` is written into every entry registered here (default: the client name).
    ``stats`` counts queries sent, replies received and replies that came too late.
    """

    def __init__(self, flow_client: FlowClient, *, lsid: int | None = None,
                 owner: str | None = None, owns_client: bool = False) -> None:
        self.flow_client = flow_client
        self.lsid = directory_lsid(flow_client, lsid)
        self.flow = P.directory_flow(self.lsid)
        self.owner = owner if owner is not None else flow_client.name
        P.check_text(self.owner, "owner", empty_ok=True)
        self.stats: Counter[str] = Counter()
        self._owns_client = owns_client
        self._reply_flow: FlowID | None = None
        self._reply_listener: Listener | None = None
        self._reply_task: asyncio.Task[None] | None = None
        self._reply_lock = asyncio.Lock()
        self._waiting: dict[str, asyncio.Queue[P.Reply]] = {}
        #: live registrations and watchers (each adds and removes itself): re-sent and told
        #: about our own registrations when they happen
        self.registrations: set[Registration] = set()
        self.watchers: set[Watcher] = set()

    @classmethod
    async def connect(cls, routers: str | Sequence[str], *, name: str = "flowdir",
                      lsid: int | None = None, owner: str | None = None,
                      state_dir: str | None = None, timeout: float = 5.0,
                      connect_options: Mapping[str, Any] | None = None) -> DirectoryClient:
        """Connect to the first router in *routers* that answers (raises
        :class:`flowlib.ConnectError` naming each one and why, when none does).
        *connect_options* go to :func:`flowlib.connect` (``link_key``, ``capabilities``...)."""
        fc = await flowlib.connect(routers, name=name, timeout=timeout, state_dir=state_dir,
                                   **(connect_options or {}))
        try:
            return cls(fc, lsid=lsid, owner=owner, owns_client=True)
        except BaseException:
            await fc.close()
            raise

    async def close(self) -> None:
        """Stop refreshing (entries then expire by themselves), stop watchers, and close the
        connection if this client owns it."""
        for reg in list(self.registrations):
            await reg.cancel(remove=False)
        for w in list(self.watchers):
            await w.close()
        if self._reply_task is not None:
            self._reply_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reply_task
        if self._reply_listener is not None and not self._owns_client \
                and not self.flow_client.closed:
            with contextlib.suppress(FlowError):  # the connection stays; free the flow
                await self.flow_client.unlisten(self._reply_listener)
        if self._owns_client:
            await self.flow_client.close()

    async def __aenter__(self) -> DirectoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ registering
    async def send_register(self, entries: Sequence[P.Entry], reach: P.Reach) -> None:
        """Send a REGISTER of *entries* (a Registration's refresh uses it too)."""
        msg = P.Register(tuple(entries))
        await self.flow_client.send(self.flow, P.encode(msg), band=P.BAND_REGISTER,
                                    **reach.send_kwargs())
        self.stats["registers.sent"] += 1
        for w in list(self.watchers):
            w.inject(msg)

    async def register(self, name: str, flow: FlowID | str, ttl: float = DEFAULT_TTL, *,
                       kind: str = P.KIND_FLOW, attrs: Sequence[str] = (), keep: bool = False,
                       refresh: float | None = None, scope: P.Scope | None = None
                       ) -> Registration:
        """Register ``(name, flow, kind, *attrs)`` for *ttl* seconds.

        With *keep*, the entry is re-registered every *refresh* seconds (default ttl/3, so
        two refreshes may be lost before it expires) until the returned
        :class:`Registration` is cancelled or the client closes. *scope* limits which members
        store it: a TTL in router hops, or ``(Locality.GEOGRAPHY, 2)`` and the like (default:
        every member). Registration is a broadcast without acknowledgement; look the name up
        to confirm it was stored.
        """
        if isinstance(flow, str):
            flow = P.check_flow(flow)
        entry = P.Entry(name, flow, kind, tuple(attrs), self.owner, P.check_ttl(ttl),
                        scoped=scope is not None)
        reach = P.Reach.of(scope)
        if keep:
            refresh = refresh if refresh is not None else max(0.05, entry.ttl / 3)
        else:
            refresh = None
        await self.send_register((entry,), reach)
        reg = Registration(self, entry, reach, refresh)
        if keep:
            self.registrations.add(reg)
        return reg

    async def register_ls(self, lsid: int, flow: FlowID | str, ttl: float = DEFAULT_TTL,
                          **kwargs: object) -> Registration:
        """Register the flow of location service *lsid* (kind ``ls``, name ``0x..``)."""
        return await self.register(f"{lsid:#x}", flow, ttl, kind=P.KIND_LS,
                                   **kwargs)  # type: ignore[arg-type]

    async def remove(self, name: str, *, kind: str = "*", flow: FlowID | str = "*",
                     scope: P.Scope | None = None) -> None:
        """Withdraw the entries named exactly *name* (optionally only one kind or flow) from
        every member in reach, and stop refreshing them here."""
        P.check_name(name)
        if kind != "*":
            P.check_kind(kind)
        flow_text = "*" if flow == "*" else str(P.check_flow(flow))
        msg = P.Remove(name, kind, flow_text, self.owner)
        for reg in list(self.registrations):
            if msg.matches(reg.entry):
                await reg.cancel(remove=False)
        await self.flow_client.send(self.flow, P.encode(msg), band=P.BAND_REMOVE,
                                    **P.Reach.of(scope).send_kwargs())
        self.stats["removes.sent"] += 1
        for w in list(self.watchers):
            w.inject(msg)

    # ------------------------------------------------------------------ querying
    async def _ensure_reply_flow(self) -> FlowID:
        async with self._reply_lock:
            if self._reply_flow is None:
                flow = await self.flow_client.create(self.lsid)
                self._reply_listener = await self.flow_client.listen(flow, P.BAND_REPLY,
                                                                     size=4096)
                self._reply_flow = flow
                self._reply_task = asyncio.ensure_future(self._read_replies(
                    self._reply_listener))
            return self._reply_flow

    async def _read_replies(self, listener: Listener) -> None:
        try:
            async for msg in listener:
                try:
                    reply = P.decode(msg.payload, expect="reply")
                except P.ProtocolError as exc:
                    self.stats["malformed.reply"] += 1
                    log.info("malformed directory reply: %s", exc)
                    continue
                assert isinstance(reply, P.Reply)
                self.stats["replies"] += 1
                queue = self._waiting.get(reply.qid)
                if queue is None:
                    self.stats["replies.late"] += 1
                else:
                    queue.put_nowait(reply)
        except FlowError as exc:
            log.info("directory replies stopped: %s", exc)

    @staticmethod
    def make_pattern(pattern: P.Pattern | str, kind: str = "*", flow: FlowID | str = "*",
                     owner: str = "*", attrs: Sequence[str] = ()) -> P.Pattern:
        if isinstance(pattern, P.Pattern):
            return pattern
        return P.Pattern(pattern, str(flow), kind, owner, tuple(attrs))

    async def lookup(self, pattern: P.Pattern | str = "*", *, kind: str = "*",
                     flow: FlowID | str = "*", owner: str = "*", attrs: Sequence[str] = (),
                     ring_type: Locality | str = Locality.NONE,
                     rings: Sequence[int] | None = None, first_ring: int = 1,
                     max_ring: int = DEFAULT_MAX_RING, expanding: bool = True,
                     window: float = DEFAULT_WINDOW, settle: float = DEFAULT_SETTLE
                     ) -> LookupResult:
        """Find entries matching *pattern* (a name glob, plus exact-or-``*`` fields), nearest
        first.

        *ring_type* is ``Locality.NONE`` for rings of TTL (router hops) or a locality type
        (rings of that budget). *rings* defaults to ``first_ring, 2*first_ring, ...,
        max_ring``; with ``expanding=False`` only *max_ring* is asked. Each ring collects
        answers for *window* seconds (cut to *settle* seconds after its first answer), and
        the search stops at the first ring that found something.

        Returns a :class:`LookupResult` (empty when members answered but nothing matched);
        raises :class:`NoDirectoryMember` when no member answered at all, and
        :class:`QueryRejected` when the members only answered with errors.
        """
        pat = self.make_pattern(pattern, kind, flow, owner, attrs)
        loc = parse_ring_type(ring_type)
        if rings is None:
            ring_list = expanding_or_not(first_ring, max_ring, expanding)
        else:
            ring_list = [int(r) for r in rings]
            if not ring_list:
                raise ValueError("rings must name at least one ring")
        return await self._search(pat, loc, ring_list, window, settle)

    async def list(self, pattern: P.Pattern | str = "*", *, kind: str = "*",
                   ring_type: Locality | str = Locality.NONE, max_ring: int = DEFAULT_MAX_RING,
                   window: float = 1.0) -> LookupResult:
        """Every entry matching *pattern* held by any member within *max_ring*: one query on
        the widest ring, collecting for the whole *window* (no early stop)."""
        pat = self.make_pattern(pattern, kind)
        return await self._search(pat, parse_ring_type(ring_type), [max_ring], window, window)

    async def _search(self, pat: P.Pattern, loc: Locality, rings: Sequence[int], window: float,
                      settle: float) -> LookupResult:
        reply_flow = await self._ensure_reply_flow()
        loop = asyncio.get_running_loop()
        qid = secrets.token_hex(8)
        queue: asyncio.Queue[P.Reply] = asyncio.Queue()
        self._waiting[qid] = queue
        result = LookupResult(pat)
        found: dict[tuple[str, str, FlowID], _Found] = {}
        try:
            for i, ring in enumerate(rings):
                last = i == len(rings) - 1
                query = P.Query(qid, reply_flow, pat, min(ring, 255), empty=last)
                reach = P.Reach.ring(loc, ring)
                await self.flow_client.send(self.flow, P.encode(query), band=P.BAND_QUERY,
                                            **reach.send_kwargs())
                self.stats["queries.sent"] += 1
                result.rings.append(ring)
                deadline = loop.time() + window
                answered = False
                while (left := deadline - loop.time()) > 0:
                    try:
                        reply = await asyncio.wait_for(queue.get(), left)
                    except TimeoutError:
                        break
                    result.members.add(reply.member)
                    if reply.error is not None:
                        result.errors.append((reply.member, reply.error))
                        continue
                    for entry, expires_in in reply.matches:
                        if not pat.matches(entry):  # a member must not make us lie
                            self.stats["replies.mismatch"] += 1
                            continue
                        slot = found.get(entry.key)
                        if slot is None:
                            found[entry.key] = _Found(entry, expires_in, [reply.member],
                                                      reply.ring)
                        else:
                            slot.add(reply.member, expires_in, reply.ring)
                    # A ring that found something, or the widest ring once anyone answered
                    # (there every member answers, matches or not), need only wait for the
                    # stragglers of the same ring.
                    if (reply.matches or last) and not answered:
                        answered = True
                        deadline = min(deadline, loop.time() + settle)
                if found:
                    result.ring = ring
                    break
        finally:
            del self._waiting[qid]
        result.matches = sorted(
            (Match(f.entry, f.expires_in, tuple(f.members), f.ring) for f in found.values()),
            key=lambda m: (m.ring, m.entry.name, m.entry.kind, m.entry.flow))
        if not result.members:
            raise NoDirectoryMember(
                f"no directory member answered on {self.flow} (LSID {self.lsid:#x}) within "
                f"{window * len(rings):g}s (rings {', '.join(map(str, rings))}"
                f"{'' if loc is Locality.NONE else ' of ' + loc.name.lower()})")
        if not result.matches and result.errors:
            raise QueryRejected(result.errors)
        return result

    def watch(self, pattern: P.Pattern | str = "*", *, kind: str = "*", initial: bool = False,
              list_window: float = 1.0) -> Watcher:
        """Changes to entries matching *pattern*, as an async iterator of :class:`Change`.

        With *initial*, the entries already registered come first (as ``present``).
        """
        return Watcher(self, self.make_pattern(pattern, kind), initial, list_window)


def parse_ring_type(value: Locality | str | int) -> Locality:
    """``Locality.NONE`` (or ``"ttl"``/``"hops"``) means rings of TTL; otherwise a
    locality type by member or name (``"geography"``, ...)."""
    if isinstance(value, str) and value.strip().lower() in ("ttl", "hops"):
        return Locality.NONE
    return Locality.parse(value)


def expanding_or_not(first_ring: int, max_ring: int, expanding: bool) -> list[int]:
    if not expanding:
        return [max_ring]
    return P.expanding_rings(first_ring, max_ring)


__all__ = ["DirectoryClient", "DirectoryError", "NoDirectoryMember", "QueryRejected", "Match",
           "LookupResult", "Change", "Registration", "Watcher", "DEFAULT_TTL",
           "DEFAULT_WINDOW", "DEFAULT_SETTLE", "DEFAULT_MAX_RING"]
