#!/usr/bin/env python3
"""Two checkouts side by side in one run: the bulk benchmark of each, taking turns.

A restructuring must not slow the hot path; one run of ``bulk.py`` on each side, an hour
apart, mostly measures the machine. This runs ``bulk.py`` (flownet chains only, no NATS)
from checkout A, then from checkout B, then A again, ... for ``--passes`` passes, each from
its own checkout's code (bulk.py snapshots the checkout it lives in), and reports per payload
size and chain length the median msg/s of each side, the spread of its passes, and B/A::

    python3 benchmarks/ab.py --a /path/to/old --b . --passes 3 --hops 1 3

B/A within the sides' own pass-to-pass spread is noise. Also prints the Python calls per
frame per hop of each side (``pycalls.py`` of this checkout, run against each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def bulk_pass(checkout: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One bulk.py run from *checkout*: its flownet rows."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    cmd = [sys.executable, str(checkout / "benchmarks" / "bulk.py"), "--no-nats",
           "--duration", str(args.duration), "--sizes", *map(str, args.sizes),
           "--hops", *map(str, args.hops), "--out", out]
    env = {k: v for k, v in os.environ.items() if k not in ("FLOWNET_BENCH_CODE", "PYTHONPATH")}
    subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        rows = json.loads(Path(out).read_text())["rates"]
    finally:
        os.unlink(out)
    return [r for r in rows if r["system"] == "flownet"]


def pycalls(checkout: Path) -> dict[int, float]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.run([sys.executable, str(HERE / "pycalls.py"), "--hops", "1", "3",
                           "--json"], cwd=checkout, env=env, check=True, text=True,
                          capture_output=True)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["hops"]: r["py_calls_per_frame_per_hop"] for r in rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, type=Path, help="checkout A (before)")
    p.add_argument("--b", required=True, type=Path, help="checkout B (after)")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1024, 16384, 65536])
    p.add_argument("--hops", type=int, nargs="+", default=[1, 3])
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--out", help="write the JSON result here")
    args = p.parse_args()
    sides = {"A": args.a.resolve(), "B": args.b.resolve()}
    rates: dict[tuple[str, int, int], list[float]] = {}
    for i in range(args.passes):
        for side, checkout in sides.items():
            print(f"pass {i + 1}/{args.passes}: {side} ({checkout})", flush=True)
            for row in bulk_pass(checkout, args):
                rates.setdefault((side, row["hops"], row["size"]), []).append(row["msg_rate"])
    calls = {side: pycalls(checkout) for side, checkout in sides.items()}
    result: list[dict[str, Any]] = []
    print(f"\n{'hops':>4} {'size':>6} {'A msg/s (min-max)':>30} {'B msg/s (min-max)':>30} "
          f"{'B/A':>6}")
    for hops in args.hops:
        for size in args.sizes:
            a, b = rates.get(("A", hops, size), []), rates.get(("B", hops, size), [])
            if not a or not b:
                continue
            ma, mb = statistics.median(a), statistics.median(b)
            result.append({"hops": hops, "size": size, "a": a, "b": b, "ratio": mb / ma})
            print(f"{hops:>4} {size:>6} {ma:>12,.0f} ({min(a):,.0f}-{max(a):,.0f})"
                  f" {mb:>12,.0f} ({min(b):,.0f}-{max(b):,.0f}) {mb / ma:>6.2f}")
    for side in sides:
        print(f"Python calls per frame per hop, {side}: "
              + ", ".join(f"{h} hop(s) {c}" for h, c in sorted(calls[side].items())))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "a": str(sides["A"]), "b": str(sides["B"]), "passes": args.passes,
            "duration": args.duration, "rows": result, "py_calls": calls}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
