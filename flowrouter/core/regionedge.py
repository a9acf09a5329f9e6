"""The edge of a backbone region: end flows in, aggregate flows across, end flows out.

A part of the router (see :mod:`flowrouter.core.router`), present only on a region's edges
(``RouterParams.region``). To the rest of the router the region is one neighbour: two
pseudo links in the link table (state ``REGION``, so neither the fast path nor the soft
state ever takes them for sockets) stand for it.

* ``REGION_LINK`` is the region as a neighbour router of the end flows. An end flow whose
  location service the region reaches through another edge (its *exit*) has it as its
  upstream; at the exit it is one downstream link whose mask is the union of the other
  edges' masks. Membership and forwarding treat it like any link; what they send to it this
  part carries across: control (JOIN, MASK, LEAVE, JOIN_ACK) as region messages to the
  exit's or the member edge's inbox (:mod:`flowrouter.core.regions`), data wrapped in
  aggregate frames.
* ``UNWRAP_LINK`` is this edge's member link of the aggregates it joins: an aggregate frame
  forwarded to it is unwrapped and forwarded again, as the end flow's frame arriving from
  ``REGION_LINK``, with the end flow's own masks, TTL and locality.

An end flow's exit is the edge through which the region reaches the flow's location
service, learned from the LS routes; when it moves, every edge moves the flows of that LSID
(:class:`~flowrouter.core.regionmoves.ExitMoves`, owned by this part: it elects the exits
and moves the flows through this part's public side, ``regionmoves.EdgeFlows``). The exit
of an end flow keeps the flow's edges and their masks (refreshed by the edges' digests,
held for the hold time) and tells each of them the set (BIND). An edge sending into the
region picks, for each group of edges the set touches, the aggregate the catalogue's policy
gives (:class:`~flowrouter.core.aggregates.Catalogue`) for the edges that want the frame's
band: masks filter at the ingress edge, and a copy reaches at most ``max_extra`` edges that
do not want it. A flow under a policy is never padded: a copy whose aggregate would reach
an edge without members goes to each member edge's inbox instead, so no edge a policy
excludes receives it.

May import :mod:`flowrouter.wire` and the core's shared modules (state, interfaces, actions,
tables, regions, regionmoves, aggregates); never another part.
"""

from __future__ import annotations

from typing import Any

from flowrouter.core import regions as R
from flowrouter.core.actions import Action, Send
from flowrouter.core.aggregates import Catalogue
from flowrouter.core.interfaces import FrameForwarder, RegionTrees
from flowrouter.core.regionmoves import ExitMoves
from flowrouter.core.state import ZERO_LSID, RouterState
from flowrouter.core.tables import Link, LinkState
from flowrouter.wire import control as C
from flowrouter.wire.bands import ALL_BANDS, BAND_REGION, ROUTER_BANDS_END
from flowrouter.wire.flowid import key_lsid
from flowrouter.wire.header import DEFAULT_TTL, HEADER_SIZE, pack_header

#: what an edge joins each aggregate with: every band an application may see
AGGREGATE_MASK = ALL_BANDS & ~((1 << ROUTER_BANDS_END) - 1)
#: seconds between attempts to (re)join an aggregate the edge is not yet on
JOIN_RETRY = 0.25
#: digest entries per frame
DIGEST_CHUNK = 1024

Plan = list[tuple[bytes, tuple[int, ...] | None]]


class RegionEdge:
    """One edge's side of its region (see the module docs)."""

    def __init__(self, state: RouterState, trees: RegionTrees, forwarding: FrameForwarder,
                 now: float) -> None:
        rp: R.RegionParams = state.p.region
        self.rp = rp
        self.state = state
        self.trees = trees
        self.forward = forwarding.forward
        self.flows = state.flows
        self.counters = state.counters
        self.policies = state.policies
        self.catalogue = Catalogue(len(rp.edges), rp.group_size, rp.max_extra)
        self.me = rp.index
        self.inbox = rp.inbox_key(self.me)
        state.local_keys.add(self.inbox)  # the fast path leaves our inbox to us
        self.creator = rp.creator.to_bytes(8, "big")
        mp = state.p.max_payload - HEADER_SIZE - 8
        self.region = Link(R.REGION_LINK, "region", f"region {rp.name}",
                           rp.modifiers.as_tuple(), state=LinkState.REGION,
                           role=C.Role.ROUTER, peer_name=f"region:{rp.name}", max_payload=mp)
        self.unwrap = Link(R.UNWRAP_LINK, "region", f"aggregates of {rp.name}",
                           (0, 0, 0, 0), state=LinkState.REGION, role=C.Role.ROUTER,
                           peer_name=f"aggregates:{rp.name}", max_payload=mp)
        state.links[R.REGION_LINK] = self.region
        state.links[R.UNWRAP_LINK] = self.unwrap
        #: each LSID's exit, elected and followed (pins the routes of the others' LSIDs)
        self.moves = ExitMoves(state, trees, self, self.region)
        #: LSID -> exit edge: the moves' own dict (exit_of is on every frame's way)
        self.exits = self.moves.exits
        if rp.routers:  # the region's own LSIDs stay inside it, and so do its flows
            state.routing.confine(rp.region_lsids(), frozenset(rp.routers))
        me = self.me
        g = self.catalogue.group_of(me)
        root = self.catalogue.root(g)
        #: the aggregates this edge is a member of
        self.aggregates = [rp.aggregate_key(root, bits)
                           for bits in self.catalogue.aggregates_of(me)]
        self._join_at = now
        self._digest_at = now + state.p.refresh_interval
        self._next_req = 1
        #: at an exit: flow -> {edge: (mask, refreshed at)}, the BIND version, and the
        #: edges' joins awaiting the answer of our membership
        self.members: dict[bytes, dict[int, tuple[int, float]]] = {}
        self.versions: dict[bytes, int] = {}
        self.waiting: dict[bytes, list[tuple[int, int]]] = {}
        #: at a member edge: flow -> (version, {edge: mask}) from the exit's BIND
        self.bound: dict[bytes, tuple[int, dict[int, int]]] = {}
        #: per flow and band, the copies a frame takes (forgotten when the edges change)
        self._plans: dict[bytes, dict[int, Plan]] = {}

    def forget_plans(self, key: bytes) -> None:
        """*key*'s edges changed (or its exit moved): plan its copies afresh."""
        self._plans.pop(key, None)

    # ------------------------------------------------------------------ who is who
    def exit_of(self, key: bytes) -> int | None:
        return self.exits.get(key_lsid(key))

    def forged(self, link: Link, header: memoryview | bytes) -> bool:
        """A frame of the region's own flows (an inbox, an aggregate) from outside the
        region: an application or an outside router must not speak for an edge."""
        if header[:8] != self.creator:
            return False
        inside = self.rp.routers
        return link.role is not C.Role.ROUTER or bool(inside) and link.peer_name not in inside

    def owns(self, header: memoryview | bytes) -> bool:
        """A frame of this edge's inbox flow: a message from another edge."""
        return header[:16] == self.inbox

    # ------------------------------------------------------------------ exits
    def sync(self, now: float) -> list[Action]:
        """Links or LS routes changed since we last looked: the exits follow
        (:meth:`ExitMoves.sync <flowrouter.core.regionmoves.ExitMoves.sync>`)."""
        return self.moves.sync(now)

    def link_down(self, link: Link, reason: str, now: float) -> list[Action]:
        """A link closed (the links part calls this in membership's place): elect first,
        so no flow re-grafts by a route the new exit makes wrong; then membership's repair,
        while the old exits still carry its faults to the region's edges (ahead of our new
        offer, which makes the edges move); then the moves."""
        told, moves = self.moves.elect(now)
        out = self.outbound(self.trees.link_down(link, reason, now), now)
        return out + told + self.moves.move(moves, now)

    def _new_req(self) -> int:
        """A request id for a JOIN we make membership take (32 bits, never 0)."""
        req = self._next_req
        self._next_req = (req + 1) & 0xFFFFFFFF or 1
        return req

    def adopt(self, key: bytes, now: float) -> list[Action]:
        """We became the exit of *key*: join it for the edges that joined us already."""
        held = self.members[key]
        acts = self.trees.on_join(self.region, key, C.Join(self._new_req(), _union(held)), now)
        return self._rebind(key, now) + self.outbound(acts, now)

    # ------------------------------------------------------------------ actions out
    def outbound(self, actions: list[Action], now: float) -> list[Action]:
        """Carry across the region whatever the router sent to its two pseudo links."""
        out: list[Action] = []
        for act in actions:
            if type(act) is Send and act.link in (R.REGION_LINK, R.UNWRAP_LINK):
                out += self._pseudo(act, now)
            else:
                out.append(act)
        return out

    def _pseudo(self, act: Send, now: float) -> list[Action]:
        hdr = act.header
        band = hdr[20]
        key = bytes(hdr[:16])
        if act.link == R.UNWRAP_LINK:
            if band < ROUTER_BANDS_END:
                self.counters["region.aggregate-control"] += 1
                return []
            return self._unwrap(act.payload, now)
        if band < ROUTER_BANDS_END or key[8:12] == ZERO_LSID:
            return self._control_out(key, act.payload, now)
        return self._wrap(key, hdr, act.payload, band, now)

    def _control_out(self, key: bytes, payload: Any, now: float) -> list[Action]:
        try:
            msg = C.decode(payload)
        except (C.UnknownControlType, ValueError):
            self.counters["region.control-dropped"] += 1
            return []
        if isinstance(msg, C.JoinAck):  # our membership answered the region's join
            out: list[Action] = []
            for edge, req in self.waiting.pop(key, []):
                out += self.to_edge(edge, R.Ack(key, req, msg.status, msg.reason), now)
                if msg.status is not C.JoinStatus.OK:
                    self.members.get(key, {}).pop(edge, None)
            return out
        exit_edge = self.exit_of(key)
        if exit_edge is None or exit_edge == self.me:
            self.counters["region.control-dropped"] += 1
            return []
        if isinstance(msg, C.Join):
            return self.to_edge(exit_edge, R.Join(key, self.me, msg.req_id, msg.mask), now)
        if isinstance(msg, C.Mask):
            return self.to_edge(exit_edge, R.Mask(key, self.me, msg.mask), now)
        if isinstance(msg, C.Leave):
            self.bound.pop(key, None)
            self._plans.pop(key, None)
            return self.to_edge(exit_edge, R.Leave(key, self.me), now)
        self.counters["region.control-dropped"] += 1
        return []

    def to_edge(self, edge: int, msg: R.RegionMessage, now: float) -> list[Action]:
        """A region message to *edge*'s inbox: it travels by LS routes, statelessly."""
        body = R.encode(msg)
        self.counters["region.messages-sent"] += 1
        if edge == self.me:
            return self.receive(self.unwrap, body, now)
        hdr = pack_header(self.rp.inbox_key(edge), len(body), BAND_REGION, 0, 0, DEFAULT_TTL)
        return self.forward(R.UNWRAP_LINK, self.unwrap, hdr, body, BAND_REGION, now)

    # ------------------------------------------------------------------ data
    def _wrap(self, key: bytes, hdr: Any, payload: Any, band: int, now: float,
              skip: int | None = None) -> list[Action]:
        """An end flow's frame into the region: one copy per group of the edges that want
        its band (none at all when no edge does: masks filter at the ingress)."""
        frame = bytes(hdr) + bytes(payload)
        plan = self._plan(key, band, skip)
        if plan is None:  # no edges known: toward the exit, which knows them
            exit_edge = self.exit_of(key)
            if exit_edge is None or exit_edge == self.me:
                self.counters["drop.region-no-exit"] += 1
                return []
            self.counters["region.toward-exit"] += 1
            return self.to_edge(exit_edge, R.Data(self.me, frame), now)
        if not plan:
            self.counters["region.band-filtered"] += 1
            return []
        out: list[Action] = []
        for agg, direct in plan:
            if direct is not None:
                for edge in direct:
                    out += self.to_edge(edge, R.Data(self.me, frame), now)
                continue
            self.counters["region.wrapped"] += 1
            outer = pack_header(agg, len(frame), band, 0, 0, DEFAULT_TTL)
            out += self.forward(R.UNWRAP_LINK, self.unwrap, outer, frame, band, now)
        return out

    def _unwrap(self, payload: Any, now: float) -> list[Action]:
        frame = bytes(payload)
        if len(frame) < HEADER_SIZE or int.from_bytes(frame[16:20], "big") != len(
                frame) - HEADER_SIZE:
            # the aggregate's own notice (a fault on band 17 from its tree), not an end
            # flow's frame: the aggregate repairs itself, its end flows lose nothing
            self.counters["region.aggregate-notices"] += 1
            return []
        key = frame[:16]
        entry = self.flows.get(key)
        band = frame[20]
        if entry is None or not (entry.upstream == R.REGION_LINK
                                 or entry.has_down(R.REGION_LINK)):
            self.counters["region.wasted"] += 1
            return []
        if entry.upstream == R.REGION_LINK and not entry.agg >> band & 1:
            self.counters["region.wasted"] += 1
            return []
        self.counters["region.unwrapped"] += 1
        return self.forward(R.REGION_LINK, self.region, frame[:HEADER_SIZE],
                            frame[HEADER_SIZE:], band, now)

    def _plan(self, key: bytes, band: int, skip: int | None = None) -> Plan | None:
        """The copies of a band-*band* frame of *key*: (aggregate, None), or (aggregate,
        member edges) for a flow under a policy whose aggregate would be padded (those go
        to each edge's inbox instead). None: this edge knows no edges of the flow."""
        exact = self.state.policies_active and self.policies.policy_for(key) is not None
        per_band = self._plans.get(key)
        if skip is None and not exact and per_band is not None and band in per_band:
            return per_band[band]
        held = self.members.get(key) if self.exit_of(key) == self.me else None
        if held:
            masks = {e: m for e, (m, _) in held.items()}
        else:
            bound = self.bound.get(key)
            if bound is None:
                return None
            masks = dict(bound[1])
        masks.pop(self.me, None)
        if skip is not None:
            masks.pop(skip, None)
        targets = frozenset(e for e, m in masks.items() if m >> band & 1)
        cat = self.catalogue
        plan: Plan = []
        for g, bits, served in cat.plan(targets, prefer=self.me):
            direct = None
            if exact and any(e not in served and e != self.me for e in cat.members(g, bits)):
                direct = tuple(sorted(served))
            plan.append((self.rp.aggregate_key(cat.root(g), bits), direct))
        if skip is None and not exact:
            self._plans.setdefault(key, {})[band] = plan
        return plan

    # ------------------------------------------------------------------ messages in
    def receive(self, link: Link, payload: Any, now: float) -> list[Action]:
        """A frame of our inbox: another edge's message."""
        try:
            msg = R.decode(payload)
        except R.BadRegionMessage:
            self.counters["drop.region-malformed"] += 1
            return []
        self.counters["region.messages-received"] += 1
        if isinstance(msg, R.Data):
            return self._on_data(msg, now)
        if isinstance(msg, R.Join):
            self.waiting.setdefault(msg.flow, []).append((msg.edge, msg.req))
            return self._member(msg.flow, msg.edge, msg.mask, now, join=True)
        if isinstance(msg, R.Mask):
            return self._member(msg.flow, msg.edge, msg.mask, now)
        if isinstance(msg, R.Leave):
            return self._member(msg.flow, msg.edge, None, now)
        if isinstance(msg, R.Ack):
            return self.outbound(self.trees.on_join_ack(
                self.region, msg.flow, C.JoinAck(msg.req, C.JoinStatus(msg.status),
                                                 msg.reason), now), now)
        if isinstance(msg, R.Bind):
            return self._on_bind(msg)
        if isinstance(msg, R.Exits):
            return self.moves.heard(msg.edge, msg.items, now)
        return self._on_digest(msg, now)

    def _on_data(self, msg: R.Data, now: float) -> list[Action]:
        frame = msg.frame
        key = frame[:16]
        band = frame[20]
        entry = self.flows.get(key)
        if entry is None and self.exit_of(key) != self.me:
            self.counters["region.wasted"] += 1
            return []
        self.counters["region.unwrapped"] += 1
        hdr, payload = frame[:HEADER_SIZE], frame[HEADER_SIZE:]
        out = self.forward(R.REGION_LINK, self.region, hdr, payload, band, now)
        if (self.members.get(key) and msg.edge not in self.members[key]
                and self.exit_of(key) == self.me):
            # a non-member's frame met the tree here: on to the flow's other edges
            out += self._wrap(key, hdr, payload, band, now, skip=msg.edge)
        return out

    def _on_bind(self, msg: R.Bind) -> list[Action]:
        entry = self.flows.get(msg.flow)
        held = self.bound.get(msg.flow)
        if entry is None or entry.upstream != R.REGION_LINK or (
                held is not None and held[0] >= msg.version) or (
                not msg.members or msg.members[0][0] != self.exit_of(msg.flow)):
            # (a BIND lists its exit first: one from an exit that is one no more is stale)
            self.counters["region.stale-bind"] += 1
            return []
        self.bound[msg.flow] = (msg.version, dict(msg.members))
        self._plans.pop(msg.flow, None)
        return []

    def _member(self, key: bytes, edge: int, mask: int | None, now: float,
                join: bool = False) -> list[Action]:
        """At the exit: an edge joined, changed its mask or left (*mask* None)."""
        held = self.members.setdefault(key, {})
        old = held.get(edge)
        if mask is None:
            held.pop(edge, None)
        else:
            held[edge] = (mask, now)
        if self.exit_of(key) != self.me:
            # not the exit in our view (yet): kept for when we are (_adopt), else expired
            self.counters["region.not-exit"] += 1
            if not held:
                del self.members[key]
                self.waiting.pop(key, None)
            return []
        if mask is None and old is None:
            if not held:
                del self.members[key]
            return []
        self._plans.pop(key, None)
        union = _union(held)
        out: list[Action] = []
        if not held:
            del self.members[key]
            self.versions.pop(key, None)
            return self.outbound(self.trees.on_leave(self.region, key, now), now)
        if join or old is None:
            acts = self.trees.on_join(self.region, key, C.Join(self._new_req(), union), now)
        elif old[0] != mask:
            acts = self.trees.on_mask(self.region, key, C.Mask(union), now)
        else:
            return []
        if key in self.members and (old is None or mask is None or old[0] != mask):
            out += self._rebind(key, now)
        return out + self.outbound(acts, now)

    def _rebind(self, key: bytes, now: float) -> list[Action]:
        """Tell every edge of the flow the flow's edges (the exit itself: all bands)."""
        held = self.members.get(key)
        if not held:
            return []
        version = self.versions[key] = self.versions.get(key, 0) + 1
        members = self._bind_members(held)
        out: list[Action] = []
        for edge in held:
            out += self.to_edge(edge, R.Bind(key, version, members), now)
        return out

    def _bind_members(self, held: dict[int, tuple[int, float]]
                      ) -> tuple[tuple[int, int], ...]:
        """What a BIND lists: the exit first (all bands), then each edge and its mask."""
        return ((self.me, AGGREGATE_MASK), *sorted((e, m) for e, (m, _) in held.items()))

    def _on_digest(self, msg: R.Digest, now: float) -> list[Action]:
        out: list[Action] = []
        for key, mask, version in msg.items:
            held = self.members.get(key, {}).get(msg.edge)
            if held is None or held[0] != mask:
                out += self._member(key, msg.edge, mask, now)  # a change: BIND to all
                continue
            self.members[key][msg.edge] = (mask, now)
            if self.versions.get(key) != version and self.exit_of(key) == self.me:
                members = self._bind_members(self.members[key])
                out += self.to_edge(msg.edge, R.Bind(key, self.versions.get(key, 0), members),
                                    now)
        return out

    # ------------------------------------------------------------------ time
    def tick(self, now: float) -> list[Action]:
        out = self.moves.sync(now)
        if now >= self._join_at:
            self._join_at = now + JOIN_RETRY
            for agg in self.aggregates:
                entry = self.flows.get(agg)
                if entry is None or not entry.has_down(R.UNWRAP_LINK):
                    out += self.outbound(self.trees.on_join(
                        self.unwrap, agg, C.Join(self._new_req(), AGGREGATE_MASK), now), now)
        if now >= self._digest_at:
            self._digest_at = now + self.state.p.refresh_interval
            out += self.digests(now)
            out += self._expire(now)
            out += self.moves.repeat_offer(now)
        return out

    def digests(self, now: float, keys: list[bytes] | None = None) -> list[Action]:
        """Refresh our joins (or those of *keys*) at their exits (a lost JOIN, MASK, LEAVE
        or BIND is repaired within one interval)."""
        per_exit: dict[int, list[tuple[bytes, int, int]]] = {}
        for key in sorted(self.region.dependent) if keys is None else keys:
            entry = self.flows.get(key)
            exit_edge = self.exit_of(key)
            if entry is None or entry.upstream != R.REGION_LINK or exit_edge is None:
                continue
            version = self.bound.get(key, (0, {}))[0]
            per_exit.setdefault(exit_edge, []).append((key, entry.agg, version))
        out: list[Action] = []
        for edge, items in sorted(per_exit.items()):
            for i in range(0, len(items), DIGEST_CHUNK):
                out += self.to_edge(edge, R.Digest(self.me, tuple(items[i:i + DIGEST_CHUNK])),
                                     now)
        return out

    def _expire(self, now: float) -> list[Action]:
        """At an exit: edges that stopped refreshing a flow for the hold time leave it."""
        hold = self.state.p.hold
        out: list[Action] = []
        for key in sorted(self.members):
            for edge, (_, at) in sorted(self.members.get(key, {}).items()):
                if now - at > hold:
                    self.counters["region.expired"] += 1
                    out += self._member(key, edge, None, now)
        return out

    # ------------------------------------------------------------------ inspection
    def status(self) -> dict[str, Any]:
        joined = 0
        for agg in self.aggregates:
            entry = self.flows.get(agg)
            if entry is not None and entry.joined and entry.has_down(R.UNWRAP_LINK):
                joined += 1
        return {"region": self.rp.name, "edge": self.rp.me, "index": self.me,
                "aggregates": len(self.aggregates), "aggregates_joined": joined,
                "flows_as_exit": sum(1 for k in self.members if self.exit_of(k) == self.me),
                "flows_bound": len(self.bound),
                "exits": {f"{lsid:#x}": self.rp.edges[e] for lsid, e in sorted(self.exits.items())},
                "exit_offers": {self.rp.edges[e]: len(items) for e, (items, _) in
                                sorted(self.moves.table.offers.items())}}


def _union(held: dict[int, tuple[int, float]]) -> int:
    """The union of the edges' masks: what the region, as one link, wants of a flow."""
    union = 0
    for m, _ in held.values():
        union |= m
    return union
