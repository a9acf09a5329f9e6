#!/usr/bin/env python3
"""How long a router's loop is blocked building its status, by view, as the flow table grows.

Every status document is built on the router's event loop, so while it is built nothing is
forwarded. This times what each kind of caller costs a router that holds N flows:

* ``every row``: ``flowrouter status`` without a limit (and ``/status``), all N flow rows;
* ``limit 20``: ``--limit 20`` unsorted, and sorted by ``bytes`` and by ``members``
  (``flowrouter.net.flowviews`` picks the 20 rows before rendering them);
* ``metrics``: the rows a Prometheus scrape renders (the 100 flows it names);
* ``probe``: the link rows a health probe reads (no flow rows).

The router and its entries are flowtable.py's (``build_direct``: one application link holds
every flow), with the compiled engine's mirror beside it for the flows' counters. The node
is a stand-in with the four things a view reads (``core``, ``fast``, ``now``, ``status``),
so no socket or event loop is involved.

    python3 benchmarks/statuscost.py --flows 100000 1000000

``--quick`` is a smoke run (10^4 flows); ``--flows`` overrides it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import flowtable  # noqa: E402

from flowrouter.core.fastpath import FastPath, new_engine  # noqa: E402
from flowrouter.core.router import Router  # noqa: E402
from flowrouter.net import flowviews  # noqa: E402

#: flows a Prometheus scrape names (flowrouter.net.observe.FLOW_METRICS)
METRIC_FLOWS = 100


class Node:
    """What a view reads of a router node (flowviews.Viewed), around a bare core."""

    def __init__(self, core: Router, fast: FastPath) -> None:
        self.core, self.fast = core, fast

    def now(self) -> float:
        return 0.0

    def status(self, flows: Iterable[bytes] | None = None) -> dict[str, Any]:
        return self.core.status(0.0, flows)


def _seconds(call: Callable[[], object]) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def measure(n: int, engine: str) -> dict[str, Any]:
    r = flowtable.make_router(n)
    flowtable.build_direct(r, n)
    node = Node(r, FastPath(r, new_engine(engine)))
    return {
        "flows": n,
        "every_row_s": _seconds(node.status),
        "limit20_s": _seconds(lambda: flowviews.status_view(node, None, 20)),
        "limit20_bytes_s": _seconds(lambda: flowviews.status_view(node, "bytes", 20)),
        "limit20_members_s": _seconds(lambda: flowviews.status_view(node, "members", 20)),
        "metrics_s": _seconds(lambda: node.status(flowviews.metric_flows(node, METRIC_FLOWS))),
        "probe_s": _seconds(lambda: r.status(0.0, ())),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=int, nargs="+",
                    help="table sizes (default: 100000 1000000, or 10000 with --quick)")
    ap.add_argument("--engine", choices=("native", "twin"), default="native",
                    help="the fast path's engine, whose mirror holds the flows' counters")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 10^4 flows")
    ap.add_argument("--out", help="write the JSON result here")
    args = ap.parse_args()
    if not args.flows:
        args.flows = [10_000] if args.quick else [100_000, 1_000_000]
    if any(n < 1 for n in args.flows):
        ap.error("--flows: each table size must be 1 or more")
    rows = [measure(n, args.engine) for n in args.flows]
    common.say(common.table(rows, [
        ("flows", "flows", ">,d"), ("every_row_s", "every row s", ">.3f"),
        ("limit20_s", "limit 20 s", ">.4f"), ("limit20_bytes_s", "by bytes s", ">.3f"),
        ("limit20_members_s", "by members s", ">.3f"), ("metrics_s", "metrics s", ">.3f"),
        ("probe_s", "probe s", ">.4f")]))
    result = {"machine": common.machine_info(), "command": " ".join(sys.argv),
              "quick": args.quick, "engine": args.engine, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
