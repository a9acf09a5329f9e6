"""Topology files: sites, routers, endpoints, links, LS placement and fault schedules.

One TOML format (documented with examples in ``topologies/README.md``) serves the launcher,
the simulator (:mod:`flowrouter.testbed.sim`) and the tests. :func:`load` / :func:`loads` parse and
validate a file into the frozen dataclasses below; :func:`dumps` / :func:`dump` write one back,
so ``loads(dumps(t)) == t`` for every valid topology ``t``.

Every problem raises :class:`TopologyError`, whose message names the file, the line and what
is wrong, e.g. ``ring.toml:41: link 'r03-r04': unknown router 'r4' in 'b' (known: r01, ...)``.
Syntax errors take their line from :mod:`tomllib`; semantic errors find the offending key or
table in the text with a small scanner (:class:`~flowrouter.testbed.topology.locator.Locator`).

Units: bandwidth in bits per second (``0`` = unlimited; strings such as ``"56k"``, ``"10M"``
are accepted), delays and times in seconds (``"50ms"``, ``"200us"`` accepted), loss as a
probability 0..1. Locality modifiers are the per-link costs the router subtracts from a
message's locality budget (see :mod:`flowrouter.core.router`).

The package, one module per concern: ``model`` (the dataclasses), ``parser`` (the document),
``values`` (typed value checks and units), ``faults`` (fault schedules and scenarios),
``locator`` (line numbers for errors), ``writer`` (TOML out). This module re-exports the public
names. May import its own modules and :mod:`flowrouter.core.tables`.
"""

from __future__ import annotations

from flowrouter.testbed.topology.locator import Locator
from flowrouter.testbed.topology.model import (
    ROUTER_PARAMS,
    TRANSPORTS,
    Defaults,
    EndpointDefaults,
    EndpointSpec,
    Fault,
    LinkDefaults,
    LinkSpec,
    LocationService,
    Region,
    RouterDefaults,
    RouterSpec,
    Scenario,
    Site,
    Topology,
    TopologyError,
    node_id_for,
)
from flowrouter.testbed.topology.parser import load, loads
from flowrouter.testbed.topology.writer import dump, dumps

__all__ = [
    "TopologyError", "Site", "RouterSpec", "EndpointSpec", "LinkSpec", "LocationService",
    "Fault", "Scenario", "LinkDefaults", "EndpointDefaults", "RouterDefaults", "Defaults",
    "Topology", "load", "loads", "dump", "dumps", "node_id_for", "Locator", "ROUTER_PARAMS",
    "TRANSPORTS", "Region",
]
