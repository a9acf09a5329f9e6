#!/usr/bin/env python3
"""Throughput: messages/s and MB/s through a chain of 1, 2 and 3 flow routers, beside raw TCP
on loopback (and, with --with-nats, a 3-node NATS cluster), in the same run.

Set-up: three routers r1 - r2 - r3, each its own ``flowrouter run`` process; r3 is the core
of the flow's LSID. The receiver (a flowlib client in its own process) listens on r3; the
sender (another process) connects to r3, r2 or r1 for 1, 2 or 3 routers on the path,
advertises the flow and sends with ``FlowClient.send`` (which waits while its link's write
buffer is full) for a fixed time. Raw TCP is a plain asyncio sender writing the same frames
(24-byte header + payload) to a plain asyncio receiver that splits and counts them. NATS is
three clustered nats-server processes, a nats-py publisher on node 1 and a subscriber on
node 3.

What is measured is what the **receiver got**: delivered messages and payload bytes divided
by the time from its first to its last message. A sender that outruns a router fills that
router's output buffer and data frames are dropped there (``drop.link-congested``): those and
every other ``drop.*`` counter of the routers are reported for each run, with each
process's CPU time (so per-message costs can be read even on a busy machine). Payload sizes
run in an interleaved order (raw, 1, 2, 3 routers, NATS for each size) so a change in the
machine's load hits all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import Child, RouterChain, say  # noqa: E402

DEFAULT_SIZES = [16, 256, 1024, 4096, 16384, 65536]
QUICK_SIZES = [1024, 65536]


def rates(count: int, nbytes: int, first: float, last: float) -> tuple[float, float, float]:
    seconds = last - first
    if count < 2 or seconds <= 0:
        return seconds, float("nan"), float("nan")
    # the first message opens the window, so count-1 arrivals fall within it
    return seconds, (count - 1) / seconds, nbytes * (count - 1) / count / seconds / 1e6


async def measure(kind: str, sender: Child, receiver: Child, args: argparse.Namespace,
                  chain: RouterChain | None = None, cluster: Any = None,
                  **info: Any) -> dict[str, Any]:
    """Run one send window between a ready sender and receiver; collect everything."""
    before = await chain.counters() if chain else None
    servers = chain or cluster
    cpu_before = servers.cpu() if servers else []
    sched_before = [common.proc_sched(p.pid) for p in servers.procs] if servers else []
    psi0, t0 = common.cpu_pressure_total(), time.monotonic()
    sender.tell("go")
    sent = await sender.expect("result", args.duration + 60)
    got = await receiver.expect("result", args.duration + args.idle + 60)
    cpu_after = servers.cpu() if servers else []
    sched_after = [common.proc_sched(p.pid) for p in servers.procs] if servers else []
    psi1, t1 = common.cpu_pressure_total(), time.monotonic()
    after = await chain.counters() if chain else None
    sender.tell("exit")
    seconds, mps, mbps = rates(got["count"], got["bytes"], got["first"], got["last"])
    row: dict[str, Any] = {
        "kind": kind, **info, "sent": sent["sent"], "delivered": got["count"],
        "delivered_bytes": got["bytes"], "seconds": seconds, "msgs_per_s": mps,
        "mb_per_s": mbps, "loss": 1 - got["count"] / sent["sent"] if sent["sent"] else 0.0,
        "send_rate": sent["sent"] / sent["seconds"] if sent["seconds"] else float("nan"),
        "sender_cpu_s": sent["cpu_s"], "receiver_cpu_s": got["cpu_s"],
        "receiver_queue_dropped": got.get("queue_dropped", 0), "stop": got.get("stop"),
    }
    server_cpu = [a - b for a, b in zip(cpu_after, cpu_before)]
    row["server_cpu_s"] = server_cpu
    # CPU contention: how long our processes sat runnable without a CPU, against their run
    # time (0 = they always got a CPU at once), and the machine's PSI "some" share
    run = sum(a[0] - b[0] for a, b in zip(sched_after, sched_before))
    wait = sum(a[1] - b[1] for a, b in zip(sched_after, sched_before))
    for w in (sent, got):
        run += w.get("sched", {}).get("run_s", 0.0)
        wait += w.get("sched", {}).get("wait_s", 0.0)
    row["runq_wait_share"] = wait / (run + wait) if run + wait > 0 else None
    row["cpu_pressure"] = (psi1 - psi0) / (t1 - t0) if psi0 is not None and psi1 is not None \
        else None
    if chain is not None and before is not None and after is not None:
        row["drops"] = common.counter_delta(before, after, "drop.")
        fwd = [a.get("forwarded", 0) - b.get("forwarded", 0) for b, a in zip(before, after)]
        row["forwarded"] = fwd
        # CPU per forwarded message of each router that forwarded anything
        row["router_us_per_msg"] = [c / f * 1e6 if f else None for c, f in zip(server_cpu, fwd)]
        busy = [x for x in row["router_us_per_msg"] if x is not None]
        row["busiest_router_us_per_msg"] = max(busy) if busy else None
    if cluster is not None:
        row["errors"] = got.get("errors", [])
        # every published message crosses node 1 and node 3 (node 2 has no interest), even
        # those node 3 then drops for a slow consumer: CPU per published message
        row["server_us_per_msg"] = [c / sent["sent"] * 1e6 if sent["sent"] else None
                                    for c in server_cpu]
        row["busiest_server_us_per_msg"] = max(row["server_us_per_msg"] or [None],
                                               key=lambda x: x or 0)
    if got["count"]:
        row["receiver_us_per_msg"] = got["cpu_s"] / got["count"] * 1e6
    if sent["sent"]:
        row["sender_us_per_msg"] = sent["cpu_s"] / sent["sent"] * 1e6
    return row


def worker_limits(args: argparse.Namespace) -> dict[str, Any]:
    return {"idle": args.idle, "first_timeout": 20.0,
            "max_time": args.duration + args.idle + 60.0}


async def run_flow(chain: RouterChain, hops: int, size: int, args: argparse.Namespace,
                   logs: Path, local: int) -> dict[str, Any]:
    flow = common.new_flow_text(local)
    n = chain.n
    sender_at = n - hops  # r3 for 1 router, r2 for 2, r1 for 3
    lim = worker_limits(args)
    async with common.children() as kids:
        rx = await common.start_worker(
            "flow-recv", f"flow-recv-{hops}-{size}", logs,
            flow=flow, clients=[{"router": chain.listen[n - 1], "bands": "32"}],
            queue=1 << 16, **lim)
        kids.append(rx)
        await rx.expect("ready", 30)
        tx = await common.start_worker(
            "flow-send", f"flow-send-{hops}-{size}", logs, stdin=True,
            router=chain.listen[sender_at], flow=flow, payload=size, bands=[32],
            duration=args.duration, max_count=args.max_count, **lim)
        kids.append(tx)
        await tx.expect("ready", 30)
        return await measure("flownet", tx, rx, args, chain=chain, routers=hops, payload=size)


async def run_raw(size: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    lim = worker_limits(args)
    async with common.children() as kids:
        rx = await common.start_worker("raw-recv", f"raw-recv-{size}", logs, **lim)
        kids.append(rx)
        ready = await rx.expect("ready", 30)
        tx = await common.start_worker("raw-send", f"raw-send-{size}", logs, stdin=True,
                                       port=ready["port"], payload=size,
                                       duration=args.duration, max_count=args.max_count, **lim)
        kids.append(tx)
        await tx.expect("ready", 30)
        return await measure("raw-tcp", tx, rx, args, routers=0, payload=size)


async def run_nats(cluster: common.NatsCluster, size: int, args: argparse.Namespace,
                   logs: Path, local: int) -> dict[str, Any]:
    lim = worker_limits(args)
    subject = f"bench.{local}"
    async with common.children() as kids:
        rx = await common.start_worker("nats-recv", f"nats-recv-{size}", logs,
                                       url=cluster.urls[-1], subject=subject, **lim)
        kids.append(rx)
        await rx.expect("ready", 30)
        tx = await common.start_worker("nats-send", f"nats-send-{size}", logs, stdin=True,
                                       url=cluster.urls[0], subject=subject, payload=size,
                                       duration=args.duration, max_count=args.max_count, **lim)
        kids.append(tx)
        await tx.expect("ready", 30)
        await asyncio.sleep(0.3)  # the subscription's interest reaches node 1 over routes
        return await measure("nats", tx, rx, args, cluster=cluster, servers=3, payload=size)


def summarize(runs: list[dict[str, Any]], sizes: list[int], hops: list[int]
              ) -> list[dict[str, Any]]:
    out = []
    for size in sizes:
        raw = next((r for r in runs if r["kind"] == "raw-tcp" and r["payload"] == size), None)
        nats = next((r for r in runs if r["kind"] == "nats" and r["payload"] == size), None)
        row: dict[str, Any] = {"payload": size}
        if raw:
            row["raw_msgs_per_s"] = raw["msgs_per_s"]
            row["raw_mb_per_s"] = raw["mb_per_s"]
        if nats:
            row["nats_msgs_per_s"] = nats["msgs_per_s"]
            row["nats_mb_per_s"] = nats["mb_per_s"]
            row["nats_loss"] = nats["loss"]
            if nats.get("busiest_server_us_per_msg"):
                # messages one nats-server process could pass per CPU-second
                row["nats_server_capacity"] = 1e6 / nats["busiest_server_us_per_msg"]
        for h in hops:
            fr = next((r for r in runs if r["kind"] == "flownet" and r["payload"] == size
                       and r["routers"] == h), None)
            if not fr:
                continue
            row[f"flow{h}_msgs_per_s"] = fr["msgs_per_s"]
            row[f"flow{h}_mb_per_s"] = fr["mb_per_s"]
            row[f"flow{h}_loss"] = fr["loss"]
            row[f"flow{h}_router_us"] = fr.get("busiest_router_us_per_msg")
            if fr.get("busiest_router_us_per_msg"):
                # messages one router process could forward per CPU-second
                row[f"flow{h}_router_capacity"] = 1e6 / fr["busiest_router_us_per_msg"]
            if raw and raw["mb_per_s"] == raw["mb_per_s"] and raw["mb_per_s"]:
                row[f"flow{h}_vs_raw"] = fr["mb_per_s"] / raw["mb_per_s"]
            if nats and nats["msgs_per_s"] == nats["msgs_per_s"] and nats["msgs_per_s"]:
                row[f"flow{h}_vs_nats"] = fr["msgs_per_s"] / nats["msgs_per_s"]
        out.append(row)
    return out


def print_tables(result: dict[str, Any]) -> None:
    runs = result["runs"]
    say("\nThroughput: every run (delivered at the receiver)")
    say(common.table(runs, [
        ("kind", "kind", "<s"), ("routers", "routers", ">d"), ("payload", "payload", ">d"),
        ("msgs_per_s", "msg/s", ">,.0f"), ("mb_per_s", "MB/s", ">.1f"),
        ("sent", "sent", ">d"), ("delivered", "delivered", ">d"), ("loss", "loss", ">.1%"),
        ("busiest_router_us_per_msg", "router CPU us/msg", ">.1f"),
        ("sender_us_per_msg", "sender us/msg", ">.1f"),
        ("receiver_us_per_msg", "recv us/msg", ">.1f"),
        ("runq_wait_share", "runq wait", ">.0%")]))
    drops = [(r["routers"], r["payload"], r["drops"]) for r in runs if r.get("drops")]
    for h, size, d in drops:
        say(f"  drops with {h} router(s), {size} B: "
            + ", ".join(f"{k}={v}" for k, v in sorted(d.items())))
    hops = result["params"]["routers"]
    cols: list[tuple[str, str, str]] = [("payload", "payload", ">d"),
                                        ("raw_mb_per_s", "raw MB/s", ">.1f")]
    for h in hops:
        cols += [(f"flow{h}_mb_per_s", f"{h}r MB/s", ">.1f"),
                 (f"flow{h}_vs_raw", f"{h}r/raw", ">.2f")]
    if any("nats_msgs_per_s" in r for r in result["summary"]):
        cols += [("nats_msgs_per_s", "NATS msg/s", ">,.0f")]
        cols += [(f"flow{h}_vs_nats", f"{h}r/NATS msg/s", ">.2f") for h in hops]
    say("\nThroughput summary: ratios (MB/s against raw TCP, msg/s against NATS)")
    say(common.table(result["summary"], cols))
    cap: list[tuple[str, str, str]] = [("payload", "payload", ">d")]
    cap += [(f"flow{h}_router_capacity", f"router msg/CPU-s ({h}r run)", ">,.0f") for h in hops]
    cap += [("nats_server_capacity", "nats-server msg/CPU-s", ">,.0f")]
    say("\nPer-hop capacity: messages one process forwards per CPU-second (busiest on path)")
    say(common.table(result["summary"], cap))
    if result.get("nats_skipped"):
        say(f"NATS: {result['nats_skipped']}")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    hops = args.routers
    result: dict[str, Any] = {
        "benchmark": "throughput", "machine": common.machine_info(), "quick": args.quick,
        "params": {"sizes": sizes, "routers": hops, "duration_s": args.duration,
                   "idle_s": args.idle, "max_count": args.max_count},
        "runs": [],
    }
    nats_why = common.nats_unavailable() if args.with_nats else "not requested (--with-nats)"
    if nats_why:
        result["nats_skipped"] = nats_why
        if args.with_nats:
            say(f"throughput: {nats_why}")
    async with common.log_directory(args.keep_logs) as logs:
        if args.keep_logs:
            say(f"throughput: logs in {logs}")
        async with RouterChain(max(hops), logs) as chain:
            cluster_cm = common.NatsCluster(logs) if not nats_why else None
            cluster = await cluster_cm.__aenter__() if cluster_cm else None
            try:
                local = 1
                for size in sizes:
                    say(f"throughput: {size} B: raw TCP ...")
                    result["runs"].append(await run_raw(size, args, logs))
                    for h in hops:
                        say(f"throughput: {size} B: {h} router(s) ...")
                        result["runs"].append(await run_flow(chain, h, size, args, logs,
                                                             local))
                        local += 1
                    if cluster is not None:
                        say(f"throughput: {size} B: NATS cluster ...")
                        result["runs"].append(await run_nats(cluster, size, args, logs,
                                                             local))
                        local += 1
            finally:
                if cluster_cm is not None:
                    await cluster_cm.__aexit__(None, None, None)
    result["summary"] = summarize(result["runs"], sizes, hops)
    result["machine"]["loadavg_end"] = common.load_average()
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python3 benchmarks/throughput.py --with-nats --out /tmp/tp.json")
    p.add_argument("--quick", action="store_true",
                   help="payloads 1 KB and 64 KB, 0.3 s windows (a smoke test)")
    p.add_argument("--sizes", type=int, nargs="+", help="payload sizes in bytes "
                   f"(default {' '.join(map(str, DEFAULT_SIZES))})")
    p.add_argument("--routers", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3],
                   help="routers on the path (default 1 2 3)")
    p.add_argument("--duration", type=float, help="seconds each sender sends (default 3, "
                   "quick 0.3)")
    p.add_argument("--idle", type=float, help="a receiver ends after this long with nothing "
                   "new (default 1, quick 0.4)")
    p.add_argument("--max-count", type=int, default=20_000_000,
                   help="most messages one sender sends (default 20000000)")
    p.add_argument("--with-nats", action="store_true",
                   help="also measure a 3-node NATS cluster (needs nats-server and nats-py; "
                        "skipped with a message otherwise)")
    common.add_output_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return common.run_benchmark(build_parser().parse_args(argv), main_async, print_tables,
                                duration=(0.3, 3.0), idle=(0.4, 1.0))


if __name__ == "__main__":
    sys.exit(main())
