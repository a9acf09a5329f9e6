"""The flowtrace analysis: read, check, tabulate, fit, report (the ``analyze`` command).

:func:`analyze` reads router traces (:mod:`flowtrace.schema`: every supported schema
version, one line rule and one reason taxonomy with ``validate``), caches the checked records
once, fails when more than ``max_bad_fraction`` of the lines are bad, leaves out routers
whose clocks are off (:mod:`flowtrace.clocks`, named) and clock outliers (records far
outside their run's time range, counted per router), picks the bucket
width from the traces' span when none is given, and then builds the tables with the
functions of :mod:`flowtrace.tables` (the Python API), writes them as Parquet
(partitioned by run, and the large per-router ones by router too), fits table size across
runs (:mod:`flowtrace.fit`: one observation per run, refused when the runs cannot
support it) and writes the report (:mod:`flowtrace.report`).
Imports pyspark lazily; the rest of flowtrace and :mod:`flowrouter.core.traces`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import clocks, peaks, provenance, schema, tables
from . import fit as FIT
from .schema import error_sql, read_records  # noqa: F401 - part of the API
from .session import build_session, default_driver_memory, resolve_inputs  # noqa: F401

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
#: local inputs up to this size run with SMALL_CONF (see small_input_conf)
SMALL_INPUT_BYTES = 8 * 2**20  # ~50,000 lines; a conservative bound, not tuned
SMALL_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.codegen.wholeStage": "false",
              "spark.sql.shuffle.partitions": "1"}
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

    def stage(self, name: str, spark: Any = None) -> None:
        self.n += 1
        if spark is not None:
            spark.sparkContext.setJobDescription(f"flowtrace: {name}")
        if self.emit is not None:
            self.emit(f"[flowtrace +{time.monotonic() - self.started:6.1f}s] "
                      f"stage {self.n}/{len(STAGES)}: {name}")


@dataclass
class Result:
    out_dir: str
    summary: dict[str, Any]
    report_md: str | None = None
    report_html: str | None = None


def _spark_conf(spark: Any) -> dict[str, Any]:
    """What the session really runs with: master, driver address, UI, Spark version."""
    conf = spark.sparkContext.getConf()
    return {"spark_master": spark.sparkContext.master, "spark_version": spark.version,
            "driver_host": conf.get("spark.driver.host", None),
            "ui": conf.get("spark.ui.enabled", "true") == "true"}


def choose_bucket(span: float) -> float:
    """A round bucket width giving about TARGET_BUCKETS buckets over *span* seconds."""
    want = span / TARGET_BUCKETS if span > 0 else 1.0
    return float(next((w for w in NICE_WIDTHS if w >= want), NICE_WIDTHS[-1]))


def _rows(df: Any) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.collect()]


class _Tables:
    """Writes the Parquet tables; small ones from rows already collected on the driver."""

    def __init__(self, spark: Any, base: str) -> None:
        self.spark = spark
        self.base = base.rstrip("/")

    def write(self, df: Any, name: str, by: Sequence[str] = ("run",), *,
              small: bool = False, sort: Sequence[str] = ()) -> None:
        """Parquet under base/name, partitioned by the *by* columns it has; a large table is
        first clustered by run (one file per run, not one per task or per router) and sorted
        by *sort* within it (so a reader's filter on a router skips most row groups).

        An empty table is still a table: a partitioned write of no rows leaves a folder with
        no part file, which ``spark.read.parquet`` refuses (it cannot infer a schema), so an
        empty table is written unpartitioned as one part file with no rows that carries the
        schema (the partition columns last, where reading a partitioned table puts them)."""
        by = [c for c in by if c in df.columns]
        if small or not by:
            df = df.coalesce(1)
        elif "run" in by:
            df = df.repartition("run")
        if sort:
            df = df.sortWithinPartitions(*sort)
        path = f"{self.base}/{name}"
        w = df.write.mode("overwrite")
        (w.partitionBy(*by) if by else w).parquet(path)
        if by and not self._has_parts(path):
            empty = self.spark.createDataFrame(
                [], df.select(*[c for c in df.columns if c not in by], *by).schema)
            empty.coalesce(1).write.mode("overwrite").parquet(path)

    def _has_parts(self, path: str) -> bool:
        """Whether a written table holds any Parquet part file (through Hadoop's file
        system API, so any URI the job writes to is looked at the same way)."""
        jvm = self.spark.sparkContext._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = hpath.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration())
        files = fs.listFiles(hpath, True)
        while files.hasNext():
            if files.next().getPath().getName().endswith(".parquet"):
                return True
        return False

    def collect(self, df: Any, name: str, by: Sequence[str] = ("run",)) -> list[dict[str, Any]]:
        """Collect a small table and write the collected rows (one computation, not two)."""
        rows = _rows(df)
        self.write(self.spark.createDataFrame([tuple(r.values()) for r in rows], df.schema),
                   name, by, small=True)
        return rows


def input_bytes(paths: Sequence[str]) -> int | None:
    """The size of the inputs when all are local files, else None (not known up front)."""
    try:
        return sum(os.path.getsize(p) for p in paths)
    except OSError:
        return None


@contextlib.contextmanager
def small_input_conf(spark: Any, size: int | None, limit: int = SMALL_INPUT_BYTES
                     ) -> Iterator[dict[str, str]]:
    """For inputs of at most *limit* bytes, run with :data:`SMALL_CONF` (the settings it
    changes are restored afterwards; yields them, empty when nothing changed).

    On a small input the fixed costs dominate: adaptive execution splits every query into a
    job per stage (three times the jobs), code generation compiles the big validation CASE
    for each query, and more than one shuffle partition (or range partition, for a sort) is
    pure overhead. A large input keeps the session's settings."""
    if size is None or size > limit:
        yield {}
        return
    saved = {k: spark.conf.get(k, None) for k in SMALL_CONF}
    for k, v in SMALL_CONF.items():
        spark.conf.set(k, v)
    try:
        yield dict(SMALL_CONF)
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def analyze(spark: Any, inputs: Sequence[str], out_dir: str, *, bucket: float | None = None,
            progress: Progress | None = None, tables_uri: str | None = None,
            top_routers: int = 8, make_report: bool = True,
            max_bad_fraction: float = MAX_BAD_FRACTION, clock_fence: float = CLOCK_FENCE,
            clock_tolerance: float = clocks.TOLERANCE, config: dict[str, Any] | None = None,
            small_input_bytes: int = SMALL_INPUT_BYTES) -> Result:
    """Run the whole analysis; returns the summary (also in ``out_dir/summary.json``).

    Local inputs of at most *small_input_bytes* run with :data:`SMALL_CONF` (0: never).
    Raises :class:`BadInput` when more than *max_bad_fraction* of the lines are bad or no
    line is a valid record (the errors table is written first).
    """
    if bucket is not None and not bucket > 0:
        raise ValueError("bucket must be positive")
    paths = resolve_inputs(inputs)
    with small_input_conf(spark, input_bytes(paths), small_input_bytes) as tuned:
        return _analyze(spark, inputs, paths, out_dir, bucket=bucket, progress=progress,
                        tables_uri=tables_uri, top_routers=top_routers,
                        make_report=make_report, max_bad_fraction=max_bad_fraction,
                        clock_fence=clock_fence, clock_tolerance=clock_tolerance,
                        config={**(config or {}),
                                **({"small_input_settings": tuned} if tuned else {})})


def _analyze(spark: Any, inputs: Sequence[str], paths: list[str], out_dir: str, *,
             bucket: float | None, progress: Progress | None, tables_uri: str | None,
             top_routers: int, make_report: bool, max_bad_fraction: float,
             clock_fence: float, clock_tolerance: float, config: dict[str, Any]) -> Result:
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    progress = progress or Progress()
    os.makedirs(out_dir, exist_ok=True)
    out = _Tables(spark, tables_uri or os.path.join(os.path.abspath(out_dir), "tables"))
    notes: list[str] = []

    # -- 1. read and validate ---------------------------------------------------------------
    progress.stage(STAGES[0], spark)
    checked = cached = read_records(spark, paths).persist()
    counts = _rows(tables.line_counts(checked))
    total_lines = sum(r["count"] for r in counts)
    n_corrupt = sum(r["count"] for r in counts if schema.error_class(r["err"]) == "corrupt")
    n_invalid = sum(r["count"] for r in counts if schema.error_class(r["err"]) == "invalid")
    by_kind: dict[str, int] = {}
    for r in counts:
        if r["err"] is None:
            by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + r["count"]
    n_valid = sum(by_kind.values())
    errors = (checked.where(F.col("err").isNotNull())
              .groupBy(F.when(F.col("err") == schema.CORRUPT, "corrupt").otherwise("invalid")
                       .alias("class"), F.col("err").alias("reason"))
              .agg(F.count(F.lit(1)).alias("count"), F.min("file").alias("example_file"),
                   F.min("line").alias("example_line"))
              .orderBy(F.desc("count"), "reason"))
    error_rows = out.collect(errors, "errors", ()) if (n_corrupt or n_invalid) else []
    if not error_rows:
        out.write(spark.createDataFrame([], errors.schema), "errors", (), small=True)
    bad = n_corrupt + n_invalid
    if n_valid == 0 or (total_lines and bad / total_lines > max_bad_fraction):
        cached.unpersist()
        top = "; ".join(f"{r['reason']}: {r['count']}" for r in error_rows[:3])
        share = 100 * bad / max(total_lines, 1)
        raise BadInput(f"{bad} of {total_lines} lines are bad ({share:.1f}%, more than "
                       f"--max-bad-fraction {max_bad_fraction:g}): {top or 'no records'}")

    offset_rows = clocks.offsets(clocks.pairs(r for r in counts if r["peer"] is not None),
                                 clock_tolerance) if clock_tolerance > 0 else []
    out.write(spark.createDataFrame([tuple(r.values()) for r in offset_rows], OFFSET_SCHEMA),
              "clock_offsets", small=True)
    dropped = set(clocks.left_out(offset_rows))
    n_dropped = sum(r["count"] for r in counts
                    if r["err"] is None and (r["run"], r["router"]) in dropped)
    if dropped:
        checked = tables.drop_routers(checked, spark.createDataFrame(
            sorted(dropped), "run string, router string"))
    notes += [f"router {r['router']} in {_run_name(r['run'])}: {r['note']}"
              for r in offset_rows if r["note"]][:20]
    fences = tables.clock_fences(checked, clock_fence) if clock_fence > 0 else None
    if fences is not None:
        fence_rows = _rows(fences)
        fences = spark.createDataFrame([tuple(r.values()) for r in fence_rows], fences.schema)
        outlier_rows = out.collect(tables.clock_outliers(checked, fences), "clock_outliers")
    else:
        outlier_rows = []
    n_outliers = sum(r["records"] for r in outlier_rows)
    for r in outlier_rows[:5]:
        notes.append(f"clock outliers: {r['records']} record(s) of router {r['router']}"
                     f"{' in run ' + r['run'] if r['run'] else ''} at t={r['min_t']:g}.."
                     f"{r['max_t']:g} s, outside {r['fence_lo']:g}..{r['fence_hi']:g} s: left "
                     "out (a wrong clock?)")
    valid0 = tables.prepare(checked, 1.0, spans=fences)
    span_rows = _rows(valid0.groupBy("run").agg(F.min("t").alias("run_lo"),
                                                F.max("t").alias("run_hi")))
    widest = max((r["run_hi"] - r["run_lo"] for r in span_rows), default=0.0)
    if bucket is None:
        bucket = choose_bucket(widest)
        notes.append(f"bucket width {bucket:g} s chosen from the traces' span ({widest:g} s)")
    elif widest / bucket > MAX_BUCKETS:
        new = float(math.ceil(widest / MAX_BUCKETS))
        notes.append(f"the traces span {widest:.0f} s, more than {MAX_BUCKETS} buckets of "
                     f"{bucket:g} s: the bucket was widened to {new:g} s")
        bucket = new
    runs = spark.createDataFrame([(r["run"], float(r["run_lo"]), float(r["run_hi"]))
                                  for r in span_rows], "run string, run_lo double, run_hi double")
    valid = tables.prepare(checked, bucket, spans=fences)

    summary: dict[str, Any] = {
        "header": provenance.header(list(inputs), {
            "bucket_seconds": bucket, "max_bad_fraction": max_bad_fraction,
            "clock_fence": clock_fence, "clock_tolerance": clock_tolerance, **config,
            **_spark_conf(spark)}),
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
    progress.stage(STAGES[1], spark)
    rc = tables.record_counts(valid).persist()
    timeline = peaks.entry_timeline(valid).persist()
    router_df = tables.routers(rc, peaks.router_peaks(timeline))
    router_rows = out.collect(router_df, "routers")
    routers = spark.createDataFrame([tuple(r.values()) for r in router_rows], router_df.schema)
    run_peaks = _rows(peaks.run_peaks(timeline))
    timeline.unpersist()
    roles = routers.select("run", "router", F.col("role").alias("router_role"))
    summary["runs"] = sorted({r["run"] for r in router_rows})
    data["routers"] = router_rows
    summary["routers"] = len(router_rows)
    summary["routers_by_role"] = {role: sum(1 for r in router_rows if r["role"] == role)
                                  for role in ("core", "edge", "transit")}
    summary["buckets"] = max((r["hi"] - r["lo"] + 1 for r in router_rows), default=0)

    # -- 3. router buckets ------------------------------------------------------------------
    progress.stage(STAGES[2], spark)
    rb = tables.router_buckets(rc, routers, runs, bucket).persist()
    out.write(rb.drop("bidx"), "router_buckets", sort=("router", "bucket"))

    # -- 4. network buckets, live flows -----------------------------------------------------
    progress.stage(STAGES[3], spark)
    net_rows = out.collect(tables.network_buckets(rb, tables.flow_deltas(valid)),
                           "network_buckets")
    data["network"] = net_rows
    role_rows = out.collect(tables.role_entries(rb), "role_entries")
    data["role_entries"] = role_rows
    summary["peaks"] = peak_summary(run_peaks, router_rows, net_rows, bucket)
    if summary["peaks"]:
        summary["peak"] = max(summary["peaks"].values(),
                               key=lambda p: (p["entries_total"] or 0, p["run"]))
    biggest = [r["router"] for r in sorted(router_rows, key=lambda r: -(r["max_entries"] or 0))
               [:top_routers]]
    data["top_routers"] = _rows(rb.where(F.col("router").isin(biggest))
                                .select("run", "router", "role", "bucket", "seconds", "entries",
                                        "entries_replay", "active_flows", "entry_adds",
                                        "entry_dels").orderBy("run", "router", "bucket"))

    # -- 5. GC lag --------------------------------------------------------------------------
    progress.stage(STAGES[4], spark)
    gc = tables.gc_lag(valid, roles).persist()
    out.write(gc, "gc_lag", sort=("router", "t_del"))
    gsum_rows = out.collect(tables.lag_summary(gc), "gc_lag_summary")
    data["gc_summary"] = gsum_rows
    max_lag = max((r["max"] for r in gsum_rows if r["max"] is not None), default=None)
    nbins = 40
    width = (max_lag / nbins) if max_lag and max_lag > 0 else 1.0
    data["gc_hist"] = out.collect(tables.lag_hist(gc, width, nbins), "gc_lag_hist")
    overall = [r for r in gsum_rows if r["role"] == "all"]
    summary["gc"] = {k: (overall[0][k] if len(overall) == 1 else None)
                     for k in ("deletions", "p50", "p90", "p99", "max", "mean_pings")}
    gc.unpersist()

    # -- 6. churn and savings ---------------------------------------------------------------
    progress.stage(STAGES[5], spark)
    churn_rows = out.collect(tables.churn(rc, bucket), "churn")
    churn_tot: dict[str, int] = {}
    for r in churn_rows:
        key = r["kind"] + (":" + r["cause"] if r["cause"] else "")
        churn_tot[key] = churn_tot.get(key, 0) + r["count"]
    summary["churn"] = dict(sorted(churn_tot.items()))
    rc.unpersist()
    traffic = tables.traffic_counts(valid, roles).persist()
    sav_rows = out.collect(tables.savings(traffic), "savings")
    data["savings"] = sav_rows
    saved: dict[str, dict[str, float]] = {}
    for r in sav_rows:
        acc = saved.setdefault(r["reason"], {"est_msgs": 0, "est_bytes": 0, "est_link_tx": 0,
                                             "est_link_bytes": 0})
        for k in acc:
            acc[k] += r[k] or 0
    summary["saved"] = saved

    # -- 7. load by role --------------------------------------------------------------------
    progress.stage(STAGES[6], spark)
    data["load"] = out.collect(tables.load_by_role(rb), "load_by_role")
    lsum_rows = out.collect(tables.load_summary(rb, routers), "load_summary")
    data["load_summary"] = lsum_rows
    summary["load"] = {(r["run"] + "/" if r["run"] else "") + r["role"]:
                       {"routers": r["routers"],
                        "msgs_per_s_per_router": r["msgs_per_s_per_router"],
                        "entries_peak": r["entries_peak"]} for r in lsum_rows}
    rb.unpersist()

    # -- 8. fan-out, flows, tree size -------------------------------------------------------
    progress.stage(STAGES[7], spark)
    data["fanout"] = out.collect(tables.fanout(valid, roles, traffic), "fanout")
    traffic.unpersist()
    flows = tables.flows(valid).persist()
    out.write(flows, "flows")
    tree_rows = out.collect(tables.tree_size(flows), "tree_size")
    data["tree"] = tree_rows
    summary["flows"] = sum(r["flows"] for r in tree_rows)
    flows.unpersist()

    # -- 9. the fit across runs -------------------------------------------------------------
    progress.stage(STAGES[8], spark)
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
    cols = list(points[0]) if points else list(POINT_COLUMNS)
    out.write(spark.createDataFrame([tuple(p[c] for c in cols) for p in points],
                                    _point_schema(cols)), "run_points", small=True)
    out.write(spark.createDataFrame([tuple(r.values()) for r in fit_rows] or [], FIT_SCHEMA),
              "fit", ())
    cached.unpersist()

    # -- 10. report -------------------------------------------------------------------------
    progress.stage(STAGES[9], spark)
    spark.sparkContext.setJobDescription(None)
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
