"""Backbone regions in a topology file: parsing ``[[regions]]`` and working out each
region's edges and exits.

::

    [[regions]]
    name = "backbone"
    routers = ["c00", "c01", ...]    # the region's routers
    group_size = 5                   # optional: edges per aggregate group (default 5)
    max_extra = 1                    # optional: edges without members a copy may reach
    lsid_base = 0x7e000000           # optional: edge i is the core of lsid_base + i
    modifiers = {geography = 3}      # optional: what crossing the region costs

The **edges** are the region's routers with a link to a router outside it or an endpoint
attached; the others are its core routers, which never hold an end flow's entry. An LSID's
**exit** is the edge through which the region reaches its location service: the edge that
is its core, else the edge nearest (in hops, ties by name) to one of its cores. An LSID
whose core is one of the region's core routers has no exit: its flows cross the region
unwrapped, as if there were no region (the core routers on their way hold their entries).
The routers learn the exits at run time from their LS routes
(:mod:`flowrouter.core.regionexits`), so they follow link failures and moves; what
:func:`exits` computes from the topology is what they learn while every link is up (the
tests compare the two), never a router's configuration.

May import the topology model, :mod:`flowrouter.core.tables`, :mod:`flowrouter.core.graphs`
(hop counts) and :mod:`flowrouter.core.regions` (:func:`region_params` builds what an edge
router is given).
"""

from __future__ import annotations

from typing import Any

from flowrouter.core.graphs import hops
from flowrouter.core.regions import RegionParams
from flowrouter.core.tables import Modifiers
from flowrouter.testbed.topology.model import Region, Topology, TopologyError
from flowrouter.testbed.topology.values import ValueChecker, known_names

KEYS = ("name", "routers", "group_size", "max_extra", "lsid_base", "modifiers")


def parse(v: ValueChecker, value: Any, routers: list[str]) -> tuple[Region, ...]:
    """The ``[[regions]]`` array (*v* reports errors with their line)."""
    if not isinstance(value, list):
        raise v.fail(("regions",), "regions must be an array of tables ([[regions]])")
    out: list[Region] = []
    taken: dict[str, str] = {}
    for i, tbl in enumerate(value):
        p: tuple[Any, ...] = ("regions", i)
        tbl = v.table(tbl, p, f"region #{i + 1}")
        v.keys(tbl, p, KEYS, f"region #{i + 1}", ("name", "routers"))
        name = v.name(tbl["name"], p + ("name",), "region name")
        members = tbl["routers"]
        if not isinstance(members, list) or not members:
            raise v.fail(p + ("routers",), f"region {name!r}: routers must be a non-empty "
                                           "array of router names")
        names: list[str] = []
        for j, r in enumerate(members):
            r = v.name(r, p + ("routers", j), "region router")
            if r not in routers:
                raise v.fail(p + ("routers", j), f"region {name!r}: unknown router {r!r} "
                                                 f"(known: {known_names(routers)})")
            if r in taken:
                raise v.fail(p + ("routers", j), f"router {r!r} is in two regions "
                                                 f"({taken[r]!r} and {name!r})")
            taken[r] = name
            names.append(r)
        kw: dict[str, Any] = {}
        if "group_size" in tbl:
            kw["group_size"] = v.integer(tbl["group_size"], p + ("group_size",),
                                         "group_size", 1, 16)
        if "max_extra" in tbl:
            kw["max_extra"] = v.integer(tbl["max_extra"], p + ("max_extra",), "max_extra",
                                        0, 16)
        if "lsid_base" in tbl:
            kw["lsid_base"] = v.lsid(tbl["lsid_base"], p + ("lsid_base",), "lsid_base")
        if "modifiers" in tbl:
            kw["modifiers"] = v.modifiers(tbl["modifiers"], p + ("modifiers",),
                                          f"region {name!r}", Modifiers())
        out.append(Region(name, tuple(names), **kw))
    return tuple(out)


def edges(topo: Topology, region: Region) -> tuple[str, ...]:
    """The region's edges, sorted by name (an edge's number is its index)."""
    inside = set(region.routers)
    out = {e.router for e in topo.endpoints if e.router in inside}
    for lk in topo.links:
        if (lk.a in inside) != (lk.b in inside):
            out.add(lk.a if lk.a in inside else lk.b)
    return tuple(sorted(out))


def exits(topo: Topology, region: Region) -> tuple[tuple[int, str], ...]:
    """(LSID, exit edge) for every location service of the topology outside the region's
    own LSIDs."""
    edge_set = set(edges(topo, region))
    inside = set(region.routers)
    out: list[tuple[int, str]] = []
    adj = _adjacency(topo)
    for ls in topo.location_services:
        at_edge = sorted(c for c in ls.cores if c in edge_set)
        if at_edge:
            out.append((ls.lsid, at_edge[0]))
            continue
        if any(c in inside for c in ls.cores):
            continue  # a core router of the region roots it: its flows cross unwrapped
        dist = hops(adj, ls.cores)
        reach = [(dist[e], e) for e in edge_set if e in dist]
        if reach:
            out.append((ls.lsid, min(reach)[1]))
    return tuple(out)


def check(topo: Topology) -> None:
    """Raise TopologyError for a region a run cannot use."""
    for region in topo.regions:
        if not edges(topo, region):
            raise TopologyError(f"region {region.name!r} has no edges (no router of it has "
                                "a link or endpoint outside it)", topo.source)
        span = len(edges(topo, region))
        lsids = {ls.lsid for ls in topo.location_services}
        clash = sorted(x for x in lsids if region.lsid_base <= x < region.lsid_base + span)
        if clash:
            raise TopologyError(f"region {region.name!r}: its edges' LSIDs "
                                f"{region.lsid_base:#x}.. overlap location service "
                                f"{clash[0]:#x}; set lsid_base", topo.source)
        exits(topo, region)


def region_of(topo: Topology, router: str) -> Region | None:
    for region in topo.regions:
        if router in region.routers:
            return region
    return None


def role(topo: Topology, router: str) -> str:
    """``edge`` or ``core`` for a region's routers, ``router`` for the others."""
    region = region_of(topo, router)
    if region is None:
        return "router"
    return "edge" if router in edges(topo, region) else "core"


def roles(topo: Topology) -> dict[str, str]:
    """:func:`role` of every router, computed once."""
    out = dict.fromkeys((r.name for r in topo.routers), "router")
    for region in topo.regions:
        edge_set = set(edges(topo, region))
        for r in region.routers:
            out[r] = "edge" if r in edge_set else "core"
    return out


def _adjacency(topo: Topology) -> dict[str, list[str]]:
    """Each router's link neighbours, in the order of the topology's links."""
    adj: dict[str, list[str]] = {}
    for lk in topo.links:
        adj.setdefault(lk.a, []).append(lk.b)
        adj.setdefault(lk.b, []).append(lk.a)
    return adj


def region_params(topo: Topology) -> dict[str, RegionParams]:
    """What each edge router of the topology's regions is given, by router name."""
    out: dict[str, RegionParams] = {}
    for region in topo.regions:
        names = edges(topo, region)
        for router in names:
            out[router] = RegionParams(region.name, names, router,
                                       lsid_base=region.lsid_base,
                                       group_size=region.group_size,
                                       max_extra=region.max_extra,
                                       modifiers=region.modifiers,
                                       routers=tuple(sorted(region.routers)))
    return out


def config_lines(topo: Topology, router: str) -> list[str]:
    """The ``[region]`` table of *router*'s daemon config (none unless it is an edge)."""
    params = region_params(topo).get(router)
    if params is None:
        return []
    m = params.modifiers
    return ["", "[region]", f'name = "{params.name}"',
            "edges = [" + ", ".join(f'"{e}"' for e in params.edges) + "]",
            f"group_size = {params.group_size}", f"max_extra = {params.max_extra}",
            f"lsid_base = {params.lsid_base:#x}",
            f"locality = {{ bandwidth = {m.bandwidth}, delay = {m.delay}, "
            f"geography = {m.geography} }}",
            "routers = [" + ", ".join(f'"{r}"' for r in params.routers) + "]"]
