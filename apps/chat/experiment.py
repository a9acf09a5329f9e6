"""Seed 003's eight experiments (Table 2) on the chat test-bed topology.

``flowchat experiment`` runs them in the deterministic simulator (default) or on real router
processes (``--real``), writes each site's delivery log, draws the seed's three graphs per
run and a Markdown summary beside the seed's figures.

=====  ====================  ========  ================  ====================================
test   ordering              scenario  down / up (s)     the seed's observation
=====  ====================  ========  ================  ====================================
1      all-to-all, delay     A1        10 / 30           global order kept, one late spike
2      all-to-all, hasten    A1        10 / 30           two spikes, reconciled ~14 s late
3      all-to-all, hasten    A1-25     25 / 25           long-term: gaps, no reconciliation
4      all-to-all, delay     A2        10 / 30           no gaps, delivery delayed both sides
5      all-to-all, hasten    A2        10 / 30           detect ~6 s, reconciled <= ~14 s
6      all-to-all, hasten    A2-25     25 / 25           long-term: gaps across partition
7      leader                L1        10 / 30           cut site: intra-site only, gaps
8      leader                L2        10 / 30           ~0.1 s connected, ~6 s spikes
=====  ====================  ========  ================  ====================================

Workload (seed 6.2): 4 sites, each sending with inter-message gaps uniform in [0, 1] s
(~2 messages/s) of ~1 KB (``--size``), 56 kbit/s links (the topology's), 5-minute runs
(``--duration`` to shorten). In leader mode the leader runs at the hub (the seed's router
machine).

Location services (``--ls``). The topology file makes the hub router the only core of the
room's LSID. A flow's shared tree hangs off its core, so (1) *all* chat traffic crosses the
hub's 56 kbit/s links, which the seed's load (3 sites x 16 kbit/s into every site) nearly fills,
leaving no room for reconciliation bursts, and (2) in A2 the side without the hub has no core
and no inter-site delivery at all. ``--ls sites`` (the default) makes every site's router a
member of the room's location service too (in memory; the file is not changed): each site's
messages then travel the direct site-to-site links, as the seed's per-pair 56 kbit/s paths did,
and both sides of a partition keep a core. ``--ls hub`` runs the file as written.

Outputs in ``--out`` (default ``chat-experiments/``), one directory per test
(``test5-hasten-A2``): ``deliveries-<site>.csv`` (site, origin, user, seq, lamport, gseq,
send_time, delivery_time, latency, late, local), ``events.jsonl`` (state and membership
changes), ``seq.png`` / ``latency.png`` / ``rate.png`` (one panel per site, outages shaded),
``result.json``; and ``summary.md`` / ``summary.json`` for all tests.
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import random
import statistics
import time
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from flowrouter.testbed import topology as T
from flowrouter.wire.flowid import FlowID

from . import checks
from .igo import Delivery, IGOConfig, MembershipChange, StateChange
from .protocol import SAY, decode_chat, encode_chat, room_flow

SITES = ("metropol", "commonwe", "kingdom", "republic")
LEADER_SITE = "hub"
LEADER_ENDPOINT = "leader"
DEFAULT_TOPOLOGY = Path(__file__).resolve().parents[2] / "topologies" / "seed003-testbed.toml"


@dataclass(frozen=True)
class Experiment:
    number: int
    mode: str  #: all-to-all | hasten | leader
    scenario: str
    down: float
    up: float
    seed_note: str

    @property
    def name(self) -> str:
        return f"test{self.number}-{self.mode}-{self.scenario}"

    @property
    def long_term(self) -> bool:
        return self.down >= 15.0


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment(1, "all-to-all", "A1", 10, 30,
               "global order kept; delivery delayed during the outage, one burst"),
    Experiment(2, "hasten", "A1", 10, 30,
               "delivery resumes after ~6 s detection; reconciled messages <= ~14 s late"),
    Experiment(3, "hasten", "A1-25", 25, 25,
               "long-term: no reconciliation, gaps from the cut site"),
    Experiment(4, "all-to-all", "A2", 10, 30,
               "no gaps; delivery on both sides delayed, global order after reconnect"),
    Experiment(5, "hasten", "A2", 10, 30,
               "~0.5 s connected, detect ~6 s, reconciled <= ~14 s late, no gaps"),
    Experiment(6, "hasten", "A2-25", 25, 25,
               "long-term: gaps across the partition, none within it"),
    Experiment(7, "leader", "L1", 10, 30,
               "~0.1 s connected; cut site sees gaps, others none (reconciled late)"),
    Experiment(8, "leader", "L2", 10, 30,
               "~0.1 s connected; ~6 s spikes at detection, up to ~12 s"),
)

SEED_FIGURES = {
    "connected latency": "< 1 s (all-to-all ~0.5 s, leader ~0.1 s)",
    "detection": "~6 s (3 heartbeats of 2 s)",
    "reconciled": "<= ~14 s late (10 s outage + ~4 s reconnect and reconcile)",
    "order": "same order at every site of a partition",
}


def select(only: str | None) -> list[Experiment]:
    """``--only``: test numbers and/or scenario names, comma-separated (``1,5`` or ``A1,L2``)."""
    if not only:
        return list(EXPERIMENTS)
    want = {w.strip() for w in only.split(",") if w.strip()}
    out = [e for e in EXPERIMENTS
           if str(e.number) in want or e.scenario in want or e.name in want]
    unknown = want - {str(e.number) for e in out} - {e.scenario for e in out} \
        - {e.name for e in out}
    if unknown:
        raise ValueError(f"unknown experiment(s) {', '.join(sorted(unknown))}: use numbers 1-8 "
                         "or scenarios " + ", ".join(sorted({e.scenario for e in EXPERIMENTS})))
    return out


def ls_at_sites(topo: T.Topology, lsid: int, sites: Sequence[str] = SITES) -> T.Topology:
    """The same topology with every site router also a member of LSID *lsid*'s service."""
    routers = tuple(replace(r, core_lsids=tuple(sorted(set(r.core_lsids) | {lsid})))
                    if r.name in sites else r for r in topo.routers)
    services = tuple(replace(ls, cores=tuple(dict.fromkeys(ls.cores + tuple(sites))))
                     if ls.lsid == lsid else ls for ls in topo.location_services)
    return replace(topo, routers=routers, location_services=services)


# ============================================================================ results
@dataclass
class RunResult:
    experiment: Experiment
    duration: float
    sites: tuple[str, ...]  #: sites that chat (not the leader)
    deliveries: dict[str, list[Delivery]]
    events: dict[str, list[Any]]
    sent: dict[str, int]  #: messages sent per site
    send_vectors: dict[tuple[str, int], dict[str, int]]  #: causal past of each message
    outages: list[tuple[float, float]]
    groups: dict[str, set[str]]  #: per site: sites on its side during outages
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    wall: float = 0.0
    mode_label: str = "sim"
    extra: dict[str, Any] = field(default_factory=dict)


def scenario_groups(exp: Experiment, sites: Sequence[str]) -> dict[str, set[str]]:
    """Which sites share a side with each site during the scenario's outages."""
    s = set(sites)
    if exp.scenario.startswith("A1"):
        sides = [{"metropol"}, s - {"metropol"}]
    elif exp.scenario.startswith("A2"):
        sides = [{"metropol", "commonwe"}, {"kingdom", "republic"}]
    elif exp.scenario.startswith("L1"):
        sides = [{"metropol"}, s - {"metropol"}]
    else:
        sides = [{"metropol"}, {"commonwe"}, s - {"metropol", "commonwe"}]
    return {x: next(g for g in sides if x in g) for x in sites}


def igo_config(exp: Experiment, sites: Sequence[str], **overrides: Any) -> IGOConfig:
    all_sites = tuple(sites) + ((LEADER_SITE,) if exp.mode == "leader" else ())
    return IGOConfig(sites=all_sites, room="seed003", mode=exp.mode,
                     leader=LEADER_SITE if exp.mode == "leader" else None, **overrides)


def config_record(cfg: IGOConfig) -> dict[str, Any]:
    """The ordering configuration a run used, JSON-able (written to result.json)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}


# ============================================================================ simulator
def run_sim(exp: Experiment, *, topology: str | Path = DEFAULT_TOPOLOGY, duration: float = 300.0,
            seed: int = 1, size: int = 1000, rate: float = 2.0, ls: str = "sites",
            start: float = 2.0, tick: float = 0.1, config: dict[str, Any] | None = None
            ) -> RunResult:
    """Run one experiment in the simulator; returns every delivery and event."""
    from flowrouter.testbed.sim import SimNetwork

    from .sim_adapter import SimSite

    topo = T.load(topology)
    lsid = topo.lsids()[0]
    if ls == "sites":
        topo = ls_at_sites(topo, lsid)
    elif ls != "hub":
        raise ValueError("ls must be 'sites' or 'hub'")
    net = SimNetwork.from_topology(topo, seed=seed, scenario=exp.scenario, strict=True)
    flow = room_flow("seed003", lsid)
    cfg = igo_config(exp, SITES, **(config or {}))
    sites: dict[str, SimSite] = {}
    for i, name in enumerate(SITES):
        sites[name] = SimSite(net, net.endpoints[f"{name}-client"], flow, cfg, name, tick=tick,
                              incarnation=1000 + i)
    if exp.mode == "leader":
        sites[LEADER_SITE] = SimSite(net, net.endpoints[LEADER_ENDPOINT], flow, cfg,
                                     LEADER_SITE, tick=tick, incarnation=2000)
    for s in sites.values():
        s.start()
    rng = random.Random(f"{seed}/bots")
    send_vectors: dict[tuple[str, int], dict[str, int]] = {}
    highest: dict[str, dict[str, int]] = {n: defaultdict(int) for n in SITES}

    def track(name: str) -> Any:
        def on_deliver(d: Delivery) -> None:
            h = highest[name]
            if d.seq > h[d.origin]:
                h[d.origin] = d.seq
        return on_deliver

    for name in SITES:
        sites[name].on_deliver = track(name)

    def bot(name: str) -> None:
        site = sites[name]
        seq = site.ordering.seq + 1
        send_vectors[(name, seq)] = dict(highest[name])
        site.submit(encode_chat(SAY, f"bot@{name}", f"{name} message {seq}", pad_to=size))
        net.after(rng.uniform(0.0, 2.0 / rate), bot, name)

    for name in SITES:
        net.schedule(start + rng.uniform(0.0, 1.0 / rate), bot, name)
    t0 = time.perf_counter()
    net.run_until(duration)
    wall = time.perf_counter() - t0
    outages = _outages(topo, exp.scenario, duration)
    res = RunResult(exp, duration, SITES,
                    {n: s.deliveries for n, s in sites.items() if n in SITES},
                    {n: s.events for n, s in sites.items()},
                    {n: sites[n].ordering.seq for n in SITES}, send_vectors, outages,
                    scenario_groups(exp, SITES),
                    {n: dict(s.ordering.counters) for n, s in sites.items()}, wall, "sim")
    res.extra["config"] = config_record(sites[SITES[0]].ordering.cfg)
    res.extra["link_drops"] = dict(net.link_drops())
    res.extra["ls"] = ls
    res.extra["leader_deliveries"] = (len(sites[LEADER_SITE].deliveries)
                                      if exp.mode == "leader" else None)
    return res


def _outages(topo: T.Topology, scenario: str, duration: float) -> list[tuple[float, float]]:
    spans: set[tuple[float, float]] = set()
    for f in topo.faults_for(scenario):
        for a, b in f.outages(duration):
            spans.add((a, min(b, duration)))
    return sorted(spans)


# ============================================================================ real routers
async def run_real_async(exp: Experiment, *, topology: str | Path = DEFAULT_TOPOLOGY,
                         duration: float = 60.0, seed: int = 1, size: int = 1000,
                         rate: float = 2.0, ls: str = "sites", workdir: str | None = None,
                         base_port: int | None = None, config: dict[str, Any] | None = None,
                         start: float = 3.0) -> RunResult:
    """One experiment on real router processes (``flowrouter.testbed.launcher.Launcher``): one
    ``flowrouter run`` per router on loopback with link emulation, this process running the
    site servers (flowlib clients) and the bots, the fault schedule applied through the
    routers' control interfaces in real time."""
    import flowlib
    from flowrouter.testbed.launcher import Launcher, LaunchReport

    from .flow_adapter import FlowSite

    topo = T.load(topology)
    lsid = topo.lsids()[0]
    if ls == "sites":
        topo = ls_at_sites(topo, lsid)
    launcher = Launcher(topo, scenario=exp.scenario, duration=duration, view=False,
                        workdir=workdir, base_port=base_port)
    flow = room_flow("seed003", lsid)
    cfg = igo_config(exp, SITES, **(config or {}))
    names = list(SITES) + ([LEADER_SITE] if exp.mode == "leader" else [])
    endpoint_of = {n: f"{n}-client" for n in SITES}
    endpoint_of[LEADER_SITE] = LEADER_ENDPOINT
    sites: dict[str, FlowSite] = {}
    clients: list[Any] = []
    tasks: list[asyncio.Task[Any]] = []
    report = LaunchReport(topo.name, exp.scenario, duration)
    rng = random.Random(f"{seed}/bots")
    send_vectors: dict[tuple[str, int], dict[str, int]] = {}
    highest: dict[str, dict[str, int]] = {n: defaultdict(int) for n in SITES}
    t_origin = 0.0
    try:
        await launcher.start_routers()
        t_origin = time.time()  # the sites' clock: seconds since now (faults use the same)
        for i, name in enumerate(names):
            ep = topo.endpoint(endpoint_of[name])
            host, port = launcher.listen[ep.router]
            fc = await flowlib.connect([f"{host}:{port}"], name=f"flowchat-{name}",
                                       state_dir=str(launcher.workdir / "state"))
            clients.append(fc)
            site = FlowSite(fc, flow, cfg, name, incarnation=1000 + i,
                            clock_origin=t_origin)
            sites[name] = site

            def on_deliver(d: Delivery, name: str = name) -> None:
                if name in highest and d.seq > highest[name][d.origin]:
                    highest[name][d.origin] = d.seq
            site.on_deliver = on_deliver
        for site in sites.values():
            await site.start()
        launcher.t0 = time.monotonic() - (time.time() - t_origin)

        async def bot(name: str) -> None:
            await asyncio.sleep(start + rng.uniform(0, 1.0 / rate))
            while True:
                site = sites[name]
                seq = site.ordering.seq + 1
                send_vectors[(name, seq)] = dict(highest[name])
                site.submit(encode_chat(SAY, f"bot@{name}", f"{name} message {seq}",
                                        pad_to=size))
                await asyncio.sleep(rng.uniform(0.0, 2.0 / rate))

        for name in SITES:
            tasks.append(asyncio.ensure_future(bot(name)))
        for t, fault, down in launcher._fault_events():
            tasks.append(asyncio.ensure_future(launcher._at(t, fault, down, report)))
        await asyncio.sleep(duration)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for site in sites.values():
            await site.stop()
        for fc in clients:
            try:
                await fc.close(timeout=2.0)
            except Exception:  # noqa: BLE001 - shutting down
                pass
        await launcher.stop_routers()
    outages = _outages(topo, exp.scenario, duration)
    res = RunResult(exp, duration, SITES,
                    {n: list(sites[n].deliveries) for n in SITES},
                    {n: list(s.events) for n, s in sites.items()},
                    {n: sites[n].ordering.seq for n in SITES}, send_vectors, outages,
                    scenario_groups(exp, SITES),
                    {n: dict(s.ordering.counters) for n, s in sites.items()}, duration, "real")
    res.extra["config"] = config_record(sites[SITES[0]].ordering.cfg)
    res.extra["faults_applied"] = report.faults_applied
    res.extra["workdir"] = str(launcher.workdir)
    res.extra["ls"] = ls
    return res


def run_real(exp: Experiment, **kwargs: Any) -> RunResult:
    return asyncio.run(run_real_async(exp, **kwargs))


# ============================================================================ analysis
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
    # ordering properties (seed 4.3.6)
    sites_all = list(res.sites) + ([LEADER_SITE] if exp.mode == "leader" else [])
    v_fifo = checks.fifo_violations(logs)
    v_order = checks.order_violations(logs, sites_all, leader=exp.mode == "leader")
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
    out["violations"] = {"fifo": len(v_fifo), "order": len(v_order),
                         "agreement": len(v_agree), "global": len(v_global),
                         "causal": len(v_causal)}
    out["violation_examples"] = (v_fifo + v_order + v_agree + v_global + v_causal)[:10]
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


def causal_check(res: RunResult) -> list[str]:
    """No site delivers a message before one its sender had delivered before sending it."""
    out = []
    for site, log in res.deliveries.items():
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


# ============================================================================ writing
CSV_FIELDS = ("site", "origin", "user", "seq", "lamport", "gseq", "send_time", "delivery_time",
              "latency", "late", "local")


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
                            int(d.local)))
    with open(outdir / "events.jsonl", "w", encoding="utf-8") as fh:
        for site, evs in res.events.items():
            for e in evs:
                if isinstance(e, StateChange):
                    rec = {"site": site, "time": round(e.time, 6), "event": "state",
                           "peer": e.peer, "old": e.old, "new": e.new}
                elif isinstance(e, MembershipChange):
                    rec = {"site": site, "time": round(e.time, 6), "event": "members",
                           "members": list(e.members)}
                else:
                    continue
                fh.write(json.dumps(rec) + "\n")


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


def _fmt(st: dict[str, Any], key: str = "mean") -> str:
    return "-" if not st.get("n") else f"{st[key]:.2f}"


def summary_markdown(results: list[dict[str, Any]], *, title: str, notes: Sequence[str] = ()
                     ) -> str:
    L = [f"# {title}", ""]
    L += list(notes)
    if notes:
        L.append("")
    L.append("| test | mode | scenario | down/up s | connected latency mean (p95) s | "
             "detection s | outage msgs max latency s | late | gaps (same side) | "
             "order checks | seed 003 |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    notes_by = {e.number: e.seed_note for e in EXPERIMENTS}
    for r in results:
        v = r["violations"]
        ok = "ok" if not any(v.values()) else ", ".join(f"{k} {n}" for k, n in v.items() if n)
        cl = r["connected_latency"]
        L.append(
            f"| {r['test']} | {r['mode']} | {r['scenario']} | {r['down']:g}/{r['up']:g} | "
            f"{_fmt(cl)} ({_fmt(cl, 'p95')}) | {_fmt(r['detection'])} | "
            f"{_fmt(r['outage_latency'], 'max')} | {r['late']} | "
            f"{r['gaps']} ({r['gaps_same_side']}) | {ok} | {notes_by.get(r['test'], '')} |")
    L += ["", "Seed 003's figures: " + "; ".join(f"{k}: {v}" for k, v in SEED_FIGURES.items())
          + ".", "",
          "Columns: *connected latency* over messages sent at least 20 s after an outage ended "
          "and delivered before the next began; *detection* from the outage's start to a "
          "site's first peer S1->S2; *outage msgs max latency*: the latest delivery of a "
          "message sent during an outage (reconciled or, in delay mode, held); *late*: "
          "deliveries flagged late (out of order, reconciled); *gaps*: messages some site "
          "never delivered (same side: from a site on its side of the partition); *order "
          "checks*: FIFO per origin, in-order deliveries follow the ordering rule, every pair "
          "of sites agrees on their common in-order messages, causal order, and for "
          "delay-delivery with short outages one global order of everything."]
    return "\n".join(L) + "\n"


def run_all(experiments: list[Experiment], *, out: str | Path, real: bool = False,
            duration: float | None = None, plots: bool = True, echo: Any = print,
            **kwargs: Any) -> list[dict[str, Any]]:
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for exp in experiments:
        dur = duration if duration is not None else (60.0 if real else 300.0)
        echo(f"test {exp.number}: {exp.mode} {exp.scenario} ({exp.down:g} s down / "
             f"{exp.up:g} s up), {dur:g} s {'real time' if real else 'simulated'} ...")
        res = run_real(exp, duration=dur, **kwargs) if real else run_sim(exp, duration=dur,
                                                                          **kwargs)
        row = analyse(res)
        row["ls"] = res.extra.get("ls")
        row["config"] = res.extra.get("config")
        row["counters"] = dict(sum((Counter(c) for c in res.counters.values()), Counter()))
        d = outdir / exp.name
        write_logs(res, d)
        if plots:
            plot(res, d)
        (d / "result.json").write_text(json.dumps(row, indent=2, default=str), encoding="utf-8")
        rows.append(row)
        cl = row["connected_latency"]
        echo(f"  connected latency {_fmt(cl)} s (p95 {_fmt(cl, 'p95')}), detection "
             f"{_fmt(row['detection'])} s, outage max {_fmt(row['outage_latency'], 'max')} s, "
             f"late {row['late']}, gaps {row['gaps']}, checks "
             f"{'ok' if not any(row['violations'].values()) else row['violations']} "
             f"[{res.wall:.1f} s wall]")
    return rows


def write_summary(rows: list[dict[str, Any]], out: str | Path, *, title: str,
                  notes: Sequence[str] = ()) -> Path:
    outdir = Path(out)
    (outdir / "summary.json").write_text(json.dumps(rows, indent=2, default=str),
                                         encoding="utf-8")
    p = outdir / "summary.md"
    p.write_text(summary_markdown(rows, title=title, notes=notes), encoding="utf-8")
    return p


def flow_for(topo_path: str | Path) -> FlowID:
    topo = T.load(topo_path)
    return room_flow("seed003", topo.lsids()[0])
