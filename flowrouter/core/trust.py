"""The trust boundary of a router: who may be a router, and what everyone else may do.
Sans-I/O.

A link is a *router* only when it proves it:

* with link keys (``[link_auth]``), by the handshake proof (:mod:`flowrouter.wire.linkauth`);
* without keys, when this router dialled it (``expected_peer``), or when its HELLO name and
  its source host match a configured pair: the ``[[peer]]`` entries and ``accept_routers``
  (where ``*@host`` accepts any router name from a host the operator controls).

Any other HELLO that claims ROUTER is refused (the router says why, logs and counts
``refused.router-claim``). Every link that is not a proven router is an application and
passes admission: once its HELLO is accepted (proven, with link keys), connections per
source host and the descriptor budget the shell reports (:meth:`TrustBoundary.
set_application_budget`); then the quotas of its principal (:mod:`flowrouter.core.quotas`)
on every join. Connections still in their handshake count against no quota, so idle
connections from a router's host never keep that router out (the shell bounds them per
port, by time-out and by the descriptor budget). The router core's links part calls
:meth:`~TrustBoundary.router_refusal`, :meth:`~TrustBoundary.application_refusal`,
:meth:`~TrustBoundary.on_up` and :meth:`~TrustBoundary.on_close`; its admission part calls
:meth:`~TrustBoundary.join_refusal`. Imports :mod:`flowrouter.core.quotas`,
:mod:`flowrouter.core.tables` and :mod:`flowrouter.wire` only.
"""

from __future__ import annotations

from typing import Any

from flowrouter.core.quotas import PrincipalQuotas, QuotaLimits, host_of, principal_for
from flowrouter.core.tables import Link
from flowrouter.wire.control import Hello, Role

__all__ = ["Refusal", "TrustBoundary"]


class Refusal:
    """Why something was refused: ``kind`` is the counter and alert key, ``text`` the line
    the peer and the log get, ``limit`` the limit alone, without who tripped it (what the
    members of a flow are told on its fault band: they learn that and which limit held,
    never the refused principal's name or address)."""

    __slots__ = ("kind", "limit", "text")

    def __init__(self, kind: str, text: str, limit: str = "") -> None:
        self.kind = kind
        self.text = text
        self.limit = limit or kind

    def __repr__(self) -> str:
        return f"Refusal({self.kind!r}, {self.text!r})"


class TrustBoundary:
    """Router proof and per-principal admission for one router."""

    def __init__(self, limits: QuotaLimits | None = None,
                 accepted_routers: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.quotas = PrincipalQuotas(limits)
        #: (router name, source host) pairs accepted as routers without link keys
        self.accepted_routers = accepted_routers
        #: why no further application may connect now (the shell's descriptor budget), or
        #: None
        self.application_budget: str | None = None

    @property
    def limits(self) -> QuotaLimits:
        return self.quotas.limits

    def set_application_budget(self, refusal: str | None) -> None:
        """The shell's descriptor budget: *refusal* says why applications are refused now
        (the rest is kept for routers and fail-over), None that they are welcome."""
        self.application_budget = refusal

    def application_refusal(self, link: Link, hello: Hello) -> Refusal | None:
        """A HELLO was accepted on a link we did not dial and it is not a router's: the
        application is counted against its source host now (not while its handshake runs),
        and refused past ``connections_per_host`` or the descriptor budget."""
        if hello.role is Role.ROUTER or link.expected_peer is not None:
            return None
        if self.application_budget is not None:
            return Refusal("descriptors", self.application_budget)
        if self.quotas.admit_connection(link.link_id, link.address):
            return None
        host = host_of(link.address)
        return Refusal("connections-per-host", f"too many connections from {host} (the limit "
                       f"is {self.limits.connections_per_host} per host)")

    def router_refusal(self, link: Link, hello: Hello) -> Refusal | None:
        """A HELLO that claims ROUTER on a link that has not proven it; or, on a link we
        dialled, a HELLO whose name is not the one configured for that peer (whatever it
        proves: the dashboard, routes and commands would show and act on a name the
        operator never configured). A ``[[peer]]`` without a ``name`` accepts any router that
        proves itself (link keys, ``accept_routers``)."""
        if link.expected_peer and hello.name != link.expected_peer:
            return Refusal("peer-name", f"dialled router {link.expected_peer!r} at "
                           f"{link.address} but it says it is {hello.name[:80]!r} (fix the "
                           "[[peer]] entry's name, or leave it out to accept any router "
                           "that proves itself)")
        if hello.role is not Role.ROUTER:
            return None
        if link.auth is not None and link.auth.authenticated:
            return None
        if link.expected_peer is not None:
            return None
        host = host_of(link.address)
        if (hello.name, host) in self.accepted_routers or ("*", host) in self.accepted_routers:
            return None
        return Refusal("router-claim", f"{hello.name!r} from {host} claims to be a router but "
                       "is not a configured peer (use link keys, or list it in "
                       f"accept_routers as \"{hello.name}@{host}\")")

    def on_up(self, link: Link) -> None:
        """The link is up: a proven router is not counted, an application speaks for its
        principal (its proven name, or its source host)."""
        if link.role is Role.ROUTER:
            return
        auth = link.auth
        name = link.peer_name if auth is not None and auth.authenticated else None
        self.quotas.bind(link.link_id, principal_for(name, link.address))

    def on_close(self, link_id: int) -> None:
        self.quotas.unbind(link_id)

    def join_refusal(self, link: Link, key: bytes, links: dict[int, Link], now: float
                     ) -> Refusal | None:
        """Check an application's join against its principal's join rate and flow quota."""
        principal = self.quotas.principal(link.link_id)
        if principal is None:
            return None
        lim = self.limits
        if not self.quotas.admit_join(principal, now):
            rate = f"{lim.joins_per_second:g}/s (burst {lim.join_burst})"
            return Refusal("join-rate", f"{principal} sends joins faster than {rate}",
                           f"a principal sent joins faster than {rate}")
        if key in link.dependent:
            return None
        held = self.flows_held(principal, links)
        if held >= lim.flows:
            return Refusal("principal-flows", f"{principal} already holds {held} flows at "
                           f"this router (the limit is {lim.flows})",
                           f"a principal already holds the {lim.flows} flows it may")
        return None

    def policy_refusal(self, link: Link, target: bytes) -> Refusal | None:
        """An application installs a policy for *target* (a flow key, or a creator's for a
        creator-wide one): against its principal's ``policies`` quota."""
        principal = self.quotas.principal(link.link_id)
        if principal is None or self.quotas.admit_policy(principal, target):
            return None
        n = self.limits.policies
        return Refusal("policy-quota", f"{principal} already installed policies for {n} "
                       "flows or creators at this router (the limit)",
                       f"a principal already installed the {n} policies it may")

    def flows_held(self, principal: str, links: dict[int, Link]) -> int:
        return sum(len(links[lid].dependent) for lid in self.quotas.links.get(principal, ())
                   if lid in links)

    def status(self, links: dict[int, Link]) -> dict[str, Any]:
        held = {p: self.flows_held(p, links) for p in self.quotas.links}
        st = self.quotas.status(held)
        st["accept_routers"] = sorted(f"{n}@{h}" for n, h in self.accepted_routers)
        return st
