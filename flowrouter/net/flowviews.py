"""Which flow rows a view of a router's status shows, picked before any row is rendered.

Rendering a flow's status row (its name, masks, downstream links, counters) costs about
11 us of the router's loop. A status document took 1.1 s to build with 10^5 flows and
11.7 s with 10^6 (JSON encoding then adds about a quarter), and the router forwarded
nothing meanwhile. That was paid for every ``flowrouter status --limit 20``, every
``/status?limit=`` page and every Prometheus scrape, all of which show a handful of rows.
Here the rows a view shows are chosen from values that cost next to nothing to read
(members, age, frames, bytes, upstream).
``heapq`` picks the first N in the order :mod:`flowrouter.net.listviews` sorts by, ties in
table order as its stable sort leaves them. Only those rows are then rendered. A sort by a
field only a rendered row has (a flow's name or masks) and a view with no limit render
every row. Views made by :func:`status_view_sliced` and :func:`metric_flows_sliced` (what
the control port, the HTTP pages and /metrics use) read the entries PICK_SLICE at a time,
render the rows ROWS_SLICE at a time (each slice sorted, then the slices merged a slice of
rows at a time, when the rows themselves are to be sorted), letting the loop run in
between, so that no view of a million flows (11.7 s of rows, a second of reading, seconds
of sorting) stops forwarding for its making.

Imports the standard library and :mod:`flowrouter.net.listviews`; the node is reached
through :class:`Viewed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import itertools
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Protocol, TypeVar

from flowrouter.net import listviews

T = TypeVar("T")


class Viewed(Protocol):
    """What a view asks of a router node (:class:`flowrouter.net.node.RouterNode`)."""

    @property
    def core(self) -> Any: ...
    @property
    def fast(self) -> Any: ...
    def now(self) -> float: ...
    def status(self, flows: Iterable[bytes] | None = None) -> dict[str, Any]: ...
    def flow_rows(self, keys: list[bytes] | None = None) -> list[dict[str, Any]]: ...


#: flow rows rendered between two turns of the router's loop (about 11 ms of its time)
ROWS_SLICE = 1024
#: entries a sorted view reads between two turns (about 1 us each), and how many slices'
#: worth of rows it may show and still keep only its best rows as it goes (past that it
#: keeps every slice, sorted, and merges them at the end, a slice at a time)
PICK_SLICE = 16384
PICK_RUNS = 4
#: the fields of a flow's row the shell adds to the core's (RouterNode.status)
SHELL_FIELDS = ("members", "age", "frames", "bytes")


def shell_values(node: Viewed, now: float) -> dict[str, Callable[[bytes], Any]]:
    """How to read each of SHELL_FIELDS for a flow's key: its downstream links that joined,
    its age at *now*, and the frames and bytes it took (the core's entry and the engine's
    mirror together). One definition for the rows and for choosing them."""
    flows, fast = node.core.flows, node.fast

    def counted(i: int) -> Callable[[bytes], int]:
        if fast is None:
            return lambda k: (flows[k].frames, flows[k].bytes)[i]
        return lambda k: (flows[k].frames, flows[k].bytes)[i] + fast.flow_counts(k)[i]
    return {"members": lambda k: flows[k].down_count(),
            "age": lambda k: round(now - flows[k].created, 3),
            "frames": counted(0), "bytes": counted(1)}


def _value(node: Viewed, field: str) -> Callable[[bytes], Any] | None:
    """The value of *field* in a flow's row, read without rendering it (None: only a
    rendered row has it)."""
    if field in SHELL_FIELDS:
        return shell_values(node, node.now())[field]
    if field == "upstream":
        flows = node.core.flows
        return lambda k: flows[k].upstream
    return None


def _pick_steps(node: Viewed, sort: str | None, limit: int | None
                ) -> Generator[None, None, list[bytes] | None]:
    """:func:`pick_flows`, one step per PICK_SLICE entries read: the best rows so far are
    kept, decorated with their place in the table so that ties fall as a stable sort
    leaves them (a sort by -FIELD too, as ``heapq.nlargest`` does). A view of more rows
    than PICK_RUNS slices' worth keeps every slice, sorted, and merges them a slice at a
    time."""
    if limit is None:
        return None
    flows = node.core.flows
    field = sort.lstrip("+-") if sort else ""
    if field not in listviews.SORTABLE["flows"]:  # table order
        return list(itertools.islice(flows, limit))
    value = _value(node, field)
    if value is None:
        return None
    key = listviews.sort_key(field)
    largest = bool(sort and sort.startswith("-"))
    sign = -1 if largest else 1
    keys = list(flows)  # the table may change between two steps: gone keys are skipped
    keep = limit <= PICK_RUNS * PICK_SLICE  # the best so far, else every slice, sorted
    best: list[tuple[Any, int, bytes]] = []
    runs: list[list[tuple[Any, int, bytes]]] = []
    for at in range(0, len(keys), PICK_SLICE):
        if at:
            yield
        part = [(key({field: value(k)}), sign * i, k)
                for i, k in enumerate(keys[at:at + PICK_SLICE], at) if k in flows]
        if keep:
            best = (heapq.nlargest if largest else heapq.nsmallest)(limit, best + part)
        else:
            part.sort(reverse=largest)
            runs.append(part)
    if keep:
        return [k for _, _, k in best]  # in order: as nsmallest and nlargest give them
    picked: list[bytes] = []
    merged = heapq.merge(*runs, reverse=largest)  # the slices merged a slice at a time
    while len(picked) < limit:
        yield
        chunk = list(itertools.islice(merged, min(PICK_SLICE, limit - len(picked))))
        if not chunk:
            break
        picked += [k for _, _, k in chunk]
    return picked


def pick_flows(node: Viewed, sort: str | None, limit: int | None) -> list[bytes] | None:
    """The keys of the flow rows that *sort* (checked) and *limit* show, in the order shown;
    None when every row must be rendered to tell."""
    return _done(_pick_steps(node, sort, limit))


def _view_steps(node: Viewed, sort: str | None, limit: Any
                ) -> Generator[None, None, dict[str, Any]]:
    """The view's making, one step per slice of entries read to pick the rows and per
    ROWS_SLICE rows rendered; its value the document. Rows of flows gone between two steps
    are left out; the rest of the document is as of the last step."""
    sort, lim = listviews.check_view(sort, limit)
    keys = yield from _pick_steps(node, sort, lim)
    flows = node.core.flows
    field = sort.lstrip("+-") if sort else ""
    # rows to sort here: none were picked (a sort by a field only a rendered row has, or
    # no limit) and the sort is by one of a flow row's fields
    sorting = keys is None and field in listviews.SORTABLE["flows"]
    by = listviews.sort_key(field) if sorting else None
    largest = bool(sort and sort.startswith("-"))
    if keys is None:
        keys = list(flows)
    parts: list[list[dict[str, Any]]] = []
    for at in range(0, len(keys), ROWS_SLICE):
        if at:
            yield
        part = node.flow_rows([k for k in keys[at:at + ROWS_SLICE] if k in flows])
        if by is not None:
            part.sort(key=by, reverse=largest)  # each slice sorted, then merged
        parts.append(part)
    rows: list[dict[str, Any]] = []
    if by is not None and len(parts) > 1:
        # heapq.merge takes ties from the earlier slice first: a stable sort's order
        merged = heapq.merge(*parts, key=by, reverse=largest)
        while lim is None or len(rows) < lim:
            yield
            chunk = list(itertools.islice(merged, ROWS_SLICE))
            if not chunk:
                break
            rows += chunk
    else:
        rows = [row for part in parts for row in part]
    del parts
    st = node.status(())
    out = listviews.apply(st, sort, lim, ("links", "peers"))
    out["flows"] = rows if lim is None else rows[:lim]
    if lim is not None and st["flow_count"] > lim:
        out["flows_total"] = st["flow_count"]
    return out


def status_view(node: Viewed, sort: str | None, limit: Any) -> dict[str, Any]:
    """The status document sorted and limited as :func:`flowrouter.net.listviews.apply`
    does it (``flows_total`` included), rendering only the flow rows it shows, at once."""
    return _done(_view_steps(node, sort, limit))


async def status_view_sliced(node: Viewed, sort: str | None, limit: Any) -> dict[str, Any]:
    """:func:`status_view`, the loop let run between its steps: a document of every row of
    a large table (``flowrouter status --json``, the control command with no limit) once
    stopped forwarding for its whole making, 11.7 s at 10^6 flows, and a sorted view for
    its reading of every entry, 1.1 s."""
    return await _sliced(_view_steps(node, sort, limit))


def _metric_steps(node: Viewed, most: int) -> Generator[None, None, list[bytes] | None]:
    chosen: set[bytes] = set()
    for field in ("members", "bytes"):
        keys = yield from _pick_steps(node, field, most)
        if keys is None:
            return None
        chosen.update(keys)
    return [k for k in node.core.flows if k in chosen]


def metric_flows(node: Viewed, most: int) -> list[bytes] | None:
    """The flows the Prometheus page names: the *most* with the most members and the *most*
    with the most bytes, in table order (each list's ties fall as a full sort leaves them)."""
    return _done(_metric_steps(node, most))


async def metric_flows_sliced(node: Viewed, most: int) -> list[bytes] | None:
    """:func:`metric_flows`, the loop let run after each PICK_SLICE entries read (a scrape
    of 10^6 flows read them all twice at once: 1.9 s)."""
    return await _sliced(_metric_steps(node, most))


_pauses = 0  #: views being made and sent that asked for the collector to wait


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector waits while a large view is made and sent: its
    rows are a million objects that live for seconds, and each full collection walks every
    object of the process (the flow table's too), 0.05 s at 10^5 flows and 0.3-0.5 s at
    10^6, several times in one view. Reference counting frees what it always frees; cycles
    wait for the end. Nested and overlapping views share one pause; a collector that was
    off stays off."""
    global _pauses
    if _pauses == 0 and not gc.isenabled():
        yield
        return
    _pauses += 1
    gc.disable()
    try:
        yield
    finally:
        _pauses -= 1
        if _pauses == 0:
            gc.enable()


def _done(steps: Generator[None, None, T]) -> T:
    """What *steps* make, made at once."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]


async def _sliced(steps: Generator[None, None, T]) -> T:
    """What *steps* make, the loop let run after each (the collector waiting meanwhile)."""
    with collector_paused():
        while True:
            try:
                next(steps)
            except StopIteration as end:
                return end.value  # type: ignore[no-any-return]
            await asyncio.sleep(0)


__all__ = ["PICK_SLICE", "ROWS_SLICE", "SHELL_FIELDS", "Viewed", "collector_paused",
           "metric_flows", "metric_flows_sliced", "pick_flows", "shell_values", "status_view",
           "status_view_sliced"]
