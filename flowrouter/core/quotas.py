"""Quotas per principal: who may hold how many flows, join how fast, connect how often.
Sans-I/O (the clock is passed in); imports only the standard library.

A *principal* is whoever a link speaks for. Application links are counted together per
principal, not per TCP connection, so opening more connections buys nothing:

* an application that authenticated with a link key is its proven name (``name:<name>``);
* an anonymous application is its source host (``host:<address>``), whatever name it claims.

Proven router links carry whole subtrees and are not counted here (the flow table limit
bounds them). Three limits, each explicit and configurable (``[quota]`` in the router config):

* ``flows`` — flows one principal may hold state for at this router, over all its links;
* ``joins_per_second`` (with a burst of ``join_burst``) — joins, advertisements and mask
  changes one principal may send, a token bucket;
* ``policies`` — flow (or creator-wide) policies one principal may install at this router:
  every policy is kept and passed to every router, and the table has room for
  ``PolicyStore.max_policies``; a new version of a policy it installed before is free;
* ``connections_per_host`` — application connections from one source host at once,
  counted once a connection's HELLO is accepted as an application's (a connection still in
  its handshake, or a proven router, never counts).

``flow_notices`` bounds how many refused joins of different flows a limit tells those flows'
members about (a fault on band 17) per alert interval.

The router refuses what is over a limit, counts it (``refused.<limit>``) and raises an alert;
:meth:`PrincipalQuotas.status` is what the status query shows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["PrincipalQuotas", "QuotaLimits", "host_of", "principal_for"]


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    flows: int = 4096
    joins_per_second: float = 500.0
    join_burst: int = 1000
    connections_per_host: int = 256
    #: refused joins of different flows told to those flows' members on band 17, per limit
    #: and alert interval (the refused peer picks the flow: without a bound, a flood of
    #: joins to made-up flows would become a flood of fault notices and log lines)
    flow_notices: int = 16
    #: policy targets (flows, or creators for creator-wide policies) one principal may
    #: install at this router
    policies: int = 256

    def __post_init__(self) -> None:
        if self.flows < 1 or self.join_burst < 1 or self.connections_per_host < 1:
            raise ValueError("quota limits (flows, join_burst, connections_per_host) must be "
                             "at least 1")
        if self.flow_notices < 0:
            raise ValueError("quota flow_notices must be >= 0 (0: no notices on band 17)")
        if self.joins_per_second <= 0:
            raise ValueError("quota joins_per_second must be positive")
        if self.policies < 1:
            raise ValueError("quota policies must be at least 1")


def host_of(address: str) -> str:
    """The host part of ``host:port`` / ``[v6]:port`` (the whole text if it has no port)."""
    if address.startswith("["):
        return address[1:address.find("]")] if "]" in address else address
    host, sep, port = address.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else address


def principal_for(authenticated_name: str | None, address: str) -> str:
    """The principal a link speaks for (see the module docs)."""
    if authenticated_name is not None:
        return f"name:{authenticated_name}"
    return f"host:{host_of(address)}"


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class PrincipalQuotas:
    """The counters behind the limits. The router tells it which link speaks for which
    principal (:meth:`bind` / :meth:`unbind`) and asks before admitting."""

    def __init__(self, limits: QuotaLimits | None = None) -> None:
        self.limits = limits or QuotaLimits()
        #: principal -> its links (flows held are counted over these)
        self.links: dict[str, set[int]] = {}
        self._principal_of: dict[int, str] = {}
        self._buckets: dict[str, _Bucket] = {}
        #: source host -> application connections open now
        self.connections: dict[str, int] = {}
        self._conn_host: dict[int, str] = {}
        #: principal -> the policy targets it installed here
        self._policies: dict[str, set[bytes]] = {}

    def admit_policy(self, principal: str, target: bytes) -> bool:
        """A policy for *target* from *principal*: False (and not counted) past its quota
        of distinct targets; a target it installed before is always admitted."""
        held = self._policies.setdefault(principal, set())
        if target in held:
            return True
        if len(held) >= self.limits.policies:
            return False
        held.add(target)
        return True

    # connections ---------------------------------------------------------------------------
    def admit_connection(self, link_id: int, address: str) -> bool:
        """Count a new connection from *address*; False (and not counted) when its host is
        at the limit."""
        host = host_of(address)
        n = self.connections.get(host, 0)
        if n >= self.limits.connections_per_host:
            return False
        self.connections[host] = n + 1
        self._conn_host[link_id] = host
        return True

    def release_connection(self, link_id: int) -> None:
        host = self._conn_host.pop(link_id, None)
        if host is None:
            return
        n = self.connections.get(host, 0) - 1
        if n <= 0:
            self.connections.pop(host, None)
        else:
            self.connections[host] = n

    # principals ----------------------------------------------------------------------------
    def bind(self, link_id: int, principal: str) -> None:
        self._principal_of[link_id] = principal
        self.links.setdefault(principal, set()).add(link_id)

    def unbind(self, link_id: int) -> None:
        self.release_connection(link_id)
        principal = self._principal_of.pop(link_id, None)
        if principal is None:
            return
        links = self.links.get(principal)
        if links is not None:
            links.discard(link_id)
            if not links:
                del self.links[principal]
                self._buckets.pop(principal, None)

    def principal(self, link_id: int) -> str | None:
        """The principal *link_id* speaks for (None: not counted, e.g. a proven router)."""
        return self._principal_of.get(link_id)

    def admit_join(self, principal: str, now: float) -> bool:
        """Take one token from the principal's join bucket; False when it is empty."""
        lim = self.limits
        b = self._buckets.get(principal)
        if b is None:
            b = self._buckets[principal] = _Bucket(float(lim.join_burst), now)
        elif now > b.stamp:
            b.tokens = min(float(lim.join_burst), b.tokens + (now - b.stamp)
                           * lim.joins_per_second)
            b.stamp = now
        if b.tokens < 1.0:
            return False
        b.tokens -= 1.0
        return True

    def status(self, flows_held: dict[str, int] | None = None) -> dict[str, Any]:
        """Limits and current use (``flows_held``: principal -> flows, if the caller has
        counted them)."""
        return {"limits": asdict(self.limits),
                "principals": {p: {"links": len(lk), **({"flows": flows_held.get(p, 0)}
                                                        if flows_held is not None else {})}
                               for p, lk in sorted(self.links.items())},
                "connections_per_host": dict(sorted(self.connections.items()))}
