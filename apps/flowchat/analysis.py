"""Numbers from one run's delivery logs: latency while connected, detection, reconciliation
lateness, gaps, and seed 003's ordering properties (section 4.3.6)."""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections import defaultdict
from typing import Any

from . import checks
from .igo import Delivery, StateChange, ViewInstalled
from .scenarios import LEADER_SITE, RunResult


def _in_outage(t: float, outages: list[tuple[float, float]], before: float = 0.0,
               after: float = 0.0) -> bool:
    return any(a - before <= t < b + after for a, b in outages)


def analyse(res: RunResult, *, settle: float = 20.0) -> dict[str, Any]:
    """Numbers for the summary: latency while connected, detection time, reconciliation
    lateness, gaps, and the ordering checks of seed 4.3.6."""
    exp = res.experiment
    logs = res.deliveries
    out: dict[str, Any] = {"test": exp.number, "mode": exp.mode, "scenario": exp.scenario,
                           "down": exp.down, "up": exp.up, "duration": res.duration,
                           "run": res.mode_label, "wall_seconds": round(res.wall, 2)}
    # connected latency: messages sent at least `settle` s after an outage ended (or the
    # start) and delivered before the next outage began
    downs = [a for a, _ in res.outages]
    ups = [0.0] + [b for _, b in res.outages]

    def connected(d: Delivery) -> bool:
        last_up = max(u for u in ups if u <= d.send_time) if d.send_time >= 0 else 0.0
        nxt = min([a for a in downs if a > d.send_time] + [res.duration])
        return (d.send_time >= last_up + (settle if last_up > 0 else 5.0)
                and not _in_outage(d.send_time, res.outages) and d.delivery_time < nxt)

    lat = [d.latency for log in logs.values() for d in log if connected(d)]
    out["connected_latency"] = _stats(lat)
    out["connected_latency_by_site"] = {
        s: _stats([d.latency for d in log if connected(d)]).get("mean") for s, log in logs.items()}
    # messages sent during outages (or in the detection window before one ends)
    out_msgs = [d for log in logs.values() for d in log if _in_outage(d.send_time, res.outages)]
    out["outage_latency"] = _stats([d.latency for d in out_msgs])
    late = [d for log in logs.values() for d in log if d.late]
    out["late"] = len(late)
    out["late_latency"] = _stats([d.latency for d in late])
    out["local"] = sum(1 for log in logs.values() for d in log if d.local)
    # detection: first S1->S2 of a peer (or of the leader) after each outage began
    det = []
    for evs in res.events.values():
        for a, b in res.outages:
            ts = [e.time for e in evs if isinstance(e, StateChange) and e.peer is not None
                  and e.old == "S1" and e.new == "S2" and a <= e.time < b + 8]
            if ts:
                det.append(min(ts) - a)
    out["detection"] = _stats(det)
    # reconnection: from an outage's end to each peer's return to S1 (reconciled)
    rec: list[float] = []
    for evs in res.events.values():
        for _start, b in res.outages:
            if b >= res.duration:
                continue
            back: dict[str, float] = {}
            for e in evs:
                if (isinstance(e, StateChange) and e.peer is not None and e.new == "S1"
                        and b <= e.time < b + 30 and e.peer not in back):
                    back[e.peer] = e.time - b
            rec += back.values()
    out["reconnect"] = _stats(rec)
    # stalls: heard peers (or a leader's order stream) blocked for the stall time-out, so
    # declared disconnected (a flapping link: heartbeats get through, data does not)
    out["stalls"] = sum(v for c in res.counters.values() for k, v in c.items()
                        if k.startswith("stall.detected"))
    out["max_latency"] = round(max((d.latency for log in logs.values() for d in log),
                                   default=0.0), 3)
    # congestion: sites whose senders were slowed, and repair bytes against data bytes
    out["congested"] = sum(c.get("congested.entered", 0) for c in res.counters.values())
    out["slowed"] = res.extra.get("slowed", {})
    sent_bytes = res.extra.get("bytes") or {}
    data_b = sum(b.get("data", 0) for b in sent_bytes.values())
    repair_b = sum(v for b in sent_bytes.values() for k, v in b.items() if k.startswith("repair"))
    out["repair_fraction"] = round(repair_b / data_b, 4) if data_b else None
    # S3 entries
    out["long_term_events"] = sum(1 for evs in res.events.values() for e in evs
                                  if isinstance(e, StateChange) and e.peer and e.new == "S3")
    # gaps: messages never delivered (those sent in the last 10 s, or 10 s before an outage
    # the run ends in, are excluded: they may still be held or in flight)
    horizon = res.duration - 10.0
    for a, b in res.outages:  # a run that ends inside an outage: what it held is not a gap
        if b >= res.duration:
            horizon = min(horizon, a - 10.0)
    gap_total = 0
    gaps_same_side = 0
    gap_detail: dict[str, dict[str, int]] = {}
    for site, log in logs.items():
        gap_detail[site] = {}
        got = defaultdict(set)
        for d in log:
            got[d.origin].add(d.seq)
        for origin in res.sites:
            sent_times = _sent_before(res, origin, horizon)
            missing = [s for s in range(1, sent_times + 1) if s not in got[origin]]
            if missing:
                gap_detail[site][origin] = len(missing)
                gap_total += len(missing)
                if origin in res.groups[site]:
                    gaps_same_side += len(missing)
    out["gaps"] = gap_total
    out["gaps_same_side"] = gaps_same_side
    out["gap_detail"] = gap_detail
    # ordering properties (seed 4.3.6); a restarted site's runs are checked apart (the new
    # run shows live traffic first and history after it, flagged late)
    logs = run_logs(res)
    sites_all = list(res.sites) + ([LEADER_SITE] if exp.mode == "leader" else [])
    v_fifo = checks.fifo_violations(logs)
    restart = res.extra.get("restart") or {}
    epochs = [restart["up"]] if restart.get("site") == LEADER_SITE else []
    v_order = checks.order_violations(logs, sites_all, leader=exp.mode == "leader",
                                      epochs=epochs)
    v_agree = []
    names = list(logs)
    for i, sa in enumerate(names):
        for sb in names[i + 1:]:
            v_agree += checks.agreement_violations(logs[sa], logs[sb], names=(sa, sb))
    v_global: list[str] = []
    skipped = sum(v for c in res.counters.values() for k, v in c.items()
                  if k.startswith("skipped."))
    out["skipped"] = skipped
    if exp.mode == "all-to-all" and not exp.long_term and not out["long_term_events"] \
            and not skipped:
        # delay-delivery with short disconnects: one global order, everything delivered
        for i, sa in enumerate(names):
            for sb in names[i + 1:]:
                v_global += checks.agreement_violations(logs[sa], logs[sb], in_order_only=False,
                                                        names=(sa, sb))
    v_causal = causal_check(res)
    # late (reconciled) messages: the same order at every site of a partition
    late_pairs = {}
    for i, sa in enumerate(names):
        for sb in names[i + 1:]:
            if sb in res.groups.get(sa, ()):
                late_pairs[f"{sa}/{sb}"] = checks.late_disagreement(logs[sa], logs[sb])
    splits = {}
    for i, sa in enumerate(names):
        for sb in names[i + 1:]:
            if sb in res.groups.get(sa, ()):
                splits[f"{sa}/{sb}"] = checks.late_splits(logs[sa], logs[sb])
    out["late_splits"] = splits
    out["late_splits_total"] = sum(splits.values())
    # agreed views (all-to-all modes): connected sites go through the same views, and sites
    # that move on together showed the same messages in order in the view they left
    views = view_runs(res)
    whole = {s: [e for e in evs if isinstance(e, ViewInstalled)]
             for s, evs in res.events.items() if s in res.groups}
    v_views = checks.view_disagreements(whole, res.groups) + checks.view_delivery_violations(
        logs, views)
    out["views"] = {s: len(v) for s, v in views.items()}
    out["view_changes"] = max(out["views"].values(), default=0)
    out["late_order"] = {k: {"common": c, "disagree": d} for k, (c, d) in late_pairs.items()}
    out["late_disagree"] = sum(d for _, d in late_pairs.values())
    out["violations"] = {"fifo": len(v_fifo), "order": len(v_order),
                         "agreement": len(v_agree), "global": len(v_global),
                         "causal": len(v_causal), "views": len(v_views)}
    out["violation_examples"] = (v_fifo + v_order + v_agree + v_global + v_causal
                                 + v_views)[:10]
    out["delivered"] = {s: len(log) for s, log in logs.items()}
    out["sent"] = dict(res.sent)
    return out


def _sent_before(res: RunResult, origin: str, horizon: float) -> int:
    """How many messages *origin* sent before *horizon* (from any site's log of it, or the
    causal-vector record of sends)."""
    seqs = [seq for (o, seq) in res.send_vectors if o == origin]
    if not seqs:
        return 0
    times: dict[int, float] = {}
    for log in res.deliveries.values():
        for d in log:
            if d.origin == origin:
                times.setdefault(d.seq, d.send_time)
    n = 0
    for s in sorted(seqs):
        t = times.get(s)
        if t is None or t < horizon:
            n = s
        else:
            break
    return n


RESTARTED = "@restart"  #: run_logs' suffix for a restarted site's new run


def run_logs(res: RunResult) -> dict[str, list[Delivery]]:
    """Per site its delivery log; a site restarted during the run (``res.extra["runs"]``:
    site -> index of its new run's first delivery) as two logs, ``SITE`` and
    ``SITE@restart``."""
    split = res.extra.get("runs") or {}
    out: dict[str, list[Delivery]] = {}
    for site, log in res.deliveries.items():
        k = split.get(site)
        if k is None:
            out[site] = list(log)
        else:
            out[site] = list(log[:k])
            out[site + RESTARTED] = list(log[k:])
    return out


def view_runs(res: RunResult) -> dict[str, list[ViewInstalled]]:
    """Per site (per run, as :func:`run_logs`) the views it installed."""
    restart = res.extra.get("restart") or {}
    split = res.extra.get("runs") or {}
    out: dict[str, list[ViewInstalled]] = {}
    for site, evs in res.events.items():
        views = [e for e in evs if isinstance(e, ViewInstalled)]
        if site in split and restart.get("up") is not None:
            out[site] = [e for e in views if e.time < restart["up"]]
            out[site + RESTARTED] = [e for e in views if e.time >= restart["up"]]
        else:
            out[site] = views
    return out


def causal_check(res: RunResult) -> list[str]:
    """No site delivers a message before one its sender had delivered before sending it.
    A restarted site's new run shows history (what was said before it came back, fetched
    in the background, flagged late) after the live messages that answer it: a history
    cause of a later message is not counted there; among the history, and everywhere
    else, causal order holds."""
    out = []
    up = (res.extra.get("restart") or {}).get("up", 0.0)
    for site, log in run_logs(res).items():
        restarted = site.endswith(RESTARTED)
        # history: what the others said before the site came back, fetched in the
        # background and shown late after the live messages (live messages of a view the
        # site was not in are late too, with agreed views, and may answer history)
        history = {(d.origin, d.seq) for d in log if d.late and d.send_time < up}
        pos = {(d.origin, d.seq): i for i, d in enumerate(log)}
        per_origin: dict[str, list[int]] = defaultdict(list)
        for d in log:
            per_origin[d.origin].append(d.seq)
        for k in per_origin:
            per_origin[k].sort()
        for (o, seq), vec in res.send_vectors.items():
            pm = pos.get((o, seq))
            if pm is None:
                continue
            for src, hi in vec.items():
                lst = per_origin.get(src)
                if not lst:
                    continue
                j = bisect_right(lst, hi) - 1
                if j < 0:
                    continue
                pp = pos[(src, lst[j])]
                if restarted and (src, lst[j]) in history and (o, seq) not in history:
                    continue
                if pp > pm:
                    out.append(f"{site}: {o}#{seq} before its cause {src}#{lst[j]}")
    return out


def _stats(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    ys = sorted(xs)
    return {"n": len(ys), "mean": round(statistics.fmean(ys), 3),
            "p50": round(ys[len(ys) // 2], 3), "p95": round(ys[min(len(ys) - 1,
                                                                   int(0.95 * len(ys)))], 3),
            "max": round(ys[-1], 3)}
