"""The membership layer of the flow client: the flows it is on, and keeping the router's view
of them in line (JOIN, LEAVE, acks, GC pings, advertisements and capability policies).

* **Membership.** The router keeps *one* band mask per link and flow, so the client joins with
  the union of the masks of all its listeners on that flow. A repeated JOIN just replaces that
  mask and is acknowledged again, so adding a listener always sends a JOIN (its ack is the
  answer to that ``listen`` call), removing one narrows the mask with a new JOIN, and removing
  the last sends a LEAVE. An advertisement is a JOIN flagged ``ADVERTISE`` that keeps the path
  toward the core installed even with no listener.
* **Soft state.** Routers keep our state only while we refresh it: the soft-state layer
  (:mod:`flowlib.softstate`) sends a digest of the flows we listen on or advertise, so state
  we no longer want is collected even if a LEAVE was lost. Older routers' GC PINGs are still
  answered, for flows we still want only.
* **Capabilities.** A flow whose creator published a policy (:meth:`publish_policy`) takes
  joins only with a capability token; the token given to ``listen``/``advertise`` stays with
  the flow and is presented again by every later JOIN. Tokens given to ``connect`` (objects,
  bytes or capability files) are presented for every flow they cover, unless a call gives
  its own.

Builds on :mod:`flowlib.connection`; imports asyncio and the wire layer of flowrouter.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_GC, BAND_MEMBERSHIP
from flowrouter.wire.flowid import FlowID, LocalIdAllocator

from .checks import BandsSpec, LocalitySpec, check_flow, check_locality, listen_mask
from .connection import LINK_KEY, Connection, log
from .credentials import capability_for, load_capability
from .errors import ConnectionLost, FlowError, FlowTimeout, JoinRefused, ListenerClosed
from .notices import NoticeLimiter
from .queue import DEFAULT_QUEUE_SIZE, Listener, Overflow


class FlowState:
    """What this client holds on one flow: its listeners and whether it advertises it."""

    __slots__ = ("flow", "listeners", "advertised", "adv_locality", "on_router", "sent_mask",
                 "notices", "capability")

    def __init__(self, flow: FlowID) -> None:
        self.flow = flow
        self.listeners: list[Listener] = []
        self.advertised = False
        self.adv_locality: tuple[int, int] = (0, 0)
        #: the router has (or is being asked to make) state for our link on this flow
        self.on_router = False
        #: the mask of the last JOIN we sent
        self.sent_mask: int | None = None
        #: rate limiter of this flow's dropped-large-message notices
        self.notices: NoticeLimiter | None = None
        #: capability token presented with every JOIN of this flow (flows under a policy)
        self.capability = b""

    def mask(self) -> int:
        bits = 0
        for lst in self.listeners:
            bits |= lst._mask
        return bits

    @property
    def wanted(self) -> bool:
        return bool(self.listeners) or self.advertised


def set_capability(fs: FlowState, capability: Any) -> None:
    if capability is None:
        return
    raw = capability.encode() if hasattr(capability, "encode") else bytes(capability)
    if len(raw) > 0xFFFF:
        raise ValueError("a capability token is at most 65535 bytes")
    fs.capability = raw


class Membership(Connection):
    """Flows, listeners and the requests that keep the router's view of them current."""

    def _init_membership(self, *, state_dir: str | os.PathLike[str] | None,
                         capabilities: Iterable[Any] = ()) -> None:
        #: capabilities presented by default with the joins of the flows they cover
        self.capabilities = [load_capability(c) for c in capabilities]
        self._state_path = Path(state_dir) / "creator" if state_dir is not None else None
        self._allocator: LocalIdAllocator | None = None
        self._alloc_lock = asyncio.Lock()
        self._flows: dict[bytes, FlowState] = {}
        self._pending: dict[int, tuple[bytes, asyncio.Future[C.JoinAck]]] = {}
        #: requests in flight when a link was lost; answered by the re-join after failover
        self._carried: dict[int, tuple[bytes, asyncio.Future[C.JoinAck]]] = {}
        self._next_req = 1
        self._listener_seq = 0

    # ------------------------------------------------------------------ the connection's hooks
    def _link_lost_cleanup(self) -> None:
        super()._link_lost_cleanup()
        for fs in self._flows.values():
            fs.on_router = False
            fs.sent_mask = None

    def _release_all(self, reason: str, user: bool) -> None:
        def listener_error() -> FlowError:
            if user:
                return ListenerClosed("the flow client was closed")
            return ConnectionLost(reason)

        for fs in self._flows.values():
            for lst in fs.listeners:
                lst._close(listener_error)
        for table in (self._pending, self._carried):
            entries = list(table.values())
            table.clear()
            for _key, fut in entries:
                if not fut.done():
                    fut.set_exception(ConnectionLost(reason))
        super()._release_all(reason, user)

    def _on_flow_control(self, key: bytes, band: int, msg: C.ControlMessage) -> None:
        if band == BAND_MEMBERSHIP and isinstance(msg, C.JoinAck):
            entry = self._pending.get(msg.req_id)
            if entry is None or entry[0] != key:
                self.counters["control.stale-ack"] += 1
                return
            fut = entry[1]
            if not fut.done():
                fut.set_result(msg)
        elif band == BAND_GC and isinstance(msg, C.Ping):
            fs = self._flows.get(key)
            if fs is not None and fs.wanted:
                self._write_control(key, BAND_GC, C.Pong(msg.epoch))
                self.counters["gc.pongs"] += 1
            else:
                self.counters["gc.pings-ignored"] += 1
        else:
            super()._on_flow_control(key, band, msg)

    def _flow_forgotten(self, key: bytes) -> None:
        """Nobody here wants flow *key* any more (the receiving layer drops its partial
        messages)."""

    # ------------------------------------------------------------------ flows
    async def create(self, lsid: int | None = None) -> FlowID:
        """Name a new flow: our creator ID, the LSID of its core, a never-reused local ID.

        No message goes to the network: a flow exists once someone advertises, listens or
        sends. The LSID defaults to the one the router suggested in its HELLO. Local IDs come
        from :class:`~flowrouter.wire.flowid.LocalIdAllocator`, persisted in ``state_dir`` (or
        ``$FLOWNET_STATE_DIR``), so they are unique across restarts of this host; its file I/O
        runs in a worker thread to keep the event loop responsive.
        """
        if lsid is None:
            lsid = self.default_lsid
            if not lsid:
                raise FlowError(f"router {self.router_name!r} suggests no LSID for new flows "
                                "(it knows no location service); pass lsid= explicitly")
        if isinstance(lsid, bool) or not isinstance(lsid, int) or not 0 < lsid < 1 << 32:
            raise ValueError(f"lsid must be an integer 1..0xffffffff (0 is reserved), "
                             f"got {lsid!r}")
        async with self._alloc_lock:
            if self._allocator is None:
                self._allocator = await asyncio.to_thread(LocalIdAllocator, self._state_path)
            allocator = self._allocator
            local = await asyncio.to_thread(allocator.allocate)
        return FlowID(allocator.creator, lsid, local)

    def _flow_state(self, flow: FlowID) -> FlowState:
        fs = self._flows.get(flow.key)
        if fs is None:
            fs = self._flows[flow.key] = FlowState(flow)
            if self.capabilities:
                set_capability(fs, capability_for(self.capabilities, flow.key, self.name))
        return fs

    def _send_join(self, fs: FlowState) -> tuple[int, asyncio.Future[C.JoinAck]]:
        req = self._next_req
        self._next_req = (req + 1) & 0xFFFFFFFF or 1
        fut: asyncio.Future[C.JoinAck] = asyncio.get_running_loop().create_future()
        key = fs.flow.key
        self._pending[req] = (key, fut)
        mask = fs.mask()
        flags = C.JOIN_FLAG_ADVERTISE if fs.advertised else 0
        self._write_control(key, BAND_MEMBERSHIP, C.Join(req, mask, flags, fs.capability),
                            fs.adv_locality if fs.advertised else (0, 0))
        fs.on_router = True
        fs.sent_mask = mask
        return req, fut

    async def _await_ack(self, req: int, fut: asyncio.Future[C.JoinAck], flow: FlowID,
                         timeout: float | None) -> C.JoinAck:
        limit = self.request_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(fut, limit)
        except TimeoutError:
            raise FlowTimeout(f"router {self.router_name!r} did not answer the join of flow "
                              f"{flow} within {limit}s") from None
        finally:
            self._forget_req(req)

    def _sync_router(self, fs: FlowState) -> tuple[int, asyncio.Future[C.JoinAck]] | None:
        """Bring the router's view of our membership in line with ``fs``.

        Returns the (request, future) of a JOIN if one was needed. A flow nobody here wants
        any more gets a LEAVE and is forgotten. Between routers (failover) only our own state
        changes; the re-join after the failover sends what is current then.
        """
        key = fs.flow.key
        if not fs.wanted:
            if fs.on_router and self._up and not self._closing:
                self._write_control(key, BAND_MEMBERSHIP, C.Leave())
            fs.on_router = False
            fs.sent_mask = None
            if self._flows.get(key) is fs:
                del self._flows[key]
                self._flow_forgotten(key)
            return None
        if not self._up or self._closing:
            return None
        if fs.on_router and fs.sent_mask == fs.mask():
            return None
        return self._send_join(fs)

    def _background_join(self, fs: FlowState) -> None:
        """A JOIN nobody awaits (repairs after a failed request): log its outcome."""
        sent = self._sync_router(fs)
        if sent is None:
            return
        req, fut = sent
        flow = fs.flow

        def done(f: asyncio.Future[C.JoinAck]) -> None:
            self._forget_req(req)
            if f.cancelled() or f.exception() is not None:
                return
            ack = f.result()
            if ack.status is not C.JoinStatus.OK:
                log.warning("re-join of flow %s refused: %s (%s)", flow, ack.status.name,
                            ack.reason)
                if self._flows.get(flow.key) is fs:
                    fs.on_router = False

        fut.add_done_callback(done)

    def _detach(self, fs: FlowState, lst: Listener | None, router_forgot: bool) -> None:
        if lst is not None:
            if lst in fs.listeners:
                fs.listeners.remove(lst)
            lst._close()
        if router_forgot:
            # a refused JOIN leaves no state for our link at the router
            fs.on_router = False
            fs.sent_mask = None
        self._background_join(fs)

    async def advertise(self, flow: FlowID | str, locality: LocalitySpec = None, *,
                        timeout: float | None = None, capability: Any = None) -> None:
        """Install this flow's path toward its core so anyone can send to it (seed 3.4).

        Sent as a JOIN flagged ADVERTISE with the current listening mask (0 with no
        listener), acknowledged like a join; a refusal raises
        :class:`~flowlib.errors.JoinRefused`. The advertisement lasts until
        :meth:`unadvertise` or the client closes (the client keeps answering GC pings, and
        re-advertises after a failover).

        *locality* is the seed's limit on how far the advertisement spreads; it travels in
        the JOIN's header, but the router core currently always advertises to the core (the
        seed's own retrospective recommendation).
        """
        flow = check_flow(flow)
        loc = check_locality(locality)
        await self._ready(self.request_timeout if timeout is None else timeout)
        fs = self._flow_state(flow)
        set_capability(fs, capability)
        was = fs.advertised, fs.adv_locality
        fs.advertised, fs.adv_locality = True, loc
        req, fut = self._send_join(fs)
        try:
            ack = await self._await_ack(req, fut, flow, timeout)
        except BaseException:
            fs.advertised, fs.adv_locality = was
            self._detach(fs, None, router_forgot=False)
            raise
        if ack.status is not C.JoinStatus.OK:
            fs.advertised, fs.adv_locality = False, (0, 0)
            self._detach(fs, None, router_forgot=True)
            raise JoinRefused(ack.status, ack.reason, flow)

    def publish_policy(self, policy: Any) -> None:
        """Give the router a creator-signed flow policy
        (:class:`flowrouter.wire.capabilities.Policy` or its bytes); routers pass it to each
        other and keep it, so from then on joins and sends on the flows it covers need
        capabilities. Publishing a newer version replaces it (e.g. to revoke tokens)."""
        raw = policy.encode() if hasattr(policy, "encode") else bytes(policy)
        self._check_open()
        self._write_control(LINK_KEY, BAND_MEMBERSHIP, C.PolicyMsg(raw))

    async def unadvertise(self, flow: FlowID | str) -> None:
        """Withdraw an advertisement (listeners on the flow stay)."""
        flow = check_flow(flow)
        fs = self._flows.get(flow.key)
        if fs is None or not fs.advertised:
            return
        fs.advertised, fs.adv_locality = False, (0, 0)
        await self._settle(fs)

    async def listen(self, flow: FlowID | str, bands: BandsSpec = "data", *,
                     size: int = DEFAULT_QUEUE_SIZE, overflow: str | Overflow = "drop-oldest",
                     timeout: float | None = None, name: str | None = None,
                     capability: Any = None) -> Listener:
        """Attach a receive queue to *bands* of *flow* and join the flow with them.

        *bands* is a :class:`~flowrouter.wire.bands.BandMask`, a band number, a list of bands or
        text (``"data"``, ``"32-40,fault"``); bands below 16 never reach applications and are
        ignored. The call returns once the router acknowledged the join (the tree toward the
        core is built by then, so messages sent afterwards arrive); it raises
        :class:`~flowlib.errors.JoinRefused` with the router's reason, or
        :class:`~flowlib.errors.FlowTimeout` after *timeout* seconds (default: the client's
        ``request_timeout``). *name* names the listener in overflow notices (default
        ``listener-N``). Add ``"fault"`` to hear about failovers and router faults, and
        ``"overflow"`` to hear about messages this client dropped.

        *capability* (a :class:`flowrouter.wire.capabilities.Capability` or its bytes) is
        presented with the join for flows whose creator published a policy; it stays with
        the flow (re-joins after a failover present it again). ``advertise`` takes one too,
        which is what lets this client send on a protected flow.
        """
        flow = check_flow(flow)
        mask = listen_mask(bands)
        self._listener_seq += 1
        lst = Listener(flow, mask, size, overflow, name or f"listener-{self._listener_seq}")
        await self._ready(self.request_timeout if timeout is None else timeout)
        fs = self._flow_state(flow)
        set_capability(fs, capability)
        # Registered before the ack so nothing sent right after the join is missed.
        fs.listeners.append(lst)
        req, fut = self._send_join(fs)
        try:
            ack = await self._await_ack(req, fut, flow, timeout)
        except BaseException:
            self._detach(fs, lst, router_forgot=False)
            raise
        if ack.status is not C.JoinStatus.OK:
            self._detach(fs, lst, router_forgot=True)
            raise JoinRefused(ack.status, ack.reason, flow)
        return lst

    async def unlisten(self, listener: Listener, *, timeout: float | None = None) -> None:
        """Remove a listener: narrow our mask on its flow with a new JOIN, or LEAVE the flow
        when nothing else here listens on or advertises it.

        The listener is closed at once (queued messages stay readable, then iteration ends).
        Removing a listener never fails: if the router does not confirm the narrower mask,
        the extra bands cost traffic, not correctness, and are logged.
        """
        fs = self._flows.get(listener.flow.key)
        if fs is None or listener not in fs.listeners:
            listener._close()
            return
        fs.listeners.remove(listener)
        listener._close()
        await self._settle(fs, timeout)

    async def _settle(self, fs: FlowState, timeout: float | None = None) -> None:
        sent = self._sync_router(fs)
        if sent is None:
            return
        req, fut = sent
        try:
            ack = await self._await_ack(req, fut, fs.flow, timeout)
        except (FlowTimeout, ConnectionLost) as exc:
            log.warning("membership change on flow %s not confirmed: %s", fs.flow, exc)
            return
        if ack.status is not C.JoinStatus.OK:
            log.warning("membership change on flow %s refused: %s (%s)", fs.flow,
                        ack.status.name, ack.reason)
            fs.on_router = False

    def listeners(self, flow: FlowID | str | None = None) -> list[Listener]:
        """The open listeners, all or those of one flow."""
        if flow is None:
            return [lst for fs in self._flows.values() for lst in fs.listeners]
        fs = self._flows.get(check_flow(flow).key)
        return list(fs.listeners) if fs else []

    def _answer_carried(self, key: bytes, ack: C.JoinAck) -> None:
        """Answer the requests on *key* that were in flight when the old link died."""
        for req, (k, fut) in list(self._carried.items()):
            if k == key:
                del self._carried[req]
                if not fut.done():
                    fut.set_result(ack)

    def _forget_req(self, req: int) -> None:
        self._pending.pop(req, None)
        self._carried.pop(req, None)
