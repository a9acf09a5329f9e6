"""benchmarks/udp_bulk.py runs (quick mode, bundled and single side by side) and reports
well-formed rows: frames delivered, loss, the routers' counted drops, CPU per message. No
rate or time thresholds (the machine may be loaded): structure and sanity only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .checkout import with_checkout

REPO = Path(__file__).resolve().parent.parent


def test_udp_bulk_quick_runs_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "udp.json"
    env = {**os.environ, "PYTHONPATH": with_checkout(os.environ.get("PYTHONPATH"))}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "udp_bulk.py"), "--quick",
                           "--modes", "bundled", "single", "--out", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    rows = {r["mode"]: r for r in data["rows"]}
    assert set(rows) == {"bundled", "single"}
    for r in rows.values():
        assert r["hops"] == 1 and r["size"] == 1024 and r["rate_offered"] == 20000
        assert 0 < r["recv_msgs"] <= r["sent_msgs"] and 0.0 <= r["loss"] < 1.0
        assert set(r["router_drops"]) == {"drop.link-congested", "drop.udp-error",
                                          "drop.udp-rcvbuf"}
        assert len(r["cpu_s_per_M"]) == 1 and r["cpu_s_per_M_max"] >= 0
