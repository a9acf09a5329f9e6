"""Cluster parity: `flowtrace analyze` on a Spark standalone master and worker (both bound to
127.0.0.1, started from the installed pyspark) gives the same tables as in local mode.

Each run is a separate driver process (one SparkContext per process), running the job and
then reading its own Parquet tables back as sorted rows (JSON on stdout), so the comparison
needs no Parquet reader in the test process. The master and worker are killed by the fixture's
finalizer whatever happens. Slow-ish (four JVMs start), but the input is tiny.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowtrace import cli

from .checkout import with_checkout
from .ports import free_port

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 120.0  # a bound for a loaded 2-core box, not a speed expectation

# The driver: analyze with the given master, then every table read back as sorted rows.
DRIVER = r"""
import json, os, sys
from flowtrace import job, session
master, traces, out = sys.argv[1:4]
spark = session.build_session(master, app_name="flowtrace-parity", driver_memory="1g",
                              shuffle_partitions=2, conf=[("spark.default.parallelism", "2"),
                              ("spark.executor.memory", "512m"), ("spark.cores.max", "1"),
                              # tiny data: compiling and re-planning cost more than they save
                              ("spark.sql.adaptive.enabled", "false"),
                              ("spark.sql.codegen.wholeStage", "false"),
                              ("spark.sql.codegen.factoryMode", "NO_CODEGEN")])
try:
    job.analyze(spark, [traces], out, bucket=10.0, make_report=False)
    base = os.path.join(out, "tables")
    tables = {}
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        if not any(f.endswith(".parquet") for _, _, fs in os.walk(path) for f in fs):
            tables[name] = {"columns": None, "rows": []}  # an empty table: no part files
            continue
        df = spark.read.parquet(path)
        cols = sorted(df.columns)
        rows = [json.dumps([r[c] for c in cols], default=str, sort_keys=True)
                for r in df.select(*cols).collect()]
        tables[name] = {"columns": cols, "rows": sorted(rows)}
    print("TABLES " + json.dumps(tables, sort_keys=True))
finally:
    spark.stop()
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="localhost",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=with_checkout(env.get("PYTHONPATH")))
    return env


def _wait_for(proc: subprocess.Popen, log: Path, marker: str, what: str) -> None:
    """Poll the daemon's log for *marker* (bounded); fail with its log if it dies or hangs."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if marker in text:
            return
        if proc.poll() is not None:
            pytest.fail(f"the {what} exited ({proc.returncode}):\n{text[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"the {what} did not start in {START_TIMEOUT:.0f} s:\n"
                f"{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """A Spark standalone master and one worker (1 core, 1 GiB) on 127.0.0.1; its URL."""
    pyspark = pytest.importorskip("pyspark")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("the Spark job needs a Java runtime (17+)")
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not spark_class.exists():
        pytest.skip(f"no {spark_class} in the installed pyspark")
    base = tmp_path_factory.mktemp("standalone")
    env = _env() | {"SPARK_HOME": str(spark_class.parent.parent),
                    "SPARK_WORKER_DIR": str(base / "work"),
                    "SPARK_LOG_DIR": str(base / "logs")}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str]) -> tuple[subprocess.Popen, Path]:
        log = base / f"{name}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([str(spark_class), *args], env=env, cwd=base, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc, log

    try:
        master, mlog = start("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(port), "--webui-port", str(free_port())])
        _wait_for(master, mlog, "I have been elected leader", "master")
        worker, wlog = start("worker", [
            "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
            "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g",
            "--work-dir", str(base / "work")])
        _wait_for(worker, wlog, "Successfully registered with master", "worker")
        yield url
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _tables(master: str, traces: Path, out: Path) -> dict:
    """Run the job under *master* in its own driver process; its tables as sorted rows."""
    done = subprocess.run([sys.executable, "-c", DRIVER, master, str(traces), str(out)],
                          env=_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("TABLES ")]
    assert done.returncode == 0 and lines, (
        f"the job under {master} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("TABLES "):])


def test_standalone_cluster_gives_the_same_tables_as_local_mode(standalone, tmp_path):
    traces = tmp_path / "traces"
    assert cli.main(["synth", "--routers", "12", "--flows", "40", "--duration", "60",
                     "--out", str(traces), "--yes", "-q"]) == 0
    local = _tables("local[2]", traces, tmp_path / "local")
    cluster = _tables(standalone, traces, tmp_path / "cluster")
    assert len(local) >= 10, sorted(local)
    assert sum(len(t["rows"]) for t in local.values()) > 50
    assert sorted(cluster) == sorted(local)
    for name in local:
        assert cluster[name]["columns"] == local[name]["columns"], name
        assert cluster[name]["rows"] == local[name]["rows"], name
