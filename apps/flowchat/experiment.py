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

Beyond the seed (``--only NAME`` or ``--only all``; :data:`~flowchat.scenarios.SCENARIOS`):

=====  ====================  ========  ================  ====================================
9      all-to-all, hasten    flapping  3 / 3, 10-70 s    no message > 15 s late, or the site
                                                          declared disconnected (stalled)
10     leader                flapping  3 / 3, 10-70 s    stalled order stream: cut off from
                                                          the leader (local chat) meanwhile
11     all-to-all, hasten    saturation  no faults, 7/s  senders slowed (congested), latency
                                                          bounded, no repair storm
12     leader                saturation  no faults, 7/s  as test 11
13     all-to-all, hasten    site-restart  at 240 s, 10 s  live within 15 s, history late in the
                                                          background, nothing shown twice
14     leader                leader-restart  at 240 s      sites follow the new order stream
15     all-to-all, hasten    A3        10 / 30           3-way partition, each side chats on
16     leader                A3        10 / 30           sides cut from the leader: local chat
17     all-to-all, hasten    mixed     no faults         one site overloaded, only it slowed
18     all-to-all, hasten    A4 (8)    10 / 30           8 sites, two halves (chat-8sites.toml)
19     leader                A3 (8)    10 / 30           8 sites, three groups
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

import json
from collections import Counter
from pathlib import Path
from typing import Any

from flowrouter.testbed import topology as T
from flowrouter.wire.flowid import FlowID

from .analysis import analyse, causal_check
from .igo import Delivery, IGOConfig, MembershipChange, StateChange
from .plots import plot
from .protocol import room_flow
from .report import CSV_FIELDS, fmt_stat, summary_markdown, write_logs, write_summary
from .runs import run_real, run_real_async, run_sim
from .scenarios import (
    ALL_EXPERIMENTS,
    DEFAULT_TOPOLOGY,
    EXPERIMENTS,
    LEADER_ENDPOINT,
    LEADER_SITE,
    SCENARIOS,
    SEED_FIGURES,
    SITES,
    Experiment,
    RunResult,
    config_record,
    igo_config,
    ls_at_sites,
    scenario_groups,
    select,
)

__all__ = [
    "ALL_EXPERIMENTS", "SCENARIOS", "CSV_FIELDS", "DEFAULT_TOPOLOGY", "EXPERIMENTS",
    "LEADER_ENDPOINT", "LEADER_SITE",
    "SEED_FIGURES", "SITES", "Delivery", "Experiment", "IGOConfig", "MembershipChange",
    "RunResult", "StateChange", "analyse", "causal_check", "config_record", "flow_for",
    "igo_config", "ls_at_sites", "plot", "run_all", "run_real", "run_real_async", "run_sim",
    "scenario_groups", "select", "summary_markdown", "write_logs", "write_summary",
]


def run_all(experiments: list[Experiment], *, out: str | Path, real: bool = False,
            duration: float | None = None, plots: bool = True, echo: Any = print,
            **kwargs: Any) -> list[dict[str, Any]]:
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for exp in experiments:
        if real and exp.restart:
            # a restart after 240 s of chat is a long real-time run: the simulator's; a
            # server restart on real routers is tested in tests/test_chat.py
            echo(f"test {exp.number}: {exp.scenario} runs in the simulator only "
                 "(skipped with --real)")
            continue
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
        echo(f"  connected latency {fmt_stat(cl)} s (p95 {fmt_stat(cl, 'p95')}), detection "
             f"{fmt_stat(row['detection'])} s, outage max "
             f"{fmt_stat(row['outage_latency'], 'max')} s, "
             f"late {row['late']}, gaps {row['gaps']}, checks "
             f"{'ok' if not any(row['violations'].values()) else row['violations']} "
             f"[{res.wall:.1f} s wall]")
    return rows


def flow_for(topo_path: str | Path) -> FlowID:
    topo = T.load(topo_path)
    return room_flow("seed003", topo.lsids()[0])
