"""Writing results: per-site delivery logs (CSV), state and membership events (JSON lines),
the summary table beside the seed's figures (Markdown, JSON)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import checks
from .igo import Congestion, MembershipChange, StateChange, ViewChange, ViewInstalled
from .protocol import decode_chat
from .scenarios import ALL_EXPERIMENTS, SEED_FIGURES, RunResult

CSV_FIELDS = ("site", "origin", "user", "seq", "lamport", "gseq", "send_time", "delivery_time",
              "latency", "late", "local", "view")


def write_logs(res: RunResult, outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    for site, log in res.deliveries.items():
        with open(outdir / f"deliveries-{site}.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(CSV_FIELDS)
            for d in log:
                try:
                    user = decode_chat(d.payload).user
                except ValueError:
                    user = ""
                w.writerow((d.site, d.origin, user, d.seq, d.lamport,
                            "" if d.gseq is None else d.gseq, f"{d.send_time:.6f}",
                            f"{d.delivery_time:.6f}", f"{d.latency:.6f}", int(d.late),
                            int(d.local), d.view))
    with open(outdir / "events.jsonl", "w", encoding="utf-8") as fh:
        for site, evs in res.events.items():
            for e in evs:
                rec: dict[str, Any]
                if isinstance(e, StateChange):
                    rec = {"site": site, "time": round(e.time, 6), "event": "state",
                           "peer": e.peer, "old": e.old, "new": e.new,
                           **({"reason": e.reason} if e.reason else {})}
                elif isinstance(e, MembershipChange):
                    rec = {"site": site, "time": round(e.time, 6), "event": "members",
                           "members": list(e.members)}
                elif isinstance(e, ViewChange):
                    rec = {"site": site, "time": round(e.time, 6), "event": "view-change",
                           "proposal": e.proposal, "number": e.number,
                           "members": list(e.members)}
                elif isinstance(e, ViewInstalled):
                    rec = {"site": site, "time": round(e.time, 6), "event": "view",
                           "view": e.view, "number": e.number, "members": list(e.members),
                           "transitional": list(e.transitional), "previous": e.previous}
                elif isinstance(e, Congestion):
                    rec = {"site": site, "time": round(e.time, 6), "event": "congestion",
                           "congested": e.congested, "queued": e.queued}
                else:
                    continue
                fh.write(json.dumps(rec) + "\n")


def fmt_stat(st: dict[str, Any], key: str = "mean") -> str:
    return "-" if not st.get("n") else f"{st[key]:.2f}"


def summary_markdown(results: list[dict[str, Any]], *, title: str, notes: Sequence[str] = ()
                     ) -> str:
    L = [f"# {title}", ""]
    L += list(notes)
    if notes:
        L.append("")
    L.append("| test | mode | scenario | down/up s | connected latency mean (p95) s | "
             "detection s | outage msgs max latency s | max latency s | stalls | "
             "late (order disagreements) | in-order/late splits | views | gaps (same side) | "
             "order checks | seed 003 |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    notes_by = {e.number: e.seed_note for e in ALL_EXPERIMENTS}
    for r in results:
        v = r["violations"]
        ok = "ok" if not any(v.values()) else ", ".join(f"{k} {n}" for k, n in v.items() if n)
        cl = r["connected_latency"]
        L.append(
            f"| {r['test']} | {r['mode']} | {r['scenario']} | {r['down']:g}/{r['up']:g} | "
            f"{fmt_stat(cl)} ({fmt_stat(cl, 'p95')}) | {fmt_stat(r['detection'])} | "
            f"{fmt_stat(r['outage_latency'], 'max')} | {r.get('max_latency', '-')} | "
            f"{r.get('stalls', 0)} | {r['late']} "
            f"({r.get('late_disagree', 0)}) | {r.get('late_splits_total', 0)} | "
            f"{r.get('view_changes', '-') if r['mode'] != 'leader' else 'leader'} | "
            f"{r['gaps']} ({r['gaps_same_side']}) | {ok} | {notes_by.get(r['test'], '')} |")
    L += ["", "What holds (flowchat.checks): " + " ".join(checks.PROPERTIES)]
    L += ["", "Seed 003's figures: " + "; ".join(f"{k}: {v}" for k, v in SEED_FIGURES.items())
          + ".", "",
          "Columns: *connected latency* over messages sent at least 20 s after an outage ended "
          "and delivered before the next began; *detection* from the outage's start to a "
          "site's first peer S1->S2; *outage msgs max latency*: the latest delivery of a "
          "message sent during an outage (reconciled or, in delay mode, held); *max latency*: "
          "of any delivery; *stalls*: peers declared disconnected because they were heard "
          "but blocked for the stall time-out (a flapping link); *late*: "
          "deliveries flagged late (out of order, reconciled), and in brackets how many "
          "late messages two sites of the same side both delivered at different places in "
          "their late sequences (0: one late order per partition); *in-order/late splits*: "
          "messages two sites of one side both delivered, in order at one and late at the "
          "other (0 expected in the all-to-all modes); *views*: agreed views installed (the "
          "most at one site; leader mode follows the leader's view); *gaps*: messages some site "
          "never delivered (same side: from a site on its side of the partition); *order "
          "checks*: FIFO per origin, in-order deliveries follow the ordering rule, every pair "
          "of sites agrees on their common in-order messages, causal order, for "
          "delay-delivery with short outages one global order of everything, and (*views*) "
          "connected sites install the same views and show the same messages in order in "
          "each view they leave together."]
    return "\n".join(L) + "\n"


def write_summary(rows: list[dict[str, Any]], out: str | Path, *, title: str,
                  notes: Sequence[str] = ()) -> Path:
    outdir = Path(out)
    (outdir / "summary.json").write_text(json.dumps(rows, indent=2, default=str),
                                         encoding="utf-8")
    p = outdir / "summary.md"
    p.write_text(summary_markdown(rows, title=title, notes=notes), encoding="utf-8")
    return p
