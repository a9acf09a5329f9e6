"""The flows a client is on, from the application's side: create, listen, advertise, and
the requests that keep the router's view in line (JOIN, LEAVE, acks, re-joins).

* **Membership.** The router keeps *one* band mask per link and flow, so the client joins with
  the union of the masks of all its listeners on that flow (:mod:`flowlib.flowtable`). A
  repeated JOIN just replaces that mask and is acknowledged again, so adding a listener
  always sends a JOIN (its ack is the answer to that ``listen`` call), removing one narrows
  the mask with a new JOIN, and removing the last sends a LEAVE. An advertisement is a JOIN
  flagged ``ADVERTISE`` that keeps the path toward the core installed even with no listener.
* **Capabilities.** A flow whose creator published a policy (``publish_policy``) takes
  joins only with a capability token; the token given to ``listen``/``advertise`` stays with
  the flow and is presented again by every later JOIN. Tokens given to ``connect`` are
  presented for every flow they cover, unless a call gives its own.

:class:`Membership` is part of the asyncio shell: it sends through the current link's
protocol and waits for the answers (:class:`~flowlib.events.JoinAnswered`). Imports asyncio
and flowlib's connection and protocol layers.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.flowid import FlowID, LocalIdAllocator

from .checks import BandsSpec, LocalitySpec, check_flow, check_locality, listen_mask
from .connection import Connection
from .delivery import Delivery
from .errors import ConnectionLost, FlowError, FlowTimeout, JoinRefused, ListenerClosed
from .events import JoinAnswered
from .flowtable import FlowEntry, FlowTable
from .queue import Listener, Overflow

log = logging.getLogger("flowlib")

Request = tuple[int, "asyncio.Future[C.JoinAck]"]


class Membership:
    """Listeners and advertisements, and the JOINs that tell the router about them."""

    def __init__(self, conn: Connection, flows: FlowTable, delivery: Delivery,
                 state_dir: str | os.PathLike[str] | None) -> None:
        self.conn = conn
        self.flows = flows
        self.delivery = delivery
        self.state_path = Path(state_dir) / "creator" if state_dir is not None else None
        self.allocator: LocalIdAllocator | None = None
        self.alloc_lock = asyncio.Lock()
        self.pending: dict[int, tuple[bytes, asyncio.Future[C.JoinAck]]] = {}
        #: requests in flight when a link was lost; answered by the re-join after failover
        self.carried: dict[int, tuple[bytes, asyncio.Future[C.JoinAck]]] = {}
        self.listener_seq = 0
        conn.on_finish.append(self.release)

    # ------------------------------------------------------------------ the shell's hooks
    def release(self, reason: str, user: bool) -> None:
        """The client ended: close the listeners, fail the requests that wait."""
        def listener_error() -> FlowError:
            if user:
                return ListenerClosed("the flow client was closed")
            return ConnectionLost(reason)

        self.delivery.close_all(listener_error)
        for table in (self.pending, self.carried):
            entries = list(table.values())
            table.clear()
            for _key, fut in entries:
                if not fut.done():
                    fut.set_exception(ConnectionLost(reason))

    def carry_requests(self) -> None:
        """The link died during a failover: its requests are answered by the re-joins."""
        self.carried.update(self.pending)
        self.pending.clear()

    def on_join_answered(self, event: JoinAnswered) -> None:
        entry = self.pending.get(event.req_id)
        if entry is None or entry[0] != event.key:
            self.conn.counters["control.stale-ack"] += 1
            return
        if not entry[1].done():
            entry[1].set_result(event.ack)

    def rejoin(self, key: bytes) -> None:
        """The router holds nothing for flow *key* (NOT_ON_TREE / PRUNE): join it again."""
        fe = self.flows.get(key)
        if fe is not None and fe.wanted:
            self.background_join(fe)

    # ------------------------------------------------------------------ requests
    def join(self, fe: FlowEntry) -> Request:
        """Send *fe*'s JOIN on the current link; its request and the future of its ack."""
        link = self.conn.link
        assert link is not None
        req = link.protocol.join(fe)
        link.flush()
        fut: asyncio.Future[C.JoinAck] = asyncio.get_running_loop().create_future()
        self.pending[req] = (fe.flow.key, fut)
        return req, fut

    def forget(self, req: int) -> None:
        self.pending.pop(req, None)
        self.carried.pop(req, None)
        link = self.conn.link
        if link is not None:
            link.protocol.forget_request(req)

    async def await_ack(self, req: int, fut: asyncio.Future[C.JoinAck], flow: FlowID,
                        timeout: float | None) -> C.JoinAck:
        limit = self.conn.options.request_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(fut, limit)
        except TimeoutError:
            raise FlowTimeout(f"router {self.conn.router_name!r} did not answer the join of "
                              f"flow {flow} within {limit}s") from None
        finally:
            self.forget(req)

    def answer_carried(self, key: bytes, ack: C.JoinAck) -> None:
        """Answer the requests on *key* that were in flight when the old link died."""
        for req, (k, fut) in list(self.carried.items()):
            if k == key:
                del self.carried[req]
                if not fut.done():
                    fut.set_result(ack)

    def sync(self, fe: FlowEntry) -> Request | None:
        """Bring the router's view of our membership in line with *fe*.

        Returns the request of a JOIN if one was needed. A flow nobody here wants any more
        gets a LEAVE and is forgotten. Between routers (failover) only our own state
        changes; the re-join after the failover sends what is current then.
        """
        conn = self.conn
        if not fe.wanted:
            link = conn.link
            if fe.on_router and conn.up and not conn.closing and link is not None:
                link.protocol.leave(fe)
                link.flush()
            fe.router_forgot()
            if self.flows.forget(fe):
                self.conn.reassembler.drop_flow(fe.flow.key)
            return None
        if not conn.up or conn.closing or fe.in_sync:
            return None
        return self.join(fe)

    def background_join(self, fe: FlowEntry) -> None:
        """A JOIN nobody awaits (repairs after a failed request): log its outcome."""
        sent = self.sync(fe)
        if sent is None:
            return
        req, fut = sent
        flow = fe.flow

        def done(f: asyncio.Future[C.JoinAck]) -> None:
            self.forget(req)
            if f.cancelled() or f.exception() is not None:
                return
            ack = f.result()
            if ack.status is not C.JoinStatus.OK:
                log.warning("re-join of flow %s refused: %s (%s)", flow, ack.status.name,
                            ack.reason)
                if self.flows.holds(fe):
                    fe.on_router = False

        fut.add_done_callback(done)

    def detach(self, fe: FlowEntry, lst: Listener | None, router_forgot: bool) -> None:
        if lst is not None:
            fe.remove_listener(id(lst))
            self.delivery.remove(lst)
            lst.end()
        if router_forgot:
            # a refused JOIN leaves no state for our link at the router
            fe.router_forgot()
        self.background_join(fe)

    async def settle(self, fe: FlowEntry, timeout: float | None = None) -> None:
        sent = self.sync(fe)
        if sent is None:
            return
        req, fut = sent
        try:
            ack = await self.await_ack(req, fut, fe.flow, timeout)
        except (FlowTimeout, ConnectionLost) as exc:
            log.warning("membership change on flow %s not confirmed: %s", fe.flow, exc)
            return
        if ack.status is not C.JoinStatus.OK:
            log.warning("membership change on flow %s refused: %s (%s)", fe.flow,
                        ack.status.name, ack.reason)
            fe.on_router = False

    # ------------------------------------------------------------------ the API's calls
    async def create(self, lsid: int | None) -> FlowID:
        if lsid is None:
            lsid = self.conn.default_lsid
            if not lsid:
                raise FlowError(f"router {self.conn.router_name!r} suggests no LSID for new "
                                "flows (it knows no location service); pass lsid= explicitly")
        if isinstance(lsid, bool) or not isinstance(lsid, int) or not 0 < lsid < 1 << 32:
            raise ValueError(f"lsid must be an integer 1..0xffffffff (0 is reserved), "
                             f"got {lsid!r}")
        async with self.alloc_lock:
            if self.allocator is None:
                self.allocator = await asyncio.to_thread(LocalIdAllocator, self.state_path)
            allocator = self.allocator
            local = await asyncio.to_thread(allocator.allocate)
        return FlowID(allocator.creator, lsid, local)

    async def advertise(self, flow: FlowID | str, locality: LocalitySpec, timeout: float | None,
                        capability: Any) -> None:
        flow = check_flow(flow)
        loc = check_locality(locality)
        await self.conn.ready(self.conn.options.request_timeout if timeout is None
                              else timeout)
        fe = self.flows.entry(flow, capability)
        was = fe.advertised, fe.adv_locality
        fe.advertised, fe.adv_locality = True, loc
        req, fut = self.join(fe)
        try:
            ack = await self.await_ack(req, fut, flow, timeout)
        except BaseException:
            fe.advertised, fe.adv_locality = was
            self.detach(fe, None, router_forgot=False)
            raise
        if ack.status is not C.JoinStatus.OK:
            fe.advertised, fe.adv_locality = False, (0, 0)
            self.detach(fe, None, router_forgot=True)
            raise JoinRefused(ack.status, ack.reason, flow)

    async def unadvertise(self, flow: FlowID | str) -> None:
        fe = self.flows.get(check_flow(flow).key)
        if fe is None or not fe.advertised:
            return
        fe.advertised, fe.adv_locality = False, (0, 0)
        await self.settle(fe)

    async def listen(self, flow: FlowID | str, bands: BandsSpec, size: int,
                     overflow: str | Overflow, timeout: float | None, name: str | None,
                     capability: Any) -> Listener:
        flow = check_flow(flow)
        mask = listen_mask(bands)
        self.listener_seq += 1
        lst = Listener(flow, mask, size, overflow, name or f"listener-{self.listener_seq}")
        await self.conn.ready(self.conn.options.request_timeout if timeout is None
                              else timeout)
        fe = self.flows.entry(flow, capability)
        # Registered before the ack so nothing sent right after the join is missed.
        fe.add_listener(id(lst), mask)
        self.delivery.add(lst)
        req, fut = self.join(fe)
        try:
            ack = await self.await_ack(req, fut, flow, timeout)
        except BaseException:
            self.detach(fe, lst, router_forgot=False)
            raise
        if ack.status is not C.JoinStatus.OK:
            self.detach(fe, lst, router_forgot=True)
            raise JoinRefused(ack.status, ack.reason, flow)
        return lst

    async def unlisten(self, listener: Listener, timeout: float | None) -> None:
        fe = self.flows.get(listener.flow.key)
        if fe is None or not fe.remove_listener(id(listener)):
            listener.end()
            return
        self.delivery.remove(listener)
        listener.end()
        await self.settle(fe, timeout)

    def listeners(self, flow: FlowID | str | None) -> list[Listener]:
        if flow is None:
            return self.delivery.all()
        return list(self.delivery.of(check_flow(flow).key))

    def leave_all(self) -> None:
        """LEAVE every flow the router holds for us (closing politely)."""
        link = self.conn.link
        if link is None:
            return
        for fe in self.flows:
            if fe.on_router:
                link.protocol.leave(fe)
        link.flush()
