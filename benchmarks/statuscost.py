#!/usr/bin/env python3
"""How long a router's loop is blocked building its status, by view, as the flow table grows.

Every status document is built on the router's event loop, so while it is built nothing is
forwarded. This times what each kind of caller costs a router that holds N flows:

* ``every row``: ``flowrouter status`` without a limit (and ``/status``), all N flow rows;
* ``limit 20``: ``--limit 20`` unsorted, and sorted by ``bytes`` and by ``members``
  (``flowrouter.net.flowviews`` picks the 20 rows before rendering them);
* ``metrics``: the rows a Prometheus scrape renders (the 100 flows it names);
* ``probe``: the link rows a health probe reads (no flow rows);
* ``sliced``: every row again as the control port makes it now (``status_view_sliced``,
  then ``slicedjson.pieces``, each piece encoded): the longest the loop waited for a turn
  meanwhile, and the whole time it took, beside ``json.dumps`` of the document at once;
  and the longest waits of ``limit 20`` by bytes, of a scrape's picking, of every row
  sorted by ``flow`` and of every row sorted by ``-bytes`` with a limit of the table's
  size, made so.

The router and its entries are flowtable.py's (``build_direct``: one application link holds
every flow), with the compiled engine's mirror beside it for the flows' counters. The node
is a stand-in with the things a view reads (``core``, ``fast``, ``now``, ``status``,
``flow_rows``), so no socket is involved; the sliced views run on an event loop of their
own beside a task that notes how long each of its turns waited.

    python3 benchmarks/statuscost.py --flows 100000 1000000

``--quick`` is a smoke run (10^4 flows); ``--flows`` overrides it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import flowtable  # noqa: E402

from flowrouter.core.fastpath import FastPath, new_engine  # noqa: E402
from flowrouter.core.router import Router  # noqa: E402
from flowrouter.net import flowviews, slicedjson  # noqa: E402

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

    def flow_rows(self, keys: list[bytes] | None = None) -> list[dict[str, Any]]:
        return self.core.flow_rows(keys)


def _seconds(call: Callable[[], object]) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def _longest_wait(work: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(the longest a ticker beside *work* waited for a turn of the loop, the time *work*
    took), in seconds."""
    async def run() -> tuple[float, float]:
        longest, done = 0.0, False

        async def ticker() -> None:
            nonlocal longest
            last = time.perf_counter()
            while not done:
                await asyncio.sleep(0)
                now = time.perf_counter()
                longest, last = max(longest, now - last), now
        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        t = time.perf_counter()
        await work()
        total = time.perf_counter() - t
        done = True
        await ticking
        return longest, total
    return asyncio.run(run())


def _sliced(node: Node) -> dict[str, float]:
    """Every row as the control port gives it: the longest wait for a turn and the time it
    all took; json.dumps of the document at once; the longest waits of a sorted view and of
    a scrape's picking, as the control port and /metrics make them."""
    def control(sort: str | None, limit: int | None) -> Callable[[], Awaitable[None]]:
        async def reply() -> None:  # what the control port does for a status command
            with flowviews.collector_paused():
                doc = await flowviews.status_view_sliced(node, sort, limit)
                parts = await slicedjson.pieces({"ok": True, "status": doc}, consume=True)
                del doc
            for piece in parts:
                piece.encode()  # written piece by piece
                await asyncio.sleep(0)
        return reply
    longest, total = _longest_wait(control(None, None))
    doc = flowviews.status_view(node, None, None)
    return {"sliced_longest_s": longest, "sliced_total_s": total,
            "json_at_once_s": _seconds(lambda: json.dumps(doc)),
            "sliced_bytes_longest_s": _longest_wait(control("bytes", 20))[0],
            "sliced_metrics_longest_s": _longest_wait(
                lambda: flowviews.metric_flows_sliced(node, METRIC_FLOWS))[0],
            "sliced_by_flow_longest_s": _longest_wait(control("flow", None))[0],
            "sliced_bytes_all_longest_s": _longest_wait(
                control("-bytes", len(node.core.flows)))[0]}


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
        **_sliced(node),
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
        ("probe_s", "probe s", ">.4f"), ("json_at_once_s", "JSON s", ">.3f"),
        ("sliced_total_s", "sliced s", ">.3f"),
        ("sliced_longest_s", "longest wait s", ">.4f"),
        ("sliced_bytes_longest_s", "by bytes wait s", ">.4f"),
        ("sliced_metrics_longest_s", "metrics wait s", ">.4f"),
        ("sliced_by_flow_longest_s", "by flow wait s", ">.4f"),
        ("sliced_bytes_all_longest_s", "all by bytes wait s", ">.4f")]))
    result = {"machine": common.machine_info(), "command": " ".join(sys.argv),
              "quick": args.quick, "engine": args.engine, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
