"""Membership: the shared tree of one flow: join, join-ack, leave and mask, hop by hop.

Seed 002 section 3.4: a join travels toward the flow's core until it meets a router on
the tree; each router keeps the masks of its downstream links and tells its upstream
only the aggregate, so unwanted bands are filtered as early as possible. Entries cut off
from their core become orphans that keep local delivery and re-graft.

A part of the router (see :mod:`flowrouter.core.router`): its own object over the shared
:class:`~flowrouter.core.state.RouterState` (whose flow route table it keeps), owning the
joins awaiting their upstream answer and the orphans. It asks admission about
applications' joins (:class:`~flowrouter.core.interfaces.JoinAdmission`) and tells
application membership of every local change (:class:`~flowrouter.core.interfaces.MemberLog`);
the LS exchange, the soft state and the links part change the trees through its public
methods (:class:`~flowrouter.core.interfaces.TreeRepair`, ``TreeUpkeep``, ``LinkLoss``).

May import :mod:`flowrouter.wire` and the core's shared modules (state, interfaces, actions,
tables, lsroutes, tracers); never another part.
"""

from __future__ import annotations

from flowrouter.core.actions import Action
from flowrouter.core.interfaces import JoinAdmission, MemberLog
from flowrouter.core.state import RouterState, control_frame, log
from flowrouter.core.tables import FlowEntry, Link
from flowrouter.wire import control as C
from flowrouter.wire.appmembers import MemberEvent
from flowrouter.wire.bands import BAND_LS
from flowrouter.wire.flowid import flow_text, key_lsid


class Membership:
    """Tree membership: join/leave/mask, aggregates, orphans, repairs after a link loss."""

    def __init__(self, state: RouterState, admission: JoinAdmission, members: MemberLog,
                 now: float) -> None:
        self.state = state
        self.admission = admission
        self.members = members
        self.p = state.p
        self.links = state.links
        self.flows = state.flows
        self.counters = state.counters
        self.routing = state.routing
        self.tracer = state.tracer
        self.tracing = state.tracing
        self._next_req = 1
        #: entries cut off from their core: retried as soon as any route changes, and
        #: every refresh interval
        self._orphans: set[bytes] = set()
        self._orphan_retry_at = now
        #: flows with a join awaiting the upstream answer (checked every tick)
        self._pending: dict[bytes, FlowEntry] = {}

    def on_join(self, link: Link, key: bytes, msg: C.Join, now: float) -> list[Action]:
        lid = link.link_id
        if link.role is C.Role.ENDPOINT:
            refused = self.admission.over_quota(link, key, msg, now)
            if refused:
                return refused
        if self.state.policies_active and link.role is C.Role.ENDPOINT:
            refusal = self.admission.authorize_join(link, key, msg, now)
            if refusal is not None:
                return [control_frame(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.REFUSED,
                                                          refusal))]
        entry = self.flows.get(key)
        if entry is None:
            if len(self.flows) >= self.p.max_flows:
                self.counters["refused.flow-limit"] += 1
                log.warning("flow table full (%d entries): refusing join of %s from %s",
                            len(self.flows), flow_text(key), link.describe())
                return [control_frame(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.LIMIT,
                                                          "router flow table is full"))]
            lsid = key_lsid(key)
            if lsid in self.p.core_lsids:
                entry = FlowEntry(None, True, now)
            else:
                up = self.routing.link_for(lsid)
                if up is None or up == lid:
                    self.counters["refused.no-route"] += 1
                    return [control_frame(lid, key, C.JoinAck(
                        msg.req_id, C.JoinStatus.NO_ROUTE,
                        f"router {self.p.name} has no route to location service {lsid:#x}"))]
                entry = FlowEntry(up, False, now)
                self.links[up].dependent.add(key)
            self.state.add_entry(key, entry)
            self.counters["flows.created"] += 1
            if self.tracing:
                self.tracer.entry_add(now, key, entry.upstream)
        elif lid == entry.upstream:
            lsid = key_lsid(key)
            route = None if lsid in self.p.core_lsids else self.routing.link_for(lsid)
            if link.role is not C.Role.ROUTER or route is None or route == lid:
                return [control_frame(lid, key, C.JoinAck(
                    msg.req_id, C.JoinStatus.REFUSED, "join arrived from the upstream side"))]
            # our upstream lost its way to the core, and its new way runs through us while
            # ours no longer runs through it: turn the branch around (graft by our route,
            # then take the old upstream as a downstream like any joiner)
            self.counters["join.turned"] += 1
            self.links[lid].dependent.discard(key)
            turned = self._graft_again(key, entry, now)
            return turned + self.on_join(link, key, msg, now)
        if (link.role is C.Role.ENDPOINT and key not in link.dependent
                and len(link.dependent) >= self.p.max_flows_per_endpoint):
            self.counters["refused.endpoint-quota"] += 1
            if not entry.down_count() and not entry.sib:
                self.remove_entry(key, entry, "refused", now)
            alerts = self.admission.refusal_alert(
                "endpoint-quota", f"{link.describe()} holds {len(link.dependent)} flows, "
                "the per-application limit", f"an application connection already holds the "
                f"{self.p.max_flows_per_endpoint} flows it may", now, key)
            return alerts + [control_frame(lid, key, C.JoinAck(
                msg.req_id, C.JoinStatus.LIMIT, f"this application already holds "
                f"{self.p.max_flows_per_endpoint} flows at router {self.p.name}"))]
        old = entry.set_down(lid, msg.mask, now)
        if self.tracing:
            self.tracer.link_add(now, key, lid, msg.mask,
                                 "mask" if old is not None else "join", link.role)
        if old is None:
            link.downstream += 1
        self.members.member_changed(key, link,
                                    MemberEvent.JOIN if old is None else MemberEvent.MASK,
                                    msg.mask, old or 0)
        link.dependent.add(key)
        entry.recompute()
        self.state.entry_changed(key)
        if entry.joined:
            out: list[Action] = [control_frame(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.OK))]
            return out + self.push_mask(key, entry)
        if entry.upstream is None:
            # An orphaned subtree (cut off from the core): it still delivers among its own
            # members, so the joiner is accepted locally while the graft is retried. A
            # partition must not stop a site talking to itself.
            out = [control_frame(lid, key, C.JoinAck(msg.req_id, C.JoinStatus.OK))]
            if entry.up_req is None:
                out += self._rejoin(key, entry, now)
            return out
        entry.waiting += ((lid, msg.req_id),)
        if entry.up_req is not None:
            return []
        return self.send_join_up(key, entry, now)

    def _join_failed(self, key: bytes, entry: FlowEntry, status: C.JoinStatus,
                     reason: str, now: float) -> list[Action]:
        """Refuse the joins waiting on *entry*; keep members that had already joined.

        When a re-graft fails, members that were already on the tree keep their state
        (local delivery goes on) and the entry becomes an orphan that the GC sweep retries.
        """
        waiting, entry.waiting = entry.waiting, ()
        entry.up_req = None
        out: list[Action] = [control_frame(lk, key, C.JoinAck(r, status, reason))
                             for lk, r in waiting]
        cause = "timeout" if status is C.JoinStatus.TIMEOUT else "refused"
        for lk, _ in waiting:
            self.drop_down(entry, key, lk, "refused", now)
        if not entry.down_count() and not entry.sib:
            self.remove_entry(key, entry, cause, now)
            return out
        if entry.upstream is not None and entry.upstream in self.links:
            self.links[entry.upstream].dependent.discard(key)
        entry.upstream = None
        entry.joined = False
        self.state.entry_changed(key)
        self.counters["flows.orphaned"] += 1
        self._orphans.add(key)
        return out

    def send_join_up(self, key: bytes, entry: FlowEntry, now: float) -> list[Action]:
        assert entry.upstream is not None
        req = self._next_req
        self._next_req = (req + 1) & 0xFFFFFFFF or 1
        entry.up_req = req
        entry.up_req_at = now
        entry.sent_up_mask = entry.agg
        self._pending[key] = entry
        return [control_frame(entry.upstream, key, C.Join(req, entry.agg))]

    def on_join_ack(self, link: Link, key: bytes, msg: C.JoinAck, now: float) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or link.link_id != entry.upstream or entry.up_req != msg.req_id:
            self.counters["control.stale-ack"] += 1
            return []
        if msg.status is C.JoinStatus.OK:
            entry.up_req = None
            waiting, entry.waiting = entry.waiting, ()
            entry.joined = True
            out: list[Action] = [control_frame(lk, key, C.JoinAck(r, C.JoinStatus.OK))
                                 for lk, r in waiting]
            return out + self.push_mask(key, entry)
        log.info("join of %s refused upstream: %s (%s)", flow_text(key), msg.status.name,
                 msg.reason)
        return self._join_failed(key, entry, msg.status, msg.reason, now)

    def on_leave(self, link: Link, key: bytes, now: float) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or not entry.has_down(link.link_id):
            self.counters["control.stale-leave"] += 1
            return []
        self.drop_down(entry, key, link.link_id, "leave", now)
        return self.after_change(key, entry, now, "leave")

    def on_mask(self, link: Link, key: bytes, msg: C.Mask, now: float) -> list[Action]:
        entry = self.flows.get(key)
        old = None if entry is None else entry.mask_of(link.link_id)
        if entry is None or old is None:
            self.counters["control.stale-mask"] += 1
            return []
        if self.tracing:
            self.tracer.link_add(now, key, link.link_id, msg.mask, "mask", link.role)
        entry.set_down(link.link_id, msg.mask, now)
        self.members.member_changed(key, link, MemberEvent.MASK, msg.mask, old)
        entry.recompute()
        self.state.entry_changed(key)
        return self.push_mask(key, entry)

    def _rejoin(self, key: bytes, entry: FlowEntry, now: float) -> list[Action]:
        """Our path to the core broke: graft the subtree back on by the next best route."""
        lsid = key_lsid(key)
        if lsid in self.p.core_lsids:
            entry.joined = True
            return []
        up = self.routing.link_for(lsid)
        if up is None:
            return []
        if entry.has_down(up):
            # the new way to the core runs through one of our downstream neighbours (whose
            # own way no longer runs through us): it stops being downstream, and turns
            # the branch around when our JOIN reaches it (on_join)
            self.drop_down(entry, key, up, "turned", now)
        entry.upstream = up
        self.state.entry_changed(key)
        self.links[up].dependent.add(key)
        return self.send_join_up(key, entry, now)

    def push_mask(self, key: bytes, entry: FlowEntry) -> list[Action]:
        """Tell upstream our aggregate when it changed, so filtering happens early.

        At a core the "upstream" is the other members of the location service: each
        sibling is told what this side of the members' tree wants (lsroutes.sibling_masks).
        """
        if entry.upstream is None:
            if not entry.joined:
                return []
            return [control_frame(lid, key, C.Mask(m), BAND_LS)
                    for lid, m in self.routing.sibling_masks(key, entry)]
        if not entry.joined or entry.sent_up_mask == entry.agg:
            return []
        entry.sent_up_mask = entry.agg
        return [control_frame(entry.upstream, key, C.Mask(entry.agg))]

    def drop_down(self, entry: FlowEntry, key: bytes, link_id: int, cause: str,
                   now: float, gone: Link | None = None) -> None:
        """Take *link_id* out of the entry (*gone*: the link itself, when it has already
        left the link table because it closed)."""
        got = entry.remove_down(link_id)
        mask, last = (None, None) if got is None else got
        if self.tracing and mask is not None:
            lk = self.links.get(link_id)
            self.tracer.link_del(now, key, link_id, mask, cause,
                                 last, lk.role if lk else None)
        link = self.links.get(link_id)
        if link is not None:
            link.dependent.discard(key)
            if mask is not None:
                link.downstream -= 1
        if mask is not None:
            self.members.member_changed(key, link or gone, MemberEvent.LEAVE, 0)
        entry.recompute()
        self.state.entry_changed(key)

    def after_change(self, key: bytes, entry: FlowEntry, now: float, cause: str
                      ) -> list[Action]:
        if entry.down_count() or entry.sib:
            return self.push_mask(key, entry)
        out: list[Action] = []
        if entry.upstream is not None and entry.upstream in self.links:
            out.append(control_frame(entry.upstream, key, C.Leave()))
        elif entry.upstream is None:
            out += self.push_mask(key, entry)  # tells sibling LS members we have no one
        self.remove_entry(key, entry, cause, now)
        return out

    def remove_entry(self, key: bytes, entry: FlowEntry, cause: str, now: float) -> None:
        self.state.remove_entry(key)
        self.state.entry_changed(key)
        self.counters["flows.removed"] += 1
        if self.tracing:
            self.tracer.entry_del(now, key, cause)
        for lid in [*entry.down_links(), *(entry.sib or ()), entry.upstream]:
            if lid is not None and lid in self.links:
                self.links[lid].dependent.discard(key)

    # ------------------------------------------------------------------ repairs
    def link_down(self, link: Link, reason: str, now: float) -> list[Action]:
        """*link* closed (it has left the link table): repair every flow that used it."""
        link_id = link.link_id
        out: list[Action] = []
        for key in sorted(link.dependent):  # sorted: the same order in every process
            entry = self.flows.get(key)
            if entry is None:
                continue
            fault = C.Fault(C.FaultKind.LINK_DOWN, self.p.name,
                            f"{link.describe()} went down: {reason}",
                            {"peer": link.peer_name, "flow": flow_text(key)})
            if entry.upstream == link_id:
                out += self._graft_again(key, entry, now)
            else:
                if entry.sib:
                    entry.sib.pop(link_id, None)
                self.drop_down(entry, key, link_id, "link-down", now, link)
                entry.waiting = tuple((lk, r) for lk, r in entry.waiting if lk != link_id)
            if key in self.flows:
                # Router links carry whole subtrees: their loss is news for every member.
                # An application going away is a membership change, not a fault (heartbeats
                # tell members about each other), and must not let one flaky client flood
                # the tree with notices.
                if link.role is C.Role.ROUTER:
                    out += self.state.fault_frames(key, entry, fault)
                out += self.after_change(key, entry, now, "link-down")
        return out

    def withdraw(self, link: Link, key: bytes, why: str, now: float) -> list[Action]:
        """Take an application off a flow whose capability is no longer valid (revoked by a
        policy, expired, or missing where a policy installed after its join needs one),
        and tell it (PRUNE): it may re-join with a capability. Counted
        ``capability.<why>``, logged."""
        if link.caps:
            link.caps.pop(key, None)
        self.counters[f"capability.{why}"] += 1
        entry = self.flows.get(key)
        if entry is None or not entry.has_down(link.link_id):
            return []
        log.info("%s: removed from %s: %s", link.describe(), flow_text(key),
                 _WITHDRAWN.get(why, f"capability {why}"))
        self.drop_down(entry, key, link.link_id, "refused", now)
        self.state.notices.prune(link.link_id, key)
        return self.after_change(key, entry, now, "refused")

    def regraft(self, key: bytes, now: float) -> list[Action]:
        """The route toward the flow's core changed under a live entry (a backbone
        region's exit moved, flowrouter.core.regionedge): leave the old upstream and join
        by the new route. Members keep their local delivery meanwhile; no route: an
        orphan, retried like any other."""
        entry = self.flows.get(key)
        if entry is None:
            return []
        lsid = key_lsid(key)
        up = None if lsid in self.p.core_lsids else self.routing.link_for(lsid)
        old = entry.upstream
        if up == old:
            return []
        out: list[Action] = []
        if old is not None and old in self.links:
            self.links[old].dependent.discard(key)
            out.append(control_frame(old, key, C.Leave()))
        entry.up_req = None
        return out + self._graft_again(key, entry, now)

    def _graft_again(self, key: bytes, entry: FlowEntry, now: float) -> list[Action]:
        """Cut the entry from its upstream and join by the route there is now (none: an
        orphan, retried)."""
        entry.upstream = None
        entry.joined = False
        self.state.entry_changed(key)
        out = self._rejoin(key, entry, now)
        if entry.upstream is None and not entry.joined:
            self.counters["flows.orphaned"] += 1
            self._orphans.add(key)
        return out

    def retry_orphans(self, now: float) -> list[Action]:
        """Routes changed: graft cut-off subtrees back now rather than at the next tick's
        retry."""
        out: list[Action] = []
        for key in sorted(self._orphans):
            entry = self.flows.get(key)
            if entry is None or entry.upstream is not None or entry.joined:
                self._orphans.discard(key)
                continue
            out += self._rejoin(key, entry, now)
            if entry.up_req is not None:
                self._orphans.discard(key)
        return out

    # ------------------------------------------------------------------ time
    def tick(self, now: float) -> list[Action]:
        """Joins unanswered upstream, and orphans' grafts (once per refresh interval; at
        once when routes change: :meth:`retry_orphans`)."""
        out = self._join_timeouts(now) if self._pending else []
        if self._orphans and now >= self._orphan_retry_at:
            self._orphan_retry_at = now + self.p.refresh_interval
            out += self.retry_orphans(now)
        return out

    def _join_timeouts(self, now: float) -> list[Action]:
        """Fail joins unanswered for ``join_timeout``; send the JOIN again every quarter of
        it before that (a lost JOIN or JOIN_ACK costs a retry, not the member's join; the
        upstream answers a repeated JOIN like the first)."""
        out: list[Action] = []
        limit = self.p.join_timeout
        retry = limit / 4
        for key, entry in list(self._pending.items()):
            if entry.up_req is None or self.flows.get(key) is not entry:
                del self._pending[key]
            elif now - entry.up_req_at > limit:
                del self._pending[key]
                self.counters["join.timeouts"] += 1
                out += self._join_failed(key, entry, C.JoinStatus.TIMEOUT,
                                         "no answer from the core", now)
            elif (entry.upstream is not None
                  and now - max(entry.up_req_at, entry.up_req_resent) >= retry):
                entry.up_req_resent = now
                self.counters["join.resent"] += 1
                out.append(control_frame(entry.upstream, key, C.Join(entry.up_req, entry.agg)))
        return out


#: why an application was taken off a flow, for the log (withdraw's *why*)
_WITHDRAWN = {
    "policy": "a policy installed after it joined requires a capability it does not hold",
    "revoked": "its capability was revoked by a policy",
    "expired": "its capability expired",
    "band-denied": "its capability does not grant the bands it holds",
}
