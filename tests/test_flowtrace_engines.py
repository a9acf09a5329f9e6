"""flowtrace analyze: the local engine (plain Python) gives the tables, summary and report of
the Spark engine, on the hand-written traces (bad lines, a stray clock, v1 and v2), the
clock-offset and v2-repair traces, and synthetic ones (one run and several); ``--engine
auto`` picks local for a small local input and says so. (The Spark arithmetic itself:
test_flowtrace.py and test_flowtrace_exact.py.)
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re

import pytest

from flowtrace import cli, job, synth

from .knowntraces import BUCKET, write_traces
from .test_flowtrace_exact import AHEAD, BEHIND, RUN_A, RUN_B

pytest.importorskip("pyarrow", reason="the local engine writes Parquet with pyarrow")


def close(a, b, path="") -> None:
    """Equal, floats to 1e-9 (the engines add in different orders)."""
    if isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, (path, a, b)
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (path, a, b)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), (path, sorted(set(a) ^ set(b)))
        for k in a:
            close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def _canon(v):
    if isinstance(v, float):
        return ("f", float(f"{v:.9g}"))
    if isinstance(v, (list, tuple)):
        return tuple(_canon(x) for x in v)
    return (type(v).__name__, v)


#: columns the engines fill differently on purpose: Spark's example of a bad line is the line
#: as its JSON reader re-serialised it; the local engine's is the line as written
DIFFERENT = {"errors": ("example_line",)}


def same_tables(spark, a_dir, b_dir) -> None:
    for name in job.TABLES:
        a = spark.read.parquet(str(a_dir / "tables" / name))
        b = spark.read.parquet(str(b_dir / "tables" / name))
        assert a.schema == b.schema, (name, a.schema, b.schema)
        skip = DIFFERENT.get(name, ())
        rows = []
        for df in (a, b):
            rs = [{k: v for k, v in r.asDict(recursive=True).items() if k not in skip}
                  for r in df.collect()]
            rows.append(sorted(rs, key=lambda r: tuple(_canon(r[k]) for k in sorted(r))))
        close(rows[0], rows[1], name)


def comparable(summary):
    return {k: v for k, v in summary.items()
            if k not in ("header", "engine", "wall_seconds", "lines_per_second")}


def report_text(d) -> str:
    """The report without what differs on purpose: date, configuration, the engine named,
    and the example of each bad line (see DIFFERENT)."""
    text = (d / "report.md").read_text()
    text = re.sub(r"Analysed in .*? engine\.", "", text)
    text = re.sub(r"^(\| (?:corrupt|invalid) \|.*\| )`.*` \|$", r"\1 |", text, flags=re.M)
    return "\n".join(ln for ln in text.splitlines()
                     if not ln.startswith(("- date:", "- config:", "- command:")))


def both(spark, traces, out, **kw):
    """Analyse *traces* with each engine; the two results (spark, local)."""
    res = {}
    for engine in ("spark", "local"):
        res[engine] = job.analyze(spark if engine == "spark" else None, [str(traces)],
                                  str(out / engine), engine=engine, **kw)
    return res["spark"], res["local"]


def check_same(spark, traces, out, **kw):
    s, loc = both(spark, traces, out, **kw)
    assert s.summary["engine"] == "spark" and loc.summary["engine"] == "local"
    assert loc.summary["header"]["config"]["engine"] == "local"
    close(comparable(s.summary), comparable(loc.summary), "summary")
    same_tables(spark, out / "spark", out / "local")
    if kw.get("make_report", True):
        assert report_text(out / "spark") == report_text(out / "local")
        assert "by the local engine." in (out / "local" / "report.md").read_text()
    return s, loc


def test_hand_written_traces_with_bad_lines_and_a_stray_clock(spark, tmp_path):
    traces = write_traces(tmp_path / "traces")
    s, loc = check_same(spark, traces, tmp_path, bucket=BUCKET, max_bad_fraction=0.5)
    assert loc.summary["corrupt"] == 3 and loc.summary["clock_outliers"] == 1


def test_clock_offsets_multiple_runs_and_v2_repairs(spark, tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RUN_A + RUN_B))
    (d / "clocks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in AHEAD + BEHIND))
    s, loc = check_same(spark, d, tmp_path, bucket=BUCKET, make_report=False)
    assert {r["router"] for r in loc.summary["clock"]["left_out"]} == {"c3", "d3"}
    assert loc.summary["peaks"]["a"]["entries_total"] == 21


def test_synthetic_traces_one_run(spark, tmp_path):
    synth.generate(synth.SynthConfig(routers=30, flows=120, duration=300.0, sample_rate=0.1,
                                     shards=3, seed=7, snapshot_interval=15.0,
                                     out=str(tmp_path / "traces")))
    s, loc = check_same(spark, tmp_path / "traces", tmp_path)
    assert loc.summary["records"] > 1000 and loc.summary["gc"]["deletions"] > 0


def test_synthetic_traces_several_runs_and_a_fit(spark, tmp_path):
    for i, (routers, flows) in enumerate(((12, 30), (20, 60), (30, 90), (16, 80))):
        synth.generate(synth.SynthConfig(routers=routers, flows=flows, duration=200.0,
                                         sample_rate=0.05, shards=1, seed=i + 1,
                                         run=f"r{i}", out=str(tmp_path / "traces" / f"r{i}")))
    s, loc = check_same(spark, tmp_path / "traces", tmp_path, make_report=False)
    assert len(loc.summary["runs"]) == 4


def test_auto_picks_local_for_a_small_trace_and_says_so(tmp_path):
    traces = write_traces(tmp_path / "traces")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["analyze", str(traces), "--out", str(tmp_path / "r"), "--bucket",
                         "10", "--max-bad-fraction", "0.5", "--progress", "--no-report"])
    assert code == 0, err.getvalue()
    assert "engine local (auto:" in err.getvalue()
    assert "engine local)" in out.getvalue()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["engine"] == "local"
    assert summary["header"]["config"]["engine_choice"].startswith("auto: ")


def test_auto_picks_spark_above_the_limit_or_for_uris(tmp_path):
    traces = write_traces(tmp_path / "traces")
    paths = [str(p) for p in sorted(traces.iterdir())]
    assert job.choose_engine("auto", paths)[0] == "local"
    assert job.choose_engine("auto", paths, limit=100)[0] == "spark"
    assert job.choose_engine("auto", paths, master="spark://h:7077")[0] == "spark"
    assert job.choose_engine("auto", ["hdfs://nn/traces"])[0] == "spark"
    assert job.choose_engine("auto", paths, tables_uri="s3a://b/t")[0] == "spark"
    assert job.choose_engine("spark", paths) == ("spark", "--engine spark")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["analyze", "hdfs://nn/traces", "--out", str(tmp_path / "r"),
                         "--engine", "local"])
    assert code == 2 and "local files only" in err.getvalue()
