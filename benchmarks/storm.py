#!/usr/bin/env python3
"""Storm: many senders into one receiver (seed 004's "storm" of concurrent senders).

Set-up: routers r1 - r2 - r3 (each its own process; r3 the core). One receiver on r3 listens
on a flow; N senders (flowlib clients spread round-robin over r1, r2, r3) all send to that
flow at once, as fast as flowlib lets each of them, for ``--duration`` seconds. All clients
live in this one process (a shared event loop: the figures are for the whole set-up on this
machine, not the routers alone).

Reported per N: messages delivered to the receiver per second, delivered / sent, the least
and most of its own messages any one sender got through (fairness), the
receiver's own overflow drops and the routers' ``drop.*`` counters.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import RouterChain, say  # noqa: E402

import flowlib  # noqa: E402

STAMP = struct.Struct("!HI")  # sender index, sequence number
DEFAULT_COUNTS = [1, 4, 16, 64]
QUICK_COUNTS = [1, 4]


async def one_storm(chain: RouterChain, senders: int, args: argparse.Namespace
                    ) -> dict[str, Any]:
    n = chain.n
    clients: list[flowlib.FlowClient] = []
    got: Counter[int] = Counter()
    first_last = [0.0, 0.0]
    try:
        rx = await flowlib.connect(chain.listen[n - 1], name="storm-rx")
        clients.append(rx)
        flow = await rx.create()
        lst = await rx.listen(flow, 32, size=1 << 16)

        async def receive() -> None:
            async for msg in lst:
                now = time.perf_counter()
                if not got:
                    first_last[0] = now
                first_last[1] = now
                got[STAMP.unpack_from(msg.payload)[0]] += 1

        rx_task = asyncio.ensure_future(receive())
        txs = []
        for i in range(senders):
            c = await flowlib.connect(chain.listen[i % n], name=f"storm-tx-{i}")
            clients.append(c)
            await c.advertise(flow)
            txs.append(c)
        sent: Counter[int] = Counter()
        pad = bytes(max(0, args.payload - STAMP.size))
        before = await chain.counters()
        deadline = time.perf_counter() + args.duration

        async def send(i: int, c: flowlib.FlowClient) -> None:
            seq = 0
            while time.perf_counter() < deadline:
                await c.send(flow, STAMP.pack(i, seq) + pad, band=32)
                seq += 1
                if seq % 64 == 0:
                    await asyncio.sleep(0)  # let the others (and the receiver) run
            sent[i] = seq

        await asyncio.gather(*(send(i, c) for i, c in enumerate(txs)))
        # wait until nothing has arrived for a while (the routers drain their queues)
        last = -1
        while sum(got.values()) != last:
            last = sum(got.values())
            await asyncio.sleep(args.idle)
        rx_task.cancel()
        await asyncio.gather(rx_task, return_exceptions=True)
        after = await chain.counters()
        drops = common.counter_delta(before, after, "drop.")
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    total_sent = sum(sent.values())
    total_got = sum(got.values())
    span = first_last[1] - first_last[0]
    shares = [got[i] / sent[i] if sent[i] else 0.0 for i in range(senders)]
    return {"senders": senders, "sent": total_sent, "delivered": total_got,
            "ratio": total_got / total_sent if total_sent else 0.0,
            "msgs_per_s": total_got / span if span > 0 else 0.0,
            "min_sender_ratio": min(shares), "max_sender_ratio": max(shares),
            "router_drops": drops}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "storm", "machine": common.machine_info(),
                              "quick": args.quick, "params": vars(args).copy(), "runs": []}
    async with common.log_directory(args.keep_logs) as logs:
        async with RouterChain(3, logs) as chain:
            for k in args.senders:
                say(f"storm: {k} sender(s) ...")
                result["runs"].append(await one_storm(chain, k, args))
    result["machine"]["loadavg_end"] = common.load_average()
    return result


def print_result(result: dict[str, Any]) -> None:
    say("\nStorm: N senders into one receiver")
    say(common.table(result["runs"], [
        ("senders", "senders", ">d"), ("sent", "sent", ">d"), ("delivered", "delivered", ">d"),
        ("ratio", "ratio", ">.3f"), ("msgs_per_s", "msg/s at rx", ">.0f"),
        ("min_sender_ratio", "worst sender", ">.3f"),
        ("max_sender_ratio", "best sender", ">.3f")]))
    for r in result["runs"]:
        if r["router_drops"]:
            say(f"  {r['senders']} senders: router drops {r['router_drops']}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 and 4 senders, 1 s (smoke test)")
    p.add_argument("--senders", type=int, nargs="+", help=f"default {DEFAULT_COUNTS}")
    p.add_argument("--duration", type=float, help="seconds of sending (default 5, quick 1)")
    p.add_argument("--payload", type=int, default=256)
    p.add_argument("--idle", type=float, default=0.5,
                   help="the run ends when nothing arrived for this long")
    common.add_output_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return common.run_benchmark(build_parser().parse_args(argv), main_async, print_result,
                                senders=(QUICK_COUNTS, DEFAULT_COUNTS), duration=(1.0, 5.0))


if __name__ == "__main__":
    sys.exit(main())
