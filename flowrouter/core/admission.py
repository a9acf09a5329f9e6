"""Admission: who may use this router and how much.

Creators' signed flow policies (gossiped to every router neighbour), the first-hop
capability check of an application's join and data, revocation and expiry, and the
alerts (counted, logged, kept for the status query, told to the flow on band 17) when a
limit trips.
The token formats themselves are :mod:`flowrouter.wire.capabilities`.

May import :mod:`flowrouter.wire` and the core's shared modules (state, actions, tables,
lsroutes, tracers); never another part (calls into other parts go through ``self``,
declared in :class:`~flowrouter.core.state.RouterState`).
"""

from __future__ import annotations

from typing import Any

from flowrouter.core.actions import Action, Send
from flowrouter.core.state import LINK_KEY, RouterState, log
from flowrouter.core.tables import Link, LinkState
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_MEMBERSHIP
from flowrouter.wire.capabilities import CapabilityError
from flowrouter.wire.flowid import flow_text, key_lsid
from flowrouter.wire.header import DEFAULT_TTL, OFF_LOC_TYPE, OFF_LOC_VALUE, pack_header


class Admission(RouterState):
    """Policies, capabilities, quotas and limit alerts."""

    def _on_policy(self, link: Link, raw: bytes, now: float) -> list[Action]:
        """A creator's signed policy: verify, install, enforce, and pass it on once."""
        if raw in self._policy_raws:
            return []
        try:
            pol = self.policies.install(raw)
        except CapabilityError as exc:
            key = "policies.stale" if exc.reason == "stale-policy" else "refused.policy"
            self.counters[key] += 1
            if exc.reason != "stale-policy":
                log.warning("%s sent a policy that does not verify (%s): %s",
                            link.describe(), exc.reason, exc)
            return []
        self._policy_raws[raw] = None
        self._policies_active = True
        self.counters["policies.installed"] += 1
        log.info("policy v%d for %s %s installed (from %s)", pol.version,
                 "creator" if pol.creator_wide else "flow",
                 f"{pol.creator:016x}" if pol.creator_wide else flow_text(pol.flow_key),
                 link.describe())
        out = self._revoke(pol, now)
        body = C.PolicyMsg(raw).encode()
        hdr = pack_header(LINK_KEY, len(body), BAND_MEMBERSHIP)
        out += [Send(lid, hdr, body) for lid, lk in self.links.items()
                if lk.role is C.Role.ROUTER and lk.state is LinkState.UP
                and lid != link.link_id]
        return out

    def _revoke(self, pol: Any, now: float) -> list[Action]:
        """Members whose capability this policy revokes lose what it granted."""
        out: list[Action] = []
        if not pol.revoked:
            return out
        for lk in list(self.links.values()):
            for key, cap in list((lk.caps or {}).items()):
                if pol.covers(key) and cap.serial in pol.revoked:
                    out += self._withdraw(lk, key, "revoked", now)
        return out

    def _withdraw(self, link: Link, key: bytes, why: str, now: float) -> list[Action]:
        """Take an application off a flow whose capability is no longer valid."""
        if link.caps:
            link.caps.pop(key, None)
        self.counters[f"capability.{why}"] += 1
        entry = self.flows.get(key)
        if entry is None or link.link_id not in entry.down:
            return []
        log.info("%s: capability for %s %s; removed from the flow", link.describe(),
                 flow_text(key), why)
        self._drop_down(entry, key, link.link_id, "refused", now)
        self._prune_notice(link.link_id, key)  # tell it: it may re-join with a new capability
        return self._after_change(key, entry, now, "refused")

    def _authorize_join(self, link: Link, key: bytes, msg: C.Join, now: float
                        ) -> str | None:
        """First-hop check of an application's join or advertise; the refusal text or None.

        The application's own router checks, so an unauthorised join never reaches the tree
        and routers further in need not trust anyone but their authenticated neighbours.
        """
        try:
            wall = now + self.wall_offset
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

    def _over_quota(self, link: Link, key: bytes, msg: C.Join, now: float) -> list[Action]:
        """An application's join against its principal's quotas (flowrouter.core.trust):
        the refusal (counted, alerted, a LIMIT answer), or nothing."""
        refusal = self.trust.join_refusal(link, key, self.links, now)
        if refusal is None:
            return []
        self.counters[f"refused.{refusal.kind}"] += 1
        out = self.refusal_alert(refusal.kind, refusal.text, refusal.limit, now, key)
        return out + [self._control(link.link_id, key, C.JoinAck(
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

    def _may_send(self, link: Link, key: bytes, header: memoryview | bytes, band: int,
                  now: float) -> bool:
        cap = link.caps.get(key) if link.caps else None
        return (cap is not None and cap.may_send(band)
                and cap.locality_ok(header[OFF_LOC_TYPE], header[OFF_LOC_VALUE])
                and cap.expiry > now + self.wall_offset)

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
        self.alerts.append({"t": round(now - self.started, 3), "kind": kind, "detail": detail,
                            "flow": flow_text(key) if key else None})
        if key is None:
            return []
        fault = C.Fault(C.FaultKind.LIMIT, self.p.name, notice or detail, {"limit": kind})
        entry = self.flows.get(key)
        if entry is not None:
            return self._emit_fault(key, entry, fault)
        # Not on the tree here (e.g. a non-member sender's flow): the notice travels toward
        # the flow's core like the flow's own data, and the tree spreads it from there.
        out_link = self.routing.link_for(key_lsid(key))
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
        if used >= self.trust.limits.flow_notices:
            return False
        self._notice_window[kind] = (start, used + 1)
        return True
