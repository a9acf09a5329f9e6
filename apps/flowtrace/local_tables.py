"""The tables of :mod:`flowtrace.tables` and :mod:`flowtrace.peaks` in plain Python.

The local engine (:mod:`flowtrace.local_engine`) runs these over the valid records of a small
trace, held as dicts, where starting a JVM and planning some fifty Spark jobs would cost
minutes for a few hundred lines. Each function mirrors the Spark function of the same name
and returns its rows (dicts, in the columns and order the Spark table has) with Spark SQL's
semantics: a sum or average over no non-null value is null, ``greatest`` skips nulls,
ascending orders put nulls first, ``max_by`` skips null orderings and keeps the later of
equals. Percentiles are the element of rank ``ceil(p * n)`` (what ``percentile_approx``
returns while its summary is exact, i.e. for the sizes this engine is meant for).
``tests/test_flowtrace_engines.py`` checks that both engines give the same tables.
Imports only the standard library and :mod:`flowtrace.tables`' constants (no pyspark).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .tables import CHURN_KINDS, EVENT_COLS, MASK_CAUSES, NET_SUMS, SNAP_COLS, TIMER_CAUSES

Row = dict[str, Any]
Rows = list[Row]


# ----------------------------------------------------------------------------- SQL helpers
def order_key(*cols: str, desc: Sequence[str] = ()) -> Callable[[Row], tuple[Any, ...]]:
    """A sort key like Spark's ``orderBy``: ascending with nulls first; columns in *desc*
    descending with nulls last (numbers only)."""
    def key(r: Row) -> tuple[Any, ...]:
        out: list[Any] = []
        for c in cols:
            v = r[c]
            if c in desc:
                out += [v is None, 0 if v is None else -v]
            else:
                out += [v is not None, 0 if v is None else v]
        return tuple(out)
    return key


def ordered(rows: Iterable[Row], *cols: str, desc: Sequence[str] = ()) -> Rows:
    return sorted(rows, key=order_key(*cols, desc=desc))


def ssum(values: Iterable[Any]) -> Any:
    """SQL ``sum``: null when no value is non-null."""
    out = None
    for v in values:
        if v is not None:
            out = v if out is None else out + v
    return out


def savg(values: Iterable[Any]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(float(x) for x in xs) / len(xs) if xs else None


def smax(values: Iterable[Any]) -> Any:
    return max((v for v in values if v is not None), default=None)


def smin(values: Iterable[Any]) -> Any:
    return min((v for v in values if v is not None), default=None)


def greatest(*values: Any) -> Any:
    return smax(values)


def percentile(values: Iterable[Any], p: float) -> Any:
    """The element of rank ceil(p * n) of the non-null values (see the module docstring)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if p <= 1e-4:
        return xs[0]
    if p >= 1 - 1e-4:
        return xs[-1]
    return xs[min(max(math.ceil(p * len(xs)), 1), len(xs)) - 1]


def ratio(num: Any, den: Any) -> float | None:
    return num / den if num is not None and den is not None and den > 0 else None


def group(rows: Iterable[Row], *keys: str) -> dict[tuple[Any, ...], Rows]:
    out: dict[tuple[Any, ...], Rows] = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def max_by(rows: Iterable[Row], value: Callable[[Row], Any], by: Callable[[Row], Any]) -> Any:
    """SQL ``max_by``: the value at the largest non-null ordering (the later of equals)."""
    best, best_by = None, None
    for r in rows:
        o = by(r)
        if o is not None and (best_by is None or not best_by > o):
            best, best_by = value(r), o
    return best


# ----------------------------------------------------------------------------- first pass
def clock_fences(valid: Rows, k: float) -> Rows:
    out = []
    for (run,), rs in sorted(group(valid, "run").items()):
        ts = [r["t"] for r in rs]
        lo, hi = percentile(ts, 0.05), percentile(ts, 0.95)
        width = max(hi - lo, 1.0)
        out.append({"run": run, "lo_t": lo - k * width, "hi_t": hi + k * width})
    return out


def clock_outliers(valid: Rows, fences: Rows) -> Rows:
    f = {r["run"]: r for r in fences}
    out = [r for r in valid if r["run"] in f
           and not f[r["run"]]["lo_t"] <= r["t"] <= f[r["run"]]["hi_t"]]
    return ordered(({"run": run, "router": router, "records": len(rs),
                     "min_t": smin(r["t"] for r in rs), "max_t": smax(r["t"] for r in rs),
                     "fence_lo": f[run]["lo_t"], "fence_hi": f[run]["hi_t"]}
                    for (run, router), rs in group(out, "run", "router").items()),
                   "run", "router")


def prepare(valid: Rows, bucket: float, spans: Rows | None = None) -> Rows:
    """The records inside their run's fences, with ``bidx`` and ``w`` (in place)."""
    f = None if spans is None else {r["run"]: (r["lo_t"], r["hi_t"]) for r in spans}
    out = []
    for r in valid:
        if f is not None:
            lim = f.get(r["run"])
            if lim is None or not lim[0] <= r["t"] <= lim[1]:
                continue
        r["bidx"] = math.floor(r["t"] / bucket)
        out.append(r)
    return out


# ----------------------------------------------------------------------------- routers
def record_counts(valid: Rows) -> Rows:
    out = []
    for (run, router, bidx, kind, cause), rs in group(valid, "run", "router", "bidx", "kind",
                                                      "cause_").items():
        snap = kind == "snapshot"
        srs = rs if snap else []
        out.append({
            "run": run, "router": router, "bidx": bidx, "kind": kind, "cause": cause,
            "n": len(rs), "w": sum(r["w"] for r in rs),
            "wb": ssum(None if r["bytes"] is None else r["w"] * r["bytes"] for r in rs),
            "wo": ssum(None if r["out_links"] is None else r["w"] * r["out_links"] for r in rs),
            "t_min": min(r["t"] for r in rs), "t_max": max(r["t"] for r in rs),
            "s": max_by(srs, lambda r: {c: r[c] for c in ("t", *SNAP_COLS)},
                        lambda r: r["t"]),
            "snap_max": smax(r["entries"] for r in srs),
            "core_i": smax(None if r["core"] is None else int(r["core"]) for r in srs),
            "edge_i": smax(None if r["edge"] is None else int(r["edge"]) for r in srs),
            "ep_i": 1 if kind in ("link_up", "link_add")
            and any(r["role"] == "endpoint" for r in rs) else None,
            "lsids": sorted({x for r in srs for x in (r["lsids"] or ())})})
    return out


def routers(counts: Rows, peaks: Rows) -> Rows:
    pk = {(r["run"], r["router"]): r for r in peaks}
    out = []
    for (run, router), rs in group(counts, "run", "router").items():
        p = pk.get((run, router), {})
        role = ("core" if smax(r["core_i"] for r in rs) == 1 else
                "edge" if 1 in (smax(r["edge_i"] for r in rs), smax(r["ep_i"] for r in rs))
                else "transit")
        out.append({"run": run, "router": router, "role": role,
                    "records": sum(r["n"] for r in rs),
                    "first_t": min(r["t_min"] for r in rs),
                    "last_t": max(r["t_max"] for r in rs),
                    "lo": min(r["bidx"] for r in rs), "hi": max(r["bidx"] for r in rs),
                    "max_entries": greatest(smax(r["snap_max"] for r in rs),
                                            p.get("peak_entries")),
                    "peak_t": p.get("peak_t"),
                    "lsids": sorted({x for r in rs for x in r["lsids"]})})
    return ordered(out, "run", "router")


def entry_timeline(valid: Rows) -> Rows:
    """(run, router, t, entries), as :func:`flowtrace.peaks.entry_timeline`."""
    at: dict[tuple[str, str], dict[float, list[Any]]] = defaultdict(dict)
    for r in valid:
        k = r["kind"]
        if k not in ("entry_add", "entry_del", "snapshot"):
            continue
        cell = at[(r["run"], r["router"])].setdefault(r["t"], [0, None])
        cell[0] += 1 if k == "entry_add" else -1 if k == "entry_del" else 0
        if k == "snapshot":
            cell[1] = greatest(cell[1], r["entries"])
    out = []
    for (run, router), cells in at.items():
        ts = sorted(cells)
        replay, acc = [], 0
        for t in ts:
            acc += cells[t][0]
            replay.append(acc)
        offs = [None if cells[t][1] is None else cells[t][1] - rp for t, rp in zip(ts, replay)]
        first = next((o for o in offs if o is not None), None)
        fallback = max(-min(replay), 0)
        last = None
        for t, rp, off in zip(ts, replay, offs):
            last = off if off is not None else last
            o = last if last is not None else first if first is not None else fallback
            out.append({"run": run, "router": router, "t": t, "entries": max(rp + o, 0)})
    return out


def router_peaks(timeline: Rows) -> Rows:
    out = []
    for (run, router), rs in group(timeline, "run", "router").items():
        top = max(r["entries"] for r in rs)
        out.append({"run": run, "router": router, "peak_entries": top,
                    "peak_t": min(r["t"] for r in rs if r["entries"] == top)})
    return out


def run_peaks(timeline: Rows) -> Rows:
    steps: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for (run, _), rs in group(timeline, "run", "router").items():
        prev = 0
        for r in sorted(rs, key=lambda r: r["t"]):
            steps[run][r["t"]] += r["entries"] - prev
            prev = r["entries"]
    out = []
    for run in sorted(steps):
        acc, best, best_t = 0, None, None
        for t in sorted(steps[run]):
            acc += steps[run][t]
            if best is None or acc > best:
                best, best_t = acc, t
        out.append({"run": run, "entries_total": best, "t": best_t})
    return out


# ----------------------------------------------------------------------------- buckets
def _bucket_events(rs: Rows) -> Row:
    def n_if(pred: Callable[[Row], bool], col: str = "n") -> int:
        return ssum(r[col] for r in rs if pred(r)) or 0

    return {
        "entry_adds": n_if(lambda r: r["kind"] == "entry_add"),
        "entry_dels": n_if(lambda r: r["kind"] == "entry_del"),
        "entry_dels_gc": n_if(lambda r: r["kind"] == "entry_del" and r["cause"] in TIMER_CAUSES),
        "link_adds": n_if(lambda r: r["kind"] == "link_add" and r["cause"] not in MASK_CAUSES),
        "mask_changes": n_if(lambda r: r["kind"] == "link_add" and r["cause"] in MASK_CAUSES),
        "link_dels": n_if(lambda r: r["kind"] == "link_del"),
        "link_dels_gc": n_if(lambda r: r["kind"] == "link_del" and r["cause"] in TIMER_CAUSES),
        "gc_pings": n_if(lambda r: r["kind"] == "gc_ping"),
        "refreshes": n_if(lambda r: r["kind"] == "refresh"),
        "prunes": n_if(lambda r: r["kind"] == "prune"),
        "fwd_msgs": n_if(lambda r: r["kind"] == "fwd", "w"),
        "fwd_bytes": n_if(lambda r: r["kind"] == "fwd", "wb"),
        "fwd_copies": n_if(lambda r: r["kind"] == "fwd", "wo"),
        "drop_msgs": n_if(lambda r: r["kind"] == "drop", "w"),
        "drop_bytes": n_if(lambda r: r["kind"] == "drop", "wb"),
        "s": max_by(rs, lambda r: r["s"], lambda r: None if r["s"] is None else r["s"]["t"])}


def router_buckets(counts: Rows, router_rows: Rows, spans: Rows, bucket: float) -> Rows:
    """One row per router and bucket (with ``bidx``), as the Spark function."""
    ev = {k: _bucket_events(rs) for k, rs in group(counts, "run", "router", "bidx").items()}
    span = {r["run"]: (r["run_lo"], r["run_hi"]) for r in spans}
    zero = dict.fromkeys(EVENT_COLS, 0)
    out = []
    for rt in router_rows:
        run, router = rt["run"], rt["router"]
        if run not in span:
            continue
        lo_t, hi_t = span[run]
        last: dict[str, Any] = dict.fromkeys(("t", *SNAP_COLS))
        e_acc = l_acc = 0
        for bidx in range(rt["lo"], rt["hi"] + 1):
            e = ev.get((run, router, bidx))
            s = e["s"] if e else None
            if s is not None:
                for c, v in s.items():
                    if v is not None:
                        last[c] = v
            cols = {c: e[c] for c in EVENT_COLS} if e else zero
            e_acc += cols["entry_adds"] - cols["entry_dels"]
            l_acc += cols["link_adds"] - cols["link_dels"]
            start = bidx * bucket
            out.append({"run": run, "router": router, "role": rt["role"], "bidx": bidx,
                        "bucket": start,
                        "seconds": min(start + bucket, hi_t) - max(start, lo_t),
                        **{c: last[c] for c in SNAP_COLS}, "snapshot_t": last["t"],
                        "entries_replay": e_acc, "links_replay": l_acc, **cols})
    return out


def flow_deltas(valid: Rows) -> dict[tuple[str, int], tuple[int, int]]:
    """(run, bidx) -> (flows that became live minus those that stopped, births)."""
    per: dict[tuple[str, str], list[tuple[float, int, int]]] = defaultdict(list)
    for r in valid:
        if r["kind"] in ("entry_add", "entry_del"):
            per[(r["run"], r["flow"])].append(
                (r["t"], -1 if r["kind"] == "entry_add" else 1, r["bidx"]))
    out: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for (run, _), evs in per.items():
        live = 0
        for _t, neg_d, bidx in sorted(evs, key=lambda e: (e[0], e[1])):
            d = -neg_d
            live += d
            fd = 1 if live - d <= 0 < live else -1 if live - d > 0 >= live else 0
            acc = out[(run, bidx)]
            acc[0] += fd
            acc[1] += fd == 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def network_buckets(rb: Rows, deltas: dict[tuple[str, int], tuple[int, int]]) -> Rows:
    out = []
    for (run, bidx, bucket), rs in group(rb, "run", "bidx", "bucket").items():
        ent = [r["entries"] for r in rs]
        fd, born = deltas.get((run, bidx), (0, 0))
        out.append({"run": run, "bidx": bidx, "bucket": bucket,
                    "seconds": smax(r["seconds"] for r in rs), "routers": len(rs),
                    "routers_reporting": sum(e is not None for e in ent),
                    "entries_total": ssum(ent), "entries_max": smax(ent),
                    "entries_mean": savg(ent),
                    "entries_replay_total": ssum(r["entries_replay"] for r in rs),
                    "links_total": ssum(r["links_total"] for r in rs),
                    "active_flows": ssum(r["active_flows"] for r in rs),
                    "mem_total": ssum(r["mem_bytes"] for r in rs),
                    "members": ssum(r["members"] for r in rs),
                    **{c: ssum(r[c] for r in rs) for c in NET_SUMS}, "fd": fd,
                    "flows_born": born})
    out = ordered(out, "run", "bidx")
    live: dict[str, int] = defaultdict(int)
    for r in out:
        live[r["run"]] += r.pop("fd")
        r["flows_live"] = live[r["run"]]
        r["flows_born"] = r.pop("flows_born")
        del r["bidx"]
    return ordered(out, "run", "bucket")


def role_entries(rb: Rows) -> Rows:
    return ordered(({"run": run, "bucket": b, "role": role,
                     "routers_reporting": sum(r["entries"] is not None for r in rs),
                     "entries_mean": savg(r["entries"] for r in rs),
                     "entries_max": smax(r["entries"] for r in rs),
                     "entries_total": ssum(r["entries"] for r in rs)}
                    for (run, b, role), rs in group(rb, "run", "bucket", "role").items()),
                   "run", "bucket", "role")


# ----------------------------------------------------------------------------- GC lag
def gc_lag(valid: Rows, role_of: dict[tuple[str, str], str]) -> Rows:
    """As :func:`flowtrace.tables.gc_lag`: events per (run, router, flow, link) replayed in
    (time, priority) order."""
    per: dict[tuple[Any, ...], list[tuple[float, int, str, Any]]] = defaultdict(list)
    for r in valid:
        k = r["kind"]
        if k == "gc_ping":
            per[(r["run"], r["router"], r["flow"], r["link"])].append((r["t"], 0, "ping", None))
        elif k == "link_add":
            per[(r["run"], r["router"], r["flow"], r["link"])].append(
                (r["t"], 1, "link_add", None))
        elif k == "fwd" and r["in_link"] is not None:
            per[(r["run"], r["router"], r["flow"], r["in_link"])].append((r["t"], 1, "fwd", None))
        elif k == "link_del" and r["cause"] in TIMER_CAUSES:
            key = (r["run"], r["router"], r["flow"], r["link"])
            per[key].append((r["t"], 3, "del", r["last"]))
            if r["last"] is not None:
                per[key].append((r["last"], 2, "mark", None))
    out = []
    for key, evs in per.items():
        c = 0
        t_add = t_fwd = c_seen = c_mark = None
        for t, _prio, src, t_rec in sorted(evs, key=lambda e: (e[0], e[1])):
            if src == "ping":
                c += 1
            elif src == "link_add":
                t_add, c_seen = greatest(t_add, t), c
            elif src == "fwd":
                t_fwd, c_seen = greatest(t_fwd, t), c
            elif src == "mark":
                c_mark = c
            else:
                t_last = greatest(t_rec, t_add, t_fwd)
                pings: int | None
                if t_last is None:
                    frm, pings = None, c
                elif t_last == t_rec:
                    frm, pings = "record", None if c_mark is None else c - c_mark
                else:
                    frm = "fwd" if t_last == t_fwd else "link_add"
                    pings = None if c_seen is None else c - c_seen
                run, router, flow, link = key
                out.append({"run": run, "router": router, "role": role_of.get((run, router)),
                            "flow": flow, "link": link, "t_del": t, "t_last": t_last,
                            "last_from": frm, "lag": None if t_last is None else t - t_last,
                            "pings": pings})
    return out


def lag_summary(gc: Rows) -> Rows:
    def stats(run: str, role: Any, rs: Rows) -> Row:
        lags = [r["lag"] for r in rs]
        return {"run": run, "role": role, "deletions": len(rs),
                "with_lag": sum(x is not None for x in lags), "mean": savg(lags),
                "min": smin(lags), "p50": percentile(lags, 0.5), "p90": percentile(lags, 0.9),
                "p99": percentile(lags, 0.99), "max": smax(lags),
                "mean_pings": savg(r["pings"] for r in rs)}

    out = [stats(run, role, rs) for (run, role), rs in group(gc, "run", "role").items()]
    out += [stats(run, "all", rs) for (run,), rs in group(gc, "run").items()]
    return ordered(out, "run", "role")


def lag_hist(gc: Rows, width: float, nbins: int) -> Rows:
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for r in gc:
        if r["lag"] is not None:
            counts[(r["run"], min(max(math.floor(r["lag"] / width), 0), nbins - 1))] += 1
    return ordered(({"run": run, "lo": b * width, "hi": (b + 1) * width, "count": n}
                    for (run, b), n in counts.items()), "run", "lo")


# ----------------------------------------------------------------------------- churn, traffic
def churn(counts: Rows, bucket: float) -> Rows:
    out = [{"run": run, "bucket": bidx * bucket, "kind": kind, "cause": cause,
            "count": sum(r["n"] for r in rs)}
           for (run, bidx, kind, cause), rs in group(
               (r for r in counts if r["kind"] in CHURN_KINDS),
               "run", "bidx", "kind", "cause").items()]
    return ordered(out, "run", "bucket", "kind", "cause")


def traffic_counts(valid: Rows, role_of: dict[tuple[str, str], str]) -> Rows:
    acc: dict[tuple[Any, ...], Row] = {}
    for r in valid:
        if r["kind"] not in ("fwd", "drop"):
            continue
        key = (r["run"], role_of.get((r["run"], r["router"])), r["kind"], r["reason"],
               r["out_links"])
        a = acc.get(key)
        if a is None:
            a = acc[key] = dict(zip(("run", "role", "kind", "reason", "out_links"), key),
                                n=0, w=0, wb=0, wl=0, wbl=0, wo=None, wbo=None)
        w, b, links = r["w"], r["bytes"], r["links"] if r["links"] is not None else 1
        a["n"] += 1
        a["w"] += w
        a["wb"] += w * b
        a["wl"] += w * links
        a["wbl"] += w * b * links
        if r["out_links"] is not None:
            a["wo"] = (a["wo"] or 0) + w * r["out_links"]
            a["wbo"] = (a["wbo"] or 0) + w * b * r["out_links"]
    return list(acc.values())


def savings(tc: Rows) -> Rows:
    offered = {}
    for (run,), rs in group(tc, "run").items():
        fwd = [r for r in rs if r["kind"] == "fwd"]
        drop = [r for r in rs if r["kind"] == "drop"]
        offered[run] = {"fwd_tx": ssum(r["wo"] for r in fwd) or 0,
                        "fwd_link_bytes": ssum(r["wbo"] for r in fwd) or 0,
                        "drop_tx": ssum(r["wl"] for r in drop) or 0,
                        "drop_link_bytes": ssum(r["wbl"] for r in drop) or 0}
    out = []
    for (run, reason, role), rs in group((r for r in tc if r["kind"] == "drop"),
                                         "run", "reason", "role").items():
        o = offered[run]
        row = {"run": run, "reason": reason, "role": role, "records": sum(r["n"] for r in rs),
               "est_msgs": sum(r["w"] for r in rs), "est_bytes": sum(r["wb"] for r in rs),
               "est_link_tx": sum(r["wl"] for r in rs),
               "est_link_bytes": sum(r["wbl"] for r in rs), **o}
        row["share_of_offered_tx"] = ratio(row["est_link_tx"], o["fwd_tx"] + o["drop_tx"])
        row["share_of_offered_bytes"] = ratio(row["est_link_bytes"],
                                              o["fwd_link_bytes"] + o["drop_link_bytes"])
        out.append(row)
    return ordered(out, "run", "est_link_bytes", "reason", "role", desc=("est_link_bytes",))


# ----------------------------------------------------------------------------- load
def _control(r: Row) -> int:
    return (r["entry_adds"] + r["entry_dels"] + r["link_adds"] + r["link_dels"]
            + r["mask_changes"] + r["gc_pings"] + r["refreshes"] + r["prunes"])


def load_by_role(rb: Rows) -> Rows:
    return ordered(({"run": run, "bucket": b, "role": role,
                     "seconds": smax(r["seconds"] for r in rs), "routers": len(rs),
                     "fwd_msgs": sum(r["fwd_msgs"] for r in rs),
                     "fwd_msgs_mean": savg(r["fwd_msgs"] for r in rs),
                     "fwd_msgs_max": max(r["fwd_msgs"] for r in rs),
                     "fwd_bytes": sum(r["fwd_bytes"] for r in rs),
                     "fwd_copies": sum(r["fwd_copies"] for r in rs),
                     "drop_msgs": sum(r["drop_msgs"] for r in rs),
                     "control_events": sum(_control(r) for r in rs),
                     "entries_mean": savg(r["entries"] for r in rs),
                     "entries_max": smax(r["entries"] for r in rs)}
                    for (run, b, role), rs in group(rb, "run", "bucket", "role").items()),
                   "run", "bucket", "role")


def load_summary(rb: Rows, router_rows: Rows) -> Rows:
    top = {(r["run"], r["router"]): r["max_entries"] for r in router_rows}
    per = []
    for (run, router, role), rs in group(rb, "run", "router", "role").items():
        per.append({"run": run, "role": role, "msgs": sum(r["fwd_msgs"] for r in rs),
                    "bytes": sum(r["fwd_bytes"] for r in rs),
                    "ctrl": sum(_control(r) for r in rs),
                    "secs": ssum(r["seconds"] for r in rs),
                    "peak_rate": smax(ratio(r["fwd_msgs"], r["seconds"]) for r in rs),
                    "entries": savg(r["entries"] for r in rs),
                    "peak_entries": greatest(smax(r["entries"] for r in rs),
                                             top.get((run, router)))})
    return ordered(({"run": run, "role": role, "routers": len(rs),
                     "fwd_msgs": sum(r["msgs"] for r in rs),
                     "msgs_per_s_per_router": savg(ratio(r["msgs"], r["secs"]) for r in rs),
                     "peak_msgs_per_s": smax(r["peak_rate"] for r in rs),
                     "bytes_per_s_per_router": savg(ratio(r["bytes"], r["secs"]) for r in rs),
                     "control_per_s_per_router": savg(ratio(r["ctrl"], r["secs"]) for r in rs),
                     "entries_mean": savg(r["entries"] for r in rs),
                     "entries_peak": smax(r["peak_entries"] for r in rs)}
                    for (run, role), rs in group(per, "run", "role").items()), "run", "role")


# ----------------------------------------------------------------------------- flows
def _bigint(text: str) -> int | None:
    n = int(text)
    return n if n < 1 << 63 else None


def fanout(valid: Rows, role_of: dict[tuple[str, str], str], tc: Rows) -> Rows:
    snap: dict[tuple[Any, ...], int] = defaultdict(int)
    for r in valid:
        if r["kind"] == "snapshot":
            role = role_of.get((r["run"], r["router"]))
            for k, n in (r["fanout"] or {}).items():
                snap[(r["run"], role, _bigint(k))] += n
    out = [{"run": run, "source": "snapshot", "role": role, "fanout": f, "count": n}
           for (run, role, f), n in snap.items()]
    out += [{"run": run, "source": "fwd", "role": role, "fanout": f,
             "count": sum(r["w"] for r in rs)}
            for (run, role, f), rs in group((r for r in tc if r["kind"] == "fwd"),
                                            "run", "role", "out_links").items()]
    return ordered(out, "run", "source", "role", "fanout")


def flows(valid: Rows) -> Rows:
    up_role = {k: max_by(rs, lambda r: r["role"], lambda r: r["t"])
               for k, rs in group((r for r in valid if r["kind"] == "link_up"
                                   and r["role"] != "unknown"),
                                  "run", "router", "link").items()}
    links: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, set()])
    for r in valid:
        if r["kind"] == "link_add" and r["cause"] is not None and r["cause"] not in MASK_CAUSES:
            role = r["role"] if r["role"] not in (None, "unknown") else None
            peer = role if role is not None else up_role.get((r["run"], r["router"], r["link"]))
            acc = links[(r["run"], r["flow"])]
            acc[0] += 1
            if peer == "endpoint":
                acc[1].add((r["router"], r["link"]))
    out = []
    for (run, flow), rs in group((r for r in valid if r["flow"] is not None),
                                 "run", "flow").items():
        adds = [r for r in rs if r["kind"] == "entry_add"]
        la = links.get((run, flow), [0, set()])
        out.append({"run": run, "flow": flow, "routers": len({r["router"] for r in adds}),
                    "entry_adds": len(adds), "first_t": smin(r["t"] for r in adds),
                    "last_del_t": smax(r["t"] for r in rs if r["kind"] == "entry_del"),
                    "fwd_msgs": sum(r["w"] for r in rs if r["kind"] == "fwd"),
                    "drop_msgs": sum(r["w"] for r in rs if r["kind"] == "drop"),
                    "link_adds": la[0], "members": len(la[1])})
    return out


def tree_size(flow_rows: Rows) -> Rows:
    return ordered(({"run": run, "members": m, "flows": len(rs),
                     "routers_mean": savg(r["routers"] for r in rs),
                     "routers_p50": percentile([r["routers"] for r in rs], 0.5),
                     "routers_max": max(r["routers"] for r in rs),
                     "link_adds_mean": savg(r["link_adds"] for r in rs),
                     "entry_adds_mean": savg(r["entry_adds"] for r in rs)}
                    for (run, m), rs in group((r for r in flow_rows if r["entry_adds"] > 0),
                                              "run", "members").items()),
                   "run", "members")
