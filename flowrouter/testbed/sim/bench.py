"""Scale benchmark: ``python -m flowrouter.testbed.sim.bench [--routers 1000] [--duration 30]``.

Builds a random connected mesh (:func:`flowrouter.testbed.sim.generate.random_mesh`), attaches
endpoints that all join one flow and send at 1 message/s, runs it in virtual time and prints
how many simulator events (frame deliveries, router ticks, timers) it ran per wall second.
"""

from __future__ import annotations

import argparse
import json
import time

from flowrouter.testbed.sim.generate import random_mesh, tree
from flowrouter.testbed.sim.network import SimNetwork
from flowrouter.testbed.sim.workload import SharedFlowWorkload, default_flow, summarize


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flowrouter.testbed.sim.bench")
    p.add_argument("--routers", type=int, default=1000)
    p.add_argument("--degree", type=float, default=4.0)
    p.add_argument("--endpoints", type=int, default=100)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--tick", type=float, default=0.1)
    p.add_argument("--shape", choices=("mesh", "tree"), default="mesh")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.shape == "mesh":
        topo = random_mesh(args.routers, degree=args.degree, endpoints=args.endpoints,
                           seed=args.seed)
    else:
        topo = tree(args.routers, endpoints=args.endpoints, seed=args.seed)
    net = SimNetwork.from_topology(topo, seed=args.seed, tick_interval=args.tick,
                                   strict=False)
    wl = SharedFlowWorkload(net, default_flow(topo), rate=args.rate, start=2.0)
    wl.install()
    build = time.perf_counter() - t0
    t1 = time.perf_counter()
    c1 = time.process_time()
    net.run_until(args.duration)
    wall = time.perf_counter() - t1
    cpu = time.process_time() - c1
    s = summarize(net, wl, wall)
    s["build_seconds"] = build
    s["cpu_seconds"] = cpu
    s["events_per_cpu_second"] = s["events"] / cpu if cpu > 0 else None
    if args.json:
        s.pop("links_traffic")
        print(json.dumps(s, indent=2, sort_keys=True))
        return 0
    m = s["messages"]
    print(f"{topo.name}: {s['routers']} routers, {s['links']} links, {s['endpoints']} "
          f"endpoints; {args.duration:g} s virtual")
    print(f"  build {build:.2f} s, run {wall:.2f} s wall ({cpu:.2f} s CPU)")
    print(f"  events {s['events']:,} ({s['events_per_second']:,.0f}/s): frames delivered "
          f"{s['frames_delivered']:,}, router ticks {s['router_ticks']:,}; "
          f"{s['events_per_cpu_second']:,.0f} per CPU second")
    print(f"  messages sent {m['sent']}, delivered {m['delivered']} of {m['expected']} "
          f"expected, errors {s['router_error_count']}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
