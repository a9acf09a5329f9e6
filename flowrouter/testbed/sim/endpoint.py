"""A simulated endpoint: the client side of the router protocol, in virtual time.

It speaks exactly what a flowlib client sends over a real link: HELLO (role ENDPOINT) first,
then JOIN / LEAVE on the membership band, ECHO_REPLY to the router's ECHOs, a REFRESH digest
of its joins and advertisements every ``refresh_interval`` (a fresh JOIN for any flow the
router answers NOT_ON_TREE or PRUNE to), PONG replies to GC pings of older routers, and data
frames with any band, locality and TTL. It records every delivery, join answer and
fault notice, so tests and experiments can inspect what arrived when.

Robustness (what a client library is expected to do, and what the simulator relies on):

* a join answered with anything but OK, or not answered within ``join_timeout``, is retried
  every ``retry_interval`` seconds while the endpoint still wants the flow;
* with ``repair=True`` (off by default: the routers re-graft broken trees themselves) the
  endpoint also listens on the fault band of every flow it joins, and when a LINK_DOWN fault
  arrives it re-grafts the flow (LEAVE then JOIN) after ``repair_delay`` seconds: a
  client-side safety net for experiments with router versions that cannot repair a tree;
* after its link to the router breaks and comes back it says HELLO again and re-joins.

Masks: ``join(flow, 32)`` means band 32; pass a :class:`~flowrouter.wire.bands.BandMask`, an
iterable of bands or text such as ``"32-40"`` for more (see :func:`flowrouter.wire.bands.mask_of`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from flowrouter.wire import control as C
from flowrouter.wire.bands import (
    BAND_FAULT,
    BAND_GC,
    BAND_MEMBERSHIP,
    DEFAULT_DATA_BAND,
    BandMask,
    check_band,
    mask_of,
)
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_TTL,
    Locality,
    MalformedFrame,
    pack_header,
)

if TYPE_CHECKING:  # pragma: no cover
    from flowrouter.testbed.sim.context import SimContext
    from flowrouter.testbed.sim.links import Direction

_LINK_KEY = LINK_LOCAL_FLOW.key
_FAULT_BIT = 1 << BAND_FAULT


class Delivery(NamedTuple):
    """One frame handed to the endpoint on a band >= 16."""

    time: float
    flow: FlowID
    band: int
    payload: bytes
    loc_type: int
    loc_value: int
    ttl: int


class JoinResult(NamedTuple):
    time: float
    flow: FlowID
    status: C.JoinStatus
    reason: str
    req_id: int


class FaultNotice(NamedTuple):
    time: float
    flow: FlowID
    fault: C.Fault


class SimEndpoint:
    """An endpoint attached to one router by one link."""

    def __init__(self, net: SimContext, name: str, router: str, node_id: int, *,
                 roles: tuple[str, ...] = (), repair: bool = False, retry_interval: float = 1.0,
                 join_timeout: float = 10.0, repair_delay: float = 0.5,
                 max_payload: int = DEFAULT_MAX_PAYLOAD,
                 refresh_interval: float | None = C.DEFAULT_REFRESH_INTERVAL) -> None:
        self.net = net
        self.name = name
        self.router = router
        self.node_id = node_id
        self.roles = roles
        self.repair = repair
        self.retry_interval = retry_interval
        self.join_timeout = join_timeout
        self.repair_delay = repair_delay
        self.max_payload = max_payload
        #: seconds between refresh digests (None: never refresh, like an old client)
        self.refresh_interval = refresh_interval
        self._refresh_gen = 0
        self._round = 0
        self.link_name = ""
        self._lid: int | None = None
        self._out: Direction | None = None
        self.router_hello: C.Hello | None = None
        #: flows this endpoint wants: flow -> (mask as requested, advertise-only)
        self.wanted: dict[FlowID, tuple[int, bool]] = {}
        self.joined: dict[FlowID, bool] = {}
        self._pending: dict[int, FlowID] = {}
        self._next_req = 1
        self._regraft_due: set[FlowID] = set()
        self.deliveries: list[Delivery] = []
        self.acks: list[JoinResult] = []
        self.faults: list[FaultNotice] = []
        self.errors: list[tuple[float, str]] = []
        self.counters: Counter[str] = Counter()
        self.on_delivery: Callable[[SimEndpoint, Delivery], Any] | None = None
        self._flow_cache: dict[bytes, FlowID] = {}

    # ------------------------------------------------------------------ wiring (network)
    @property
    def connected(self) -> bool:
        return self._lid is not None

    def attach(self, lid: int, out: Direction) -> None:
        """The transport to the router is up: say HELLO, then (re-)join what we want."""
        self._lid = lid
        self._out = out
        self.counters["connects"] += 1
        hello = C.Hello(self.node_id, C.Role.ENDPOINT, self.name, self.max_payload).encode()
        out.transmit(C.hello_header(len(hello)), hello)  # announces soft state (it echoes)
        for flow in list(self.wanted):
            self._send_join(flow)
        self._refresh_gen += 1
        if self.refresh_interval:
            # a per-endpoint phase, so endpoints do not refresh in step
            phase = (self.node_id % 997) / 997 * self.refresh_interval
            self.net.queue.schedule(self.net.now + phase + 0.001, self._refresh,
                                    self._refresh_gen)

    def _refresh(self, gen: int) -> None:
        """Send the digest of what we want (one round, all chunks at once: an endpoint holds
        few flows), then schedule the next."""
        if gen != self._refresh_gen or self._out is None or not self.refresh_interval:
            return
        self.net.queue.schedule(self.net.now + self.refresh_interval, self._refresh, gen)
        self._round = (self._round + 1) & 0xFFFFFFFF
        entries = [(flow.key, bits | (_FAULT_BIT if self.repair and not adv else 0),
                    C.REFRESH_ADVERTISE if adv else 0)
                   for flow, (bits, adv) in self.wanted.items()]
        per = C.refresh_capacity(self.max_payload)
        count = max(1, -(-len(entries) // per))
        hold_ms = int(self.refresh_interval * C.DEFAULT_HOLD_FACTOR * 1000)
        for i in range(count):
            body = C.Refresh(self._round, i, count, hold_ms,
                             tuple(entries[i * per:(i + 1) * per])).encode()
            self._out.transmit(pack_header(_LINK_KEY, len(body), BAND_MEMBERSHIP), body)
        self.counters["refresh.rounds"] += 1

    def close(self, lid: int, reason: str = "closed") -> None:
        if lid != self._lid:
            return
        self._lid = None
        self._out = None
        self._pending.clear()
        for flow in self.joined:
            self.joined[flow] = False
        self.counters["disconnects"] += 1

    # ------------------------------------------------------------------ API
    @property
    def now(self) -> float:
        return self.net.now

    def join(self, flow: FlowID | str, mask: Any = DEFAULT_DATA_BAND) -> int:
        """Subscribe to *flow* on the bands of *mask*; returns the request id (0 if offline).

        The answer arrives later as a :class:`JoinResult` in :attr:`acks`; :meth:`is_joined`
        tells the current state.
        """
        flow = _flow(flow)
        bits = mask_of(mask)
        self.wanted[flow] = (bits, False)
        self.joined.setdefault(flow, False)
        return self._send_join(flow)

    def advertise(self, flow: FlowID | str) -> int:
        """Install the path toward the core without receiving anything (a sender)."""
        flow = _flow(flow)
        self.wanted[flow] = (0, True)
        self.joined.setdefault(flow, False)
        return self._send_join(flow)

    def leave(self, flow: FlowID | str) -> None:
        flow = _flow(flow)
        self.wanted.pop(flow, None)
        self.joined.pop(flow, None)
        self._pending = {r: f for r, f in self._pending.items() if f != flow}
        self._control(flow, C.Leave())

    def send(self, flow: FlowID | str, band: int = DEFAULT_DATA_BAND,
             payload: bytes = b"", locality: tuple[Locality | int | str, int] | None = None,
             ttl: int = DEFAULT_TTL) -> bool:
        """Send one message; False if the endpoint is not connected (counted)."""
        flow = _flow(flow)
        check_band(band)
        loc_type, loc_value = 0, 0
        if locality is not None:
            loc_type = int(Locality.parse(locality[0]))
            loc_value = int(locality[1])
            if not 0 <= loc_value <= 255:
                raise ValueError(f"locality value must be 0..255, got {loc_value}")
        if not 0 <= ttl <= 255:
            raise ValueError(f"ttl must be 0..255, got {ttl}")
        if len(payload) > self.max_payload:
            raise ValueError(f"payload of {len(payload)} bytes exceeds {self.max_payload}")
        if self._out is None:
            self.counters["send.offline"] += 1
            return False
        self.counters["sent"] += 1
        self._out.transmit(pack_header(flow.key, len(payload), band, loc_type, loc_value, ttl),
                           bytes(payload))
        return True

    def is_joined(self, flow: FlowID | str) -> bool:
        return self.joined.get(_flow(flow), False)

    def received(self, flow: FlowID | str | None = None, band: int | None = None
                 ) -> list[Delivery]:
        f = _flow(flow) if flow is not None else None
        return [d for d in self.deliveries
                if (f is None or d.flow == f) and (band is None or d.band == band)]

    def payloads(self, flow: FlowID | str | None = None, band: int | None = None
                 ) -> list[bytes]:
        return [d.payload for d in self.received(flow, band)]

    # ------------------------------------------------------------------ protocol
    def _control(self, flow: FlowID, msg: C.ControlMessage, band: int = BAND_MEMBERSHIP
                 ) -> None:
        if self._out is None:
            return
        body = msg.encode()
        self._out.transmit(pack_header(flow.key, len(body), band), body)

    def _send_join(self, flow: FlowID) -> int:
        if self._out is None or flow not in self.wanted:
            return 0
        bits, adv = self.wanted[flow]
        req = self._next_req
        self._next_req = (req + 1) & 0xFFFFFFFF or 1
        self._pending[req] = flow
        wire = bits | (_FAULT_BIT if self.repair and not adv else 0)
        self._control(flow, C.Join(req, wire, C.JOIN_FLAG_ADVERTISE if adv else 0))
        self.counters["joins.sent"] += 1
        self.net.queue.schedule(self.net.now + self.join_timeout, self._join_deadline, req)
        return req

    def _join_deadline(self, req: int) -> None:
        flow = self._pending.pop(req, None)
        if flow is None:
            return
        self.counters["joins.timed-out"] += 1
        self.acks.append(JoinResult(self.now, flow, C.JoinStatus.TIMEOUT,
                                    "no answer from the router (endpoint time-out)", req))
        if not self.joined.get(flow):  # a lost JOIN or JOIN_ACK: ask again (idempotent)
            self._send_join(flow)

    def _regraft(self, flow: FlowID) -> None:
        """Leave then join again: rebuilds the path from this endpoint to the tree."""
        if flow not in self.wanted or self._out is None:
            return
        self.counters["regrafts"] += 1
        self.joined[flow] = False
        self._pending = {r: f for r, f in self._pending.items() if f != flow}
        self._control(flow, C.Leave())
        self._send_join(flow)

    def _schedule_regraft(self, flow: FlowID, delay: float) -> None:
        if flow in self._regraft_due:
            return
        self._regraft_due.add(flow)
        self.net.queue.schedule(self.net.now + delay, self._regraft_now, flow)

    def _regraft_now(self, flow: FlowID) -> None:
        self._regraft_due.discard(flow)
        self._regraft(flow)

    def on_frame(self, lid: int, header: bytes, payload: bytes | memoryview) -> None:
        if lid != self._lid:
            return
        key = bytes(header[:16])
        band = header[20]
        try:
            if key == _LINK_KEY:
                msg = C.decode(payload)
                if isinstance(msg, C.Hello):
                    self.router_hello = msg
                elif isinstance(msg, C.Echo) and self._out is not None:
                    body = C.EchoReply(msg.seq, msg.stamp).encode()
                    self._out.transmit(pack_header(_LINK_KEY, len(body), BAND_MEMBERSHIP),
                                       body)
                elif isinstance(msg, (C.NotOnTree, C.Prune)):
                    self.counters["refresh.detached"] += 1
                    for k in msg.keys:
                        fid = self._flow_cache.get(k) or FlowID.from_key(k)
                        if fid in self.wanted:
                            self.joined[fid] = False
                            self._send_join(fid)
                elif isinstance(msg, C.Error):
                    self.errors.append((self.now, msg.text))
                return
            flow = self._flow_cache.get(key)
            if flow is None:
                flow = self._flow_cache[key] = FlowID.from_key(key)
            if band == BAND_MEMBERSHIP:
                msg = C.decode(payload)
                if isinstance(msg, C.JoinAck):
                    self._on_ack(flow, msg)
                return
            if band == BAND_GC:
                msg = C.decode(payload)
                if isinstance(msg, C.Ping):
                    self.counters["pings"] += 1
                    if flow in self.wanted:
                        self.counters["pongs"] += 1
                        self._control(flow, C.Pong(msg.epoch), BAND_GC)
                return
            if band < 16:
                self.counters["unexpected-router-band"] += 1
                return
            if band == BAND_FAULT:
                try:
                    fault = C.decode(payload)
                except MalformedFrame:
                    fault = None
                if isinstance(fault, C.Fault):
                    self.faults.append(FaultNotice(self.now, flow, fault))
                    if (self.repair and fault.kind is C.FaultKind.LINK_DOWN
                            and flow in self.wanted):
                        self.counters["repairs"] += 1
                        self._schedule_regraft(flow, self.repair_delay)
                want = self.wanted.get(flow)
                if want is None or not want[0] & _FAULT_BIT:
                    return
        except MalformedFrame as exc:
            self.counters["malformed"] += 1
            self.errors.append((self.now, f"malformed frame from the router: {exc}"))
            return
        d = Delivery(self.now, flow, band, bytes(payload), header[21], header[22], header[23])
        self.deliveries.append(d)
        self.counters["delivered"] += 1
        net = self.net
        if net.trace is not None:
            net.record(d.time, "deliver", self.link_name, self.name, band, 24 + len(payload),
                       "")
        if self.on_delivery is not None:
            self.on_delivery(self, d)

    def _on_ack(self, flow: FlowID, msg: C.JoinAck) -> None:
        if self._pending.get(msg.req_id) != flow:
            self.counters["acks.stale"] += 1
            return
        del self._pending[msg.req_id]
        self.acks.append(JoinResult(self.now, flow, msg.status, msg.reason, msg.req_id))
        if flow not in self.wanted:
            return
        if msg.status is C.JoinStatus.OK:
            self.joined[flow] = True
            self.counters["joins.ok"] += 1
        else:
            self.joined[flow] = False
            self.counters[f"joins.{msg.status.name.lower()}"] += 1
            self._schedule_regraft(flow, self.retry_interval)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "router": self.router, "connected": self.connected,
                "flows": {str(f): {"mask": str(BandMask(m)), "advertise": adv,
                                   "joined": self.joined.get(f, False)}
                          for f, (m, adv) in self.wanted.items()},
                "delivered": len(self.deliveries), "faults": len(self.faults),
                "counters": dict(sorted(self.counters.items()))}


def _flow(flow: FlowID | str) -> FlowID:
    return flow if isinstance(flow, FlowID) else FlowID.parse(flow)
