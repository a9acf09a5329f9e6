"""The topology model: frozen dataclasses for sites, routers, endpoints, links, location
services, faults and scenarios, and :class:`TopologyError`.

A :class:`Topology` is what :func:`~flowrouter.testbed.topology.load` returns and what the
launcher, the simulator and the tests consume. May import :mod:`flowrouter.core.tables`
(Modifiers). Writing a topology back to TOML is :mod:`~flowrouter.testbed.topology.writer`'s
(``dumps``, ``dump``), which imports this module, not the other way round.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

from flowrouter.core.tables import Modifiers

TRANSPORTS = ("tcp", "udp")
ROUTER_PARAMS = ("epoch", "ping_after", "delete_after", "join_timeout", "max_payload",
                 "max_flows")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
MAX_LSID = 0xFFFFFFFF


class TopologyError(ValueError):
    """A topology file is unreadable or inconsistent; ``str()`` is ``file:line: what``."""

    def __init__(self, message: str, source: str = "<string>", line: int | None = None
                 ) -> None:
        self.message = message
        self.source = source
        self.line = line
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


def node_id_for(name: str) -> int:
    """A stable 64-bit node ID derived from a router or endpoint name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") or 1


# ============================================================================ data model


@dataclass(frozen=True)
class Site:
    name: str
    description: str = ""


@dataclass(frozen=True)
class LinkDefaults:
    transport: str = "tcp"
    bandwidth: float = 0.0  #: bits/s, 0 = unlimited
    delay: float = 0.001  #: one-way propagation, seconds
    loss: float = 0.0
    modifiers: Modifiers = Modifiers()
    queue_limit: int = 0  #: bytes waiting per direction before frames drop; 0 = unlimited


@dataclass(frozen=True)
class EndpointDefaults:
    bandwidth: float = 0.0
    delay: float = 0.0001
    modifiers: Modifiers = Modifiers()


@dataclass(frozen=True)
class RouterDefaults:
    host: str = "127.0.0.1"
    base_port: int = 7400
    #: router parameters (keys of ROUTER_PARAMS) applied to every router
    params: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Defaults:
    link: LinkDefaults = LinkDefaults()
    endpoint: EndpointDefaults = EndpointDefaults()
    router: RouterDefaults = RouterDefaults()


@dataclass(frozen=True)
class RouterSpec:
    name: str
    site: str | None = None
    #: LSIDs this router is a core for (merged with ``[[location_services]]``), sorted
    core_lsids: tuple[int, ...] = ()
    #: listen port = defaults.router.base_port + port_offset; None = the router's index
    port_offset: int | None = None
    host: str | None = None
    #: static LS routes: (lsid, neighbour router name)
    routes: tuple[tuple[int, str], ...] = ()
    default_route: str | None = None
    #: per-router overrides of ROUTER_PARAMS
    params: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    router: str
    roles: tuple[str, ...] = ()
    bandwidth: float = 0.0
    delay: float = 0.0001
    modifiers: Modifiers = Modifiers()


@dataclass(frozen=True)
class LinkSpec:
    name: str
    a: str
    b: str
    transport: str = "tcp"
    bandwidth: float = 0.0
    delay: float = 0.001
    loss: float = 0.0
    modifiers: Modifiers = Modifiers()
    #: True: application data only travels a -> b (control still goes both ways)
    oneway: bool = False
    queue_limit: int = 0

    def other(self, router: str) -> str:
        return self.b if router == self.a else self.a


@dataclass(frozen=True)
class LocationService:
    lsid: int
    cores: tuple[str, ...]
    name: str = ""
    #: the cores are a full mesh that never relays (routers' ``direct_lsids``): a broken
    #: link between two of them is not routed around through a third
    direct: bool = False


@dataclass(frozen=True)
class Region:
    """A backbone region: its routers carry end flows inside aggregate flows between its
    edges (the routers of the region with links or endpoints outside it); see
    :mod:`flowrouter.testbed.topology.regions` and :mod:`flowrouter.core.aggregates`."""

    name: str
    routers: tuple[str, ...]
    lsid_base: int = 0x7E00_0000  #: edge i is the core of LSID lsid_base + i
    group_size: int = 5  #: edges per group (2**group_size - 1 aggregates a group at most)
    max_extra: int = 1  #: edges without members one aggregate copy may reach at most
    modifiers: Modifiers = Modifiers()  #: what crossing the region costs a frame


@dataclass(frozen=True)
class Fault:
    """One schedule entry. Three kinds, told apart by their keys:

    * outage: ``at`` [``until``] — the link(s) go down at ``at`` and up at ``until``;
    * repeat: ``down``, ``up``, ``start`` [``until``] — down for ``down`` s, up for ``up`` s,
      the first outage at ``start``, no outage at or after ``until``;
    * set: ``at`` [``until``] plus any of ``bandwidth``/``delay``/``loss`` — the link(s) use
      those values from ``at`` and return to their configured values at ``until``.

    ``direction`` (a router at one end) limits the fault to frames that router sends: an
    asymmetric outage loses frames silently and the routers are not told (a half-dead path
    that no transport has noticed yet); a symmetric outage closes the links at both ends.
    """

    links: tuple[str, ...]
    at: float | None = None
    until: float | None = None
    down: float | None = None
    up: float | None = None
    start: float | None = None
    direction: str | None = None
    bandwidth: float | None = None
    delay: float | None = None
    loss: float | None = None

    @property
    def kind(self) -> str:
        if self.down is not None:
            return "repeat"
        if self.bandwidth is not None or self.delay is not None or self.loss is not None:
            return "set"
        return "outage"

    def outages(self, horizon: float) -> list[tuple[float, float]]:
        """The (down, up) intervals of an outage or repeat fault that start before horizon."""
        if self.kind == "outage":
            assert self.at is not None
            return [(self.at, self.until if self.until is not None else math.inf)]
        if self.kind != "repeat":
            return []
        assert self.start is not None and self.down is not None and self.up is not None
        out = []
        end = self.until if self.until is not None else math.inf
        t = self.start
        while t < min(end, horizon):
            out.append((t, min(t + self.down, end)))
            t += self.down + self.up
        return out


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    faults: tuple[Fault, ...] = ()
    duration: float | None = None  #: suggested run length, seconds


@dataclass(frozen=True)
class Topology:
    name: str
    description: str = ""
    defaults: Defaults = Defaults()
    sites: tuple[Site, ...] = ()
    routers: tuple[RouterSpec, ...] = ()
    endpoints: tuple[EndpointSpec, ...] = ()
    links: tuple[LinkSpec, ...] = ()
    location_services: tuple[LocationService, ...] = ()
    faults: tuple[Fault, ...] = ()  #: applied in every scenario (and with none)
    scenarios: tuple[Scenario, ...] = ()
    duration: float | None = None
    regions: tuple[Region, ...] = ()
    source: str = field(default="<string>", compare=False)

    # lookups ----------------------------------------------------------------------------
    def router(self, name: str) -> RouterSpec:
        for r in self.routers:
            if r.name == name:
                return r
        raise KeyError(f"no router {name!r} in topology {self.name!r}")

    def endpoint(self, name: str) -> EndpointSpec:
        for e in self.endpoints:
            if e.name == name:
                return e
        raise KeyError(f"no endpoint {name!r} in topology {self.name!r}")

    def link(self, name: str) -> LinkSpec:
        for lk in self.links:
            if lk.name == name:
                return lk
        raise KeyError(f"no link {name!r} in topology {self.name!r}")

    def scenario(self, name: str) -> Scenario:
        for s in self.scenarios:
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.scenarios) or "none"
        raise KeyError(f"no scenario {name!r} in topology {self.name!r} (known: {known})")

    def links_of(self, router: str) -> list[LinkSpec]:
        return [lk for lk in self.links if router in (lk.a, lk.b)]

    def neighbours(self, router: str) -> list[str]:
        return [lk.other(router) for lk in self.links_of(router)]

    def endpoints_of(self, router: str) -> list[EndpointSpec]:
        return [e for e in self.endpoints if e.router == router]

    def faults_for(self, scenario: str | None = None) -> tuple[Fault, ...]:
        """The base faults plus those of *scenario* (None: base faults only)."""
        if scenario is None:
            return self.faults
        return self.faults + self.scenario(scenario).faults

    def router_params(self, router: str) -> dict[str, float]:
        """ROUTER_PARAMS for *router*: defaults.router overlaid with the router's own."""
        out = dict(self.defaults.router.params)
        out.update(dict(self.router(router).params))
        return out

    def listen_address(self, router: str) -> tuple[str, int]:
        """(host, port) a launcher should make *router* listen on."""
        for i, r in enumerate(self.routers):
            if r.name == router:
                off = r.port_offset if r.port_offset is not None else i
                return (r.host or self.defaults.router.host,
                        self.defaults.router.base_port + off)
        raise KeyError(f"no router {router!r} in topology {self.name!r}")

    def direct_lsids(self, router: str) -> frozenset[int]:
        """The direct location services *router* is a core of."""
        return frozenset(ls.lsid for ls in self.location_services
                         if ls.direct and router in ls.cores)

    def lsids(self) -> list[int]:
        return sorted({ls.lsid for ls in self.location_services})

