"""flowtrace's command line and what surrounds the job: the CLI's help, usage errors and
``validate`` (on files and URIs; bad input and remote failures in one line), the error SQL
against the schema, the report renderer, the synthetic generator, and the Spark session itself
(on loopback, no UI, its chatter in a file; a fresh JVM prints one line). The job's known
answers: test_flowtrace.py; the shared ``spark`` fixture: conftest.py.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter

import pytest

from flowtrace import cli, job, report, schema, synth

from .knowntraces import EDGE1, NET, write_traces


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


# ----------------------------------------------------------------------------- the session
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
