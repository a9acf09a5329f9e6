"""Admission: who may use this router and how much.

Creators' signed flow policies (gossiped to every router neighbour), the first-hop
capability check of an application's join and data, revocation and expiry, and the
alerts (counted, logged, kept for the status query, told to the flow on band 17) when a
limit trips.
The token formats themselves are :mod:`flowrouter.wire.capabilities`.

A part of the router (see :mod:`flowrouter.core.router`): its own object over the shared
:class:`~flowrouter.core.state.RouterState`, owning the raw policies it gossips and the alert
rate limits; it calls no other part. Membership asks it about joins
(:class:`~flowrouter.core.interfaces.JoinAdmission`), forwarding about data
(:class:`~flowrouter.core.interfaces.SendCheck`), links and the LS exchange raise alerts
through it. Members a new policy excludes (no capability where it now needs one, a revoked
one, or one that no longer grants the bands they hold) are returned
(:meth:`Admission.excluded_by`) for the Router to have membership withdraw them: membership
already calls admission, and the call back would close a cycle.

May import :mod:`flowrouter.wire` and the core's shared modules (state, actions, tables,
lsroutes, tracers); never another part.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from flowrouter.core.actions import Action, Send
from flowrouter.core.state import LINK_KEY, RouterState, control_frame, log
from flowrouter.core.tables import Link, LinkState
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_MEMBERSHIP
from flowrouter.wire.capabilities import CapabilityError, Policy
from flowrouter.wire.flowid import flow_text, key_lsid
from flowrouter.wire.header import DEFAULT_TTL, OFF_LOC_TYPE, OFF_LOC_VALUE, pack_header


class Admission:
    """Policies, capabilities, quotas and limit alerts."""

    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.p = state.p
        self.counters = state.counters
        self.policies = state.policies
        #: raw records of the policies in force, gossiped to every router neighbour
        self._policy_raws: dict[bytes, None] = {}
        #: recent tripped limits, newest last (shown by the status query)
        self.alerts: deque[dict[str, Any]] = deque(maxlen=100)
        self._alerted: dict[tuple[str, bytes | None], float] = {}
        #: limit kind -> (start of its alert interval, flows told in it): :meth:`alert`
        self._notice_window: dict[str, tuple[float, int]] = {}

    def install_policy(self, link: Link, raw: bytes, now: float) -> Policy | None:
        """A creator's signed policy from *link*: verify and install it; the policy now in
        force, or None when it was already known, stale or does not verify (counted)."""
        if raw in self._policy_raws:
            return None
        try:
            if link.role is not C.Role.ROUTER:  # its principal's quota, before the check
                target = Policy.decode(raw)
                wide = target.creator_wide
                refusal = self.state.trust.policy_refusal(
                    link, target.flow_key[:8] if wide else target.flow_key)
                if refusal is not None:  # counted, alerted (the log rate-limited)
                    self.counters[f"refused.{refusal.kind}"] += 1
                    self.alert(refusal.kind, refusal.text, now)
                    return None
            pol = self.policies.install(raw)
        except CapabilityError as exc:
            key = "policies.stale" if exc.reason == "stale-policy" else "refused.policy"
            self.counters[key] += 1
            if exc.reason != "stale-policy":
                log.warning("%s sent a policy that does not verify (%s): %s",
                            link.describe(), exc.reason, exc)
            return None
        self._policy_raws[raw] = None
        self.state.policies_active = True
        self.counters["policies.installed"] += 1
        log.info("policy v%d for %s %s installed (from %s)", pol.version,
                 "creator" if pol.creator_wide else "flow",
                 f"{pol.creator:016x}" if pol.creator_wide else flow_text(pol.flow_key),
                 link.describe())
        return pol

    def gossip(self, raw: bytes, source: int) -> list[Action]:
        """Pass a newly installed policy on to every router neighbour but *source*."""
        body = C.PolicyMsg(raw).encode()
        hdr = pack_header(LINK_KEY, len(body), BAND_MEMBERSHIP)
        return [Send(lid, hdr, body) for lid, lk in self.state.links.items()
                if lk.role is C.Role.ROUTER and lk.state is LinkState.UP and lid != source]

    def policy_frames(self, link_id: int) -> list[Action]:
        """The policies in force, for a router neighbour that just came up."""
        out: list[Action] = []
        for raw in self._policy_raws:
            body = C.PolicyMsg(raw).encode()
            out.append(Send(link_id, pack_header(LINK_KEY, len(body), BAND_MEMBERSHIP), body))
        return out

    def excluded_by(self, pol: Policy, now: float) -> list[tuple[Link, bytes, str]]:
        """The (application link, flow, why) triples a newly installed policy excludes, so
        that a policy arriving late binds the members that joined before it too: a member
        holding bands without a capability where *pol* now requires one to join
        (``policy``), an advertiser without one where it requires one to send (``policy``),
        and a member whose capability *pol* revokes (``revoked``), which has expired
        (``expired``) or no longer grants the bands it holds (``band-denied``).
        Membership withdraws each (PRUNE: it may re-join with a capability)."""
        flows = self.state.flows
        if pol.creator_wide:  # its creator's flows, from the index: no table walk
            keys = sorted(self.state.by_creator.get(pol.flow_key[:8], ()))
        else:
            keys = [pol.flow_key] if pol.flow_key in flows else []
        links = self.state.links
        wall = now + self.state.wall_offset
        out: list[tuple[Link, bytes, str]] = []
        for key in keys:
            if self.policies.policy_for(key) is not pol:
                continue  # a per-flow policy takes precedence over this creator-wide one
            for lid, mask in flows[key].down_items():
                lk = links.get(lid)
                if lk is None or lk.role is not C.Role.ENDPOINT:
                    continue
                cap = lk.caps.get(key) if lk.caps else None
                if cap is None:
                    if (pol.require_join and mask) or (pol.require_send and not mask):
                        out.append((lk, key, "policy"))
                elif cap.serial in pol.revoked:
                    out.append((lk, key, "revoked"))
                elif cap.expiry <= wall:
                    out.append((lk, key, "expired"))
                elif pol.require_join and mask and not cap.may_join(mask):
                    out.append((lk, key, "band-denied"))
        return out

    def authorize_join(self, link: Link, key: bytes, msg: C.Join, now: float
                        ) -> str | None:
        """First-hop check of an application's join or advertise; the refusal text or None.

        The application's own router checks, so an unauthorised join never reaches the tree
        and routers further in need not trust anyone but their authenticated neighbours.
        """
        try:
            wall = now + self.state.wall_offset
            if msg.flags & C.JOIN_FLAG_ADVERTISE and not msg.mask:
                cap = self.policies.authorize(key, "send", msg.capability or None,
                                              link.peer_name, wall)
            else:
                cap = self.policies.authorize_join(key, msg.capability or None,
                                                   link.peer_name, msg.mask, wall)
                if cap is None and msg.capability and self.policies.requires(key, "send"):
                    cap = self.policies.authorize(key, "send", msg.capability,
                                                  link.peer_name, wall)
        except CapabilityError as exc:
            self.counters["refused.capability"] += 1
            self.counters[f"refused.capability.{exc.reason}"] += 1
            log.info("%s: join of %s refused: capability %s: %s", link.describe(),
                     flow_text(key), exc.reason, exc)
            return f"capability {exc.reason}: {exc}"
        if cap is not None:
            if link.caps is None:
                link.caps = {}
            link.caps[key] = cap
        return None

    def over_quota(self, link: Link, key: bytes, msg: C.Join, now: float) -> list[Action]:
        """An application's join against its principal's quotas (flowrouter.core.trust):
        the refusal (counted, alerted, a LIMIT answer), or nothing."""
        refusal = self.state.trust.join_refusal(link, key, self.state.links, now)
        if refusal is None:
            return []
        self.counters[f"refused.{refusal.kind}"] += 1
        out = self.refusal_alert(refusal.kind, refusal.text, refusal.limit, now, key)
        return out + [control_frame(link.link_id, key, C.JoinAck(
            msg.req_id, C.JoinStatus.LIMIT, refusal.text))]

    def refusal_alert(self, kind: str, detail: str, limit: str, now: float, key: bytes
                      ) -> list[Action]:
        """A join of flow *key* was refused over a quota: alert, and tell the flow.

        Who hears what: the refused application gets the JoinAck(LIMIT) with *detail*; the
        flow's members listening on band 17 get a Fault(LIMIT) that names the router and the
        *limit* but not the refused principal (its name or address stays in the log and the
        status query, for the operator). The refused peer chooses the flow, so beyond the
        per-(kind, flow) rate limit at most ``[quota] flow_notices`` different flows per
        kind and alert interval are told (and logged); the rest are only counted.
        """
        notice = f"router {self.p.name} refused a join of this flow: {limit}"
        return self.alert(kind, detail, now, key, notice=notice, budget=True)

    def may_send(self, link: Link, key: bytes, header: memoryview | bytes, band: int,
                  now: float) -> bool:
        cap = link.caps.get(key) if link.caps else None
        return (cap is not None and cap.may_send(band)
                and cap.locality_ok(header[OFF_LOC_TYPE], header[OFF_LOC_VALUE])
                and cap.expiry > now + self.state.wall_offset)

    def alert(self, kind: str, detail: str, now: float, key: bytes | None = None, *,
              notice: str | None = None, budget: bool = False) -> list[Action]:
        """A limit tripped: count it, log it, keep it for the status query, and tell the
        affected flow's members on the fault band (*notice*, else *detail*). Rate-limited
        per (kind, flow); with *budget* (the flow was chosen by whoever tripped the limit)
        also to ``flow_notices`` flows per kind and alert interval."""
        self.counters[f"alerts.{kind}"] += 1
        last = self._alerted.get((kind, key))
        if last is not None and now - last < self.p.alert_interval:
            return []
        if budget and key is not None and not self._notice_allowed(kind, now):
            self.counters["alerts.unannounced"] += 1
            return []
        if len(self._alerted) > 10_000:
            self._alerted.clear()
        self._alerted[(kind, key)] = now
        log.warning("router %s: limit tripped: %s: %s", self.p.name, kind, detail)
        self.alerts.append({"t": round(now - self.state.started, 3), "kind": kind, "detail": detail,
                            "flow": flow_text(key) if key else None})
        if key is None:
            return []
        fault = C.Fault(C.FaultKind.LIMIT, self.p.name, notice or detail, {"limit": kind})
        entry = self.state.flows.get(key)
        if entry is not None:
            return self.state.fault_frames(key, entry, fault)
        # Not on the tree here (e.g. a non-member sender's flow): the notice travels toward
        # the flow's core like the flow's own data, and the tree spreads it from there.
        out_link = self.state.routing.link_for(key_lsid(key))
        if out_link is None:
            return []
        body = fault.encode()
        self.counters["faults.sent"] += 1
        return [Send(out_link, pack_header(key, len(body), BAND_FAULT, 0, 0, DEFAULT_TTL),
                     body)]

    def _notice_allowed(self, kind: str, now: float) -> bool:
        """One more flow may hear about limit *kind* in this alert interval (and takes it)."""
        start, used = self._notice_window.get(kind, (now, 0))
        if now - start >= self.p.alert_interval:
            start, used = now, 0
        if used >= self.state.trust.limits.flow_notices:
            return False
        self._notice_window[kind] = (start, used + 1)
        return True
