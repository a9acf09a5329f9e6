"""Seed 003's experiments as data: the eight tests of Table 2, their partitions, the room's
ordering configuration, and what a run returns (:class:`RunResult`). Imports flowrouter.testbed
(topology files) and the chat's own modules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from flowrouter.testbed import topology as T
from flowrouter.testbed.topofiles import find_topology

from .igo import Delivery, IGOConfig

SITES = ("metropol", "commonwe", "kingdom", "republic")


#: the eight sites of topologies/chat-8sites.toml
SITES8 = SITES + ("duchy", "empire", "federat", "princip")


LEADER_SITE = "hub"


LEADER_ENDPOINT = "leader"


#: the checkout's topologies/, else one in the working directory or above (an installed
#: package ships none next to itself)
DEFAULT_TOPOLOGY = find_topology("seed003-testbed.toml")


@dataclass(frozen=True)
class Experiment:
    number: int
    mode: str  #: all-to-all | hasten | leader
    scenario: str
    down: float
    up: float
    seed_note: str
    rate: float | None = None  #: messages per second per site (None: the run's --rate)
    restart: str | None = None  #: a site (or the leader) whose server restarts ...
    restart_at: float = 0.0  #: ... at this time ...
    restart_down: float = 0.0  #: ... and is down this long (its display marks kept)
    site_rates: tuple[tuple[str, float], ...] = ()  #: per-site messages/s (mixed loads)
    topology: str | None = None  #: another topology file (default seed003-testbed.toml)
    sites: tuple[str, ...] = SITES  #: the chatting sites (each with endpoint SITE-client)
    sides: tuple[tuple[str, ...], ...] = ()  #: the partition's sides (default: by scenario)

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


#: beyond the seed: the network misbehaving in ways its eight tests do not (numbers go on
#: from 9; ``--only`` takes a number, a scenario name or ``all``)
SCENARIOS: tuple[Experiment, ...] = (
    Experiment(9, "hasten", "flapping", 3, 3,
               "every metropol link 3 s down / 3 s up for a minute: no message more than "
               "15 s late, or the site is declared disconnected (stalled) and reconciled"),
    Experiment(10, "leader", "flapping", 3, 3,
               "as test 9 in leader mode: a site whose order stream stalls is cut off from "
               "the leader (local chat, gaps as in L1) instead of waiting"),
    Experiment(11, "hasten", "saturation", 0, 0,
               "7 msg/s of 1 KB per site, ~110% of a 56 kbit/s link: senders slowed "
               "(congested), latency bounded, repair a small fraction, no disconnect",
               rate=7.0),
    Experiment(12, "leader", "saturation", 0, 0,
               "as test 11 in leader mode", rate=7.0),
    Experiment(13, "hasten", "site-restart", 0, 0,
               "metropol's server restarts after 240 s of chat (down 10 s): live traffic "
               "within 15 s, history in the background (late), nothing shown twice",
               restart="metropol", restart_at=240.0, restart_down=10.0),
    Experiment(14, "leader", "leader-restart", 0, 0,
               "the leader restarts after 240 s (down 10 s): sites follow its new order "
               "stream within 15 s, no history flood, nothing shown twice",
               restart=LEADER_SITE, restart_at=240.0, restart_down=10.0),
    Experiment(15, "hasten", "A3", 10, 30,
               "3-way partition {metropol} | {commonwe} | {kingdom, republic}: each side "
               "chats on, reconciled late after each outage, no gaps"),
    Experiment(16, "leader", "A3", 10, 30,
               "as test 15 in leader mode: the sides cut from the leader chat locally"),
    Experiment(17, "hasten", "mixed", 0, 0,
               "mixed loads: metropol at 8 msg/s (beyond its links), the others at 1: "
               "only metropol is slowed, the others' latency stays low",
               site_rates=(("metropol", 8.0), ("commonwe", 1.0), ("kingdom", 1.0),
                           ("republic", 1.0))),
    Experiment(18, "hasten", "A4", 10, 30,
               "8 sites, two halves apart 10 s in every 40: each half chats on, the other's "
               "messages come back late, no gaps", topology="chat-8sites.toml",
               sites=SITES8, sides=(SITES8[:4], SITES8[4:])),
    Experiment(19, "leader", "A3", 10, 30,
               "8 sites in three groups, 10 s in every 40; the group with the leader orders, "
               "the others chat locally", topology="chat-8sites.toml",
               sites=SITES8, sides=(SITES8[:2], SITES8[2:5], SITES8[5:])),
)


ALL_EXPERIMENTS = EXPERIMENTS + SCENARIOS


SEED_FIGURES = {
    "connected latency": "< 1 s (all-to-all ~0.5 s, leader ~0.1 s)",
    "detection": "~6 s (3 heartbeats of 2 s)",
    "reconciled": "<= ~14 s late (10 s outage + ~4 s reconnect and reconcile)",
    "order": "same order at every site of a partition",
}


def select(only: str | None) -> list[Experiment]:
    """``--only``: test numbers and/or scenario names, comma-separated (``1,5`` or ``A1,L2``
    or ``flapping``); ``all`` is the seed's eight and the scenarios beyond them. Without it,
    the seed's eight."""
    if not only:
        return list(EXPERIMENTS)
    want = {w.strip() for w in only.split(",") if w.strip()}
    if "all" in want:
        want = (want - {"all"}) | {str(e.number) for e in ALL_EXPERIMENTS}
    out = [e for e in ALL_EXPERIMENTS
           if str(e.number) in want or e.scenario in want or e.name in want]
    unknown = want - {str(e.number) for e in out} - {e.scenario for e in out} \
        - {e.name for e in out}
    if unknown:
        raise ValueError(f"unknown experiment(s) {', '.join(sorted(unknown))}: use numbers "
                         f"1-{len(ALL_EXPERIMENTS)}, 'all' or scenarios "
                         + ", ".join(sorted({e.scenario for e in ALL_EXPERIMENTS})))
    return out


def ls_at_sites(topo: T.Topology, lsid: int, sites: Sequence[str] = SITES) -> T.Topology:
    """The same topology with every site router also a member of LSID *lsid*'s service,
    as a direct one: the members send straight to each other and never relay, so a broken
    site-to-site link cuts that pair as seed 003's per-pair paths did (a relaying service
    would route around it, and over a tree of thin links)."""
    routers = tuple(replace(r, core_lsids=tuple(sorted(set(r.core_lsids) | {lsid})))
                    if r.name in sites else r for r in topo.routers)
    services = tuple(replace(ls, cores=tuple(dict.fromkeys(ls.cores + tuple(sites))),
                             direct=True)
                     if ls.lsid == lsid else ls for ls in topo.location_services)
    return replace(topo, routers=routers, location_services=services)


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
    if exp.sides:
        return {x: next(set(g) for g in exp.sides if x in g) for x in sites}
    if exp.scenario.startswith("A1"):
        sides = [{"metropol"}, s - {"metropol"}]
    elif exp.scenario.startswith("A2"):
        sides = [{"metropol", "commonwe"}, {"kingdom", "republic"}]
    elif exp.scenario == "A3":
        sides = [{"metropol"}, {"commonwe"}, s - {"metropol", "commonwe"}]
    elif exp.scenario.startswith("L1") or exp.scenario == "flapping":
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


def outages_of(topo: T.Topology, scenario: str, duration: float) -> list[tuple[float, float]]:
    spans: set[tuple[float, float]] = set()
    for f in topo.faults_for(scenario):
        for a, b in f.outages(duration):
            spans.add((a, min(b, duration)))
    return sorted(spans)
