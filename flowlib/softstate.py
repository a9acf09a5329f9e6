"""The soft-state layer of the flow client: liveness of the router link and refresh digests
of what this client holds (docs/architecture.md, "Soft state").

* **Liveness.** The router sends an ECHO every second or so; the client answers it and sends
  its own every ``liveness_interval``. Anything read from the router counts as a sign of
  life; a router silent for ``dead_after`` seconds is hung or cut off (a stopped process
  whose kernel still holds the socket answers TCP, so TCP alone never notices), and the
  link is dropped like a lost one: with failover on, the client moves to the next router.
  ``rtt`` is the smoothed round trip of the echoes. A router whose HELLO does not announce
  the soft-state feature (``flowrouter.wire.control.FEATURE_SOFT_STATE``: one from before
  these messages) is sent no ECHO and no digest, and is never declared dead for silence.
* **Refresh.** Every ``refresh_interval`` the client sends its router one digest (chunked,
  spread over the interval) of the flows it listens on or advertises and their band masks.
  The router reconciles its table from it, so a lost JOIN, mask change or LEAVE is repaired
  by the next round, and what the client stopped listing is collected. Only live clients keep
  a flow alive.
* **Re-join.** A router that answers NOT_ON_TREE (it holds nothing for a flow we refreshed)
  or PRUNE (it dropped our state) gets a fresh JOIN for every flow still wanted.

Builds on :mod:`flowlib.sending`; imports asyncio and the wire layer of flowrouter.
"""

from __future__ import annotations

import asyncio

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_MEMBERSHIP

from .checks import Address
from .connection import LINK_KEY, log
from .link import Link
from .sending import Sending

SPREAD = 0.8  #: share of the refresh interval a digest round is spread over


class SoftState(Sending):
    """ECHOs both ways, dead-router detection, refresh digests and re-joins."""

    def _init_softstate(self, *, liveness_interval: float, dead_after: float,
                        refresh_interval: float) -> None:
        if not liveness_interval > 0 or not refresh_interval > 0:
            raise ValueError("liveness_interval and refresh_interval must be positive")
        if not dead_after > liveness_interval:
            raise ValueError("dead_after must be longer than liveness_interval")
        self.liveness_interval = liveness_interval
        self.dead_after = dead_after
        self.refresh_interval = refresh_interval
        #: smoothed round trip of our echoes to the router (seconds; None before the first)
        self.rtt: float | None = None
        self._upkeep_handle: asyncio.TimerHandle | None = None
        self._watched: Link | None = None
        self._seen_reads = 0
        #: the router has sent an ECHO or ECHO_REPLY on this link: it speaks liveness, so
        #: its silence means something (an older router is never declared dead)
        self._router_speaks = False
        self._heard = 0.0
        self._echo_due = 0.0
        self._echo_seq = 0
        self._round_due = 0.0
        self._round = 0
        self._round_keys: list[bytes] = []
        self._round_sent = 0
        self._round_count = 0
        self._round_started = 0.0
        self._round_period = refresh_interval

    async def _open(self, addr: Address, timeout: float) -> None:
        await super()._open(addr, timeout)
        if self._upkeep_handle is None:
            self._upkeep()

    def _upkeep(self) -> None:
        """The maintenance timer: echoes, the dead-router check, digest chunks."""
        self._upkeep_handle = None
        if self._lost or self._loop is None:
            return
        tick = min(self.liveness_interval, self.refresh_interval) / 4
        self._upkeep_handle = self._loop.call_later(tick, self._upkeep)
        link = self._link
        if not self._up or link is None or self._transport is None:
            return
        now = self._loop.time()
        if link is not self._watched:  # a new router link: start afresh
            self._watched = link
            self._seen_reads = link.reads
            self._router_speaks = False
            self._heard = self._echo_due = now
            self._round_due = now + self.refresh_interval
            self._round_keys = []
        if link.reads != self._seen_reads:
            self._seen_reads = link.reads
            self._heard = now
        silent = now - self._heard
        if silent > self.dead_after and self._router_speaks:
            self.counters["liveness.dead"] += 1
            log.warning("router %r silent for %.1fs (dead after %gs): dropping the link",
                        self.router_name, silent, self.dead_after)
            self._fail(link, f"router {self.router_name!r} silent for {silent:.1f}s: hung or "
                             "unreachable")
            return
        if not (link.router_features & C.FEATURE_SOFT_STATE or self._router_speaks):
            return  # a router from before soft state would drop the link on our first ECHO
        if now >= self._echo_due:
            self._echo_due = now + self.liveness_interval
            self._echo_seq = (self._echo_seq + 1) & 0xFFFFFFFF
            self._write_control(LINK_KEY, BAND_MEMBERSHIP, C.Echo(
                self._echo_seq, int(now * 1e6) & 0xFFFFFFFFFFFFFFFF))
        if now >= self._round_due:
            self._round_due = now + self._start_round(now)
        if self._round_sent < self._round_count:
            self._send_chunks(now)

    def _start_round(self, now: float) -> float:
        """Snapshot what we hold; returns the round's length (the refresh interval, longer
        for a huge number of flows: see :func:`flowrouter.wire.control.refresh_period`)."""
        self._round = (self._round + 1) & 0xFFFFFFFF
        self._round_keys = [k for k, fs in self._flows.items() if fs.on_router and fs.wanted]
        per = C.refresh_capacity(self.max_payload)
        self._round_count = max(1, -(-len(self._round_keys) // per))
        self._round_sent = 0
        self._round_started = now
        self._round_period = C.refresh_period(len(self._round_keys), self.refresh_interval)
        self.counters["refresh.rounds"] += 1
        return self._round_period

    def _send_chunks(self, now: float) -> None:
        per = C.refresh_capacity(self.max_payload)
        span = self._round_period * SPREAD
        due = min(self._round_count,
                  1 + int(self._round_count * (now - self._round_started) / span))
        hold_ms = int(self._round_period * C.DEFAULT_HOLD_FACTOR * 1000)
        while self._round_sent < due:
            i = self._round_sent
            entries = []
            for key in self._round_keys[i * per:(i + 1) * per]:
                fs = self._flows.get(key)
                if fs is None or not fs.on_router or not fs.wanted:
                    continue
                mask = fs.sent_mask if fs.sent_mask is not None else fs.mask()
                entries.append((key, mask, C.REFRESH_ADVERTISE if fs.advertised else 0))
            self._write_control(LINK_KEY, BAND_MEMBERSHIP, C.Refresh(
                self._round, i, self._round_count, hold_ms, tuple(entries)))
            self._round_sent += 1

    def _on_link_control(self, link: Link, msg: C.ControlMessage) -> None:
        if isinstance(msg, (C.Echo, C.EchoReply)) and link is self._link:
            self._router_speaks = True
        if isinstance(msg, C.Echo):
            if self._transport is not None:
                self._write_control(LINK_KEY, BAND_MEMBERSHIP,
                                    C.EchoReply(msg.seq, msg.stamp))
        elif isinstance(msg, C.EchoReply):
            assert self._loop is not None
            sample = self._loop.time() - msg.stamp / 1e6
            if 0 <= sample < 3600:
                self.rtt = sample if self.rtt is None else 0.875 * self.rtt + 0.125 * sample
        elif isinstance(msg, (C.NotOnTree, C.Prune)):
            what = "prune" if isinstance(msg, C.Prune) else "not-on-tree"
            self.counters[f"refresh.{what}-received"] += 1
            for key in msg.keys:
                fs = self._flows.get(key)
                if fs is None or not fs.wanted:
                    continue
                log.info("router %r has no state for flow %s (%s): joining again",
                         self.router_name, fs.flow, what)
                self.counters["refresh.rejoins"] += 1
                fs.on_router = False
                fs.sent_mask = None
                self._background_join(fs)
        else:
            super()._on_link_control(link, msg)

    def _release_all(self, reason: str, user: bool) -> None:
        if self._upkeep_handle is not None:
            self._upkeep_handle.cancel()
            self._upkeep_handle = None
        super()._release_all(reason, user)
