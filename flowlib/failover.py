"""Failover (seed 002, 4.1.2 leaves it open): moving to another router when ours is lost, and
re-joining every flow there.

With several router addresses (or ``failover=True``), losing the link for any reason but
:meth:`~flowlib.client.FlowClient.close` makes the client connect to the next router of its
list that answers (round robin starting after the lost one; each round tries every address
once, rounds are separated by an exponential back-off from ``reconnect_min`` to
``reconnect_max``: :mod:`flowlib.reconnect` is that schedule, on virtual time). Each
attempt builds a fresh :class:`~flowlib.protocol.ClientProtocol`;
once one is up, the flow table is replayed into it: every wanted flow's JOIN (with the
listeners' union mask, the advertisement flag and the flow's capability), so the new router
grafts us onto each tree. Listeners stay open and readers keep waiting; each flow's listeners
on the fault band get a local FAILOVER notice naming both routers and the gap. Requests in
flight on the lost link are answered by the re-join. Only when no router answered for
``failover_timeout`` seconds does the client give up: then everything fails with
:class:`~flowlib.errors.ConnectionLost`, exactly as a single-router client does at once.
With failover on, the socket also gets TCP keep-alives (:mod:`flowlib.link`), so a router
*host* that vanishes without closing the connection is noticed in about 11 s.

Part of the asyncio shell; imports asyncio and flowlib's connection and membership.
"""

from __future__ import annotations

import asyncio
import logging

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT

from .checks import address_text
from .connection import Connection, call_hook
from .delivery import Delivery
from .events import FailoverEvent
from .flowtable import FlowEntry
from .link import Link
from .membership import Membership
from .notices import failover_fault
from .reconnect import GiveUp, Pause, ReconnectPlan

log = logging.getLogger("flowlib")


class Failover:
    """Decides what a lost link means, looks for the next router, and replays the flow
    table there."""

    def __init__(self, conn: Connection, members: Membership, delivery: Delivery) -> None:
        self.conn = conn
        self.members = members
        self.delivery = delivery
        o = conn.options
        self.timeout = o.failover_timeout
        self.reconnect_min = o.reconnect_min
        self.reconnect_max = max(o.reconnect_max, o.reconnect_min)
        self.task: asyncio.Task[None] | None = None
        self.resync_tasks: set[asyncio.Task[None]] = set()
        #: completed failovers, and the last one
        self.count = 0
        self.last: FailoverEvent | None = None
        conn.on_link_lost = self.link_lost
        conn.on_finish.append(self.release)

    @property
    def enabled(self) -> bool:
        return self.conn.options.failover

    def link_lost(self, link: Link, reason: str) -> None:
        """The current link ended: fail over, or end the client."""
        for task in list(self.resync_tasks):
            task.cancel()
        conn = self.conn
        if conn.closing:
            conn.finish(conn.close_reason or "the client was closed", user=True)
        elif self.enabled and conn.addresses:
            self.start(link, reason)
        else:
            conn.finish(reason, user=False)

    def release(self, reason: str, user: bool) -> None:
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self.task = None
        for t in list(self.resync_tasks):
            t.cancel()

    def stop(self) -> None:
        """close() was called: stop looking for a router."""
        if self.task is not None:
            self.task.cancel()

    # ------------------------------------------------------------------ looking for a router
    def start(self, link: Link, reason: str) -> None:
        conn = self.conn
        t0 = asyncio.get_running_loop().time()
        conn.failing_since = t0
        self.members.carry_requests()
        old_name = link.router_name or conn.router_name
        conn.counters["failover.started"] += 1
        log.warning("lost flow router %r at %s (%s); failing over (%d router address(es), "
                    "giving up after %gs)", old_name, link.address, reason,
                    len(conn.addresses), self.timeout)
        self.task = asyncio.ensure_future(self.run(old_name, link.address, reason, t0))

    async def run(self, old_name: str, old_address: str, reason: str, t0: float) -> None:
        """Follow the :class:`~flowlib.reconnect.ReconnectPlan` until a router answers or
        the plan gives up."""
        conn = self.conn
        loop = asyncio.get_running_loop()
        n = len(conn.addresses)
        plan = ReconnectPlan(n, conn.addr_index, t0, timeout=self.timeout,
                             connect_timeout=conn.options.connect_timeout,
                             reconnect_min=self.reconnect_min,
                             reconnect_max=self.reconnect_max)
        failed: list[tuple[str, str]] = []
        while not isinstance(step := plan.next(loop.time()), GiveUp):
            if isinstance(step, Pause):
                log.info("failover round %d: no router answered; next round in %.2fs",
                         step.round, step.delay)
                await asyncio.sleep(step.delay)
                continue
            addr = conn.addresses[step.index]
            why = await conn.try_open(addr, step.timeout)
            if why is None:
                conn.addr_index = step.index
                self.task = None
                self.failed_over(old_name, old_address, reason, t0, failed)
                return
            text = address_text(addr)
            log.info("failover round %d: router %s: %s", step.round, text, why)
            failed.append((text, why))
        self.task = None
        tail = "; ".join(f"{a}: {w}" for a, w in failed[-n:])
        conn.counters["failover.gave-up"] += 1
        conn.finish(f"lost router {old_name or old_address} ({reason}) and no router "
                    f"answered for {self.timeout:g}s ({tail})", user=False)

    def failed_over(self, old_name: str, old_address: str, reason: str, t0: float,
                    failed: list[tuple[str, str]]) -> None:
        conn = self.conn
        reconnect_ms = (asyncio.get_running_loop().time() - t0) * 1000
        conn.failing_since = None
        self.count += 1
        conn.counters["failover.done"] += 1
        event = FailoverEvent(old_name, old_address, conn.router_name, conn.address, reason,
                              reconnect_ms, tuple(failed))
        self.last = event
        wanted = self.members.flows.wanted()
        log.warning("failed over from router %r (%s) to %r (%s) in %.1f ms; re-joining %d "
                    "flow(s)", old_name, old_address, conn.router_name, conn.address,
                    reconnect_ms, len(wanted))
        for fe in wanted:
            task = asyncio.ensure_future(self.rejoin(fe, event, t0))
            self.resync_tasks.add(task)
            task.add_done_callback(self.resync_tasks.discard)
        call_hook(conn.on_failover, event, "on_failover")

    # ------------------------------------------------------------------ replaying the flows
    async def rejoin(self, fe: FlowEntry, event: FailoverEvent, t0: float) -> None:
        """Re-establish our membership of one flow on the new router, then tell its listeners.

        A refusal (e.g. the new router has not learned the way to the flow's location service
        yet) is retried with back-off until ``failover_timeout`` after the loss.
        """
        conn, members = self.conn, self.members
        loop = asyncio.get_running_loop()
        key = fe.flow.key
        gen = conn.gen
        deadline = t0 + self.timeout
        delay = 0.1
        last: C.JoinAck | None = None
        why = "no answer"
        while True:
            if conn.gen != gen or not conn.up:
                return  # lost this router too: the next failover re-joins
            if not members.flows.holds(fe) or not fe.wanted:
                members.answer_carried(key, C.JoinAck(0, C.JoinStatus.OK))
                return
            req, fut = members.join(fe)
            try:
                ack: C.JoinAck | None = await asyncio.wait_for(
                    fut, max(0.1, min(conn.options.request_timeout, deadline - loop.time())))
            except TimeoutError:
                ack = None
                why = "no answer to the re-join"
            finally:
                members.forget(req)
            if ack is not None and ack.status is C.JoinStatus.OK:
                gap_ms = (loop.time() - t0) * 1000
                members.answer_carried(key, ack)
                conn.counters["failover.rejoined"] += 1
                self.notice(fe, event, gap_ms, "resumed",
                            f"; flow {fe.flow} resumed after a {gap_ms:.1f} ms gap")
                return
            if ack is not None:
                last = ack
                why = f"{ack.status.name}: {ack.reason}" if ack.reason else ack.status.name
                fe.on_router = False
            if loop.time() + delay >= deadline:
                break
            log.info("re-join of flow %s at router %r failed (%s); retrying in %.1fs",
                     fe.flow, conn.router_name, why, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        gap_ms = (loop.time() - t0) * 1000
        conn.counters["failover.rejoin-failed"] += 1
        log.warning("flow %s: could not re-join at router %r after the failover: %s", fe.flow,
                    conn.router_name, why)
        members.answer_carried(key, last or C.JoinAck(0, C.JoinStatus.TIMEOUT, why))
        self.notice(fe, event, gap_ms, "rejoin-failed",
                    f", but flow {fe.flow} could not be re-joined there: {why}", error=why)

    def notice(self, fe: FlowEntry, event: FailoverEvent, gap_ms: float, state: str,
               outcome: str, **extra: object) -> None:
        """Tell *fe*'s listeners (a FAILOVER fault on the fault band) how the failover
        *event* went for their flow: *state* and the detail's *outcome*, with the event's
        fields."""
        self.delivery.local_notice(fe.flow, BAND_FAULT, failover_fault(
            self.conn.options.name,
            f"router {event.old_router} ({event.old_address}) lost ({event.reason}); failed "
            f"over to router {event.new_router} ({event.new_address}){outcome}",
            state=state, flow=fe.flow, old=event.old_router,
            old_address=event.old_address, new=event.new_router,
            new_address=event.new_address, reason=event.reason,
            reconnect_ms=f"{event.reconnect_ms:.1f}", gap_ms=f"{gap_ms:.1f}", **extra))
