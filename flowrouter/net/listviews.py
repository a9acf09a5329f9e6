"""Sorted, limited views of a router's lists (links, flows, peers), as NATS's ``/connz?sort=``.

One definition serves every place a list is shown: the HTTP pages (``/status?sort=...&
limit=...``, ``/links``, ``/flows``), the control interface's ``status`` command (arguments
``sort`` and ``limit``) and ``flowrouter status --sort --limit``. Pure functions on the status
document; nothing here runs on the forwarding path.

``sort=FIELD`` orders numbers largest first and text A to Z (what an operator looks for: the
busiest link, the largest flow); ``sort=-FIELD`` reverses that. A field that holds a table
(a flow's ``downstream``) sorts by its size. ``limit=N`` keeps the first N rows; the document
then says how many there were (``links_total``, ``flows_total``). May import only the
standard library.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

#: the lists a status document holds, and the fields each may be sorted by
SORTABLE: dict[str, tuple[str, ...]] = {
    "links": ("id", "peer", "role", "state", "transport", "address", "flows", "rx", "tx",
              "bytes_in", "bytes_out", "rtt_ms", "silent"),
    "flows": ("flow", "upstream", "downstream", "members", "aggregate", "age", "frames",
              "bytes"),
    "peers": ("peer", "address", "up", "attempts"),
}
#: the most rows one view returns (a limit asked for above it is cut to it)
MAX_LIMIT = 1_000_000


class ViewError(ValueError):
    """A sort field or limit that cannot be used (the reply says which are)."""


def sort_key(field: str) -> Any:
    """The key :func:`view` sorts rows by for *field* (ascending; ``-FIELD`` reverses it)."""
    def key(row: dict[str, Any]) -> tuple[int, Any]:
        value = row.get(field)
        if isinstance(value, dict | list | tuple | set):
            value = len(value)
        if value is None:
            return (1, 0)  # rows without the field go last
        if isinstance(value, bool | int | float):
            return (0, -value)
        return (0, str(value))
    return key


def check_view(sort: str | None, limit: Any) -> tuple[str | None, int | None]:
    """*sort* and *limit* checked (a limit as text is accepted: it comes from a query)."""
    if limit is not None and limit != "":
        try:
            limit = int(limit)
        except (TypeError, ValueError, OverflowError):
            raise ViewError(f"limit must be a whole number, got {limit!r:.40}") from None
        if limit < 0:
            raise ViewError("limit must not be negative")
        limit = min(limit, MAX_LIMIT)
    else:
        limit = None
    if sort is not None and not isinstance(sort, str):
        raise ViewError(f"sort must be a field name, got {sort!r:.40}")
    if sort:
        field = sort.lstrip("+-")
        if not any(field in fields for fields in SORTABLE.values()):
            raise ViewError(f"cannot sort by {field!r}; sortable: " + "; ".join(
                f"{name}: {', '.join(fields)}" for name, fields in SORTABLE.items()))
    return sort or None, limit


def view(rows: list[dict[str, Any]], sort: str | None, limit: int | None
         ) -> list[dict[str, Any]]:
    """*rows* sorted by *sort* (when it is one of their fields) and cut to *limit*."""
    if sort:
        field = sort.lstrip("+-")
        if rows and any(field in row for row in rows):
            rows = sorted(rows, key=sort_key(field), reverse=sort.startswith("-"))
    return rows if limit is None else rows[:limit]


def apply(status: dict[str, Any], sort: str | None, limit: Any,
          lists: tuple[str, ...] = ("links", "flows", "peers")) -> dict[str, Any]:
    """A copy of the status document with each of *lists* sorted and limited (those a sort
    field does not belong to keep their order and are only limited)."""
    sort, lim = check_view(sort, limit)
    out = dict(status)
    for name in lists:
        rows = status.get(name)
        if not isinstance(rows, list):
            continue
        field = sort.lstrip("+-") if sort else ""
        out[name] = view(rows, sort if field in SORTABLE.get(name, ()) else None, lim)
        if lim is not None and len(rows) > lim:
            out[f"{name}_total"] = len(rows)
    return out


def from_query(query: str) -> tuple[str | None, str | None]:
    """``sort`` and ``limit`` from a URL query string (the last of each wins)."""
    args = parse_qs(query, keep_blank_values=False)
    sort = args.get("sort", [None])[-1]
    limit = args.get("limit", [None])[-1]
    return sort, limit


__all__ = ["MAX_LIMIT", "SORTABLE", "ViewError", "apply", "check_view", "from_query", "sort_key",
           "view"]
