"""Per-router clock offsets, from the links both ends saw come up.

When routers A and B connect, A writes ``link_up`` (peer B) and B writes ``link_up`` (peer
A) at nearly the same true time (the handshake takes a round trip). The difference of their
clocks at their first ``link_up`` toward each other is the offset of B's clock from A's, to
within that round trip. Within each run, the routers joined by such pairs form components;
a breadth-first walk gives every router's offset from the component's first router, exactly
as the pairs say (a wrong clock shifts only its own router: the pairs through it cancel).

A component's reference time is that of its largest group of routers whose offsets agree to
within the tolerance (the earliest such group), when that group is a strict majority; each
router's offset is then measured from the group's median, and a router further than the
tolerance from it is not trusted (``trusted`` false: the job leaves its records out and
names it). With no majority (say two routers that disagree) nothing can be said (``trusted``
null: the routers are kept, the report says so); a router with no link seen on both ends is
not estimated at all.

Pure Python over the pairs (one row per link, collected by the job). Imports only the
standard library.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from statistics import median
from typing import Any

#: offsets within this many seconds of the reference are trusted (link-up round trips are
#: milliseconds; a clock an hour off is not)
TOLERANCE = 1.0


def pairs(first_up: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str, float, float]]:
    """(run, a, b, t_a, t_b) with a < b for every pair of routers that each wrote a
    ``link_up`` toward the other; *first_up*: rows (run, router, peer, t), the first such
    record per (run, router, peer)."""
    seen = {(r["run"], r["router"], r["peer"]): float(r["t"]) for r in first_up}
    out = []
    for (run, a, b), ta in seen.items():
        tb = seen.get((run, b, a))
        if tb is not None and a < b:
            out.append((run, a, b, ta, tb))
    return sorted(out)


def offsets(link_pairs: Iterable[tuple[str, str, str, float, float]],
            tolerance: float = TOLERANCE) -> list[dict[str, Any]]:
    """Rows (run, router, offset, links, trusted, note), sorted by run and router; see the
    module docstring. ``offset`` is seconds ahead of the reference (negative: behind)."""
    graph: dict[str, dict[str, list[tuple[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for run, a, b, ta, tb in link_pairs:
        graph[run][a].append((b, tb - ta))
        graph[run][b].append((a, ta - tb))
    rows: list[dict[str, Any]] = []
    for run in sorted(graph):
        adj = graph[run]
        done: set[str] = set()
        for root in sorted(adj):
            if root in done:
                continue
            rel = {root: 0.0}
            queue = deque([root])
            while queue:
                r = queue.popleft()
                for peer, d in adj[r]:
                    if peer not in rel:
                        rel[peer] = rel[r] + d
                        queue.append(peer)
            done.update(rel)
            rows += _component(run, rel, adj, tolerance)
    return sorted(rows, key=lambda r: (r["run"], r["router"]))


def _component(run: str, rel: dict[str, float], adj: Mapping[str, list[tuple[str, float]]],
               tolerance: float) -> list[dict[str, Any]]:
    ranked = sorted(rel, key=lambda r: (rel[r], r))
    best: list[str] = []
    lo = 0
    for hi in range(len(ranked)):  # the largest window of offsets no wider than tolerance
        while rel[ranked[hi]] - rel[ranked[lo]] > tolerance:
            lo += 1
        if hi - lo + 1 > len(best):
            best = ranked[lo:hi + 1]
    majority = 2 * len(best) > len(rel)
    ref = median(rel[r] for r in best) if majority else None
    out: list[dict[str, Any]] = []
    for router in sorted(rel):
        links = len(adj[router])
        if ref is None:
            out.append({"run": run, "router": router, "offset": None, "links": links,
                        "trusted": None,
                        "note": f"the clocks of {len(rel)} connected routers disagree with no "
                                "majority: cannot tell which is right (kept)"})
            continue
        off = rel[router] - ref
        ok = abs(off) <= tolerance
        out.append({"run": run, "router": router, "offset": off, "links": links,
                    "trusted": ok,
                    "note": None if ok else (
                        f"clock {abs(off):.6g} s {'ahead of' if off > 0 else 'behind'} "
                        f"{len(best)} of {len(rel)} connected routers (from {links} link(s) "
                        "seen on both ends): left out")})
    return out


def left_out(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(run, router) of the routers whose clocks are not trusted."""
    return [(r["run"], r["router"]) for r in rows if r["trusted"] is False]
