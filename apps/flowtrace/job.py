"""The PySpark job: mine router traces (schema v1, :mod:`flowrouter.core.traces`) for flow-table scaling.

:func:`analyze` reads JSON Lines with Spark's JSON source and an explicit schema built from
:data:`flowrouter.core.traces.FIELDS`, validates every line with the same rules (and the same
messages) as :func:`flowrouter.core.traces.validate`, caches the checked records once, and computes,
per run (``run`` field; one run when absent), router and time bucket:

* **router_buckets** — table entries from snapshots (last snapshot at or before the end of the
  bucket) and from replaying ``entry_add``/``entry_del`` (cumulative), links, active flows,
  memory, churn (adds/dels/pings), sampled traffic scaled by ``sample``;
* **network_buckets** — the same summed over routers, plus live flows (flows with an entry on
  some router, replayed per flow) — the input of the scaling fit;
* **gc_lag** — per ``link_del`` with cause ``gc``: the last traffic on that (flow, link) (the
  latest of the record's ``last``, the last sampled ``fwd`` that arrived on the link, and the
  last ``link_add`` for it) and the lag to the deletion, plus the pings sent in between;
* **churn**, **savings** (drops by reason, scaled: messages, bytes, link transmissions avoided),
  **load_by_role** / **load_summary** (core vs edge vs transit routers), **fanout** (from
  snapshots and from forwarding), **flows** / **tree_size** (state per flow vs members);
* **fit** / **extrapolation** — least squares on network_buckets (numpy, on the driver): table
  size against live flows F, members M and routers R, linear and power-law, with R² and
  predictions for 10x and 100x networks.

Every table is written as Parquet under ``tables/``; :mod:`apps.flowtrace.report` turns the
collected small aggregates into ``report.md``/``report.html`` with PNG plots. Corrupt lines and
schema violations are counted (table ``errors``), never fatal.

Roles: a router is ``core`` if any of its snapshots says ``core: true``; else ``edge`` if a
snapshot says ``edge: true`` or it has an endpoint link (``link_up``/``link_add`` with role
``endpoint``); else ``transit``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowrouter.core import traces as TR

# pyspark is imported lazily (inside functions) so that `flowtrace --help` and the non-Spark
# parts work without it.

TABLES = ("errors", "routers", "router_buckets", "network_buckets", "churn", "gc_lag",
          "gc_lag_summary", "gc_lag_hist", "savings", "load_by_role", "load_summary",
          "fanout", "flows", "tree_size", "fit", "extrapolation")
STAGES = ("read and validate", "routers", "router buckets", "network buckets", "gc lag",
          "churn and savings", "load by role", "fan-out and flows", "fit", "report")

#: dense per-router bucket grids longer than this make the job widen the bucket
MAX_BUCKETS = 20_000
SCALES = (1, 10, 100)


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
    """What :func:`analyze` returns (and writes to ``summary.json``)."""

    out_dir: str
    summary: dict[str, Any]
    report_md: str | None = None
    report_html: str | None = None


# ----------------------------------------------------------------------------- session
def build_session(master: str = "local[*]", *, app_name: str = "flowtrace",
                  driver_memory: str | None = None, shuffle_partitions: int | None = None,
                  conf: Iterable[tuple[str, str]] = ()) -> Any:
    """A SparkSession for the job (reuses an active one, e.g. the tests')."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    local = master.startswith("local")
    if driver_memory is None and local:
        driver_memory = default_driver_memory()
    if local:
        # smaller input splits: more, lighter tasks for the embedded single JVM
        builder = builder.config("spark.sql.files.maxPartitionBytes", str(32 * 2**20))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    if shuffle_partitions is None and local:
        shuffle_partitions = 8
    if shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for k, v in conf:
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def default_driver_memory() -> str:
    """For local mode (the driver is the only executor): 40% of RAM, 1-16 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return "2g"
    return f"{max(1, min(16, int(total * 0.4 / 2**30)))}g"


def resolve_inputs(inputs: Sequence[str]) -> list[str]:
    """Local files/dirs/globs -> files (via :func:`flowrouter.core.traces.expand_paths`); URIs with a
    scheme other than ``file:`` are passed to Spark unchanged (globs and dirs work there too)."""
    out: list[str] = []
    for item in inputs:
        if "://" in item and not item.startswith("file://"):
            out.append(item)
            continue
        local = item[len("file://"):] if item.startswith("file://") else item
        out += [os.path.abspath(p) for p in TR.expand_paths(local)]
    if not out:
        raise FileNotFoundError("no trace files found in " + ", ".join(inputs))
    return out


# ----------------------------------------------------------------------------- schema
_SPARK_TYPE = {"int": "long", "pos": "long", "band": "long", "num": "double", "str": "string",
               "flow": "string", "token": "string", "hex": "string", "role": "string",
               "bool": "boolean", "fanout": "map<string,bigint>", "ints": "array<bigint>"}


def _all_fields() -> dict[str, str]:
    fields: dict[str, str] = {"v": "int"}
    for name, typ in (*TR.COMMON_FIELDS, *TR.COMMON_OPTIONAL):
        fields[name] = typ
    for required, optional in TR.FIELDS.values():
        for name, typ in (*required, *optional):
            prev = fields.setdefault(name, typ)
            if _SPARK_TYPE[prev] != _SPARK_TYPE[typ]:  # pragma: no cover - schema sanity
                raise AssertionError(f"field {name} has two types")
    return fields


def record_schema() -> Any:
    """The explicit Spark schema of a v1 record (plus ``_corrupt_record``)."""
    from pyspark.sql import types as T

    simple = {"long": T.LongType(), "double": T.DoubleType(), "string": T.StringType(),
              "boolean": T.BooleanType(),
              "map<string,bigint>": T.MapType(T.StringType(), T.LongType()),
              "array<bigint>": T.ArrayType(T.LongType())}
    fields = [T.StructField(n, simple[_SPARK_TYPE[t]]) for n, t in _all_fields().items()]
    fields.append(T.StructField("_corrupt_record", T.StringType()))
    return T.StructType(fields)


def _q(name: str) -> str:
    return f"`{name}`"


def ok_sql(col: str, typ: str) -> str:
    """Spark SQL twin of ``not traces._bad(value, typ)`` for a non-null value."""
    if typ == "int":
        return f"{col} >= 0"
    if typ == "pos":
        return f"{col} >= 1"
    if typ == "band":
        return f"{col} BETWEEN 0 AND 127"
    if typ == "num":
        return f"abs({col}) < double('Infinity')"  # false for NaN and +-inf
    if typ == "str":
        return f"length({col}) > 0"
    if typ in ("flow", "token", "hex"):
        return f"{col} RLIKE '{TR.SPARK_PATTERNS[typ]}'"
    if typ == "bool":
        return "true"
    if typ == "role":
        return f"{col} IN ({', '.join(repr(r) for r in TR.ROLES)})"
    if typ == "fanout":
        return (f"forall(map_keys({col}), k -> k RLIKE '{TR.SPARK_PATTERNS['digits']}') AND "
                f"forall(map_values({col}), x -> x IS NOT NULL AND x >= 0)")
    if typ == "ints":
        return f"forall({col}, x -> x IS NOT NULL AND x >= 0)"
    raise AssertionError(typ)  # pragma: no cover


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def error_sql() -> str:
    """The validation verdict as one SQL CASE over the flattened record columns, ``raw``
    (the line as map<string,string>, computed only for lines with a type mismatch) and
    ``_corrupt_record``: null for a valid record, else the reason, with the messages and the
    check order of :func:`flowrouter.core.traces.validate`."""

    def bad(name: str, typ: str) -> str:
        return f"({_q(name)} IS NULL OR NOT ({ok_sql(_q(name), typ)}))"

    def present(name: str) -> str:
        # a value was given (not JSON null), even if it failed to parse as its type
        return f"({_q(name)} IS NOT NULL OR (raw IS NOT NULL AND raw[{_lit(name)}] IS NOT NULL))"

    arms = ["WHEN _corrupt_record IS NOT NULL AND raw IS NULL THEN 'corrupt'",
            "WHEN v IS NULL OR v NOT IN (" + ", ".join(map(str, TR.SUPPORTED_VERSIONS))
            + ") THEN 'unsupported version'"]
    for name, typ in TR.COMMON_FIELDS:
        arms.append(f"WHEN {bad(name, typ)} THEN "
                    + _lit(f"missing or invalid field '{name}'"))
    arms.append(f"WHEN kind NOT IN ({', '.join(_lit(k) for k in TR.KINDS)}) "
                "THEN 'unknown kind'")
    for kind, versions in TR.VERSION_KINDS.items():  # kinds of some schema versions only
        arms.append(f"WHEN kind = {_lit(kind)} AND v NOT IN "
                    f"({', '.join(map(str, versions))}) THEN 'unknown kind'")
    # then one switch on the kind (not a test per kind and field)
    per_kind = []
    for kind, (required, optional) in TR.FIELDS.items():
        inner = [f"WHEN {bad(name, typ)} THEN " + _lit(f"missing or invalid field '{name}'")
                 for name, typ in required]
        inner += [f"WHEN {present(name)} AND {bad(name, typ)} THEN "
                  + _lit(f"invalid field '{name}'")
                  for name, typ in (*TR.COMMON_OPTIONAL, *optional)]
        per_kind.append(f"WHEN {_lit(kind)} THEN CASE {' '.join(inner)} END")
    arms.append(f"ELSE CASE kind {' '.join(per_kind)} END")
    return "CASE " + " ".join(arms) + " END"


def read_records(spark: Any, paths: Sequence[str]) -> Any:
    """Lines -> one row per non-blank line: every schema field as a column, ``err`` (null
    when valid), and for bad lines their text and file (``line``, ``file``).

    Uses Spark's JSON Lines source with the explicit schema in PERMISSIVE mode (about three
    times faster than ``from_json`` over ``spark.read.text``): a line that is not a JSON object
    comes back with only ``_corrupt_record`` set; a field of the wrong type comes back null
    with the line in ``_corrupt_record``, which is then re-read as a map to tell "present but
    invalid" from "absent". Differences from :func:`flowrouter.core.traces.read_traces`: Spark
    reads a JSON array of objects on one line as several records, and ignores bytes after a
    complete object; both report blank lines as nothing at all.
    """
    from pyspark.sql import functions as F

    fields = [n for n in _all_fields() if n != "v"]
    df = (spark.read.schema(record_schema()).option("mode", "PERMISSIVE")
          .option("columnNameOfCorruptRecord", "_corrupt_record")
          .option("recursiveFileLookup", "true").json(list(paths))
          .select("*", F.col("_metadata.file_path").alias("file")))
    df = df.select("*", F.expr("CASE WHEN _corrupt_record IS NOT NULL THEN "
                               "from_json(_corrupt_record, 'map<string,string>') END")
                   .alias("raw"))
    checked = df.select("*", F.expr(error_sql()).alias("err"))
    text = F.coalesce(F.col("_corrupt_record"), F.to_json(F.struct("v", *fields)))
    return checked.select(
        *fields, "err",
        F.when(F.col("err").isNotNull(), F.substring(text, 1, 300)).alias("line"),
        F.when(F.col("err").isNotNull(), F.col("file")).alias("file"))


# ----------------------------------------------------------------------------- helpers
def _sum_if(cond: Any, value: Any = 1) -> Any:
    from pyspark.sql import functions as F

    return F.coalesce(F.sum(F.when(cond, value)), F.lit(0))


def _ratio(num: Any, den: Any) -> Any:
    """num / den, null when den is 0 (Spark 4 runs in ANSI mode: x / 0 raises)."""
    from pyspark.sql import functions as F

    return F.when(den != 0, num / den)


def _rows(df: Any) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.collect()]


def _w(*parts: str, order: str = "bidx") -> Any:
    from pyspark.sql import Window

    return (Window.partitionBy(*parts).orderBy(order)
            .rowsBetween(Window.unboundedPreceding, Window.currentRow))


class _Tables:
    """Writes the Parquet tables; small ones from rows already collected on the driver."""

    def __init__(self, spark: Any, base: str) -> None:
        self.spark = spark
        self.base = base.rstrip("/")

    def write(self, df: Any, name: str, partitions: int = 1) -> None:
        df.coalesce(partitions).write.mode("overwrite").parquet(f"{self.base}/{name}")

    def collect(self, df: Any, name: str) -> list[dict[str, Any]]:
        """Collect a small table and write the collected rows (one computation, not two)."""
        rows = _rows(df)
        self.write(self.spark.createDataFrame([tuple(r.values()) for r in rows], df.schema),
                   name)
        return rows


# ----------------------------------------------------------------------------- the job
def analyze(spark: Any, inputs: Sequence[str], out_dir: str, *, bucket: float = 60.0,
            progress: Progress | None = None, tables_uri: str | None = None,
            top_routers: int = 8, make_report: bool = True) -> Result:
    """Run the whole analysis; returns the summary (also in ``out_dir/summary.json``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not bucket > 0:
        raise ValueError("bucket must be positive")
    t0 = time.monotonic()
    progress = progress or Progress()
    os.makedirs(out_dir, exist_ok=True)
    out = _Tables(spark, tables_uri or os.path.join(os.path.abspath(out_dir), "tables"))
    paths = resolve_inputs(inputs)
    notes: list[str] = []

    # -- 1. read and validate ---------------------------------------------------------------
    # The lines are parsed and checked once, into Spark's columnar cache (compact: most
    # fields of a record are null); the first aggregation fills it.
    progress.stage(STAGES[0], spark)
    checked = read_records(spark, paths).persist()
    counts = _rows(checked.groupBy("err", "kind", F.coalesce("run", F.lit("")).alias("run"))
                   .agg(F.count(F.lit(1)).alias("count"), F.min("t").alias("lo"),
                        F.max("t").alias("hi")))
    total_lines = sum(r["count"] for r in counts)
    n_corrupt = sum(r["count"] for r in counts if r["err"] == "corrupt")
    n_invalid = sum(r["count"] for r in counts if r["err"] not in (None, "corrupt"))
    by_kind: dict[str, int] = {}
    for r in counts:
        if r["err"] is None:
            by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + r["count"]
    n_valid = sum(by_kind.values())
    errors = (checked.where(F.col("err").isNotNull())
              .groupBy(F.when(F.col("err") == "corrupt", "corrupt").otherwise("invalid")
                       .alias("class"), F.col("err").alias("reason"))
              .agg(F.count(F.lit(1)).alias("count"), F.min("file").alias("example_file"),
                   F.min("line").alias("example_line"))
              .orderBy(F.desc("count"), "reason"))
    error_rows = out.collect(errors, "errors") if (n_corrupt or n_invalid) else []
    if not error_rows:
        out.write(spark.createDataFrame([], errors.schema), "errors")

    valid = (checked.where(F.col("err").isNull()).drop("err", "line", "file")
             .withColumn("run", F.coalesce("run", F.lit(""))))
    span: dict[str, tuple[float, float]] = {}
    for r in counts:
        if r["err"] is None:
            lo, hi = span.get(r["run"], (r["lo"], r["hi"]))
            span[r["run"]] = (min(lo, r["lo"]), max(hi, r["hi"]))
    if span:
        widest = max(hi - lo for lo, hi in span.values())
        if widest / bucket > MAX_BUCKETS:
            new = float(math.ceil(widest / MAX_BUCKETS))
            notes.append(f"the traces span {widest:.0f} s, more than {MAX_BUCKETS} buckets of "
                         f"{bucket:g} s: the bucket was widened to {new:g} s (check that all "
                         "routers' clocks share an origin)")
            bucket = new
    valid = valid.select("*", F.floor(F.col("t") / F.lit(bucket)).cast("long").alias("bidx"),
                         F.coalesce("sample", F.lit(1)).alias("w"))

    summary: dict[str, Any] = {
        "inputs": list(inputs), "files": len(paths), "bucket_seconds": bucket,
        "lines": total_lines, "records": n_valid, "corrupt": n_corrupt, "invalid": n_invalid,
        "records_by_kind": dict(sorted(by_kind.items())),
        "errors": [{k: r[k] for k in ("class", "reason", "count")} for r in error_rows],
        "notes": notes,
    }
    data: dict[str, Any] = {"errors": error_rows}
    K = F.col("kind")
    is_fwd, is_drop = K == "fwd", K == "drop"
    bstart = (F.col("bidx") * F.lit(bucket)).alias("bucket")

    # -- 2. routers and their roles ---------------------------------------------------------
    progress.stage(STAGES[1], spark)
    routers = (valid.groupBy("run", "router").agg(
        F.max(F.when(K == "snapshot", F.col("core").cast("int"))).alias("core_i"),
        F.max(F.when(K == "snapshot", F.col("edge").cast("int"))).alias("edge_i"),
        F.max(F.when(K.isin("link_up", "link_add") & (F.col("role") == "endpoint"), 1))
        .alias("ep_i"),
        F.count(F.lit(1)).alias("records"),
        F.min("t").alias("first_t"), F.max("t").alias("last_t"),
        F.min("bidx").alias("lo"), F.max("bidx").alias("hi"),
        F.max(F.when(K == "snapshot", F.col("entries"))).alias("max_entries"),
        F.array_sort(F.array_distinct(F.flatten(F.collect_list(
            F.when(K == "snapshot", F.coalesce("lsids", F.array().cast("array<bigint>")))))))
        .alias("lsids"))
        .select("run", "router",
                F.when(F.col("core_i") == 1, "core")
                .when((F.col("edge_i") == 1) | (F.col("ep_i") == 1), "edge")
                .otherwise("transit").alias("role"),
                "records", "first_t", "last_t", "lo", "hi", "max_entries", "lsids")
        .orderBy("run", "router"))
    router_rows = out.collect(routers, "routers")
    routers = spark.createDataFrame([tuple(r.values()) for r in router_rows], routers.schema)
    roles = routers.select("run", "router", F.col("role").alias("router_role"))
    summary["runs"] = sorted({r["run"] for r in router_rows})
    summary["routers"] = len(router_rows)
    summary["routers_by_role"] = {
        role: sum(1 for r in router_rows if r["role"] == role)
        for role in ("core", "edge", "transit")}
    summary["buckets"] = max((r["hi"] - r["lo"] + 1 for r in router_rows), default=0)

    # -- 3. router buckets ------------------------------------------------------------------
    progress.stage(STAGES[2], spark)
    event_cols = ("entry_adds", "entry_dels", "entry_dels_gc", "link_adds", "mask_changes",
                  "link_dels", "link_dels_gc", "gc_pings", "fwd_msgs", "fwd_bytes",
                  "fwd_copies", "drop_msgs", "drop_bytes")
    events = valid.groupBy("run", "router", "bidx").agg(
        _sum_if(K == "entry_add").alias("entry_adds"),
        _sum_if(K == "entry_del").alias("entry_dels"),
        _sum_if((K == "entry_del") & (F.col("cause") == "gc")).alias("entry_dels_gc"),
        _sum_if((K == "link_add") & (F.col("cause") != "mask")).alias("link_adds"),
        _sum_if((K == "link_add") & (F.col("cause") == "mask")).alias("mask_changes"),
        _sum_if(K == "link_del").alias("link_dels"),
        _sum_if((K == "link_del") & (F.col("cause") == "gc")).alias("link_dels_gc"),
        _sum_if(K == "gc_ping").alias("gc_pings"),
        _sum_if(is_fwd, F.col("w")).alias("fwd_msgs"),
        _sum_if(is_fwd, F.col("w") * F.col("bytes")).alias("fwd_bytes"),
        _sum_if(is_fwd, F.col("w") * F.col("out_links")).alias("fwd_copies"),
        _sum_if(is_drop, F.col("w")).alias("drop_msgs"),
        _sum_if(is_drop, F.col("w") * F.col("bytes")).alias("drop_bytes"),
        F.max_by(F.when(K == "snapshot", F.struct("t", "entries", "links_total",
                                                  "active_flows", "mem_bytes", "members")),
                 F.when(K == "snapshot", F.col("t"))).alias("s"))
    grid = routers.select("run", "router", "role",
                          F.explode(F.sequence("lo", "hi")).alias("bidx"))
    rb = (grid.join(events, ["run", "router", "bidx"], "left")
          .na.fill(0, list(event_cols)))
    w = _w("run", "router")
    snap_cols = ("entries", "links_total", "active_flows", "mem_bytes", "members")
    rb = rb.select(
        "run", "router", "role", "bidx", bstart,
        *[F.last(F.col("s")[c], ignorenulls=True).over(w).alias(c) for c in snap_cols],
        F.last(F.col("s")["t"], ignorenulls=True).over(w).alias("snapshot_t"),
        F.sum(F.col("entry_adds") - F.col("entry_dels")).over(w).alias("entries_replay"),
        F.sum(F.col("link_adds") - F.col("link_dels")).over(w).alias("links_replay"),
        *event_cols).persist()
    out.write(rb.drop("bidx"), "router_buckets", 2)

    # -- 4. network buckets, live flows -----------------------------------------------------
    progress.stage(STAGES[3], spark)
    fw = (Window.partitionBy("run", "flow").orderBy("t", F.desc("d"))
          .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    fe = (valid.where(K.isin("entry_add", "entry_del"))
          .select("run", "flow", "t", "bidx",
                  F.when(K == "entry_add", 1).otherwise(-1).alias("d")))
    fe = fe.select("*", F.sum("d").over(fw).alias("live"))
    fe = fe.select("run", "bidx", F.when((F.col("live") - F.col("d") <= 0)
                                         & (F.col("live") > 0), 1)
                   .when((F.col("live") - F.col("d") > 0) & (F.col("live") <= 0), -1)
                   .otherwise(0).alias("fd"))
    flow_delta = fe.groupBy("run", "bidx").agg(
        F.sum("fd").alias("fd"), _sum_if(F.col("fd") == 1).alias("flows_born"))
    net_sums = ("entry_adds", "entry_dels", "link_adds", "link_dels", "link_dels_gc",
                "gc_pings", "fwd_msgs", "fwd_bytes", "drop_msgs", "drop_bytes")
    net = rb.groupBy("run", "bidx").agg(
        F.count(F.lit(1)).alias("routers"),
        F.count("entries").alias("routers_reporting"),
        F.sum("entries").alias("entries_total"), F.max("entries").alias("entries_max"),
        F.avg("entries").alias("entries_mean"),
        F.sum("entries_replay").alias("entries_replay_total"),
        F.sum("links_total").alias("links_total"), F.sum("active_flows").alias("active_flows"),
        F.sum("mem_bytes").alias("mem_total"), F.sum("members").alias("members"),
        *[F.sum(c).alias(c) for c in net_sums])
    net_cols = [c for c in net.columns if c not in ("run", "bidx")]
    net = (net.join(flow_delta, ["run", "bidx"], "left").na.fill(0, ["fd", "flows_born"])
           .select("*", F.sum("fd").over(_w("run")).alias("flows_live"))
           .select("run", bstart, *net_cols, "flows_live", "flows_born")
           .orderBy("run", "bucket"))
    net_rows = out.collect(net, "network_buckets")
    data["network"] = net_rows
    peak = max(net_rows, key=lambda r: (r["entries_total"] or 0), default=None)
    if peak:
        summary["peak"] = {k: peak[k] for k in ("run", "bucket", "entries_total", "entries_max",
                                                 "flows_live", "active_flows", "mem_total",
                                                 "routers_reporting")}
    top = [r["router"] for r in sorted(router_rows, key=lambda r: -(r["max_entries"] or 0))
           [:top_routers]]
    data["top_routers"] = _rows(rb.where(F.col("router").isin(top))
                                .select("run", "router", "role", "bucket", "entries",
                                        "entries_replay", "active_flows", "entry_adds",
                                        "entry_dels").orderBy("run", "router", "bucket"))

    # -- 5. GC lag --------------------------------------------------------------------------
    progress.stage(STAGES[4], spark)
    keys = ["run", "router", "flow", "link"]
    dels = (valid.where((K == "link_del") & (F.col("cause") == "gc"))
            .select(*keys, F.col("t").alias("t_del"), F.col("last").alias("t_last_rec"))
            .withColumn("id", F.monotonically_increasing_id()))
    # everything that tells when (flow, link) last saw traffic, in one union
    seen = (valid.where((K == "link_add") | (is_fwd & F.col("in_link").isNotNull()))
            .select("run", "router", "flow",
                    F.when(is_fwd, F.col("in_link")).otherwise(F.col("link")).alias("link"),
                    F.col("t").alias("t_seen"), F.when(is_fwd, "fwd").otherwise("link_add")
                    .alias("src")))
    d, s_ = dels.alias("d"), seen.alias("s")
    last_seen = (d.join(s_, [F.col(f"d.{k}") == F.col(f"s.{k}") for k in keys]
                        + [F.col("s.t_seen") <= F.col("d.t_del")], "left")
                 .groupBy("d.id").agg(
                     F.max(F.when(F.col("s.src") == "link_add", F.col("s.t_seen"))).alias("t_add"),
                     F.max(F.when(F.col("s.src") == "fwd", F.col("s.t_seen"))).alias("t_fwd")))
    lag = (dels.join(last_seen, "id")
           .withColumn("t_last", F.greatest("t_last_rec", "t_add", "t_fwd"))
           .withColumn("last_from", F.when(F.col("t_last").isNull(), None)
                       .when(F.col("t_last") == F.col("t_last_rec"), "record")
                       .when(F.col("t_last") == F.col("t_fwd"), "fwd")
                       .otherwise("link_add")))
    pings = valid.where(K == "gc_ping").select(*keys, F.col("t").alias("t_ping"))
    g, p_ = lag.alias("g"), pings.alias("p")
    gc = (g.join(p_, [F.col(f"g.{k}") == F.col(f"p.{k}") for k in keys]
                 + [F.col("p.t_ping") <= F.col("g.t_del"),
                    F.col("p.t_ping") > F.coalesce(F.col("g.t_last"), F.lit(-math.inf))],
                 "left")
          .groupBy(*[F.col(f"g.{c}") for c in (*keys, "id", "t_del", "t_last", "last_from")])
          .agg(F.count("p.t_ping").alias("pings"))
          .join(roles, ["run", "router"], "left")
          .select("run", "router", F.col("router_role").alias("role"), "flow", "link",
                  "t_del", "t_last", "last_from",
                  (F.col("t_del") - F.col("t_last")).alias("lag"), "pings")
          .persist())
    out.write(gc, "gc_lag")

    def lag_stats(df: Any) -> Any:
        return df.groupBy("run", "role").agg(
            F.count(F.lit(1)).alias("deletions"), F.count("lag").alias("with_lag"),
            F.avg("lag").alias("mean"), F.min("lag").alias("min"),
            F.percentile("lag", F.array(F.lit(0.5), F.lit(0.9), F.lit(0.99))).alias("p"),
            F.max("lag").alias("max"), F.avg("pings").alias("mean_pings"),
        ).select("run", "role", "deletions", "with_lag", "mean", "min",
                 F.col("p")[0].alias("p50"), F.col("p")[1].alias("p90"),
                 F.col("p")[2].alias("p99"), "max", "mean_pings")

    gsum_rows = out.collect(
        lag_stats(gc).unionByName(lag_stats(gc.withColumn("role", F.lit("all"))))
        .orderBy("run", "role"), "gc_lag_summary")
    data["gc_summary"] = gsum_rows
    max_lag = max((r["max"] for r in gsum_rows if r["max"] is not None), default=None)
    nbins = 40
    width = (max_lag / nbins) if max_lag and max_lag > 0 else 1.0
    hist = (gc.where(F.col("lag").isNotNull())
            .select("run", F.least(F.greatest(F.floor(F.col("lag") / width), F.lit(0)),
                                   F.lit(nbins - 1)).cast("int").alias("bin"))
            .groupBy("run", "bin").count()
            .select("run", (F.col("bin") * width).alias("lo"),
                    ((F.col("bin") + 1) * width).alias("hi"), "count").orderBy("run", "lo"))
    data["gc_hist"] = out.collect(hist, "gc_lag_hist")
    overall = [r for r in gsum_rows if r["role"] == "all"]
    summary["gc"] = {k: (overall[0][k] if len(overall) == 1 else None)
                     for k in ("deletions", "p50", "p90", "p99", "max", "mean_pings")}
    gc.unpersist()

    # -- 6. churn and savings ---------------------------------------------------------------
    progress.stage(STAGES[5], spark)
    churn = (valid.where(K.isin("entry_add", "entry_del", "link_add", "link_del", "gc_ping"))
             .groupBy("run", "bidx", "kind", F.coalesce("cause", F.lit("")).alias("cause"))
             .count().select("run", bstart, "kind", "cause", "count")
             .orderBy("run", "bucket", "kind", "cause"))
    churn_rows = out.collect(churn, "churn")
    churn_tot: dict[str, int] = {}
    for r in churn_rows:
        key = r["kind"] + (":" + r["cause"] if r["cause"] else "")
        churn_tot[key] = churn_tot.get(key, 0) + r["count"]
    summary["churn"] = dict(sorted(churn_tot.items()))

    traffic = valid.where(is_fwd | is_drop).join(roles, ["run", "router"], "left")
    links = F.coalesce("links", F.lit(1))
    by_reason = (traffic.where(is_drop)
                 .groupBy("run", "reason", F.col("router_role").alias("role")).agg(
                     F.count(F.lit(1)).alias("records"), F.sum("w").alias("est_msgs"),
                     F.sum(F.col("w") * F.col("bytes")).alias("est_bytes"),
                     F.sum(F.col("w") * links).alias("est_link_tx"),
                     F.sum(F.col("w") * F.col("bytes") * links).alias("est_link_bytes")))
    offered = traffic.groupBy("run").agg(
        _sum_if(is_fwd, F.col("w") * F.col("out_links")).alias("fwd_tx"),
        _sum_if(is_fwd, F.col("w") * F.col("bytes") * F.col("out_links"))
        .alias("fwd_link_bytes"),
        _sum_if(is_drop, F.col("w") * links).alias("drop_tx"),
        _sum_if(is_drop, F.col("w") * F.col("bytes") * links).alias("drop_link_bytes"))
    savings = (by_reason.join(offered, "run", "left")
               .withColumn("share_of_offered_tx",
                           _ratio(F.col("est_link_tx"), F.col("fwd_tx") + F.col("drop_tx")))
               .withColumn("share_of_offered_bytes",
                           _ratio(F.col("est_link_bytes"),
                                  F.col("fwd_link_bytes") + F.col("drop_link_bytes")))
               .orderBy("run", F.desc("est_link_bytes"), "reason", "role"))
    sav_rows = out.collect(savings, "savings")
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
    ctrl = (F.col("entry_adds") + F.col("entry_dels") + F.col("link_adds")
            + F.col("link_dels") + F.col("mask_changes") + F.col("gc_pings"))
    load = (rb.groupBy("run", "bidx", "role").agg(
        F.count(F.lit(1)).alias("routers"),
        F.sum("fwd_msgs").alias("fwd_msgs"), F.avg("fwd_msgs").alias("fwd_msgs_mean"),
        F.max("fwd_msgs").alias("fwd_msgs_max"), F.sum("fwd_bytes").alias("fwd_bytes"),
        F.sum("fwd_copies").alias("fwd_copies"), F.sum("drop_msgs").alias("drop_msgs"),
        F.sum(ctrl).alias("control_events"), F.avg("entries").alias("entries_mean"),
        F.max("entries").alias("entries_max"))
        .select("run", bstart, "role", "routers", "fwd_msgs", "fwd_msgs_mean", "fwd_msgs_max",
                "fwd_bytes", "fwd_copies", "drop_msgs", "control_events", "entries_mean",
                "entries_max")
        .orderBy("run", "bucket", "role"))
    data["load"] = out.collect(load, "load_by_role")
    secs = F.col("nb") * F.lit(bucket)
    per_router = rb.groupBy("run", "router", "role").agg(
        F.sum("fwd_msgs").alias("msgs"), F.sum("fwd_bytes").alias("bytes"),
        F.sum(ctrl).alias("ctrl"), F.count(F.lit(1)).alias("nb"),
        F.max("fwd_msgs").alias("peak_msgs"), F.avg("entries").alias("entries"),
        F.max("entries").alias("peak_entries"))
    lsum = (per_router.groupBy("run", "role").agg(
        F.count(F.lit(1)).alias("routers"), F.sum("msgs").alias("fwd_msgs"),
        F.avg(F.col("msgs") / secs).alias("msgs_per_s_per_router"),
        F.max(F.col("peak_msgs") / F.lit(bucket)).alias("peak_msgs_per_s"),
        F.avg(F.col("bytes") / secs).alias("bytes_per_s_per_router"),
        F.avg(F.col("ctrl") / secs).alias("control_per_s_per_router"),
        F.avg("entries").alias("entries_mean"), F.max("peak_entries").alias("entries_peak"))
        .orderBy("run", "role"))
    lsum_rows = out.collect(lsum, "load_summary")
    data["load_summary"] = lsum_rows
    summary["load"] = {(r["run"] + "/" if r["run"] else "") + r["role"]:
                       {"routers": r["routers"],
                        "msgs_per_s_per_router": r["msgs_per_s_per_router"],
                        "entries_peak": r["entries_peak"]} for r in lsum_rows}
    rb.unpersist()

    # -- 8. fan-out, flows, tree size -------------------------------------------------------
    progress.stage(STAGES[7], spark)
    fan_snap = (valid.where(K == "snapshot").join(roles, ["run", "router"], "left")
                .select("run", F.col("router_role").alias("role"),
                        F.explode("fanout").alias("k", "n"))
                .groupBy("run", "role", F.expr("try_cast(k AS BIGINT)").alias("fanout"))
                .agg(F.sum("n").alias("count"))
                .select("run", F.lit("snapshot").alias("source"), "role", "fanout", "count"))
    fan_fwd = (traffic.where(is_fwd)
               .groupBy("run", F.col("router_role").alias("role"),
                        F.col("out_links").alias("fanout"))
               .agg(F.sum("w").alias("count"))
               .select("run", F.lit("fwd").alias("source"), "role", "fanout", "count"))
    data["fanout"] = out.collect(fan_snap.unionByName(fan_fwd)
                                 .orderBy("run", "source", "role", "fanout"), "fanout")

    link_roles = (valid.where((K == "link_up") & (F.col("role") != "unknown"))
                  .groupBy("run", "router", "link")
                  .agg(F.max_by("role", "t").alias("up_role")))
    la = (valid.where((K == "link_add") & (F.col("cause") != "mask"))
          .select("run", "router", "flow", "link",
                  F.when(F.col("role") != "unknown", F.col("role")).alias("role"))
          .join(link_roles, ["run", "router", "link"], "left")
          .select("run", "flow", "router", "link",
                  F.coalesce("role", "up_role").alias("peer_role")))
    per_flow_links = la.groupBy("run", "flow").agg(
        F.count(F.lit(1)).alias("link_adds"),
        F.count_distinct(F.when(F.col("peer_role") == "endpoint",
                                F.struct("router", "link"))).alias("members"))
    flows = (valid.where(F.col("flow").isNotNull()).groupBy("run", "flow").agg(
        F.count_distinct(F.when(K == "entry_add", F.col("router"))).alias("routers"),
        _sum_if(K == "entry_add").alias("entry_adds"),
        F.min(F.when(K == "entry_add", F.col("t"))).alias("first_t"),
        F.max(F.when(K == "entry_del", F.col("t"))).alias("last_del_t"),
        _sum_if(is_fwd, F.col("w")).alias("fwd_msgs"),
        _sum_if(is_drop, F.col("w")).alias("drop_msgs"))
        .join(per_flow_links, ["run", "flow"], "left")
        .na.fill(0, ["members", "link_adds"])
        .persist())
    out.write(flows, "flows")
    tree = (flows.where(F.col("entry_adds") > 0).groupBy("run", "members").agg(
        F.count(F.lit(1)).alias("flows"), F.avg("routers").alias("routers_mean"),
        F.percentile("routers", F.lit(0.5)).alias("routers_p50"),
        F.max("routers").alias("routers_max"), F.avg("link_adds").alias("link_adds_mean"),
        F.avg("entry_adds").alias("entry_adds_mean"))
        .orderBy("run", "members"))
    tree_rows = out.collect(tree, "tree_size")
    data["tree"] = tree_rows
    summary["flows"] = sum(r["flows"] for r in tree_rows)
    flows.unpersist()

    # -- 9. fit and extrapolation -----------------------------------------------------------
    progress.stage(STAGES[8], spark)
    fit_rows, extra_rows, fit_notes = fit_scaling(net_rows)
    notes += fit_notes
    fit_schema = T.StructType([T.StructField(n, t) for n, t in (
        ("model", T.StringType()), ("target", T.StringType()), ("term", T.StringType()),
        ("coef", T.DoubleType()), ("r2", T.DoubleType()), ("n", T.LongType()),
        ("note", T.StringType()))])
    out.write(spark.createDataFrame([tuple(r.values()) for r in fit_rows], fit_schema), "fit")
    ex_schema = T.StructType([T.StructField(n, t) for n, t in (
        ("scenario", T.StringType()), ("scale", T.LongType()), ("flows", T.DoubleType()),
        ("members", T.DoubleType()), ("routers", T.DoubleType()), ("model", T.StringType()),
        ("entries_total", T.DoubleType()), ("entries_per_router", T.DoubleType()),
        ("entries_max", T.DoubleType()), ("links_total", T.DoubleType()),
        ("mem_total_bytes", T.DoubleType()), ("mem_max_router_bytes", T.DoubleType()))])
    out.write(spark.createDataFrame([tuple(r.values()) for r in extra_rows], ex_schema),
              "extrapolation")
    data["fit"], data["extrapolation"] = fit_rows, extra_rows
    summary["fit"] = {f"{r['model']}:{r['target']}": r["r2"] for r in fit_rows
                      if r["term"] == "const"}
    big = [r for r in extra_rows if r["scenario"] == "grow" and r["model"] == "power"
           and r["scale"] == max(SCALES)]
    if big:
        summary["extrapolation_100x"] = {k: big[0][k] for k in (
            "flows", "members", "routers", "entries_total", "entries_per_router", "entries_max",
            "mem_max_router_bytes")}
    checked.unpersist()

    # -- 10. report -------------------------------------------------------------------------
    progress.stage(STAGES[9], spark)
    spark.sparkContext.setJobDescription(None)
    wall = time.monotonic() - t0
    summary["wall_seconds"] = round(wall, 3)
    summary["lines_per_second"] = round(total_lines / wall, 1) if wall > 0 else None
    summary["notes"] = notes
    result = Result(out_dir=out_dir, summary=summary)
    if make_report:
        from . import report

        result.report_md, result.report_html = report.write_report(out_dir, summary, data)
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True, default=str)
    return result


# ----------------------------------------------------------------------------- the fit
FIT_TARGETS = ("entries_total", "entries_max", "links_total")
FIT_TERMS = (("F", "flows_live"), ("M", "members"), ("R", "routers_reporting"))


def ols(X: Any, y: Any, names: Sequence[str]) -> tuple[dict[str, float], float, list[str]]:
    """Least squares with an intercept. Columns with no variance, or that add no rank, are
    dropped (reported, coefficient 0). Returns (coefficients incl. ``const``, R², dropped)."""
    import numpy as np

    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    keep: list[int] = []
    dropped: list[str] = []
    cols = [np.ones(len(y))]
    for i, name in enumerate(names):
        col = X[:, i]
        if np.ptp(col) <= 1e-12 * max(1.0, float(np.abs(col).max(initial=0))):
            dropped.append(name)
            continue
        trial = np.column_stack([*cols, col])
        if np.linalg.matrix_rank(trial) < trial.shape[1]:
            dropped.append(name)
            continue
        cols.append(col)
        keep.append(i)
    A = np.column_stack(cols)
    beta, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ beta
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res < 1e-12 else float("nan"))
    coef = {"const": float(beta[0])}
    for j, i in enumerate(keep):
        coef[names[i]] = float(beta[j + 1])
    for name in dropped:
        coef[name] = 0.0
    return coef, r2, dropped


def fit_scaling(net_rows: Sequence[dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Fit table size against flows, members and routers; extrapolate to 10x and 100x.

    Models, per target y in entries_total, entries_max (the busiest router), links_total:
    ``linear``: y = c + a·F + b·M + d·R;  ``power``: ln y = ln c + a·ln F + b·ln M + d·ln R.
    Rows: buckets (of every run) with a snapshot from every router and F, M, y > 0 (the linear
    fit uses the same rows). Extrapolation starts from the observed bucket with the most live
    flows (in the run with the most routers): ``grow`` multiplies F, M and R by the scale,
    ``more_flows`` only F and M. A term with no variance in the data (R, from one network) is
    dropped, so its effect is assumed nil: say so in the note.
    """
    import numpy as np

    notes: list[str] = []
    rows = [r for r in net_rows
            if r["routers_reporting"] and r["routers_reporting"] == r["routers"]
            and (r["flows_live"] or 0) > 0]
    has_members = any((r["members"] or 0) > 0 for r in rows)
    terms = [(n, c) for n, c in FIT_TERMS if n != "M" or has_members]
    if not has_members:
        notes.append("snapshots carry no 'members': the fit uses flows and routers only")
    fit_rows: list[dict[str, Any]] = []
    extra: list[dict[str, Any]] = []
    if len(rows) < 3:
        notes.append(f"too few complete buckets ({len(rows)}) to fit table size")
        return fit_rows, extra, notes
    base = max(rows, key=lambda r: (r["routers"], r["flows_live"]))
    models: dict[tuple[str, str], tuple[dict[str, float], float]] = {}
    for target in FIT_TARGETS:
        pos = [r for r in rows if (r[target] or 0) > 0 and all((r[c] or 0) > 0
                                                              for _, c in terms)]
        for model, data in (("linear", rows), ("power", pos)):
            if len(data) < 3:
                continue
            X = np.array([[float(r[c] or 0) for _, c in terms] for r in data])
            y = np.array([float(r[target] or 0) for r in data])
            if model == "power":
                X, y = np.log(X), np.log(y)
            coef, r2, dropped = ols(X, y, [n for n, _ in terms])
            note = ""
            if dropped:
                note = (f"{', '.join(dropped)} dropped (no independent variation in the data); "
                        "its effect is assumed nil")
            models[(model, target)] = (coef, r2)
            for term in ("const", *[n for n, _ in terms]):
                fit_rows.append({"model": model, "target": target, "term": term,
                                 "coef": coef[term], "r2": r2, "n": len(data), "note": note})
    # one-variable power laws: the growth exponent of each quantity on its own
    for target in ("entries_total", "entries_max"):
        for name, col in terms:
            data = [r for r in rows if (r[target] or 0) > 0 and (r[col] or 0) > 0]
            if len(data) < 3:
                continue
            x = np.log(np.array([[float(r[col])] for r in data]))
            y = np.log(np.array([float(r[target]) for r in data]))
            coef, r2, dropped = ols(x, y, [name])
            if dropped:
                continue
            for term in ("const", name):
                fit_rows.append({"model": f"power:{name}", "target": target, "term": term,
                                 "coef": coef[term], "r2": r2, "n": len(data),
                                 "note": f"{target} ~ {name}^a alone"})
    logs = [[math.log(float(r[c])) for _, c in terms] for r in rows
            if all((r[c] or 0) > 0 for _, c in terms)]
    if len(logs) >= 3:
        arr = np.array(logs)
        for i in range(len(terms)):
            for j in range(i + 1, len(terms)):
                if np.ptp(arr[:, i]) > 0 and np.ptp(arr[:, j]) > 0:
                    rho = float(np.corrcoef(arr[:, i], arr[:, j])[0, 1])
                    if abs(rho) > 0.95:
                        notes.append(
                            f"{terms[i][0]} and {terms[j][0]} move together (log correlation "
                            f"{rho:.3f}): their separate coefficients are not meaningful, only "
                            "their joint effect (and the one-variable exponents) are")
    if not any(r["term"] == "R" and r["coef"] != 0 for r in fit_rows):
        notes.append("all buckets come from networks of one size: the fits cannot see the "
                     "effect of the router count; 'grow' extrapolations assume total state "
                     "does not depend on it (analyse traces of several network sizes, tagged "
                     "with 'run', to measure it)")

    def predict(model: str, target: str, v: dict[str, float]) -> float | None:
        m = models.get((model, target))
        if m is None:
            return None
        coef, _ = m
        if model == "linear":
            return coef["const"] + sum(coef[n] * v[n] for n, _ in terms)
        return math.exp(coef["const"] + sum(coef[n] * math.log(v[n]) for n, _ in terms
                                            if coef[n] and v[n] > 0))

    per_entry = (base["mem_total"] / base["entries_total"]) if base["entries_total"] else None
    for scenario in ("grow", "more_flows"):
        for k in SCALES:
            v = {"F": base["flows_live"] * k, "M": (base["members"] or 0) * k,
                 "R": base["routers_reporting"] * (k if scenario == "grow" else 1)}
            for model in ("power", "linear"):
                e_tot = predict(model, "entries_total", v)
                if e_tot is None:
                    continue
                e_max = predict(model, "entries_max", v)
                l_tot = predict(model, "links_total", v)
                mem = (e_tot * TR.ENTRY_BYTES + l_tot * TR.LINK_BYTES
                       if l_tot is not None else (e_tot * per_entry if per_entry else None))
                lpe = (l_tot / e_tot) if (l_tot and e_tot) else 0.0
                mem_max = (e_max * (TR.ENTRY_BYTES + lpe * TR.LINK_BYTES)
                           if e_max is not None else None)
                extra.append({"scenario": scenario, "scale": k, "flows": float(v["F"]),
                              "members": float(v["M"]), "routers": float(v["R"]),
                              "model": model, "entries_total": e_tot,
                              "entries_per_router": e_tot / v["R"] if v["R"] else None,
                              "entries_max": e_max, "links_total": l_tot,
                              "mem_total_bytes": mem, "mem_max_router_bytes": mem_max})
    return fit_rows, extra, notes
