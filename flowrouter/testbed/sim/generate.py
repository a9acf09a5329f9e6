"""Synthetic topologies for scale experiments (thousands of routers).

:func:`random_mesh` grows a random tree (each new router attaches to a uniformly chosen
earlier one, so depth stays near ``e * ln(n)``) and adds random extra links until the mean
degree is reached; the result is connected, has a short diameter (the LS distance vector
treats 32 hops as unreachable) and is fixed by its seed. :func:`tree` builds a k-ary tree.
:func:`backbone` builds a backbone region (core routers and edges) for aggregation runs.
Both return a :class:`~flowrouter.testbed.topology.Topology`, so they can be written to a file with
``topology.dump()`` and run like any shipped topology.
"""

from __future__ import annotations

import random

from flowrouter.core.tables import Modifiers
from flowrouter.testbed.topology import (
    Defaults,
    EndpointSpec,
    LinkDefaults,
    LinkSpec,
    LocationService,
    Region,
    RouterSpec,
    Topology,
    dumps,
    loads,
)

_WAN = Modifiers(bandwidth=1, delay=1, geography=3)


def _build(name: str, description: str, n: int, edges: list[tuple[int, int]],
           endpoints: int, lsid: int, bandwidth: float, delay: float, rng: random.Random,
           more_lsids: tuple[int, ...] = ()) -> Topology:
    width = max(4, len(str(n - 1)))
    rn = [f"r{i:0{width}d}" for i in range(n)]
    all_lsids = (lsid, *more_lsids)
    # one core per LSID, spread evenly over the router numbers (the first at r0)
    cores = {(k * n) // len(all_lsids): x for k, x in enumerate(all_lsids)}
    routers = tuple(RouterSpec(rn[i], core_lsids=(cores[i],) if i in cores else (),
                               port_offset=i)
                    for i in range(n))
    links = tuple(LinkSpec(f"{rn[a]}-{rn[b]}", rn[a], rn[b], bandwidth=bandwidth,
                           delay=delay * (0.5 + rng.random()), modifiers=_WAN)
                  for a, b in edges)
    hosts = sorted(rng.sample(range(n), min(endpoints, n)))
    eps = tuple(EndpointSpec(f"e{rn[i][1:]}", rn[i]) for i in hosts)
    defaults = Defaults(link=LinkDefaults(bandwidth=bandwidth, delay=delay, modifiers=_WAN))
    topo = Topology(name=name, description=description, defaults=defaults, routers=routers,
                    endpoints=eps, links=links,
                    location_services=tuple(LocationService(x, (rn[i],), "bench")
                                            for i, x in sorted(cores.items())))
    return topo


def random_mesh(n: int, *, degree: float = 4.0, endpoints: int = 100, seed: int | str = 0,
                lsid: int = 0x10, bandwidth: float = 100e6, delay: float = 0.005,
                check: bool = False, more_lsids: tuple[int, ...] = ()) -> Topology:
    """A connected random graph of *n* routers with mean degree about *degree*; the core of
    *lsid* is r0, those of *more_lsids* are spread over the other routers."""
    if n < 2:
        raise ValueError("need at least 2 routers")
    rng = random.Random(f"mesh/{seed}")
    edges: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    for i in range(1, n):
        j = rng.randrange(i)
        edges.append((j, i))
        seen.add((j, i))
    target = int(n * degree / 2)
    tries = 0
    while len(edges) < target and tries < target * 20:
        tries += 1
        a, b = rng.randrange(n), rng.randrange(n)
        if a == b:
            continue
        e = (min(a, b), max(a, b))
        if e in seen:
            continue
        seen.add(e)
        edges.append(e)
    topo = _build(f"random-mesh-{n}", f"random connected mesh, {n} routers, mean degree "
                  f"{2 * len(edges) / n:.1f}, seed {seed}", n, edges, endpoints, lsid,
                  bandwidth, delay, rng, more_lsids)
    if check:
        topo = loads(dumps(topo), f"<random-mesh-{n}>")
    return topo


def tree(n: int, *, fanout: int = 3, endpoints: int = 100, seed: int = 0, lsid: int = 0x10,
         bandwidth: float = 100e6, delay: float = 0.005) -> Topology:
    """A *fanout*-ary tree of *n* routers rooted at the core (r0000)."""
    rng = random.Random(f"tree/{seed}")
    edges = [((i - 1) // fanout, i) for i in range(1, n)]
    return _build(f"tree-{n}", f"{fanout}-ary tree of {n} routers", n, edges, endpoints,
                  lsid, bandwidth, delay, rng)


def backbone(cores: int = 200, edges: int = 30, *, degree: float = 3.5,
             endpoints_per_edge: int = 2, lsids: int = 4, seed: int | str = 0,
             group_size: int = 5, max_extra: int = 1, bandwidth: float = 1e9,
             delay: float = 0.002) -> Topology:
    """A backbone region: *cores* core routers (a random connected mesh of mean degree
    about *degree*) and *edges* edge routers, each linked to two core routers, with
    *endpoints_per_edge* applications on each edge. The first LSID (0x10) lives on an
    outside router ``ls0`` homed on two edges; the others (0x11, ...) on edges spread
    evenly. The whole region is one ``[[regions]]`` entry (flowrouter.core.aggregates)."""
    if cores < 2 or edges < 2:
        raise ValueError("a backbone needs at least 2 core routers and 2 edges")
    rng = random.Random(f"backbone/{seed}")
    cw = max(2, len(str(cores - 1)))
    ew = max(2, len(str(edges - 1)))
    cn = [f"c{i:0{cw}d}" for i in range(cores)]
    en = [f"e{i:0{ew}d}" for i in range(edges)]
    pairs: set[tuple[int, int]] = set()
    for i in range(1, cores):
        pairs.add((rng.randrange(i), i))
    target = int(cores * degree / 2)
    tries = 0
    while len(pairs) < target and tries < target * 20:
        tries += 1
        a, b = sorted(rng.sample(range(cores), 2))
        pairs.add((a, b))
    links = [LinkSpec(f"{cn[a]}-{cn[b]}", cn[a], cn[b], bandwidth=bandwidth,
                      delay=delay * (0.5 + rng.random())) for a, b in sorted(pairs)]
    for e in en:
        for c in sorted(rng.sample(range(cores), 2)):
            links.append(LinkSpec(f"{e}-{cn[c]}", e, cn[c], bandwidth=bandwidth,
                                  delay=delay * (0.5 + rng.random())))
    links.append(LinkSpec(f"ls0-{en[0]}", "ls0", en[0], bandwidth=bandwidth, delay=delay))
    links.append(LinkSpec(f"ls0-{en[edges // 2]}", "ls0", en[edges // 2],
                          bandwidth=bandwidth, delay=delay))
    lss = [LocationService(0x10, ("ls0",), "outside")]
    for k in range(1, lsids):
        lss.append(LocationService(0x10 + k, (en[(k * edges) // lsids],), "edge"))
    routers = tuple(RouterSpec(n, port_offset=i)
                    for i, n in enumerate([*cn, *en, "ls0"]))
    eps = tuple(EndpointSpec(f"a{e[1:]}-{j}", e) for e in en
                for j in range(endpoints_per_edge))
    defaults = Defaults(link=LinkDefaults(bandwidth=bandwidth, delay=delay))
    topo = Topology(
        name=f"backbone-{cores}-{edges}",
        description=f"a backbone region of {cores} core routers and {edges} edges (two "
                    f"core links each), {endpoints_per_edge} applications per edge, "
                    f"seed {seed}",
        defaults=defaults, routers=routers, endpoints=eps, links=tuple(links),
        location_services=tuple(lss),
        regions=(Region("backbone", (*cn, *en), group_size=group_size,
                        max_extra=max_extra),))
    return loads(dumps(topo), f"<backbone-{cores}-{edges}>")
