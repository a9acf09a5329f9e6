"""Synthetic topologies for scale experiments (thousands of routers).

:func:`random_mesh` grows a random tree (each new router attaches to a uniformly chosen
earlier one, so depth stays near ``e * ln(n)``) and adds random extra links until the mean
degree is reached; the result is connected, has a short diameter (the LS distance vector
treats 32 hops as unreachable) and is fixed by its seed. :func:`tree` builds a k-ary tree.
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
