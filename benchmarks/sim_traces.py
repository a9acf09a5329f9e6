"""Simulator traces at scale, for `flowtrace analyze` (issue 8's end-to-end scale run).

A random mesh of ROUTERS routers (one location service core) with ENDPOINTS applications
drives FLOWS flows through their life: members join over the first JOIN_WINDOW seconds
(every flow has one member, every third a second one), a share of the flows carry data,
some members leave politely and some vanish without a word (their state must be garbage-
collected), and every router writes its trace records (flowrouter.core.traces schema) into
OUT/traces. Then, unless --no-analyze, the Spark job analyses them into OUT/report and the
wall times and rates are printed (and written to OUT/scale.json).

    python3 benchmarks/sim_traces.py --out /tmp/scale                 # 1,000 routers, 100,000 flows
    python3 benchmarks/sim_traces.py --routers 50 --flows 2000 --out /tmp/small   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowrouter.core.router import Router, RouterParams  # noqa: E402
from flowrouter.core.traces import TraceWriter  # noqa: E402
from flowrouter.testbed.sim import SimNetwork  # noqa: E402
from flowrouter.testbed.sim.generate import random_mesh  # noqa: E402
from flowrouter.wire.flowid import FlowID  # noqa: E402

LSID = 0x10


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--routers", type=int, default=1000)
    p.add_argument("--flows", type=int, default=100_000)
    p.add_argument("--endpoints", type=int, default=200)
    p.add_argument("--duration", type=float, default=150.0, help="virtual seconds")
    p.add_argument("--join-window", type=float, default=60.0)
    p.add_argument("--data-share", type=float, default=0.02,
                   help="share of flows that carry data (one message every 5 s)")
    p.add_argument("--sample", type=float, default=0.05, help="trace sampling of forwarding")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--no-analyze", action="store_true", help="only write the traces")
    args = p.parse_args(argv)

    out = Path(args.out)
    traces = out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    topo = random_mesh(args.routers, endpoints=args.endpoints, seed=args.seed, lsid=LSID)
    writers: list[TraceWriter] = []
    run_name = f"sim-{args.routers}r-{args.flows}f"

    def factory(params: RouterParams, now: float) -> Router:
        w = TraceWriter(str(traces) + "/", params.name, sample_rate=args.sample, run=run_name)
        writers.append(w)
        return Router(params, now=now, tracer=w)

    t0 = time.perf_counter()
    net = SimNetwork.from_topology(topo, seed=args.seed, tick_interval=1.0, strict=False,
                                   router_factory=factory)
    eps = list(net.endpoints.values())
    plan = 0
    for i in range(args.flows):
        flow = FlowID(0xF10E, LSID, i + 1)
        members = rng.sample(eps, 2 if i % 3 == 0 else 1)
        for ep in members:
            at = rng.uniform(1.0, args.join_window)
            net.schedule(at, ep.join, flow, "32")
            plan += 1
            fate = rng.random()
            if fate < 0.15:  # leaves politely later
                net.schedule(at + rng.uniform(10, 60), ep.leave, flow)
            elif fate < 0.30:  # vanishes: stops answering keep-alive pings
                net.schedule(at + rng.uniform(10, 60), ep.wanted.pop, flow, None)
        if rng.random() < args.data_share:
            sender = rng.choice(eps)
            t = rng.uniform(args.join_window, args.join_window + 5)
            while t < args.duration:
                net.schedule(t, sender.send, flow, 32, b"x" * 200)
                t += 5.0
    build = time.perf_counter() - t0
    t1, c1 = time.perf_counter(), time.process_time()
    net.run_until(args.duration)
    sim_wall, sim_cpu = time.perf_counter() - t1, time.process_time() - c1
    for w in writers:
        w.close()
    lines = 0
    for f in traces.iterdir():
        with f.open("rb") as fh:
            lines += sum(1 for _ in fh)
    size = sum(f.stat().st_size for f in traces.iterdir())
    result: dict[str, Any] = {
        "routers": args.routers, "flows": args.flows, "endpoints": len(eps), "joins": plan,
        "virtual_seconds": args.duration, "build_s": round(build, 1),
        "simulate_wall_s": round(sim_wall, 1), "simulate_cpu_s": round(sim_cpu, 1),
        "events": net.events if hasattr(net, "events") else None,
        "trace_lines": lines, "trace_bytes": size, "trace_files": len(writers),
        "peak_entries_sum": None,
    }
    print(f"simulated {args.routers} routers, {args.flows} flows, {plan} joins in "
          f"{sim_wall:.0f} s wall; {lines:,} trace lines ({size / 1e6:.0f} MB)", flush=True)
    if not args.no_analyze:
        t2 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "flowtrace.cli", "analyze",
                              str(traces), "--out", str(out / "report"), "--progress"],
                             cwd=str(Path(__file__).resolve().parent.parent),
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 str(Path(__file__).resolve().parent.parent / d)
                                 for d in (".", "apps"))})
        wall = time.perf_counter() - t2
        result.update({"analyze_rc": rc, "analyze_wall_s": round(wall, 1),
                       "analyze_lines_per_s": round(lines / wall) if wall else None})
        print(f"analysed in {wall:.0f} s ({lines / wall:,.0f} lines/s), exit {rc}; report "
              f"in {out / 'report'}", flush=True)
    (out / "scale.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
