"""A router in its own process with an event-loop probe, for stall tests.

``python -m tests.loopprobe SECONDS`` starts a loopback router (the core for LSID 0x10),
prints ``PORT <port>``, then measures for SECONDS the CPU time its event-loop thread spends
between two wake-ups of a 5 ms sleep (CPU time, not wall time: a loaded machine stretches
wall time, not the work one stall does), and prints one JSON line: the longest, the count,
and the router's counters. A fresh process, with the collector paused while it measures, so
nothing but the router's own work is counted.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time

from flowrouter.net.config import NodeConfig
from flowrouter.net.runtime import RouterNode


async def main(seconds: float) -> None:
    node = RouterNode(NodeConfig("probe", listen="127.0.0.1:0", http="off",
                                 core_lsids=frozenset({0x10}), default_lsid=0x10))
    await node.start()
    print("PORT", node.tcp_address[1], flush=True)
    gc.collect()
    gc.disable()
    cpu: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        c = time.thread_time()
        await asyncio.sleep(0.005)
        cpu.append(time.thread_time() - c)
    gc.enable()
    print(json.dumps({"max_cpu": max(cpu), "samples": len(cpu),
                      "counters": dict(node.core.counters)}), flush=True)
    await node.stop()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
