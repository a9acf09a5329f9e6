#!/usr/bin/env python3
"""Run every flownet benchmark, print a summary with the targets, write one JSON file.

Each benchmark runs as its own process (``python3 benchmarks/NAME.py [--quick] --out
FILE``) under a time limit; one that fails or times out is reported as such and the others
still run. The combined result goes to ``benchmarks/results/latest.json`` (or ``--out``),
with each benchmark's full JSON under ``results`` and the targets' verdicts under
``targets``.

Targets (issue 9):

* forwarding within 2x of a 3-node NATS cluster's messages/s at 1 KB (flownet through 3
  routers, publisher and subscriber on the two ends, against NATS with the publisher on
  node 1 and the subscriber on node 3);
* >= 30% of raw TCP's MB/s at 64 KB (through one router; two and three shown too);
* added latency per router < 100 us median;
* 10^6 flows in < 1 GiB, with lookups O(1) (the lookup time at the largest table no more
  than 3x the smallest; hash tables stay O(1) but large ones miss the CPU caches).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import say  # noqa: E402

BENCHES = ["flowtable", "throughput", "latency", "fanout"]
TIME_LIMIT = {"flowtable": 1500, "throughput": 1200, "latency": 600, "fanout": 900}
QUICK_LIMIT = 120
GIB = 1 << 30


def run_bench(name: str, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    out = out_dir / f"{name}.json"
    cmd = [sys.executable, str(common.BENCH_DIR / f"{name}.py"), "--out", str(out)]
    if args.quick:
        cmd.append("--quick")
    if name == "throughput" and not args.no_nats:
        cmd.append("--with-nats")
    limit = QUICK_LIMIT if args.quick else TIME_LIMIT[name]
    say(f"run_all: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=common.child_env(), cwd=str(common.CODE_DIR),
                              timeout=limit, capture_output=True, text=True)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or "")[-2000:] if isinstance(exc.stderr, str) else ""
        return {"ok": False, "error": f"timed out after {limit}s", "log": tail}
    elapsed = time.monotonic() - t0
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0 or not out.exists():
        return {"ok": False, "error": f"exit status {proc.returncode}",
                "log": proc.stderr[-3000:], "seconds": elapsed}
    return {"ok": True, "seconds": elapsed, "data": json.loads(out.read_text())}


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    tp = results.get("throughput", {}).get("data")
    if tp:
        s = {r["payload"]: r for r in tp["summary"]}
        kb = s.get(1024, {})
        nats = kb.get("nats_msgs_per_s")
        flow3 = kb.get("flow3_msgs_per_s")
        ok = None if nats is None or flow3 is None or nats != nats else flow3 >= nats / 2
        per_router = ", ".join(f"{h} router(s) {kb[f'flow{h}_msgs_per_s']:,.0f}"
                               for h in (1, 2, 3) if f"flow{h}_msgs_per_s" in kb)
        out.append({
            "target": "within 2x of NATS msg/s at 1 KB: end to end, 3 routers vs 3-node cluster",
            "measured": (f"flownet {flow3:,.0f} msg/s vs NATS {nats:,.0f} msg/s delivered "
                         f"(x{flow3 / nats:.2f}; NATS lost {kb.get('nats_loss', 0):.0%} to its "
                         f"slow-consumer limit); {per_router}") if ok is not None else
            (tp.get("nats_skipped") or "1 KB or NATS not measured"),
            "verdict": _verdict(ok)})
        caps = [kb[f"flow{h}_router_capacity"] for h in (1, 2, 3)
                if kb.get(f"flow{h}_router_capacity")]
        ncap = kb.get("nats_server_capacity")
        ok = None if not caps or not ncap else min(caps) >= ncap / 2
        out.append({
            "target": "within 2x of NATS msg/s at 1 KB: per hop (msgs per CPU-second of the "
                      "busiest forwarding process)",
            "measured": (f"flowrouter {min(caps):,.0f}..{max(caps):,.0f} vs nats-server "
                         f"{ncap:,.0f} msg/CPU-s "
                         f"(x{min(caps) / ncap:.2f}..x{max(caps) / ncap:.2f})")
            if ok is not None else (tp.get("nats_skipped") or "not measured"),
            "verdict": _verdict(ok)})
        big = s.get(65536, {})
        r1 = big.get("flow1_vs_raw")
        ok = None if r1 is None else r1 >= 0.30
        out.append({
            "target": ">= 30% of raw TCP MB/s at 64 KB (one router)",
            "measured": (f"1 router {big['flow1_mb_per_s']:.0f} MB/s = {r1:.0%} of raw "
                         f"{big['raw_mb_per_s']:.0f} MB/s"
                         + "".join(f"; {h} routers {big[f'flow{h}_vs_raw']:.0%}"
                                   for h in (2, 3) if f"flow{h}_vs_raw" in big))
            if r1 is not None else "64 KB not measured",
            "verdict": _verdict(ok)})
    lat = results.get("latency", {}).get("data")
    if lat:
        s = lat["summary"]
        added = s.get("added_per_router_median_us")
        ok = None if added is None else added < 100
        rows = [r for r in s["rows"] if r["kind"] == "flownet"]
        out.append({
            "target": "added latency per router < 100 us median",
            "measured": "; ".join(f"{r['routers']} router(s): {r['added_per_router_median_us']:.0f}"
                                  f" us" for r in rows)
            + (f"; marginal router {s['marginal_router_median_us']:.0f} us"
               if "marginal_router_median_us" in s else ""),
            "verdict": _verdict(ok)})
    ft = results.get("flowtable", {}).get("data")
    if ft:
        largest = max(ft["sizes"], key=lambda r: r["flows"])
        n = largest["flows"]
        traced = largest["bytes_per_flow"] * 1_000_000
        rss = largest.get("rss_bytes_per_flow")
        mem_basis = max(traced, rss * 1_000_000 if rss else 0)
        mem_ok = mem_basis < GIB
        growth = ft["lookup_growth"]
        o1 = growth <= 3.0
        out.append({
            "target": "10^6 flows in < 1 GiB",
            "measured": f"{traced / GIB:.2f} GiB traced, "
                        + (f"{rss * 1e6 / GIB:.2f} GiB RSS " if rss else "")
                        + f"per 10^6 flows (measured at {n:,} flows)",
            "verdict": _verdict(mem_ok)})
        upkeep = [m for m in ft.get("maintenance", []) if "cpu_share" in m]
        if upkeep:
            big = max(upkeep, key=lambda m: m["flows"])
            frames = max(big["ep_in_per_s"], big["up_out_per_s"], big["ep_out_per_s"])
            scale = 1_000_000 / big["flows"]
            ok_upkeep = big["cpu_share"] * scale < 0.05 and frames * scale < 1000
            out.append({
                "target": "10^6 idle flows kept with < 5% of a core, < 1,000 frames/s/link",
                "measured": f"{big['cpu_share']:.2%} of a core, {frames:.0f} frames/s on the "
                            f"busiest link at {big['flows']:,} flows",
                "verdict": _verdict(ok_upkeep)})
        small = min(ft["sizes"], key=lambda r: r["flows"])
        out.append({
            "target": "O(1) lookups",
            "measured": f"receive of a data frame {small['receive_ns'] / 1000:.1f} us at "
                        f"{small['flows']:,} flows, {largest['receive_ns'] / 1000:.1f} us at "
                        f"{n:,} (x{growth:.2f})",
            "verdict": _verdict(o1)})
    return out


def summary_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    tp = results.get("throughput", {}).get("data")
    if tp:
        lines.append("THROUGHPUT (delivered; MB/s of payload)")
        cols: list[tuple[str, str, str]] = [("payload", "payload", ">d"),
                                            ("raw_msgs_per_s", "raw msg/s", ">,.0f"),
                                            ("raw_mb_per_s", "raw MB/s", ">.1f")]
        for h in tp["params"]["routers"]:
            cols += [(f"flow{h}_msgs_per_s", f"{h}r msg/s", ">,.0f"),
                     (f"flow{h}_mb_per_s", f"{h}r MB/s", ">.1f")]
        cols += [("nats_msgs_per_s", "NATS msg/s", ">,.0f"), ("nats_mb_per_s", "NATS MB/s", ">.1f")]
        lines.append(common.table(tp["summary"], cols))
        waits = [r["runq_wait_share"] for r in tp["runs"] if r.get("runq_wait_share") is not None]
        if waits:
            lines.append(f"CPU contention: the measured processes waited for a CPU "
                         f"{min(waits):.0%}..{max(waits):.0%} of their runnable time "
                         f"(2 cores; load average at start {tp['machine'].get('loadavg')})")
        if tp.get("nats_skipped"):
            lines.append(f"NATS: {tp['nats_skipped']}")
    lat = results.get("latency", {}).get("data")
    if lat:
        lines += ["", "LATENCY (round trip, best pass)"]
        lines.append(common.table(lat["summary"]["rows"], [
            ("kind", "kind", "<s"), ("routers", "routers", ">d"),
            ("median_us", "median us", ">.1f"), ("p99_us", "p99 us", ">.1f"),
            ("added_per_router_median_us", "added/router us", ">.1f")]))
    fo = results.get("fanout", {}).get("data")
    if fo:
        lines += ["", "FAN-OUT"]
        lines.append(common.table(fo["runs"], [
            ("receivers", "receivers", ">d"), ("send_rate", "sent/s", ">,.0f"),
            ("delivered_per_s", "delivered/s", ">,.0f"), ("delivery_ratio", "ratio", ">.1%")]))
    ft = results.get("flowtable", {}).get("data")
    if ft:
        lines += ["", "FLOW TABLE"]
        lines.append(common.table(ft["sizes"], [
            ("flows", "flows", ">,d"), ("bytes_per_flow", "traced B/flow", ">.0f"),
            ("rss_bytes_per_flow", "RSS B/flow", ">.0f"), ("receive_ns", "receive ns", ">.0f")]))
        upkeep = [m for m in ft.get("maintenance", []) if "cpu_share" in m]
        if upkeep:
            lines.append(common.table(upkeep, [
                ("flows", "idle flows", ">,d"), ("cpu_share", "upkeep CPU", ">.2%"),
                ("ep_in_per_s", "app->router fr/s", ">.1f"),
                ("up_out_per_s", "router->up fr/s", ">.1f"),
                ("max_call_ms", "max call ms", ">.1f")]))
    for name, r in results.items():
        if not r.get("ok"):
            lines += ["", f"{name}: FAILED: {r.get('error')}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="every benchmark in its quick mode")
    p.add_argument("--only", nargs="+", choices=BENCHES, help="run only these")
    p.add_argument("--skip", nargs="+", choices=BENCHES, default=[], help="skip these")
    p.add_argument("--no-nats", action="store_true", help="leave NATS out of the throughput run")
    p.add_argument("--out", default=str(common.BENCH_DIR / "results" / "latest.json"),
                   help="combined JSON (default benchmarks/results/latest.json)")
    args = p.parse_args(argv)
    out = Path(args.out)
    names = [b for b in (args.only or BENCHES) if b not in args.skip]
    started = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flownet-bench-parts-") as part_dir:
        for name in names:
            results[name] = run_bench(name, args, Path(part_dir))
    combined = {
        "machine": common.machine_info(), "quick": args.quick,
        "seconds": time.monotonic() - started,
        "results": results, "targets": targets(results),
    }
    say("")
    say("=" * 100)
    for line in summary_lines(results):
        say(line)
    say("")
    say("TARGETS")
    say(common.table(combined["targets"], [("target", "target", "<s"),
                                           ("verdict", "verdict", "<s"),
                                           ("measured", "measured", "<s")]))
    common.write_json(combined, str(out))
    say(f"\nwrote {out}")
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
