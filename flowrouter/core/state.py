"""RouterState: the tables every part of the router shares, and the outbox of link notices.

The :class:`~flowrouter.core.router.Router` is a coordinator over parts with one job each
(links, forwarding, membership, lsexchange, softstate, admission, appmembers, locality).
Each part is its own object that owns its own state; what they all read and change is here,
in one :class:`RouterState` the Router builds and hands to every part at construction: the
link table, the flow route table, the LS routing table, the counters, the tracer, the trust
boundary and the policies in force. What a part calls in another part is declared in
:mod:`flowrouter.core.interfaces`, never reached through a shared ``self``.

The containers here (``links``, ``flows``, ``counters``, ``routing`` ...) are created once
and never rebound, so a part may keep a direct reference to one (the forwarding hot path
does, to stay one attribute away from its tables).

May import :mod:`flowrouter.wire` and the core's data modules (tables, lsroutes, tracers,
policystore, params, actions, trust, quotas, timers); never a part.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from flowrouter.core.actions import Action, Send
from flowrouter.core.lsroutes import LsRouting
from flowrouter.core.params import RouterParams
from flowrouter.core.policystore import PolicyStore
from flowrouter.core.tables import FlowEntry, Link
from flowrouter.core.tracers import NULL_TRACER, Tracer
from flowrouter.core.trust import TrustBoundary
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_MEMBERSHIP
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import DEFAULT_TTL, pack_header

log = logging.getLogger("flowrouter.core")

#: the link-local flow's key (HELLO, AUTH, LS routes, policies, errors)
LINK_KEY = LINK_LOCAL_FLOW.key
#: LSID bytes of a link-local key
ZERO_LSID = b"\0\0\0\0"


class LinkNotices:
    """PRUNE and NOT_ON_TREE keys waiting for the next tick, per link.

    Any part may file one (forwarding: traffic from the tree's side for a flow we hold
    nothing for; membership: a branch we dropped ourselves); the soft state sends them,
    batched per link and kind, at most once per tick and flow."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: dict[tuple[int, int], set[bytes]] = {}

    def __bool__(self) -> bool:
        return bool(self.pending)

    def not_on_tree(self, link_id: int, keys: bytes | list[bytes]) -> None:
        """Tell *link_id* we hold no state for *keys* (one key or several)."""
        self._file(link_id, C.MsgType.NOT_ON_TREE, keys)

    def prune(self, link_id: int, key: bytes) -> None:
        """Tell *link_id* we dropped (key, link) ourselves (hold time, a limit, a withdrawn
        capability): it may re-join."""
        self._file(link_id, C.MsgType.PRUNE, key)

    def _file(self, link_id: int, kind: int, keys: bytes | list[bytes]) -> None:
        held = self.pending.setdefault((link_id, kind), set())
        if isinstance(keys, bytes):
            held.add(keys)
        else:
            held.update(keys)

    def take(self) -> dict[tuple[int, int], set[bytes]]:
        """Everything filed so far, ((link, kind) -> keys); the outbox starts empty again."""
        pending, self.pending = self.pending, {}
        return pending

    def forget(self, link_id: int) -> None:
        """The link is gone: nothing is to be told to it."""
        for k in [k for k in self.pending if k[0] == link_id]:
            del self.pending[k]


class RouterState:
    """One router's shared tables, counters and clock fields (see the module docs)."""

    def __init__(self, params: RouterParams, now: float = 0.0,
                 tracer: Tracer = NULL_TRACER) -> None:
        self.p = params
        #: trace records (flowrouter.core.traces); ``tracing`` keeps the hot path at one test
        self.tracer = tracer
        self.tracing = bool(tracer.enabled)
        #: the link table and the flow route table
        self.links: dict[int, Link] = {}
        self.flows: dict[bytes, FlowEntry] = {}
        self.counters: Counter[str] = Counter()
        #: the LS routing table (LS route vectors from router neighbours)
        self.routing = LsRouting(params.core_lsids, params.routes, params.default_route,
                                 params.max_ls_routes, direct=params.direct_lsids)
        self.started = now
        self.epoch = 0
        #: ticks so far (per-tick budgets count in it)
        self.ticks = 0
        #: bumped whenever links or LS routes change, so shells can wake waiters cheaply
        self.generation = 0
        #: flow policies in force (capabilities.PolicyStore): installed by admission, checked
        #: by forwarding, membership and soft state; ``policies_active`` keeps the data path
        #: at one test while no flow is protected
        self.policies = PolicyStore()
        self.policies_active = False
        #: add to ``now`` to get Unix time (capability expiry is in Unix seconds); the
        #: runtime sets it, the simulator leaves 0
        self.wall_offset = 0.0
        #: who may be a router, and the quotas of everyone else (flowrouter.core.trust)
        self.trust = TrustBoundary(params.quota, params.accept_routers)
        #: PRUNE / NOT_ON_TREE keys for the soft state to send at the next tick
        self.notices = LinkNotices()
        #: the forwarding fast path's mirror of our tables (flowrouter.core.fastpath), told
        #: of every change to an entry or link; None while no fast path is attached
        self.fib: Any = None
        #: keys addressed to this router itself (a region edge's inbox: frames of it are
        #: the region part's messages), which the fast path must leave to the core
        self.local_keys: set[bytes] = set()
        #: flow keys by creator (the key's first 8 bytes): what a creator-wide policy
        #: covers, found without a walk of the whole table
        self.by_creator: dict[bytes, set[bytes]] = {}

    def add_entry(self, key: bytes, entry: FlowEntry) -> None:
        """A new route entry (every part adds entries through this). The fast path is told
        at once: it may mirror the key as absent (a sender that is not a member), which the
        entry now overrides."""
        self.flows[key] = entry
        self.by_creator.setdefault(key[:8], set()).add(key)
        self.entry_changed(key)

    def remove_entry(self, key: bytes) -> None:
        """The route entry of *key* goes (every part removes entries through this)."""
        self.flows.pop(key, None)
        keys = self.by_creator.get(key[:8])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_creator[key[:8]]

    def entry_changed(self, key: bytes) -> None:
        """Any change to the route entry of *key* (links, masks, upstream, removal): the
        fast path forgets its copy (the parts call this wherever they change an entry)."""
        if self.fib is not None:
            self.fib.flow_changed(key)

    def link_changed(self, link_id: int) -> None:
        """Any change to a link that forwarding reads (state, role, costs, removal)."""
        if self.fib is not None:
            self.fib.link_changed(link_id)

    def fault_frames(self, key: bytes, entry: FlowEntry, fault: C.Fault) -> list[Action]:
        """Tell the flow's members (those listening on the fault band) about a fault."""
        body = fault.encode()
        targets = entry.targets(1 << BAND_FAULT)
        if entry.upstream is not None:
            targets.append(entry.upstream)
        elif entry.sib:
            targets += [lk for lk, m in entry.sib.items() if m >> BAND_FAULT & 1]
        if not targets:
            return []
        self.counters["faults.sent"] += len(targets)
        hdr = pack_header(key, len(body), BAND_FAULT, 0, 0, DEFAULT_TTL)
        return [Send(t, hdr, body) for t in targets]


def control_frame(link_id: int, key: bytes, msg: C.ControlMessage,
                  band: int = BAND_MEMBERSHIP) -> Send:
    """A control message of flow *key* (JOIN, JOIN_ACK, LEAVE, MASK) for *link_id*."""
    body = msg.encode()
    return Send(link_id, pack_header(key, len(body), band), body)


def link_message(link_id: int, msg: C.ControlMessage) -> Send:
    """A link-local control message (ERROR, LS routes, policies, soft state)."""
    return control_frame(link_id, LINK_KEY, msg)
