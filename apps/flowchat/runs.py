"""Running one experiment: in the deterministic simulator (:func:`run_sim`) or on real router
processes on loopback (:func:`run_real`), with the seed's bots at every site."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from flowrouter.testbed import topology as T
from flowrouter.testbed.topofiles import find_topology

from .igo import Delivery
from .protocol import SAY, encode_chat, room_flow
from .scenarios import (
    DEFAULT_TOPOLOGY,
    LEADER_ENDPOINT,
    LEADER_SITE,
    Experiment,
    RunResult,
    config_record,
    igo_config,
    ls_at_sites,
    outages_of,
    scenario_groups,
)

#: messages per second per site when neither the run nor the scenario says (seed 6.2)
DEFAULT_RATE = 2.0

#: how long a bot holds back when its site is congested before it tries again
BOT_BACKOFF = 0.25


def run_sim(exp: Experiment, *, topology: str | Path = DEFAULT_TOPOLOGY, duration: float = 300.0,
            seed: int = 1, size: int = 1000, rate: float | None = None, ls: str = "sites",
            start: float = 2.0, tick: float = 0.1, config: dict[str, Any] | None = None,
            keep_marks: bool = True) -> RunResult:
    """Run one experiment in the simulator; returns every delivery and event.
    *keep_marks* False: a restarted site comes back without its display marks (its state
    directory lost)."""
    from flowrouter.testbed.sim import SimNetwork

    from .sim_adapter import SimSite

    chatting = exp.sites  # the sites that chat in this experiment
    topo = T.load(find_topology(exp.topology) if exp.topology else topology)
    lsid = topo.lsids()[0]
    if ls == "sites":
        topo = ls_at_sites(topo, lsid, chatting)
    elif ls != "hub":
        raise ValueError("ls must be 'sites' or 'hub'")
    net = SimNetwork.from_topology(topo, seed=seed, scenario=exp.scenario, strict=True)
    flow = room_flow("seed003", lsid)
    cfg = igo_config(exp, chatting, **(config or {}))
    sites: dict[str, SimSite] = {}
    for i, name in enumerate(chatting):
        sites[name] = SimSite(net, net.endpoints[f"{name}-client"], flow, cfg, name, tick=tick,
                              incarnation=1000 + i)
    if exp.mode == "leader":
        sites[LEADER_SITE] = SimSite(net, net.endpoints[LEADER_ENDPOINT], flow, cfg,
                                     LEADER_SITE, tick=tick, incarnation=2000)
    for s in sites.values():
        s.start()
    rng = random.Random(f"{seed}/bots")
    rate = rate or exp.rate or DEFAULT_RATE  # the run's, else the scenario's
    rates = {n: dict(exp.site_rates).get(n, rate) for n in chatting}
    send_vectors: dict[tuple[str, int], dict[str, int]] = {}
    highest: dict[str, dict[str, int]] = {n: defaultdict(int) for n in chatting}

    def track(name: str) -> Any:
        def on_deliver(d: Delivery) -> None:
            h = highest[name]
            if d.seq > h[d.origin]:
                h[d.origin] = d.seq
        return on_deliver

    for name in chatting:
        sites[name].on_deliver = track(name)

    slowed: dict[str, float] = defaultdict(float)  #: seconds each site's bot was held back
    before: dict[str, SimSite] = {}  #: a restarted site's first run

    def go_down(name: str) -> None:
        """The site's server stops (a crash or a restart): its display marks are what it
        kept on disk."""
        old = sites[name]
        before[name] = old
        old.stop()
        net.after(exp.restart_down, come_up, name,
                  old.ordering.display_marks() if keep_marks else [],
                  old.ordering.sent_mark() if keep_marks else None)

    def come_up(name: str, marks: list[tuple[str, int, int]],
                sent: tuple[int, int] | None) -> None:
        ep = net.endpoints[LEADER_ENDPOINT if name == LEADER_SITE else f"{name}-client"]
        new = SimSite(net, ep, flow, cfg, name, tick=tick, shown=marks, sent=sent)
        if name in chatting:
            new.on_deliver = track(name)
        sites[name] = new
        new.start()

    if exp.restart:
        net.schedule(exp.restart_at, go_down, exp.restart)

    def bot(name: str) -> None:
        site = sites[name]
        if name == exp.restart and net.now >= exp.restart_at:
            return  # the restarted site listens from then on (its runs are told apart)
        if site.ordering.congested:
            # the site says "congested": a user (and the bot) waits before sending more
            slowed[name] += BOT_BACKOFF
            net.after(BOT_BACKOFF, bot, name)
            return
        seq = site.ordering.seq + 1
        send_vectors[(name, seq)] = dict(highest[name])
        site.submit(encode_chat(SAY, f"bot@{name}", f"{name} message {seq}", pad_to=size))
        net.after(rng.uniform(0.0, 2.0 / rates[name]), bot, name)

    for name in chatting:
        net.schedule(start + rng.uniform(0.0, 1.0 / rate), bot, name)
    t0 = time.perf_counter()
    net.run_until(duration)
    wall = time.perf_counter() - t0
    outages = outages_of(topo, exp.scenario, duration)
    first = {n: before.get(n, s) for n, s in sites.items()}
    res = RunResult(exp, duration, chatting,
                    {n: (before[n].deliveries if n in before else []) + s.deliveries
                     for n, s in sites.items() if n in chatting},
                    {n: (before[n].events if n in before else []) + s.events
                     for n, s in sites.items()},
                    {n: first[n].ordering.seq for n in chatting}, send_vectors, outages,
                    scenario_groups(exp, chatting),
                    {n: dict(sum((Counter(r.ordering.counters) for r in {first[n], s}),
                                 Counter()))
                     for n, s in sites.items()}, wall, "sim")
    res.extra["runs"] = {n: len(old.deliveries) for n, old in before.items() if n in chatting}
    res.extra["restart"] = ({"site": exp.restart, "at": exp.restart_at,
                             "up": exp.restart_at + exp.restart_down,
                             "before": before[exp.restart].deliveries,
                             "after": sites[exp.restart].deliveries,
                             "counters": dict(sites[exp.restart].ordering.counters)}
                            if exp.restart in before else None)
    res.extra["config"] = config_record(sites[chatting[0]].ordering.cfg)
    res.extra["link_drops"] = dict(net.link_drops())
    res.extra["slowed"] = {n: round(slowed[n], 1) for n in chatting}
    res.extra["bytes"] = {n: s.bytes_by_kind() for n, s in sites.items()}
    res.extra["ls"] = ls
    res.extra["leader_deliveries"] = (len(sites[LEADER_SITE].deliveries)
                                      if exp.mode == "leader" else None)
    return res


async def run_real_async(exp: Experiment, *, topology: str | Path = DEFAULT_TOPOLOGY,
                         duration: float = 60.0, seed: int = 1, size: int = 1000,
                         rate: float | None = None, ls: str = "sites",
                         workdir: str | None = None,
                         base_port: int | None = None, config: dict[str, Any] | None = None,
                         start: float = 3.0) -> RunResult:
    """One experiment on real router processes (``flowrouter.testbed.launcher.Launcher``): one
    ``flowrouter run`` per router on loopback with link emulation, this process running the
    site servers (flowlib clients) and the bots, the fault schedule applied through the
    routers' control interfaces in real time."""
    import flowlib
    from flowrouter.testbed.launcher import Launcher, LaunchReport

    if exp.restart:
        raise ValueError(f"{exp.name} restarts a server: simulator only (run_sim)")

    from .flow_adapter import FlowSite

    chatting = exp.sites  # the sites that chat in this experiment
    topo = T.load(find_topology(exp.topology) if exp.topology else topology)
    lsid = topo.lsids()[0]
    if ls == "sites":
        topo = ls_at_sites(topo, lsid, chatting)
    launcher = Launcher(topo, scenario=exp.scenario, duration=duration, view=False,
                        workdir=workdir, base_port=base_port)
    flow = room_flow("seed003", lsid)
    cfg = igo_config(exp, chatting, **(config or {}))
    names = list(chatting) + ([LEADER_SITE] if exp.mode == "leader" else [])
    endpoint_of = {n: f"{n}-client" for n in chatting}
    endpoint_of[LEADER_SITE] = LEADER_ENDPOINT
    sites: dict[str, FlowSite] = {}
    clients: list[Any] = []
    tasks: list[asyncio.Task[Any]] = []
    report = LaunchReport(topo.name, exp.scenario, duration)
    rng = random.Random(f"{seed}/bots")
    rate = rate or exp.rate or DEFAULT_RATE  # the run's, else the scenario's
    rates = {n: dict(exp.site_rates).get(n, rate) for n in chatting}
    send_vectors: dict[tuple[str, int], dict[str, int]] = {}
    highest: dict[str, dict[str, int]] = {n: defaultdict(int) for n in chatting}
    slowed: dict[str, float] = defaultdict(float)
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
                if site.ordering.congested:  # "congested": hold back, as a user would
                    slowed[name] += BOT_BACKOFF
                    await asyncio.sleep(BOT_BACKOFF)
                    continue
                seq = site.ordering.seq + 1
                send_vectors[(name, seq)] = dict(highest[name])
                site.submit(encode_chat(SAY, f"bot@{name}", f"{name} message {seq}",
                                        pad_to=size))
                await asyncio.sleep(rng.uniform(0.0, 2.0 / rates[name]))

        for name in chatting:
            tasks.append(asyncio.ensure_future(bot(name)))
        for t, fault, down in launcher.fault_events():
            tasks.append(asyncio.ensure_future(launcher.fault_at(t, fault, down, report)))
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
    outages = outages_of(topo, exp.scenario, duration)
    res = RunResult(exp, duration, chatting,
                    {n: list(sites[n].deliveries) for n in chatting},
                    {n: list(s.events) for n, s in sites.items()},
                    {n: sites[n].ordering.seq for n in chatting}, send_vectors, outages,
                    scenario_groups(exp, chatting),
                    {n: dict(s.ordering.counters) for n, s in sites.items()}, duration, "real")
    res.extra["config"] = config_record(sites[chatting[0]].ordering.cfg)
    res.extra["faults_applied"] = report.faults_applied
    res.extra["slowed"] = {n: round(slowed[n], 1) for n in chatting}
    res.extra["workdir"] = str(launcher.workdir)
    res.extra["ls"] = ls
    return res


def run_real(exp: Experiment, **kwargs: Any) -> RunResult:
    return asyncio.run(run_real_async(exp, **kwargs))
