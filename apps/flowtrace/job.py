"""The flowtrace analysis: read, check, tabulate, fit, report (the ``analyze`` command).

:func:`analyze` drives one of two engines through the same stages: Spark
(:mod:`flowtrace.spark_engine`: large traces, clusters, URIs) or plain Python
(:mod:`flowtrace.local_engine`: a small trace in seconds, no JVM); :func:`choose_engine`
picks one for ``--engine auto``. The job reads router traces (:mod:`flowtrace.schema`:
every supported schema version, one line rule and one reason taxonomy with ``validate``),
fails when more than ``max_bad_fraction`` of the lines are bad, leaves out routers whose
clocks are off (:mod:`flowtrace.clocks`, named) and clock outliers (records far outside
their run's time range, counted per router), picks the bucket width from the traces' span
when none is given, and then has the engine build the tables (Spark: the functions of
:mod:`flowtrace.tables`, the Python API) and write them as Parquet (partitioned by run),
fits table size across runs (:mod:`flowtrace.fit`: one observation per run, refused when
the runs cannot support it) and writes the report (:mod:`flowtrace.report`).
Imports the rest of flowtrace (pyspark and pyarrow only lazily, through the engines).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import clocks, provenance, schema
from . import fit as FIT
from .schema import error_sql, read_records  # noqa: F401 - part of the API
from .session import build_session, default_driver_memory, is_uri, resolve_inputs  # noqa: F401
from .spark_engine import SMALL_CONF, SMALL_INPUT_BYTES, input_bytes  # noqa: F401

TABLES = ("errors", "clock_offsets", "clock_outliers", "routers", "router_buckets",
          "network_buckets", "role_entries", "churn", "gc_lag", "gc_lag_summary",
          "gc_lag_hist", "savings", "load_by_role", "load_summary", "fanout", "flows",
          "tree_size", "run_points", "fit")
STAGES = ("read and validate", "routers", "router buckets", "network buckets", "gc lag",
          "churn and savings", "load by role", "fan-out and flows", "fit", "report")

#: per-router bucket grids longer than this make the job widen the bucket
MAX_BUCKETS = 20_000
#: bucket widths the job picks from when none is given (about TARGET_BUCKETS per run)
NICE_WIDTHS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
               7200, 21600, 86400)
TARGET_BUCKETS = 50
MAX_BAD_FRACTION = 0.01
CLOCK_FENCE = 10.0
FIT_TERMS = ("flows", "members", "routers")
FIT_TARGETS = ("core_entries", "edge_entries", "transit_entries", "max_entries",
               "total_entries")


class BadInput(Exception):
    """The input is too broken to analyse (the message says how)."""


@dataclass
class Progress:
    """Stage announcements; ``emit`` gets one line of text (None: silent)."""

    emit: Callable[[str], None] | None = None
    started: float = field(default_factory=time.monotonic)
    n: int = 0

    def stage(self, name: str) -> None:
        self.n += 1
        if self.emit is not None:
            self.emit(f"[flowtrace +{time.monotonic() - self.started:6.1f}s] "
                      f"stage {self.n}/{len(STAGES)}: {name}")


@dataclass
class Result:
    out_dir: str
    summary: dict[str, Any]
    report_md: str | None = None
    report_html: str | None = None


def choose_bucket(span: float) -> float:
    """A round bucket width giving about TARGET_BUCKETS buckets over *span* seconds."""
    want = span / TARGET_BUCKETS if span > 0 else 1.0
    return float(next((w for w in NICE_WIDTHS if w >= want), NICE_WIDTHS[-1]))


ENGINES = ("auto", "spark", "local")
#: ``--engine auto`` runs local inputs up to this many bytes in plain Python (no JVM)
LOCAL_LIMIT = 64 * 2**20  # ~450,000 lines, ~1 GiB of records in memory


def choose_engine(choice: str, paths: Sequence[str], *, master: str = "local[*]",
                  tables_uri: str | None = None, limit: int = LOCAL_LIMIT
                  ) -> tuple[str, str]:
    """(engine, why) for ``--engine`` *choice*: ``auto`` is ``local`` when every input is a
    local file, together at most *limit* bytes, the master is a local one, the tables go to
    a local folder and pyarrow (which writes them) is installed; else ``spark``."""
    if choice != "auto":
        return choice, f"--engine {choice}"
    size = input_bytes(paths)
    if size is None:
        return "spark", "auto: the inputs are not all local files"
    if size > limit:
        return "spark", f"auto: {size} input bytes, more than the local limit of {limit}"
    if not master.startswith("local"):
        return "spark", f"auto: --master {master} is a cluster"
    if tables_uri and is_uri(tables_uri) and not tables_uri.startswith("file://"):
        return "spark", "auto: the tables go to a URI"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return "spark", "auto: pyarrow (which the local engine writes Parquet with) is missing"
    return "local", f"auto: {size} input bytes, at most the local limit of {limit}"


def _schemas() -> dict[str, str]:
    from .local_engine import SCHEMAS

    return {**SCHEMAS, "clock_offsets": OFFSET_SCHEMA, "fit": FIT_SCHEMA,
            "run_points": _point_schema(POINT_COLUMNS)}


def analyze(spark: Any, inputs: Sequence[str], out_dir: str, *, bucket: float | None = None,
            progress: Progress | None = None, tables_uri: str | None = None,
            top_routers: int = 8, make_report: bool = True,
            max_bad_fraction: float = MAX_BAD_FRACTION, clock_fence: float = CLOCK_FENCE,
            clock_tolerance: float = clocks.TOLERANCE, config: dict[str, Any] | None = None,
            small_input_bytes: int = SMALL_INPUT_BYTES, engine: str | None = None) -> Result:
    """Run the whole analysis; returns the summary (also in ``out_dir/summary.json``).

    *engine*: ``spark`` (on the session *spark*) or ``local`` (plain Python, no session:
    :mod:`flowtrace.local_engine`); by default ``spark`` when a session is given, else
    ``local``. Both write the same tables and report, which say which engine ran.
    With Spark, local inputs of at most *small_input_bytes* run with :data:`SMALL_CONF`
    (0: never). Raises :class:`BadInput` when more than *max_bad_fraction* of the lines are
    bad or no line is a valid record (the errors table is written first).
    """
    if bucket is not None and not bucket > 0:
        raise ValueError("bucket must be positive")
    engine = engine or ("spark" if spark is not None else "local")
    if engine not in ("spark", "local"):
        raise ValueError(f"unknown engine {engine!r}")
    paths = resolve_inputs(inputs)
    os.makedirs(out_dir, exist_ok=True)
    base = tables_uri or os.path.join(os.path.abspath(out_dir), "tables")
    kwargs = dict(bucket=bucket, progress=progress or Progress(), top_routers=top_routers,
                  make_report=make_report, max_bad_fraction=max_bad_fraction,
                  clock_fence=clock_fence, clock_tolerance=clock_tolerance)
    if engine == "local":
        from .local_engine import LocalEngine

        local_base = base[len("file://"):] if base.startswith("file://") else base
        return _analyze(LocalEngine(local_base, _schemas()), inputs, paths, out_dir,
                        config=dict(config or {}), **kwargs)  # type: ignore[arg-type]
    from .spark_engine import SparkEngine, small_input_conf

    with small_input_conf(spark, input_bytes(paths), small_input_bytes) as tuned:
        return _analyze(SparkEngine(spark, base, _schemas()), inputs, paths, out_dir,
                        config={**(config or {}),
                                **({"small_input_settings": tuned} if tuned else {})},
                        **kwargs)  # type: ignore[arg-type]


def _analyze(engine: Any, inputs: Sequence[str], paths: list[str], out_dir: str, *,
             bucket: float | None, progress: Progress, top_routers: int, make_report: bool,
             max_bad_fraction: float, clock_fence: float, clock_tolerance: float,
             config: dict[str, Any]) -> Result:
    t0 = time.monotonic()
    notes: list[str] = []

    def stage(i: int) -> None:
        progress.stage(STAGES[i])
        engine.stage(STAGES[i])

    # -- 1. read and validate ---------------------------------------------------------------
    stage(0)
    counts = engine.read(paths)
    total_lines = sum(r["count"] for r in counts)
    n_corrupt = sum(r["count"] for r in counts if schema.error_class(r["err"]) == "corrupt")
    n_invalid = sum(r["count"] for r in counts if schema.error_class(r["err"]) == "invalid")
    by_kind: dict[str, int] = {}
    for r in counts:
        if r["err"] is None:
            by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + r["count"]
    n_valid = sum(by_kind.values())
    error_rows = engine.errors(bool(n_corrupt or n_invalid))
    bad = n_corrupt + n_invalid
    if n_valid == 0 or (total_lines and bad / total_lines > max_bad_fraction):
        engine.close()
        top = "; ".join(f"{r['reason']}: {r['count']}" for r in error_rows[:3])
        share = 100 * bad / max(total_lines, 1)
        raise BadInput(f"{bad} of {total_lines} lines are bad ({share:.1f}%, more than "
                       f"--max-bad-fraction {max_bad_fraction:g}): {top or 'no records'}")

    offset_rows = clocks.offsets(clocks.pairs(r for r in counts if r["peer"] is not None),
                                 clock_tolerance) if clock_tolerance > 0 else []
    engine.write_rows("clock_offsets", offset_rows)
    dropped = set(clocks.left_out(offset_rows))
    n_dropped = sum(r["count"] for r in counts
                    if r["err"] is None and (r["run"], r["router"]) in dropped)
    if dropped:
        engine.drop_routers(dropped)
    notes += [f"router {r['router']} in {_run_name(r['run'])}: {r['note']}"
              for r in offset_rows if r["note"]][:20]
    outlier_rows = engine.clock_outliers(clock_fence) if clock_fence > 0 else []
    n_outliers = sum(r["records"] for r in outlier_rows)
    for r in outlier_rows[:5]:
        notes.append(f"clock outliers: {r['records']} record(s) of router {r['router']}"
                     f"{' in run ' + r['run'] if r['run'] else ''} at t={r['min_t']:g}.."
                     f"{r['max_t']:g} s, outside {r['fence_lo']:g}..{r['fence_hi']:g} s: left "
                     "out (a wrong clock?)")
    span_rows = engine.run_spans()
    widest = max((r["run_hi"] - r["run_lo"] for r in span_rows), default=0.0)
    if bucket is None:
        bucket = choose_bucket(widest)
        notes.append(f"bucket width {bucket:g} s chosen from the traces' span ({widest:g} s)")
    elif widest / bucket > MAX_BUCKETS:
        new = float(math.ceil(widest / MAX_BUCKETS))
        notes.append(f"the traces span {widest:.0f} s, more than {MAX_BUCKETS} buckets of "
                     f"{bucket:g} s: the bucket was widened to {new:g} s")
        bucket = new
    engine.prepare(bucket, span_rows)

    described = engine.describe()
    summary: dict[str, Any] = {
        "header": provenance.header(list(inputs), {
            "bucket_seconds": bucket, "max_bad_fraction": max_bad_fraction,
            "clock_fence": clock_fence, "clock_tolerance": clock_tolerance, **config,
            **described}),
        "engine": described["engine"],
        "inputs": list(inputs), "files": len(paths), "bucket_seconds": bucket,
        "lines": total_lines, "records": n_valid - n_outliers - n_dropped,
        "corrupt": n_corrupt, "invalid": n_invalid, "clock_outliers": n_outliers,
        "clock": {"tolerance": clock_tolerance, "estimated": len(offset_rows),
                  "left_out": [{k: r[k] for k in ("run", "router", "offset", "links")}
                               for r in offset_rows if r["trusted"] is False],
                  "records_left_out": n_dropped,
                  "undecided": [{k: r[k] for k in ("run", "router")}
                                for r in offset_rows if r["trusted"] is None]},
        "records_by_kind": dict(sorted(by_kind.items())),
        "errors": [{k: r[k] for k in ("class", "reason", "count")} for r in error_rows],
        "run_spans": {r["run"]: [r["run_lo"], r["run_hi"]] for r in span_rows},
        "notes": notes,
    }
    data: dict[str, Any] = {"errors": error_rows, "clock_outliers": outlier_rows,
                            "clock_offsets": offset_rows}

    # -- 2. routers and their roles (one pass: record_counts) -------------------------------
    stage(1)
    router_rows, run_peaks = engine.routers()
    summary["runs"] = sorted({r["run"] for r in router_rows})
    data["routers"] = router_rows
    summary["routers"] = len(router_rows)
    summary["routers_by_role"] = {role: sum(1 for r in router_rows if r["role"] == role)
                                  for role in ("core", "edge", "transit")}
    summary["buckets"] = max((r["hi"] - r["lo"] + 1 for r in router_rows), default=0)

    # -- 3. router buckets ------------------------------------------------------------------
    stage(2)
    engine.router_buckets()

    # -- 4. network buckets, live flows -----------------------------------------------------
    stage(3)
    net_rows, role_rows = engine.network()
    data["network"], data["role_entries"] = net_rows, role_rows
    summary["peaks"] = peak_summary(run_peaks, router_rows, net_rows, bucket)
    if summary["peaks"]:
        summary["peak"] = max(summary["peaks"].values(),
                               key=lambda p: (p["entries_total"] or 0, p["run"]))
    biggest = [r["router"] for r in sorted(router_rows, key=lambda r: -(r["max_entries"] or 0))
               [:top_routers]]
    data["top_routers"] = engine.top_routers(biggest, TOP_COLUMNS)

    # -- 5. GC lag --------------------------------------------------------------------------
    stage(4)
    gsum_rows, data["gc_hist"] = engine.gc(LAG_BINS, lag_width)
    data["gc_summary"] = gsum_rows
    overall = [r for r in gsum_rows if r["role"] == "all"]
    summary["gc"] = {k: (overall[0][k] if len(overall) == 1 else None)
                     for k in ("deletions", "p50", "p90", "p99", "max", "mean_pings")}

    # -- 6. churn and savings ---------------------------------------------------------------
    stage(5)
    churn_tot: dict[str, int] = {}
    for r in engine.churn():
        key = r["kind"] + (":" + r["cause"] if r["cause"] else "")
        churn_tot[key] = churn_tot.get(key, 0) + r["count"]
    summary["churn"] = dict(sorted(churn_tot.items()))
    sav_rows = engine.savings()
    data["savings"] = sav_rows
    saved: dict[str, dict[str, float]] = {}
    for r in sav_rows:
        acc = saved.setdefault(r["reason"], {"est_msgs": 0, "est_bytes": 0, "est_link_tx": 0,
                                             "est_link_bytes": 0})
        for k in acc:
            acc[k] += r[k] or 0
    summary["saved"] = saved

    # -- 7. load by role --------------------------------------------------------------------
    stage(6)
    data["load"], lsum_rows = engine.load()
    data["load_summary"] = lsum_rows
    summary["load"] = {(r["run"] + "/" if r["run"] else "") + r["role"]:
                       {"routers": r["routers"],
                        "msgs_per_s_per_router": r["msgs_per_s_per_router"],
                        "entries_peak": r["entries_peak"]} for r in lsum_rows}

    # -- 8. fan-out, flows, tree size -------------------------------------------------------
    stage(7)
    data["fanout"] = engine.fanout()
    tree_rows = engine.flows()
    data["tree"] = tree_rows
    summary["flows"] = sum(r["flows"] for r in tree_rows)

    # -- 9. the fit across runs -------------------------------------------------------------
    stage(8)
    points = run_points(net_rows, role_rows)
    data["run_points"] = points
    results = fit_runs(points)
    fit_rows = FIT.as_rows(results)
    data["fit"], data["fit_results"] = fit_rows, results
    summary["fit"] = {}
    for target in FIT_TARGETS:
        best = FIT.best([f for f in results if f.target == target])
        if best is None:
            summary["fit"][target] = {"refused": next(
                (f.reason for f in results
                 if f.target == target and isinstance(f, FIT.Refusal)), "no data")}
        else:
            summary["fit"][target] = {"model": best.model, "formula": best.formula(),
                                      "runs": best.n, "loo_error": best.loo_error}
    engine.write_rows("run_points", points)
    engine.write_rows("fit", fit_rows, ())
    engine.close()

    # -- 10. report -------------------------------------------------------------------------
    progress.stage(STAGES[9])
    wall = time.monotonic() - t0
    summary["wall_seconds"] = round(wall, 3)
    summary["lines_per_second"] = round(total_lines / wall, 1) if wall > 0 else None
    result = Result(out_dir=out_dir, summary=summary)
    if make_report:
        from . import report

        result.report_md, result.report_html = report.write_report(out_dir, summary, data)
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True, default=str)
    return result


#: the columns of the largest routers' buckets the report plots
TOP_COLUMNS = ("run", "router", "role", "bucket", "seconds", "entries", "entries_replay",
               "active_flows", "entry_adds", "entry_dels")
#: bins of the GC lag histogram
LAG_BINS = 40


def lag_width(summary_rows: Sequence[dict[str, Any]]) -> float:
    """The GC lag histogram's bin width: the largest lag over :data:`LAG_BINS` (1 s when
    there is none)."""
    max_lag = max((r["max"] for r in summary_rows if r["max"] is not None), default=None)
    return (max_lag / LAG_BINS) if max_lag and max_lag > 0 else 1.0


def peak_summary(run_peaks: Sequence[dict[str, Any]], router_rows: Sequence[dict[str, Any]],
                 net_rows: Sequence[dict[str, Any]], bucket: float
                 ) -> dict[str, dict[str, Any]]:
    """Per run: the exact peak total (every snapshot and entry event, :mod:`~.peaks`) and
    when, the largest single table, which router held it and when; with the live flows,
    active entries and memory of the bucket the peak falls in (those are per bucket)."""
    net = {(r["run"], round(r["bucket"] / bucket)): r for r in net_rows}
    out: dict[str, dict[str, Any]] = {}
    for p in run_peaks:
        run = p["run"]
        mine = [r for r in router_rows if r["run"] == run and r["max_entries"] is not None]
        big = max(mine, key=lambda r: (r["max_entries"], -(r["peak_t"] or 0.0)), default=None)
        k = None if p["t"] is None else math.floor(p["t"] / bucket)
        b = None if k is None else k * bucket
        row = net.get((run, k), {})
        out[run] = {"run": run, "entries_total": p["entries_total"], "t": p["t"],
                    "bucket": b, "entries_max": big["max_entries"] if big else None,
                    "router_max": big["router"] if big else None,
                    "t_max": big["peak_t"] if big else None,
                    **{k: row.get(k) for k in ("flows_live", "active_flows", "mem_total",
                                                "routers_reporting")}}
    return out


OFFSET_SCHEMA = ("run string, router string, offset double, links long, trusted boolean, "
                 "note string")


def _run_name(run: str) -> str:
    return f"run {run}" if run else "the untagged run"


FIT_SCHEMA = ("target string, model string, term string, coef double, se double, "
              "ci_lo double, ci_hi double, n long, df long, r2 double, loo_error double, "
              "extrapolation_error double, note string")


#: the columns of a run point (:func:`run_points`), for an empty ``run_points`` table
POINT_COLUMNS = ("run", "bucket", "flows", "members", "routers", "core_entries",
                 "edge_entries", "transit_entries", "max_entries", "total_entries")


def _point_schema(cols: Sequence[str]) -> str:
    return ", ".join(f"{c} {'string' if c == 'run' else 'double'}" for c in cols)


def run_points(net_rows: Sequence[dict[str, Any]], role_rows: Sequence[dict[str, Any]]
               ) -> list[dict[str, Any]]:
    """One observation per run: its complete bucket (every router has reported a snapshot)
    with the most live flows (the latest among equals), with table sizes per role."""
    by_role: dict[tuple[str, float], dict[str, dict[str, Any]]] = {}
    for r in role_rows:
        by_role.setdefault((r["run"] or "", r["bucket"]), {})[r["role"]] = r
    best: dict[str, dict[str, Any]] = {}
    for r in net_rows:
        if not r["routers_reporting"] or r["routers_reporting"] != r["routers"]:
            continue
        if not (r["flows_live"] or 0) > 0:
            continue
        run = r["run"] or ""
        key = (r["flows_live"], r["bucket"])
        if run not in best or key >= (best[run]["flows_live"], best[run]["bucket"]):
            best[run] = r
    out = []
    for run, r in sorted(best.items()):
        roles = by_role.get((run, r["bucket"]), {})

        def mean(role: str, roles: dict[str, dict[str, Any]] = roles) -> float | None:
            x = roles.get(role)
            return None if x is None else x["entries_mean"]

        out.append({"run": run, "bucket": float(r["bucket"]),
                    "flows": float(r["flows_live"]), "members": float(r["members"] or 0),
                    "routers": float(r["routers"]), "core_entries": mean("core"),
                    "edge_entries": mean("edge"), "transit_entries": mean("transit"),
                    "max_entries": float(r["entries_max"] or 0),
                    "total_entries": float(r["entries_total"] or 0)})
    return out


def fit_runs(points: Sequence[dict[str, Any]]) -> list[FIT.Fit | FIT.Refusal]:
    """Linear and power fits of every target across runs (refusals included)."""
    terms = [t for t in FIT_TERMS if any(p[t] for p in points)]
    out: list[FIT.Fit | FIT.Refusal] = []
    for target in FIT_TARGETS:
        for model in ("linear", "power"):
            if len(points) < 2:
                out.append(FIT.Refusal(target, model, (
                    f"{len(points)} run(s) with complete snapshots: a scaling fit needs "
                    "several runs (networks of different sizes or loads, tagged with 'run'); "
                    "buckets of one run are not independent observations; see flowtrace "
                    "study")))
                continue
            out.append(FIT.fit(points, target, terms, model))
    return out
