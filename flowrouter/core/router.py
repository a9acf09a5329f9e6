"""The sans-I/O flow router: events in, actions out, the clock passed in.

The asyncio daemon (:mod:`flowrouter.net.runtime`) and the simulator drive this same object. It
owns no sockets and never reads the time: every event method takes ``now`` (seconds, any
monotonic origin) and returns a list of actions for the caller to carry out:

* :class:`Send` ``(link, header, payload)`` — write one frame; ``payload`` is a view into the
  received buffer (never copied), ``header`` a fresh 24 bytes;
* :class:`Close` ``(link, reason)`` — close that link's transport (the router has already
  forgotten it).

Forwarding follows DESIGN.md section 6; join/leave/mask and the epoch GC follow seed 002
sections 3.4 and 4.2.6. See the module docs of :mod:`flowrouter.wire.bands` and
:mod:`flowrouter.wire.header` for the band allocation and the wire format.

Locality semantics (the seed leaves the edge case open): a message's locality value is a
budget; crossing a link costs the link's modifier for that locality type, and a copy whose
budget would fall below zero is not sent on that link. So value 0 reaches only zero-cost
links (the same host), and geography value 2 stays within the site when inter-site links
cost 3. TTL counts routers: a router drops a message that arrives with TTL 0 and does not
hand a TTL-0 copy to another router (endpoints still get it).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from flowrouter.core.lsroutes import LsRouting
from flowrouter.core.tables import FlowEntry, Link, LinkState, Modifiers
from flowrouter.core.traces import NULL_TRACER, Tracer, snapshot_fields
from flowrouter.wire import control as C
from flowrouter.wire.bands import (
    BAND_FAULT,
    BAND_GC,
    BAND_LS,
    BAND_MEMBERSHIP,
    ROUTER_BANDS_END,
    BandMask,
)
from flowrouter.wire.capabilities import CapabilityError, PolicyStore
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, flow_text, key_lsid
from flowrouter.wire.header import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_TTL,
    OFF_LOC_TYPE,
    OFF_LOC_VALUE,
    OFF_TTL,
    MalformedFrame,
    pack_header,
)
from flowrouter.wire.linkauth import AuthError, LinkAuthenticator, LinkCipher, ReplayCache

log = logging.getLogger("flowrouter.core")

_LINK_KEY = LINK_LOCAL_FLOW.key
_ZERO_LSID = b"\0\0\0\0"


class Send(NamedTuple):
    link: int
    header: bytes
    payload: bytes | memoryview


class Close(NamedTuple):
    link: int
    reason: str


class Secure(NamedTuple):
    """From now on, seal what goes out on *link* and open what comes in with *cipher*:
    everything after the peer's AUTH frame, and everything the actions after this one
    send. Only emitted for stream (TCP) links that negotiated encryption."""

    link: int
    cipher: LinkCipher


Action = Send | Close | Secure

#: builds a Send without NamedTuple's Python-level __new__ (half the cost, on the hot path)
_new_tuple = tuple.__new__


@dataclass(slots=True)
class RouterParams:
    """Everything the core needs to know about itself (the daemon's TOML fills it in)."""

    name: str
    node_id: int
    max_payload: int = DEFAULT_MAX_PAYLOAD
    #: LSIDs for which this router is the core of the shared trees
    core_lsids: frozenset[int] = frozenset()
    #: LSID suggested to endpoints for new flows (0: the first core LSID known)
    default_lsid: int = 0
    #: static LS routes: LSID -> name of the neighbouring router toward it
    routes: dict[int, str] = field(default_factory=dict)
    #: neighbour used for LSIDs with no other route
    default_route: str | None = None
    epoch_length: float = 5.0  #: seconds per GC epoch
    gc_ping_after: int = 3  #: T1: idle epochs on (flow, link) before a keep-alive ping
    gc_delete_after: int = 6  #: T2: idle epochs before the link leaves the entry
    join_timeout: float = 5.0  #: seconds an upstream join may stay unanswered
    max_flows: int = 1_000_000  #: flow-table limit; joins past it are refused
    max_flows_per_endpoint: int = 4096  #: flows one application link may hold state for
    alert_interval: float = 5.0  #: at most one alert per (limit, flow) in this many seconds
    max_ls_routes: int = 4096  #: LSIDs this router keeps routes for
    #: link authentication (flowrouter.wire.linkauth.KeyRing); None: links are not authenticated.
    #: With a key ring, every ROUTER link must prove it holds a key; applications must too
    #: when ``auth_endpoints`` (and may, by sending credentials, anyway).
    keyring: Any = None
    auth_key_id: str | None = None
    auth_encrypt: bool = False  #: ask for encrypted links (TCP; on if either side asks)
    auth_endpoints: bool = False
    handshake_timeout: float = 10.0
    #: locality costs of links to applications (accepted links from routers adopt the
    #: costs the dialling router announces)
    endpoint_modifiers: Modifiers = field(default_factory=Modifiers)

    def __post_init__(self) -> None:
        if not self.gc_delete_after > self.gc_ping_after >= 1:
            raise ValueError("GC thresholds need 1 <= gc_ping_after (T1) < gc_delete_after (T2)")
        if self.epoch_length <= 0:
            raise ValueError("epoch_length must be positive")


class Router:
    """One overlay router's state machine."""

    def __init__(self, params: RouterParams, now: float = 0.0,
                 tracer: Tracer = NULL_TRACER) -> None:
        self.p = params
        #: trace records (flowrouter.core.traces); ``_tracing`` keeps the hot path at one test
        self.tracer = tracer
        self._tracing = bool(tracer.enabled)
        self._snapshot_epoch = -1
        self.links: dict[int, Link] = {}
        self.flows: dict[bytes, FlowEntry] = {}
        self.counters: Counter[str] = Counter()
        self.routing = LsRouting(params.core_lsids, params.routes, params.default_route,
                                 params.max_ls_routes)
        self.started = now
        self.epoch = 0
        self._next_req = 1
        self._gc_keys: list[bytes] = []
        self._gc_pos = 0
        self._gc_last = now
        #: recent tripped limits, newest last (shown by the status query)
        self.alerts: deque[dict[str, Any]] = deque(maxlen=100)
        self._alerted: dict[tuple[str, bytes | None], float] = {}
        #: flow policies in force (capabilities.PolicyStore) and their raw records, which
        #: are gossiped to every router neighbour; ``_policies_active`` keeps the data path
        #: at one test while no flow is protected
        self.policies = PolicyStore()
        self._policy_raws: dict[bytes, None] = {}
        self._policies_active = False
        #: add to ``now`` to get Unix time (capability expiry is in Unix seconds); the
        #: runtime sets it, the simulator leaves 0
        self.wall_offset = 0.0
        self._replay = ReplayCache()
        #: links still in their handshake (the only ones a tick must check for time-outs)
        self._handshaking: set[int] = set()
        #: entries cut off from their core: retried as soon as any route changes
        self._orphans: set[bytes] = set()
        #: flows with a join awaiting the upstream answer (checked every tick, not by the GC)
        self._pending: dict[bytes, FlowEntry] = {}
        #: bumped whenever links or LS routes change, so shells can wake waiters cheaply
        self.generation = 0

    # ------------------------------------------------------------------ links
    def open_link(self, link_id: int, now: float, *, transport: str = "tcp", address: str = "",
                  modifiers: Modifiers | None = None, expected_peer: str | None = None
                  ) -> list[Action]:
        """A transport connected (either direction): say HELLO and await the peer's."""
        if link_id in self.links:
            raise ValueError(f"link id {link_id} is already in use")
        mods = (modifiers or Modifiers()).as_tuple()
        self.links[link_id] = Link(link_id, transport, address, mods, expected_peer,
                                   modifiers_configured=modifiers is not None, opened_at=now)
        self._handshaking.add(link_id)
        creds = b""
        if self.p.keyring is not None:
            auth = self.links[link_id].auth = LinkAuthenticator(
                self.p.keyring, my_name=self.p.name, my_role=C.Role.ROUTER,
                key_id=self.p.auth_key_id, encrypt=self.p.auth_encrypt,
                replay_cache=self._replay, require_endpoints=self.p.auth_endpoints)
            creds = auth.hello_credentials()
        hello = C.Hello(self.p.node_id, C.Role.ROUTER, self.p.name, self.p.max_payload,
                        self.default_lsid(), creds,
                        modifiers=(mods[1], mods[2], mods[3]) if modifiers is not None
                        else (0, 0, 0)).encode()
        return [Send(link_id, pack_header(_LINK_KEY, len(hello), BAND_MEMBERSHIP), hello)]

    def default_lsid(self) -> int:
        if self.p.default_lsid:
            return self.p.default_lsid
        known = self.routing.known_lsids()
        return min(known) if known else 0

    def close_link(self, link_id: int, now: float, reason: str = "closed") -> list[Action]:
        """The transport is gone (or we dropped it): repair every flow that used it."""
        link = self.links.pop(link_id, None)
        self._handshaking.discard(link_id)
        if link is None:
            return []
        was_up = link.state is LinkState.UP
        link.state = LinkState.DOWN
        self.generation += 1
        log.info("%s %s: %s", "lost" if was_up else "gave up on", link.describe(), reason)
        self.counters["links.down"] += 1
        if self._tracing:
            self.tracer.link_down(now, link_id, link.peer_name, link.role, reason)
        out: list[Action] = []
        if link.role is C.Role.ROUTER:
            out += self._advertise_routes(self.routing.link_down(link_id), now)
        for key in sorted(link.dependent):  # sorted: the same order in every process
            entry = self.flows.get(key)
            if entry is None:
                continue
            fault = C.Fault(C.FaultKind.LINK_DOWN, self.p.name,
                            f"{link.describe()} went down: {reason}",
                            {"peer": link.peer_name, "flow": flow_text(key)})
            if entry.upstream == link_id:
                entry.upstream = None
                entry.joined = False
                out += self._rejoin(key, entry, now)
                if entry.upstream is None and not entry.joined:
                    self.counters["flows.orphaned"] += 1
                    self._orphans.add(key)
            else:
                if entry.sib:
                    entry.sib.pop(link_id, None)
                self._drop_down(entry, key, link_id, "link-down", now)
                entry.waiting = [(lk, r) for lk, r in entry.waiting if lk != link_id]
            if key in self.flows:
                # Router links carry whole subtrees: their loss is news for every member.
                # An application going away is a membership change, not a fault (heartbeats
                # tell members about each other), and must not let one flaky client flood
                # the tree with notices.
                if link.role is C.Role.ROUTER:
                    out += self._emit_fault(key, entry, fault)
                out += self._after_change(key, entry, now, "link-down")
        return out

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
        self.links[up].dependent.add(key)
        return self._send_join_up(key, entry, now)

    # ------------------------------------------------------------------ receive
    def receive(self, link_id: int, header: memoryview | bytes, payload: memoryview | bytes,
                now: float) -> list[Action]:
        """One frame arrived on *link_id* (already split by the FrameDecoder or datagram)."""
        link = self.links.get(link_id)
        if link is None:
            return []
        link.rx += 1
        try:
            if link.state is not LinkState.UP:
                return self._handshake(link, header, payload, now)
            band = header[20]
            if band < ROUTER_BANDS_END or header[8:12] == _ZERO_LSID:
                return self._admin(link, header, payload, band, now)
            return self._forward(link_id, link, header, payload, band, now)
        except MalformedFrame as exc:
            return self.drop_link(link_id, exc, now)

    def drop_link(self, link_id: int, exc: MalformedFrame, now: float) -> list[Action]:
        """Count and report a malformed frame, tell the peer why, and drop only that link."""
        link = self.links.get(link_id)
        self.counters["malformed"] += 1
        self.counters[f"malformed.{exc.reason}"] += 1
        desc = link.describe() if link else f"link {link_id}"
        log.warning("%s: malformed frame (%s); dropping the link", desc, exc)
        err = C.Error(1, f"malformed frame: {exc}").encode()
        out: list[Action] = [Send(link_id, pack_header(_LINK_KEY, len(err), BAND_MEMBERSHIP),
                                  err)]
        out += self.close_link(link_id, now, f"malformed frame ({exc.reason})")
        out.append(Close(link_id, f"malformed frame: {exc}"))
        return out

    def _handshake(self, link: Link, header: memoryview | bytes, payload: memoryview | bytes,
                   now: float) -> list[Action]:
        if bytes(header[:16]) != _LINK_KEY:
            raise MalformedFrame("no-hello", "first frame on a link must be HELLO")
        msg = C.decode(payload)
        if isinstance(msg, C.Error):
            log.warning("%s refused us: %s", link.describe(), msg.text)
            closed = self.close_link(link.link_id, now, f"refused by peer: {msg.text}")
            return closed + [Close(link.link_id, "refused by peer")]
        if isinstance(msg, C.Auth) and link.pending_hello is not None:
            try:
                link.auth.on_peer_auth(msg.body)
            except AuthError as exc:
                return self._refuse(link, exc.reason, str(exc), now)
            hello, link.pending_hello = link.pending_hello, None
            self.counters["auth.ok"] += 1
            # TCP links are sealed when either side asked (UDP links: authenticated only)
            cipher = link.auth.cipher() if link.transport == "tcp" else None
            out: list[Action] = [Secure(link.link_id, cipher)] if cipher is not None else []
            return out + self._link_up(link, hello, now)
        if not isinstance(msg, C.Hello) or link.pending_hello is not None:
            raise MalformedFrame("no-hello", f"first frame on a link must be HELLO (and then "
                                             f"AUTH), got {type(msg).__name__}")
        if msg.max_payload <= 0:
            raise MalformedFrame("bad-hello", "peer announces a maximum payload of 0")
        if self.p.keyring is not None and (msg.role is C.Role.ROUTER or self.p.auth_endpoints
                                           or msg.credentials):
            if not msg.credentials:
                return self._refuse(link, "missing-credentials",
                                    f"{msg.role.name.lower()} {msg.name!r} offers no link "
                                    "credentials and this router requires them", now)
            try:
                proof = link.auth.on_peer_hello(msg.name, msg.role, msg.credentials)
            except AuthError as exc:
                return self._refuse(link, exc.reason, str(exc), now)
            link.pending_hello = msg
            body = C.Auth(proof).encode()
            return [Send(link.link_id, pack_header(_LINK_KEY, len(body), BAND_MEMBERSHIP),
                         body)]
        return self._link_up(link, msg, now)

    def _refuse(self, link: Link, reason: str, detail: str, now: float) -> list[Action]:
        """Link authentication failed: say why, count it, drop only that link."""
        self.counters["auth.refused"] += 1
        self.counters[f"auth.refused.{reason}"] += 1
        log.warning("%s: link refused (%s): %s", link.describe(), reason, detail)
        err = C.Error(2, f"link authentication failed: {reason}").encode()
        out: list[Action] = [Send(link.link_id, pack_header(_LINK_KEY, len(err),
                                                            BAND_MEMBERSHIP), err)]
        out += self.close_link(link.link_id, now, f"authentication failed ({reason})")
        return out + [Close(link.link_id, f"authentication failed: {reason}")]

    def _link_up(self, link: Link, msg: C.Hello, now: float) -> list[Action]:
        if link.expected_peer and msg.name != link.expected_peer:
            log.warning("%s: expected router %r, it says it is %r", link.describe(),
                        link.expected_peer, msg.name)
        link.role = msg.role
        if not link.modifiers_configured:
            link.modifiers = ((0, *msg.modifiers) if msg.role is C.Role.ROUTER
                              else self.p.endpoint_modifiers.as_tuple())
        link.peer_name = msg.name
        link.peer_node_id = msg.node_id
        link.max_payload = min(link.max_payload, self.p.max_payload, msg.max_payload)
        link.state = LinkState.UP
        self._handshaking.discard(link.link_id)
        self.generation += 1
        self.counters["links.up"] += 1
        if self._tracing:
            self.tracer.link_up(now, link.link_id, msg.name, msg.role)
        log.info("%s is up (peer %s %r)", link.describe(), msg.role.name.lower(), msg.name)
        if msg.role is C.Role.ROUTER:
            self.routing.link_up(link.link_id, msg.name)
            out = self._advertise_routes(True, now, only=link.link_id)
            for raw in self._policy_raws:  # a new neighbour learns the policies in force
                body = C.PolicyMsg(raw).encode()
                out.append(Send(link.link_id, pack_header(_LINK_KEY, len(body),
                                                          BAND_MEMBERSHIP), body))
            return out
        return []

    # ------------------------------------------------------------------ forwarding
    def _dropped(self, reason: str, key: bytes, band: int, link_id: int, size: int,
                 now: float, links: int = 1) -> list[Action]:
        self.counters["drop." + reason] += 1
        if self._tracing:
            tr = self.tracer
            tr.drop_left -= 1
            if tr.drop_left <= 0:
                tr.drop_sampled(now, key, band, link_id, reason, size, links)
        return []

    def _forward(self, link_id: int, link: Link, header: memoryview | bytes,
                 payload: memoryview | bytes, band: int, now: float) -> list[Action]:
        counters = self.counters
        ttl = header[OFF_TTL]
        key = bytes(header[:16])
        if (self._policies_active and link.role is C.Role.ENDPOINT
                and self.policies.requires(key, "send")
                and not self._may_send(link, key, header, band, now)):
            return self._dropped("unauthorised", key, band, link_id, len(payload), now)
        if ttl == 0:
            return self._dropped("ttl", key, band, link_id, len(payload), now)
        entry = self.flows.get(key)
        bit = 1 << band
        if entry is None:
            lsid = key_lsid(key)
            if lsid in self.p.core_lsids:
                return self._dropped("no-members", key, band, link_id, len(payload), now)
            out_link = self.routing.link_for(lsid)
            if out_link is None:
                return self._dropped("no-route", key, band, link_id, len(payload), now)
            if out_link == link_id:
                return self._dropped("no-state", key, band, link_id, len(payload), now)
            targets = [out_link]
            counters["forward.toward-core"] += 1
        else:
            if link_id in entry.down:
                entry.traffic[link_id] = self.epoch
            up = entry.upstream
            if link_id == up:
                if not entry.agg & bit:  # one test saves a copy on every downstream link
                    return self._dropped("band-filtered", key, band, link_id, len(payload),
                                         now, len(entry.down))
                targets = [lk for lk, m in entry.down.items() if m & bit]
            else:
                targets = [lk for lk, m in entry.down.items() if m & bit and lk != link_id]
                if up is not None:
                    targets.append(up)
                elif entry.sib and link_id not in entry.sib:
                    # At a core: other LS members' subtrees, filtered by their masks. What
                    # comes from a sibling goes only down (the members form a full mesh).
                    targets += [lk for lk, m in entry.sib.items() if m & bit]
            if not targets:
                return self._dropped("no-receivers", key, band, link_id, len(payload), now)
        out = self._emit(targets, key, header, payload, band, ttl - 1, link_id, now)
        if self._tracing and out:
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

    # ------------------------------------------------------------------ administration
    def _admin(self, link: Link, header: memoryview | bytes, payload: memoryview | bytes,
               band: int, now: float) -> list[Action]:
        msg = C.decode(payload)
        key = bytes(header[:16])
        if key[8:12] == _ZERO_LSID:
            if isinstance(msg, C.LsRoutes) and link.role is C.Role.ROUTER:
                before = self.routing.sibling_map()
                out = self._advertise_routes(self.routing.update(link.link_id, msg.routes), now)
                if self.routing.refused:
                    self.counters["refused.ls-routes"] += self.routing.refused
                    out += self.alert("ls-routes", f"{link.describe()} announced more LSIDs "
                                      f"than the limit of {self.p.max_ls_routes}; "
                                      f"{self.routing.refused} ignored", now)
                after = self.routing.sibling_map()
                if after != before:
                    out += self._sync_siblings(before, after)
                return out
            if isinstance(msg, C.Error):
                log.warning("%s reports: %s", link.describe(), msg.text)
                return []
            if isinstance(msg, C.PolicyMsg):
                return self._on_policy(link, msg.raw, now)
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
        if isinstance(msg, C.Ping):
            return self._on_ping(link, key, msg)
        if isinstance(msg, C.Pong):
            return self._on_pong(link, key, msg)
        raise MalformedFrame("bad-control", f"{type(msg).__name__} on band {band} of a flow")

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
        hdr = pack_header(_LINK_KEY, len(body), BAND_MEMBERSHIP)
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

    def _may_send(self, link: Link, key: bytes, header: memoryview | bytes, band: int,
                  now: float) -> bool:
        cap = link.caps.get(key) if link.caps else None
        return (cap is not None and cap.may_send(band)
                and cap.locality_ok(header[OFF_LOC_TYPE], header[OFF_LOC_VALUE])
                and cap.expiry > now + self.wall_offset)

    def _control(self, link_id: int, key: bytes, msg: C.ControlMessage,
                 band: int = BAND_MEMBERSHIP) -> Send:
        body = msg.encode()
        return Send(link_id, pack_header(key, len(body), band), body)

    def _on_join(self, link: Link, key: bytes, msg: C.Join, now: float) -> list[Action]:
        lid = link.link_id
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
            alerts = self.alert("endpoint-quota", f"{link.describe()} holds "
                                f"{len(link.dependent)} flows, the per-application limit", now)
            return alerts + [self._control(lid, key, C.JoinAck(
                msg.req_id, C.JoinStatus.LIMIT, f"this application already holds "
                f"{self.p.max_flows_per_endpoint} flows at router {self.p.name}"))]
        if self._tracing:
            self.tracer.link_add(now, key, lid, msg.mask,
                                 "mask" if lid in entry.down else "join", link.role)
        entry.down[lid] = msg.mask
        entry.traffic[lid] = self.epoch
        link.dependent.add(key)
        entry.recompute()
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
        entry.down[link.link_id] = msg.mask
        entry.traffic[link.link_id] = self.epoch
        entry.recompute()
        return self._push_mask(key, entry)

    def _on_sibling_mask(self, link: Link, key: bytes, msg: C.Mask, now: float
                         ) -> list[Action]:
        """Another member of our location service announces its subtree mask for a flow."""
        lid = link.link_id
        if lid not in self.routing.siblings(key_lsid(key)):
            self.counters["control.stale-sibling"] += 1
            return []
        entry = self.flows.get(key)
        if entry is None:
            if not msg.mask:
                return []
            if len(self.flows) >= self.p.max_flows:
                self.counters["refused.flow-limit"] += 1
                return []
            entry = self.flows[key] = FlowEntry(None, True, now)
            self.counters["flows.created"] += 1
            if self._tracing:
                self.tracer.entry_add(now, key, None)
        if msg.mask:
            if entry.sib is None:
                entry.sib = {}
            entry.sib[lid] = msg.mask
            link.dependent.add(key)
        elif entry.sib:
            entry.sib.pop(lid, None)
            link.dependent.discard(key)
        if not entry.down and not entry.sib:
            self._remove_entry(key, entry, "leave", now)
        return []

    def _sync_siblings(self, before: dict[int, tuple[int, ...]],
                       after: dict[int, tuple[int, ...]]) -> list[Action]:
        """A new LS member became reachable: tell it our subtree masks for that LSID."""
        out: list[Action] = []
        for lsid, links in after.items():
            new = set(links) - set(before.get(lsid, ()))
            if not new:
                continue
            log.info("location service %#x: sibling member(s) on link(s) %s", lsid,
                     sorted(new))
            for key, entry in self.flows.items():
                if entry.upstream is None and entry.agg and key_lsid(key) == lsid:
                    msg = C.Mask(entry.agg)
                    out += [self._control(lid, key, msg, BAND_LS) for lid in sorted(new)]
        return out

    def _on_ping(self, link: Link, key: bytes, msg: C.Ping) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or link.link_id != entry.upstream or entry.ping_epoch == self.epoch:
            return []
        entry.ping_epoch = self.epoch
        self.counters["gc.pings-relayed"] += 1
        return [self._control(lk, key, msg, BAND_GC) for lk in entry.down]

    def _on_pong(self, link: Link, key: bytes, msg: C.Pong) -> list[Action]:
        entry = self.flows.get(key)
        if entry is None or link.link_id not in entry.down:
            return []
        entry.traffic[link.link_id] = self.epoch
        if entry.upstream is None or entry.pong_epoch == self.epoch:
            return []
        entry.pong_epoch = self.epoch
        return [self._control(entry.upstream, key, msg, BAND_GC)]

    # ------------------------------------------------------------------ entry maintenance
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
                   now: float) -> None:
        mask = entry.down.pop(link_id, None)
        last = entry.traffic.pop(link_id, None)
        if self._tracing and mask is not None:
            lk = self.links.get(link_id)
            self.tracer.link_del(now, key, link_id, mask, cause,
                                 None if last is None else
                                 self.started + last * self.p.epoch_length,
                                 lk.role if lk else None)
        entry.pinged.pop(link_id, None)
        link = self.links.get(link_id)
        if link is not None:
            link.dependent.discard(key)
        entry.recompute()

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

    # ------------------------------------------------------------------ routing
    def _advertise_routes(self, changed: bool, now: float, only: int | None = None
                          ) -> list[Action]:
        if not changed:
            return []
        self.generation += 1
        out: list[Action] = self._retry_orphans(now) if self._orphans else []
        targets = [only] if only is not None else [
            lid for lid, lk in self.links.items()
            if lk.role is C.Role.ROUTER and lk.state is LinkState.UP]
        for lid in targets:
            body = C.LsRoutes(self.routing.vector_for(lid)).encode()
            out.append(Send(lid, pack_header(_LINK_KEY, len(body), BAND_MEMBERSHIP), body))
        return out

    def _retry_orphans(self, now: float) -> list[Action]:
        """Routes changed: graft cut-off subtrees back now rather than at the next GC visit."""
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
        """Advance the clock: epochs, incremental GC, join and handshake time-outs.

        The GC visits a share of the table proportional to the time since the last tick, so
        each entry is examined about once per epoch and pings are spread over the epoch rather
        than sent in a burst at its boundary.
        """
        out: list[Action] = []
        p = self.p
        self.epoch = int((now - self.started) / p.epoch_length)
        if self._tracing and self.epoch != self._snapshot_epoch:
            self._snapshot_epoch = self.epoch  # one table snapshot per epoch
            self.tracer.snapshot(now, **snapshot_fields(self))
        for lid in sorted(self._handshaking):
            lk = self.links[lid]
            if now - lk.opened_at > p.handshake_timeout:
                out += self.close_link(lid, now, "no HELLO within the handshake time-out")
                out.append(Close(lid, "handshake time-out"))
        if self._pending:
            out += self._join_timeouts(now)
        if not self._gc_keys or self._gc_pos >= len(self._gc_keys):
            self._gc_keys = list(self.flows)
            self._gc_pos = 0
        share = (now - self._gc_last) / p.epoch_length
        self._gc_last = now
        budget = min(len(self._gc_keys) - self._gc_pos,
                     int(len(self._gc_keys) * share) + 1)
        end = self._gc_pos + budget
        for key in self._gc_keys[self._gc_pos:end]:
            entry = self.flows.get(key)
            if entry is not None:
                out += self._gc_entry(key, entry, now)
        self._gc_pos = end
        return out

    def _join_timeouts(self, now: float) -> list[Action]:
        out: list[Action] = []
        limit = self.p.join_timeout
        for key, entry in list(self._pending.items()):
            if entry.up_req is None or self.flows.get(key) is not entry:
                del self._pending[key]
            elif now - entry.up_req_at > limit:
                del self._pending[key]
                self.counters["join.timeouts"] += 1
                out += self._join_failed(key, entry, C.JoinStatus.TIMEOUT,
                                         "no answer from the core", now)
        return out

    def _gc_entry(self, key: bytes, entry: FlowEntry, now: float) -> list[Action]:
        p, epoch = self.p, self.epoch
        out: list[Action] = []
        if entry.upstream is None and not entry.joined:
            out += self._rejoin(key, entry, now)  # an orphaned subtree retries its graft
        if self._policies_active:
            wall = now + self.wall_offset
            for lid in list(entry.down):
                lk = self.links.get(lid)
                cap = lk.caps.get(key) if lk is not None and lk.caps else None
                if cap is not None and cap.expiry <= wall:
                    out += self._withdraw(lk, key, "expired", now)  # type: ignore[arg-type]
            if key not in self.flows:
                return out
        doomed = []
        for lid, last in entry.traffic.items():
            idle = epoch - last
            if idle >= p.gc_delete_after:
                doomed.append(lid)
            elif idle >= p.gc_ping_after and entry.pinged.get(lid) != epoch:
                entry.pinged[lid] = epoch
                self.counters["gc.pings"] += 1
                if self._tracing:
                    self.tracer.gc_ping(now, key, lid, epoch)
                out.append(self._control(lid, key, C.Ping(epoch), BAND_GC))
        if doomed:
            for lid in doomed:
                self._drop_down(entry, key, lid, "gc", now)
                self.counters["gc.links-collected"] += 1
            if not entry.down:
                self.counters["gc.entries-collected"] += 1
            out += self._after_change(key, entry, now, "gc")
        return out

    # ------------------------------------------------------------------ limits
    def alert(self, kind: str, detail: str, now: float, key: bytes | None = None
              ) -> list[Action]:
        """A limit tripped: count it, log it, keep it for the status query, and tell the
        affected flow's members on the fault band. Rate-limited per (kind, flow)."""
        self.counters[f"alerts.{kind}"] += 1
        last = self._alerted.get((kind, key))
        if last is not None and now - last < self.p.alert_interval:
            return []
        if len(self._alerted) > 10_000:
            self._alerted.clear()
        self._alerted[(kind, key)] = now
        log.warning("router %s: limit tripped: %s: %s", self.p.name, kind, detail)
        self.alerts.append({"t": round(now - self.started, 3), "kind": kind, "detail": detail,
                            "flow": flow_text(key) if key else None})
        if key is None:
            return []
        fault = C.Fault(C.FaultKind.LIMIT, self.p.name, detail, {"limit": kind})
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

    # ------------------------------------------------------------------ inspection
    def status(self) -> dict[str, Any]:
        links = [{
            "id": lk.link_id, "peer": lk.peer_name, "role": lk.role.name.lower()
            if lk.role else "?", "state": lk.state.value, "transport": lk.transport,
            "address": lk.address, "flows": len(lk.dependent), "rx": lk.rx, "tx": lk.tx,
            "max_payload": lk.max_payload,
            "modifiers": dict(zip(("bandwidth", "delay", "geography"), lk.modifiers[1:])),
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
        }


def _mask_text(bits: int) -> str:
    return str(BandMask(bits))
