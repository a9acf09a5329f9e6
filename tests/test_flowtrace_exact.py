"""flowtrace: known answers for what a bucketed view gets wrong: exact table peaks
(between bucket ends, before a router's first snapshot), v2 mask repairs that are not new
links, and the job on a small trace (per-run peaks in the summary and the report).

Shares test_flowtrace.py's session-scoped ``spark`` fixture.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from flowtrace import cli, peaks, schema, tables

from .test_flowtrace import spark  # noqa: F401 - the shared session fixture

BUCKET = 10.0


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


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("exact") / "traces"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RUN_A))
    (d / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RUN_B))
    for r in RUN_A + RUN_B:
        assert schema.check(r) is None, (r, schema.check(r))
    return d


@pytest.fixture(scope="module")
def valid(spark, trace_dir):  # noqa: F811 - the fixture imported above
    return tables.prepare(schema.read_records(spark, [str(trace_dir)]), BUCKET).cache()


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
def analysis(spark, trace_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("exact") / "report"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(["analyze", str(trace_dir), "--out", str(out), "--bucket",
                         str(BUCKET), "--master", "local[2]", "--json"])
    assert code == 0, stderr.getvalue()
    return {"summary": json.loads(stdout.getvalue()), "out": out}


def test_the_job_reports_exact_peaks_per_run(analysis):
    s = analysis["summary"]
    pa, pb = s["peaks"]["a"], s["peaks"]["b"]
    assert (pa["entries_total"], pa["t"], pa["bucket"]) == (21, 5.0, 0.0)
    assert (pa["entries_max"], pa["router_max"], pa["t_max"]) == (12, "r2", 2.0)
    assert (pb["entries_total"], pb["t"], pb["entries_max"]) == (8, 12.0, 8)
    assert s["peak"]["run"] == "a"
    md = (analysis["out"] / "report.md").read_text()
    assert "| run a | 21 | 5 | 12 | r2 | 2 |" in md
