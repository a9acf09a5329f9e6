"""Many end flows at once: the workload of ``flowrouter sim TOPOLOGY --flows N``.

What it measures is what backbone aggregation (:mod:`flowrouter.core.aggregates`) is for:
run it with ``--aggregate on`` and ``--aggregate off`` on a topology with a region and
compare. The run, all in virtual time:

1. **warm-up** (5 s): links come up, LS routes spread, edges join their aggregates;
2. **joins**: N end flows with realistic membership (most have 2 or 3 members, a few
   dozens: :func:`member_count`), each member on its own application with a random
   non-empty mask of bands 32..35, joined at ``join_rate`` joins a second;
3. **data**: each flow's sender (one of its members) sends once on each band 32..35
   (``size`` bytes, 200 by default); every other member must receive exactly the bands of
   its mask (``delivery_exact``); the bytes on links with a core router at either end are
   counted over this phase;
4. **quiet** (one refresh interval): control frames per second on router links;
5. **failure**: the core link on most edge-to-edge paths goes down for good; a sample of
   flows is probed every 100 ms, and the recovery time is how long after the failure the
   last incomplete probe round was sent;
6. **exit failure** (a topology whose region reaches an outside location service through
   two or more edges): the link from that service's core to the edge that is its exit
   goes down for good, so another edge becomes the exit (learned from the LS routes,
   :mod:`flowrouter.core.regionexits`; without aggregation the trees re-graft hop by hop);
   flows of that LSID are probed the same way, and the region messages and exit moves the
   change cost are counted.

Per router: its role (``edge``, ``core`` or ``router``, from the topology's regions) and
the peak of its flow table, sampled every virtual second.

May import the simulator, the topology model and the core (for trace writers).
"""

from __future__ import annotations

import json
import random
import statistics
import struct
import time
from collections import Counter, deque
from typing import Any

from flowrouter.core.aggregates import Catalogue
from flowrouter.core.quotas import QuotaLimits
from flowrouter.testbed.sim.endpoint import Delivery, SimEndpoint
from flowrouter.testbed.sim.network import SimNetwork
from flowrouter.testbed.topology import Topology
from flowrouter.testbed.topology.regions import edges as region_edges
from flowrouter.testbed.topology.regions import exits, roles
from flowrouter.wire.bands import BandMask
from flowrouter.wire.flowid import FlowID

BANDS = (32, 33, 34, 35)
CREATOR = 0xF10A
WARMUP = 5.0
PROBE_EVERY = 0.1
PROBE_FOR = 12.0
PROBE_SAMPLE = 200
_STAMP = struct.Struct("!IBI")  # flow index, band, round (0: the data phase)


def member_count(rng: random.Random, population: int) -> int:
    """Members of one flow: many small flows, a few large (a heavy tail)."""
    u = rng.random()
    if u < 0.60:
        n = 2
    elif u < 0.85:
        n = 3
    elif u < 0.95:
        n = rng.randint(4, 8)
    elif u < 0.99:
        n = rng.randint(9, 20)
    else:
        n = rng.randint(21, max(21, population // 2))
    return max(1, min(n, population))


def random_mask(rng: random.Random) -> int:
    bands = [b for b in BANDS if rng.random() < 0.5] or [rng.choice(BANDS)]
    mask = 0
    for b in bands:
        mask |= 1 << b
    return mask


class FlowMix:
    """The flows, their members and masks, and what each member must receive."""

    def __init__(self, net: SimNetwork, flows: int, seed: int, size: int = 200) -> None:
        rng = random.Random(f"flowmix/{seed}")
        self.net = net
        self.pad = bytes(max(0, size - _STAMP.size))
        names = sorted(net.endpoints)
        lsids = sorted({ls.lsid for ls in net.topology.location_services}) \
            if net.topology else []
        if not lsids or not names:
            raise ValueError("--flows needs a topology with location services and endpoints")
        self.flows: list[FlowID] = []
        self.members: list[list[tuple[str, int]]] = []
        self.senders: list[str] = []
        for i in range(flows):
            self.flows.append(FlowID(CREATOR, lsids[i % len(lsids)], i + 1))
            chosen = rng.sample(names, member_count(rng, len(names)))
            self.members.append([(n, random_mask(rng)) for n in chosen])
            self.senders.append(chosen[0])
        self.index = {f: i for i, f in enumerate(self.flows)}
        self.got: Counter[tuple[str, int, int, int]] = Counter()
        self.join_at: dict[tuple[str, FlowID], float] = {}
        for ep in net.endpoints.values():
            ep.on_delivery = self._on_delivery
            ep.deliveries = _Discard()  # type: ignore[assignment] # counted here instead

    def _on_delivery(self, ep: SimEndpoint, d: Delivery) -> None:
        if len(d.payload) >= _STAMP.size and d.flow.creator == CREATOR:
            i, band, rnd = _STAMP.unpack_from(d.payload)
            self.got[(ep.name, i, band, rnd)] += 1

    def schedule_joins(self, start: float, rate: float) -> float:
        t = start
        step = 1.0 / rate
        for i, flow in enumerate(self.flows):
            for name, mask in self.members[i]:
                self.net.schedule(t, self._join, name, flow, mask)
                t += step
        return t

    def _join(self, name: str, flow: FlowID, mask: int) -> None:
        self.join_at[(name, flow)] = self.net.now
        self.net.endpoints[name].join(flow, BandMask(mask))

    def send(self, i: int, band: int, rnd: int) -> set[tuple[str, int, int, int]]:
        """Flow *i*'s sender sends on *band*; returns the deliveries that must follow."""
        sender = self.senders[i]
        self.net.endpoints[sender].send(self.flows[i], band,
                                        _STAMP.pack(i, band, rnd) + self.pad)
        return {(n, i, band, rnd) for n, m in self.members[i] if n != sender and m >> band & 1}


class _Discard(list):  # type: ignore[type-arg]
    """A delivery list that keeps nothing (the workload counts deliveries itself)."""

    def append(self, _item: Any) -> None:
        pass


def run_flows(topo: Topology, flows: int, *, aggregate: bool = True, seed: int = 0,
              join_rate: float = 50_000.0, send_rate: float = 100_000.0,
              failure: bool = True, router_traces: str | None = None,
              trace_sample: float = 0.01, size: int = 200) -> dict[str, Any]:
    """Run the workload (see the module docs); returns the summary."""
    writers: list[Any] = []
    factory = None
    if router_traces is not None:
        from flowrouter.core.router import Router
        from flowrouter.core.traces import TraceWriter

        def factory(params: Any, now: float) -> Router:  # type: ignore[misc]
            w = TraceWriter(router_traces + "/", params.name, sample_rate=trace_sample,
                            run=f"{topo.name}:aggregate-{'on' if aggregate else 'off'}:"
                                f"{seed}")
            writers.append(w)
            return Router(params, now=now, tracer=w)
    t0 = time.perf_counter()
    net = SimNetwork.from_topology(
        topo, seed=seed, tick_interval=0.1, strict=False, aggregate=aggregate,
        # each simulated application stands for many: no per-application quota applies
        router_options={"max_flows_per_endpoint": 1 << 30, "join_timeout": 10.0,
                        "quota": QuotaLimits(flows=1 << 40, joins_per_second=1e9,
                                             join_burst=1 << 40)},
        endpoint_options={"join_timeout": 30.0}, router_factory=factory)
    role = roles(topo)
    peak: Counter[str] = Counter()

    def sample() -> None:
        for name, r in net.routers.items():
            if len(r.flows) > peak[name]:
                peak[name] = len(r.flows)
        net.after(1.0, sample)

    net.schedule(0.5, sample)
    mix = FlowMix(net, flows, seed, size)
    joins_end = mix.schedule_joins(WARMUP, join_rate)
    data_at = joins_end + 5.0
    net.run_until(data_at)
    # data: every flow's sender on every band
    expected: set[tuple[str, int, int, int]] = set()
    step = 1.0 / send_rate
    core_links = [lk for lk in net.links.values() if lk.kind == "router"
                  and "core" in (role.get(lk.a), role.get(lk.b))]
    bytes_before = sum(lk.ab.bytes + lk.ba.bytes for lk in core_links)
    t = data_at
    for i in range(flows):
        for band in BANDS:
            net.schedule(t, _send_into, mix, expected, i, band, 0)
            t += step
    net.run_until(t + 2.0)
    core_bytes = sum(lk.ab.bytes + lk.ba.bytes for lk in core_links) - bytes_before
    got_data = {k: v for k, v in mix.got.items() if k[3] == 0}
    received = set(got_data)
    # quiet: control traffic only
    quiet = net.topology and 10.0 or 10.0
    router_links = [lk for lk in net.links.values() if lk.kind == "router"]
    frames_before = sum(lk.ab.frames + lk.ba.frames for lk in router_links)
    q0 = net.now
    net.run_until(q0 + quiet)
    control_rate = (sum(lk.ab.frames + lk.ba.frames for lk in router_links)
                    - frames_before) / quiet
    recovery = _failure(net, mix, topo, role) if failure else None
    exit_recovery = _exit_failure(net, mix, topo) if failure else None
    wall = time.perf_counter() - t0
    for w in writers:
        w.close()
    summary = _summary(net, mix, topo, role, peak, aggregate, expected, received, got_data,
                       core_bytes, control_rate, recovery, wall)
    summary["exit_recovery"] = exit_recovery
    return summary


def _send_into(mix: FlowMix, expected: set[Any], i: int, band: int, rnd: int) -> None:
    expected |= mix.send(i, band, rnd)


def busiest_core_link(topo: Topology, role: dict[str, str]) -> str | None:
    """The link between two core routers on most edge-to-edge shortest paths (one BFS
    tree per edge; ties by name)."""
    adj: dict[str, list[tuple[str, str]]] = {}
    for lk in sorted(topo.links, key=lambda x: x.name):
        adj.setdefault(lk.a, []).append((lk.b, lk.name))
        adj.setdefault(lk.b, []).append((lk.a, lk.name))
    use: Counter[str] = Counter()
    edges = [r for r, x in role.items() if x == "edge"]
    for src in edges:
        parent: dict[str, tuple[str, str] | None] = {src: None}
        todo = deque([src])
        while todo:
            r = todo.popleft()
            for n, name in adj.get(r, ()):
                if n not in parent:
                    parent[n] = (r, name)
                    todo.append(n)
        for dst in edges:
            at = parent.get(dst)
            while at is not None:
                prev, name = at
                lk = topo.link(name)
                if role.get(lk.a) == "core" and role.get(lk.b) == "core":
                    use[name] += 1
                at = parent[prev]
    if not use:
        return None
    return min(use, key=lambda n: (-use[n], n))


def exit_link(topo: Topology) -> tuple[str, int] | None:
    """(link, LSID): the link between an outside location service's core and the edge
    that is its exit while every link is up, for the first such service that another edge
    of the region links to as well (so the region has a second way out); None if none."""
    for region in topo.regions:
        edge_set = set(region_edges(topo, region))
        for lsid, edge in exits(topo, region):
            ls = next(x for x in topo.location_services if x.lsid == lsid)
            if any(c in region.routers for c in ls.cores):
                continue
            ways = sorted((lk.name, lk.a if lk.a in edge_set else lk.b) for lk in topo.links
                          if {lk.a, lk.b} & set(ls.cores) and {lk.a, lk.b} & edge_set)
            if len({e for _, e in ways}) >= 2:
                for name, e in ways:
                    if e == edge:
                        return name, lsid
    return None


def _failure(net: SimNetwork, mix: FlowMix, topo: Topology, role: dict[str, str]
             ) -> dict[str, Any] | None:
    name = busiest_core_link(topo, role)
    if name is None:
        return None
    return _probe_failure(net, mix, name, range(len(mix.flows)))


def _exit_failure(net: SimNetwork, mix: FlowMix, topo: Topology) -> dict[str, Any] | None:
    found = exit_link(topo)
    if found is None:
        return None
    name, lsid = found
    before = net.router_counters()
    got = _probe_failure(net, mix, name, [i for i, f in enumerate(mix.flows)
                                          if f.lsid == lsid])
    after = net.router_counters()
    if got is not None:
        got["lsid"] = f"{lsid:#x}"
        for key in ("region.messages-sent", "region.exit-moves"):
            got[key.split(".")[1].replace("-", "_")] = after.get(key, 0) - before.get(key, 0)
    return got


def _probe_failure(net: SimNetwork, mix: FlowMix, name: str, pool: Any
                   ) -> dict[str, Any] | None:
    """Fail link *name* for good and probe a sample of the flows of *pool*."""
    rng = random.Random(f"probe/{net.seed}")
    sample = [i for i in pool if any(n != mix.senders[i] for n, _ in mix.members[i])]
    if not sample:
        return None
    sample = sorted(rng.sample(sample, min(PROBE_SAMPLE, len(sample))))
    bands = {}
    for i in sample:
        union = 0
        for n, m in mix.members[i]:
            if n != mix.senders[i]:
                union |= m
        bands[i] = min(b for b in BANDS if union >> b & 1)
    rounds: list[tuple[float, set[Any]]] = []
    fail_at = net.now + 1.0
    t = net.now
    rnd = 0
    while t < fail_at + PROBE_FOR:
        rnd += 1
        want: set[Any] = set()
        rounds.append((t, want))
        for i in sample:
            net.schedule(t, _send_into, mix, want, i, bands[i], rnd)
        t += PROBE_EVERY
    net.schedule(fail_at, net.link_down, name)
    net.run_until(t + 2.0)
    got = set(mix.got)
    last_bad = None
    lost = 0
    for at, want in rounds:
        missing = len(want - got)
        lost += missing
        if missing and at >= fail_at:
            last_bad = at
    return {"link": name, "failed_at": fail_at, "probe_interval": PROBE_EVERY,
            "flows_probed": len(sample), "probes_lost": lost,
            "seconds": 0.0 if last_bad is None else round(last_bad + PROBE_EVERY - fail_at, 3)}


def _stats(values: list[int]) -> dict[str, Any]:
    if not values:
        return {"routers": 0}
    return {"routers": len(values), "max": max(values), "mean": statistics.fmean(values),
            "total": sum(values)}


def _summary(net: SimNetwork, mix: FlowMix, topo: Topology, role: dict[str, str],
             peak: Counter[str], aggregate: bool, expected: set[Any], received: set[Any],
             got: dict[Any, int], core_bytes: int, control_rate: float,
             recovery: dict[str, Any] | None, wall: float) -> dict[str, Any]:
    rc = net.router_counters()
    acks = [a for ep in net.endpoints.values() for a in ep.acks]
    lat = sorted(a.time - mix.join_at[(ep.name, a.flow)] for ep in net.endpoints.values()
                 for a in ep.acks if (ep.name, a.flow) in mix.join_at
                 and a.status.name == "OK")
    ok = sum(1 for a in acks if a.status.name == "OK")
    total_joins = sum(len(m) for m in mix.members)
    routers = {n: {"role": role.get(n, "router"), "peak_entries": peak[n]}
               for n in sorted(net.routers)}
    by_role: dict[str, list[int]] = {}
    for n in routers:
        by_role.setdefault(role.get(n, "router"), []).append(peak[n])
    missing = expected - received
    unexpected = received - expected
    duplicates = sum(v - 1 for v in got.values() if v > 1)
    policy: dict[str, Any] = {}
    for region in topo.regions:
        n_edges = len(region_edges(topo, region))
        cat = Catalogue(n_edges, region.group_size, region.max_extra)
        policy[region.name] = {"edges": n_edges, "group_size": region.group_size,
                               "max_extra": region.max_extra,
                               "aggregates": len(cat.all_aggregates())}

    def pct(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 6) if lat else None

    return {
        "topology": topo.name, "seed": net.seed, "flows": len(mix.flows),
        "message_size": len(mix.pad) + _STAMP.size,
        "aggregate": aggregate, "regions": policy,
        "routers": routers,
        "entries": {r: _stats(v) for r, v in sorted(by_role.items())},
        "delivery_exact": not missing and not unexpected and not duplicates,
        "deliveries": {"expected": len(expected), "received": len(received),
                       "missing": len(missing), "unexpected": len(unexpected),
                       "duplicates": duplicates},
        "joins": {"total": total_joins, "ok": ok, "latency_s": {
            "mean": round(statistics.fmean(lat), 6) if lat else None, "p50": pct(0.5),
            "p95": pct(0.95), "max": round(lat[-1], 6) if lat else None}},
        "control_frames_per_second": round(control_rate, 1),
        "core_link_bytes": core_bytes,
        "region_copies": rc.get("region.wrapped", 0),
        "wasted_deliveries": rc.get("region.wasted", 0),
        "wasted_bound_per_copy": {n: p["max_extra"] for n, p in policy.items()},
        "recovery": recovery,
        "virtual_time": round(net.now, 3), "wall_seconds": round(wall, 2),
        "router_errors": len(net.errors),
    }


def format_summary(s: dict[str, Any]) -> str:
    e = s["entries"]
    lines = [f"flowrouter sim: {s['topology']}, {s['flows']} flows, aggregation "
             f"{'on' if s['aggregate'] else 'off'} ({s['wall_seconds']} s wall)"]
    for r, st in e.items():
        if st.get("routers"):
            lines.append(f"  {r:<6} routers {st['routers']:>4}: peak entries max {st['max']}, "
                         f"mean {st['mean']:.1f}")
    d = s["deliveries"]
    lines.append(f"  delivery exact: {s['delivery_exact']} ({d['received']} of "
                 f"{d['expected']}; missing {d['missing']}, unexpected {d['unexpected']}, "
                 f"duplicates {d['duplicates']})")
    j = s["joins"]
    lines.append(f"  joins {j['ok']} of {j['total']}, latency mean {j['latency_s']['mean']} s, "
                 f"p95 {j['latency_s']['p95']} s")
    lines.append(f"  control frames/s {s['control_frames_per_second']}, core-link bytes "
                 f"{s['core_link_bytes']}, wasted deliveries {s['wasted_deliveries']}")
    for what in ("recovery", "exit_recovery"):
        rv = s.get(what)
        if rv:
            lines.append(f"  {what.replace('_', ' ')} after {rv['link']} failed: "
                         f"{rv['seconds']} s ({rv['probes_lost']} probes lost)")
    return "\n".join(lines)


def dumps(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=2, sort_keys=True)
