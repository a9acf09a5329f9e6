"""Forwarding: where one data frame goes, and why it is dropped when it goes nowhere.

The hot path (docs/architecture.md, "Life of a frame"): the flow entry's downstream masks,
its upstream, and at a core the masks of its tree neighbours among the LS members choose the
output links; then each
output link gets its own header, with the TTL and the locality budget charged for that link.

A part of the router (see :mod:`flowrouter.core.router`): its own object over the shared
:class:`~flowrouter.core.state.RouterState`, holding direct references to the tables it
reads per frame (they are never rebound), so the hot path is as flat as a method of the
Router: one attribute away from each table. On a protected flow it asks admission whether an
application may send (:class:`~flowrouter.core.interfaces.SendCheck`); traffic from the
tree's side for a flow it holds nothing for is answered NOT_ON_TREE through the shared
outbox (:class:`~flowrouter.core.state.LinkNotices`).

May import :mod:`flowrouter.wire` and the core's shared modules (state, interfaces, actions,
tables, lsroutes, tracers); never another part.

Bands only routers originate (faults, overflow and membership notices:
:data:`~flowrouter.wire.bands.ROUTER_ONLY_BANDS`) are dropped when an application link sends
them (``drop.app-control``); the fast path's engines hand such frames to the core.
"""

from __future__ import annotations

from flowrouter.core.actions import Action, Send
from flowrouter.core.interfaces import SendCheck
from flowrouter.core.state import RouterState
from flowrouter.core.tables import Link
from flowrouter.wire import control as C
from flowrouter.wire.bands import ROUTER_ONLY_BANDS
from flowrouter.wire.flowid import key_lsid
from flowrouter.wire.header import OFF_LOC_TYPE, OFF_LOC_VALUE, OFF_TTL, pack_header

#: builds a Send without NamedTuple's Python-level __new__ (half the cost, on the hot path)
_new_tuple = tuple.__new__


class Forwarding:
    """Data-frame forwarding: output links, TTL and locality per link, drops."""

    def __init__(self, state: RouterState, admission: SendCheck) -> None:
        self.state = state
        self.admission = admission
        self.links = state.links
        self.flows = state.flows
        self.counters = state.counters
        self.routing = state.routing
        self.policies = state.policies
        self.core_lsids = state.p.core_lsids
        self.notices = state.notices
        self.tracer = state.tracer
        self.tracing = state.tracing

    def _dropped(self, reason: str, key: bytes, band: int, link_id: int, size: int,
                 now: float, links: int = 1) -> list[Action]:
        self.counters["drop." + reason] += 1
        if self.tracing:
            tr = self.tracer
            tr.drop_left -= 1
            if tr.drop_left <= 0:
                tr.drop_sampled(now, key, band, link_id, reason, size, links)
        return []

    def forward(self, link_id: int, link: Link, header: memoryview | bytes,
                 payload: memoryview | bytes, band: int, now: float) -> list[Action]:
        counters = self.counters
        ttl = header[OFF_TTL]
        key = bytes(header[:16])
        if ROUTER_ONLY_BANDS >> band & 1 and link.role is not C.Role.ROUTER:
            # faults and notices are said by routers only: an application cannot speak for
            # one (a fake member, a fake fault) to everyone on the flow
            return self._dropped("app-control", key, band, link_id, len(payload), now)
        if (self.state.policies_active and link.role is C.Role.ENDPOINT
                and self.policies.requires(key, "send")
                and not self.admission.may_send(link, key, header, band, now)):
            return self._dropped("unauthorised", key, band, link_id, len(payload), now)
        if ttl == 0:
            return self._dropped("ttl", key, band, link_id, len(payload), now)
        entry = self.flows.get(key)
        bit = 1 << band
        if entry is None:
            lsid = key_lsid(key)
            if lsid in self.core_lsids:
                return self._dropped("no-members", key, band, link_id, len(payload), now)
            out_link = self.routing.link_for(lsid)
            if out_link is None:
                return self._dropped("no-route", key, band, link_id, len(payload), now)
            if out_link == link_id:
                # from the tree's side, for a flow we hold nothing for: the sender thinks
                # we are downstream of it; NOT_ON_TREE makes it forget the branch
                if link.role is C.Role.ROUTER:
                    self.notices.not_on_tree(link_id, key)
                return self._dropped("no-state", key, band, link_id, len(payload), now)
            targets = [out_link]
            counters["forward.toward-core"] += 1
        else:
            entry.frames += 1
            entry.bytes += len(header) + len(payload)
            up = entry.upstream
            if link_id == up:
                if not entry.agg & bit:  # one test saves a copy on every downstream link
                    return self._dropped("band-filtered", key, band, link_id, len(payload),
                                         now, entry.down_count())
                targets = entry.targets(bit)
            else:
                targets = entry.targets(bit, link_id)
                if up is not None:
                    targets.append(up)
                elif self.routing.trees and not self.routing.admit(
                        key_lsid(key), link_id, (key, band, bytes(payload)), now):
                    # from a fellow member that is no tree neighbour of ours (our views of
                    # the members' tree differ), or a copy gone round while they settle
                    return self._dropped("off-tree", key, band, link_id, len(payload), now)
                elif self.routing.trees and (flood := self.routing.flood(
                        key_lsid(key), key, bit, link_id, now)) is not None:
                    targets += flood  # the members' graph settles: old tree and new
                elif entry.sib and not (link.role is C.Role.ROUTER and self.routing.trees
                                        and self.routing.from_mesh(key_lsid(key), link_id)):
                    # At a core: the other members' sides of the tree, filtered by their
                    # masks, never back to the tree link it came from (split horizon). In
                    # a full mesh of members, what comes from a member goes only down.
                    targets += [lk for lk, m in entry.sib.items()
                                if m & bit and lk != link_id]
            if not targets:
                return self._dropped("no-receivers", key, band, link_id, len(payload), now)
        out = self._emit(targets, key, header, payload, band, ttl - 1, link_id, now)
        if self.tracing and out:
            tr = self.tracer  # sampling countdown inline: no call per unsampled decision
            tr.fwd_left -= 1
            if tr.fwd_left <= 0:
                tr.fwd_sampled(now, key, band, link_id, len(out), len(payload))
        return out

    def _emit(self, targets: list[int], key: bytes, header: memoryview | bytes,
              payload: memoryview | bytes, band: int, ttl: int, in_link: int = 0,
              now: float = 0.0) -> list[Action]:
        """Build one header per distinct (TTL, locality) and a Send per target link."""
        links = self.links
        loc_type = header[OFF_LOC_TYPE]
        size = len(payload)
        out: list[Action] = []
        counters = self.counters
        if loc_type == 0:
            hdr = pack_header(key, size, band, 0, 0, ttl)
            for t in targets:
                lk = links[t]
                if ttl == 0 and lk.role is C.Role.ROUTER:
                    self._dropped("ttl", key, band, in_link, size, now)
                    continue
                if size > lk.max_payload:
                    self._dropped("too-big-for-link", key, band, in_link, size, now)
                    continue
                lk.tx += 1
                out.append(_new_tuple(Send, (t, hdr, payload)))
        else:
            value = header[OFF_LOC_VALUE]
            cache: dict[int, bytes] = {}
            for t in targets:
                lk = links[t]
                left = value - lk.modifiers[loc_type]
                if left < 0:
                    self._dropped("locality", key, band, in_link, size, now)
                    continue
                if ttl == 0 and lk.role is C.Role.ROUTER:
                    self._dropped("ttl", key, band, in_link, size, now)
                    continue
                if size > lk.max_payload:
                    self._dropped("too-big-for-link", key, band, in_link, size, now)
                    continue
                cached = cache.get(left)
                if cached is None:
                    cached = cache[left] = pack_header(key, size, band, loc_type, left, ttl)
                hdr = cached
                lk.tx += 1
                out.append(_new_tuple(Send, (t, hdr, payload)))
        counters["forwarded"] += len(out)
        return out
