"""flowtrace: the Spark job on hand-written traces with known answers, the CLI, the
report renderer and the synthetic generator. (The fit and the study: test_flowtrace_fit.py.)

One SparkSession serves the whole session (the session-scoped ``spark`` fixture in
conftest.py, shared with test_flowtrace_exact.py and test_flowtrace_engines.py); the traces
are in knowntraces.py, and the job runs once over them, through the CLI, in a module fixture.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections import Counter

import pytest

from flowtrace import cli, job, report, schema, synth

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


# ----------------------------------------------------------------------------- no Spark
def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["analyze", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for opt in ("--out", "--engine", "--local-limit", "--master", "--bucket", "--progress",
                "--driver-memory",
                "--shuffle-partitions", "--conf", "--tables-uri", "--top", "--no-report",
                "--json", "Hadoop-compatible", "--max-bad-fraction", "--clock-fence",
                "--driver-host", "--ui", "hadoop-aws"):
        assert opt in text
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "synth" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["analyze", "x", "--out", "y", "--bucket", "-1"])
    assert exc.value.code == 2


def test_cli_missing_input_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["analyze", str(tmp_path / "nothing*.jsonl"), "--out",
                     str(tmp_path / "r")]) == 2
    assert "no trace file" in capsys.readouterr().err


def test_cli_validate(tmp_path, capsys):
    d = write_traces(tmp_path / "t")
    assert cli.main(["validate", str(d), "--show", "2"]) == 1
    out = capsys.readouterr().out
    assert f"{len(EDGE1) + len(NET)} valid records" in out
    assert "4 corrupt lines" not in out and "3 corrupt lines; 9 schema violations" in out
    (d / "bad.jsonl").unlink()
    assert cli.main(["validate", str(d)]) == 0


def test_error_sql_covers_every_field():
    sql = job.error_sql()
    for table in schema.VERSIONS.values():
        for kind, (required, optional) in table.items():
            for name, _ in (*required, *optional):
                assert f"'{kind}'" in sql and f"'{name}''" in sql


def test_render_markdown_and_html_escape():
    blocks = [("h1", "T"), ("p", "a `code` and **bold** <b>"),
              ("table", (["x", "y|z"], [["1", "<2>"]])), ("ul", ["one"]),
              ("img", ("plots/a.png", "a")), ("code", "x < y")]
    md = report.render_markdown(blocks)
    assert "| x | y\\|z |" in md and "![a](plots/a.png)" in md
    html = report.render_html(blocks, "t")
    assert "<code>code</code>" in html and "<b>bold</b>" in html and "&lt;b&gt;" in html
    assert "&lt;2&gt;" in html and "x &lt; y" in html
    assert report.fmt(1234567) == "1,234,567" and report.fmt(None) == "–"
    assert report.fmt_bytes(2048) == "2.0 KiB"


def test_synth_traces_are_valid_consistent_and_deterministic(tmp_path):
    cfg = dict(routers=30, flows=120, duration=300.0, sample_rate=0.1, shards=3, seed=7,
               snapshot_interval=15.0)
    s1 = synth.generate(synth.SynthConfig(out=str(tmp_path / "a"), **cfg))
    s2 = synth.generate(synth.SynthConfig(out=str(tmp_path / "b"), **cfg))
    assert s1["records"] == s2["records"] > 1000
    for name in sorted(os.listdir(tmp_path / "a")):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    checked = list(schema.check_files([str(tmp_path / "a")]))
    assert not [c for c in checked if c[4]]
    items = [c[3] for c in checked]
    kinds = Counter(i["kind"] for i in items)
    assert kinds == Counter(s1["records_by_kind"])
    for k in ("fwd", "drop", "entry_add", "entry_del", "link_add", "link_del", "gc_ping",
              "snapshot", "link_up"):
        assert kinds[k] > 0, k
    assert kinds["entry_add"] == kinds["entry_del"]  # every flow ends and is collected
    # snapshots agree with replaying the table events
    per_router: dict[str, list] = {}
    for i in items:
        if i["kind"] in ("entry_add", "entry_del", "link_add", "link_del", "snapshot"):
            per_router.setdefault(i["router"], []).append(i)
    n_snaps = 0
    for evs in per_router.values():
        evs.sort(key=lambda r: (r["t"], r["kind"] == "snapshot"))
        entries = links = 0
        for r in evs:
            if r["kind"] == "entry_add":
                entries += 1
            elif r["kind"] == "entry_del":
                entries -= 1
            elif r["kind"] == "link_add":
                links += r["cause"] == "join"
            elif r["kind"] == "link_del":
                links -= 1
            else:
                n_snaps += 1
                assert (r["entries"], r["links_total"]) == (entries, links)
                assert sum(r["fanout"].values()) == entries
    assert n_snaps == kinds["snapshot"]


def test_garbage_input_fails_with_one_line(spark, tmp_path, capsys):
    bad = tmp_path / "garbage.jsonl"
    bad.write_text("".join(f"garbage line {i}\n" for i in range(20)))
    assert cli.main(["validate", str(bad)]) == 1
    code = cli.main(["analyze", str(bad), "--out", str(tmp_path / "r"), "--bucket", "10"])
    err = capsys.readouterr().err
    assert code == 1
    assert "bad input: 20 of 20 lines are bad" in err and "not a JSON object: 20" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_validate_tolerates_a_bad_fraction_when_asked(tmp_path, capsys):
    d = write_traces(tmp_path / "t")
    assert cli.main(["validate", str(d), "--max-bad-fraction", "0.5"]) == 0
    assert cli.main(["validate", str(d), "--max-bad-fraction", "0.1"]) == 1


def test_remote_failures_are_one_line():
    from flowtrace.session import one_line_error

    jvm = ("An error occurred while calling o86.json.\n: java.lang.RuntimeException: "
           "java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem "
           "not found\n\tat org.apache.hadoop.conf.Configuration.getClass(Configuration"
           ".java:2724)\n" + "\tat x.y.Z.m(Z.java:1)\n" * 170)
    line = one_line_error(RuntimeError(jvm))
    assert "\n" not in line and "S3AFileSystem" in line and "hadoop-aws" in line
    assert "UnknownHostException" in one_line_error(
        RuntimeError("java.net.UnknownHostException: namenode"))


def test_synth_estimates_and_refuses_a_huge_output(tmp_path, capsys):
    out = tmp_path / "s"
    code = cli.main(["synth", "--routers", "20", "--flows", "200", "--duration", "120",
                     "--out", str(out), "--max-bytes", "1000"])
    err = capsys.readouterr().err
    assert code == 1 and "will write about" in err and "--yes" in err
    assert not out.exists() or not any(out.iterdir())
    assert cli.main(["synth", "--routers", "20", "--flows", "200", "--duration", "120",
                     "--out", str(out), "--max-bytes", "1000", "--yes", "-q"]) == 0
    assert any(out.iterdir())


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


def test_validate_takes_uris_and_fails_remote_reads_in_one_line(spark, tmp_path, capsys):
    d = write_traces(tmp_path / "t")
    (d / "bad.jsonl").unlink()
    assert cli.main(["validate", f"file://{d}"]) == 0
    # a name node that refuses connections (on loopback): one line, exit 1
    spark.sparkContext._jsc.hadoopConfiguration().set("ipc.client.connect.max.retries", "0")
    assert cli.main(["validate", "hdfs://127.0.0.1:1/traces/"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "onnect" in err  # ConnectException / Connection refused


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


def test_the_session_is_on_loopback_without_ui_and_its_chatter_in_a_file(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.ui.enabled") == "false" and spark.sparkContext.uiWebUrl is None
    log = conf.get("spark.flowtrace.log")
    assert log and os.path.getsize(log) > 0  # the JVM's start-up lines went there


def test_a_fresh_jvm_prints_one_line_and_no_log_noise(tmp_path):
    """The command as a user runs it, in its own JVM: a refused hdfs:// read (loopback) is
    one line on stderr, with none of log4j's or the JVM's start-up chatter."""
    import subprocess
    import sys

    pytest.importorskip("pyspark")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("needs a Java runtime")
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    proc = subprocess.run(
        [sys.executable, "-m", "flowtrace.cli", "validate", "hdfs://127.0.0.1:1/t/",
         "--master", "local[1]", "--conf", "spark.hadoop.ipc.client.connect.max.retries=0",
         "--conf", "spark.driver.memory=512m"],
        capture_output=True, text=True, env=env, timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("flowtrace: ") and "onnect" in proc.stderr
