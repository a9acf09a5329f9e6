"""Membership: the shared tree of one flow: join, join-ack, leave and mask, hop by hop.

Seed 002 section 3.4: a join travels toward the flow's core until it meets a router on
the tree; each router keeps the masks of its downstream links and tells its upstream
only the aggregate, so unwanted bands are filtered as early as possible. Entries cut off
from their core become orphans that keep local delivery and re-graft.

May import :mod:`flowrouter.wire` and the core's shared modules (state, actions, tables,
lsroutes, tracers); never another part (calls into other parts go through ``self``,
declared in :class:`~flowrouter.core.state.RouterState`).
"""

from __future__ import annotations

from flowrouter.core.actions import Action, Send
from flowrouter.core.state import RouterState, log
from flowrouter.core.tables import FlowEntry, Link
from flowrouter.wire import control as C
from flowrouter.wire.appmembers import MemberEvent
from flowrouter.wire.bands import BAND_FAULT, BAND_LS
from flowrouter.wire.flowid import flow_text, key_lsid
from flowrouter.wire.header import DEFAULT_TTL, pack_header


class Membership(RouterState):
    """Tree membership: join/leave/mask, aggregates, faults to members."""

    def _on_join(self, link: Link, key: bytes, msg: C.Join, now: float) -> list[Action]:
        lid = link.link_id
        if link.role is C.Role.ENDPOINT:
            refused = self._over_quota(link, key, msg, now)
            if refused:
                return refused
        if self._policies_active and link.role is C.Role.ENDPOINT:
            refusal = self._authorize_join(link, key, msg, now)
            if refusal is not None:
                return [self._control(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.REFUSED,
                                                          refusal))]
        entry = self.flows.get(key)
        if entry is None:
            if len(self.flows) >= self.p.max_flows:
                self.counters["refused.flow-limit"] += 1
                log.warning("flow table full (%d entries): refusing join of %s from %s",
                            len(self.flows), flow_text(key), link.describe())
                return [self._control(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.LIMIT,
                                                          "router flow table is full"))]
            lsid = key_lsid(key)
            if lsid in self.p.core_lsids:
                entry = FlowEntry(None, True, now)
            else:
                up = self.routing.link_for(lsid)
                if up is None or up == lid:
                    self.counters["refused.no-route"] += 1
                    return [self._control(lid, key, C.JoinAck(
                        msg.req_id, C.JoinStatus.NO_ROUTE,
                        f"router {self.p.name} has no route to location service {lsid:#x}"))]
                entry = FlowEntry(up, False, now)
                self.links[up].dependent.add(key)
            self.flows[key] = entry
            self.counters["flows.created"] += 1
            if self._tracing:
                self.tracer.entry_add(now, key, entry.upstream)
        elif lid == entry.upstream:
            return [self._control(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.REFUSED,
                                                      "join arrived from the upstream side"))]
        if (link.role is C.Role.ENDPOINT and key not in link.dependent
                and len(link.dependent) >= self.p.max_flows_per_endpoint):
            self.counters["refused.endpoint-quota"] += 1
            if not entry.down and not entry.sib:
                self._remove_entry(key, entry, "refused", now)
            alerts = self.refusal_alert(
                "endpoint-quota", f"{link.describe()} holds {len(link.dependent)} flows, "
                "the per-application limit", f"an application connection already holds the "
                f"{self.p.max_flows_per_endpoint} flows it may", now, key)
            return alerts + [self._control(lid, key, C.JoinAck(
                msg.req_id, C.JoinStatus.LIMIT, f"this application already holds "
                f"{self.p.max_flows_per_endpoint} flows at router {self.p.name}"))]
        if self._tracing:
            self.tracer.link_add(now, key, lid, msg.mask,
                                 "mask" if lid in entry.down else "join", link.role)
        if lid not in entry.down:
            link.downstream += 1
        old = entry.down.get(lid)
        entry.down[lid] = msg.mask
        entry.traffic[lid] = now
        self._member_changed(key, link, MemberEvent.JOIN if old is None else MemberEvent.MASK,
                             msg.mask, old or 0)
        link.dependent.add(key)
        entry.recompute()
        self._entry_changed(key)
        if entry.joined:
            out: list[Action] = [self._control(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.OK))]
            return out + self._push_mask(key, entry)
        if entry.upstream is None:
            # An orphaned subtree (cut off from the core): it still delivers among its own
            # members, so the joiner is accepted locally while the graft is retried. A
            # partition must not stop a site talking to itself.
            out = [self._control(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.OK))]
            if entry.up_req is None:
                out += self._rejoin(key, entry, now)
            return out
        entry.waiting.append((lid, msg.req_id))
        if entry.up_req is not None:
            return []
        return self._send_join_up(key, entry, now)

    def _join_failed(self, key: bytes, entry: FlowEntry, status: C.JoinStatus,
                     reason: str, now: float) -> list[Action]:
        """Refuse the joins waiting on *entry*; keep members that had already joined.

        When a re-graft fails, members that were already on the tree keep their state
        (local delivery goes on) and the entry becomes an orphan that the GC sweep retries.
        """
        waiting, entry.waiting = entry.waiting, []
        entry.up_req = None
        out: list[Action] = [self._control(lk, key, C.JoinAck(r, status, reason))
                             for lk, r in waiting]
        cause = "timeout" if status is C.JoinStatus.TIMEOUT else "refused"
        for lk, _ in waiting:
            self._drop_down(entry, key, lk, "refused", now)
        if not entry.down and not entry.sib:
            self._remove_entry(key, entry, cause, now)
            return out
        if entry.upstream is not None and entry.upstream in self.links:
            self.links[entry.upstream].dependent.discard(key)
        entry.upstream = None
        entry.joined = False
        self._entry_changed(key)
        self.counters["flows.orphaned"] += 1
        self._orphans.add(key)
        return out

    def _send_join_up(self, key: bytes, entry: FlowEntry, now: float) -> list[Action]:
        assert entry.upstream is not None
        req = self._next_req
        self._next_req = (req + 1) & 0xFFFFFFFF or 1
        entry.up_req = req
        entry.up_req_at = now
        entry.sent_up_mask = entry.agg
        self._pending[key] = entry
        return [self._control(entry.upstream, key, C.Join(req, entry.agg))]

    def _on_join_ack(self, link: Link, key: bytes, msg: C.JoinAck, now: float) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or link.link_id != entry.upstream or entry.up_req != msg.req_id:
            self.counters["control.stale-ack"] += 1
            return []
        if msg.status is C.JoinStatus.OK:
            entry.up_req = None
            waiting, entry.waiting = entry.waiting, []
            entry.joined = True
            out: list[Action] = [self._control(lk, key, C.JoinAck(r, C.JoinStatus.OK))
                                 for lk, r in waiting]
            return out + self._push_mask(key, entry)
        log.info("join of %s refused upstream: %s (%s)", flow_text(key), msg.status.name,
                 msg.reason)
        return self._join_failed(key, entry, msg.status, msg.reason, now)

    def _on_leave(self, link: Link, key: bytes, now: float) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or link.link_id not in entry.down:
            self.counters["control.stale-leave"] += 1
            return []
        self._drop_down(entry, key, link.link_id, "leave", now)
        return self._after_change(key, entry, now, "leave")

    def _on_mask(self, link: Link, key: bytes, msg: C.Mask, now: float) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or link.link_id not in entry.down:
            self.counters["control.stale-mask"] += 1
            return []
        if self._tracing:
            self.tracer.link_add(now, key, link.link_id, msg.mask, "mask", link.role)
        old = entry.down[link.link_id]
        entry.down[link.link_id] = msg.mask
        entry.traffic[link.link_id] = now
        self._member_changed(key, link, MemberEvent.MASK, msg.mask, old)
        entry.recompute()
        self._entry_changed(key)
        return self._push_mask(key, entry)

    def _rejoin(self, key: bytes, entry: FlowEntry, now: float) -> list[Action]:
        """Our path to the core broke: graft the subtree back on by the next best route."""
        lsid = key_lsid(key)
        if lsid in self.p.core_lsids:
            entry.joined = True
            return []
        up = self.routing.link_for(lsid)
        if up is None or up in entry.down:
            return []
        entry.upstream = up
        self._entry_changed(key)
        self.links[up].dependent.add(key)
        return self._send_join_up(key, entry, now)

    def _push_mask(self, key: bytes, entry: FlowEntry) -> list[Action]:
        """Tell upstream our aggregate when it changed, so filtering happens early.

        At a core the "upstream" is the other members of the location service.
        """
        if entry.upstream is None:
            if entry.sent_sib_mask == entry.agg or not entry.joined:
                return []
            siblings = self.routing.siblings(key_lsid(key))
            entry.sent_sib_mask = entry.agg
            msg = C.Mask(entry.agg)
            return [self._control(lid, key, msg, BAND_LS) for lid in siblings]
        if not entry.joined or entry.sent_up_mask == entry.agg:
            return []
        entry.sent_up_mask = entry.agg
        return [self._control(entry.upstream, key, C.Mask(entry.agg))]

    def _drop_down(self, entry: FlowEntry, key: bytes, link_id: int, cause: str,
                   now: float, gone: Link | None = None) -> None:
        """Take *link_id* out of the entry (*gone*: the link itself, when it has already
        left the link table because it closed)."""
        mask = entry.down.pop(link_id, None)
        last = entry.traffic.pop(link_id, None)
        if self._tracing and mask is not None:
            lk = self.links.get(link_id)
            self.tracer.link_del(now, key, link_id, mask, cause,
                                 last, lk.role if lk else None)
        link = self.links.get(link_id)
        if link is not None:
            link.dependent.discard(key)
            if mask is not None:
                link.downstream -= 1
        if mask is not None:
            self._member_changed(key, link or gone, MemberEvent.LEAVE, 0)
        entry.recompute()
        self._entry_changed(key)

    def _after_change(self, key: bytes, entry: FlowEntry, now: float, cause: str
                      ) -> list[Action]:
        if entry.down or entry.sib:
            return self._push_mask(key, entry)
        out: list[Action] = []
        if entry.upstream is not None and entry.upstream in self.links:
            out.append(self._control(entry.upstream, key, C.Leave()))
        elif entry.upstream is None:
            out += self._push_mask(key, entry)  # tells sibling LS members we have no one
        self._remove_entry(key, entry, cause, now)
        return out

    def _remove_entry(self, key: bytes, entry: FlowEntry, cause: str, now: float) -> None:
        self.flows.pop(key, None)
        self._entry_changed(key)
        self.counters["flows.removed"] += 1
        if self._tracing:
            self.tracer.entry_del(now, key, cause)
        for lid in [*entry.down, *(entry.sib or ()), entry.upstream]:
            if lid is not None and lid in self.links:
                self.links[lid].dependent.discard(key)

    def _emit_fault(self, key: bytes, entry: FlowEntry, fault: C.Fault) -> list[Action]:
        """Tell the flow's members (those listening on the fault band) about a fault."""
        body = fault.encode()
        targets = [lk for lk, m in entry.down.items() if m >> BAND_FAULT & 1]
        if entry.upstream is not None:
            targets.append(entry.upstream)
        elif entry.sib:
            targets += [lk for lk, m in entry.sib.items() if m >> BAND_FAULT & 1]
        if not targets:
            return []
        self.counters["faults.sent"] += len(targets)
        hdr = pack_header(key, len(body), BAND_FAULT, 0, 0, DEFAULT_TTL)
        return [Send(t, hdr, body) for t in targets]
