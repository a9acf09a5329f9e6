"""The flowtrace report: Markdown and HTML from the job's small aggregates, PNG plots.

:func:`write_report` is driver-side only (no Spark): it gets the summary and the collected
tables from :func:`flowtrace.job.analyze`, draws the plots with matplotlib (Agg backend;
without matplotlib the report is written without plots and says so) and renders one list of
blocks both as ``report.md`` and as a self-contained-looking ``report.html`` (images are files
under ``plots/`` next to it). :func:`console_summary` is the short text printed by the CLI.
Rendering and number formats: :mod:`flowtrace.render`; plots: :mod:`flowtrace.report_plots`.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from . import report_plots
from .render import Block, fmt, fmt_bytes, pct, render_html, render_markdown
from .report_plots import run_name as _run

__all__ = ["Block", "build_blocks", "console_summary", "fmt", "fmt_bytes", "render_html",
           "render_markdown", "write_report"]


# ----------------------------------------------------------------------------- the report
def build_blocks(summary: dict[str, Any], data: dict[str, Any], images: dict[str, str],
                 plot_error: str | None, plot_notes: Sequence[str] = ()) -> list[Block]:
    b: list[Block] = [("h1", "flowtrace: flow-table scaling report")]
    if summary.get("header"):
        from .provenance import header_lines

        b.append(("ul", header_lines(summary["header"])))
    roles = ", ".join(f"{v} {k}" for k, v in summary.get("routers_by_role", {}).items())
    b.append(("p", f"{fmt(summary['lines'])} trace lines from {fmt(summary['files'])} file(s); "
                   f"{fmt(summary['records'])} valid records, {fmt(summary['corrupt'])} corrupt "
                   f"lines, {fmt(summary['invalid'])} schema violations. "
                   f"{fmt(summary.get('routers'))} routers ({roles}), "
                   f"{fmt(summary.get('flows'))} flows, time bucket "
                   f"{fmt(summary['bucket_seconds'])} s. Analysed in "
                   f"{fmt(summary.get('wall_seconds'))} s by the "
                   f"{summary.get('engine', 'spark')} engine."))
    notes = list(summary.get("notes", []))
    if plot_error:
        notes.append(plot_error)
    notes += [f"plot {n}" for n in plot_notes]
    if notes:
        b.append(("ul", notes))
    if summary.get("records_by_kind"):
        b.append(("table", (["record kind", "records"],
                            [[k, fmt(v)] for k, v in summary["records_by_kind"].items()])))

    b.append(("h2", "Input errors"))
    errs = data.get("errors", [])
    clock = summary.get("clock") or {}
    offs = data.get("clock_offsets", [])
    if clock.get("tolerance"):
        bad = [r for r in offs if r["trusted"] is not True]
        b.append(("p", f"Clocks: offsets estimated for {fmt(len(offs))} router(s) from the "
                       "links both ends saw come up; a router more than "
                       f"{fmt(clock['tolerance'])} s off the majority of the routers it "
                       "connects to is left out (all its records: "
                       f"{fmt(clock.get('records_left_out'))} in all). "
                       + ("Not trusted or undecided:" if bad else
                          "Every estimated clock agrees.")))
        if bad:
            b.append(("table", (["run", "router", "offset (s)", "links", "verdict"],
                                [[r["run"], r["router"], fmt(r["offset"]), fmt(r["links"]),
                                  r["note"]] for r in bad])))
    outl = data.get("clock_outliers", [])
    if outl:
        b.append(("p", "Clock outliers (records far outside their run's time range, left "
                       "out), per router:"))
        b.append(("table", (["run", "router", "records", "from (s)", "to (s)"],
                            [[r["run"], r["router"], fmt(r["records"]), fmt(r["min_t"]),
                              fmt(r["max_t"])] for r in outl[:20]])))
    if errs:
        b.append(("p", "Lines that are not JSON objects are *corrupt*; JSON objects that break "
                       "the schema are *invalid*. Both are left out; more than --max-bad-fraction "
                       "of them fails the run."))
        b.append(("table", (["class", "reason", "lines", "example file", "example line"],
                            [[r["class"], r["reason"], fmt(r["count"]),
                              os.path.basename(str(r["example_file"] or "")),
                              "`" + str(r["example_line"] or "")[:80].replace("`", "'") + "`"]
                             for r in errs])))
    else:
        b.append(("p", "None: every line is a valid record."))

    b.append(("h2", "Table entries over time"))
    peaks = summary.get("peaks") or {}
    if peaks:
        b.append(("p", "Peaks are exact: the maximum over every snapshot and every entry "
                       "event (a router's size between snapshots is its last snapshot plus the "
                       "entries added and removed since), not the last snapshot of a bucket. "
                       "Live flows, active entries and memory are those of the bucket the "
                       "peak falls in."))
        b.append(("table", (["run", "peak entries (all routers)", "at t (s)",
                             "largest table", "router", "at t (s)", "live flows",
                             "active entries", "memory (est.)"],
                            [[_run(p["run"]), fmt(p["entries_total"]), fmt(p["t"]),
                              fmt(p["entries_max"]), p["router_max"] or "–", fmt(p["t_max"]),
                              fmt(p["flows_live"]), fmt(p["active_flows"]),
                              fmt_bytes(p["mem_total"])] for p in peaks.values()])))
    b.append(("p", "Per router and bucket, *entries (snapshots)* is the last snapshot at or "
                   "before the end of the bucket and *replay* counts `entry_add` minus "
                   "`entry_del` up to the end of the bucket (it needs traces from the router's "
                   "start). *Active* entries saw traffic in the last epoch; the gap between "
                   "entries and active entries is state kept alive only by the GC timers."))
    for key, alt in (("entries", "entries"), ("top", "entries per router")):
        if key in images:
            b.append(("img", (images[key], alt)))
    exact = {(r["run"], r["router"]): r for r in data.get("routers", [])}
    top: dict[tuple[str, str], dict[str, Any]] = {}
    for r in data.get("top_routers", []):
        t = top.setdefault((r["run"], r["router"]), {"role": r["role"], "peak": 0,
                                                     "replay": 0, "adds": 0, "dels": 0})
        t["peak"] = max(t["peak"], r["entries"] or 0)
        t["replay"] = max(t["replay"], r["entries_replay"] or 0)
        t["adds"] += r["entry_adds"] or 0
        t["dels"] += r["entry_dels"] or 0
    if top:
        b.append(("table", (["run", "router", "role", "peak entries (exact)", "at t (s)",
                             "peak entries (replay)", "entries added", "entries removed"],
                            [[k[0], k[1], v["role"],
                              fmt(exact.get(k, {}).get("max_entries", v["peak"])),
                              fmt(exact.get(k, {}).get("peak_t")), fmt(v["replay"]),
                              fmt(v["adds"]), fmt(v["dels"])] for k, v in top.items()])))

    b.append(("h2", "Churn and garbage collection"))
    churn = summary.get("churn", {})
    if churn:
        b.append(("table", (["event", "count"], [[k, fmt(v)] for k, v in churn.items()])))
    if "churn" in images:
        b.append(("img", (images["churn"], "churn")))
    gsum = data.get("gc_summary", [])
    if gsum:
        b.append(("p", "GC lag: from the last traffic the router saw on a (flow, link) to the "
                       "link's removal by the garbage collector, with the keep-alive pings sent "
                       "in between."))
        b.append(("table", (["run", "role", "deletions", "mean (s)", "p50", "p90", "p99", "max",
                             "pings per deletion"],
                            [[r["run"], r["role"], fmt(r["deletions"]), fmt(r["mean"]),
                              fmt(r["p50"]), fmt(r["p90"]), fmt(r["p99"]), fmt(r["max"]),
                              fmt(r["mean_pings"])] for r in gsum])))
    else:
        b.append(("p", "No link was removed by the garbage collector."))
    if "gc" in images:
        b.append(("img", (images["gc"], "GC lag")))

    b.append(("h2", "Traffic saved by filtering"))
    sav = data.get("savings", [])
    if sav:
        b.append(("p", "Drop records scaled by their sampling interval. *Link transmissions* "
                       "counts the copies not sent at the dropping router (a band-filtered "
                       "message from upstream saves one copy per downstream link); savings "
                       "further down the tree are not counted, so these are lower bounds. "
                       "*Share* is of all copies the routers were offered (sent + dropped)."))
        b.append(("table", (["run", "reason", "role", "records", "est. messages", "est. bytes",
                             "link transmissions", "link bytes", "share (tx)", "share (bytes)"],
                            [[r["run"], r["reason"], r["role"], fmt(r["records"]),
                              fmt(r["est_msgs"]), fmt_bytes(r["est_bytes"]),
                              fmt(r["est_link_tx"]), fmt_bytes(r["est_link_bytes"]),
                              pct(r["share_of_offered_tx"]),
                              pct(r["share_of_offered_bytes"])] for r in sav])))
    else:
        b.append(("p", "No drop records."))
    if "savings" in images:
        b.append(("img", (images["savings"], "savings")))

    b.append(("h2", "Load on core routers vs edge routers"))
    ls: list[dict[str, Any]] = data.get("load_summary", [])
    if ls:
        b.append(("table", (["run", "role", "routers", "msgs/s per router", "peak msgs/s",
                             "bytes/s per router", "table events/s per router",
                             "mean entries", "peak entries"],
                            [[r["run"], r["role"], fmt(r["routers"]),
                              fmt(r["msgs_per_s_per_router"]), fmt(r["peak_msgs_per_s"]),
                              fmt_bytes(r["bytes_per_s_per_router"]),
                              fmt(r["control_per_s_per_router"]), fmt(r["entries_mean"]),
                              fmt(r["entries_peak"])] for r in ls])))
        ratios = core_edge_ratios(ls)
        if len(ratios) == 1:
            run, ratio = next(iter(ratios.items()))
            b.append(("p", f"In {_run(run)}, a core router forwards {ratio:.1f}x the messages "
                           "of an edge router on average."))
        elif ratios:
            b.append(("p", "Messages a core router forwards for each one an edge router "
                           "forwards, on average, per run (not pooled: the runs differ): "
                           + "; ".join(f"{_run(k)} {v:.1f}x" for k, v in ratios.items())
                           + "."))
    if "load" in images:
        b.append(("img", (images["load"], "load by role")))

    b.append(("h2", "Fan-out and state per flow"))
    if "fanout" in images:
        b.append(("img", (images["fanout"], "fan-out")))
    fan = data.get("fanout", [])
    snap: defaultdict[Any, float] = defaultdict(float)
    for r in fan:
        if r["source"] == "snapshot":
            snap[r["fanout"]] += r["count"]
    if snap:
        tot = sum(snap.values())
        mean = sum(k * v for k, v in snap.items()) / tot if tot else 0
        b.append(("p", f"Downstream links per entry over all snapshots: mean {mean:.2f}, "
                       f"max {max(snap)}; entries with a single downstream link (pure relays): "
                       f"{pct(snap.get(1, 0) / tot if tot else None)}."))
    tree = data.get("tree", [])
    if tree:
        shown = tree if len(tree) <= 25 else tree[:20] + tree[-5:]
        b.append(("table", (["run", "members", "flows", "mean routers", "median routers",
                             "max routers", "mean link adds"],
                            [[r["run"], fmt(r["members"]), fmt(r["flows"]),
                              fmt(r["routers_mean"]), fmt(r["routers_p50"]),
                              fmt(r["routers_max"]), fmt(r["link_adds_mean"])]
                             for r in shown])))
    if "tree" in images:
        b.append(("img", (images["tree"], "tree size")))

    b.append(("h2", "Scaling model"))
    b.append(("p", "One observation per run (the run's complete bucket with the most live "
                   "flows); buckets of one run are not independent, so a single run gives no "
                   "fit. Terms: flows (live), members, routers; `linear` and `power` "
                   "(log-log) models with standard errors, "
                   "95% intervals and the error on held-out runs. For extrapolation with "
                   "designed, independent variation use `flowtrace study`."))
    fits = data.get("fit", [])
    rows = [[r["target"], r["model"], r["term"] or "–", fmt(r["coef"], 4), fmt(r["se"], 3),
             "–" if r["ci_lo"] is None else f"[{fmt(r['ci_lo'], 4)}, {fmt(r['ci_hi'], 4)}]",
             fmt(r["n"]), pct(r["loo_error"]), r["note"] or ""] for r in fits]
    if rows:
        b.append(("table", (["target", "model", "term", "coefficient", "std. error",
                             "95% interval", "runs", "held-out error", "note / refusal"],
                            rows)))
    if "fit" in images:
        b.append(("img", (images["fit"], "fit")))
    pts = data.get("run_points", [])
    if pts:
        b.append(("p", "Runs (one observation each) and the sanity check: the core routers "
                       "should hold about one entry per live flow of their LSIDs."))
        b.append(("table", (["run", "t (s)", "live flows", "members", "routers",
                             "core entries", "core / live flows", "largest table"],
                            [[r["run"], fmt(r["bucket"]), fmt(r["flows"]), fmt(r["members"]),
                              fmt(r["routers"]), fmt(r["core_entries"]),
                              fmt(r["core_entries"] / r["flows"]
                                  if r["core_entries"] is not None and r["flows"] else None),
                              fmt(r["max_entries"])] for r in pts[:30]])))

    b.append(("h2", "Tables"))
    b.append(("p", "Parquet tables under `tables/`: errors, routers, router_buckets, "
                   "network_buckets, role_entries, churn, gc_lag, gc_lag_summary, gc_lag_hist, "
                   "savings, load_by_role, load_summary, fanout, flows, tree_size, "
                   "clock_outliers, run_points, fit. "
                   "`summary.json` holds the numbers above."))
    return b


def core_edge_ratios(load_summary: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per run with both roles: core / edge messages per second per router."""
    by: dict[str, dict[str, Any]] = defaultdict(dict)
    for r in load_summary:
        by[r["run"]][r["role"]] = r["msgs_per_s_per_router"]
    return {run: (v.get("core") or 0) / v["edge"] for run, v in sorted(by.items())
            if "core" in v and v.get("edge")}


def write_report(out_dir: str, summary: dict[str, Any], data: dict[str, Any]
                 ) -> tuple[str, str]:
    """Write report.md, report.html and plots/*.png; returns the two report paths."""
    plots = report_plots.Plots(out_dir)
    images = report_plots.draw(plots, summary, data) if plots.plt is not None else {}
    blocks = build_blocks(summary, data, images, plots.error, plots.left_out)
    md = os.path.join(out_dir, "report.md")
    htm = os.path.join(out_dir, "report.html")
    with open(md, "w", encoding="utf-8") as fh:
        fh.write(render_markdown(blocks))
    with open(htm, "w", encoding="utf-8") as fh:
        fh.write(render_html(blocks, "flowtrace report"))
    return md, htm


def console_summary(summary: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    lines = [
        f"flowtrace: {fmt(summary['lines'])} lines, {fmt(summary['records'])} records, "
        f"{fmt(summary['corrupt'])} corrupt, {fmt(summary['invalid'])} invalid "
        f"({fmt(summary.get('wall_seconds'))} s, {fmt(summary.get('lines_per_second'))} "
        f"lines/s, engine {summary.get('engine', 'spark')})",
        f"  routers: {fmt(summary.get('routers'))} "
        f"{summary.get('routers_by_role', {})}; flows: {fmt(summary.get('flows'))}; "
        f"buckets of {fmt(summary['bucket_seconds'])} s: {fmt(summary.get('buckets'))}",
    ]
    for e in summary.get("errors", [])[:5]:
        lines.append(f"  {e['class']}: {e['reason']}: {fmt(e['count'])}")
    peaks = summary.get("peaks") or {}
    for p in list(peaks.values())[:5]:
        lines.append(f"  peak entries in {_run(p['run'])}: {fmt(p['entries_total'])} in all at "
                     f"t={fmt(p['t'])} s; largest table {fmt(p['entries_max'])} "
                     f"({p['router_max']} at t={fmt(p['t_max'])} s)")
    if len(peaks) > 5:
        lines.append(f"  (peaks of {len(peaks) - 5} more runs in summary.json)")
    gc = summary.get("gc") or {}
    if gc.get("deletions"):
        lines.append(f"  GC lag: p50 {fmt(gc['p50'])} s, p99 {fmt(gc['p99'])} s, max "
                     f"{fmt(gc['max'])} s over {fmt(gc['deletions'])} deletions")
    saved = summary.get("saved") or {}
    if saved:
        lines.append("  saved: " + "; ".join(
            f"{k} {fmt(v['est_link_tx'])} copies / {fmt_bytes(v['est_link_bytes'])}"
            for k, v in sorted(saved.items(), key=lambda kv: -kv[1]["est_link_bytes"])[:4]))
    refused: dict[str, list[str]] = defaultdict(list)
    for target, f in (summary.get("fit") or {}).items():
        if "refused" in f:
            refused[f["refused"]].append(target)
        else:
            lines.append(f"  fit {target}: {f['formula']} ({f['runs']} runs, held-out error "
                         f"{pct(f['loo_error'])})")
    for reason, targets in refused.items():
        lines.append(f"  no scaling fit ({', '.join(targets)}): {reason}")
    for n in summary.get("notes", []):
        lines.append(f"  note: {n}")
    return "\n".join(lines)
