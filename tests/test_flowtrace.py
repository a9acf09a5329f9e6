"""flowtrace: the Spark job on hand-written traces with known answers, a known scaling law
recovered within its interval, and the tables API. (The CLI, the report renderer, the synthetic
generator and the session itself: test_flowtrace_cli.py; the fit and the study:
test_flowtrace_fit.py.)

One SparkSession serves the whole session (the session-scoped ``spark`` fixture in
conftest.py, shared with the other flowtrace tests); the traces are in knowntraces.py, and the
job runs once over them, through the CLI, in a module fixture.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections import Counter

import pytest

from flowtrace import cli, job, report, schema

from .knowntraces import (
    BAD_LINES,
    BUCKET,
    EDGE1,
    EXPECTED_ERRORS,
    NET,
    A,
    B,
    rec,
    snap,
    write_traces,
)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", params=["spark", "local"])
def analysis(request, spark, tmp_path_factory):
    """Run `flowtrace analyze` once over the hand-written traces (through the CLI), with
    each engine: every known answer below holds for both."""
    if request.param == "local":
        pytest.importorskip("pyarrow", reason="the local engine writes Parquet with pyarrow")
    base = tmp_path_factory.mktemp(f"flowtrace-{request.param}")
    traces = write_traces(base / "traces")
    out_dir = base / "report"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(["analyze", str(traces), "--out", str(out_dir), "--bucket",
                         str(BUCKET), "--master", "local[2]", "--shuffle-partitions", "2",
                         "--progress", "--json", "--max-bad-fraction", "0.5",
                         "--engine", request.param])
    assert code == 0, stderr.getvalue()
    summary = json.loads(stdout.getvalue())
    assert summary["engine"] == request.param

    def table(name):
        rows = spark.read.parquet(str(out_dir / "tables" / name)).collect()
        return [r.asDict(recursive=True) for r in rows]

    return {"summary": summary, "out": out_dir, "table": table, "stderr": stderr.getvalue(),
            "traces": traces}


def by(rows, *keys):
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


# ----------------------------------------------------------------------------- the job
def test_counts_and_errors_match_the_reference_reader(analysis):
    s = analysis["summary"]
    n_good = len(EDGE1) + len(NET)
    assert s["records"] == n_good - 1 and s["clock_outliers"] == 1
    assert s["corrupt"] == 3 and s["invalid"] == 9
    assert s["lines"] == n_good + len(BAD_LINES) - 1  # the blank line is skipped
    spark_errors = Counter({(e["class"], e["reason"]): e["count"] for e in s["errors"]})
    assert spark_errors == EXPECTED_ERRORS
    # validate's Python reader: the same lines, the same classes and reasons
    ref = Counter(bad for *_, bad in schema.check_files([str(analysis["traces"])]) if bad)
    assert ref == EXPECTED_ERRORS
    errors = analysis["table"]("errors")
    assert sum(r["count"] for r in errors) == 12
    assert all(r["example_file"].endswith("bad.jsonl") for r in errors)
    assert s["records_by_kind"]["snapshot"] == 8


def test_router_roles(analysis):
    routers = by(analysis["table"]("routers"), "router")
    assert {k: v["role"] for k, v in routers.items()} == {
        "edge1": "edge", "mid1": "transit", "core1": "core"}
    assert routers["core1"]["max_entries"] == 2
    assert analysis["summary"]["routers_by_role"] == {"core": 1, "edge": 1, "transit": 1}


def test_entries_and_churn_per_router_and_bucket(analysis):
    rb = by(analysis["table"]("router_buckets"), "router", "bucket")
    edge = [rb[("edge1", b * BUCKET)] for b in range(4)]
    assert [r["entries"] for r in edge] == [2, 2, 1, 0]
    assert [r["entries_replay"] for r in edge] == [2, 2, 1, 0]
    assert [r["links_total"] for r in edge] == [3, 3, 2, 0]
    assert [r["links_replay"] for r in edge] == [3, 3, 2, 0]
    assert [r["active_flows"] for r in edge] == [2, 1, 0, 0]
    assert [r["entry_adds"] for r in edge] == [2, 0, 0, 0]
    assert [r["entry_dels"] for r in edge] == [0, 0, 1, 1]
    assert [r["entry_dels_gc"] for r in edge] == [0, 0, 1, 1]
    assert [r["link_adds"] for r in edge] == [3, 0, 0, 0]
    assert [r["link_dels"] for r in edge] == [0, 0, 1, 2]
    assert [r["link_dels_gc"] for r in edge] == [0, 0, 1, 1]
    assert [r["gc_pings"] for r in edge] == [0, 1, 1, 0]
    # sampled traffic, scaled by sample=10
    assert [r["fwd_msgs"] for r in edge] == [10, 10, 0, 0]
    assert [r["fwd_bytes"] for r in edge] == [1000, 1000, 0, 0]
    assert [r["fwd_copies"] for r in edge] == [10, 10, 0, 0]
    assert [r["drop_msgs"] for r in edge] == [20, 0, 0, 0]
    assert [r["drop_bytes"] for r in edge] == [2500, 0, 0, 0]
    # mid1 snapshots only at t=9 and t=39: carried forward; the replay sees the leave at 25
    mid = [rb[("mid1", b * BUCKET)] for b in range(4)]
    assert [r["entries"] for r in mid] == [2, 2, 2, 0]
    assert [r["snapshot_t"] for r in mid] == [9.0, 9.0, 9.0, 39.0]
    assert [r["entries_replay"] for r in mid] == [2, 2, 1, 0]
    assert [rb[("core1", b * BUCKET)]["refreshes"] for b in range(4)] == [0, 0, 1, 0]


def test_network_buckets_and_live_flows(analysis):
    net = by(analysis["table"]("network_buckets"), "bucket")
    rows = [net[b * BUCKET] for b in range(4)]
    assert [r["routers_reporting"] for r in rows] == [3, 3, 3, 3]
    assert [r["entries_total"] for r in rows] == [6, 6, 5, 0]
    assert [r["entries_replay_total"] for r in rows] == [6, 6, 3, 0]
    assert [r["entries_max"] for r in rows] == [2, 2, 2, 0]
    assert [r["members"] for r in rows] == [3, 3, 2, 0]
    assert [r["flows_live"] for r in rows] == [2, 2, 1, 0]
    assert [r["flows_born"] for r in rows] == [2, 0, 0, 0]
    assert [r["active_flows"] for r in rows] == [6, 5, 4, 0]
    peak = analysis["summary"]["peak"]
    assert peak["entries_total"] == 6 and peak["bucket"] == 0.0


def test_gc_lag(analysis):
    gc = by(analysis["table"]("gc_lag"), "flow")
    a, b = gc[A], gc[B]
    # A: the record says last=10 but a forwarded message arrived on link 5 at t=12
    assert (a["router"], a["link"], a["t_del"], a["t_last"], a["last_from"], a["lag"],
            a["pings"]) == ("edge1", 5, 25.0, 12.0, "fwd", 13.0, 2)
    # B: no traffic and no 'last': the join (link_add at t=2) is the last sign of life
    assert (b["t_last"], b["last_from"], b["lag"], b["pings"]) == (2.0, "link_add", 33.0, 0)
    summ = by(analysis["table"]("gc_lag_summary"), "role")
    for role in ("all", "edge"):
        s = summ[role]
        assert s["deletions"] == 2 and s["with_lag"] == 2
        assert s["mean"] == 23.0 and s["min"] == 13.0 and s["max"] == 33.0
        # percentile_approx returns observed values (lags 13 and 33)
        assert (s["p50"], s["p90"], s["p99"]) == (13.0, 33.0, 33.0)
        assert s["mean_pings"] == 1.0
    hist = analysis["table"]("gc_lag_hist")
    assert sum(h["count"] for h in hist) == 2
    assert analysis["summary"]["gc"]["p50"] == 13.0


def test_churn(analysis):
    assert analysis["summary"]["churn"] == {
        "entry_add": 6, "entry_del:gc": 2, "entry_del:leave": 4, "gc_ping": 2,
        "link_add:join": 7, "link_del:gc": 2, "link_del:leave": 5, "refresh": 1}
    churn = analysis["table"]("churn")
    b2 = Counter({(r["kind"], r["cause"]): r["count"] for r in churn if r["bucket"] == 20.0})
    assert b2 == Counter({("gc_ping", ""): 1, ("link_del", "gc"): 1,
                          ("link_del", "leave"): 2, ("entry_del", "gc"): 1,
                          ("entry_del", "leave"): 2, ("refresh", ""): 1})


def test_traffic_saved_scaled_by_sampling(analysis):
    sav = by(analysis["table"]("savings"), "reason")
    bf, loc, nr = sav["band-filtered"], sav["locality"], sav["no-receivers"]
    assert (bf["role"], bf["records"], bf["est_msgs"], bf["est_bytes"], bf["est_link_tx"],
            bf["est_link_bytes"]) == ("edge", 1, 10, 2000, 20, 4000)
    assert (loc["est_msgs"], loc["est_bytes"], loc["est_link_tx"], loc["est_link_bytes"]) == (
        10, 500, 10, 500)
    assert (nr["role"], nr["est_msgs"], nr["est_link_bytes"]) == ("core", 10, 1000)
    # offered = sent (3 fwd records x 10 x 1 copy x 100 B) + all drops (40 copies, 5500 B)
    assert bf["share_of_offered_tx"] == pytest.approx(20 / 70)
    assert bf["share_of_offered_bytes"] == pytest.approx(4000 / 8500)
    assert analysis["summary"]["saved"]["band-filtered"]["est_link_bytes"] == 4000


def test_load_core_vs_edge(analysis):
    ls = by(analysis["table"]("load_summary"), "role")
    assert ls["edge"]["fwd_msgs"] == 20 and ls["transit"]["fwd_msgs"] == 10
    assert ls["core"]["fwd_msgs"] == 0
    # the run spans t=0..39: 4 buckets of 10 s cover 39 s, not 40 (the last one is partial)
    assert ls["edge"]["msgs_per_s_per_router"] == pytest.approx(20 / 39)
    assert ls["edge"]["peak_msgs_per_s"] == pytest.approx(1.0)
    assert ls["transit"]["msgs_per_s_per_router"] == pytest.approx(10 / 39)
    # table events on edge1: 2 adds + 2 dels + 3 link adds + 3 link dels + 2 pings
    assert ls["edge"]["control_per_s_per_router"] == pytest.approx(12 / 39)
    assert ls["core"]["entries_peak"] == 2
    load = by(analysis["table"]("load_by_role"), "role", "bucket")
    assert load[("edge", 0.0)]["fwd_msgs"] == 10 and load[("transit", 0.0)]["fwd_msgs"] == 10
    assert load[("core", 0.0)]["entries_mean"] == 2.0


def test_fanout(analysis):
    fan = {(r["source"], r["role"], r["fanout"]): r["count"]
           for r in analysis["table"]("fanout")}
    assert fan == {("snapshot", "edge", 1): 2, ("snapshot", "edge", 2): 3,
                   ("snapshot", "transit", 1): 2, ("snapshot", "core", 1): 2,
                   ("fwd", "edge", 1): 20, ("fwd", "transit", 1): 10}


def test_state_per_flow_vs_tree_size(analysis):
    flows = by(analysis["table"]("flows"), "flow")
    assert (flows[A]["routers"], flows[A]["members"], flows[A]["link_adds"]) == (3, 1, 3)
    # B's link 6 has no role in its link_add: the link_up says endpoint
    assert (flows[B]["routers"], flows[B]["members"], flows[B]["link_adds"]) == (3, 2, 4)
    assert flows[A]["fwd_msgs"] == 30 and flows[A]["drop_msgs"] == 30
    tree = by(analysis["table"]("tree_size"), "members")
    assert tree[1]["flows"] == 1 and tree[1]["routers_mean"] == 3.0
    assert tree[2]["flows"] == 1 and tree[2]["link_adds_mean"] == 4.0
    assert analysis["summary"]["flows"] == 2


def test_rates_divide_by_the_seconds_a_partial_last_bucket_covers(analysis):
    net = by(analysis["table"]("network_buckets"), "bucket")
    assert [net[b * BUCKET]["seconds"] for b in range(4)] == [10.0, 10.0, 10.0, 9.0]
    rb = by(analysis["table"]("router_buckets"), "router", "bucket")
    assert rb[("core1", 30.0)]["seconds"] == 9.0
    assert analysis["summary"]["run_spans"] == {"": [0.0, 39.0]}


def test_a_stray_clock_is_an_outlier_not_20000_buckets(analysis):
    out = analysis["table"]("clock_outliers")
    assert [(r["router"], r["records"], r["min_t"]) for r in out] == [("mid1", 1, 1.0e6)]
    assert analysis["summary"]["buckets"] == 4
    assert any("clock outliers" in n and "mid1" in n for n in analysis["summary"]["notes"])


def test_one_run_gives_no_fit_and_says_why(analysis):
    fit = analysis["table"]("fit")
    assert fit and all(r["coef"] is None for r in fit)
    assert all("1 run(s)" in r["note"] for r in fit)
    for target, f in analysis["summary"]["fit"].items():
        assert "refused" in f, target
    assert "100x" not in report.console_summary(analysis["summary"])


def test_report_and_progress(analysis):
    out = analysis["out"]
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for text in ("Input errors", "GC lag", "Traffic saved", "core routers vs edge",
                 "Scaling model", "missing or invalid field 'band'", "date: ", "versions: ",
                 "pyspark", "inputs: ", "config: ", "Clock outliers"):
        assert text in md
    assert html.startswith("<!DOCTYPE html>") and "<table>" in html
    assert json.loads((out / "summary.json").read_text())["corrupt"] == 3
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # pragma: no cover
        assert "matplotlib is not installed" in md
    else:
        pngs = sorted(os.listdir(out / "plots"))
        assert {"entries.png", "gc_lag.png", "savings.png", "fanout.png"} <= set(pngs)
        assert "![entries](plots/entries.png)" in md
    assert f"by the {analysis['summary']['engine']} engine." in md
    assert "stage 1/10: read and validate" in analysis["stderr"]
    assert "stage 10/10: report" in analysis["stderr"]


def test_the_shared_session_survives_the_cli(analysis, spark):
    assert spark.range(3).count() == 3


# ----------------------------------------------------------------------------- known law
LAW_A, LAW_B = 1.25, 4.0


def write_law_traces(d):
    """16 runs in which the core's table follows core = LAW_A x flows + LAW_B (+-1 noise),
    with flows, members and routers varied on a grid."""
    import random

    rng = random.Random(3)
    d.mkdir(parents=True, exist_ok=True)
    truth = []
    for flows in (10, 20, 40, 80):
        for routers in (3, 5):
            for per_flow in (1, 2):
                run = f"law-f{flows}-r{routers}-m{per_flow}"
                core = LAW_A * flows + LAW_B + rng.choice((-1, 0, 1))
                recs = [rec(1.0, "c", "entry_add", flow=f"{0xa1:016x}:00000010:{i + 1:08x}",
                            run=run) for i in range(flows)]
                recs.append(snap(5.0, "c", int(core), 0, 0, {}, core=True) | {"run": run})
                members = flows * per_flow
                for e in range(routers - 1):
                    share = members // (routers - 1) + (e < members % (routers - 1))
                    recs.append(snap(5.0, f"e{e}", share, share, 0, {"1": share}, edge=True,
                                     members=share) | {"run": run})
                (d / f"{run}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
                truth.append((flows, members, routers, core))
    return truth


def test_a_known_law_is_recovered_within_its_interval(spark, tmp_path, capsys):
    write_law_traces(tmp_path / "law")
    out = tmp_path / "report"
    assert cli.main(["analyze", str(tmp_path / "law"), "--out", str(out), "--bucket", "10",
                     "--no-report", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["fit"]["core_entries"]["runs"] == 16
    rows = [r.asDict() for r in spark.read.parquet(str(out / "tables" / "fit")).collect()]
    lin = {r["term"]: r for r in rows
           if r["target"] == "core_entries" and r["model"] == "linear"}
    assert lin["flows"]["ci_lo"] <= LAW_A <= lin["flows"]["ci_hi"]
    assert lin["const"]["ci_lo"] <= LAW_B <= lin["const"]["ci_hi"]
    assert lin["flows"]["coef"] == pytest.approx(LAW_A, abs=0.05)
    assert lin["flows"]["ci_hi"] - lin["flows"]["ci_lo"] < 0.2  # and the interval is tight
    assert lin["flows"]["n"] == 16 and lin["flows"]["df"] == 12


# ----------------------------------------------------------------------------- the tables API
def test_the_tables_api_returns_dataframes(spark, tmp_path):
    from flowtrace import schema as S
    from flowtrace import tables

    d = write_traces(tmp_path / "t")
    valid = tables.prepare(S.read_records(spark, [str(d / "net.jsonl")]), BUCKET)
    roles = tables.routers(tables.record_counts(valid))
    assert sorted(r["router"] for r in roles.collect()) == ["core1", "mid1"]
    # without clock fences the stray record stretches mid1's range: that is what the job
    # removes before bucketing
    assert max(r["hi"] for r in roles.collect()) == 100_000


def test_empty_tables_read_back_with_their_columns(spark, tmp_path):
    """A quiet trace (one router, nothing collected, no stray clock, no live flow) leaves
    several tables empty; each is still a Parquet table Spark reads back: zero rows, the
    columns a full run gives (partition columns last, as a partitioned table reads)."""
    d = tmp_path / "quiet"
    d.mkdir()
    (d / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        rec(0.0, "solo", "link_up", link=1, peer="host", role="endpoint"),
        snap(5.0, "solo", 0, 1, 0, {}, edge=True),
        snap(15.0, "solo", 0, 1, 0, {}, edge=True)]))
    out = tmp_path / "out"
    job.analyze(spark, [str(d)], str(out), bucket=BUCKET, make_report=False)
    for name in job.TABLES:
        spark.read.parquet(str(out / "tables" / name)).schema  # noqa: B018 - must not raise
    want = {"clock_outliers": ["router", "records", "min_t", "max_t", "fence_lo", "fence_hi",
                               "run"],
            "run_points": [c for c in job.POINT_COLUMNS if c != "run"] + ["run"]}
    for name in ("clock_outliers", "gc_lag", "run_points", "errors"):
        df = spark.read.parquet(str(out / "tables" / name))
        assert df.count() == 0, name
        if name in want:
            assert df.columns == want[name], name
    # partitioned by run only (one file per run, sorted by router; not a folder per router)
    gc_cols = spark.read.parquet(str(out / "tables" / "gc_lag")).columns
    assert gc_cols[-1] == "run" and gc_cols[0] == "router"
