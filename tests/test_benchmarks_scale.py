"""Issue 32's scale benchmarks run in their quick modes and write well-formed results.

``flowmem.py --quick`` (bytes per flow entry, core tables and engine mirror) and
``fanout_bulk.py --quick`` (one sender, ten receivers, against nats-server when it is
installed), each in its own process as a user runs them. Nothing here asserts a rate or a
size target: only the JSON's shape and that something was measured (the targets are the
benchmarks' business, on a quiet machine).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .checkout import with_checkout

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"


def _run(script: str, out: Path, *extra: str, timeout: float = 180) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = with_checkout(env.get("PYTHONPATH"))
    proc = subprocess.run([sys.executable, str(BENCH / script), "--quick", "--out", str(out),
                           *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert data["quick"] is True and data["machine"]["nproc"] >= 1
    assert "--quick" in data["command"]
    return data


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_flowmem_quick(tmp_path: Path) -> None:
    try:
        from flowrouter.core import _fastpath  # type: ignore[attr-defined]  # noqa: F401
        engine = "native"
    except ImportError:  # not built here: the Python twin's mirror is measured instead
        engine = "twin"
    data = _run("flowmem.py", tmp_path / "mem.json", "--engine", engine, "--forward", "16",
                "--mixed")
    (row,) = data["rows"]
    assert row["flows"] == 10_000 and row["engine"] == engine and row["build"] == "direct"
    for k in ("core_bytes_per_flow", "engine_bytes_per_flow", "build_s"):
        assert _positive(row[k]), row
    assert math.isclose(row["total_bytes_per_flow"],
                        row["core_bytes_per_flow"] + row["engine_bytes_per_flow"])
    assert 100 < row["total_bytes_per_flow"] < 10_000, row  # an entry, not MBs
    timed = row["forward_ns_per_frame"]
    assert sorted(timed) == ["16", "mixed"], timed
    for ns in timed.values():
        assert _positive(ns["all_flows"]) and _positive(ns["one_flow"]), ns


def test_fanout_bulk_quick(tmp_path: Path) -> None:
    nats = shutil.which("nats-server") is not None
    data = _run("fanout_bulk.py", tmp_path / "fan.json", *(() if nats else ("--no-nats",)))
    rows = {r["system"].split()[0]: r for r in data["rows"]}
    assert set(rows) == ({"flownet", "nats"} if nats else {"flownet"}), rows
    flow = rows["flownet"]
    assert (flow["hops"], flow["receivers"], flow["size"]) == (1, 10, 16)
    assert _positive(flow["deliveries_per_s"]) and _positive(flow["sent_msgs"]), flow
    # every receiver counts its own copy: deliveries are receivers x what was delivered
    assert 0 < flow["delivered_share"] <= 1.0 and flow["deliveries"] > 0, flow
    assert flow["deliveries"] <= flow["sent_msgs"] * 10, flow
    assert _positive(flow["cpu_us_per_delivery"]), flow
    if nats and not rows["nats"].get("note"):
        assert _positive(rows["nats"]["deliveries_per_s"]), rows["nats"]


def test_bulk_rounds_report_the_median_round_and_each_rounds_ratio() -> None:
    """``bulk.py --rounds``: each row is its median round (a real round's row, the lower
    one of an even count) with every round's rate beside it, and ``--flows`` rows get their
    ratio to x1 from the medians and per round; ``--rounds 0`` is refused."""
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        import bulk  # it puts benchmarks/ on the path too: all put back below
    finally:
        sys.path[:] = saved

    def row(flows: int, rate: float, rnd: int) -> dict[str, Any]:
        return {"system": f"flownet-stranger x{flows}", "hops": 1, "size": 16,
                "msg_rate": rate, "round": rnd}

    rows = [row(1, 10.0, 1), row(100, 9.0, 1), row(1, 30.0, 2), row(100, 15.0, 2),
            row(1, 20.0, 3), row(100, 16.0, 3), row(1, 40.0, 4), row(100, 30.0, 4)]
    med = {r["system"]: r for r in bulk.median_rows(rows)}
    assert med["flownet-stranger x1"]["msg_rate"] == 20.0
    assert med["flownet-stranger x1"]["round_rates"] == [10, 30, 20, 40]
    assert med["flownet-stranger x100"]["msg_rate"] == 15.0
    assert med["flownet-stranger x100"]["round"] == 2
    assert bulk.flow_ratios(list(med.values())) == [
        "flownet-stranger x100 / x1, 1h 16 B: 75% (rounds: 90%, 50%, 80%, 75%)"]
    one = [row(1, 10.0, 1), row(100, 8.0, 1)]
    assert bulk.median_rows(one) == one
    assert bulk.flow_ratios(one) == ["flownet-stranger x100 / x1, 1h 16 B: 80%"]
    proc = subprocess.run([sys.executable, str(BENCH / "bulk.py"), "--rounds", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "must be 1 or more, not 0" in proc.stderr


def test_bulk_refuses_routers_that_lost_the_compiled_engine(tmp_path: Path) -> None:
    """A checkout whose engine was never built forwards every frame in Python: its rows
    would be 25-100x slower under the fast path's name, so the run stops and says why."""
    for pkg in ("flowrouter", "flowlib"):  # the code the routers run, with no .so in it
        shutil.copytree(REPO / pkg, tmp_path / pkg,
                        ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = dict(os.environ)
    env.pop("FLOWNET_NATIVE", None)  # this pass may be the Python-only one
    env["FLOWNET_BENCH_CODE"] = str(tmp_path)
    env["PYTHONPATH"] = with_checkout(env.get("PYTHONPATH"))
    argv = [sys.executable, str(BENCH / "bulk.py"), "--sizes", "16", "--hops", "1",
            "--no-nats", "--duration", "0.2", "--warmup", "0.1", "--out",
            str(tmp_path / "bulk.json")]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "forwards without a fast path" in proc.stderr, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert "compiled engine not built" in proc.stderr, proc.stderr[-4000:]
    env["FLOWNET_NATIVE"] = "0"  # asked for: measured, not refused
    proc = subprocess.run([*argv, "--no-native"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads((tmp_path / "bulk.json").read_text())["rates"]
    assert any(r["system"] == "flownet" and r["msg_rate"] > 0 for r in rows), rows


def test_statuscost_quick(tmp_path: Path) -> None:
    try:
        from flowrouter.core import _fastpath  # type: ignore[attr-defined]  # noqa: F401
        engine = "native"
    except ImportError:  # not built here: the Python twin's mirror holds the counters
        engine = "twin"
    data = _run("statuscost.py", tmp_path / "status.json", "--engine", engine)
    (row,) = data["rows"]
    assert row["flows"] == 10_000 and data["engine"] == engine
    for k in ("every_row_s", "limit20_s", "limit20_bytes_s", "limit20_members_s",
              "metrics_s", "probe_s", "sliced_longest_s", "sliced_total_s", "json_at_once_s",
              "sliced_bytes_longest_s", "sliced_metrics_longest_s", "sliced_by_flow_longest_s",
              "sliced_bytes_all_longest_s"):
        assert _positive(row[k]), row
    # the sliced document's longest stop is a fraction of making it all
    assert row["sliced_longest_s"] < row["sliced_total_s"], row
