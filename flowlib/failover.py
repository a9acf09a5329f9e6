"""The failover layer of the flow client (seed 002, 4.1.2 leaves it open): moving to another
router when ours is lost, and re-joining every flow there.

With several router addresses (or ``failover=True``), losing the link for any reason but
:meth:`~flowlib.client.FlowClient.close` makes the client connect to the next router of its
list that answers (round robin starting after the lost one; each round tries every address
once, rounds are separated by an exponential back-off from ``reconnect_min`` to
``reconnect_max``), then re-send every flow's JOIN (with the listeners' union mask, the
advertisement flag and the flow's capability), so the new router grafts us onto each tree.
Listeners stay open and readers keep waiting; each flow's listeners on the fault band get a
local FAILOVER notice naming both routers and the gap. Requests in flight on the lost link are
answered by the re-join. Only when no router answered for ``failover_timeout`` seconds does
the client give up: then everything fails with :class:`~flowlib.errors.ConnectionLost`,
exactly as a single-router client does at once. With failover on, the socket also gets TCP
keep-alives (:mod:`flowlib.link`), so a router *host* that vanishes without closing the
connection is noticed in about 11 s.

Builds on :mod:`flowlib.receiving`; imports asyncio and the wire layer of flowrouter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT

from .checks import address_text
from .connection import log
from .link import Link
from .membership import FlowState
from .notices import failover_fault
from .receiving import Receiving

#: How long a client keeps trying its routers after losing one before it gives up.
DEFAULT_FAILOVER_TIMEOUT = 30.0
DEFAULT_RECONNECT_MIN = 0.05  #: back-off after the first round of failed attempts (seconds)
DEFAULT_RECONNECT_MAX = 2.0  #: longest back-off between rounds (seconds)


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """One completed failover, as given to ``on_failover`` and kept in ``last_failover``."""

    old_router: str
    old_address: str
    new_router: str
    new_address: str
    reason: str  #: why the old link ended
    reconnect_ms: float  #: from noticing the loss to the new router's HELLO
    attempts: tuple[tuple[str, str], ...]  #: failed attempts before success: (address, why)


FailoverHook = Callable[[FailoverEvent], Any]


class Failover(Receiving):
    """Looking for the next router after a loss, and re-joining the flows there."""

    def _init_failover(self, *, failover_timeout: float, failover_send_timeout: float | None,
                       reconnect_min: float, reconnect_max: float,
                       on_failover: FailoverHook | None) -> None:
        self.failover_timeout = failover_timeout
        self.failover_send_timeout = failover_send_timeout
        self.reconnect_min = reconnect_min
        self.reconnect_max = max(reconnect_max, reconnect_min)
        #: called after each successful failover with a :class:`FailoverEvent`
        self.on_failover = on_failover
        self._failover_task: asyncio.Task[None] | None = None
        self._resync_tasks: set[asyncio.Task[None]] = set()
        #: completed failovers, and the last one
        self.failovers = 0
        self.last_failover: FailoverEvent | None = None

    # ------------------------------------------------------------------ the lower layers' hooks
    def _link_lost_cleanup(self) -> None:
        super()._link_lost_cleanup()
        for task in list(self._resync_tasks):
            task.cancel()

    def _after_link_lost(self, link: Link, reason: str) -> None:
        if not self._closing and self._failover and self._addresses:
            self._start_failover(link, reason)
        else:
            super()._after_link_lost(link, reason)

    def _release_all(self, reason: str, user: bool) -> None:
        task = self._failover_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self._failover_task = None
        for t in list(self._resync_tasks):
            t.cancel()
        super()._release_all(reason, user)

    # ------------------------------------------------------------------ failover
    def _start_failover(self, link: Link, reason: str) -> None:
        assert self._loop is not None
        t0 = self._loop.time()
        self._failing_since = t0
        # requests in flight are answered by the re-join on the next router
        self._carried.update(self._pending)
        self._pending.clear()
        old_name = link.router_name or self.router_name
        self.counters["failover.started"] += 1
        log.warning("lost flow router %r at %s (%s); failing over (%d router address(es), "
                    "giving up after %gs)", old_name, link.address, reason,
                    len(self._addresses), self.failover_timeout)
        self._failover_task = asyncio.ensure_future(
            self._failover_loop(old_name, link.address, reason, t0))

    async def _failover_loop(self, old_name: str, old_address: str, reason: str,
                             t0: float) -> None:
        loop = asyncio.get_running_loop()
        n = len(self._addresses)
        start = (self._addr_index + 1) % n
        delay = self.reconnect_min
        failed: list[tuple[str, str]] = []
        rnd = 0
        while True:
            rnd += 1
            for k in range(n):
                left = self.failover_timeout - (loop.time() - t0)
                if left <= 0:
                    break
                idx = (start + k) % n
                addr = self._addresses[idx]
                text = address_text(addr)
                why = await self._try_open(addr, min(self.connect_timeout, left))
                if why is None:
                    self._addr_index = idx
                    self._failover_task = None
                    self._failed_over(old_name, old_address, reason, t0, failed)
                    return
                log.info("failover round %d: router %s: %s", rnd, text, why)
                failed.append((text, why))
            left = self.failover_timeout - (loop.time() - t0)
            if left <= 0:
                break
            pause = min(delay, left)
            log.info("failover round %d: no router answered; next round in %.2fs", rnd, pause)
            await asyncio.sleep(pause)
            delay = min(delay * 2, self.reconnect_max)
        self._failover_task = None
        tail = "; ".join(f"{a}: {w}" for a, w in failed[-n:])
        self.counters["failover.gave-up"] += 1
        self._finish(f"lost router {old_name or old_address} ({reason}) and no router "
                     f"answered for {self.failover_timeout:g}s ({tail})", user=False)

    def _failed_over(self, old_name: str, old_address: str, reason: str, t0: float,
                     failed: list[tuple[str, str]]) -> None:
        assert self._loop is not None
        reconnect_ms = (self._loop.time() - t0) * 1000
        self._failing_since = None
        self.failovers += 1
        self.counters["failover.done"] += 1
        event = FailoverEvent(old_name, old_address, self.router_name, self.address, reason,
                              reconnect_ms, tuple(failed))
        self.last_failover = event
        log.warning("failed over from router %r (%s) to %r (%s) in %.1f ms; re-joining %d "
                    "flow(s)", old_name, old_address, self.router_name, self.address,
                    reconnect_ms, sum(1 for fs in self._flows.values() if fs.wanted))
        for fs in list(self._flows.values()):
            if fs.wanted:
                task = asyncio.ensure_future(self._rejoin(fs, event, t0))
                self._resync_tasks.add(task)
                task.add_done_callback(self._resync_tasks.discard)
        self._call_hook(self.on_failover, event, "on_failover")

    async def _rejoin(self, fs: FlowState, event: FailoverEvent, t0: float) -> None:
        """Re-establish our membership of one flow on the new router, then tell its listeners.

        A refusal (e.g. the new router has not learned the way to the flow's location service
        yet) is retried with back-off until ``failover_timeout`` after the loss.
        """
        assert self._loop is not None
        loop = self._loop
        key = fs.flow.key
        gen = self._gen
        deadline = t0 + self.failover_timeout
        delay = 0.1
        last: C.JoinAck | None = None
        why = "no answer"
        while True:
            if self._gen != gen or not self._up:
                return  # lost this router too: the next failover re-joins
            if self._flows.get(key) is not fs or not fs.wanted:
                self._answer_carried(key, C.JoinAck(0, C.JoinStatus.OK))
                return
            req, fut = self._send_join(fs)
            try:
                ack: C.JoinAck | None = await asyncio.wait_for(
                    fut, max(0.1, min(self.request_timeout, deadline - loop.time())))
            except TimeoutError:
                ack = None
                why = "no answer to the re-join"
            finally:
                self._forget_req(req)
            if ack is not None and ack.status is C.JoinStatus.OK:
                gap_ms = (loop.time() - t0) * 1000
                self._answer_carried(key, ack)
                self.counters["failover.rejoined"] += 1
                self._notice_rejoin(fs, event, gap_ms, "resumed",
                                    f"; flow {fs.flow} resumed after a {gap_ms:.1f} ms gap")
                return
            if ack is not None:
                last = ack
                why = f"{ack.status.name}: {ack.reason}" if ack.reason else ack.status.name
                fs.on_router = False
            if loop.time() + delay >= deadline:
                break
            log.info("re-join of flow %s at router %r failed (%s); retrying in %.1fs",
                     fs.flow, self.router_name, why, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        gap_ms = (loop.time() - t0) * 1000
        self.counters["failover.rejoin-failed"] += 1
        log.warning("flow %s: could not re-join at router %r after the failover: %s", fs.flow,
                    self.router_name, why)
        self._answer_carried(key, last or C.JoinAck(0, C.JoinStatus.TIMEOUT, why))
        self._notice_rejoin(fs, event, gap_ms, "rejoin-failed",
                            f", but flow {fs.flow} could not be re-joined there: {why}",
                            error=why)

    def _notice_rejoin(self, fs: FlowState, event: FailoverEvent, gap_ms: float, state: str,
                       outcome: str, **extra: object) -> None:
        """Tell *fs*'s listeners (a FAILOVER fault on the fault band) how the failover
        *event* went for their flow: *state* and the detail's *outcome*, with the event's
        fields."""
        self._local_notice(fs, BAND_FAULT, failover_fault(
            self.name,
            f"router {event.old_router} ({event.old_address}) lost ({event.reason}); failed "
            f"over to router {event.new_router} ({event.new_address}){outcome}",
            state=state, flow=fs.flow, old=event.old_router,
            old_address=event.old_address, new=event.new_router,
            new_address=event.new_address, reason=event.reason,
            reconnect_ms=f"{event.reconnect_ms:.1f}", gap_ms=f"{gap_ms:.1f}", **extra))
