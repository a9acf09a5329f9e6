"""The local engine: ``flowtrace analyze`` on a small trace in plain Python, no JVM.

:class:`LocalEngine` has the stage methods of :class:`flowtrace.spark_engine.SparkEngine`
(the job, :mod:`flowtrace.job`, drives either) and computes the same tables with
:mod:`flowtrace.local_tables` over records read and checked by :mod:`flowtrace.schema`'s
rule (the one ``flowtrace validate`` uses). It holds every record in memory, so it is meant
for traces up to some tens of MiB (``--engine auto`` picks it below ``--local-limit``).
The tables are written as Parquet with pyarrow, laid out as Spark writes them (a folder per
table, ``run=...`` partition folders, an empty table as one file that carries the columns),
so that readers, Spark's included, see the same tables whichever engine ran.
Imports the standard library, the rest of flowtrace and, lazily, pyarrow (no pyspark).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from collections.abc import Sequence
from typing import Any

from flowrouter.core import traces as TR

from . import local_tables as L
from . import schema
from .local_tables import Row, Rows

#: Spark's types of the record fields (pyspark-free: schema's own table)
_FIELD_TYPES = {n: schema.spark_type(t) for n, t in schema.all_fields().items()}
_INT_TYPES = ("long",)


class Record(dict):  # type: ignore[type-arg]
    """A checked record: a field it does not have reads as None (a null column)."""

    def __missing__(self, key: str) -> None:
        return None


def _coerce(name: str, value: Any) -> Any:
    """*value* as Spark's reader types column *name* (a mismatch reads as null there)."""
    typ = _FIELD_TYPES.get(name)
    if value is None or typ is None:
        return None
    if typ == "long":
        return value if type(value) is int else None
    if typ == "double":
        return float(value) if type(value) in (int, float) else None
    if typ == "string":
        return value if isinstance(value, str) else None
    if typ == "boolean":
        return value if type(value) is bool else None
    if typ.startswith("map"):
        return value if isinstance(value, dict) else None
    return value if isinstance(value, list) else None


def read(paths: Sequence[str]) -> tuple[Rows, Rows]:
    """(valid records, bad lines): every non-blank line of *paths* by the schema's rule.
    A valid record carries its fields (typed as Spark reads them), ``run`` ('' when absent),
    ``cause_`` (the cause, '' when absent) and ``w`` (its sampling weight); a bad line is
    (class, reason, file, line)."""
    valid: Rows = []
    bad: Rows = []
    for path in paths:
        uri = "file:" + urllib.parse.quote(os.path.abspath(path))  # as Spark names it
        for _n, text in schema.iter_lines(path):
            try:
                obj = json.loads(text)
            except (ValueError, RecursionError):
                obj = None
                reason: str | None = schema.CORRUPT
            else:
                reason = TR.validate(obj)
            if reason is not None:
                bad.append({"class": schema.error_class(reason), "reason": reason,
                            "file": uri, "line": text[:300]})
                continue
            rec = Record((k, _coerce(k, v)) for k, v in obj.items() if k in _FIELD_TYPES)
            rec["run"] = rec["run"] or ""
            rec["cause_"] = rec["cause"] or ""
            rec["w"] = rec["sample"] if rec["sample"] is not None else 1
            valid.append(rec)
    return valid, bad


def line_counts(valid: Rows, bad: Rows) -> Rows:
    """The rows of :func:`flowtrace.tables.line_counts` (bad lines by reason only)."""
    acc: dict[tuple[Any, ...], list[Any]] = {}
    for r in valid:
        peer = r["peer"] if r["kind"] == "link_up" and r["role"] == "router" else None
        key = (None, r["kind"], r["run"], r["router"], peer)
        a = acc.setdefault(key, [0, None])
        a[0] += 1
        a[1] = L.smin((a[1], r["t"]))
    for r in bad:
        a = acc.setdefault((r["reason"], None, None, None, None), [0, None])
        a[0] += 1
    return [{"err": k[0], "kind": k[1], "run": k[2], "router": k[3], "peer": k[4],
             "count": n, "t": t} for k, (n, t) in acc.items()]


# ----------------------------------------------------------------------------- Parquet
def _arrow_type(pa: Any, text: str) -> Any:
    text = text.strip()
    if text.startswith("array<"):
        return pa.list_(_arrow_type(pa, text[6:-1]))
    return {"string": pa.string(), "double": pa.float64(), "long": pa.int64(),
            "bigint": pa.int64(), "int": pa.int32(), "boolean": pa.bool_()}[text]


def _columns(ddl: str) -> list[tuple[str, str]]:
    out = []
    for part in ddl.split(","):
        name, typ = part.split(None, 1)
        out.append((name, typ))
    return out


#: what Spark escapes in a partition folder's value (as %XX)
_ESCAPE = set('"#%\'*/:=?\\{[]^') | {chr(c) for c in range(0x20)} | {chr(0x7F)}


def partition_dir(column: str, value: Any) -> str:
    """The folder Spark writes a partition value to (null or '' as Hive's default)."""
    if value is None or value == "":
        return f"{column}=__HIVE_DEFAULT_PARTITION__"
    text = str(value)
    return column + "=" + "".join(f"%{ord(c):02X}" if c in _ESCAPE else c for c in text)


def write_parquet(base: str, name: str, rows: Rows, ddl: str,
                  by: Sequence[str] = ("run",), sort: Sequence[str] = ()) -> None:
    """Rows as the Parquet table *name* under *base*, partitioned by the *by* columns of
    *ddl* and sorted by *sort* within each file; an empty table is one file with no rows
    whose partition columns come last (as the Spark engine writes it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = _columns(ddl)
    by = [c for c in by if c in dict(cols)]
    path = os.path.join(base, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)

    def table(part: Rows, names: list[tuple[str, str]]) -> Any:
        if sort:
            part = L.ordered(part, *sort)
        return pa.table({c: pa.array([r[c] for r in part], _arrow_type(pa, t))
                         for c, t in names})

    data = [c for c in cols if c[0] not in by]
    if not by or not rows:
        pq.write_table(table(rows, data + [c for c in cols if c[0] in by]),
                       os.path.join(path, "part-00000.parquet"))
    else:
        parts = L.group(rows, *by)
        for key, part in parts.items():
            d = os.path.join(path, *(partition_dir(c, v) for c, v in zip(by, key)))
            os.makedirs(d, exist_ok=True)
            pq.write_table(table(part, data), os.path.join(d, "part-00000.parquet"))
    open(os.path.join(path, "_SUCCESS"), "w").close()  # noqa: SIM115 - an empty marker


# ----------------------------------------------------------------------------- the engine
class LocalEngine:
    """The job's stages over records held in memory (see the module docstring)."""

    name = "local"

    def __init__(self, tables_base: str, schemas: dict[str, str]) -> None:
        self.base = tables_base
        self.schemas = schemas
        self.checked: Rows = []
        self.bad: Rows = []
        self.fences: Rows | None = None
        self.valid: Rows = []
        self.bucket = 1.0
        self.spans: Rows = []

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name}

    def stage(self, name: str) -> None:
        """Nothing to label (Spark names its jobs after the stage)."""

    def write(self, name: str, rows: Rows, by: Sequence[str] = ("run",),
              sort: Sequence[str] = ()) -> None:
        write_parquet(self.base, name, rows, self.schemas[name], by, sort)

    # -- 1. read and validate
    def read(self, paths: Sequence[str]) -> Rows:
        self.checked, self.bad = read(paths)
        return line_counts(self.checked, self.bad)

    def errors(self, any_bad: bool) -> Rows:
        rows = [{"class": cls, "reason": reason, "count": len(rs),
                 "example_file": min(r["file"] for r in rs),
                 "example_line": min(r["line"] for r in rs)}
                for (cls, reason), rs in L.group(self.bad, "class", "reason").items()]
        rows = L.ordered(rows, "count", "reason", desc=("count",))
        self.write("errors", rows, ())
        return rows

    def drop_routers(self, dropped: set[tuple[str, str]]) -> None:
        self.checked = [r for r in self.checked if (r["run"], r["router"]) not in dropped]

    def clock_outliers(self, k: float) -> Rows:
        self.fences = L.clock_fences(self.checked, k)
        rows = L.clock_outliers(self.checked, self.fences)
        self.write("clock_outliers", rows)
        return rows

    def run_spans(self) -> Rows:
        valid = L.prepare(self.checked, 1.0, self.fences)
        return [{"run": run, "run_lo": min(r["t"] for r in rs),
                 "run_hi": max(r["t"] for r in rs)}
                for (run,), rs in L.group(valid, "run").items()]

    def prepare(self, bucket: float, spans: Rows) -> None:
        self.bucket, self.spans = bucket, spans
        self.valid = L.prepare(self.checked, bucket, self.fences)

    # -- 2. routers and the router/bucket family
    def routers(self) -> tuple[Rows, Rows]:
        self.rc = L.record_counts(self.valid)
        timeline = L.entry_timeline(self.valid)
        self.router_rows = L.routers(self.rc, L.router_peaks(timeline))
        self.write("routers", self.router_rows)
        self.role_of = {(r["run"], r["router"]): r["role"] for r in self.router_rows}
        return self.router_rows, L.run_peaks(timeline)

    def router_buckets(self) -> None:
        self.rb = L.router_buckets(self.rc, self.router_rows, self.spans, self.bucket)
        self.write("router_buckets", self.rb, sort=("router", "bucket"))

    def network(self) -> tuple[Rows, Rows]:
        net = L.network_buckets(self.rb, L.flow_deltas(self.valid))
        self.write("network_buckets", net)
        roles = L.role_entries(self.rb)
        self.write("role_entries", roles)
        return net, roles

    def top_routers(self, names: Sequence[str], cols: Sequence[str]) -> Rows:
        keep = set(names)
        return L.ordered(({c: r[c] for c in cols} for r in self.rb if r["router"] in keep),
                         "run", "router", "bucket")

    # -- 3. GC lag, churn, traffic, load
    def gc(self, nbins: int, width_of: Any) -> tuple[Rows, Rows]:
        gc = L.gc_lag(self.valid, self.role_of)
        self.write("gc_lag", gc, sort=("router", "t_del"))
        summary = L.lag_summary(gc)
        self.write("gc_lag_summary", summary)
        hist = L.lag_hist(gc, width_of(summary), nbins)
        self.write("gc_lag_hist", hist)
        return summary, hist

    def churn(self) -> Rows:
        rows = L.churn(self.rc, self.bucket)
        self.write("churn", rows)
        return rows

    def savings(self) -> Rows:
        self.tc = L.traffic_counts(self.valid, self.role_of)
        rows = L.savings(self.tc)
        self.write("savings", rows)
        return rows

    def load(self) -> tuple[Rows, Rows]:
        by_role = L.load_by_role(self.rb)
        self.write("load_by_role", by_role)
        summary = L.load_summary(self.rb, self.router_rows)
        self.write("load_summary", summary)
        return by_role, summary

    def fanout(self) -> Rows:
        rows = L.fanout(self.valid, self.role_of, self.tc)
        self.write("fanout", rows)
        return rows

    def flows(self) -> Rows:
        flows = L.flows(self.valid)
        self.write("flows", flows)
        rows = L.tree_size(flows)
        self.write("tree_size", rows)
        return rows

    def write_rows(self, name: str, rows: Sequence[Row], by: Sequence[str] = ("run",)) -> None:
        self.write(name, list(rows), by)

    def close(self) -> None:
        self.checked = self.valid = []


#: the columns of the tables the engine computes (Spark infers them from its plans; the
#: equivalence test reads both back and compares)
SCHEMAS = {
    "errors": "class string, reason string, count long, example_file string, "
              "example_line string",
    "clock_outliers": "run string, router string, records long, min_t double, max_t double, "
                      "fence_lo double, fence_hi double",
    "routers": "run string, router string, role string, records long, first_t double, "
               "last_t double, lo long, hi long, max_entries long, peak_t double, "
               "lsids array<long>",
    "router_buckets": "run string, router string, role string, bucket double, seconds double, "
                      "entries long, links_total long, active_flows long, mem_bytes long, "
                      "members long, snapshot_t double, entries_replay long, "
                      "links_replay long, " + ", ".join(f"{c} long" for c in L.EVENT_COLS),
    "network_buckets": "run string, bucket double, seconds double, routers long, "
                       "routers_reporting long, entries_total long, entries_max long, "
                       "entries_mean double, entries_replay_total long, links_total long, "
                       "active_flows long, mem_total long, members long, "
                       + ", ".join(f"{c} long" for c in L.NET_SUMS)
                       + ", flows_live long, flows_born long",
    "role_entries": "run string, bucket double, role string, routers_reporting long, "
                    "entries_mean double, entries_max long, entries_total long",
    "gc_lag": "run string, router string, role string, flow string, link long, t_del double, "
              "t_last double, last_from string, lag double, pings long",
    "gc_lag_summary": "run string, role string, deletions long, with_lag long, mean double, "
                      "min double, p50 double, p90 double, p99 double, max double, "
                      "mean_pings double",
    "gc_lag_hist": "run string, lo double, hi double, count long",
    "churn": "run string, bucket double, kind string, cause string, count long",
    "savings": "run string, reason string, role string, records long, est_msgs long, "
               "est_bytes long, est_link_tx long, est_link_bytes long, fwd_tx long, "
               "fwd_link_bytes long, drop_tx long, drop_link_bytes long, "
               "share_of_offered_tx double, share_of_offered_bytes double",
    "load_by_role": "run string, bucket double, role string, seconds double, routers long, "
                    "fwd_msgs long, fwd_msgs_mean double, fwd_msgs_max long, fwd_bytes long, "
                    "fwd_copies long, drop_msgs long, control_events long, "
                    "entries_mean double, entries_max long",
    "load_summary": "run string, role string, routers long, fwd_msgs long, "
                    "msgs_per_s_per_router double, peak_msgs_per_s double, "
                    "bytes_per_s_per_router double, control_per_s_per_router double, "
                    "entries_mean double, entries_peak long",
    "fanout": "run string, source string, role string, fanout long, count long",
    "flows": "run string, flow string, routers long, entry_adds long, first_t double, "
             "last_del_t double, fwd_msgs long, drop_msgs long, link_adds long, members long",
    "tree_size": "run string, members long, flows long, routers_mean double, "
                 "routers_p50 long, routers_max long, link_adds_mean double, "
                 "entry_adds_mean double",
}
