"""The flowtrace report: Markdown and HTML from the job's small aggregates, PNG plots.

:func:`write_report` is driver-side only (no Spark): it gets the summary and the collected
tables from :func:`flowtrace.job.analyze`, draws the plots with matplotlib (Agg backend;
without matplotlib the report is written without plots and says so) and renders one list of
blocks both as ``report.md`` and as a self-contained-looking ``report.html`` (images are files
under ``plots/`` next to it). :func:`console_summary` is the short text printed by the CLI.
"""

from __future__ import annotations

import html
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

Block = tuple[str, Any]


# ----------------------------------------------------------------------------- formatting
def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        if x == int(x) and abs(x) < 1e15:
            return f"{int(x):,}"
        if abs(x) >= 1e6:
            return f"{x:.{digits}g}"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def fmt_bytes(x: Any) -> str:
    if x is None:
        return "–"
    x = float(x)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(x) < 1024 or unit == "PiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(x)  # pragma: no cover


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


# ----------------------------------------------------------------------------- rendering
def render_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for kind, body in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + body)
        elif kind == "p":
            out.append(body)
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in body))
        elif kind == "img":
            path, alt = body
            out.append(f"![{alt}]({path})")
        elif kind == "table":
            header, rows = body
            esc = [[str(c).replace("|", "\\|") for c in r] for r in [header, *rows]]
            out.append("| " + " | ".join(esc[0]) + " |")
            out.append("|" + "|".join("---" for _ in header) + "|")
            out += ["| " + " | ".join(r) + " |" for r in esc[1:]]
        elif kind == "code":
            out.append("```\n" + body + "\n```")
        out.append("")
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;
padding:.25em .6em;text-align:right}th{background:#f3f3f3}td:first-child,th:first-child
{text-align:left}img{max-width:100%;border:1px solid #eee}code,pre{background:#f6f6f6}
pre{padding:.6em;overflow-x:auto}"""


def _inline(text: str) -> str:
    """Escape, then render `code` and **bold** spans."""
    parts = html.escape(text).split("`")
    for i in range(1, len(parts), 2):
        parts[i] = f"<code>{parts[i]}</code>"
    out = "".join(parts)
    bits = out.split("**")
    for i in range(1, len(bits), 2):
        bits[i] = f"<b>{bits[i]}</b>"
    return "".join(bits)


def render_html(blocks: Sequence[Block], title: str) -> str:
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"]
    for kind, body in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append(f"<{kind}>{_inline(body)}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_inline(body)}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in body) + "</ul>")
        elif kind == "img":
            path, alt = body
            out.append(f"<p><img src='{html.escape(path)}' alt='{html.escape(alt)}'></p>")
        elif kind == "table":
            header, rows = body
            out.append("<table><tr>" + "".join(f"<th>{_inline(str(h))}</th>" for h in header)
                       + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in r) + "</tr>"
                    for r in rows]
            out.append("</table>")
        elif kind == "code":
            out.append(f"<pre>{html.escape(body)}</pre>")
    out.append("</body></html>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- plots
class _Plots:
    def __init__(self, out_dir: str) -> None:
        self.dir = os.path.join(out_dir, "plots")
        self.error: str | None = None
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            self.plt = plt
        except ImportError:  # pragma: no cover - depends on the machine
            self.plt = None  # type: ignore[assignment]
            self.error = "matplotlib is not installed: no plots (pip install matplotlib)"
        os.makedirs(self.dir, exist_ok=True)

    def figure(self, nrows: int = 1, height: float = 3.6) -> tuple[Any, Any]:
        fig, axes = self.plt.subplots(nrows, 1, figsize=(9, height * nrows), squeeze=False)
        return fig, [a[0] for a in axes]

    def save(self, fig: Any, name: str) -> str:
        fig.tight_layout()
        fig.savefig(os.path.join(self.dir, name), dpi=100)
        self.plt.close(fig)
        return f"plots/{name}"


def _by_run(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r["run"]].append(r)
    return dict(out)


def _run(run: str | None) -> str:
    """A run's name as a headline gives it (traces without ``run`` make one unnamed run)."""
    return f"run {run}" if run else "the run (traces without a 'run' tag)"


def _label(run: str, what: str) -> str:
    return f"{run}: {what}" if run else what


def _plots(p: _Plots, summary: dict[str, Any], data: dict[str, Any]) -> dict[str, str]:
    made: dict[str, str] = {}
    plt = p.plt
    net = _by_run(data.get("network", []))
    width = float(summary["bucket_seconds"])
    if net:
        # snapshot values describe the end of their bucket; per-bucket counts are rates over
        # the seconds the bucket covers, drawn as steps (no interpolation, no partial-bucket
        # drop); live flows get their own axis (20x fewer than entries)
        fig, (ax, ax2) = p.figure(2, 3.0)
        for run, rows in list(net.items())[:4]:
            x = [r["bucket"] + min(width, r["seconds"] or width) for r in rows]
            ax.plot(x, [r["entries_total"] for r in rows], "o-", ms=2,
                    label=_label(run, f"entries (n={len(rows)} buckets)"))
            ax.plot(x, [r["active_flows"] for r in rows], "s--", ms=2,
                    label=_label(run, "active entries"))
            ax2.plot(x, [r["flows_live"] for r in rows], "o-", ms=2,
                     label=_label(run, "live flows"))
        ax.set_ylabel("entries (all routers)")
        ax.set_title("Flow-table entries and active entries (at the end of each bucket)")
        ax.legend(fontsize=8)
        ax2.set_ylabel("live flows")
        ax2.set_xlabel("time (s)")
        ax2.legend(fontsize=8)
        made["entries"] = p.save(fig, "entries.png")

        fig, (ax,) = p.figure()
        styles = ("-", "--", "-.", ":")
        for run, rows in list(net.items())[:2]:
            x = [r["bucket"] for r in rows]
            for (col, label), ls in zip((("entry_adds", "entry adds"),
                                         ("entry_dels", "entry dels"),
                                         ("link_dels_gc", "links collected by GC"),
                                         ("gc_pings", "GC pings")), styles):
                ys = [(r[col] / r["seconds"]) if r["seconds"] else 0.0 for r in rows]
                ax.step(x, ys, ls, where="post", label=_label(run, label))
        ax.set_xlabel("time (s)")
        ax.set_ylabel("events per second")
        ax.set_title(f"Churn (rates per {fmt(width)} s bucket; a partial last bucket is "
                     "divided by the seconds it covers)")
        ax.legend(fontsize=8)
        made["churn"] = p.save(fig, "churn.png")

    top = data.get("top_routers", [])
    if top:
        fig, (ax,) = p.figure()
        series: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in top:
            series[(r["run"], r["router"])].append(r)
        for (run, router), rows in series.items():
            x = [r["bucket"] + min(width, r["seconds"] or width) for r in rows]
            line, = ax.plot(x, [r["entries"] for r in rows],
                            label=_label(run, f"{router} ({rows[0]['role']})"))
            ax.plot(x, [r["entries_replay"] for r in rows], ":", color=line.get_color())
        ax.set_xlabel("time (s)")
        ax.set_ylabel("entries")
        ax.set_title("Entries per router, largest tables (solid: snapshots, dotted: replay)")
        ax.legend(fontsize=7, ncol=2)
        made["top"] = p.save(fig, "top_routers.png")

    hist = data.get("gc_hist", [])
    if hist:
        fig, (ax,) = p.figure()
        for run, rows in list(_by_run(hist).items())[:4]:
            ax.bar([r["lo"] for r in rows], [r["count"] for r in rows],
                   width=[r["hi"] - r["lo"] for r in rows], align="edge", alpha=0.6,
                   label=run or None)
        ax.set_xlabel("GC lag: last traffic on (flow, link) to its deletion (s)")
        ax.set_ylabel("deletions")
        ax.set_title("GC lag")
        if len(_by_run(hist)) > 1:
            ax.legend(fontsize=8)
        made["gc"] = p.save(fig, "gc_lag.png")

    sav = data.get("savings", [])
    if sav:
        agg: dict[str, float] = defaultdict(float)
        for r in sav:
            agg[r["reason"]] += r["est_link_bytes"] or 0
        fig, (ax,) = p.figure()
        names = sorted(agg, key=lambda k: -agg[k])
        ax.barh(names, [agg[k] for k in names])
        ax.set_xlabel("estimated link bytes not sent (scaled by sampling)")
        ax.set_title("Traffic saved by drops, by reason")
        made["savings"] = p.save(fig, "savings.png")

    load = data.get("load", [])
    if load:
        fig, (a1, a2) = p.figure(2, 3.0)
        series2: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in load:
            series2[(r["run"], r["role"])].append(r)
        for (run, role), rows in list(series2.items())[:9]:
            x = [r["bucket"] for r in rows]
            n = rows[0]["routers"]
            a1.step(x, [(r["fwd_msgs_mean"] / r["seconds"]) if r["seconds"] else 0.0
                        for r in rows], where="post", label=_label(run, f"{role} (n={n})"))
            a2.plot([r["bucket"] + min(width, r["seconds"] or width) for r in rows],
                    [r["entries_mean"] for r in rows], "o-", ms=2,
                    label=_label(run, f"{role} (n={n})"))
        a1.set_ylabel("messages/s per router")
        a1.set_title("Forwarding load per router, by role (scaled)")
        a2.set_ylabel("entries / router")
        a2.set_xlabel("time (s)")
        a1.legend(fontsize=8)
        made["load"] = p.save(fig, "load_by_role.png")

    fan = data.get("fanout", [])
    if fan:
        fig, (a1, a2) = p.figure(2, 3.0)
        for ax, source, title in ((a1, "snapshot", "downstream links per entry (snapshots)"),
                                  (a2, "fwd", "copies per forwarded message (scaled)")):
            by_role: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
            for r in fan:
                if r["source"] == source:
                    by_role[r["role"] or "?"][r["fanout"]] += r["count"]
            for role, hist2 in sorted(by_role.items()):
                ks = sorted(hist2)
                ax.plot(ks, [hist2[k] for k in ks], "o-", ms=3,
                        label=f"{role} (n={fmt(sum(hist2.values()))})")
            ax.set_title(f"Fan-out: {title}")
            if by_role:
                ax.set_yscale("log")
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "no records", ha="center", va="center",
                        transform=ax.transAxes)
        a2.set_xlabel("fan-out")
        made["fanout"] = p.save(fig, "fanout.png")

    tree = data.get("tree", [])
    if tree:
        fig, (ax,) = p.figure()
        for run, rows in list(_by_run(tree).items())[:4]:
            ax.plot([r["members"] for r in rows], [r["routers_mean"] for r in rows], "o-",
                    ms=3, label=_label(run, "mean routers holding the flow"))
        ax.set_xlabel("members (endpoint links) of the flow")
        ax.set_ylabel("routers with an entry")
        ax.set_title("State per flow vs tree size")
        ax.legend(fontsize=8)
        made["tree"] = p.save(fig, "tree_size.png")

    points = data.get("run_points", [])
    chosen = [f for f in data.get("fit_results", []) if hasattr(f, "coef")]
    if points and chosen:
        from .fit import value_at

        fig, (ax,) = p.figure()
        for f in chosen:
            if f.target != "total_entries":
                continue
            pts = [(value_at(f, r), r[f.target]) for r in points]
            ax.scatter([a for a, _ in pts], [b for _, b in pts], s=14,
                       label=f"{f.model} (n={f.n} runs)")
        ax.set_xlabel("fitted entries (all routers)")
        ax.set_ylabel("observed")
        ax.set_title("Table size across runs: observed vs fitted")
        ax.legend(fontsize=8)
        made["fit"] = p.save(fig, "fit.png")
    del plt
    return made


# ----------------------------------------------------------------------------- the report
def build_blocks(summary: dict[str, Any], data: dict[str, Any], images: dict[str, str],
                 plot_error: str | None) -> list[Block]:
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
                   f"{fmt(summary.get('wall_seconds'))} s."))
    notes = list(summary.get("notes", []))
    if plot_error:
        notes.append(plot_error)
    if notes:
        b.append(("ul", notes))
    if summary.get("records_by_kind"):
        b.append(("table", (["record kind", "records"],
                            [[k, fmt(v)] for k, v in summary["records_by_kind"].items()])))

    b.append(("h2", "Input errors"))
    errs = data.get("errors", [])
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
                              _pct(r["share_of_offered_tx"]),
                              _pct(r["share_of_offered_bytes"])] for r in sav])))
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
        by_role = {row["role"]: row for row in ls}
        if "core" in by_role and "edge" in by_role and by_role["edge"]["msgs_per_s_per_router"]:
            ratio = ((by_role["core"]["msgs_per_s_per_router"] or 0)
                     / by_role["edge"]["msgs_per_s_per_router"])
            b.append(("p", f"A core router forwards {ratio:.1f}x the messages of an edge router "
                           "on average."))
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
                       f"{_pct(snap.get(1, 0) / tot if tot else None)}."))
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
             fmt(r["n"]), _pct(r["loo_error"]), r["note"] or ""] for r in fits]
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


def write_report(out_dir: str, summary: dict[str, Any], data: dict[str, Any]
                 ) -> tuple[str, str]:
    """Write report.md, report.html and plots/*.png; returns the two report paths."""
    plots = _Plots(out_dir)
    images = _plots(plots, summary, data) if plots.plt is not None else {}
    blocks = build_blocks(summary, data, images, plots.error)
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
        "lines/s)",
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
                         f"{_pct(f['loo_error'])})")
    for reason, targets in refused.items():
        lines.append(f"  no scaling fit ({', '.join(targets)}): {reason}")
    for n in summary.get("notes", []):
        lines.append(f"  note: {n}")
    return "\n".join(lines)
