#!/usr/bin/env python3
"""Churn: join/leave disturbance under streaming load (seed 004's membership-change cost).

Seed 004 (Isis) saw about 20 ms of disturbance to a streaming group of 3-4 members per
membership change. Set-up here: routers r1 - r2 - r3 (each its own process; r3 the core). A
sender on r1 streams fixed-size messages at ``--rate`` per second on one flow; ``--members``
steady receivers (spread over r1, r2, r3) listen; a *churner* client on r2 (or r3) joins the
flow (a new listener) and leaves it again every ``--period`` seconds, ``--changes`` times.
All clients are flowlib clients in this one process, so send and receive times share a clock.

Disturbance per membership change: at each steady receiver, the largest gap between
consecutive arrivals in the ``--window`` after the change, minus the median gap of the whole
run (the stream's own spacing); and the worst one-way latency in that window minus the
median latency. Reported: median, p90 and max over all changes and receivers, next to the
same figures taken at random instants away from any change (the noise floor of this shared
machine), plus messages lost.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import RouterChain, say  # noqa: E402

import flowlib  # noqa: E402

STAMP = struct.Struct("!Id")  # sequence number, send time (perf_counter)


async def stream(client: flowlib.FlowClient, flow: flowlib.FlowID, rate: float, size: int,
                 stop: asyncio.Event, sent: list[int]) -> None:
    """Send at *rate* per second (paced by the clock, not by sleep accuracy)."""
    t0 = time.perf_counter()
    seq = 0
    pad = bytes(max(0, size - STAMP.size))
    while not stop.is_set():
        due = t0 + seq / rate
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        await client.send(flow, STAMP.pack(seq, time.perf_counter()) + pad, band=32)
        seq += 1
        sent[0] = seq


async def receive(listener: flowlib.Listener, log: list[tuple[float, float, int]]) -> None:
    async for msg in listener:
        if len(msg.payload) >= STAMP.size:
            seq, t_sent = STAMP.unpack_from(msg.payload)
            log.append((time.perf_counter(), t_sent, seq))


def disturbance(log: list[tuple[float, float, int]], instants: list[float], window: float
                ) -> list[dict[str, float]]:
    """Per instant: (largest arrival gap in the window - median gap), (worst latency in the
    window - median latency), in milliseconds."""
    if len(log) < 3:
        return []
    arr = [a for a, _, _ in log]
    gaps = [b - a for a, b in zip(arr, arr[1:])]
    med_gap = statistics.median(gaps)
    med_lat = statistics.median(a - s for a, s, _ in log)
    out = []
    for t in instants:
        idx = [i for i, a in enumerate(arr) if t <= a <= t + window]
        if len(idx) < 2:
            continue
        lo, hi = idx[0], idx[-1]
        gap = max(arr[i + 1] - arr[i] for i in range(max(lo - 1, 0), min(hi, len(arr) - 1)))
        lat = max(log[i][0] - log[i][1] for i in idx)
        out.append({"gap_ms": (gap - med_gap) * 1e3, "latency_ms": (lat - med_lat) * 1e3})
    return out


def summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p90": None, "max": None}
    v = sorted(values)
    return {"median": statistics.median(v), "p90": common.percentile(v, 0.90), "max": v[-1]}


async def run(chain: RouterChain, args: argparse.Namespace) -> dict[str, Any]:
    n = chain.n
    clients: list[flowlib.FlowClient] = []
    try:
        sender = await flowlib.connect(chain.listen[0], name="churn-sender")
        clients.append(sender)
        flow = await sender.create()
        await sender.advertise(flow)
        logs: list[list[tuple[float, float, int]]] = []
        tasks = []
        for i in range(args.members):
            c = await flowlib.connect(chain.listen[i % n], name=f"churn-member-{i}")
            clients.append(c)
            lst = await c.listen(flow, 32, size=1 << 16)
            log: list[tuple[float, float, int]] = []
            logs.append(log)
            tasks.append(asyncio.ensure_future(receive(lst, log)))
        churner = await flowlib.connect(chain.listen[min(1, n - 1)], name="churn-churner")
        clients.append(churner)
        stop = asyncio.Event()
        sent = [0]
        tx = asyncio.ensure_future(stream(sender, flow, args.rate, args.payload, stop, sent))
        await asyncio.sleep(args.settle)
        changes: list[dict[str, Any]] = []
        for _ in range(args.changes):
            t = time.perf_counter()
            lst = await churner.listen(flow, 32)
            changes.append({"kind": "join", "t": t, "ack_ms": (time.perf_counter() - t) * 1e3})
            await asyncio.sleep(args.period)
            t = time.perf_counter()
            await churner.unlisten(lst)
            changes.append({"kind": "leave", "t": t, "ack_ms": (time.perf_counter() - t) * 1e3})
            await asyncio.sleep(args.period)
        stop.set()
        await tx
        await asyncio.sleep(0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    instants = [c["t"] for c in changes]
    rng = random.Random(1)
    t_first, t_last = instants[0], instants[-1] + args.period
    quiet: list[float] = []
    for _ in range(100 * len(instants)):  # random instants at least a window from any change
        if len(quiet) >= len(instants) or t_last - t_first <= 2 * args.window:
            break
        x = rng.uniform(t_first, t_last - args.window)
        if all(abs(x - c) > args.window for c in instants):
            quiet.append(x)
    dist = [d for log in logs for d in disturbance(log, instants, args.window)]
    noise = [d for log in logs for d in disturbance(log, quiet, args.window)]
    received = [len({s for _, _, s in log}) for log in logs]
    return {"members": args.members, "rate": args.rate, "changes": len(changes),
            "sent": sent[0], "received_per_member": received,
            "lost_per_member": [sent[0] - r for r in received],
            "gap_ms": summary([d["gap_ms"] for d in dist]),
            "latency_ms": summary([d["latency_ms"] for d in dist]),
            "noise_gap_ms": summary([d["gap_ms"] for d in noise]),
            "noise_latency_ms": summary([d["latency_ms"] for d in noise]),
            "join_ack_ms": summary([c["ack_ms"] for c in changes if c["kind"] == "join"]),
            "leave_ms": summary([c["ack_ms"] for c in changes if c["kind"] == "leave"])}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "churn", "machine": common.machine_info(),
                              "quick": args.quick, "params": vars(args).copy()}
    async with common.log_directory(args.keep_logs) as logs:
        async with RouterChain(3, logs) as chain:
            say(f"churn: {args.members} members, {args.rate:g} msg/s, {args.changes} "
                "join+leave pairs ...")
            result["run"] = await run(chain, args)
    result["machine"]["loadavg_end"] = common.load_average()
    return result


def print_result(result: dict[str, Any]) -> None:
    r = result["run"]

    def f(s: dict[str, float | None]) -> str:
        return " / ".join("-" if x is None else f"{x:.1f}" for x in
                          (s["median"], s["p90"], s["max"]))

    say(f"\nChurn: {r['members']} steady members, {r['rate']:g} msg/s, {r['changes']} "
        "membership changes (median / p90 / max, ms)")
    say(f"  extra arrival gap after a change: {f(r['gap_ms'])}   (quiet instants: "
        f"{f(r['noise_gap_ms'])})")
    say(f"  extra latency after a change:     {f(r['latency_ms'])}   (quiet instants: "
        f"{f(r['noise_latency_ms'])})")
    say(f"  join acknowledged in {f(r['join_ack_ms'])}; leave settled in {f(r['leave_ms'])}")
    say(f"  sent {r['sent']}, lost per member {r['lost_per_member']}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 changes, short (smoke test)")
    p.add_argument("--members", type=int, default=3, help="steady receivers (default 3)")
    p.add_argument("--rate", type=float, default=200.0, help="messages/s streamed")
    p.add_argument("--payload", type=int, default=256)
    p.add_argument("--changes", type=int, help="join+leave pairs (default 40, quick 2)")
    p.add_argument("--period", type=float, default=0.5, help="seconds between changes")
    p.add_argument("--window", type=float, default=0.2,
                   help="seconds after a change searched for disturbance")
    p.add_argument("--settle", type=float, default=1.0)
    common.add_output_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return common.run_benchmark(build_parser().parse_args(argv), main_async, print_result,
                                changes=(2, 40))


if __name__ == "__main__":
    sys.exit(main())
