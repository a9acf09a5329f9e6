"""flowtrace's Python API: functions from trace DataFrames to the tables of the report.

Each function takes DataFrames and returns a DataFrame (nothing is collected or written), so a
notebook can call them as the job does::

    from pyspark.sql import functions as F
    from flowtrace import schema, session, tables
    spark = session.build_session("local[*]")
    valid = tables.prepare(schema.read_records(spark, ["traces/"]), bucket=10.0)
    counts = tables.record_counts(valid)
    routers = tables.routers(counts)
    runs = valid.groupBy("run").agg(F.min("t").alias("run_lo"), F.max("t").alias("run_hi"))
    rb = tables.router_buckets(counts, routers, runs, bucket=10.0)

:func:`prepare` takes the checked records (:func:`flowtrace.schema.read_records`) and
keeps the valid ones with their bucket index ``bidx`` and sampling weight ``w``. Each family
of tables comes from one aggregation of the records: routers, router_buckets and churn from
:func:`record_counts`; savings and forwarding fan-out from :func:`traffic_counts`. GC lag uses
window functions over each (flow, link)'s events, linear in their number. Rates divide by
the seconds each bucket actually covers (``seconds``: the bucket clipped to the run's first
and last record), so a partial last bucket does not dilute them.

Roles: a router is ``core`` if any of its snapshots says ``core: true``; else ``edge`` if a
snapshot says ``edge: true`` or it has an endpoint link; else ``transit``.
Imports pyspark lazily (inside functions).
"""

from __future__ import annotations

from typing import Any

EVENT_COLS = ("entry_adds", "entry_dels", "entry_dels_gc", "link_adds", "mask_changes",
              "link_dels", "link_dels_gc", "gc_pings", "refreshes", "prunes", "fwd_msgs",
              "fwd_bytes", "fwd_copies", "drop_msgs", "drop_bytes")
#: causes of a deletion by the soft-state timers: v1 ``gc`` (after keep-alive pings), v2
#: ``expired`` (not refreshed within the hold time)
TIMER_CAUSES = ("gc", "expired")
#: ``link_add`` causes that change an existing link's mask rather than add a link: v1/v2
#: ``mask``, v2 ``refresh`` (a mask repaired from a refresh digest)
MASK_CAUSES = ("mask", "refresh")
#: the table-maintenance kinds counted as churn (v1 pings, v2 refresh rounds and prunes)
CHURN_KINDS = ("entry_add", "entry_del", "link_add", "link_del", "gc_ping", "refresh", "prune")
SNAP_COLS = ("entries", "links_total", "active_flows", "mem_bytes", "members")


def _F() -> Any:
    from pyspark.sql import functions as F

    return F


def _sum_if(cond: Any, value: Any = 1) -> Any:
    F = _F()
    return F.coalesce(F.sum(F.when(cond, value)), F.lit(0))


def _ratio(num: Any, den: Any) -> Any:
    """num / den, null when den is not positive (Spark 4 runs in ANSI mode: x / 0 raises)."""
    return _F().when(den > 0, num / den)


def _running(*parts: str, order: Any = "bidx") -> Any:
    from pyspark.sql import Window

    orders = order if isinstance(order, (list, tuple)) else [order]
    return (Window.partitionBy(*parts).orderBy(*orders)
            .rowsBetween(Window.unboundedPreceding, Window.currentRow))


def prepare(checked: Any, bucket: float, *, spans: Any = None) -> Any:
    """Valid records with ``run`` ('' when absent), ``bidx`` (bucket index) and ``w`` (the
    sampling weight). With *spans* (run, lo_t, hi_t), records outside their run's span (clock
    outliers) are left out."""
    F = _F()
    valid = (checked.where(F.col("err").isNull()).drop("err", "line", "file")
             .withColumn("run", F.coalesce("run", F.lit(""))))
    if spans is not None:
        valid = (valid.join(F.broadcast(spans), "run")
                 .where(F.col("t").between(F.col("lo_t"), F.col("hi_t")))
                 .drop("lo_t", "hi_t"))
    return valid.select("*", F.floor(F.col("t") / F.lit(bucket)).cast("long").alias("bidx"),
                        F.coalesce("sample", F.lit(1)).alias("w"))


def line_counts(checked: Any) -> Any:
    """The first pass: lines per (err, kind) and, for valid records, per (run, router), with
    the first ``link_up`` toward each router peer (``peer``, ``t``: the pairs
    :mod:`flowtrace.clocks` estimates clock offsets from)."""
    F = _F()
    ok = F.col("err").isNull()
    up = ok & (F.col("kind") == "link_up") & (F.col("role") == "router")
    return checked.groupBy(
        "err", "kind", F.when(ok, F.coalesce("run", F.lit(""))).alias("run"),
        F.when(ok, F.col("router")).alias("router"), F.when(up, F.col("peer")).alias("peer")
    ).agg(F.count(F.lit(1)).alias("count"), F.min("t").alias("t"))


def drop_routers(checked: Any, routers_df: Any) -> Any:
    """*checked* without the records of the (run, router) rows of *routers_df* (routers
    whose clocks are not trusted); bad lines stay."""
    F = _F()
    x = routers_df.select(F.col("run").alias("_x_run"), F.col("router").alias("_x_router"))
    cond = ((F.coalesce(checked["run"], F.lit("")) == x["_x_run"])
            & (checked["router"] == x["_x_router"]) & checked["err"].isNull())
    return checked.join(F.broadcast(x), cond, "left_anti")


def clock_fences(checked: Any, k: float) -> Any:
    """Per run, the times outside which a record is a clock outlier: the 5th..95th percentile
    of the run's valid record times widened by *k* times that range (at least 1 s) on each
    side. A stray record from a wrong clock falls far outside; a whole run does not."""
    F = _F()
    q = (checked.where(F.col("err").isNull())
         .groupBy(F.coalesce("run", F.lit("")).alias("run"))
         .agg(F.percentile_approx("t", F.array(F.lit(0.05), F.lit(0.95)), 10000).alias("q")))
    width = F.greatest(F.col("q")[1] - F.col("q")[0], F.lit(1.0))
    return q.select("run", (F.col("q")[0] - F.lit(k) * width).alias("lo_t"),
                    (F.col("q")[1] + F.lit(k) * width).alias("hi_t"))


def clock_outliers(checked: Any, fences: Any) -> Any:
    """Per (run, router): the records outside the run's fences, their count and time range."""
    F = _F()
    v = (checked.where(F.col("err").isNull())
         .withColumn("run", F.coalesce("run", F.lit(""))).join(F.broadcast(fences), "run"))
    return (v.where(~F.col("t").between(F.col("lo_t"), F.col("hi_t")))
            .groupBy("run", "router").agg(F.count(F.lit(1)).alias("records"),
                                          F.min("t").alias("min_t"), F.max("t").alias("max_t"),
                                          F.first("lo_t").alias("fence_lo"),
                                          F.first("hi_t").alias("fence_hi"))
            .orderBy("run", "router"))


def record_counts(valid: Any) -> Any:
    """The one pass over the records for the router/bucket family: per (run, router, bucket,
    kind, cause) counts, weighted traffic sums, the bucket's last snapshot and the flags and
    ranges the router table needs."""
    F = _F()
    K = F.col("kind")
    snap = K == "snapshot"
    return valid.groupBy("run", "router", "bidx", "kind",
                         F.coalesce("cause", F.lit("")).alias("cause")).agg(
        F.count(F.lit(1)).alias("n"), F.sum("w").alias("w"),
        F.sum(F.col("w") * F.col("bytes")).alias("wb"),
        F.sum(F.col("w") * F.col("out_links")).alias("wo"),
        F.min("t").alias("t_min"), F.max("t").alias("t_max"),
        F.max_by(F.when(snap, F.struct("t", *SNAP_COLS)), F.when(snap, F.col("t"))).alias("s"),
        F.max(F.when(snap, F.col("entries"))).alias("snap_max"),
        F.max(F.when(snap, F.col("core").cast("int"))).alias("core_i"),
        F.max(F.when(snap, F.col("edge").cast("int"))).alias("edge_i"),
        F.max(F.when(K.isin("link_up", "link_add") & (F.col("role") == "endpoint"), 1))
        .alias("ep_i"),
        F.array_distinct(F.flatten(F.collect_list(F.when(snap, F.coalesce(
            "lsids", F.array().cast("array<bigint>")))))).alias("lsids"))


def routers(counts: Any, peaks: Any = None) -> Any:
    """(run, router, role, records, first_t, last_t, lo, hi, max_entries, peak_t, lsids).

    ``max_entries`` is the largest table over every snapshot (not only the last one of each
    bucket) and, given *peaks* (:func:`flowtrace.peaks.router_peaks`), over every entry
    event too; ``peak_t`` is when (null without *peaks*)."""
    F = _F()
    out = (counts.groupBy("run", "router").agg(
        F.max("core_i").alias("core_i"), F.max("edge_i").alias("edge_i"),
        F.max("ep_i").alias("ep_i"), F.sum("n").alias("records"),
        F.min("t_min").alias("first_t"), F.max("t_max").alias("last_t"),
        F.min("bidx").alias("lo"), F.max("bidx").alias("hi"),
        F.max("snap_max").alias("max_entries"),
        F.array_sort(F.array_distinct(F.flatten(F.collect_list("lsids")))).alias("lsids")))
    if peaks is None:
        out = out.withColumn("peak_t", F.lit(None).cast("double"))
    else:
        out = (out.join(peaks, ["run", "router"], "left")
               .withColumn("max_entries", F.greatest("max_entries", "peak_entries")))
    return (out.select("run", "router",
                       F.when(F.col("core_i") == 1, "core")
                       .when((F.col("edge_i") == 1) | (F.col("ep_i") == 1), "edge")
                       .otherwise("transit").alias("role"),
                       "records", "first_t", "last_t", "lo", "hi", "max_entries", "peak_t",
                       "lsids")
            .orderBy("run", "router"))


def _seconds(bucket: float) -> Any:
    """Seconds of bucket ``bidx`` that its run covers (needs run_lo, run_hi columns)."""
    F = _F()
    start = F.col("bidx") * F.lit(bucket)
    return (F.least(start + F.lit(bucket), F.col("run_hi"))
            - F.greatest(start, F.col("run_lo"))).alias("seconds")


def router_buckets(counts: Any, routers_df: Any, runs: Any, bucket: float) -> Any:
    """One row per router and bucket from its first to its last record: snapshot values
    (carried forward), replayed entries/links, table events, scaled traffic, and ``seconds``
    (the part of the bucket inside the run). *runs*: (run, run_lo, run_hi)."""
    F = _F()
    K, C = F.col("kind"), F.col("cause")
    ev = counts.groupBy("run", "router", "bidx").agg(
        _sum_if(K == "entry_add", F.col("n")).alias("entry_adds"),
        _sum_if(K == "entry_del", F.col("n")).alias("entry_dels"),
        _sum_if((K == "entry_del") & C.isin(*TIMER_CAUSES), F.col("n")).alias("entry_dels_gc"),
        _sum_if((K == "link_add") & ~C.isin(*MASK_CAUSES), F.col("n")).alias("link_adds"),
        _sum_if((K == "link_add") & C.isin(*MASK_CAUSES), F.col("n")).alias("mask_changes"),
        _sum_if(K == "link_del", F.col("n")).alias("link_dels"),
        _sum_if((K == "link_del") & C.isin(*TIMER_CAUSES), F.col("n")).alias("link_dels_gc"),
        _sum_if(K == "gc_ping", F.col("n")).alias("gc_pings"),
        _sum_if(K == "refresh", F.col("n")).alias("refreshes"),
        _sum_if(K == "prune", F.col("n")).alias("prunes"),
        _sum_if(K == "fwd", F.col("w")).alias("fwd_msgs"),
        _sum_if(K == "fwd", F.col("wb")).alias("fwd_bytes"),
        _sum_if(K == "fwd", F.col("wo")).alias("fwd_copies"),
        _sum_if(K == "drop", F.col("w")).alias("drop_msgs"),
        _sum_if(K == "drop", F.col("wb")).alias("drop_bytes"),
        F.max_by("s", F.col("s")["t"]).alias("s"))
    grid = routers_df.select("run", "router", "role",
                             F.explode(F.sequence("lo", "hi")).alias("bidx"))
    rb = grid.join(ev, ["run", "router", "bidx"], "left").na.fill(0, list(EVENT_COLS))
    w = _running("run", "router")
    return (rb.join(F.broadcast(runs), "run").select(
        "run", "router", "role", "bidx", (F.col("bidx") * F.lit(bucket)).alias("bucket"),
        _seconds(bucket),
        *[F.last(F.col("s")[c], ignorenulls=True).over(w).alias(c) for c in SNAP_COLS],
        F.last(F.col("s")["t"], ignorenulls=True).over(w).alias("snapshot_t"),
        F.sum(F.col("entry_adds") - F.col("entry_dels")).over(w).alias("entries_replay"),
        F.sum(F.col("link_adds") - F.col("link_dels")).over(w).alias("links_replay"),
        *EVENT_COLS))


def flow_deltas(valid: Any) -> Any:
    """Per (run, bucket): flows that became live (an entry on some router) minus those that
    stopped, and the births; replayed per flow in time order."""
    from pyspark.sql import Window

    F = _F()
    K = F.col("kind")
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
    return fe.groupBy("run", "bidx").agg(F.sum("fd").alias("fd"),
                                         _sum_if(F.col("fd") == 1).alias("flows_born"))


NET_SUMS = ("entry_adds", "entry_dels", "link_adds", "link_dels", "link_dels_gc", "gc_pings",
            "refreshes", "prunes", "fwd_msgs", "fwd_bytes", "drop_msgs", "drop_bytes")


def network_buckets(rb: Any, deltas: Any) -> Any:
    """Router buckets summed per (run, bucket), with live flows (``flows_live``)."""
    F = _F()
    net = rb.groupBy("run", "bidx", "bucket").agg(
        F.max("seconds").alias("seconds"),
        F.count(F.lit(1)).alias("routers"), F.count("entries").alias("routers_reporting"),
        F.sum("entries").alias("entries_total"), F.max("entries").alias("entries_max"),
        F.avg("entries").alias("entries_mean"),
        F.sum("entries_replay").alias("entries_replay_total"),
        F.sum("links_total").alias("links_total"), F.sum("active_flows").alias("active_flows"),
        F.sum("mem_bytes").alias("mem_total"), F.sum("members").alias("members"),
        *[F.sum(c).alias(c) for c in NET_SUMS])
    cols = [c for c in net.columns if c not in ("run", "bidx", "bucket")]
    return (net.join(deltas, ["run", "bidx"], "left").na.fill(0, ["fd", "flows_born"])
            .select("*", F.sum("fd").over(_running("run")).alias("flows_live"))
            .select("run", "bucket", *cols, "flows_live", "flows_born")
            .orderBy("run", "bucket"))


def role_entries(rb: Any) -> Any:
    """Per (run, bucket, role): routers, mean and max entries (snapshots), for the per-role
    fit and the core-vs-live-flows check."""
    F = _F()
    return (rb.groupBy("run", "bucket", "role").agg(
        F.count("entries").alias("routers_reporting"), F.avg("entries").alias("entries_mean"),
        F.max("entries").alias("entries_max"), F.sum("entries").alias("entries_total"))
        .orderBy("run", "bucket", "role"))


def gc_lag(valid: Any, roles: Any) -> Any:
    """Per deletion of a (flow, link) by the soft-state timers (v1 cause ``gc``, v2
    ``expired``): the last sign of life before it and the pings in between, with window
    functions over the key's events in time order (linear time).

    Last sign of life = the latest of the record's ``last`` (v1: last traffic the GC saw; v2:
    last refresh or join), the last sampled ``fwd`` that arrived on the link and the last
    ``link_add`` of it (``last_from`` says which); ``pings`` are the v1 ``gc_ping`` records
    after that time, up to the deletion (v2 has none: refreshes are per neighbour).
    """
    F = _F()
    K = F.col("kind")
    keys = ["run", "router", "flow", "link"]
    is_del = (K == "link_del") & F.col("cause").isin(*TIMER_CAUSES)
    # order at equal times: pings, then traffic, then the 'last' marker, then the deletion
    ev = valid.where(K.isin("gc_ping", "link_add") | is_del
                     | ((K == "fwd") & F.col("in_link").isNotNull())).select(
        "run", "router", "flow",
        F.when(K == "fwd", F.col("in_link")).otherwise(F.col("link")).alias("link"),
        "t", F.when(K == "gc_ping", 0).when(K.isin("fwd", "link_add"), 1)
        .otherwise(3).alias("prio"),
        F.when(K == "link_add", "link_add").when(K == "fwd", "fwd")
        .when(K == "gc_ping", "ping").otherwise("del").alias("src"),
        F.when(is_del, F.col("last")).alias("t_last_rec"))
    markers = (ev.where((F.col("src") == "del") & F.col("t_last_rec").isNotNull())
               .select(*keys, F.col("t_last_rec").alias("t"), F.lit(2).alias("prio"),
                       F.lit("mark").alias("src"), F.lit(None).cast("double")
                       .alias("t_last_rec")))
    ev = ev.unionByName(markers)
    w = _running(*keys, order=["t", "prio"])
    ev = ev.select("*", F.sum(F.when(F.col("src") == "ping", 1).otherwise(0)).over(w)
                   .alias("c"),
                   F.max(F.when(F.col("src") == "link_add", F.col("t"))).over(w).alias("t_add"),
                   F.max(F.when(F.col("src") == "fwd", F.col("t"))).over(w).alias("t_fwd"))
    ev = ev.select("*", F.last(F.when(F.col("src").isin("link_add", "fwd"), F.col("c")),
                               ignorenulls=True).over(w).alias("c_seen"),
                   F.last(F.when(F.col("src") == "mark", F.col("c")), ignorenulls=True)
                   .over(w).alias("c_mark"))
    t_last = F.greatest("t_last_rec", "t_add", "t_fwd")
    lag = (ev.where(F.col("src") == "del").select(
        *keys, F.col("t").alias("t_del"), t_last.alias("t_last"), "t_last_rec", "t_add",
        "t_fwd", "c", "c_seen", "c_mark")
        .select(*keys, "t_del", "t_last",
                F.when(F.col("t_last").isNull(), None)
                .when(F.col("t_last") == F.col("t_last_rec"), "record")
                .when(F.col("t_last") == F.col("t_fwd"), "fwd")
                .otherwise("link_add").alias("last_from"),
                (F.col("c") - F.when(F.col("t_last").isNull(), 0)
                 .when(F.col("t_last") == F.col("t_last_rec"), F.col("c_mark"))
                 .otherwise(F.col("c_seen"))).alias("pings")))
    return (lag.join(roles, ["run", "router"], "left")
            .select("run", "router", F.col("router_role").alias("role"), "flow", "link",
                    "t_del", "t_last", "last_from",
                    (F.col("t_del") - F.col("t_last")).alias("lag"), "pings"))


def lag_summary(gc: Any) -> Any:
    """Per (run, role) and per run over all roles: deletions, mean/min/max lag and its
    approximate 50th/90th/99th percentiles (``percentile_approx``: distributed, bounded
    memory)."""
    F = _F()

    def stats(df: Any) -> Any:
        return df.groupBy("run", "role").agg(
            F.count(F.lit(1)).alias("deletions"), F.count("lag").alias("with_lag"),
            F.avg("lag").alias("mean"), F.min("lag").alias("min"),
            F.percentile_approx("lag", F.array(F.lit(0.5), F.lit(0.9), F.lit(0.99)), 10000)
            .alias("p"),
            F.max("lag").alias("max"), F.avg("pings").alias("mean_pings"),
        ).select("run", "role", "deletions", "with_lag", "mean", "min",
                 F.col("p")[0].alias("p50"), F.col("p")[1].alias("p90"),
                 F.col("p")[2].alias("p99"), "max", "mean_pings")

    return (stats(gc).unionByName(stats(gc.withColumn("role", F.lit("all"))))
            .orderBy("run", "role"))


def lag_hist(gc: Any, width: float, nbins: int) -> Any:
    F = _F()
    return (gc.where(F.col("lag").isNotNull())
            .select("run", F.least(F.greatest(F.floor(F.col("lag") / width), F.lit(0)),
                                   F.lit(nbins - 1)).cast("int").alias("bin"))
            .groupBy("run", "bin").count()
            .select("run", (F.col("bin") * width).alias("lo"),
                    ((F.col("bin") + 1) * width).alias("hi"), "count").orderBy("run", "lo"))


def churn(counts: Any, bucket: float) -> Any:
    """Table events per (run, bucket, kind, cause), from :func:`record_counts`."""
    F = _F()
    return (counts.where(F.col("kind").isin(*CHURN_KINDS))
            .groupBy("run", "bidx", "kind", "cause").agg(F.sum("n").alias("count"))
            .select("run", (F.col("bidx") * F.lit(bucket)).alias("bucket"), "kind", "cause",
                    "count")
            .orderBy("run", "bucket", "kind", "cause"))


def traffic_counts(valid: Any, roles: Any) -> Any:
    """The one pass over the sampled fwd/drop records for the traffic family (savings,
    forwarding fan-out): per (run, role, kind, reason, out_links), record count and sums
    scaled by the sampling weight ``w`` (messages, bytes, link copies)."""
    F = _F()
    w, b = F.col("w"), F.col("bytes")
    links = F.coalesce("links", F.lit(1))
    return (valid.where(F.col("kind").isin("fwd", "drop")).join(roles, ["run", "router"], "left")
            .groupBy("run", F.col("router_role").alias("role"), "kind", "reason", "out_links")
            .agg(F.count(F.lit(1)).alias("n"), F.sum(w).alias("w"), F.sum(w * b).alias("wb"),
                 F.sum(w * links).alias("wl"), F.sum(w * b * links).alias("wbl"),
                 F.sum(w * F.col("out_links")).alias("wo"),
                 F.sum(w * b * F.col("out_links")).alias("wbo")))


def savings(tc: Any) -> Any:
    """Drops by (run, reason, role), scaled by sampling, and their share of offered load
    (from :func:`traffic_counts`)."""
    F = _F()
    K = F.col("kind")
    by_reason = (tc.where(K == "drop").groupBy("run", "reason", "role").agg(
        F.sum("n").alias("records"), F.sum("w").alias("est_msgs"),
        F.sum("wb").alias("est_bytes"), F.sum("wl").alias("est_link_tx"),
        F.sum("wbl").alias("est_link_bytes")))
    offered = tc.groupBy("run").agg(
        _sum_if(K == "fwd", F.col("wo")).alias("fwd_tx"),
        _sum_if(K == "fwd", F.col("wbo")).alias("fwd_link_bytes"),
        _sum_if(K == "drop", F.col("wl")).alias("drop_tx"),
        _sum_if(K == "drop", F.col("wbl")).alias("drop_link_bytes"))
    return (by_reason.join(offered, "run", "left")
            .withColumn("share_of_offered_tx",
                        _ratio(F.col("est_link_tx"), F.col("fwd_tx") + F.col("drop_tx")))
            .withColumn("share_of_offered_bytes",
                        _ratio(F.col("est_link_bytes"),
                               F.col("fwd_link_bytes") + F.col("drop_link_bytes")))
            .orderBy("run", F.desc("est_link_bytes"), "reason", "role"))


def _control() -> Any:
    F = _F()
    return (F.col("entry_adds") + F.col("entry_dels") + F.col("link_adds")
            + F.col("link_dels") + F.col("mask_changes") + F.col("gc_pings")
            + F.col("refreshes") + F.col("prunes"))


def load_by_role(rb: Any) -> Any:
    """Per (run, bucket, role): forwarding and control load, entries; ``seconds`` is the
    part of the bucket the run covers (divide by it for rates)."""
    F = _F()
    return (rb.groupBy("run", "bucket", "role").agg(
        F.max("seconds").alias("seconds"), F.count(F.lit(1)).alias("routers"),
        F.sum("fwd_msgs").alias("fwd_msgs"), F.avg("fwd_msgs").alias("fwd_msgs_mean"),
        F.max("fwd_msgs").alias("fwd_msgs_max"), F.sum("fwd_bytes").alias("fwd_bytes"),
        F.sum("fwd_copies").alias("fwd_copies"), F.sum("drop_msgs").alias("drop_msgs"),
        F.sum(_control()).alias("control_events"), F.avg("entries").alias("entries_mean"),
        F.max("entries").alias("entries_max"))
        .orderBy("run", "bucket", "role"))


def load_summary(rb: Any, routers_df: Any = None) -> Any:
    """Per (run, role): mean per-router rates over the seconds each router's buckets cover
    (a partial last bucket counts for its covered part), the peak per-bucket rate, entries
    (the peak: the routers' exact ``max_entries`` given *routers_df*, else the largest
    bucket-end snapshot)."""
    F = _F()
    per_router = rb.groupBy("run", "router", "role").agg(
        F.sum("fwd_msgs").alias("msgs"), F.sum("fwd_bytes").alias("bytes"),
        F.sum(_control()).alias("ctrl"), F.sum("seconds").alias("secs"),
        F.max(_ratio(F.col("fwd_msgs"), F.col("seconds"))).alias("peak_rate"),
        F.avg("entries").alias("entries"), F.max("entries").alias("peak_entries"))
    if routers_df is not None:
        per_router = (per_router.join(routers_df.select("run", "router", "max_entries"),
                                      ["run", "router"], "left")
                      .withColumn("peak_entries", F.greatest("peak_entries", "max_entries")))
    secs = F.col("secs")
    return (per_router.groupBy("run", "role").agg(
        F.count(F.lit(1)).alias("routers"), F.sum("msgs").alias("fwd_msgs"),
        F.avg(_ratio(F.col("msgs"), secs)).alias("msgs_per_s_per_router"),
        F.max("peak_rate").alias("peak_msgs_per_s"),
        F.avg(_ratio(F.col("bytes"), secs)).alias("bytes_per_s_per_router"),
        F.avg(_ratio(F.col("ctrl"), secs)).alias("control_per_s_per_router"),
        F.avg("entries").alias("entries_mean"), F.max("peak_entries").alias("entries_peak"))
        .orderBy("run", "role"))


def fanout(valid: Any, roles: Any, tc: Any) -> Any:
    """Fan-out histograms: downstream links per entry (snapshots) and copies per forwarded
    message (scaled by sampling), per role."""
    F = _F()
    fan_snap = (valid.where(F.col("kind") == "snapshot").join(roles, ["run", "router"], "left")
                .select("run", F.col("router_role").alias("role"),
                        F.explode("fanout").alias("k", "n"))
                .groupBy("run", "role", F.expr("try_cast(k AS BIGINT)").alias("fanout"))
                .agg(F.sum("n").alias("count"))
                .select("run", F.lit("snapshot").alias("source"), "role", "fanout", "count"))
    fan_fwd = (tc.where(F.col("kind") == "fwd")
               .groupBy("run", "role", F.col("out_links").alias("fanout"))
               .agg(F.sum("w").alias("count"))
               .select("run", F.lit("fwd").alias("source"), "role", "fanout", "count"))
    return fan_snap.unionByName(fan_fwd).orderBy("run", "source", "role", "fanout")


def flows(valid: Any) -> Any:
    """Per flow: routers holding it, members (endpoint links), link adds, traffic."""
    F = _F()
    K = F.col("kind")
    link_roles = (valid.where((K == "link_up") & (F.col("role") != "unknown"))
                  .groupBy("run", "router", "link")
                  .agg(F.max_by("role", "t").alias("up_role")))
    la = (valid.where((K == "link_add") & ~F.col("cause").isin(*MASK_CAUSES))
          .select("run", "router", "flow", "link",
                  F.when(F.col("role") != "unknown", F.col("role")).alias("role"))
          .join(link_roles, ["run", "router", "link"], "left")
          .select("run", "flow", "router", "link",
                  F.coalesce("role", "up_role").alias("peer_role")))
    per_flow_links = la.groupBy("run", "flow").agg(
        F.count(F.lit(1)).alias("link_adds"),
        F.count_distinct(F.when(F.col("peer_role") == "endpoint",
                                F.struct("router", "link"))).alias("members"))
    return (valid.where(F.col("flow").isNotNull()).groupBy("run", "flow").agg(
        F.count_distinct(F.when(K == "entry_add", F.col("router"))).alias("routers"),
        _sum_if(K == "entry_add").alias("entry_adds"),
        F.min(F.when(K == "entry_add", F.col("t"))).alias("first_t"),
        F.max(F.when(K == "entry_del", F.col("t"))).alias("last_del_t"),
        _sum_if(K == "fwd", F.col("w")).alias("fwd_msgs"),
        _sum_if(K == "drop", F.col("w")).alias("drop_msgs"))
        .join(per_flow_links, ["run", "flow"], "left")
        .na.fill(0, ["members", "link_adds"]))


def tree_size(flows_df: Any) -> Any:
    """State per flow vs its members: routers holding it (mean, approximate median, max)."""
    F = _F()
    return (flows_df.where(F.col("entry_adds") > 0).groupBy("run", "members").agg(
        F.count(F.lit(1)).alias("flows"), F.avg("routers").alias("routers_mean"),
        F.percentile_approx("routers", F.lit(0.5), 10000).alias("routers_p50"),
        F.max("routers").alias("routers_max"), F.avg("link_adds").alias("link_adds_mean"),
        F.avg("entry_adds").alias("entry_adds_mean"))
        .orderBy("run", "members"))
