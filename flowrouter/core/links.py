"""Links: the life of one link, from HELLO (and AUTH) to link up and to link down.

A transport that connects is opened here; its first frames must be HELLO (and, with a
key ring, AUTH: :mod:`flowrouter.wire.linkauth`); the trust boundary
(:mod:`flowrouter.core.trust`) admits the connection and refuses unproven router claims.
A link that closes, times out or sends a malformed frame is forgotten here, and every flow
that used it is repaired.

A part of the router (see :mod:`flowrouter.core.router`): its own object, owning the links
still in their handshake and the replay cache of handshake proofs, over the shared
:class:`~flowrouter.core.state.RouterState` (whose link table it keeps). What a link's coming
and going means elsewhere it tells the other parts through their interfaces
(:mod:`flowrouter.core.interfaces`): admission (alerts, the policies a new router neighbour
learns), the LS exchange (routes), membership (flows to repair), the soft state (timers) and
measured locality (meters).

May import :mod:`flowrouter.wire` and the core's shared modules (state, interfaces, actions,
tables, lsroutes, tracers, trust); never another part.
"""

from __future__ import annotations

from flowrouter.core.actions import Action, Close, Secure, Send
from flowrouter.core.interfaces import (
    LinkAdmission,
    LinkLiveness,
    LinkLoss,
    LinkMeters,
    RouteAdvertiser,
)
from flowrouter.core.state import LINK_KEY, RouterState, log
from flowrouter.core.tables import Link, LinkState, Modifiers
from flowrouter.core.trust import Refusal
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_MEMBERSHIP
from flowrouter.wire.header import MalformedFrame, pack_header
from flowrouter.wire.linkauth import AuthError, LinkAuthenticator, ReplayCache

#: transports that carry datagrams: a lost handshake datagram is repeated, not fatal.
#: "udp" (router links, never sealed) and "dgram" (applications' datagram links,
#: flowrouter.net.appdgram: every datagram sealed by the shell once encryption is
#: negotiated, so with link keys they are taken only then)
DATAGRAM_TRANSPORTS = ("udp", "dgram")


class Links:
    """The link table: handshake, link up, link down, malformed-frame drops."""

    def __init__(self, state: RouterState, *, admission: LinkAdmission,
                 routes: RouteAdvertiser, trees: LinkLoss, liveness: LinkLiveness,
                 meters: LinkMeters) -> None:
        self.state = state
        self.admission = admission
        self.routes = routes
        self.trees = trees
        self.liveness = liveness
        self.meters = meters
        self.p = state.p
        self.links = state.links
        self.counters = state.counters
        self.routing = state.routing
        self.trust = state.trust
        self._replay = ReplayCache()
        #: links still in their handshake (the only ones a tick must check for time-outs)
        self._handshaking: set[int] = set()

    def open_link(self, link_id: int, now: float, *, transport: str = "tcp", address: str = "",
                  modifiers: Modifiers | None = None, expected_peer: str | None = None
                  ) -> list[Action]:
        """A transport connected (either direction): say HELLO and await the peer's."""
        if link_id in self.links:
            raise ValueError(f"link id {link_id} is already in use")
        mods = (modifiers or Modifiers()).as_tuple()
        self.links[link_id] = Link(link_id, transport, address, mods, expected_peer,
                                   modifiers_configured=modifiers is not None, opened_at=now)
        self.state.link_changed(link_id)
        self._handshaking.add(link_id)
        creds = b""
        if self.p.keyring is not None:
            auth = self.links[link_id].auth = LinkAuthenticator(
                self.p.keyring, my_name=self.p.name, my_role=C.Role.ROUTER,
                key_id=self.p.auth_key_id, encrypt=self.p.auth_encrypt,
                replay_cache=self._replay, require_endpoints=self.p.auth_endpoints,
                rekey_records=self.p.auth_rekey_records)
            creds = auth.hello_credentials()
        hello = C.Hello(self.p.node_id, C.Role.ROUTER, self.p.name, self.p.max_payload,
                        self.default_lsid(), creds,
                        modifiers=(mods[1], mods[2], mods[3]) if modifiers is not None
                        else (0, 0, 0)).encode()
        link = self.links[link_id]
        link.hello_body, link.hello_at = hello, now
        return [_hello_frame(link_id, hello)]

    def tick(self, now: float) -> list[Action]:
        """Links whose handshake timed out are closed; datagram links still in their
        handshake repeat it."""
        if not self._handshaking:
            return []
        out: list[Action] = []
        for lid in sorted(self._handshaking):
            if now - self.links[lid].opened_at > self.p.handshake_timeout:
                out += self.close_link(lid, now, "no HELLO within the handshake time-out")
                out.append(Close(lid, "handshake time-out"))
        if self._handshaking:
            out += self._repeat_hellos(now)
        return out

    def _repeat_hellos(self, now: float) -> list[Action]:
        """Datagram links still in their handshake repeat their last handshake messages,
        unchanged, every liveness interval until the next step arrives: the HELLO while the
        peer's has not come, and with link authentication the HELLO and our AUTH once it
        has (the peer may have lost either). The peer recognises a repeat by its bytes
        (:meth:`LinkAuthenticator.is_repeated_hello`): no proof is ever replayed into a new
        session, and a lost datagram costs one interval, not a handshake time-out."""
        out: list[Action] = []
        for lid in sorted(self._handshaking):
            lk = self.links[lid]
            if (lk.transport not in DATAGRAM_TRANSPORTS or not lk.hello_body
                    or now - lk.hello_at < self.p.liveness_interval):
                continue
            lk.hello_at = now
            if lk.pending_hello is None:
                self.counters["handshake.hello-repeated"] += 1
                out.append(_hello_frame(lid, lk.hello_body))
            elif lk.auth_body:
                self.counters["handshake.auth-repeated"] += 1
                out += [_hello_frame(lid, lk.hello_body), _link_frame(lid, lk.auth_body)]
        return out

    def hello_on_up_link(self, link: Link, msg: C.Hello, now: float) -> list[Action]:
        """A HELLO on a link that is up: the peer lost ours (a datagram link) or started
        over. Unauthenticated: say HELLO again. Authenticated: the very HELLO this link
        accepted, repeated because the peer lost our AUTH, is answered with our AUTH
        (:meth:`_answer_repeat`); any other HELLO closes the link, so both sides redo the
        handshake with fresh proofs on a new link."""
        if link.auth is None and link.hello_body:
            self.counters["handshake.hello-answered"] += 1
            return [_hello_frame(link.link_id, link.hello_body)]
        if link.auth is not None and link.auth.is_repeated_hello(msg.name, msg.role,
                                                                 msg.credentials):
            return self._answer_repeat(link, now)
        reason = "the peer started its handshake again"
        return self.close_link(link.link_id, now, reason) + [Close(link.link_id, reason)]

    def auth_on_up_link(self, link: Link, msg: C.Auth, now: float) -> list[Action]:
        """An AUTH on a link that is up: the one this link accepted, repeated (the peer
        lost our AUTH), is answered with ours; any other is a protocol error."""
        if link.auth is not None and link.auth.is_repeated_auth(msg.body):
            return self._answer_repeat(link, now)
        raise MalformedFrame("bad-control", "AUTH on a link that is already up")

    def _answer_repeat(self, link: Link, now: float) -> list[Action]:
        """The peer repeats its handshake: it lacks our AUTH (it has our HELLO, or it
        could not have proven itself). Answer with the same AUTH as before, while the
        peer's handshake could still be running (the handshake time-out since this link
        came up) and at most once per half liveness interval, so two sides that both came
        up cannot keep answering each other's answers."""
        p = self.p
        if (not link.auth_body or now - link.up_at > p.handshake_timeout
                or now - link.answered_at < p.liveness_interval / 2):
            self.counters["handshake.repeats-ignored"] += 1
            return []
        link.answered_at = now
        self.counters["handshake.auth-answered"] += 1
        return [_link_frame(link.link_id, link.auth_body)]

    def default_lsid(self) -> int:
        if self.p.default_lsid:
            return self.p.default_lsid
        known = self.routing.known_lsids()
        return min(known) if known else 0

    def close_link(self, link_id: int, now: float, reason: str = "closed") -> list[Action]:
        """The transport is gone (or we dropped it): repair every flow that used it."""
        link = self.links.pop(link_id, None)
        self._handshaking.discard(link_id)
        self.meters.link_closed(link_id)
        self.trust.on_close(link_id)
        if link is None:
            return []
        self.state.link_changed(link_id)
        self.liveness.link_closed(link_id)
        was_up = link.state is LinkState.UP
        link.state = LinkState.DOWN
        self.state.generation += 1
        log.info("%s %s: %s", "lost" if was_up else "gave up on", link.describe(), reason)
        self.counters["links.down"] += 1
        if self.state.tracing:
            self.state.tracer.link_down(now, link_id, link.peer_name, link.role, reason)
        out: list[Action] = []
        if link.role is C.Role.ROUTER:
            out += self.routes.advertise_routes(self.routing.link_down(link_id), now)
        return out + self.trees.link_down(link, reason, now)

    def drop_link(self, link_id: int, exc: MalformedFrame, now: float) -> list[Action]:
        """Count and report a malformed frame, tell the peer why, and drop only that link."""
        link = self.links.get(link_id)
        self.counters["malformed"] += 1
        self.counters[f"malformed.{exc.reason}"] += 1
        desc = link.describe() if link else f"link {link_id}"
        log.warning("%s: malformed frame (%s); dropping the link", desc, exc)
        err = C.Error(1, f"malformed frame: {exc}").encode()
        out: list[Action] = [Send(link_id, pack_header(LINK_KEY, len(err), BAND_MEMBERSHIP),
                                  err)]
        out += self.close_link(link_id, now, f"malformed frame ({exc.reason})")
        out.append(Close(link_id, f"malformed frame: {exc}"))
        return out

    def handshake(self, link: Link, header: memoryview | bytes, payload: memoryview | bytes,
                   now: float) -> list[Action]:
        if bytes(header[:16]) != LINK_KEY:
            raise MalformedFrame("no-hello", "first frame on a link must be HELLO")
        try:
            msg = C.decode(payload)
        except C.UnknownControlType:
            return self.unknown_control(link)
        if isinstance(msg, (C.Echo, C.EchoReply, C.Refresh, C.Prune, C.NotOnTree,
                            C.LsRoutes, C.PolicyMsg)):
            # the peer is up and we missed its HELLO (lost datagram, one-way outage): not
            # malformed; its HELLO comes again (or the handshake times out)
            self.counters["handshake.early-frames"] += 1
            return []
        if isinstance(msg, C.Error):
            log.warning("%s refused us: %s", link.describe(), msg.text)
            closed = self.close_link(link.link_id, now, f"refused by peer: {msg.text}")
            return closed + [Close(link.link_id, "refused by peer")]
        datagram = link.transport in DATAGRAM_TRANSPORTS
        if isinstance(msg, C.Auth) and link.pending_hello is None and datagram:
            # the peer has our HELLO but we lost its own: its AUTH cannot be checked yet;
            # the peer repeats both (Links._repeat_hellos)
            self.counters["handshake.early-frames"] += 1
            return []
        if (isinstance(msg, C.Hello) and link.pending_hello is not None
                and link.auth.is_repeated_hello(msg.name, msg.role, msg.credentials)):
            # a repeat of the HELLO we hold: our own repeats answer it (no new session)
            self.counters["handshake.repeats-ignored"] += 1
            return []
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
        link.features = C.hello_features(header)
        if self.p.keyring is not None and (msg.role is C.Role.ROUTER or self.p.auth_endpoints
                                           or msg.credentials):
            if link.transport == "udp" and not self.p.auth_udp_unsealed:
                return self._refuse_untrusted(link, Refusal(
                    "udp-unsealed", f"{msg.role.name.lower()} {msg.name[:80]!r}: UDP links "
                    "are not sealed, so a proof at the handshake would protect nothing after "
                    "it; this router has link keys and refuses authenticated UDP links (use "
                    "TCP, or set [link_auth] allow_unsealed_udp = true)"), now)
            if not msg.credentials:
                return self._refuse(link, "missing-credentials",
                                    f"{msg.role.name.lower()} {msg.name!r} offers no link "
                                    "credentials and this router requires them", now)
            try:
                proof = link.auth.on_peer_hello(msg.name, msg.role, msg.credentials)
            except AuthError as exc:
                return self._refuse(link, exc.reason, str(exc), now)
            if (link.transport == "dgram" and not link.auth.encrypt
                    and not self.p.auth_udp_unsealed):
                return self._refuse_untrusted(link, Refusal(
                    "udp-unsealed", f"{msg.role.name.lower()} {msg.name[:80]!r}: a datagram "
                    "link is sealed only when encryption is asked for, and neither end did; "
                    "this router has link keys and refuses it (ask for encryption, or set "
                    "[link_auth] allow_unsealed_udp = true)"), now)
            link.pending_hello = msg
            link.auth_body = C.Auth(proof).encode()
            return [_link_frame(link.link_id, link.auth_body)]
        return self._link_up(link, msg, now)

    def unknown_control(self, link: Link) -> list[Action]:
        """A control message of a type we do not know (a newer peer's): counted and
        ignored, the link stays up (flowrouter.wire.control: forward compatibility)."""
        self.counters["control.unknown-type"] += 1
        log.debug("%s: ignored a control message of an unknown type", link.describe())
        return []

    def _refuse(self, link: Link, reason: str, detail: str, now: float) -> list[Action]:
        """Link authentication failed: say why, count it, drop only that link."""
        self.counters["auth.refused"] += 1
        self.counters[f"auth.refused.{reason}"] += 1
        log.warning("%s: link refused (%s): %s", link.describe(), reason, detail)
        err = C.Error(2, f"link authentication failed: {reason}").encode()
        out: list[Action] = [Send(link.link_id, pack_header(LINK_KEY, len(err),
                                                            BAND_MEMBERSHIP), err)]
        out += self.close_link(link.link_id, now, f"authentication failed ({reason})")
        return out + [Close(link.link_id, f"authentication failed: {reason}")]

    def _refuse_untrusted(self, link: Link, refusal: Refusal, now: float) -> list[Action]:
        """The trust boundary refused this link: say why, count, log, alert, drop it."""
        self.counters[f"refused.{refusal.kind}"] += 1
        log.warning("%s: refused: %s", link.describe(), refusal.text)
        out = self.admission.alert(refusal.kind, refusal.text, now)
        err = C.Error(3, refusal.text).encode()
        out.append(Send(link.link_id, pack_header(LINK_KEY, len(err), BAND_MEMBERSHIP), err))
        out += self.close_link(link.link_id, now, f"refused ({refusal.kind})")
        return out + [Close(link.link_id, f"refused: {refusal.kind}")]

    def _link_up(self, link: Link, msg: C.Hello, now: float) -> list[Action]:
        refusal = self.trust.router_refusal(link, msg)
        if refusal is None:  # proven: an application now counts against its host
            refusal = self.trust.application_refusal(link, msg)
        if refusal is not None:  # a router claim nothing proves, not the peer we dialled,
            return self._refuse_untrusted(link, refusal, now)  # or over a quota
        link.role = msg.role
        if not link.modifiers_configured:
            link.modifiers = ((0, *msg.modifiers) if msg.role is C.Role.ROUTER
                              else self.p.endpoint_modifiers.as_tuple())
        link.peer_name = msg.name
        link.peer_node_id = msg.node_id
        link.max_payload = min(link.max_payload, self.p.max_payload, msg.max_payload)
        link.state = LinkState.UP
        link.up_at = now
        self.state.link_changed(link.link_id)
        self._handshaking.discard(link.link_id)
        self.trust.on_up(link)
        self.state.generation += 1
        self.counters["links.up"] += 1
        if self.state.tracing:
            self.state.tracer.link_up(now, link.link_id, msg.name, msg.role)
        log.info("%s is up (peer %s %r)", link.describe(), msg.role.name.lower(), msg.name)
        self.liveness.link_up(link, now)
        if msg.role is C.Role.ROUTER:
            self.routing.link_up(link.link_id, msg.name)
            out = self.routes.advertise_routes(True, now, only=link.link_id)
            # a new neighbour learns the policies in force
            return out + self.admission.policy_frames(link.link_id)
        return []


def _link_frame(link_id: int, body: bytes) -> Send:
    """A link-local control frame (HELLO, AUTH, ERROR) carrying *body*."""
    return Send(link_id, pack_header(LINK_KEY, len(body), BAND_MEMBERSHIP), body)


def _hello_frame(link_id: int, body: bytes) -> Send:
    """Our HELLO frame: its header announces the features we speak (wire.control)."""
    return Send(link_id, C.hello_header(len(body)), body)
