"""The benchmark scripts run (quick mode) and produce well-formed, sane results.

One ``benchmarks/run_all.py --quick`` run (every script in its quick mode, each in its own
process, routers in their own processes) feeds all the checks below. Nothing here asserts a
time or a rate threshold: only structure and sanity (messages were delivered, ratios are
positive, memory was measured).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .checkout import with_checkout

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
SCRIPTS = ["throughput", "latency", "fanout", "flowtable", "run_all", "profile_hotpath"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = with_checkout(env.get("PYTHONPATH"))
    return env


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "latest.json"
    proc = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--quick", "--out",
                           str(out)], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=240)
    assert out.exists(), f"run_all wrote nothing (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    data = json.loads(out.read_text())
    failed = {k: v.get("error") for k, v in data["results"].items() if not v.get("ok")}
    assert not failed, f"benchmarks failed: {failed}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "TARGETS" in proc.stderr  # the human summary was printed
    return data


def _finite_positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script: str) -> None:
    proc = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--help"], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "--quick" in proc.stdout and "--out" in proc.stdout


def test_combined_file(results: dict[str, Any]) -> None:
    assert results["quick"] is True
    assert set(results["results"]) == {"flowtable", "throughput", "latency", "fanout"}
    assert results["machine"]["nproc"] >= 1
    names = [t["target"] for t in results["targets"]]
    assert len(names) == 7, names
    for t in results["targets"]:
        assert t["verdict"] in ("met", "NOT met", "n/a"), t


def test_throughput(results: dict[str, Any]) -> None:
    tp = results["results"]["throughput"]["data"]
    flow = [r for r in tp["runs"] if r["kind"] == "flownet"]
    raw = [r for r in tp["runs"] if r["kind"] == "raw-tcp"]
    assert {r["routers"] for r in flow} == {1, 2, 3}
    assert {r["payload"] for r in flow} == {r["payload"] for r in raw} == {1024, 65536}
    for r in flow + raw:
        assert r["sent"] > 0 and r["delivered"] > 0, r
        assert r["delivered"] <= r["sent"], r
        assert _finite_positive(r["msgs_per_s"]) and _finite_positive(r["mb_per_s"]), r
        assert r["delivered_bytes"] == r["delivered"] * r["payload"], r
    for r in flow:
        assert isinstance(r["drops"], dict)
        assert sum(r["forwarded"]) >= r["delivered"], r  # every delivery was forwarded
    for row in tp["summary"]:
        for h in (1, 2, 3):
            assert _finite_positive(row[f"flow{h}_vs_raw"]), row


def test_throughput_nats(results: dict[str, Any]) -> None:
    tp = results["results"]["throughput"]["data"]
    if tp.get("nats_skipped"):
        pytest.skip(tp["nats_skipped"])
    nats = [r for r in tp["runs"] if r["kind"] == "nats"]
    assert {r["payload"] for r in nats} == {1024, 65536}
    for r in nats:
        assert r["delivered"] > 0 and _finite_positive(r["msgs_per_s"]), r
    for row in tp["summary"]:
        assert _finite_positive(row["flow3_vs_nats"]), row


def test_latency(results: dict[str, Any]) -> None:
    lat = results["results"]["latency"]["data"]
    rows = {(r["kind"], r["routers"]): r for r in lat["summary"]["rows"]}
    assert set(rows) == {("raw-tcp", 0), ("flownet", 1), ("flownet", 2), ("flownet", 3)}
    for r in lat["runs"]:
        assert r["rounds"] == lat["params"]["rounds"]
        assert 0 < r["min_us"] <= r["median_us"] <= r["p99_us"], r
    for h in (1, 2, 3):
        assert math.isfinite(rows[("flownet", h)]["added_per_router_median_us"])


def test_fanout(results: dict[str, Any]) -> None:
    fo = results["results"]["fanout"]["data"]
    assert [r["receivers"] for r in fo["runs"]] == [1, 4]
    for r in fo["runs"]:
        assert r["sent"] > 0 and r["delivered"] > 0, r
        assert 0 < r["delivery_ratio"] <= 1.0, r
        assert r["max_per_receiver"] <= r["sent"], r
        assert _finite_positive(r["delivered_per_s"]), r


def test_flowtable(results: dict[str, Any]) -> None:
    ft = results["results"]["flowtable"]["data"]
    sizes = [r["flows"] for r in ft["sizes"]]
    assert sizes == [1_000, 10_000]
    for r in ft["sizes"]:
        assert 100 < r["bytes_per_flow"] < 100_000, r  # an entry costs something, not MBs
        assert _finite_positive(r["receive_ns"]) and _finite_positive(r["dict_get_ns"]), r
    upkeep = {(m["phase"], m["flows"]): m for m in ft["maintenance"]}
    for n in (1_000, 10_000):
        steady = upkeep[("steady (refresh)", n)]
        assert _finite_positive(steady["cpu_share"]) and steady["cpu_share"] < 1, steady
        # digests, not a frame per flow: far fewer frames a second than flows
        assert 0 < steady["ep_in_per_s"] < n / 100 and 0 < steady["up_out_per_s"] < n / 100
        expiry = upkeep[("expiry (hold)", n)]
        assert expiry["left"] == 0 and _finite_positive(expiry["cpu_ms"]), expiry


def test_trace_overhead_quick(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The tracing-overhead benchmark runs and reports all three configurations."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "t.json"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "trace_overhead.py"
    subprocess.run([sys.executable, str(script), "--quick", "--out", str(out)], check=True,
                   timeout=120, capture_output=True)
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows][0] == "no tracer"
    assert len(rows) == 3 and all(r["us_per_frame"] > 0 for r in rows)
