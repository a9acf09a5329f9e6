#!/usr/bin/env python3
"""Memory per flow entry: the core's tables and the forwarding engine's mirror together.

The router and its entries are flowtable.py's (a transit router: link 1 toward the core,
link 2 an application; every flow joined by the application on one band, ``--build join``
through ``Router.receive`` or ``direct``). Then a :class:`~flowrouter.core.fastpath.FastPath`
with the compiled engine (``--engine twin`` for the Python twin) gets one data frame per
flow from upstream, in 64 KiB reads as the runtime hands them over, which mirrors every
flow as traffic would. ``tracemalloc`` counts both: the engine allocates with
``PyMem_Malloc``/``PyMem_Calloc``, which it traces like any Python object, so the engine's
bytes are the traced growth while the mirror fills.

    python3 benchmarks/flowmem.py --flows 1000000

``--quick`` is a seconds-long smoke run (10^4 flows); ``--flows`` still overrides it.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import flowtable  # noqa: E402

from flowrouter.core.fastpath import FastPath, new_engine  # noqa: E402
from flowrouter.wire.header import pack_header  # noqa: E402


def measure(n: int, build: str, engine: str) -> dict[str, Any]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    r = flowtable.make_router(n)
    made = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    (flowtable.build_join if build == "join" else flowtable.build_direct)(r, n)
    built = time.perf_counter() - t0
    gc.collect()
    core = tracemalloc.get_traced_memory()[0] - made
    fast = FastPath(r, new_engine(engine))
    payload = b"p" * 16
    tail = pack_header(b"\0" * 16, len(payload), flowtable.BAND)[16:] + payload
    per_read = 65536 // len(tail + bytes(16))
    mirrored = 0
    before = tracemalloc.get_traced_memory()[0]
    for at in range(0, n, per_read):
        data = b"".join(flowtable.flow_key(i) + tail for i in range(at, min(n, at + per_read)))
        pos, _stop, _outs = fast.forward(flowtable.UP, data, 0, 65536)
        assert pos == len(data), "the engine stopped before the end of a read"
        mirrored += min(n, at + per_read) - at
    gc.collect()
    mirror = tracemalloc.get_traced_memory()[0] - before
    flows, _links = fast.engine.sizes()
    tracemalloc.stop()
    assert flows == n, (flows, n)
    return {"flows": n, "build": build, "engine": engine, "build_s": built,
            "core_bytes_per_flow": core / n, "engine_bytes_per_flow": mirror / n,
            "total_bytes_per_flow": (core + mirror) / n,
            "router_fixed_bytes": made - base}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=int, nargs="+",
                    help="table sizes (default: 100000 1000000, or 10000 with --quick)")
    ap.add_argument("--build", choices=("join", "direct"), default="direct")
    ap.add_argument("--engine", choices=("native", "twin"), default="native")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 10^4 flows, a second or two")
    ap.add_argument("--out", help="write the JSON result here")
    args = ap.parse_args()
    if not args.flows:
        args.flows = [10_000] if args.quick else [100_000, 1_000_000]
    rows = [measure(n, args.build, args.engine) for n in args.flows]
    common.say(common.table(rows, [
        ("flows", "flows", ">,d"), ("engine", "engine", "<"),
        ("core_bytes_per_flow", "core B/flow", ">.0f"),
        ("engine_bytes_per_flow", "engine B/flow", ">.0f"),
        ("total_bytes_per_flow", "total B/flow", ">.0f")]))
    result = {"machine": common.machine_info(), "command": " ".join(sys.argv),
              "quick": args.quick, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
