"""The default workload and the ``flowrouter sim`` command.

:class:`SharedFlowWorkload`: every endpoint joins one shared flow on one data band and sends
messages of ``size`` bytes at ``rate`` messages per second (inter-message gaps uniform in
``[0, 2/rate]``, as seed 003's test-bed did), starting at ``start``. Payloads carry the sender,
a sequence number and the send time, so deliveries give latency, loss and duplicates.

``flowrouter sim TOPOLOGY [--scenario S] [--seed N] [--duration T] [--json]`` runs a topology
file with that workload and prints a summary: messages sent / delivered / expected, latency,
drops by reason (router counters and link model), and per-link traffic.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import struct
import sys
import time
from collections import Counter
from typing import Any

from flowrouter import console
from flowrouter.testbed.sim.endpoint import Delivery, SimEndpoint
from flowrouter.testbed.sim.network import SimNetwork, SimulationError
from flowrouter.testbed.topology import Topology, TopologyError, load
from flowrouter.wire.bands import DEFAULT_DATA_BAND, check_band
from flowrouter.wire.flowid import FlowID

_STAMP = struct.Struct("!IId")  # sender index, sequence number, send time
WORKLOAD_CREATOR = 0x5111
MAX_LINKS_SHOWN = 40


class SharedFlowWorkload:
    def __init__(self, net: SimNetwork, flow: FlowID, *, rate: float = 1.0, size: int = 200,
                 band: int = DEFAULT_DATA_BAND, start: float = 2.0, stop: float | None = None,
                 senders: list[str] | None = None, receivers: list[str] | None = None) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        check_band(band)
        self.net = net
        self.flow = flow
        self.rate = rate
        self.size = max(size, _STAMP.size)
        self.band = band
        self.start = start
        self.stop = stop
        names = list(net.endpoints)
        self.receivers = receivers if receivers is not None else names
        self.senders = senders if senders is not None else names
        self.index = {n: i for i, n in enumerate(names)}
        self.names = names
        self.sent = 0
        self.sent_by: Counter[str] = Counter()
        self.delivered = 0
        self.expected = 0
        self.duplicates = 0
        self.latencies: list[float] = []
        self._seen: set[tuple[int, int, int]] = set()
        self._seq: Counter[str] = Counter()

    def install(self) -> None:
        net = self.net
        for name in self.receivers:
            ep = net.endpoints[name]
            ep.join(self.flow, self.band)
            ep.on_delivery = self._on_delivery
        for name in self.senders:
            if name not in self.receivers:
                net.endpoints[name].advertise(self.flow)
            first = max(self.start, net.now) + net.rng.uniform(0, 1.0 / self.rate)
            net.schedule(first, self._send, name)

    def _send(self, name: str) -> None:
        net = self.net
        now = net.now
        if self.stop is not None and now >= self.stop:
            return
        ep = net.endpoints[name]
        seq = self._seq[name]
        self._seq[name] = seq + 1
        body = _STAMP.pack(self.index[name], seq, now)
        if ep.send(self.flow, self.band, body + bytes(self.size - len(body))):
            self.sent += 1
            self.sent_by[name] += 1
            self.expected += sum(1 for r in self.receivers if r != name)
        net.schedule(now + net.rng.uniform(0, 2.0 / self.rate), self._send, name)

    def _on_delivery(self, ep: SimEndpoint, d: Delivery) -> None:
        if d.flow != self.flow or d.band != self.band or len(d.payload) < _STAMP.size:
            return
        src, seq, sent_at = _STAMP.unpack_from(d.payload)
        key = (self.index[ep.name], src, seq)
        if key in self._seen:
            self.duplicates += 1
            return
        self._seen.add(key)
        self.delivered += 1
        self.latencies.append(d.time - sent_at)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

        return {
            "flow": str(self.flow), "band": self.band, "rate": self.rate, "size": self.size,
            "sent": self.sent, "delivered": self.delivered, "expected": self.expected,
            "delivery_ratio": self.delivered / self.expected if self.expected else None,
            "duplicates": self.duplicates,
            "latency": {"mean": statistics.fmean(lat) if lat else None, "p50": pct(0.5),
                        "p95": pct(0.95), "max": lat[-1] if lat else None},
        }


class _VirtualTime(logging.Filter):
    """Prefixes router log lines with the simulator's virtual time."""

    def __init__(self, net: SimNetwork) -> None:
        super().__init__()
        self.net = net

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = f"[t={self.net.now:.6f}] {record.msg}"
        return True


def default_flow(topo: Topology) -> FlowID:
    lsids = topo.lsids()
    if not lsids:
        raise TopologyError("the default workload needs a location service: add a "
                            "[[location_services]] entry or core_lsids to a router",
                            topo.source)
    return FlowID(WORKLOAD_CREATOR, lsids[0], 1)


def run(topo: Topology, *, scenario: str | None = None, seed: int = 0,
        duration: float | None = None, rate: float = 1.0, size: int = 200,
        band: int = DEFAULT_DATA_BAND, start: float = 2.0, tick: float = 0.1,
        strict: bool = False, repair: bool = False, trace: str | None = None,
        verbose: bool = False, router_traces: str | None = None,
        trace_sample: float = 0.01) -> dict[str, Any]:
    """Run *topo* with the default workload; returns the summary dictionary.

    The routers' own log lines (logger ``flowrouter.core``) are silenced below WARNING unless
    *verbose*, in which case they are prefixed with the virtual time.
    """
    if duration is None:
        sc = topo.scenario(scenario) if scenario else None
        duration = (sc.duration if sc and sc.duration else None) or topo.duration or 60.0
    writers: list[Any] = []
    factory = None
    if router_traces is not None:
        from flowrouter.core.router import Router
        from flowrouter.core.traces import TraceWriter

        def factory(params: Any, now: float) -> Router:  # type: ignore[misc]
            w = TraceWriter(router_traces + "/", params.name, sample_rate=trace_sample,
                            run=f"{topo.name}:{scenario or '-'}:{seed}")
            writers.append(w)
            return Router(params, now=now, tracer=w)
    net = SimNetwork.from_topology(topo, seed=seed, scenario=scenario, tick_interval=tick,
                                   strict=strict, trace=trace is not None,
                                   endpoint_options={"repair": repair},
                                   router_factory=factory)
    wl = SharedFlowWorkload(net, default_flow(topo), rate=rate, size=size, band=band,
                            start=start)
    wl.install()
    core_log = logging.getLogger("flowrouter.core")
    saved_level = core_log.level
    stamp = _VirtualTime(net)
    if verbose:
        core_log.addFilter(stamp)
    elif core_log.getEffectiveLevel() < logging.WARNING:
        core_log.setLevel(logging.WARNING)
    t0 = time.perf_counter()
    try:
        net.run_until(duration)
    finally:
        core_log.removeFilter(stamp)
        core_log.setLevel(saved_level)
    wall = time.perf_counter() - t0
    for w in writers:
        w.close()
    if trace is not None:
        net.write_trace(trace)
    return summarize(net, wl, wall)


def summarize(net: SimNetwork, wl: SharedFlowWorkload | None, wall: float) -> dict[str, Any]:
    st = net.stats()
    rc = st["router_counters"]
    events = st["events"] - st["tick_rounds"] + st["router_ticks"]
    out: dict[str, Any] = {
        "topology": net.topology.name if net.topology else None,
        "scenario": net.scenario, "seed": net.seed, "virtual_time": net.now,
        "wall_seconds": wall, "routers": st["routers"], "endpoints": st["endpoints"],
        "links": st["links"], "events": events,
        "events_per_second": events / wall if wall > 0 else None,
        "frames_delivered": st["frames_delivered"], "router_ticks": st["router_ticks"],
        "messages": wl.summary() if wl else None,
        "drops": {**{f"router:{k}": v for k, v in rc.items() if k.startswith("drop.")},
                  **{f"link:{k}": v for k, v in st["link_drops"].items()}},
        "router_counters": rc,
        "links_traffic": [net.links[n].stats() for n in _link_order(net)],
        "router_errors": [{"time": t, "router": r, "event": e, "error": x}
                          for t, r, e, x in net.errors[:50]],
        "router_error_count": len(net.errors),
    }
    return out


def _link_order(net: SimNetwork) -> list[str]:
    if net.topology is not None:
        return [lk.name for lk in net.topology.links if lk.name in net.links]
    return [n for n, lk in net.links.items() if lk.kind == "router"]


def format_summary(s: dict[str, Any]) -> str:
    L = []
    sc = f"scenario {s['scenario']}" if s["scenario"] else "no scenario"
    L.append(f"flowrouter sim: {s['topology']} ({sc}, seed {s['seed']}): "
             f"{s['virtual_time']:.1f} s virtual in {s['wall_seconds']:.2f} s wall")
    eps = s["events_per_second"]
    L.append(f"  {s['routers']} routers, {s['endpoints']} endpoints, {s['links']} links; "
             f"{s['events']} events ({eps:,.0f}/s)" if eps else "")
    m = s["messages"]
    if m:
        ratio = f"{100 * m['delivery_ratio']:.1f}%" if m["delivery_ratio"] is not None else "-"
        L.append("")
        L.append(f"messages on flow {m['flow']} band {m['band']} ({m['rate']:g}/s per "
                 f"endpoint, {m['size']} bytes)")
        L.append(f"  sent {m['sent']}, delivered {m['delivered']} of {m['expected']} expected "
                 f"({ratio}), duplicates {m['duplicates']}")
        lat = m["latency"]
        if lat["mean"] is not None:
            L.append(f"  latency mean {lat['mean']:.3f} s, p50 {lat['p50']:.3f} s, p95 "
                     f"{lat['p95']:.3f} s, max {lat['max']:.3f} s")
    L.append("")
    L.append("drops by reason")
    if not s["drops"]:
        L.append("  none")
    for k, v in sorted(s["drops"].items()):
        L.append(f"  {k:<32} {v}")
    L.append("")
    L.append("per-link traffic (frames / kbytes each way; drops)")
    links = s["links_traffic"]
    if len(links) > MAX_LINKS_SHOWN:
        links = sorted(links, key=lambda lk: -sum(d["bytes"] for d in lk["directions"]))
        links = links[:MAX_LINKS_SHOWN]
    for lk in links:
        parts = []
        for d in lk["directions"]:
            drops = ", ".join(f"{k} {v}" for k, v in d["drops"].items())
            parts.append(f"{d['from']}>{d['to']} {d['frames']} / {d['bytes'] / 1000:.1f}"
                         + (f" ({drops})" if drops else ""))
        state = "" if lk["connected"] else "  [down]"
        L.append(f"  {lk['name']:<24} " + "   ".join(parts) + state)
    if len(links) < len(s["links_traffic"]):
        L.append(f"  ... the {len(links)} busiest of {len(s['links_traffic'])} links shown "
                 "(--json has all)")
    if s["router_error_count"]:
        L.append("")
        L.append(f"ROUTER ERRORS: {s['router_error_count']} (first shown)")
        for e in s["router_errors"][:5]:
            L.append(f"  t={e['time']:.3f} {e['router']} in {e['event']}: {e['error']}")
    return "\n".join(x for x in L if x is not None)


def build_parser() -> argparse.ArgumentParser:
    p = console.ArgumentParser(
        prog="flowrouter sim",
        description="Run a topology file in the deterministic simulator with a simple "
                    "workload: every endpoint joins one shared flow (on the topology's first "
                    "LSID) and sends to it; prints messages sent/delivered/dropped, drops by "
                    "reason and per-link traffic.")
    p.add_argument("topology", metavar="TOPOLOGY", help="a topology TOML file")
    p.add_argument("--scenario", help="a scenario defined in the file (its faults are added "
                                      "to the file's base faults)")
    p.add_argument("--seed", type=int, default=0, help="fixes every random choice "
                                                       "(default 0)")
    p.add_argument("--duration", type=float, help="virtual seconds to run (default: the "
                   "scenario's or topology's duration, else 60)")
    p.add_argument("--rate", type=float, default=1.0, help="messages per second per endpoint "
                                                           "(default 1)")
    p.add_argument("--size", type=int, default=200, help="payload bytes (default 200)")
    p.add_argument("--band", type=int, default=DEFAULT_DATA_BAND, help="data band (default "
                                                                       "32)")
    p.add_argument("--start", type=float, default=2.0, help="when senders start, virtual "
                                                            "seconds (default 2)")
    p.add_argument("--tick", type=float, default=0.1, help="router tick interval, virtual "
                                                           "seconds (default 0.1)")
    p.add_argument("--trace", metavar="FILE", help="write every simulator event as JSON lines")
    p.add_argument("--router-traces", metavar="DIR",
                   help="write each router's trace records (flowrouter.core.traces schema, the "
                        "input of 'flowtrace analyze') into DIR")
    p.add_argument("--trace-sample", type=float, default=0.01,
                   help="fraction of forwarding decisions traced (default 0.01)")
    p.add_argument("--strict", action="store_true", help="stop at the first exception a "
                                                         "router raises")
    p.add_argument("--repair", action="store_true", help="endpoints re-graft their flows "
                                                         "(LEAVE, JOIN) on fault notices")
    p.add_argument("--verbose", action="store_true", help="show the routers' log lines, "
                                                          "stamped with virtual time")
    p.add_argument("--list-scenarios", action="store_true", help="list the file's scenarios "
                                                                 "and exit")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--flows", type=int, metavar="N",
                   help="instead of the shared flow: N end flows with realistic membership "
                        "(most with 2-3 members, a few large), each member with its own "
                        "bands; reports per router its role and peak table entries, whether "
                        "every member got exactly its bands, control frames/s, bytes on "
                        "core links, wasted deliveries, join latency and the recovery time "
                        "after a core link fails (flowrouter.testbed.sim.flowmix)")
    p.add_argument("--aggregate", choices=("on", "off"), default="on",
                   help="with --flows: the edges of the topology's [[regions]] carry end "
                        "flows inside aggregate flows (on, the default) or every router "
                        "holds every flow crossing it (off)")
    p.add_argument("--join-rate", type=float, default=50_000.0,
                   help="with --flows: joins a virtual second (default 50000)")
    p.add_argument("--no-failure", action="store_true",
                   help="with --flows: skip the link failures (the busiest core link; an "
                        "exit's outside link)")
    return p


def cli_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        topo = load(args.topology)
        if args.list_scenarios:
            for sc in topo.scenarios:
                print(f"{sc.name:<12} {sc.description}")
            return 0
        if args.scenario:
            topo.scenario(args.scenario)
        if args.flows is not None:
            return _run_flows(args, topo)
        summary = run(topo, scenario=args.scenario, seed=args.seed, duration=args.duration,
                      rate=args.rate, size=args.size, band=args.band, start=args.start,
                      tick=args.tick, strict=args.strict, repair=args.repair,
                      trace=args.trace, verbose=args.verbose,
                      router_traces=args.router_traces, trace_sample=args.trace_sample)
    except TopologyError as exc:
        print(f"flowrouter sim: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"flowrouter sim: {exc.args[0]}", file=sys.stderr)
        return 2
    except (ValueError, SimulationError) as exc:
        print(f"flowrouter sim: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(format_summary(summary))
    return 1 if summary["router_error_count"] and args.strict else 0


def _run_flows(args: argparse.Namespace, topo: Topology) -> int:
    from flowrouter.testbed.sim import flowmix

    if args.flows < 1:
        raise ValueError("--flows must be at least 1")
    summary = flowmix.run_flows(topo, args.flows, aggregate=args.aggregate == "on",
                                seed=args.seed, join_rate=args.join_rate,
                                failure=not args.no_failure,
                                router_traces=args.router_traces,
                                trace_sample=args.trace_sample, size=args.size)
    print(flowmix.dumps(summary) if args.json else flowmix.format_summary(summary))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
