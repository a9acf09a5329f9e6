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
every row, as before.

Imports the standard library and :mod:`flowrouter.net.listviews`; the node is reached
through :class:`Viewed`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from flowrouter.net import listviews


class Viewed(Protocol):
    """What a view asks of a router node (:class:`flowrouter.net.node.RouterNode`)."""

    @property
    def core(self) -> Any: ...
    @property
    def fast(self) -> Any: ...
    def now(self) -> float: ...
    def status(self, flows: Iterable[bytes] | None = None) -> dict[str, Any]: ...


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


def pick_flows(node: Viewed, sort: str | None, limit: int | None) -> list[bytes] | None:
    """The keys of the flow rows that *sort* (checked) and *limit* show, in the order shown;
    None when every row must be rendered to tell."""
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
    pick = heapq.nlargest if sort and sort.startswith("-") else heapq.nsmallest
    return pick(limit, flows, key=lambda k: key({field: value(k)}))


def status_view(node: Viewed, sort: str | None, limit: Any) -> dict[str, Any]:
    """The status document sorted and limited as :func:`flowrouter.net.listviews.apply`
    does it (``flows_total`` included), rendering only the flow rows it shows."""
    sort, lim = listviews.check_view(sort, limit)
    st = node.status(pick_flows(node, sort, lim))
    out = listviews.apply(st, sort, lim)
    if lim is not None and st["flow_count"] > lim:
        out["flows_total"] = st["flow_count"]
    return out


def metric_flows(node: Viewed, most: int) -> list[bytes] | None:
    """The flows the Prometheus page names: the *most* with the most members and the *most*
    with the most bytes, in table order (each list's ties fall as a full sort leaves them)."""
    chosen: set[bytes] = set()
    for field in ("members", "bytes"):
        keys = pick_flows(node, field, most)
        if keys is None:
            return None
        chosen.update(keys)
    return [k for k in node.core.flows if k in chosen]


__all__ = ["SHELL_FIELDS", "Viewed", "metric_flows", "pick_flows", "shell_values",
           "status_view"]
