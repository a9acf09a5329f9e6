"""The sans-I/O flow router: events in, actions out, the clock passed in.

The asyncio daemon (:mod:`flowrouter.net`) and the simulator drive this same object. It
owns no sockets and never reads the time: every event method takes ``now`` (seconds, any
monotonic origin) and returns a list of actions for the caller to carry out:

* :class:`Send` ``(link, header, payload)`` — write one frame; ``payload`` is a view into the
  received buffer (never copied), ``header`` a fresh 24 bytes;
* :class:`Close` ``(link, reason)`` — close that link's transport (the router has already
  forgotten it).

Forwarding: docs/architecture.md, "Life of a frame". Join/leave/mask follow Warfield, Flows
(UBC MSc thesis, 2001), section 3.4; its epoch GC (section 4.2.6) became refresh digests with
hold times (docs/architecture.md, "Soft state").
See the module docs of :mod:`flowrouter.wire.bands` and
:mod:`flowrouter.wire.header` for the band allocation and the wire format.

Locality semantics (the seed leaves the edge case open): a message's locality value is a
budget; crossing a link costs the link's modifier for that locality type, and a copy whose
budget would fall below zero is not sent on that link. So value 0 reaches only zero-cost
links (the same host), and geography value 2 stays within the site when inter-site links
cost 3. TTL counts routers: a router drops a message that arrives with TTL 0 and does not
hand a TTL-0 copy to another router (endpoints still get it).

The Router is a coordinator (h11's ``Connection`` is the model): it builds one
:class:`~flowrouter.core.state.RouterState` (the link table, the flow route table, the LS
routing table, counters), builds the parts over it, each its own object owning its own
state, and hands each part the others it calls, typed by the small protocols of
:mod:`flowrouter.core.interfaces` (the parts never import each other, and their calls form
no cycle). It dispatches each event to the part whose job it is and merges the actions they
return:

* :mod:`~flowrouter.core.links` — handshake (HELLO/AUTH), link up, link down;
* :mod:`~flowrouter.core.forwarding` — data frames: output links, TTL and locality per link;
* :mod:`~flowrouter.core.membership` — the flow trees: join, leave, masks, orphans, faults,
  joins awaiting their answer, repairs after a link loss;
* :mod:`~flowrouter.core.lsexchange` — LS route vectors; the members' graph, spanning tree
  and masks at a location service's member;
* :mod:`~flowrouter.core.softstate` — link liveness (ECHO), refresh digests, hold times,
  PRUNE and NOT_ON_TREE: the soft state that repairs itself;
* :mod:`~flowrouter.core.admission` — policies, capabilities, quotas and limit alerts;
* :mod:`~flowrouter.core.appmembers` — applications' joins and leaves, told on band 19;
* :mod:`~flowrouter.core.locality` — measured locality: link costs from RTT and throughput;
* :mod:`~flowrouter.core.regionedge` — on a backbone region's edges only: end flows cross
  the region inside aggregate flows (what the other parts send to the region's pseudo
  links, it carries across; frames of the edge's inbox are its messages).

The clock (``tick``) is the Router's too: epochs and trace snapshots, then each part's timers
in a fixed order (handshake time-outs, join time-outs and orphan re-grafts, the soft state's
timer wheel, membership notices). The seed's epoch GC (ping each idle (flow, link), drop it
after T2: a walk of the whole table every epoch) became aggregated refresh digests with hold
times on a timer wheel: a tick does only the work that fell due, never a table walk. PING and
PONG from older peers are counted and ignored.

Two decisions travel back through the Router rather than between parts, so no two parts call
each other: a peer the soft state finds dead is closed here by the links part, and the members
a new policy excludes are withdrawn here by membership.

The per-frame path stays flat: ``receive`` calls the forwarding part's bound method, kept in
an attribute of the Router, and that part holds its tables directly; the compiled fast path
(:mod:`flowrouter.core.fastpath`) mirrors the shared tables and is told of every change by
``RouterState.entry_changed`` / ``link_changed``.

This module is the core's public face (``Router``, ``RouterParams`` and the actions
``Send``, ``Close``, ``Secure``). May import :mod:`flowrouter.wire` and the rest of the core.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from typing import Any

from flowrouter.core.actions import Action, Close, Secure, Send
from flowrouter.core.admission import Admission
from flowrouter.core.appmembers import AppMembership
from flowrouter.core.forwarding import Forwarding
from flowrouter.core.links import Links
from flowrouter.core.locality import MeasuredLocality
from flowrouter.core.lsexchange import LsExchange
from flowrouter.core.membership import Membership
from flowrouter.core.params import RouterParams
from flowrouter.core.regionedge import RegionEdge
from flowrouter.core.softstate import SoftState
from flowrouter.core.state import ZERO_LSID, RouterState, log
from flowrouter.core.tables import Link, LinkState, Modifiers
from flowrouter.core.tracers import NULL_TRACER, Tracer, snapshot_fields
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_LS, ROUTER_BANDS_END, BandMask
from flowrouter.wire.flowid import flow_text
from flowrouter.wire.header import MalformedFrame

__all__ = ["Action", "Close", "Router", "RouterParams", "Secure", "Send"]


class Router:
    """One overlay router's state machine: the coordinator of its parts."""

    def __init__(self, params: RouterParams, now: float = 0.0,
                 tracer: Tracer = NULL_TRACER) -> None:
        if params.region is not None:  # an edge is the core of its region inbox's LSID
            params = dataclasses.replace(params, core_lsids=params.core_lsids | {
                params.region.inbox_lsid(params.region.index)})
        st = self.state = RouterState(params, now, tracer)
        #: the shared tables, for shells, tests and the status query (the very objects the
        #: parts hold: never rebound)
        self.p = params
        self.links = st.links
        self.flows = st.flows
        self.counters = st.counters
        self.routing = st.routing
        self.tracer = st.tracer
        self.trust = st.trust
        self.policies = st.policies
        self._snapshot_epoch = -1
        # the parts, bottom up: each gets the others it calls (flowrouter.core.interfaces)
        admission = self._admission = Admission(st)
        members = self._members = AppMembership(st, now)
        locality = self._locality = MeasuredLocality(st)
        trees = self._trees = Membership(st, admission, members, now)
        ls = self._ls = LsExchange(st, trees, admission)
        soft = self._soft = SoftState(st, trees, ls, locality, admission)
        forwarding = Forwarding(st, admission)
        #: a region edge's part (None on every other router: one test per frame); it stands
        #: between the links part and membership for a closed link (exits move first)
        self._region = (RegionEdge(st, trees, forwarding, now) if params.region is not None
                        else None)
        self._link_life = Links(st, admission=admission, routes=ls,
                                trees=trees if self._region is None else self._region,
                                liveness=soft, meters=locality)
        #: recent tripped limits, newest last (admission's; shown by the status query)
        self.alerts = admission.alerts
        # the per-frame path calls bound methods kept here: no attribute hop per frame
        self._forward = forwarding.forward
        self._handshake = self._link_life.handshake

    # ------------------------------------------------------------------ shared fields
    #: read per read by the shells (a C getter: no Python call); see RouterState
    generation = property(operator.attrgetter("state.generation"),
                          doc="Bumped whenever links or LS routes change.")
    epoch = property(operator.attrgetter("state.epoch"), doc="The current epoch.")
    started = property(operator.attrgetter("state.started"), doc="When the router started.")

    @property
    def wall_offset(self) -> float:
        """Add to ``now`` to get Unix time (capability expiry); the runtime sets it."""
        return self.state.wall_offset

    @wall_offset.setter
    def wall_offset(self, value: float) -> None:
        self.state.wall_offset = value

    @property
    def fib(self) -> Any:
        """The forwarding fast path's mirror (flowrouter.core.fastpath), or None."""
        return self.state.fib

    @fib.setter
    def fib(self, mirror: Any) -> None:
        self.state.fib = mirror

    # ------------------------------------------------------------------ events
    def receive(self, link_id: int, header: memoryview | bytes, payload: memoryview | bytes,
                now: float) -> list[Action]:
        """One frame arrived on *link_id* (already split by the FrameDecoder or datagram)."""
        link = self.links.get(link_id)
        if link is None:
            return []
        link.rx += 1
        link.heard = now  # any frame is a sign of life (soft state's liveness)
        try:
            if link.state is not LinkState.UP:
                return self._out(self._handshake(link, header, payload, now), now)
            band = header[20]
            if self._region is not None:
                return self._region_receive(link_id, link, header, payload, band, now)
            if band < ROUTER_BANDS_END or header[8:12] == ZERO_LSID:
                return self._admin(link, header, payload, band, now)
            return self._forward(link_id, link, header, payload, band, now)
        except MalformedFrame as exc:
            return self._out(self._link_life.drop_link(link_id, exc, now), now)

    def _region_receive(self, link_id: int, link: Link, header: memoryview | bytes,
                        payload: memoryview | bytes, band: int, now: float) -> list[Action]:
        """At a region edge: the edge's inbox is the region part's; what the others send to
        the region's pseudo links it carries across."""
        region = self._region
        assert region is not None
        if region.forged(link, header):
            self.counters["drop.region-forged"] += 1
            return []
        if region.owns(header):
            out = region.receive(link, payload, now)
        elif band < ROUTER_BANDS_END or header[8:12] == ZERO_LSID:
            out = self._admin(link, header, payload, band, now)
        else:
            out = self._forward(link_id, link, header, payload, band, now)
        return region.outbound(out, now) + region.sync(now)

    def _out(self, actions: list[Action], now: float) -> list[Action]:
        """At a region edge, what the parts sent to the region's pseudo links, carried (and
        the region's exits followed, if links or routes changed)."""
        if self._region is None:
            return actions
        return self._region.outbound(actions, now) + self._region.sync(now)

    def _admin(self, link: Link, header: memoryview | bytes, payload: memoryview | bytes,
               band: int, now: float) -> list[Action]:
        if link.role is not C.Role.ROUTER and self._control_left(link) < 0:
            self.counters["drop.control-budget"] += 1
            if link.control_left == -1:  # the first one dropped this tick: trip the limit
                return self._soft.budget_tripped(
                    link, now, f"over {self.p.control_per_tick} control messages in one "
                    "tick: the rest of this tick's are dropped")
            return []
        try:
            msg = C.decode(payload)
        except C.UnknownControlType:
            return self._link_life.unknown_control(link)
        if (link.role is not C.Role.ROUTER and isinstance(msg, (C.PolicyMsg, C.Join))
                and not self._signature_allowed(link, msg)):
            return []
        key = bytes(header[:16])
        if key[8:12] == ZERO_LSID:
            if isinstance(msg, C.LsRoutes) and link.role is C.Role.ROUTER:
                return self._ls.on_ls_routes(link, msg, now)
            if isinstance(msg, C.LsTopology) and link.role is C.Role.ROUTER:
                return self._ls.on_topology(link, msg, now)
            if isinstance(msg, C.Error):
                log.warning("%s reports: %s", link.describe(), msg.text)
                return []
            if isinstance(msg, C.PolicyMsg):
                return self._on_policy(link, msg.raw, now)
            if isinstance(msg, _SOFT_MESSAGES):
                return self._soft.on_message(link, msg, now)
            if isinstance(msg, C.Hello):
                return self._link_life.hello_on_up_link(link, msg, now)
            if isinstance(msg, C.Auth):
                return self._link_life.auth_on_up_link(link, msg, now)
            raise MalformedFrame("bad-control", f"{type(msg).__name__} is not a link-local "
                                                "message")
        if band >= ROUTER_BANDS_END:  # pragma: no cover - guarded by the caller
            raise MalformedFrame("bad-control", "admin message on a data band")
        self.counters[f"control.{type(msg).__name__.lower()}"] += 1
        trees = self._trees
        if isinstance(msg, C.Join):
            return trees.on_join(link, key, msg, now)
        if isinstance(msg, C.JoinAck):
            return trees.on_join_ack(link, key, msg, now)
        if isinstance(msg, C.Leave):
            return trees.on_leave(link, key, now)
        if isinstance(msg, C.Mask):
            if band == BAND_LS:
                return self._ls.on_sibling_mask(link, key, msg, now)
            return trees.on_mask(link, key, msg, now)
        if isinstance(msg, (C.Ping, C.Pong)):
            return []  # the per-flow GC of older peers: refresh digests replaced it
        raise MalformedFrame("bad-control", f"{type(msg).__name__} on band {band} of a flow")

    def _signature_allowed(self, link: Link, msg: C.PolicyMsg | C.Join) -> bool:
        """A policy, or a join carrying a capability, costs a signature check (about a
        hundred times a plain control message): it counts :data:`SIGNED_COST` against the
        application's control budget, so a flood of signed records cannot stall the loop
        either. False: dropped (counted ``drop.control-budget``)."""
        if isinstance(msg, C.Join) and not msg.capability:
            return True
        link.control_left -= SIGNED_COST - 1
        if link.control_left >= 0:
            return True
        self.counters["drop.control-budget"] += 1
        return False

    def _control_left(self, link: Link) -> int:
        """Count one control message of an application against its ``control_per_tick``
        and say how many are left (negative: over). A flood of joins, each answered, must
        not make one read cost the loop seconds: past the budget, until the next tick, an
        application's control messages are dropped before they are decoded (counted
        ``drop.control-budget``; the work-budget limit trips, see SoftState)."""
        ticks = self.state.ticks
        if link.control_tick != ticks:
            link.control_tick = ticks
            link.control_left = self.p.control_per_tick
        link.control_left -= 1
        return link.control_left

    def _on_policy(self, link: Link, raw: bytes, now: float) -> list[Action]:
        """A creator's signed policy: install it, withdraw the current members it
        excludes (joined before it, revoked, ...), and pass it on to the other router
        neighbours once."""
        pol = self._admission.install_policy(link, raw, now)
        if pol is None:
            return []
        out: list[Action] = []
        for lk, key, why in self._admission.excluded_by(pol, now):
            out += self._trees.withdraw(lk, key, why, now)
        return out + self._admission.gossip(raw, link.link_id)

    def tick(self, now: float) -> list[Action]:
        """Advance the clock. Cost: the handshaking links, the pending joins, the orphans
        (once per refresh interval) and the soft-state timers that fell due."""
        st = self.state
        st.ticks += 1
        st.epoch = int((now - st.started) / self.p.epoch_length)
        if st.tracing and st.epoch != self._snapshot_epoch:
            self._snapshot_epoch = st.epoch  # one table snapshot per epoch
            self.tracer.snapshot(now, **snapshot_fields(st))
        out = self._link_life.tick(now)
        out += self._trees.tick(now)
        soft, dead = self._soft.tick(now)
        out += soft
        for lid, reason in dead:  # peers silent past dead_after: closed like failed links
            out += self._link_life.close_link(lid, now, reason)
            out.append(Close(lid, reason))
        out += self._members.notices(now)
        if self._region is not None:
            out = self._region.outbound(out, now) + self._region.tick(now)
        return out

    def open_link(self, link_id: int, now: float, *, transport: str = "tcp", address: str = "",
                  modifiers: Modifiers | None = None, expected_peer: str | None = None
                  ) -> list[Action]:
        """A transport connected (either direction): say HELLO and await the peer's."""
        return self._out(self._link_life.open_link(
            link_id, now, transport=transport, address=address, modifiers=modifiers,
            expected_peer=expected_peer), now)

    def close_link(self, link_id: int, now: float, reason: str = "closed") -> list[Action]:
        """The transport is gone (or we dropped it): repair every flow that used it."""
        return self._out(self._link_life.close_link(link_id, now, reason), now)

    def drop_link(self, link_id: int, exc: MalformedFrame, now: float) -> list[Action]:
        """Count and report a malformed frame, tell the peer why, and drop only that link."""
        return self._out(self._link_life.drop_link(link_id, exc, now), now)

    def over_control_budget(self, link_id: int) -> bool:
        """The application on *link_id* used up this tick's ``control_per_tick``: its
        further control messages are dropped until the next tick, so its shell may as well
        leave the rest of its input unread until then."""
        lk = self.links.get(link_id)
        return (lk is not None and lk.control_left < 0
                and lk.control_tick == self.state.ticks)

    def input_paused(self, link_id: int, paused: bool, now: float) -> None:
        """The shell stopped (or resumed) reading *link_id* (input credit): while it does
        not read, the peer's silence proves nothing, so liveness leaves the link alone."""
        self._soft.input_paused(link_id, paused, now)

    def measure_rtt(self, link_id: int, rtt: float, now: float) -> bool:
        """One RTT sample of a link. With measured locality on
        (``RouterParams.locality_mapping``) the link's delay modifier follows the smoothed RTT
        (flowrouter.core.measured); True if its costs changed."""
        return self._locality.measure_rtt(link_id, rtt, now)

    def measure_throughput(self, link_id: int, bps: float, now: float) -> bool:
        """One throughput sample (bits/s over a period the link had data waiting)."""
        return self._locality.measure_throughput(link_id, bps, now)

    def set_link_modifiers(self, link_id: int, modifiers: Modifiers) -> bool:
        """Give a link new locality costs; True if they changed (the fast path is told)."""
        return self._locality.set_link_modifiers(link_id, modifiers)

    def default_lsid(self) -> int:
        """The LSID this router announces in its HELLO (configured, else the lowest known)."""
        return self._link_life.default_lsid()

    def alert(self, kind: str, detail: str, now: float, key: bytes | None = None, *,
              notice: str | None = None, budget: bool = False) -> list[Action]:
        """A limit tripped (the shells' too, e.g. a congested link): count it, log it, keep
        it for the status query, and tell the affected flow's members on the fault band."""
        return self._out(self._admission.alert(kind, detail, now, key, notice=notice,
                                               budget=budget), now)

    def refusal_alert(self, kind: str, detail: str, limit: str, now: float, key: bytes
                      ) -> list[Action]:
        """A join of flow *key* was refused over a quota: alert, and tell the flow."""
        return self._out(self._admission.refusal_alert(kind, detail, limit, now, key), now)

    # ------------------------------------------------------------------ inspection
    def status(self, now: float | None = None, flows: Iterable[bytes] | None = None
               ) -> dict[str, Any]:
        """Tables, counters and alerts; with *now*, also how long each link's peer has been
        silent. *flows*: the keys whose rows to give, in that order (None: every flow's; a
        row costs about 11 us, so a view of a large table picks its rows first)."""
        measured = self._locality.status
        links = []
        for lk in self.links.values():
            row = {
                "id": lk.link_id, "peer": lk.peer_name, "role": lk.role.name.lower()
                if lk.role else "?", "state": lk.state.value, "transport": lk.transport,
                "address": lk.address, "flows": len(lk.dependent), "rx": lk.rx, "tx": lk.tx,
                "max_payload": lk.max_payload,
                "modifiers": dict(zip(("bandwidth", "delay", "geography"), lk.modifiers[1:])),
                **self._soft.liveness_status(lk, now),
            }
            meter = measured(lk.link_id)
            if meter is not None:
                row["measured"] = meter
            links.append(row)
        return {
            "name": self.p.name, "node_id": f"{self.p.node_id:016x}", "epoch": self.epoch,
            "core_lsids": sorted(self.p.core_lsids), "links": links,
            "flows": self.flow_rows(flows),
            "flow_count": len(self.flows), "ls_routes": self.routing.table(),
            "counters": dict(sorted(self.counters.items())),
            "alerts": list(self.alerts),
            "quota": self.trust.status(self.links),
            **({"region": self._region.status()} if self._region is not None else {}),
        }

    def flow_rows(self, keys: Iterable[bytes] | None = None) -> list[dict[str, Any]]:
        """The status rows of the flows *keys*, in that order (None: every flow's, in table
        order); about 11 us a row, so the shell renders a large table's a slice at a time,
        letting its loop run in between."""
        flows = self.flows
        return [{
            "flow": flow_text(key),
            "upstream": e.upstream,
            "joined": e.joined,
            "aggregate": _mask_text(e.agg),
            "downstream": {str(lk): _mask_text(m) for lk, m in e.down_items()},
            "siblings": {str(lk): _mask_text(m) for lk, m in (e.sib or {}).items()},
        } for key, e in (flows.items() if keys is None else ((k, flows[k]) for k in keys))]


_SOFT_MESSAGES = (C.Echo, C.EchoReply, C.Refresh, C.Prune, C.NotOnTree)
#: control messages a signed record (a policy, a join with a capability) counts as in an
#: application's control budget: a signature check costs about a hundred plain messages
SIGNED_COST = 16


def _mask_text(bits: int) -> str:
    return str(BandMask(bits))
