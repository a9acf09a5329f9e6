"""Cost of tracing on the forwarding path: Router.receive with no tracer vs a TraceWriter.

One router, one flow with DOWNSTREAM receivers, N data frames fed straight into the sans-I/O
core (no sockets, so the tracer's share is not diluted by I/O). Rounds alternate between
the configurations so machine noise hits all of them alike; the best round of each is
compared. Prints a table and writes JSON with --out.

    python3 benchmarks/trace_overhead.py            # default sampling (1%) and 100%
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowrouter.core.router import Router, RouterParams  # noqa: E402
from flowrouter.core.traces import NULL_TRACER, TraceWriter  # noqa: E402
from flowrouter.wire import control as C  # noqa: E402
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID  # noqa: E402
from flowrouter.wire.header import pack_header  # noqa: E402

FLOW = FlowID(0xBEEF, 0x10, 1)


def build(tracer: object, downstream: int) -> Router:
    r = Router(RouterParams("bench", 1, core_lsids=frozenset({0x10})), 0.0,
               tracer=tracer)  # type: ignore[arg-type]
    for lid in range(1, downstream + 2):
        r.open_link(lid, 0.0)
        hello = C.Hello(100 + lid, C.Role.ENDPOINT, f"e{lid}", 65536).encode()
        r.receive(lid, pack_header(LINK_LOCAL_FLOW.key, len(hello), 0), hello, 0.0)
        if lid > 1:  # link 1 is the sender
            join = C.Join(lid, 1 << 40).encode()
            r.receive(lid, pack_header(FLOW.key, len(join), 0), join, 0.0)
    return r


def run_once(r: Router, frames: int, payload: bytes) -> float:
    hdr = memoryview(pack_header(FLOW.key, len(payload), 40))
    body = memoryview(payload)
    receive = r.receive
    t = time.perf_counter()
    for _ in range(frames):
        receive(1, hdr, body, 1.0)
    return (time.perf_counter() - t) / frames


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="tracing overhead on Router.receive")
    p.add_argument("--frames", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--downstream", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="20,000 frames, 3 rounds")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.quick:
        args.frames, args.rounds = 20_000, 3
    payload = b"x" * 1024
    with tempfile.TemporaryDirectory() as tmp:
        configs = {
            "no tracer": NULL_TRACER,
            "TraceWriter, 1% sampled (default)": TraceWriter(tmp + "/a/", "bench",
                                                             sample_rate=0.01),
            "TraceWriter, every decision": TraceWriter(tmp + "/b/", "bench", sample_rate=1.0),
        }
        routers = {name: build(tr, args.downstream) for name, tr in configs.items()}
        best = {name: float("inf") for name in configs}
        for _ in range(args.rounds):
            for name, r in routers.items():
                best[name] = min(best[name], run_once(r, args.frames, payload))
        for tr in configs.values():
            tr.close()  # type: ignore[attr-defined]
    base = best["no tracer"]
    rows = [{"config": n, "us_per_frame": round(v * 1e6, 3),
             "overhead": round(v / base - 1, 4)} for n, v in best.items()]
    print(f"Router.receive of a 1 KB data frame to {args.downstream} receivers "
          f"({args.frames:,} frames, best of {args.rounds} interleaved rounds)")
    for row in rows:
        print(f"  {row['config']:<36} {row['us_per_frame']:7.3f} us/frame  "
              f"{row['overhead']:+.1%}")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "frames": args.frames,
                                              "rounds": args.rounds}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
