"""The backbone part of ``flowtrace study``: table sizes and control load per router role,
with and without aggregation.

The random meshes of :mod:`flowtrace.study` have one location service (LSID) core per
LSID and no backbone, so they cannot say what the seed's Internet-scale question asks:
whether the routers *inside* a backbone must hold an entry for every flow crossing them.
This sweep runs :func:`flowrouter.testbed.sim.flowmix.run_flows` (many end flows with a
heavy-tailed membership, every member on its own mask of bands) on generated backbones
(:func:`flowrouter.testbed.sim.generate.backbone`: *cores* routers inside a region, *edges*
border routers with applications, location services outside and on edges), once with
aggregation off and once on, over a grid of flows x cores x edges x seeds. The same
topology serves both settings of a grid point, so the comparison is paired.

Per run it keeps each role's tables (``core``: inside the region; ``edge``: the region's
border routers; ``ls``: the location service router outside it), the control frames a second
on router links once traffic is quiet, the bytes on links touching a core router while every
flow sends, the wasted deliveries (copies an edge received for no member) and whether every
member received exactly its bands. Each (setting, target) is fitted against flows, cores and
edges with :mod:`flowtrace.fit` (cluster-robust by topology), so the report states the law
with and without aggregation side by side.

Imports the simulator (lazily: it is heavy), :mod:`flowtrace.fit` and :mod:`flowtrace.render`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import fit as FIT
from .render import Block, fmt

TERMS = ("flows", "cores", "edges")
#: what is fitted per setting: the busiest core router's table, the mean core and edge
#: tables, control frames a second on router links
TARGETS = ("core_max_entries", "core_mean_entries", "edge_mean_entries", "control_fps")
CLUSTER = "topology"


@dataclass(frozen=True)
class BackboneConfig:
    #: aggregation settings swept; () leaves the backbone sweep out of the study
    aggregate: tuple[bool, ...] = (False, True)
    cores: tuple[int, ...] = (16, 32)
    edges: tuple[int, ...] = (6, 10)
    flows: tuple[int, ...] = (100, 300)
    seeds: int = 2


def run_one(flows: int, cores: int, edges: int, seed: int, aggregate: bool,
            traces: str | None = None) -> dict[str, Any]:
    """One backbone run (the topology is seeded by the grid point, not the setting)."""
    from flowrouter.testbed.sim.flowmix import run_flows
    from flowrouter.testbed.sim.generate import backbone

    topology = f"backbone-c{cores}-e{edges}-f{flows}-s{seed}"
    topo = backbone(cores=cores, edges=edges, seed=topology)
    s = run_flows(topo, flows, aggregate=aggregate, seed=seed, failure=False,
                  router_traces=None if traces is None else f"{traces}/{topology}")
    ent = s["entries"]

    def stat(role: str, key: str) -> float | None:
        v = ent.get(role, {}).get(key)
        return None if v is None else float(v)

    return {"run": f"{topology}-{'on' if aggregate else 'off'}", "topology": topology,
            "aggregate": aggregate, "flows": flows, "cores": cores, "edges": edges,
            "seed": seed, "core_max_entries": stat("core", "max"),
            "core_mean_entries": stat("core", "mean"),
            "edge_mean_entries": stat("edge", "mean"), "edge_max_entries": stat("edge", "max"),
            "ls_entries": stat("router", "max"),
            "control_fps": float(s["control_frames_per_second"]),
            "core_link_bytes": s["core_link_bytes"],
            "wasted_deliveries": s["wasted_deliveries"],
            "delivery_exact": s["delivery_exact"],
            "join_p95_s": s["joins"]["latency_s"]["p95"]}


def sweep(cfg: BackboneConfig, progress: Callable[[str], None] | None = None,
          traces: str | None = None) -> list[dict[str, Any]]:
    grid = list(itertools.product(cfg.flows, cfg.cores, cfg.edges, range(1, cfg.seeds + 1),
                                  cfg.aggregate))

    def describe(point: tuple[Any, ...], r: dict[str, Any]) -> str:
        f, c, e, s, agg = point
        return (f": {f} flows, {c} cores, {e} edges, seed {s}, aggregation "
                f"{'on' if agg else 'off'}: busiest core table {fmt(r['core_max_entries'])}"
                f"{'' if r['delivery_exact'] else ' (delivery NOT exact)'}")

    return FIT.run_grid(grid, lambda f, c, e, s, agg: run_one(f, c, e, s, agg, traces),
                        describe, progress, "backbone")


def analyse(rows: Sequence[dict[str, Any]], level: float) -> dict[str, Any]:
    """Fits per (setting, target), and per flow count the paired ratio on/off of the
    busiest core table (the issue's 'at most 1%' measure)."""
    fits: dict[str, list[FIT.Fit | FIT.Refusal]] = {}
    chosen: dict[str, FIT.Fit | None] = {}
    for agg in sorted({r["aggregate"] for r in rows}):
        part = [r for r in rows if r["aggregate"] == agg]
        for target in TARGETS:
            key = f"{target} (aggregation {'on' if agg else 'off'})"
            fits[key], chosen[key] = FIT.fit_both(part, target, TERMS, level=level,
                                                  cluster=CLUSTER)
    off = {r["topology"]: r for r in rows if not r["aggregate"]}
    ratios: dict[int, list[float]] = {}
    for r in rows:
        o = off.get(r["topology"])
        if r["aggregate"] and o and o["core_max_entries"]:
            ratios.setdefault(r["flows"], []).append(
                (r["core_max_entries"] or 0.0) / o["core_max_entries"])
    return {"fits": fits, "chosen": chosen,
            "core_ratio": {f: max(v) for f, v in sorted(ratios.items())},
            "exact": all(r["delivery_exact"] for r in rows), "runs": len(rows)}


def _mean(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return sum(v) / len(v) if v else None


def slug(key: str) -> str:
    """A file name for a fit's key ('core_max_entries (aggregation on)' ->
    'core_max_entries_aggregation_on')."""
    return "_".join("".join(c if c.isalnum() or c == "_" else " " for c in key).split())


def blocks(rows: Sequence[dict[str, Any]], result: dict[str, Any],
           fit_table: Callable[[Sequence[FIT.Fit | FIT.Refusal]], list[Block]],
           images: dict[str, str] | None = None) -> list[Block]:
    """The report section: a side-by-side table per flow count, the paired ratio, the fits
    (each with its fitted law along flows, *images* keyed ``law_<key>``)."""
    b: list[Block] = [("h2", "Backbone routers with and without aggregation")]
    if not rows:
        b.append(("p", "Not run (`--aggregate off,on` sweeps generated backbones with "
                       "aggregation off and on)."))
        return b
    b.append(("p", f"{len(rows)} runs on generated backbones (a region of *cores* routers "
                   "with *edges* border routers; location services outside the region and on "
                   "edges; heavy-tailed membership: most flows 2-3 members, a few dozens). "
                   "Roles: *core* routers are inside the region, *edge* routers are its "
                   "border (they wrap and unwrap), *ls* is the location service router outside "
                   "it (the core of its flows' trees). Each grid point's topology serves both "
                   "settings. Every member received exactly its bands in "
                   + ("every run." if result["exact"] else "NOT every run: see runs.csv.")))
    table = []
    for flows, agg in itertools.product(sorted({r["flows"] for r in rows}), (False, True)):
        part = [r for r in rows if r["flows"] == flows and r["aggregate"] == agg]
        if not part:
            continue
        table.append([fmt(flows), "on" if agg else "off", str(len(part)),
                      fmt(_mean([r["core_max_entries"] for r in part]), 4),
                      fmt(_mean([r["core_mean_entries"] for r in part]), 4),
                      fmt(_mean([r["edge_mean_entries"] for r in part]), 4),
                      fmt(_mean([r["ls_entries"] for r in part]), 4),
                      fmt(_mean([r["control_fps"] for r in part]), 4),
                      fmt(_mean([float(r["core_link_bytes"]) for r in part]), 4),
                      fmt(_mean([float(r["wasted_deliveries"]) for r in part]), 4)])
    b.append(("table", (["flows", "aggregation", "runs", "busiest core table",
                         "mean core table", "mean edge table", "ls table",
                         "control frames/s", "bytes on core links", "wasted deliveries"],
                        table)))
    if result["core_ratio"]:
        b.append(("p", "Busiest core table with aggregation on over the same topology's "
                       "table with it off (the largest ratio over the runs): " + "; ".join(
                           f"{fmt(f)} flows {100 * v:.2f}%"
                           for f, v in result["core_ratio"].items())
                       + ". Inside the region the tables follow the aggregates, not the end "
                       "flows: the fits below show the exponent on flows with and without."))
    for key, fits in result["fits"].items():
        chosen = result["chosen"][key]
        b.append(("h3", key + (f" (chosen: {chosen.model})" if chosen else " (no model)")))
        b += fit_table(fits)
        if images and f"law_{key}" in images:
            b.append(("img", (images[f"law_{key}"], f"{key}: fitted law")))
    return b


def console(result: dict[str, Any]) -> list[str]:
    lines = [f"  backbone: {result['runs']} runs, delivery "
             f"{'exact in every run' if result['exact'] else 'NOT exact in every run'}"]
    for f, v in result["core_ratio"].items():
        lines.append(f"  backbone: {fmt(f)} flows: busiest core table with aggregation is "
                     f"{100 * v:.2f}% of without")
    for key, chosen in result["chosen"].items():
        if chosen is not None and "flows" in chosen.coef:
            lines.append(f"  backbone {key}: {chosen.formula()}")
    return lines
