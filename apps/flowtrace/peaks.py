"""Exact table peaks: the largest table of each router and of each run at event resolution.

A bucketed view (:func:`flowtrace.tables.router_buckets`) keeps one snapshot per
router and bucket, so a peak between two bucket ends is missed (and the more often routers
snapshot, the more). Here every snapshot and every ``entry_add`` / ``entry_del`` counts:
per router, the table size after each instant with a record is

* at a snapshot: the snapshot's ``entries``;
* at an entry event: the last snapshot before it plus the events since (``offset`` below);
  before the router's first snapshot, the first snapshot minus the events up to it; a router
  with no snapshot at all is replayed from the smallest count that never goes negative.

Events at the same instant count together (the size after all of them; a snapshot at that
instant is taken to follow them), so an add and a delete in the same instant never make a
peak that did not exist. The run's total is the sum, over its routers, of each one's latest
size, stepped at every instant any of them changes.

Functions from DataFrames to DataFrames, as in :mod:`flowtrace.tables`. Imports
pyspark lazily.
"""

from __future__ import annotations

from typing import Any


def _F() -> Any:
    from pyspark.sql import functions as F

    return F


def entry_timeline(valid: Any) -> Any:
    """(run, router, t, entries): each router's table size after every instant at which it
    wrote a snapshot or an entry event (see the module docstring)."""
    from pyspark.sql import Window

    F = _F()
    K = F.col("kind")
    ev = (valid.where(K.isin("entry_add", "entry_del", "snapshot"))
          .groupBy("run", "router", "t").agg(
              F.sum(F.when(K == "entry_add", 1).when(K == "entry_del", -1).otherwise(0))
              .alias("d"),
              F.max(F.when(K == "snapshot", F.col("entries"))).alias("snap")))
    upto = (Window.partitionBy("run", "router").orderBy("t")
            .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    whole = (Window.partitionBy("run", "router").orderBy("t")
             .rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing))
    ev = ev.select("*", F.sum("d").over(upto).alias("replay"))
    ev = ev.select("*", (F.col("snap") - F.col("replay")).alias("off"))
    offset = F.coalesce(F.last("off", ignorenulls=True).over(upto),
                        F.first("off", ignorenulls=True).over(whole),
                        F.greatest(-F.min("replay").over(whole), F.lit(0)))
    return ev.select("run", "router", "t",
                     F.greatest(F.col("replay") + offset, F.lit(0)).alias("entries"))


def router_peaks(timeline: Any) -> Any:
    """(run, router, peak_entries, peak_t): each router's largest table and the first time
    it reached it."""
    F = _F()
    return timeline.groupBy("run", "router").agg(
        F.max("entries").alias("peak_entries"),
        F.max_by("t", F.struct("entries", -F.col("t"))).alias("peak_t"))


def run_totals(timeline: Any) -> Any:
    """(run, t, entries_total): the sum of every router's latest table size after each
    instant at which some router's size is known to change."""
    from pyspark.sql import Window

    F = _F()
    prev = Window.partitionBy("run", "router").orderBy("t")
    steps = (timeline.select("run", "t", (F.col("entries") - F.coalesce(
        F.lag("entries").over(prev), F.lit(0))).alias("step"))
        .groupBy("run", "t").agg(F.sum("step").alias("step")))
    upto = (Window.partitionBy("run").orderBy("t")
            .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    return steps.select("run", "t", F.sum("step").over(upto).alias("entries_total"))


def run_peaks(timeline: Any) -> Any:
    """(run, entries_total, t): per run, the largest total over all routers and the first
    time it was reached. (The largest single table is the largest ``max_entries`` of the
    run's routers.)"""
    F = _F()
    return (run_totals(timeline).groupBy("run").agg(
        F.max("entries_total").alias("entries_total"),
        F.max_by("t", F.struct("entries_total", -F.col("t"))).alias("t"))
        .orderBy("run"))
