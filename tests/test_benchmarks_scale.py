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
    data = _run("flowmem.py", tmp_path / "mem.json", "--engine", engine, "--forward", "16")
    (row,) = data["rows"]
    assert row["flows"] == 10_000 and row["engine"] == engine and row["build"] == "direct"
    for k in ("core_bytes_per_flow", "engine_bytes_per_flow", "build_s"):
        assert _positive(row[k]), row
    assert math.isclose(row["total_bytes_per_flow"],
                        row["core_bytes_per_flow"] + row["engine_bytes_per_flow"])
    assert 100 < row["total_bytes_per_flow"] < 10_000, row  # an entry, not MBs
    (size, ns), = row["forward_ns_per_frame"].items()
    assert size == "16" and _positive(ns["all_flows"]) and _positive(ns["one_flow"]), ns


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
