"""The seed's three graphs per run (Figures 27-34): sequence numbers by partition, latency
and delivery rate against time (matplotlib, imported only when drawing)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .igo import MembershipChange, StateChange
from .scenarios import RunResult


def seq_lines(res: RunResult, site: str) -> dict[str, list[tuple[float, int, bool]]]:
    """The seed's sequence-number graph at *site*: per side of the partition ("same side":
    the sites sharing *site*'s side during the outages, "other side": the rest), the
    ``(delivery time, sequence number, late)`` of each delivered message, in delivery
    order."""
    side = res.groups[site]
    out: dict[str, list[tuple[float, int, bool]]] = {"same side": [], "other side": []}
    for d in res.deliveries[site]:
        out["same side" if d.origin in side else "other side"].append(
            (d.delivery_time, d.seq, d.late))
    return out


def zoom_window(res: RunResult) -> tuple[float, float] | None:
    """The seed's zoom (Figure 27: 80-200 s around three outages): from 10 s before an
    outage (the first starting after 60 s if three follow it, else the first) to 20 s after
    the third from there ends; None without outages."""
    outs = [o for o in res.outages if o[0] < res.duration]
    if not outs:
        return None
    k = next((i for i, (a, _) in enumerate(outs) if a >= 60 and i + 3 <= len(outs)), 0)
    last = outs[min(k + 2, len(outs) - 1)]
    return max(0.0, outs[k][0] - 10.0), min(res.duration, last[1] + 20.0)


def plot(res: RunResult, outdir: Path) -> list[Path]:
    """The seed's three graphs (Figures 27-34): sequence numbers by partition, latency and
    delivery rate against time, one panel per site, outages shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    sites = list(res.deliveries)
    exp = res.experiment
    paths = []

    def shade(ax: Any) -> None:
        for a, b in res.outages:
            ax.axvspan(a, b, color="0.85", zorder=0)

    def finish(ax: Any, site: str, unit: str) -> None:
        ax.set_ylabel(f"{site}\n{unit}")
        ax.legend(fontsize=6, loc="upper left")

    def save(fig: Any, what: str, name: str) -> None:
        fig.suptitle(f"Test {exp.number} ({exp.mode}, {exp.scenario}): {what}")
        fig.tight_layout()
        p = outdir / name
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)

    # 1. sequence numbers vs delivery time: one line per side of the partition (the seed's
    # Figures 27, 29, 32, 33), the whole run and the seed's zoom window side by side
    window = zoom_window(res)
    ncols = 2 if window else 1
    fig, axes = plt.subplots(len(sites), ncols, figsize=(7 * ncols, 2.6 * len(sites)),
                             squeeze=False)
    top = max((d.seq for log in res.deliveries.values() for d in log), default=1)
    shift = max(5, round(top * 0.15))
    for row, site in zip(axes, sites):
        lines = seq_lines(res, site)
        for col, ax in enumerate(row):
            shade(ax)
            for name, pts in lines.items():
                if not pts:
                    continue
                same = name == "same side"
                xs = [t for t, _, _ in pts]
                ys = [q if same else q - shift for _, q, _ in pts]
                who = sorted(o for o in res.sites if (o in res.groups[site]) == same)
                label = (f"{name}: {', '.join(who)}"
                         + ("" if same else f" (shifted down {shift})"))
                ax.plot(xs, ys, "-", linewidth=0.5, color="tab:blue" if same else "tab:red")
                ax.scatter(xs, ys, s=7, marker="o" if same else "s",
                           color="tab:blue" if same else "tab:red", label=label)
                late = [(t, q if same else q - shift) for t, q, lt in pts if lt]
                if late:
                    lx, ly = zip(*late)
                    ax.scatter(lx, ly, s=16, facecolors="none", edgecolors="k",
                               linewidths=0.5, label=f"late ({name})")
            if col == 1 and window:
                ax.set_xlim(*window)
                seen = [q if name == "same side" else q - shift
                        for name, pts in lines.items() for t, q, _ in pts
                        if window[0] <= t <= window[1]]
                if seen:
                    pad = max(2.0, 0.05 * (max(seen) - min(seen)))
                    ax.set_ylim(min(seen) - pad, max(seen) + pad)
                ax.set_title(f"zoom {window[0]:g}-{window[1]:g} s", fontsize=8)
            finish(ax, site, "seq no.")
    for ax in axes[-1]:
        ax.set_xlabel("time (s)")
    save(fig, "sequence numbers of delivered messages, one line per side of the partition",
         "seq.png")
    # 2. latency vs time
    fig, axes = plt.subplots(len(sites), 1, figsize=(10, 2.2 * len(sites)), sharex=True)
    for ax, site in zip(axes, sites):
        shade(ax)
        log = res.deliveries[site]
        ax.scatter([d.delivery_time for d in log if not d.late],
                   [d.latency for d in log if not d.late], s=3, color="tab:blue",
                   label="in order")
        ax.scatter([d.delivery_time for d in log if d.late],
                   [d.latency for d in log if d.late], s=5, color="tab:red", label="late")
        # view changes: this site's ordering set changed (solid), a peer went disconnected
        # or stalled (dashed)
        views = [e.time for e in res.events.get(site, ()) if isinstance(e, MembershipChange)]
        cuts = [e.time for e in res.events.get(site, ())
                if isinstance(e, StateChange) and e.peer is not None and e.new != "S1"]
        for i, t in enumerate(views):
            ax.axvline(t, color="tab:green", linewidth=0.6,
                       label="view change" if i == 0 else None)
        for i, t in enumerate(cuts):
            ax.axvline(t, color="tab:orange", linewidth=0.6, linestyle="--",
                       label="peer disconnected / stalled" if i == 0 else None)
        finish(ax, site, "latency (s)")
    axes[-1].set_xlabel("delivery time (s)")
    save(fig, "message latency", "latency.png")
    # 3. delivery rate (messages/s, 1 s bins, 5 s moving average)
    fig, axes = plt.subplots(len(sites), 1, figsize=(10, 2.0 * len(sites)), sharex=True)
    nb = int(math.ceil(res.duration)) + 1
    for ax, site in zip(axes, sites):
        shade(ax)
        bins = [0] * nb
        for d in res.deliveries[site]:
            i = int(d.delivery_time)
            if 0 <= i < nb:
                bins[i] += 1
        ma = [sum(bins[max(0, i - 4):i + 1]) / min(5, i + 1) for i in range(nb)]
        ax.plot(range(nb), bins, color="0.6", linewidth=0.5, label="per second")
        ax.plot(range(nb), ma, color="tab:blue", linewidth=1.2, label="5 s average")
        finish(ax, site, "msgs/s")
    axes[-1].set_xlabel("time (s)")
    save(fig, "delivery rate", "rate.png")
    return paths
