"""The Spark engine: the job's stages as Spark DataFrames (large traces, clusters, URIs).

:class:`SparkEngine` has the stage methods the job (:mod:`flowtrace.job`) drives; each builds
its tables with :mod:`flowtrace.tables` and :mod:`flowtrace.peaks`, collects the small ones
to the driver (written from the collected rows: one computation, not two) and writes the
large ones (router_buckets, gc_lag, flows) straight from the executors, one file per run
sorted by router. The checked records are cached once and each family of tables comes from
one aggregation (record_counts, traffic_counts). :class:`flowtrace.local_engine.LocalEngine`
has the same methods in plain Python.
Imports pyspark lazily; the rest of flowtrace.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import peaks, schema, tables

#: local inputs up to this size run with SMALL_CONF (see small_input_conf)
SMALL_INPUT_BYTES = 8 * 2**20  # ~50,000 lines; a conservative bound, not tuned
SMALL_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.codegen.wholeStage": "false",
              "spark.sql.shuffle.partitions": "1"}


def _F() -> Any:
    from pyspark.sql import functions as F

    return F


def rows_of(df: Any) -> list[dict[str, Any]]:
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
        rows = rows_of(df)
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


class SparkEngine:
    """The job's stages on a SparkSession (see the module docstring)."""

    name = "spark"

    def __init__(self, spark: Any, tables_base: str, schemas: dict[str, str]) -> None:
        self.spark = spark
        self.out = _Tables(spark, tables_base)
        self.schemas = schemas
        self.fences: Any = None

    def describe(self) -> dict[str, Any]:
        """What the session really runs with: master, driver address, UI, Spark version."""
        conf = self.spark.sparkContext.getConf()
        return {"engine": self.name, "spark_master": self.spark.sparkContext.master,
                "spark_version": self.spark.version,
                "driver_host": conf.get("spark.driver.host", None),
                "ui": conf.get("spark.ui.enabled", "true") == "true"}

    def stage(self, name: str) -> None:
        self.spark.sparkContext.setJobDescription(f"flowtrace: {name}" if name else None)

    def _df(self, rows: Sequence[dict[str, Any]], schema_: Any) -> Any:
        return self.spark.createDataFrame([tuple(r.values()) for r in rows], schema_)

    def write_rows(self, name: str, rows: Sequence[dict[str, Any]],
                   by: Sequence[str] = ("run",)) -> None:
        """Rows computed on the driver as the table *name* (columns: ``schemas[name]``)."""
        self.out.write(self._df(rows, self.schemas[name]), name, by, small=True)

    # -- 1. read and validate
    def read(self, paths: Sequence[str]) -> list[dict[str, Any]]:
        self.checked = self.cached = schema.read_records(self.spark, paths).persist()
        return rows_of(tables.line_counts(self.checked))

    def errors(self, any_bad: bool) -> list[dict[str, Any]]:
        F = _F()
        errors = (self.checked.where(F.col("err").isNotNull())
                  .groupBy(F.when(F.col("err") == schema.CORRUPT, "corrupt")
                           .otherwise("invalid").alias("class"), F.col("err").alias("reason"))
                  .agg(F.count(F.lit(1)).alias("count"), F.min("file").alias("example_file"),
                       F.min("line").alias("example_line"))
                  .orderBy(F.desc("count"), "reason"))
        rows = self.out.collect(errors, "errors", ()) if any_bad else []
        if not rows:
            self.out.write(self.spark.createDataFrame([], errors.schema), "errors", (),
                           small=True)
        return rows

    def drop_routers(self, dropped: set[tuple[str, str]]) -> None:
        self.checked = tables.drop_routers(self.checked, self.spark.createDataFrame(
            sorted(dropped), "run string, router string"))

    def clock_outliers(self, k: float) -> list[dict[str, Any]]:
        fences = tables.clock_fences(self.checked, k)
        self.fences = self._df(rows_of(fences), fences.schema)
        return self.out.collect(tables.clock_outliers(self.checked, self.fences),
                                "clock_outliers")

    def run_spans(self) -> list[dict[str, Any]]:
        F = _F()
        valid0 = tables.prepare(self.checked, 1.0, spans=self.fences)
        return rows_of(valid0.groupBy("run").agg(F.min("t").alias("run_lo"),
                                                 F.max("t").alias("run_hi")))

    def prepare(self, bucket: float, spans: Sequence[dict[str, Any]]) -> None:
        self.bucket = bucket
        self.runs = self.spark.createDataFrame(
            [(r["run"], float(r["run_lo"]), float(r["run_hi"])) for r in spans],
            "run string, run_lo double, run_hi double")
        self.valid = tables.prepare(self.checked, bucket, spans=self.fences)

    # -- 2. routers and the router/bucket family
    def routers(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        F = _F()
        self.rc = tables.record_counts(self.valid).persist()
        timeline = peaks.entry_timeline(self.valid).persist()
        router_df = tables.routers(self.rc, peaks.router_peaks(timeline))
        router_rows = self.out.collect(router_df, "routers")
        self.routers_df = self._df(router_rows, router_df.schema)
        run_peaks = rows_of(peaks.run_peaks(timeline))
        timeline.unpersist()
        self.roles = self.routers_df.select("run", "router", F.col("role").alias("router_role"))
        return router_rows, run_peaks

    def router_buckets(self) -> None:
        self.rb = tables.router_buckets(self.rc, self.routers_df, self.runs,
                                        self.bucket).persist()
        self.out.write(self.rb.drop("bidx"), "router_buckets", sort=("router", "bucket"))

    def network(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        net = self.out.collect(tables.network_buckets(self.rb, tables.flow_deltas(self.valid)),
                               "network_buckets")
        return net, self.out.collect(tables.role_entries(self.rb), "role_entries")

    def top_routers(self, names: Sequence[str], cols: Sequence[str]) -> list[dict[str, Any]]:
        F = _F()
        return rows_of(self.rb.where(F.col("router").isin(list(names))).select(*cols)
                       .orderBy("run", "router", "bucket"))

    # -- 3. GC lag, churn, traffic, load
    def gc(self, nbins: int, width_of: Callable[[list[dict[str, Any]]], float]
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        gc = tables.gc_lag(self.valid, self.roles).persist()
        self.out.write(gc, "gc_lag", sort=("router", "t_del"))
        summary = self.out.collect(tables.lag_summary(gc), "gc_lag_summary")
        hist = self.out.collect(tables.lag_hist(gc, width_of(summary), nbins), "gc_lag_hist")
        gc.unpersist()
        return summary, hist

    def churn(self) -> list[dict[str, Any]]:
        rows = self.out.collect(tables.churn(self.rc, self.bucket), "churn")
        self.rc.unpersist()
        return rows

    def savings(self) -> list[dict[str, Any]]:
        self.tc = tables.traffic_counts(self.valid, self.roles).persist()
        return self.out.collect(tables.savings(self.tc), "savings")

    def load(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        by_role = self.out.collect(tables.load_by_role(self.rb), "load_by_role")
        summary = self.out.collect(tables.load_summary(self.rb, self.routers_df),
                                   "load_summary")
        self.rb.unpersist()
        return by_role, summary

    def fanout(self) -> list[dict[str, Any]]:
        rows = self.out.collect(tables.fanout(self.valid, self.roles, self.tc), "fanout")
        self.tc.unpersist()
        return rows

    def flows(self) -> list[dict[str, Any]]:
        flows = tables.flows(self.valid).persist()
        self.out.write(flows, "flows")
        rows = self.out.collect(tables.tree_size(flows), "tree_size")
        flows.unpersist()
        return rows

    def close(self) -> None:
        self.cached.unpersist()
        self.spark.sparkContext.setJobDescription(None)
