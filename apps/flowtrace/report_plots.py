"""The analyze report's plots (matplotlib, Agg backend), one PNG per figure.

Every figure that draws one line per run (or per run and role) draws at most
:data:`MAX_SERIES` of them and says in its title how many it left out and where they are
(the tables). Imports the standard library and, lazily, matplotlib.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .render import fmt


class Plots:
    def __init__(self, out_dir: str) -> None:
        self.dir = os.path.join(out_dir, "plots")
        self.error: str | None = None
        #: what the figures leave out (one line each, for the report)
        self.left_out: list[str] = []
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


MAX_SERIES = 4


def first(items: dict[Any, Any], p: Plots, what: str, table: str, limit: int = MAX_SERIES,
          figure: str = "") -> tuple[list[tuple[Any, Any]], str]:
    """The first *limit* series and, when some are left out, a title suffix saying so (also
    noted in ``p.left_out`` for the report)."""
    pairs = list(items.items())
    if len(pairs) <= limit:
        return pairs, ""
    note = f"first {limit} of {len(pairs)} {what} drawn; all are in tables/{table}"
    p.left_out.append(f"{figure}: {note}" if figure else note)
    return pairs[:limit], f"\n({note})"


def pooled(rows: Sequence[dict[str, Any]]) -> str:
    """A title suffix for a figure that adds up several runs."""
    runs = {r["run"] for r in rows}
    return f" (pooled over {len(runs)} runs)" if len(runs) > 1 else ""


def by_run(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r["run"]].append(r)
    return dict(out)


def run_name(run: str | None) -> str:
    """A run's name as a headline gives it (traces without ``run`` make one unnamed run)."""
    return f"run {run}" if run else "the run (traces without a 'run' tag)"


def _label(run: str, what: str) -> str:
    return f"{run}: {what}" if run else what


def draw(p: Plots, summary: dict[str, Any], data: dict[str, Any]) -> dict[str, str]:
    made: dict[str, str] = {}
    plt = p.plt
    net = by_run(data.get("network", []))
    width = float(summary["bucket_seconds"])
    if net:
        # snapshot values describe the end of their bucket; per-bucket counts are rates over
        # the seconds the bucket covers, drawn as steps (no interpolation, no partial-bucket
        # drop); live flows get their own axis (20x fewer than entries)
        fig, (ax, ax2) = p.figure(2, 3.0)
        shown, more = first(net, p, "runs", "network_buckets", figure="entries")
        for run, rows in shown:
            x = [r["bucket"] + min(width, r["seconds"] or width) for r in rows]
            ax.plot(x, [r["entries_total"] for r in rows], "o-", ms=2,
                    label=_label(run, f"entries (n={len(rows)} buckets)"))
            ax.plot(x, [r["active_flows"] for r in rows], "s--", ms=2,
                    label=_label(run, "active entries"))
            ax2.plot(x, [r["flows_live"] for r in rows], "o-", ms=2,
                     label=_label(run, "live flows"))
        ax.set_ylabel("entries (all routers)")
        ax.set_title("Flow-table entries and active entries (at the end of each bucket)" + more)
        ax.legend(fontsize=8)
        ax2.set_ylabel("live flows")
        ax2.set_xlabel("time (s)")
        ax2.legend(fontsize=8)
        made["entries"] = p.save(fig, "entries.png")

        fig, (ax,) = p.figure()
        styles = ("-", "--", "-.", ":")
        shown, more = first(net, p, "runs", "network_buckets", limit=2, figure="churn")
        for run, rows in shown:
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
                     "divided by the seconds it covers)" + more)
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
        ax.set_title(f"Entries per router: the {len(series)} largest tables of "
                     f"{len(data.get('routers', [])) or '?'} routers (solid: snapshots, "
                     "dotted: replay)")
        ax.legend(fontsize=7, ncol=2)
        made["top"] = p.save(fig, "top_routers.png")

    hist = data.get("gc_hist", [])
    if hist:
        fig, (ax,) = p.figure()
        shown, more = first(by_run(hist), p, "runs", "gc_lag_hist", figure="GC lag")
        for run, rows in shown:
            ax.bar([r["lo"] for r in rows], [r["count"] for r in rows],
                   width=[r["hi"] - r["lo"] for r in rows], align="edge", alpha=0.6,
                   label=run or None)
        ax.set_xlabel("GC lag: last traffic on (flow, link) to its deletion (s)")
        ax.set_ylabel("deletions")
        ax.set_title("GC lag" + more)
        if len(by_run(hist)) > 1:
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
        ax.set_title("Traffic saved by drops, by reason" + pooled(sav))
        made["savings"] = p.save(fig, "savings.png")

    load = data.get("load", [])
    if load:
        fig, (a1, a2) = p.figure(2, 3.0)
        series2: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in load:
            series2[(r["run"], r["role"])].append(r)
        shown2, more = first(series2, p, "(run, role) series", "load_by_role", limit=9,
                             figure="load by role")
        for (run, role), rows in shown2:
            x = [r["bucket"] for r in rows]
            n = rows[0]["routers"]
            a1.step(x, [(r["fwd_msgs_mean"] / r["seconds"]) if r["seconds"] else 0.0
                        for r in rows], where="post", label=_label(run, f"{role} (n={n})"))
            a2.plot([r["bucket"] + min(width, r["seconds"] or width) for r in rows],
                    [r["entries_mean"] for r in rows], "o-", ms=2,
                    label=_label(run, f"{role} (n={n})"))
        a1.set_ylabel("messages/s per router")
        a1.set_title("Forwarding load per router, by role (scaled)" + more)
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
            ax.set_title(f"Fan-out: {title}{pooled(fan)}")
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
        shown, more = first(by_run(tree), p, "runs", "tree_size", figure="tree size")
        for run, rows in shown:
            ax.plot([r["members"] for r in rows], [r["routers_mean"] for r in rows], "o-",
                    ms=3, label=_label(run, "mean routers holding the flow"))
        ax.set_xlabel("members (endpoint links) of the flow")
        ax.set_ylabel("routers with an entry")
        ax.set_title("State per flow vs tree size" + more)
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
