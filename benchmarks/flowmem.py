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

``--forward 16 1024``: then, with every flow mirrored, the engine's CPU time per frame
forwarding reads that cycle over all the flows (one frame each, as ``bulk.py --flows``'s
publisher sends) against reads of one flow, per payload size: the lookup cost of a large
table, taken in CPU time of this thread (``thread_time``), which load from elsewhere on
the machine moves far less than a rate.

``--mixed`` adds reads whose frames vary in size, which the compiled engine's look-ahead
must walk (it computes where frames start while they are all of one size).

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

#: ``--mixed``: payload sizes taken in turn, so that no two neighbouring frames match
MIXED = (16, 24, 40, 16, 100)


def _forward_ns(fast: FastPath, keys: list[bytes], size: int | tuple[int, ...],
                frames: int, read: int = 65536, in_place: bool = False) -> float:
    """CPU ns per frame forwarding *frames* frames cycling over *keys*, in reads of *read*
    bytes (the second of two passes: the first may still fill caches); *size*, or the sizes
    of a tuple in turn. *in_place*: each read is a bytearray forwarded in place, as the
    runtime forwards its receive buffer (its frames' headers rewritten where they lie)."""
    sizes = size if isinstance(size, tuple) else (size,)
    tails = [pack_header(b"\0" * 16, n, flowtable.BAND)[16:] + b"p" * n for n in sizes]
    per_read = max(1, read // (sum(map(len, tails)) // len(tails) + 16))
    reads = [(bytearray if in_place else bytes)(b"".join(
        keys[i % len(keys)] + tails[i % len(tails)]
        for i in range(at, min(frames, at + per_read))))
        for at in range(0, frames, per_read)]
    took = 0.0
    for _ in range(2):
        t0 = time.thread_time()
        for data in reads:
            pos, _stop, _outs = fast.forward(flowtable.UP, data, 0, 65536, in_place=in_place)
            assert pos == len(data), "the engine stopped before the end of a read"
        took = time.thread_time() - t0
    return took / frames * 1e9


def measure(n: int, build: str, engine: str, sizes: list[int | tuple[int, ...]] | None = None,
            read: int = 65536, in_place: bool = False) -> dict[str, Any]:
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
    row = {"flows": n, "build": build, "engine": engine, "build_s": built,
           "core_bytes_per_flow": core / n, "engine_bytes_per_flow": mirror / n,
           "total_bytes_per_flow": (core + mirror) / n,
           "router_fixed_bytes": made - base}
    if sizes:
        keys = [flowtable.flow_key(i) for i in range(n)]
        frames = max(n, 200_000)
        row["forward_ns_per_frame"] = {"mixed" if isinstance(size, tuple) else str(size): {
            "all_flows": _forward_ns(fast, keys, size, frames, read, in_place),
            "one_flow": _forward_ns(fast, keys[:1], size, frames, read, in_place)}
            for size in sizes}
        row["forward_read"] = {"bytes": read, "in_place": in_place}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=int, nargs="+",
                    help="table sizes (default: 100000 1000000, or 10000 with --quick)")
    ap.add_argument("--build", choices=("join", "direct"), default="direct")
    ap.add_argument("--engine", choices=("native", "twin"), default="native")
    ap.add_argument("--forward", type=int, nargs="*", metavar="SIZE",
                    help="also time the engine forwarding reads that cycle over every flow "
                         "against reads of one flow, per payload size (default 16 1024)")
    ap.add_argument("--mixed", action="store_true",
                    help="with --forward, also reads whose frames' payloads vary "
                         f"({', '.join(map(str, MIXED))} B in turn), which the compiled "
                         "engine's look-ahead walks instead of computing where frames start")
    ap.add_argument("--read", type=int, default=65536, metavar="BYTES",
                    help="with --forward, bytes a read (default 65536; a router under load "
                         "reads up to its read_buffer, 1 MiB)")
    ap.add_argument("--in-place", action="store_true",
                    help="with --forward, forward each read in place (a bytearray), as a "
                         "router forwards its receive buffer, not into new output bytes")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 10^4 flows, a second or two")
    ap.add_argument("--out", help="write the JSON result here")
    args = ap.parse_args()
    if not args.flows:
        args.flows = [10_000] if args.quick else [100_000, 1_000_000]
    sizes: list[int | tuple[int, ...]] | None = None
    if args.forward is not None:
        sizes = [*(args.forward or [16, 1024]), *([MIXED] if args.mixed else [])]
    if args.read < 64:
        ap.error(f"--read {args.read}: a read must hold a frame (64 bytes or more)")
    rows = [measure(n, args.build, args.engine, sizes, args.read, args.in_place)
            for n in args.flows]
    common.say(common.table(rows, [
        ("flows", "flows", ">,d"), ("engine", "engine", "<"),
        ("core_bytes_per_flow", "core B/flow", ">.0f"),
        ("engine_bytes_per_flow", "engine B/flow", ">.0f"),
        ("total_bytes_per_flow", "total B/flow", ">.0f")]))
    for row in rows:
        for size, ns in row.get("forward_ns_per_frame", {}).items():
            common.say(f"  {row['flows']:,} flows, {size}{'' if size == 'mixed' else ' B'}: "
                       "the engine forwards "
                       f"{ns['all_flows']:.0f} ns/frame cycling over all of them, "
                       f"{ns['one_flow']:.0f} ns/frame for one flow")
    result = {"machine": common.machine_info(), "command": " ".join(sys.argv),
              "quick": args.quick, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
