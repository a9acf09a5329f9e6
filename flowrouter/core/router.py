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

The Router is a thin coordinator: it dispatches each received frame and inherits the parts
that do the work, one job each, all over the shared :class:`~flowrouter.core.state.RouterState`:

* :mod:`~flowrouter.core.links` — handshake (HELLO/AUTH), link up, link down and its repairs;
* :mod:`~flowrouter.core.forwarding` — data frames: output links, TTL and locality per link;
* :mod:`~flowrouter.core.membership` — the flow trees: join, leave, masks, orphans, faults;
* :mod:`~flowrouter.core.lsexchange` — LS route vectors and sibling LS members' masks;
* :mod:`~flowrouter.core.gc` — the clock: epochs, time-outs, orphan retries;
* :mod:`~flowrouter.core.softstate` — link liveness (ECHO), refresh digests, hold times,
  PRUNE and NOT_ON_TREE: the soft state that repairs itself;
* :mod:`~flowrouter.core.admission` — policies, capabilities, quotas and limit alerts;
* :mod:`~flowrouter.core.appmembers` — applications' joins and leaves, told on band 19.

This module is the core's public face (``Router``, ``RouterParams`` and the actions
``Send``, ``Close``, ``Secure``). May import :mod:`flowrouter.wire` and the rest of the core.
"""

from __future__ import annotations

from typing import Any

from flowrouter.core.actions import Action, Close, Secure, Send
from flowrouter.core.admission import Admission
from flowrouter.core.appmembers import AppMembership
from flowrouter.core.forwarding import Forwarding
from flowrouter.core.gc import GarbageCollection
from flowrouter.core.links import Links
from flowrouter.core.lsexchange import LsExchange
from flowrouter.core.membership import Membership
from flowrouter.core.params import RouterParams
from flowrouter.core.softstate import SoftState
from flowrouter.core.state import ZERO_LSID, RouterState, log
from flowrouter.core.tables import Link, LinkState
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_LS, ROUTER_BANDS_END, BandMask
from flowrouter.wire.flowid import flow_text
from flowrouter.wire.header import MalformedFrame

__all__ = ["Action", "Close", "Router", "RouterParams", "Secure", "Send"]


class Router(Links, Forwarding, Membership, LsExchange, GarbageCollection, SoftState,
             Admission, AppMembership, RouterState):
    """One overlay router's state machine."""

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
                return self._handshake(link, header, payload, now)
            band = header[20]
            if band < ROUTER_BANDS_END or header[8:12] == ZERO_LSID:
                return self._admin(link, header, payload, band, now)
            return self._forward(link_id, link, header, payload, band, now)
        except MalformedFrame as exc:
            return self.drop_link(link_id, exc, now)

    def _admin(self, link: Link, header: memoryview | bytes, payload: memoryview | bytes,
               band: int, now: float) -> list[Action]:
        try:
            msg = C.decode(payload)
        except C.UnknownControlType:
            return self._unknown_control(link)
        key = bytes(header[:16])
        if key[8:12] == ZERO_LSID:
            if isinstance(msg, C.LsRoutes) and link.role is C.Role.ROUTER:
                return self._on_ls_routes(link, msg, now)
            if isinstance(msg, C.Error):
                log.warning("%s reports: %s", link.describe(), msg.text)
                return []
            if isinstance(msg, C.PolicyMsg):
                return self._on_policy(link, msg.raw, now)
            if isinstance(msg, _SOFT_MESSAGES):
                return self._on_soft(link, msg, now)
            if isinstance(msg, C.Hello):
                return self._hello_on_up_link(link, msg, now)
            if isinstance(msg, C.Auth):
                return self._auth_on_up_link(link, msg, now)
            raise MalformedFrame("bad-control", f"{type(msg).__name__} is not a link-local "
                                                "message")
        if band >= ROUTER_BANDS_END:  # pragma: no cover - guarded by the caller
            raise MalformedFrame("bad-control", "admin message on a data band")
        self.counters[f"control.{type(msg).__name__.lower()}"] += 1
        if isinstance(msg, C.Join):
            return self._on_join(link, key, msg, now)
        if isinstance(msg, C.JoinAck):
            return self._on_join_ack(link, key, msg, now)
        if isinstance(msg, C.Leave):
            return self._on_leave(link, key, now)
        if isinstance(msg, C.Mask):
            if band == BAND_LS:
                return self._on_sibling_mask(link, key, msg, now)
            return self._on_mask(link, key, msg, now)
        if isinstance(msg, (C.Ping, C.Pong)):
            return []  # the per-flow GC of older peers: refresh digests replaced it
        raise MalformedFrame("bad-control", f"{type(msg).__name__} on band {band} of a flow")

    def status(self, now: float | None = None) -> dict[str, Any]:
        """Tables, counters and alerts; with *now*, also how long each link's peer has been
        silent."""
        links = [{
            "id": lk.link_id, "peer": lk.peer_name, "role": lk.role.name.lower()
            if lk.role else "?", "state": lk.state.value, "transport": lk.transport,
            "address": lk.address, "flows": len(lk.dependent), "rx": lk.rx, "tx": lk.tx,
            "max_payload": lk.max_payload,
            "modifiers": dict(zip(("bandwidth", "delay", "geography"), lk.modifiers[1:])),
            **self._liveness_status(lk, now),
            **({"measured": self.meters[lk.link_id].status()}
               if lk.link_id in self.meters else {}),
        } for lk in self.links.values()]
        flows = [{
            "flow": flow_text(key),
            "upstream": e.upstream,
            "joined": e.joined,
            "aggregate": _mask_text(e.agg),
            "downstream": {str(lk): _mask_text(m) for lk, m in e.down.items()},
            "siblings": {str(lk): _mask_text(m) for lk, m in (e.sib or {}).items()},
        } for key, e in self.flows.items()]
        return {
            "name": self.p.name, "node_id": f"{self.p.node_id:016x}", "epoch": self.epoch,
            "core_lsids": sorted(self.p.core_lsids), "links": links, "flows": flows,
            "flow_count": len(self.flows), "ls_routes": self.routing.table(),
            "counters": dict(sorted(self.counters.items())),
            "alerts": list(self.alerts),
            "quota": self.trust.status(self.links),
        }


_SOFT_MESSAGES = (C.Echo, C.EchoReply, C.Refresh, C.Prune, C.NotOnTree)


def _mask_text(bits: int) -> str:
    return str(BandMask(bits))
