"""Heartbeats on a flow: who is there, who went quiet, who is gone.

Every member runs a :class:`Heartbeat` on the flow: it multicasts a small beat on
:data:`~flowrouter.wire.bands.BAND_HEARTBEAT` (16) every ``period`` seconds, listens to the band,
and keeps a table of the peers it hears. A peer's state follows the time since it was last
heard, measured in *its* announced period (so members with different periods judge each other
fairly):

==============  ===============================================================================
state           when
==============  ===============================================================================
``alive``       heard within ``suspect_after`` periods (default 1.5: one beat may be late)
``suspected``   silent for ``suspect_after`` periods or more
``dead``        silent for ``missed`` periods or more (default 3)
``left``        it said goodbye (a beat flagged LEAVING, sent by :meth:`Heartbeat.stop`)
==============  ===============================================================================

The defaults are seed 003's: a beat every 2 s, a site not heard from for 3 intervals (6 s) is
disconnected. A peer that is heard again becomes ``alive`` again (a restarted peer, recognised
by a new incarnation number, is reported as such). Changes are reported through an
``on_change`` callback and through ``async for change in heartbeat.changes()``; the current
table is :attr:`Heartbeat.peers`.

Seed 003 also counts *any* message from a site as a sign of life; an application that
receives data from a peer can say so with :meth:`Heartbeat.saw` (e.g. a chat that knows
which member sent a message), so a busy peer is never suspected for beats lost in a burst.

The clock is injectable (``clock=``): the tracker (:class:`PeerTracker`) is sans-I/O, and
``Heartbeat.start(run=False)`` lets a test drive time by calling :meth:`Heartbeat.tick`.

Payload of a heartbeat (network byte order)::

    "HB" | version = 1 (1) | flags (1) | incarnation (4) | sequence (4) | period in ms (4)
         | name length (1) | name (UTF-8) | data length (2) | data

* ``flags``: bit 0 LEAVING (the sender is stopping: mark it ``left`` at once);
* ``incarnation``: random per :class:`Heartbeat` instance, so a restarted member is told
  apart from a late beat of its previous life;
* ``sequence``: beats sent by this incarnation, from 0 (gaps are counted as lost beats);
* ``period``: the sender's period, which receivers use to judge its silence;
* ``name``: the member's name (defaults to the client's name), at most 255 bytes;
* ``data``: opaque application bytes carried on every beat (e.g. a Lamport clock, as the chat
  of seed 003 needs heartbeats to advance its knowledge of other sites' clocks), at most
  65535 bytes; the receiver keeps the latest as ``Peer.data``.

Payloads that do not parse are counted (``heartbeat.bad``) and ignored, so other traffic on
band 16 cannot confuse the tracker.

What a beat can make a receiver believe is bounded: a beat is the sender's own claim (its
name is not authenticated: anyone on the flow may beat under any name, so names are only as
trustworthy as who may send on the flow, see capabilities), the period it announces is held
to :data:`MAX_PERIOD` (a peer cannot make itself impossible to suspect), and the table keeps
at most ``max_peers`` names (:data:`DEFAULT_MAX_PEERS`): a new name past it takes the place
of the longest-silent dead or departed peer, or is refused and counted
(``PeerTracker.refused``, ``heartbeat.counters["refused"]``).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from flowrouter.wire.bands import BAND_HEARTBEAT
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import DEFAULT_TTL

from .errors import ConnectionLost, FailoverInProgress, FlowError, ListenerClosed
from .queue import Listener

if TYPE_CHECKING:
    from .client import FlowClient, LocalitySpec

log = logging.getLogger("flowlib.heartbeat")

HB_MAGIC = b"HB"
HB_VERSION = 1
FLAG_LEAVING = 0x01
_FIXED = struct.Struct("!2sBBIII")  # magic, version, flags, incarnation, seq, period ms
DEFAULT_PERIOD = 2.0
#: the longest period a peer may announce (seconds); a longer one counts as this
MAX_PERIOD = 600.0
#: names one tracker keeps at most, by default
DEFAULT_MAX_PEERS = 4096
DEFAULT_MISSED = 3
DEFAULT_SUSPECT_AFTER = 1.5


class PeerState(enum.StrEnum):
    ALIVE = "alive"
    SUSPECTED = "suspected"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True, slots=True)
class Beat:
    """One decoded heartbeat."""

    name: str
    seq: int
    period: float
    incarnation: int
    leaving: bool = False
    data: bytes = b""


def encode_beat(beat: Beat) -> bytes:
    name = beat.name.encode("utf-8")
    if len(name) > 255:
        raise ValueError("heartbeat name is longer than 255 bytes in UTF-8")
    if len(beat.data) > 0xFFFF:
        raise ValueError("heartbeat data is longer than 65535 bytes")
    period_ms = max(1, min(0xFFFFFFFF, round(beat.period * 1000)))
    return (_FIXED.pack(HB_MAGIC, HB_VERSION, FLAG_LEAVING if beat.leaving else 0,
                        beat.incarnation, beat.seq & 0xFFFFFFFF, period_ms)
            + bytes([len(name)]) + name + len(beat.data).to_bytes(2, "big") + beat.data)


def decode_beat(payload: bytes | memoryview) -> Beat:
    """Parse a heartbeat payload; ValueError says what is wrong."""
    raw = bytes(payload)
    if len(raw) < _FIXED.size + 3:
        raise ValueError(f"heartbeat of {len(raw)} bytes is too short")
    magic, version, flags, inc, seq, period_ms = _FIXED.unpack_from(raw)
    if magic != HB_MAGIC:
        raise ValueError("not a heartbeat (bad magic)")
    if version != HB_VERSION:
        raise ValueError(f"heartbeat version {version} is not supported")
    if period_ms == 0:
        raise ValueError("heartbeat period of 0")
    pos = _FIXED.size
    n = raw[pos]
    pos += 1
    if len(raw) < pos + n + 2:
        raise ValueError("heartbeat truncated in its name")
    try:
        name = raw[pos:pos + n].decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("heartbeat name is not UTF-8") from None
    pos += n
    m = int.from_bytes(raw[pos:pos + 2], "big")
    pos += 2
    if len(raw) != pos + m:
        raise ValueError("heartbeat data length does not match the payload")
    if not name:
        raise ValueError("heartbeat without a name")
    return Beat(name, seq, period_ms / 1000, inc, bool(flags & FLAG_LEAVING), raw[pos:])


@dataclass(slots=True)
class Peer:
    """What we know of one member (a snapshot is attached to every change)."""

    name: str
    state: PeerState
    incarnation: int
    seq: int
    period: float
    first_seen: float
    last_seen: float
    beats: int = 0  #: heartbeats received from this incarnation
    lost: int = 0  #: heartbeats missing from its sequence (lost or late)
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """A peer changed state. ``old`` is None for a peer heard for the first time."""

    peer: str
    old: PeerState | None
    new: PeerState
    at: float
    restarted: bool = False  #: a new incarnation of a peer we knew
    info: Peer | None = field(default=None, compare=False)


class PeerTracker:
    """The sans-I/O peer table: feed it beats and the time, ask it for state changes."""

    def __init__(self, missed: float = DEFAULT_MISSED,
                 suspect_after: float | None = None,
                 max_peers: int = DEFAULT_MAX_PEERS) -> None:
        if isinstance(max_peers, bool) or not isinstance(max_peers, int) or max_peers < 1:
            raise ValueError(f"max_peers must be a positive integer, got {max_peers!r}")
        if not missed > 0:
            raise ValueError(f"missed must be positive, got {missed!r}")
        if suspect_after is None:
            suspect_after = min(DEFAULT_SUSPECT_AFTER, missed)
        if not 0 < suspect_after <= missed:
            raise ValueError(f"suspect_after must be in (0, missed], got {suspect_after!r}")
        self.missed = missed
        self.suspect_after = suspect_after
        self.max_peers = max_peers
        self.peers: dict[str, Peer] = {}
        #: beats from new names refused because the table was full of live peers
        self.refused = 0

    def _change(self, peer: Peer, old: PeerState | None, new: PeerState, now: float,
                restarted: bool = False) -> MembershipChange:
        peer.state = new
        return MembershipChange(peer.name, old, new, now, restarted, replace(peer))

    def _room(self) -> bool:
        """Whether a new name fits: evict the longest-silent dead or departed peer if the
        table is full."""
        if len(self.peers) < self.max_peers:
            return True
        gone = [p for p in self.peers.values() if p.state in (PeerState.DEAD, PeerState.LEFT)]
        if not gone:
            self.refused += 1
            return False
        del self.peers[min(gone, key=lambda p: p.last_seen).name]
        return True

    def observe(self, beat: Beat, now: float) -> list[MembershipChange]:
        """A heartbeat from *beat.name* arrived at *now*."""
        peer = self.peers.get(beat.name)
        period = min(beat.period, MAX_PERIOD)
        if peer is None:
            if not self._room():
                return []
            peer = self.peers[beat.name] = Peer(beat.name, PeerState.ALIVE, beat.incarnation,
                                                beat.seq, period, now, now, 1, 0, beat.data)
            if beat.leaving:
                return [self._change(peer, None, PeerState.LEFT, now)]
            return [self._change(peer, None, PeerState.ALIVE, now)]
        restarted = beat.incarnation != peer.incarnation
        if restarted:
            peer.incarnation, peer.seq, peer.beats, peer.lost = beat.incarnation, beat.seq, 0, 0
            peer.first_seen = now
        elif beat.seq > peer.seq:
            peer.lost += beat.seq - peer.seq - 1
            peer.seq = beat.seq
        elif peer.state is PeerState.LEFT and not beat.leaving:
            return []  # a beat overtaken by its sender's goodbye
        peer.beats += 1
        peer.last_seen = now
        peer.period = period
        peer.data = beat.data
        old = peer.state
        new = PeerState.LEFT if beat.leaving else PeerState.ALIVE
        if new is not old or restarted:
            return [self._change(peer, old, new, now, restarted)]
        return []

    def saw(self, name: str, now: float) -> list[MembershipChange]:
        """Any other sign of life from a known peer (seed 003 counts every message)."""
        peer = self.peers.get(name)
        if peer is None or peer.state is PeerState.LEFT:
            return []
        peer.last_seen = max(peer.last_seen, now)
        if peer.state is not PeerState.ALIVE:
            return [self._change(peer, peer.state, PeerState.ALIVE, now)]
        return []

    def check(self, now: float) -> list[MembershipChange]:
        """Move peers along alive -> suspected -> dead by their silence at *now*."""
        out: list[MembershipChange] = []
        for peer in self.peers.values():
            if peer.state in (PeerState.DEAD, PeerState.LEFT):
                continue
            silent = (now - peer.last_seen) / peer.period
            if silent >= self.missed:
                out.append(self._change(peer, peer.state, PeerState.DEAD, now))
            elif silent >= self.suspect_after and peer.state is PeerState.ALIVE:
                out.append(self._change(peer, peer.state, PeerState.SUSPECTED, now))
        return out

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`check` may change something."""
        best: float | None = None
        for peer in self.peers.values():
            if peer.state is PeerState.ALIVE:
                t = peer.last_seen + self.suspect_after * peer.period
            elif peer.state is PeerState.SUSPECTED:
                t = peer.last_seen + self.missed * peer.period
            else:
                continue
            best = t if best is None or t < best else best
        return best


ChangeHook = Callable[[MembershipChange], Any]


class ChangeStream:
    """An async iterator of :class:`MembershipChange` (made by :meth:`Heartbeat.changes`)."""

    def __init__(self, queue: asyncio.Queue[MembershipChange | None], done: bool,
                 unsubscribe: Callable[[asyncio.Queue[MembershipChange | None]], None]) -> None:
        self._queue = queue
        self._done = done
        self._unsubscribe = unsubscribe

    def __aiter__(self) -> ChangeStream:
        return self

    async def __anext__(self) -> MembershipChange:
        if self._done and self._queue.empty():
            raise StopAsyncIteration
        ch = await self._queue.get()
        if ch is None:
            self.close()
            raise StopAsyncIteration
        return ch

    def close(self) -> None:
        self._done = True
        self._unsubscribe(self._queue)


class Heartbeat:
    """Send heartbeats on *flow* and track the peers that send them.

    ::

        async with Heartbeat(client, flow, name="site-a") as hb:
            async for change in hb.changes():
                print(change.peer, change.old, "->", change.new)

    *period* (seconds) between beats; a peer is dead after *missed* of its periods without a
    beat (suspected after *suspect_after*); *name* identifies us (default the client's name;
    names must be unique among the members); *data* is carried on every beat (bytes, or a
    function returning bytes, called at each beat); *send* False only listens; *clock*
    replaces :func:`time.monotonic` (for tests, with ``start(run=False)`` and :meth:`tick`);
    *on_change* is called (may be a coroutine function) with every :class:`MembershipChange`;
    *max_peers* bounds the peer table (see the module docs).
    """

    def __init__(self, client: FlowClient, flow: FlowID | str, *,
                 period: float = DEFAULT_PERIOD, missed: float = DEFAULT_MISSED,
                 name: str | None = None, suspect_after: float | None = None,
                 data: bytes | Callable[[], bytes] = b"", send: bool = True,
                 clock: Callable[[], float] | None = None,
                 on_change: ChangeHook | None = None, locality: LocalitySpec = None,
                 ttl: int = DEFAULT_TTL, queue_size: int = 1024,
                 max_peers: int = DEFAULT_MAX_PEERS) -> None:
        if not period > 0:
            raise ValueError(f"period must be positive, got {period!r}")
        self.client = client
        self.flow = FlowID.parse(flow) if isinstance(flow, str) else flow
        self.period = period
        self.name = name or client.name
        if not 0 < len(self.name.encode("utf-8")) <= 255:
            raise ValueError("heartbeat name must be 1..255 bytes in UTF-8")
        self.tracker = PeerTracker(missed, suspect_after, max_peers)
        self.data = data
        self.sending = send
        self.clock = clock or time.monotonic
        self.on_change = on_change
        self.locality = locality
        self.ttl = ttl
        self.queue_size = queue_size
        self.incarnation = secrets.randbits(32)
        self.seq = 0
        #: beats sent, beats skipped (no router during a failover), bad payloads, ...
        self.counters: dict[str, int] = {"sent": 0, "skipped": 0, "received": 0, "bad": 0,
                                         "refused": 0}
        self.listener: Listener | None = None
        self._next_beat: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribers: list[asyncio.Queue[MembershipChange | None]] = []
        self._wake = asyncio.Event()
        self._stopped = False

    # --- views -----------------------------------------------------------------------------
    @property
    def peers(self) -> dict[str, Peer]:
        """Every peer heard so far, by name (live objects: copy what you keep)."""
        return self.tracker.peers

    def alive(self) -> list[str]:
        """Names of the peers currently alive (not suspected, dead or gone)."""
        return sorted(n for n, p in self.tracker.peers.items() if p.state is PeerState.ALIVE)

    def state(self, peer: str) -> PeerState | None:
        p = self.tracker.peers.get(peer)
        return p.state if p else None

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self, *, run: bool = True) -> Heartbeat:
        """Join band 16 of the flow, send the first beat, and (with *run*) keep beating and
        checking in a background task. With ``run=False`` nothing happens by itself: call
        :meth:`tick` (a test with an injected clock does)."""
        if self.listener is not None:
            return self
        self.listener = await self.client.listen(self.flow, BAND_HEARTBEAT,
                                                 size=self.queue_size,
                                                 name=f"heartbeat:{self.name}")
        self._tasks.append(asyncio.ensure_future(self._receive()))
        if self.sending:
            self.beat()
        if run:
            self._tasks.append(asyncio.ensure_future(self._run()))
        return self

    async def stop(self, *, goodbye: bool = True) -> None:
        """Stop beating; tell the peers we are leaving (unless *goodbye* is False); leave the
        band. Iterators from :meth:`changes` end."""
        if self._stopped:
            return
        self._stopped = True
        if goodbye and self.sending and self.listener is not None:
            self._send(leaving=True)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("heartbeat %s: background task failed", self.name)
        self._tasks.clear()
        if self.listener is not None and not self.client.closed:
            await self.client.unlisten(self.listener)
        for q in self._subscribers:
            q.put_nowait(None)

    async def __aenter__(self) -> Heartbeat:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- sending ---------------------------------------------------------------------------
    def _send(self, leaving: bool = False) -> bool:
        data = self.data() if callable(self.data) else self.data
        payload = encode_beat(Beat(self.name, self.seq, self.period, self.incarnation, leaving,
                                   data))
        try:
            self.client.send_nowait(self.flow, payload, band=BAND_HEARTBEAT,
                                    locality=self.locality, ttl=self.ttl)
        except FailoverInProgress:
            self.counters["skipped"] += 1  # between routers: this beat is lost, like any
            return False
        except ConnectionLost:
            self.counters["skipped"] += 1
            return False
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        self.counters["sent"] += 1
        return True

    def beat(self) -> None:
        """Send one heartbeat now (and schedule the next one a period later)."""
        self._send()
        self._next_beat = self.clock() + self.period

    # --- receiving and checking -------------------------------------------------------------
    def _dispatch(self, changes: list[MembershipChange]) -> None:
        for ch in changes:
            log.info("heartbeat %s: peer %s %s -> %s%s", self.name, ch.peer,
                     ch.old.value if ch.old else "new", ch.new.value,
                     " (restarted)" if ch.restarted else "")
            for q in self._subscribers:
                q.put_nowait(ch)
            hook = self.on_change
            if hook is not None:
                try:
                    result = hook(ch)
                    if inspect.isawaitable(result):
                        asyncio.ensure_future(result)
                except Exception:
                    log.exception("heartbeat on_change hook raised")
        if changes:
            self._wake.set()

    def handle(self, payload: bytes | memoryview, now: float | None = None
               ) -> list[MembershipChange]:
        """Feed one received heartbeat payload (the receive task does this)."""
        try:
            beat = decode_beat(payload)
        except ValueError as exc:
            self.counters["bad"] += 1
            log.debug("heartbeat %s: ignoring a bad beat: %s", self.name, exc)
            return []
        if beat.name == self.name and beat.incarnation == self.incarnation:
            return []  # our own
        self.counters["received"] += 1
        refused = self.tracker.refused
        changes = self.tracker.observe(beat, self.clock() if now is None else now)
        self.counters["refused"] += self.tracker.refused - refused
        self._dispatch(changes)
        return changes

    def saw(self, peer: str) -> list[MembershipChange]:
        """Count any message from *peer* as a sign of life (see the module docs)."""
        changes = self.tracker.saw(peer, self.clock())
        self._dispatch(changes)
        return changes

    def check(self) -> list[MembershipChange]:
        """Re-evaluate every peer's state at the current time."""
        changes = self.tracker.check(self.clock())
        self._dispatch(changes)
        return changes

    def tick(self) -> list[MembershipChange]:
        """Send a beat if one is due, then check the peers (the background task's step)."""
        if self.sending and not self._stopped and self._next_beat is not None \
                and self.clock() >= self._next_beat:
            self._send()
            # keep the rhythm; after a long stall, do not send a burst of catch-up beats
            self._next_beat = max(self._next_beat + self.period, self.clock())
        return self.check()

    async def _receive(self) -> None:
        assert self.listener is not None
        try:
            async for msg in self.listener:
                self.handle(msg.payload)
        except (ListenerClosed, ConnectionLost):
            pass

    async def _run(self) -> None:
        while not self._stopped and not self.client.closed:
            self.tick()
            now = self.clock()
            wake = [t for t in (self._next_beat, self.tracker.next_deadline()) if t is not None]
            delay = max(0.0, min(wake) - now) if wake else self.period
            delay = min(delay, self.period)
            try:
                await asyncio.wait_for(self._wake.wait(), delay + 0.001)
            except TimeoutError:
                pass
            self._wake.clear()

    # --- reporting -------------------------------------------------------------------------
    def changes(self) -> ChangeStream:
        """Membership changes from this call on, until :meth:`stop`: ``async for change in
        hb.changes()``. The stream subscribes at once (nothing between this call and the
        first iteration is missed); ``close()`` it if you stop reading early."""
        q: asyncio.Queue[MembershipChange | None] = asyncio.Queue()
        if not self._stopped:
            self._subscribers.append(q)
        return ChangeStream(q, self._stopped, self._unsubscribe)

    def _unsubscribe(self, q: asyncio.Queue[MembershipChange | None]) -> None:
        try:
            self._subscribers.remove(q)
        except ValueError:
            pass

    async def wait_for(self, peer: str, state: PeerState | str,
                       timeout: float | None = None) -> Peer:
        """Wait until *peer* is in *state* (returns at once if it is already)."""
        state = PeerState(state)

        async def wait() -> Peer:
            q: asyncio.Queue[MembershipChange | None] = asyncio.Queue()
            self._subscribers.append(q)
            try:
                while True:
                    p = self.tracker.peers.get(peer)
                    if p is not None and p.state is state:
                        return p
                    ch = await q.get()
                    if ch is None:
                        raise FlowError(f"heartbeat {self.name} stopped before {peer} became "
                                        f"{state.value}")
            finally:
                self._subscribers.remove(q)

        return await asyncio.wait_for(wait(), timeout)

    def __repr__(self) -> str:
        return (f"<Heartbeat {self.name!r} on {self.flow} every {self.period:g}s, "
                f"{len(self.alive())}/{len(self.tracker.peers)} peers alive>")


__all__ = ["Heartbeat", "ChangeStream", "PeerTracker", "Peer", "PeerState", "MembershipChange",
           "Beat", "encode_beat", "decode_beat", "DEFAULT_PERIOD", "DEFAULT_MISSED"]
