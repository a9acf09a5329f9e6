"""``flowtrace study``: a scaling study on the simulator, fitted across runs.

Runs the deterministic simulator (:mod:`flowrouter.testbed.sim`, the real sans-I/O router)
over a grid of network sizes x flow counts x members per flow x endpoints per router x
location services (LSIDs), several seeds each (a grid, so the terms vary independently and
the fit can tell their effects apart). Every run builds a random mesh of its own
(:func:`flowrouter.testbed.sim.generate.random_mesh`, seeded by the run's grid values, one
core router per LSID), spreads the flows over the LSIDs, joins every flow's members during
``join_window`` seconds, lets the network settle and then measures every router's table
(:func:`flowrouter.core.traces.snapshot_fields`, the same numbers a snapshot record
carries), per role: core, edge (has endpoint links), transit.

One run is one observation; ``members`` is members per flow, ``endpoints`` the hosts that
may join. :mod:`flowtrace.fit` fits each target (core entries per core router, mean edge
and transit entries, the largest table) against the terms, linear and power-law, with
cluster-robust standard errors (by topology), confidence intervals and held-out error, and
predicts the points asked for with ``--predict`` only inside the model's validity range.
``--repeats`` reruns the study on fresh topologies and reports how often one repeat's
intervals cover another's estimates (:func:`coverage`). The sanity check compares each core's
entries of its own LSID with the live flows of that LSID (the ratio should be 1).

Imports :mod:`flowrouter.testbed.sim` (the simulator), :mod:`flowrouter.core.traces` and
:mod:`flowtrace.fit`; no Spark.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import backbone as BB
from . import fit as FIT

LSID = 0x10
TARGETS = ("core_entries", "edge_entries", "transit_entries", "max_entries")
TERMS = ("flows", "members", "routers", "endpoints", "lsids")
#: the column runs are clustered by for the standard errors (a topology per run: each run is
#: its own cluster, so the errors are heteroskedasticity-robust)
CLUSTER = "topology"


@dataclass
class StudyConfig:
    routers: tuple[int, ...] = (25, 50, 100, 200)
    flows: tuple[int, ...] = (100, 300, 900)
    members: tuple[int, ...] = (1, 2, 4)
    #: endpoints per router (hosts that may join), varied apart from the network size
    endpoints: tuple[float, ...] = (0.25, 1.0)
    #: location services (LSIDs, each with its own core router); flows spread over them
    lsids: tuple[int, ...] = (1, 2)
    seeds: int = 1
    join_window: float = 10.0
    settle: float = 5.0
    degree: float = 3.0
    level: float = 0.95
    max_factor: float = FIT.MAX_FACTOR
    repeats: int = 0
    predict: list[dict[str, float]] = field(default_factory=list)
    traces: str | None = None
    #: the backbone sweep (aggregation off and on; flowtrace.backbone)
    backbone: BB.BackboneConfig = field(default_factory=BB.BackboneConfig)


def run_one(routers: int, flows: int, members: int, seed: int, cfg: StudyConfig,
            endpoints: float = 0.5, lsids: int = 1, base: int = 0) -> dict[str, Any]:
    """One simulated network, on a topology of its own (seeded by every grid value, the
    seed and the repeat *base*): its tables per role once every flow's members have
    joined."""
    from flowrouter.core.router import Router, RouterParams
    from flowrouter.core.traces import TraceWriter, snapshot_fields
    from flowrouter.testbed.sim import SimNetwork
    from flowrouter.testbed.sim.generate import random_mesh
    from flowrouter.wire.flowid import FlowID

    n_eps = min(routers, max(2 * members, int(routers * endpoints)))
    ids = [LSID + k for k in range(lsids)]
    run = (f"study-r{routers}-f{flows}-m{members}-e{endpoints:g}-l{lsids}-s{seed}"
           + (f"-b{base}" if base else ""))
    topo = random_mesh(routers, degree=cfg.degree, endpoints=n_eps, seed=run, lsid=ids[0],
                       more_lsids=tuple(ids[1:]))
    writers: list[Any] = []
    factory: Callable[[RouterParams, float], Router] | None = None
    if cfg.traces:
        trace_dir = os.path.join(cfg.traces, run) + "/"

        def factory(params: RouterParams, now: float) -> Router:
            w = TraceWriter(trace_dir, params.name, sample_rate=0.01, run=run)
            writers.append(w)
            return Router(params, now=now, tracer=w)

    net = SimNetwork.from_topology(topo, seed=seed, tick_interval=1.0, strict=False,
                                   router_factory=factory)
    eps = list(net.endpoints.values())
    rng = random.Random(f"study/{run}")
    for i in range(flows):
        flow = FlowID(0xF10E, ids[i % lsids], i + 1)
        for ep in rng.sample(eps, min(members, len(eps))):
            net.schedule(rng.uniform(1.0, cfg.join_window), ep.join, flow, "32")
    t_end = cfg.join_window + cfg.settle
    net.run_until(t_end)
    by_role: dict[str, list[int]] = {"core": [], "edge": [], "transit": []}
    live: set[bytes] = set()
    own: list[int] = []  # per core: entries of flows of its own LSIDs
    for r in net.routers.values():
        s = snapshot_fields(r)
        role = "core" if s["core"] else ("edge" if s["edge"] else "transit")
        by_role[role].append(s["entries"])
        if s["core"]:
            own.append(sum(1 for k in r.flows if FlowID.from_key(k).lsid in s["lsids"]))
        live.update(r.flows)
        if writers:
            r.tracer.snapshot(t_end, **s)
    for w in writers:
        w.close()

    def mean(xs: list[int]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {"run": run, "topology": run, "routers": routers, "flows": flows,
            "members": members, "endpoints": len(eps), "lsids": lsids, "seed": seed,
            "flows_live": len(live), "core_routers": len(by_role["core"]),
            "edge_routers": len(by_role["edge"]), "transit_routers": len(by_role["transit"]),
            "core_entries": mean(by_role["core"]), "core_own_entries": mean(own),
            "edge_entries": mean(by_role["edge"]),
            "transit_entries": mean(by_role["transit"]),
            "max_entries": max(max(v) for v in by_role.values() if v),
            "total_entries": sum(sum(v) for v in by_role.values())}


def sweep(cfg: StudyConfig, progress: Callable[[str], None] | None = None, base: int = 0
          ) -> list[dict[str, Any]]:
    grid = list(itertools.product(cfg.routers, cfg.flows, cfg.members, cfg.endpoints,
                                  cfg.lsids, range(1, cfg.seeds + 1)))

    def describe(point: tuple[Any, ...], row: dict[str, Any]) -> str:
        r, f, m, e, ls, s = point
        return (f"{f' (repeat {base})' if base else ''}: {r} routers, {f} flows, "
                f"{m} members, {e:g} endpoints/router, {ls} LSID(s), seed {s}: core "
                f"table {row['core_entries']:g}")

    return FIT.run_grid(grid, lambda r, f, m, e, ls, s: run_one(r, f, m, s, cfg, e, ls, base),
                        describe, progress, "study")


def analyse(rows: Sequence[dict[str, Any]], cfg: StudyConfig) -> dict[str, Any]:
    """Fits, the chosen model per target, predictions (or refusals), the sanity check."""
    fits: dict[str, list[FIT.Fit | FIT.Refusal]] = {}
    chosen: dict[str, FIT.Fit | None] = {}
    for target in TARGETS:
        fits[target], chosen[target] = FIT.fit_both(rows, target, TERMS, level=cfg.level,
                                                    cluster=CLUSTER)
    predictions: list[dict[str, Any]] = []
    for point in cfg.predict:
        for target in TARGETS:
            f = chosen[target]
            if f is None:
                reasons = "; ".join(x.reason for x in fits[target]
                                    if isinstance(x, FIT.Refusal))
                predictions.append({"point": point, "target": target, "refused": reasons})
                continue
            missing = [t for t in TERMS[:3] if t not in point]
            if missing:
                raise ValueError(f"--predict needs {', '.join(missing)}")
            full = {"lsids": 1.0, "endpoints": point["routers"] / 2, **point}
            p = FIT.predict(f, full, max_factor=cfg.max_factor)
            if isinstance(p, FIT.Refusal):
                predictions.append({"point": point, "target": target, "refused": p.reason})
            else:
                predictions.append({"point": point, "target": target, "model": f.model,
                                    "value": p[0], "low": p[1], "high": p[2]})
    # each core holds the live flows of its own LSID (flows are spread evenly over the
    # LSIDs); a core may also hold other LSIDs' flows as a transit router of their trees
    ratios = [r["core_own_entries"] * r["lsids"] / r["flows_live"] for r in rows
              if r["core_own_entries"] is not None and r["flows_live"]]
    sanity = {"core_over_live_flows_mean": sum(ratios) / len(ratios) if ratios else None,
              "core_over_live_flows_min": min(ratios, default=None),
              "core_over_live_flows_max": max(ratios, default=None),
              "runs": len(rows)}
    one = [r for r in rows if r["lsids"] == 1]  # one core holds every flow
    core_fit = FIT.fit(one, "core_entries", TERMS, "linear", level=cfg.level,
                       holdout=False, cluster=CLUSTER) if one else None
    if isinstance(core_fit, FIT.Fit) and "flows" in core_fit.terms:
        lo, hi = core_fit.ci["flows"]
        sanity["core_slope_on_flows"] = core_fit.coef["flows"]
        sanity["core_slope_ci"] = [lo, hi]
        sanity["core_slope_covers_1"] = lo <= 1.0 <= hi or abs(core_fit.coef["flows"] - 1) < 1e-3
    return {"fits": fits, "chosen": chosen, "predictions": predictions, "sanity": sanity}


def coverage(results: Sequence[dict[str, Any]], level: float) -> dict[str, Any]:
    """The repeat-study check: how often one repeat's interval for a coefficient covers
    another repeat's estimate of it (same target, model and term), over every ordered pair
    of repeats. For two independent estimates of equal precision the rate is
    P(|Z| < z / sqrt 2), about 83% at 95%: far less means the intervals are too narrow."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + level / 2)
    expected = 2 * NormalDist().cdf(z / math.sqrt(2)) - 1
    covered = total = 0
    by_term: dict[str, list[int]] = {}
    for i, a in enumerate(results):
        for j, b in enumerate(results):
            if i == j:
                continue
            for target, fa in a["chosen"].items():
                fb = b["chosen"].get(target)
                if fa is None or fb is None or fa.model != fb.model:
                    continue
                for term in set(fa.terms) & set(fb.terms):
                    lo, hi = fa.ci[term]
                    hit = int(lo <= fb.coef[term] <= hi)
                    covered += hit
                    total += 1
                    acc = by_term.setdefault(f"{target}/{fa.model}/{term}", [0, 0])
                    acc[0] += hit
                    acc[1] += 1
    return {"repeats": len(results), "covered": covered, "pairs": total,
            "rate": covered / total if total else None, "expected": expected,
            "by_term": {k: v[0] / v[1] for k, v in sorted(by_term.items())}}


def parse_point(text: str) -> dict[str, float]:
    """``routers=1000,flows=1e5,members=4`` -> a dict."""
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in TERMS:
            raise argparse.ArgumentTypeError(
                f"expected {'=N,'.join(TERMS)}=N, got {text!r}")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number in {text!r}") from None
        if not out[key.strip()] > 0:
            raise argparse.ArgumentTypeError(f"must be positive: {part!r}")
    return out


def _floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected X,X,...: {text!r}") from None
    if not vals or min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers: {text!r}")
    return vals


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N,N,...: {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return vals


def _settings(text: str) -> tuple[bool, ...]:
    if text.strip() == "none":
        return ()
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or any(w not in ("on", "off") for w in words):
        raise argparse.ArgumentTypeError(f"expected off, on, off,on or none: {text!r}")
    return tuple(sorted({w == "on" for w in words}))


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = StudyConfig()

    def csv(v: tuple[int, ...]) -> str:
        return ",".join(map(str, v))

    p.add_argument("--out", "-o", required=True, metavar="DIR",
                   help="directory for study.json, runs.csv, report.md/html and plots/")
    p.add_argument("--routers", type=_ints, default=d.routers, metavar="N,N,...",
                   help=f"network sizes (default {csv(d.routers)})")
    p.add_argument("--flows", type=_ints, default=d.flows, metavar="N,N,...",
                   help=f"flow counts (default {csv(d.flows)})")
    p.add_argument("--members", type=_ints, default=d.members, metavar="N,N,...",
                   help=f"members per flow (default {csv(d.members)})")
    p.add_argument("--endpoints", type=_floats, default=d.endpoints, metavar="X,X,...",
                   help="endpoints (hosts that may join) per router, varied apart from the "
                        f"network size (default {','.join(f'{x:g}' for x in d.endpoints)})")
    p.add_argument("--lsids", type=_ints, default=d.lsids, metavar="N,N,...",
                   help="location services (LSIDs, each with its own core router; flows are "
                        f"spread over them) (default {csv(d.lsids)})")
    p.add_argument("--seeds", type=int, default=d.seeds,
                   help=f"seeds per grid point; every run has a topology of its own "
                        f"(default {d.seeds})")
    p.add_argument("--repeats", type=int, default=d.repeats, metavar="N",
                   help="run the whole study N more times on fresh topologies and report how "
                        "often one repeat's intervals cover another's estimates (the "
                        "coverage check; default 0: not run)")
    p.add_argument("--join-window", type=float, default=d.join_window, metavar="SECONDS",
                   help=f"members join during this virtual time (default {d.join_window:g})")
    p.add_argument("--settle", type=float, default=d.settle, metavar="SECONDS",
                   help=f"virtual time after the last join before measuring "
                        f"(default {d.settle:g})")
    p.add_argument("--predict", type=parse_point, action="append", default=[],
                   metavar="routers=N,flows=N,members=N[,endpoints=N,lsids=N]",
                   help="predict the tables at this point (repeatable; endpoints default to "
                        "routers/2, lsids to 1); refused beyond --max-factor times the range "
                        "the sweep covers, and beyond the sampled range of a term whose "
                        "held-out extrapolation test failed")
    p.add_argument("--max-factor", type=float, default=d.max_factor, metavar="X",
                   help=f"how far beyond the sweep a prediction may go (default "
                        f"{d.max_factor:g}x)")
    p.add_argument("--level", type=float, default=d.level,
                   help=f"confidence level of the intervals (default {d.level})")
    b = d.backbone
    p.add_argument("--aggregate", type=_settings, default=b.aggregate, metavar="off,on",
                   help="the backbone sweep: generated backbones with aggregation off and/or "
                        "on, side by side in the report ('none' leaves it out; default off,on)")
    p.add_argument("--backbone-cores", type=_ints, default=b.cores, metavar="N,N,...",
                   help=f"routers inside the backbone region (default {csv(b.cores)})")
    p.add_argument("--backbone-edges", type=_ints, default=b.edges, metavar="N,N,...",
                   help=f"the region's border routers (default {csv(b.edges)})")
    p.add_argument("--backbone-flows", type=_ints, default=b.flows, metavar="N,N,...",
                   help=f"end flows in the backbone sweep (default {csv(b.flows)})")
    p.add_argument("--backbone-seeds", type=int, default=b.seeds, metavar="N",
                   help=f"seeds per backbone grid point (default {b.seeds})")
    p.add_argument("--traces", metavar="DIR", default=None,
                   help="also write every run's router traces under DIR/<run>/ (for "
                        "flowtrace analyze)")


def config_from_args(args: argparse.Namespace) -> StudyConfig:
    return StudyConfig(routers=args.routers, flows=args.flows, members=args.members,
                       endpoints=args.endpoints, lsids=args.lsids, repeats=args.repeats,
                       seeds=args.seeds, join_window=args.join_window, settle=args.settle,
                       level=args.level, max_factor=args.max_factor, predict=args.predict,
                       traces=args.traces,
                       backbone=BB.BackboneConfig(aggregate=args.aggregate,
                                                  cores=args.backbone_cores,
                                                  edges=args.backbone_edges,
                                                  flows=args.backbone_flows,
                                                  seeds=args.backbone_seeds))


def run(args: argparse.Namespace, emit: Callable[[str], None]) -> int:
    from . import study_report

    if (args.seeds < 1 or args.backbone_seeds < 1 or not 0 < args.level < 1
            or args.max_factor < 1 or args.repeats < 0):
        emit("flowtrace study: --seeds and --backbone-seeds must be >= 1, --level in (0, 1), "
             "--max-factor >= 1, --repeats >= 0")
        return 2
    cfg = config_from_args(args)
    t0 = time.monotonic()
    rows = sweep(cfg, emit)
    result = analyse(rows, cfg)
    if cfg.repeats > 0:
        again = [analyse(sweep(cfg, emit, base), cfg) for base in range(1, cfg.repeats + 1)]
        result["coverage"] = coverage([result, *again], cfg.level)
    bb_rows = BB.sweep(cfg.backbone, emit, cfg.traces) if cfg.backbone.aggregate else []
    result["backbone"] = BB.analyse(bb_rows, cfg.level)
    result["backbone_runs"] = bb_rows
    os.makedirs(args.out, exist_ok=True)
    meta = study_report.header(cfg, time.monotonic() - t0)
    doc = {"meta": meta, "config": asdict(cfg), "runs": rows,
           "fits": [r for fs in result["fits"].values() for r in FIT.as_rows(fs)],
           "chosen": {k: (f.model if f else None) for k, f in result["chosen"].items()},
           "predictions": result["predictions"], "sanity": result["sanity"],
           "coverage": result.get("coverage"),
           "backbone": {"runs": bb_rows,
                        "fits": [{"fit": key, **r}
                                 for key, fs in result["backbone"]["fits"].items()
                                 for r in FIT.as_rows(fs)],
                        "core_ratio": result["backbone"]["core_ratio"],
                        "delivery_exact": result["backbone"]["exact"]}}
    with open(os.path.join(args.out, "study.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, default=str)
    for name, table in (("runs.csv", rows), ("backbone_runs.csv", bb_rows)):
        if not table:
            continue
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as fh:
            cols = list(table[0])
            fh.write(",".join(cols) + "\n")
            fh.writelines(",".join("" if r[c] is None else str(r[c]) for c in cols) + "\n"
                          for r in table)
    md = study_report.write(args.out, meta, rows, result)
    print(study_report.console(rows, result))
    print(f"  report: {md}")
    return 0
