"""flowtrace: known answers for what a bucketed view gets wrong: exact table peaks
(between bucket ends, before a router's first snapshot), v2 mask repairs that are not new
links, and the job on a small trace (per-run peaks in the summary and the report).

Shares the session-scoped ``spark`` fixture (conftest.py) with test_flowtrace.py.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from flowtrace import cli, peaks, schema, tables

BUCKET = 10.0
#: Spark jobs one analysis of this small trace may take (63 when this was written; with
#: adaptive execution on, each query is a job per stage: about three times as many)
MAX_JOBS = 66


def flow(i):
    return f"00000000000000a1:00000010:{i:08x}"


def rec(t, router, kind, run="a", **fields):
    return {"v": 2, "t": t, "router": router, "kind": kind, "run": run, **fields}


def snap(t, router, entries, run="a", core=False):
    return rec(t, router, "snapshot", run=run, entries=entries, links_total=entries,
               active_flows=0, mem_bytes=700 * entries, core=core, edge=False, fanout={})


def add(t, router, i, run="a"):
    return rec(t, router, "entry_add", run=run, flow=flow(i), upstream=1)


def delete(t, router, i, run="a"):
    return rec(t, router, "entry_del", run=run, flow=flow(i), cause="leave")


# r1: snapshots every ~2 s; its peak (4 at t=5) falls between snapshots and the last snapshot
#     of the bucket says 2. Two adds in one instant (t=3) count together.
# r2: its trace starts mid-life (10 entries at the first snapshot): 12 at t=2.
# r3: events before its first snapshot: anchored back from it (6 at t=4 -> 7 at t=2).
# Run total: 17 (t=1), 20 (t=2), 20 (t=3), 20 (t=4), 21 (t=5), 19 (t=6): peak 21 at t=5.
# Run b: one router, snapshots only, peak 8 at t=12 (the last snapshot of its bucket is 3).
RUN_A = [
    add(1.0, "r1", 1), snap(2.0, "r1", 1), add(3.0, "r1", 2), add(3.0, "r1", 3),
    snap(4.0, "r1", 3), add(5.0, "r1", 4), delete(6.0, "r1", 4), delete(6.0, "r1", 3),
    snap(8.0, "r1", 2), snap(9.5, "r1", 2),
    # v2: a join adds link 7; a mask repaired from a digest (cause refresh) is no new link
    rec(1.0, "r1", "link_add", flow=flow(1), link=7, mask="1", cause="join", role="router"),
    rec(7.0, "r1", "link_add", flow=flow(1), link=7, mask="3", cause="refresh",
        role="router"),
    snap(1.0, "r2", 10, core=True), add(2.0, "r2", 1), add(2.0, "r2", 2),
    delete(3.0, "r2", 2), snap(9.0, "r2", 11, core=True),
    add(1.0, "r3", 1), add(2.0, "r3", 2), delete(3.0, "r3", 1), snap(4.0, "r3", 6),
]
RUN_B = [snap(11.0, "s1", 5, run="b"), snap(12.0, "s1", 8, run="b"),
         snap(19.0, "s1", 3, run="b")]


def clocked(run, routers, base):
    """Three fully connected routers whose clocks are off by *routers*' values, on a true
    time line starting at *base*: links up at 0, one flow at 10, snapshots at 20 and 100."""
    out = []
    for name, off in routers.items():
        t0 = base + off
        out += [rec(t0, name, "link_up", run=run, link=i, peer=peer, role="router")
                for i, peer in enumerate(sorted(set(routers) - {name}), 1)]
        out += [add(t0 + 10, name, 1, run=run), snap(t0 + 20, name, 1, run=run),
                snap(t0 + 100, name, 1, run=run)]
    return out


# one router an hour ahead; one 10^6 s behind (each of three, fully connected)
AHEAD = clocked("ahead", {"c1": 0.0, "c2": 0.0, "c3": 3600.0}, 0.0)
BEHIND = clocked("behind", {"d1": 0.0, "d2": 0.0, "d3": -1e6}, 2e6)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("exact") / "traces"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RUN_A))
    (d / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RUN_B))
    (d / "clocks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in AHEAD + BEHIND))
    for r in RUN_A + RUN_B + AHEAD + BEHIND:
        assert schema.check(r) is None, (r, schema.check(r))
    return d


@pytest.fixture(scope="module")
def valid(spark, trace_dir):
    files = [str(trace_dir / "a.jsonl"), str(trace_dir / "b.jsonl")]
    return tables.prepare(schema.read_records(spark, files), BUCKET).cache()


def rows(df):
    return [r.asDict(recursive=True) for r in df.collect()]


def test_router_peaks_count_every_snapshot_and_event(valid):
    timeline = peaks.entry_timeline(valid)
    got = {(r["run"], r["router"]): (r["peak_entries"], r["peak_t"])
           for r in rows(peaks.router_peaks(timeline))}
    assert got == {("a", "r1"): (4, 5.0), ("a", "r2"): (12, 2.0), ("a", "r3"): (7, 2.0),
                   ("b", "s1"): (8, 12.0)}
    r1 = {r["t"]: r["entries"] for r in rows(timeline) if r["router"] == "r1"}
    assert r1 == {1.0: 1, 2.0: 1, 3.0: 3, 4.0: 3, 5.0: 4, 6.0: 2, 8.0: 2, 9.5: 2}


def test_run_peaks_sum_the_routers_at_every_instant(valid):
    got = {r["run"]: (r["entries_total"], r["t"])
           for r in rows(peaks.run_peaks(peaks.entry_timeline(valid)))}
    assert got == {"a": (21, 5.0), "b": (8, 12.0)}


def test_the_routers_table_has_the_exact_peak_not_the_last_snapshot_per_bucket(valid):
    counts = tables.record_counts(valid)
    bucketed = {r["router"]: r["max_entries"] for r in rows(tables.routers(counts))}
    # without events: still every snapshot (r1's 3 at t=4, s1's 8 at t=12), not the last ones
    assert bucketed == {"r1": 3, "r2": 11, "r3": 6, "s1": 8}
    exact = {r["router"]: (r["max_entries"], r["peak_t"]) for r in rows(
        tables.routers(counts, peaks.router_peaks(peaks.entry_timeline(valid))))}
    assert exact == {"r1": (4, 5.0), "r2": (12, 2.0), "r3": (7, 2.0), "s1": (8, 12.0)}


def test_a_v2_mask_repair_is_not_a_new_link(valid):
    counts = tables.record_counts(valid)
    rb = rows(tables.router_buckets(counts, tables.routers(counts),
                                    valid.groupBy("run").agg({"t": "min"})
                                    .withColumnRenamed("min(t)", "run_lo")
                                    .join(valid.groupBy("run").agg({"t": "max"})
                                          .withColumnRenamed("max(t)", "run_hi"), "run"),
                                    BUCKET))
    r1 = [r for r in rb if r["router"] == "r1"]
    assert sum(r["link_adds"] for r in r1) == 1
    assert sum(r["mask_changes"] for r in r1) == 1
    assert max(r["links_replay"] for r in r1) == 1


@pytest.fixture(scope="module")
def analysis(spark, trace_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("exact") / "report"
    stdout, stderr = io.StringIO(), io.StringIO()
    sc = spark.sparkContext
    sc.setJobGroup("flowtrace-exact", "the job on a small trace")
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli.main(["analyze", str(trace_dir), "--out", str(out), "--bucket",
                             str(BUCKET), "--master", "local[2]", "--json", "--engine",
                             "spark"])
    finally:
        jobs = len(sc.statusTracker().getJobIdsForGroup("flowtrace-exact"))
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert code == 0, stderr.getvalue()
    return {"summary": json.loads(stdout.getvalue()), "out": out, "jobs": jobs}


def test_a_small_trace_takes_few_spark_jobs_and_few_files(analysis, spark):
    # adaptive execution off for a small input: one job per query, not one per stage (was
    # 138 jobs on test_flowtrace's trace); the settings are restored afterwards
    assert analysis["jobs"] <= MAX_JOBS, analysis["jobs"]
    assert spark.conf.get("spark.sql.adaptive.enabled") == "false"  # the test session's
    assert analysis["summary"]["header"]["config"]["small_input_settings"][
        "spark.sql.shuffle.partitions"] == "1"
    # restored to the session's value (8: what the CLI's builder sets on the shared session)
    assert spark.conf.get("spark.sql.shuffle.partitions") == "8"
    # one Parquet file per run for the per-router tables, not one per router
    files = sorted((analysis["out"] / "tables" / "router_buckets").rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["run=a", "run=ahead", "run=b", "run=behind"]


def test_the_job_reports_exact_peaks_per_run(analysis):
    s = analysis["summary"]
    pa, pb = s["peaks"]["a"], s["peaks"]["b"]
    assert (pa["entries_total"], pa["t"], pa["bucket"]) == (21, 5.0, 0.0)
    assert (pa["entries_max"], pa["router_max"], pa["t_max"]) == (12, "r2", 2.0)
    assert (pb["entries_total"], pb["t"], pb["entries_max"]) == (8, 12.0, 8)
    assert s["peak"]["run"] == "a"
    md = (analysis["out"] / "report.md").read_text()
    assert "| run a | 21 | 5 | 12 | r2 | 2 |" in md


def test_a_router_whose_clock_is_off_is_left_out_and_named(analysis):
    s = analysis["summary"]
    assert s["clock"]["left_out"] == [
        {"run": "ahead", "router": "c3", "offset": 3600.0, "links": 2},
        {"run": "behind", "router": "d3", "offset": -1e6, "links": 2}]
    assert s["clock"]["records_left_out"] == len(AHEAD) // 3 + len(BEHIND) // 3
    assert s["clock"]["estimated"] == 6 and s["clock"]["undecided"] == []
    # the others' time range, not one widened by the wrong clock; no bucket widening
    assert s["run_spans"]["ahead"] == [0.0, 100.0]
    assert s["run_spans"]["behind"] == [2e6, 2e6 + 100]
    assert s["bucket_seconds"] == BUCKET and s["clock_outliers"] == 0
    assert s["routers"] == 4 + 4  # r1..r3, s1; c1, c2, d1, d2
    assert any("c3" in n and "3600 s ahead" in n and "left out" in n for n in s["notes"])
    assert any("d3" in n and "1e+06 s behind" in n for n in s["notes"])
    md = (analysis["out"] / "report.md").read_text()
    assert "| ahead | c3 | 3,600 | 2 |" in md


def test_clock_offsets_need_a_majority():
    from flowtrace import clocks

    two = clocks.offsets([("x", "a", "b", 0.0, 50.0)])
    assert [r["trusted"] for r in two] == [None, None]
    assert "no majority" in two[0]["note"]
    agree = clocks.offsets([("x", "a", "b", 0.0, 0.2)])
    assert [r["trusted"] for r in agree] == [True, True]
    assert agree[1]["offset"] == pytest.approx(0.1)
    # a wrong clock on the path between two good ones shifts only itself
    line = clocks.offsets([("x", "a", "b", 0.0, 99.0), ("x", "b", "c", 99.0, 0.0)])
    assert [(r["router"], r["trusted"]) for r in line] == [
        ("a", True), ("b", False), ("c", True)]
    ups = [{"run": "x", "router": "a", "peer": "b", "t": 1.0},
           {"run": "x", "router": "b", "peer": "a", "t": 2.0},
           {"run": "x", "router": "a", "peer": "host", "t": 1.0}]
    assert clocks.pairs(ups) == [("x", "a", "b", 1.0, 2.0)]


def test_a_multi_run_report_names_its_runs_and_says_what_plots_leave_out(tmp_path):
    pytest.importorskip("matplotlib")
    from flowtrace import report

    runs = [f"run{i}" for i in range(6)]
    net = [{"run": run, "bucket": b * 10.0, "seconds": 10.0, "entries_total": 5 + i + b,
            "active_flows": 1, "flows_live": 2, "entry_adds": 1, "entry_dels": 0,
            "link_dels_gc": 0, "gc_pings": 0} for i, run in enumerate(runs) for b in range(3)]
    load = [{"run": run, "role": role, "routers": 1, "msgs_per_s_per_router": rate,
             "peak_msgs_per_s": rate, "bytes_per_s_per_router": 1.0,
             "control_per_s_per_router": 1.0, "entries_mean": 1.0, "entries_peak": 2}
            for run, core in (("run0", 14.8), ("run5", 25.0))
            for role, rate in (("core", core), ("edge", 1.0))]
    summary = {"lines": 10, "files": 1, "records": 10, "corrupt": 0, "invalid": 0,
               "routers": 6, "routers_by_role": {}, "flows": 2, "bucket_seconds": 10.0,
               "notes": []}
    md, _ = report.write_report(str(tmp_path), summary, {"network": net, "load_summary": load})
    text = Path(md).read_text(encoding="utf-8")
    assert "entries: first 4 of 6 runs drawn; all are in tables/network_buckets" in text
    assert "churn: first 2 of 6 runs drawn" in text
    assert "run run0 14.8x; run run5 25.0x" in text
    assert "A core router forwards" not in text
