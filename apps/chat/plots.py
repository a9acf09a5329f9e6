"""The seed's three graphs per run (Figures 27-34): sequence numbers by partition, latency
and delivery rate against time (matplotlib, imported only when drawing)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .scenarios import RunResult


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
    colours = {"metropol": "tab:blue", "commonwe": "tab:orange", "kingdom": "tab:green",
               "republic": "tab:red"}

    def shade(ax: Any) -> None:
        for a, b in res.outages:
            ax.axvspan(a, b, color="0.85", zorder=0)

    # 1. sequence numbers vs delivery time, by partition (same side: circles, other: squares)
    fig, axes = plt.subplots(len(sites), 1, figsize=(10, 2.4 * len(sites)), sharex=True)
    for ax, site in zip(axes, sites):
        shade(ax)
        side = res.groups[site]
        for origin in res.sites:
            pts = [(d.delivery_time, d.seq) for d in res.deliveries[site] if d.origin == origin]
            if not pts:
                continue
            xs, ys = zip(*pts)
            marker = "o" if origin in side else "s"
            ax.scatter(xs, ys, s=6, marker=marker, color=colours.get(origin),
                       label=f"{origin} ({'same side' if origin in side else 'other side'})")
        late = [(d.delivery_time, d.seq) for d in res.deliveries[site] if d.late]
        if late:
            xs, ys = zip(*late)
            ax.scatter(xs, ys, s=14, facecolors="none", edgecolors="k", linewidths=0.5,
                       label="late")
        ax.set_ylabel(f"{site}\nseq no.")
        ax.legend(fontsize=6, loc="upper left", ncol=3)
    axes[-1].set_xlabel("time (s)")
    fig.suptitle(f"Test {exp.number} ({exp.mode}, {exp.scenario}): sequence numbers of "
                 "delivered messages, by partition")
    fig.tight_layout()
    p = outdir / "seq.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
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
        ax.set_ylabel(f"{site}\nlatency (s)")
        ax.legend(fontsize=6, loc="upper left")
    axes[-1].set_xlabel("delivery time (s)")
    fig.suptitle(f"Test {exp.number} ({exp.mode}, {exp.scenario}): message latency")
    fig.tight_layout()
    p = outdir / "latency.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
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
        ax.set_ylabel(f"{site}\nmsgs/s")
        ax.legend(fontsize=6, loc="upper left")
    axes[-1].set_xlabel("time (s)")
    fig.suptitle(f"Test {exp.number} ({exp.mode}, {exp.scenario}): delivery rate")
    fig.tight_layout()
    p = outdir / "rate.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
    return paths
