#!/usr/bin/env python3
"""Fan-out: one sender, 1..64 receivers with band masks; messages/s delivered in total.

Set-up: routers r1 - r2 - r3 (each its own process; r3 the core). The sender (its own
process) is on r1, advertises the flow and sends for a fixed time, alternating bands 32 and
33. The receivers are flowlib clients, spread round-robin over r1, r2 and r3 and split
between two receiver processes (several clients per process). Even-numbered receivers listen
on bands 32-33 (they should get every message), odd-numbered ones on band 32 only (half of
them), so the routers' band filtering is part of the work: r2 and r3 get band 33 only while
some receiver below them wants it.

Reported per receiver count: messages delivered in total and per second (from the first
arrival at any receiver to the last), the delivery ratio (delivered / what the receivers'
masks should have got of what was sent), the routers' ``drop.*`` counters and CPU per
message. Messages lost to congestion are visible in the ratio and the drop counters.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import RouterChain, say  # noqa: E402

DEFAULT_COUNTS = [1, 2, 4, 8, 16, 32, 64]
QUICK_COUNTS = [1, 4]
PROCESSES = 2


async def run_fanout(chain: RouterChain, receivers: int, args: argparse.Namespace,
                     logs: Path, local: int) -> dict[str, Any]:
    flow = common.new_flow_text(local)
    specs = [{"router": chain.listen[i % chain.n], "bands": "32-33" if i % 2 == 0 else "32"}
             for i in range(receivers)]
    groups = [specs[k::PROCESSES] for k in range(PROCESSES)]
    groups = [g for g in groups if g]
    lim = {"idle": args.idle, "first_timeout": 30.0,
           "max_time": args.duration + args.idle + 90.0}
    async with common.children() as kids:
        rxs = []
        for k, g in enumerate(groups):
            rx = await common.start_worker("flow-recv", f"fanout-recv-{receivers}-{k}", logs,
                                           flow=flow, clients=g, queue=1 << 15, **lim)
            kids.append(rx)
            rxs.append(rx)
        for rx in rxs:
            await rx.expect("ready", 60)
        tx = await common.start_worker("flow-send", f"fanout-send-{receivers}", logs,
                                       stdin=True, router=chain.listen[0], flow=flow,
                                       payload=args.payload, bands=[32, 33],
                                       duration=args.duration, max_count=args.max_count, **lim)
        kids.append(tx)
        await tx.expect("ready", 30)
        before = await chain.counters()
        cpu0 = chain.cpu()
        tx.tell("go")
        sent = await tx.expect("result", args.duration + 60)
        gots = [await rx.expect("result", args.duration + args.idle + 90) for rx in rxs]
        cpu1 = chain.cpu()
        after = await chain.counters()
        tx.tell("exit")
    delivered = sum(g["count"] for g in gots)
    firsts = [g["first"] for g in gots if g["count"]]
    lasts = [g["last"] for g in gots if g["count"]]
    seconds = max(lasts) - min(firsts) if firsts else 0.0
    n_all = sum(1 for s in specs if s["bands"] == "32-33")
    n_half = receivers - n_all
    # bands alternate starting with 32: ceil(sent/2) messages on band 32
    on32 = (sent["sent"] + 1) // 2
    expected = n_all * sent["sent"] + n_half * on32
    per_client = [c["count"] for g in gots for c in g["per_client"]]
    fwd = [a.get("forwarded", 0) - b.get("forwarded", 0) for b, a in zip(before, after)]
    cpu = [b - a for a, b in zip(cpu0, cpu1)]
    return {
        "receivers": receivers, "payload": args.payload, "sent": sent["sent"],
        "send_rate": sent["sent"] / sent["seconds"] if sent["seconds"] else float("nan"),
        "expected": expected, "delivered": delivered,
        "delivery_ratio": delivered / expected if expected else float("nan"),
        "seconds": seconds,
        "delivered_per_s": delivered / seconds if seconds > 0 else float("nan"),
        "min_per_receiver": min(per_client) if per_client else 0,
        "max_per_receiver": max(per_client) if per_client else 0,
        "receiver_queue_dropped": sum(g.get("queue_dropped", 0) for g in gots),
        "drops": common.counter_delta(before, after, "drop."),
        "forwarded": fwd, "router_cpu_s": cpu,
        "router_us_per_copy": [c / f * 1e6 if f else None for c, f in zip(cpu, fwd)],
        "receiver_cpu_s": [g["cpu_s"] for g in gots],
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    counts = args.receivers or (QUICK_COUNTS if args.quick else DEFAULT_COUNTS)
    result: dict[str, Any] = {
        "benchmark": "fanout", "machine": common.machine_info(), "quick": args.quick,
        "params": {"receivers": counts, "payload": args.payload, "duration_s": args.duration,
                   "routers": 3, "receiver_processes": PROCESSES},
        "runs": [],
    }
    async with common.log_directory(args.keep_logs) as logs:
        async with RouterChain(3, logs) as chain:
            for i, n in enumerate(counts):
                say(f"fanout: {n} receiver(s) ...")
                result["runs"].append(await run_fanout(chain, n, args, logs, 500 + i))
    result["machine"]["loadavg_end"] = common.load_average()
    return result


def print_tables(result: dict[str, Any]) -> None:
    say(f"\nFan-out: one sender on r1, receivers over r1..r3, payload "
        f"{result['params']['payload']} B")
    say(common.table(result["runs"], [
        ("receivers", "receivers", ">d"), ("sent", "sent", ">d"),
        ("send_rate", "sent/s", ">,.0f"), ("delivered", "delivered", ">d"),
        ("delivered_per_s", "delivered/s", ">,.0f"), ("delivery_ratio", "ratio", ">.1%"),
        ("min_per_receiver", "min/recv", ">d"), ("max_per_receiver", "max/recv", ">d")]))
    for r in result["runs"]:
        if r["drops"]:
            say(f"  drops with {r['receivers']} receivers: "
                + ", ".join(f"{k}={v}" for k, v in sorted(r["drops"].items())))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Example: python3 benchmarks/fanout.py --receivers 1 8 64")
    p.add_argument("--quick", action="store_true", help="1 and 4 receivers, short windows")
    p.add_argument("--receivers", type=int, nargs="+",
                   help=f"receiver counts (default {' '.join(map(str, DEFAULT_COUNTS))})")
    p.add_argument("--payload", type=int, default=256, help="payload bytes (default 256)")
    p.add_argument("--duration", type=float, help="seconds the sender sends (default 3, "
                   "quick 0.3)")
    p.add_argument("--idle", type=float, help="receivers stop after this long with nothing "
                   "new (default 1.5, quick 0.5)")
    p.add_argument("--max-count", type=int, default=5_000_000)
    common.add_output_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return common.run_benchmark(build_parser().parse_args(argv), main_async, print_tables,
                                duration=(0.3, 3.0), idle=(0.5, 1.5))


if __name__ == "__main__":
    sys.exit(main())
