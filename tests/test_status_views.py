"""Views of a large flow table render only the rows they show.

A flow's status row costs about 11 us of the router's loop: a status document took 1.1 s to
build with 10^5 flows and 11.7 s with 10^6, forwarding nothing meanwhile, and every
``flowrouter status --limit 20``, ``/status?limit=`` page, Prometheus scrape and health
probe paid it (the probe for its link rows alone). A view now picks its rows first
(:mod:`flowrouter.net.flowviews`). What it shows must be exactly what sorting every row
showed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

import flowlib
from flowrouter.core import router as core_router
from flowrouter.monitor import render_metrics, start_monitor
from flowrouter.net import flowviews, listviews, observe, slicedjson
from flowrouter.net.config import NodeConfig
from flowrouter.net.observe import FLOW_METRICS, router_health, router_source
from flowrouter.net.runtime import RouterNode, query_control
from flowrouter.tools.cli import TABLE_ROWS

from .rawep import run, until, within
from .test_monitor import get

FLOWS = 3 * FLOW_METRICS
#: the flows with members, which are the router's entries (more than the Prometheus page
#: names)
JOINED = sum(1 for i in range(FLOWS) if i % 3 or i % 5 == 0)
assert max(2 * FLOW_METRICS, TABLE_ROWS) < JOINED


@contextlib.asynccontextmanager
async def _busy_router() -> AsyncIterator[RouterNode]:
    """One router, FLOWS flows with 0, 1 or 2 members and 0-4 messages on each that has
    members; stopped, with its applications, after."""
    node = RouterNode(NodeConfig("views", listen="127.0.0.1:0", control="127.0.0.1:0",
                                 core_lsids=frozenset({0x10}), default_lsid=0x10))
    await node.start()
    addr = ["%s:%d" % node.tcp_address]
    apps: list[Any] = []
    try:
        for name in ("tx", "rx1", "rx2"):
            apps.append(await within(flowlib.connect(addr, name=name)))
        await _load(node, *apps)
        yield node
    finally:
        for app in apps:
            await app.close()
        await node.stop()


async def _load(node: RouterNode, tx: Any, rx1: Any, rx2: Any) -> None:
    flows = [await tx.create() for _ in range(FLOWS)]
    for i, f in enumerate(flows):
        if i % 3:
            await rx1.listen(f, "data")
        if i % 5 == 0:
            await rx2.listen(f, "data")
    sent = 0
    for i, f in enumerate(flows):
        if i % 3 == 0 and i % 5:  # no members: frames a router drops at the sender's side
            continue
        for _ in range(i % 5):
            await tx.send(f, bytes(10 + i))
            sent += 1
    await tx.flush()

    def counted() -> bool:
        return sum(r["frames"] for r in node.status()["flows"]) >= sent
    await until(counted, what="every message counted in the flows' rows")


class _Rows:
    """Counts the flow rows the core renders (each names its flow once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = core_router.flow_text

        def counting(key: bytes) -> str:
            self.n += 1
            return real(key)
        monkeypatch.setattr(core_router, "flow_text", counting)

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


@pytest.mark.parametrize("slices", [None, (7, 4, 13)], ids=["as-shipped", "small-slices"])
def test_a_view_shows_what_sorting_every_row_shows(
        monkeypatch: pytest.MonkeyPatch, slices: tuple[int, int, int] | None) -> None:
    """Read and rendered in slices or not, a view is the full document sorted and cut
    (small slices: the best rows kept as the entries are read up to 28 rows, every entry
    kept and sorted at the end past that, rows rendered 13 at a time)."""
    if slices is not None:
        for name, value in zip(("PICK_SLICE", "PICK_RUNS", "ROWS_SLICE"), slices,
                               strict=True):
            monkeypatch.setattr(flowviews, name, value)

    async def go() -> None:
        async with _busy_router() as node:
            now = node.now()
            monkeypatch.setattr(node, "now", lambda: now)  # ages alike in both documents
            full = node.status()
            assert full["flow_count"] == JOINED
            fields = listviews.SORTABLE["flows"]
            for sort in (None, *fields, *(f"-{f}" for f in fields)):
                for limit in (None, 0, 1, 7, 28, 29, FLOW_METRICS, JOINED, JOINED + 5):
                    # the full document again: the sliced views let the loop run, and
                    # its links (rx, round trips) move on
                    want = listviews.apply(node.status(), sort, limit)
                    at_once = node.status_view(sort, limit)
                    assert at_once["links"] == want["links"], (sort, limit)
                    for got in (at_once, await node.status_view_sliced(sort, limit)):
                        assert got["flows"] == want["flows"], (sort, limit)
                        assert got.get("flows_total") == want.get("flows_total"), (sort,
                                                                                 limit)
            with pytest.raises(listviews.ViewError, match="cannot sort by"):
                node.status_view("nonsense", 3)

    run(go())


def _named(metrics: str) -> set[str]:
    """The flows with a members series on a Prometheus page."""
    return {line.split('flow="')[1].split('"')[0] for line in metrics.splitlines()
            if line.startswith("flownet_router_flow_members{")}


def test_limited_views_scrapes_and_probes_render_only_what_they_show(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        async with _busy_router() as node:
            rows = _Rows(monkeypatch)
            ctl = "%s:%d" % node.control_address
            st = (await query_control(ctl, "status", sort="bytes", limit=5))["status"]
            assert len(st["flows"]) == 5 and st["flows_total"] == JOINED
            assert rows.take() == 5
            st = (await query_control(ctl, "status", limit=3))["status"]
            assert len(st["flows"]) == 3 and rows.take() == 3
            assert router_health(node)[0] is True and rows.take() == 0
            metrics = render_metrics(router_source(node)).decode()
            assert rows.take() <= 2 * FLOW_METRICS < JOINED
            full = node.status()
            assert rows.take() == JOINED  # asked for every row: every row
            top = listviews.view(full["flows"], "members", FLOW_METRICS)
            assert _named(metrics) == {r["flow"] for r in top}
            assert f"flownet_router_flows {float(JOINED)}" in metrics

    run(go())


def test_the_cli_asks_for_no_more_rows_than_its_tables_show(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        async with _busy_router() as node:
            rows = _Rows(monkeypatch)
            ctl = "%s:%d" % node.control_address

            def cli(*extra: str) -> str:
                out = subprocess.run([sys.executable, "-m", "flowrouter.tools.cli", "status",
                                      "--control", ctl, *extra], capture_output=True,
                                     text=True, check=False, timeout=60)
                assert out.returncode == 0, out.stderr
                return out.stdout

            shown = await asyncio.to_thread(cli)
            assert f"({TABLE_ROWS} of {JOINED} flows)" in shown, shown[-2000:]
            assert rows.take() == TABLE_ROWS
            raw = json.loads(await asyncio.to_thread(cli, "--json"))
            assert len(raw["flows"]) == JOINED and rows.take() == JOINED  # everything asked

    run(go())


def test_http_pages_give_a_page_of_a_large_table_unless_asked_for_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        async with _busy_router() as node:
            rows = _Rows(monkeypatch)
            monkeypatch.setattr(observe, "PAGE_ROWS", 50)
            mon = await start_monitor(router_source(node), "127.0.0.1:0")
            assert mon is not None
            try:
                for path in ("/status", "/flows"):
                    code, _, body = await get(mon.address, path)
                    doc = json.loads(body)
                    assert code == 200 and len(doc["flows"]) == 50, path
                    assert doc["flows_total"] == JOINED and rows.take() == 50, path
                code, _, body = await get(mon.address, f"/flows?sort=bytes&limit={JOINED}")
                doc = json.loads(body)
                assert len(doc["flows"]) == JOINED and "flows_total" not in doc
                assert rows.take() == JOINED
                # the scrape picks its flows a slice at a time: the same as all at once
                monkeypatch.setattr(flowviews, "PICK_SLICE", 7)
                code, _, body = await get(mon.address, "/metrics")
                assert code == 200 and b"flownet_router_flow_members{" in body
                assert 0 < rows.take() <= 2 * FLOW_METRICS
                at_once = render_metrics(router_source(node)).decode()
                assert _named(body.decode()) == _named(at_once)
            finally:
                await mon.stop()

    run(go())


def test_a_sort_only_a_rendered_row_can_tell_still_renders_them_all(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        async with _busy_router() as node:
            rows = _Rows(monkeypatch)
            st = node.status_view("aggregate", 2)
            assert len(st["flows"]) == 2 and st["flows_total"] == JOINED
            assert rows.take() == JOINED

    run(go())


def test_every_row_of_a_large_table_is_rendered_and_encoded_a_slice_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A status with no limit (``flowrouter status --json``, the testbed's launcher) still
    gives every row, but renders them ROWS_SLICE at a time and encodes the reply so too,
    the loop running in between: at 10^6 flows it once held the loop for 11.7 s."""
    async def go() -> None:
        async with _busy_router() as node:
            monkeypatch.setattr(flowviews, "ROWS_SLICE", 50)
            monkeypatch.setattr(slicedjson, "SLICE", 50)
            turns, seen, real = 0, [], RouterNode.flow_rows
            done = asyncio.Event()

            def flow_rows(self: RouterNode, keys: list[bytes] | None = None) -> Any:
                if keys and not done.is_set():  # a slice (not the rowless rest)
                    seen.append(turns)  # how often the loop had turned when it began
                return real(self, keys)
            monkeypatch.setattr(RouterNode, "flow_rows", flow_rows)

            async def ticker() -> None:
                nonlocal turns
                while not done.is_set():
                    turns += 1
                    await asyncio.sleep(0)
            ticking = asyncio.ensure_future(ticker())
            try:
                ctl = "%s:%d" % node.control_address
                st = (await query_control(ctl, "status"))["status"]
            finally:
                done.set()
                await ticking
            assert [r["flow"] for r in st["flows"]] \
                == [r["flow"] for r in node.status()["flows"]]
            assert len(st["flows"]) == JOINED and "flows_total" not in st
            assert len(seen) == -(-JOINED // 50)
            assert all(a < b for a, b in zip(seen, seen[1:], strict=False)), seen

    run(go())


def test_the_collector_waits_while_views_are_made_and_resumes_after() -> None:
    """A sliced view pauses Python's cyclic collector (a full collection walks every object,
    0.3-0.5 s at 10^6 flows); overlapping views share the pause, and a collector that was
    off stays off."""
    assert gc.isenabled()
    with flowviews.collector_paused():
        assert not gc.isenabled()
        with flowviews.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer view is still being made
    assert gc.isenabled()
    with pytest.raises(RuntimeError), flowviews.collector_paused():
        raise RuntimeError("a view that fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with flowviews.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
