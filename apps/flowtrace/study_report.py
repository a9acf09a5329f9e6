"""The report of ``flowtrace study``: model, validity range, held-out error, sanity checks.

Renders with :mod:`flowtrace.report`'s Markdown/HTML renderer and plot helper; each
target gets a plot of observed against fitted values per run (points, the diagonal, the
number of runs), and the core's table is plotted against live flows. A refused fit or
prediction is printed as its reason, never as a number.
Imports :mod:`flowtrace.report`, :mod:`flowtrace.fit` and
:mod:`flowtrace.provenance`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from . import backbone as BB
from . import fit as FIT
from . import provenance
from .render import Block, fmt, render_html, render_markdown
from .report_plots import Plots


def header(cfg: Any, wall: float) -> dict[str, Any]:
    conf = {k: v for k, v in asdict(cfg).items() if k not in ("predict", "traces")}
    conf["wall_seconds"] = round(wall, 1)
    return provenance.header(["flowrouter.testbed.sim (random meshes, a topology per run, "
                              "one core per LSID)"], conf)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _fit_table(fits: Sequence[FIT.Fit | FIT.Refusal]) -> list[Block]:
    out: list[Block] = []
    for f in fits:
        if isinstance(f, FIT.Refusal):
            out.append(("p", f"**{f.model}**: refused: {f.reason}"))
            continue
        rows = [[t, fmt(f.coef[t], 4), fmt(f.se[t], 3),
                 f"[{fmt(f.ci[t][0], 4)}, {fmt(f.ci[t][1], 4)}]"] for t in ("const", *f.terms)]
        first = f.terms[0] if f.terms else "–"
        out.append(("p", f"**{f.model}**: `{f.formula()}`; n = {f.n} runs, {f.df} degrees of "
                         f"freedom, R² {f.r2:.4f}; held-out error {_pct(f.loo_error)} "
                         f"(leave one run out), {_pct(f.extrapolation_error)} on the "
                         f"{f.extrapolation_runs} runs at the largest {first} "
                         "predicted from the others"))
        out.append(("table", (["term", "coefficient", "std. error",
                              f"{int(f.level * 100)}% interval"], rows)))
        ext = [f"{t}: " + ("not testable" if e is None else
                           f"{_pct(e)} off on the {n} run(s) at its largest value")
               + ("" if e is not None and e <= FIT.MAX_EXTRAPOLATION_ERROR
                  else " — predictions beyond its sampled range are refused")
               for t, (e, n) in f.extrapolation.items()]
        if ext:
            out.append(("p", "Extrapolation, tested per term (its largest value predicted "
                             "from the other runs):"))
            out.append(("ul", ext))
        if f.clusters:
            out.append(("p", f"Standard errors and intervals are cluster-robust over "
                             f"{f.clusters} topologies (t with {f.df} degrees of freedom)."))
        if f.notes:
            out.append(("ul", f.notes))
    return out


def _plots(p: Plots, rows: Sequence[dict[str, Any]], result: dict[str, Any]
           ) -> dict[str, str]:
    made: dict[str, str] = {}
    for target, f in result["chosen"].items():
        if f is None:
            continue
        pts = [(FIT.value_at(f, r), float(r[target])) for r in rows if r.get(target)]
        fig, (ax,) = p.figure(height=4.0)
        ax.scatter([a for a, _ in pts], [b for _, b in pts], s=12)
        hi = max(max(a, b) for a, b in pts)
        ax.plot([0, hi], [0, hi], "k:", lw=1, label="observed = fitted")
        ax.set_xlabel(f"fitted ({f.model} model)")
        ax.set_ylabel(f"observed {target}")
        ax.set_title(f"{target}: {len(pts)} runs")
        ax.legend(fontsize=8)
        made[target] = p.save(fig, f"study_{target}.png")
    for target, f in result["chosen"].items():
        law = _law_plot(p, rows, target, f)
        if law:
            made[f"law_{target}"] = law
    bb_rows = result.get("backbone_runs") or []
    for key, bf in result.get("backbone", {}).get("chosen", {}).items():
        part = [r for r in bb_rows if r["aggregate"] == key.endswith(" on)")]
        law = _law_plot(p, part, bf.target, bf, BB.TERMS, key) if bf else None
        if law:
            made[f"law_{key}"] = law
    pts2 = [(r["flows_live"], r["core_own_entries"] * r["lsids"]) for r in rows
            if r["core_own_entries"] is not None]
    if pts2:
        fig, (ax,) = p.figure(height=4.0)
        ax.scatter([a for a, _ in pts2], [b for _, b in pts2], s=12, label="runs")
        hi = max(a for a, _ in pts2)
        ax.plot([0, hi], [0, hi], "k:", lw=1, label="core table = live flows")
        ax.set_xlabel("live flows")
        ax.set_ylabel("own-LSID entries per core x LSIDs")
        ax.set_title(f"Sanity check: core table vs live flows ({len(pts2)} runs)")
        ax.legend(fontsize=8)
        made["core_vs_flows"] = p.save(fig, "study_core_vs_flows.png")
    return made


def _law_plot(p: Plots, rows: Sequence[dict[str, Any]], target: str, f: FIT.Fit | None,
              terms: Sequence[str] | None = None, name: str | None = None) -> str | None:
    """The fitted law along flows (the other *terms* at their median values in the sweep)
    with its prediction interval, over the runs at those values and all runs faded."""
    if f is None or "flows" not in f.terms or not rows:
        return None
    from statistics import median_low

    at = {t: float(median_low([r[t] for r in rows])) for t in (terms or FIT_TERMS)
          if t != "flows"}
    lo, hi = f.ranges["flows"]
    xs = [lo + (hi - lo) * k / 40 for k in range(41)]
    band = [FIT.predict(f, {**at, "flows": x}) for x in xs]
    ok = [(x, b) for x, b in zip(xs, band) if not isinstance(b, FIT.Refusal)]
    if not ok:
        return None
    fig, (ax,) = p.figure(height=4.0)
    ax.scatter([r["flows"] for r in rows], [r[target] for r in rows], s=8, c="0.8",
               label=f"all {len(rows)} runs")
    mine = [r for r in rows if all(float(r[t]) == v for t, v in at.items())]
    ax.scatter([r["flows"] for r in mine], [r[target] for r in mine], s=16,
               label=f"runs at {', '.join(f'{t}={fmt(v)}' for t, v in at.items())}")
    ax.plot([x for x, _ in ok], [b[0] for _, b in ok], "k-", lw=1.2,
            label=f"fitted law ({f.model})")
    ax.fill_between([x for x, _ in ok], [b[1] for _, b in ok], [b[2] for _, b in ok],
                    color="k", alpha=0.12, label=f"{int(f.level * 100)}% prediction interval")
    ax.set_xlabel("flows")
    ax.set_ylabel(target)
    ax.set_title(f"{name or target}: the fitted law along flows, the other terms at their "
                 "medians", fontsize=9)
    ax.legend(fontsize=7)
    return p.save(fig, f"study_law_{BB.slug(name or target)}.png")


def blocks(meta: dict[str, Any], rows: Sequence[dict[str, Any]], result: dict[str, Any],
           images: dict[str, str], plot_error: str | None) -> list[Block]:
    b: list[Block] = [("h1", "flowtrace study: flow-table scaling on the simulator"),
                      ("ul", provenance.header_lines(meta))]
    ranges = {t: (min(r[t] for r in rows), max(r[t] for r in rows)) for t in FIT_TERMS}
    b.append(("p", f"{len(rows)} runs. Validity range of every model: " + ", ".join(
        f"{t} {fmt(lo)}..{fmt(hi)}" for t, (lo, hi) in ranges.items())
        + ". One run is one observation (tables measured once all members have joined), "
        "on a topology of its own (a fresh random mesh per run), so the runs are "
        "independent; members (members per flow) and endpoints (hosts that may join) are "
        "varied apart, and flows are spread over the LSIDs, each with its own core. "
        "*members* here is members per flow; `flowtrace analyze`'s members is the number of "
        "endpoint links over all flows in a snapshot, a different quantity. In these random "
        "meshes *core* is each LSID's location-service router (the core of its flows' "
        "trees), *edge* a router with endpoints and *transit* the rest; routers inside a "
        "backbone, with and without aggregation, are in the backbone section at the end."))
    cov = result.get("coverage")
    b.append(("h2", "Repeat-study coverage"))
    if cov and cov["pairs"]:
        worst = sorted(cov["by_term"].items(), key=lambda kv: kv[1])[:5]
        b.append(("p", f"The study was repeated {cov['repeats'] - 1} more time(s) on fresh "
                       f"topologies: one repeat's interval covered another's estimate "
                       f"{cov['covered']} of {cov['pairs']} times ({_pct(cov['rate'])}); "
                       f"about {_pct(cov['expected'])} is expected of honest intervals. "
                       "Lowest: " + "; ".join(f"{k} {_pct(v)}" for k, v in worst) + "."))
    else:
        b.append(("p", "Not run (`--repeats N` runs the study N more times and reports how "
                       "often one repeat's intervals cover another's estimates)."))
    s = result["sanity"]
    b.append(("h2", "Sanity check: the core holds every live flow"))
    items = [f"own-LSID entries per core x LSIDs / live flows: mean "
             f"{fmt(s['core_over_live_flows_mean'], 4)}, "
             f"min {fmt(s['core_over_live_flows_min'], 4)}, "
             f"max {fmt(s['core_over_live_flows_max'], 4)} (expected 1)"]
    if "core_slope_on_flows" in s:
        items.append(f"linear slope of the core table on flows: "
                     f"{fmt(s['core_slope_on_flows'], 4)}, interval "
                     f"[{fmt(s['core_slope_ci'][0], 4)}, {fmt(s['core_slope_ci'][1], 4)}]"
                     + ("" if s["core_slope_covers_1"] else " — does NOT cover 1: check"))
    b.append(("ul", items))
    if "core_vs_flows" in images:
        b.append(("img", (images["core_vs_flows"], "core vs live flows")))
    b.append(("h2", "Predictions"))
    if not result["predictions"]:
        b.append(("p", "None asked for (`--predict routers=N,flows=N,members=N`)."))
    else:
        prow = []
        for p in result["predictions"]:
            pt = ", ".join(f"{k}={fmt(v)}" for k, v in p["point"].items())
            if "refused" in p:
                prow.append([pt, p["target"], "refused", p["refused"]])
            else:
                prow.append([pt, p["target"], fmt(p["value"], 4),
                             f"[{fmt(p['low'], 4)}, {fmt(p['high'], 4)}] ({p['model']})"])
        b.append(("table", (["point", "target", "prediction", "interval / reason"], prow)))
    b.append(("h2", "Models"))
    for target, fits in result["fits"].items():
        chosen = result["chosen"][target]
        b.append(("h3", f"{target}" + (f" (chosen: {chosen.model}, lower held-out error)"
                                        if chosen else " (no model)")))
        b += _fit_table(fits)
        if target in images:
            b.append(("img", (images[target], target)))
        if f"law_{target}" in images:
            b.append(("img", (images[f"law_{target}"], f"{target}: fitted law")))
    if plot_error:
        b.append(("p", plot_error))
    b += BB.blocks(result.get("backbone_runs", []), result.get("backbone", {}), _fit_table,
                   images)
    return b


FIT_TERMS = ("routers", "flows", "members", "endpoints", "lsids")


def write(out_dir: str, meta: dict[str, Any], rows: Sequence[dict[str, Any]],
          result: dict[str, Any]) -> str:
    p = Plots(out_dir)
    images = _plots(p, rows, result) if p.plt is not None else {}
    bl = blocks(meta, rows, result, images, p.error)
    md = os.path.join(out_dir, "report.md")
    with open(md, "w", encoding="utf-8") as fh:
        fh.write(render_markdown(bl))
    with open(os.path.join(out_dir, "report.html"), "w", encoding="utf-8") as fh:
        fh.write(render_html(bl, "flowtrace study"))
    return md


def console(rows: Sequence[dict[str, Any]], result: dict[str, Any]) -> str:
    lines = [f"flowtrace study: {len(rows)} runs"]
    s = result["sanity"]
    lines.append(f"  sanity: core entries / live flows mean "
                 f"{fmt(s['core_over_live_flows_mean'], 4)} (expected 1)")
    for target, f in result["chosen"].items():
        if f is None:
            # linear and power often refuse for the same reason: say each reason once
            reasons = "; ".join(dict.fromkeys(x.reason for x in result["fits"][target]
                                              if isinstance(x, FIT.Refusal)))
            lines.append(f"  {target}: no model: {reasons}")
        else:
            lines.append(f"  {target}: {f.formula()} (held-out error {_pct(f.loo_error)}, "
                         f"extrapolation {_pct(f.extrapolation_error)})")
    if result.get("backbone_runs"):
        lines += BB.console(result["backbone"])
    cov = result.get("coverage")
    if cov and cov["pairs"]:
        lines.append(f"  coverage over {cov['repeats']} repeats: {_pct(cov['rate'])} "
                     f"(expected about {_pct(cov['expected'])})")
    for p in result["predictions"]:
        pt = ",".join(f"{k}={fmt(v)}" for k, v in p["point"].items())
        if "refused" in p:
            lines.append(f"  {pt}: {p['target']}: refused: {p['refused']}")
        else:
            lines.append(f"  {pt}: {p['target']} {fmt(p['value'], 4)} "
                         f"[{fmt(p['low'], 4)}, {fmt(p['high'], 4)}]")
    return "\n".join(lines)
