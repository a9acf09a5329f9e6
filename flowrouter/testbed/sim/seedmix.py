"""Seed 000's workload in the simulator: its message-size mix, fragmenting or not.

Holds :class:`MailWorkload` (seed 000's message-transfer load on a topology) and
``python -m flowrouter.testbed.sim.seedmix``, which sweeps it the way the seed compares its
systems. May import flowrouter.testbed (sim, topology), flowrouter.core and flowrouter.wire.

The seed (Brachman 1989, ch. 6) has every MTA originate messages with exponential gaps, each
to a uniformly chosen other MTA, with sizes drawn from its Table 6.1 (1 fragment: 0.70, 2-30:
0.20, 31-100: 0.10; 1000-byte fragments), over links that take ``t`` = 1.0 or 2.0 s per
fragment. It compares a *fragmenting* system (each fragment travels on its own, so a long
message is pipelined over its path and interleaves with others) with a *non-fragmenting* one
(the whole message is one unit, stored and forwarded hop by hop), as throughput against load
(figures 6.3-6.10; RBSAD, its recipient-buffer delay, has no counterpart here, so the load axis
is the mean interarrival time as in figure 6.10, and fragment size as in figure 6.9).

Here each MTA is a router with one endpoint (its user agent). Every user agent joins its own
"mailbox" flow; a message to it is sent on that flow (routers carry it toward the flow's core
and down its tree, flownet's routing, not the seed's shortest path). Fragmenting: ``n`` frames
of one fragment each. Non-fragmenting: one frame of ``n`` fragments' bytes (the routers'
``max_payload`` is raised to the largest message so nothing is refused for size). Each frame
carries (sender, message id, index, count, send time), so the receiver knows when a message is
complete; throughput counts only complete messages' bytes, and delay is send-to-complete.

Link buffers are finite like the seed's (``buffer_fragments`` fragments per direction by
default, the seed's 500-buffer pool): a frame that does not fit is dropped and counted
(``queue-full``), which is how a store-and-forward system's large messages suffer.

The routers' GC epoch is raised to 600 s: at the seed's link speeds a GC pong can wait minutes
behind queued fragments, and the default 5 s epoch would collect live mailbox trees (measured:
with it, most fragments died as ``drop.no-members`` at the core).
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrouter.testbed.sim.endpoint import Delivery, SimEndpoint
from flowrouter.testbed.sim.network import SimNetwork
from flowrouter.testbed.topofiles import SHIPPED
from flowrouter.testbed.topology import Topology, load
from flowrouter.wire.bands import DEFAULT_DATA_BAND
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import HEADER_SIZE

#: seed 000 Table 6.1: (lowest, highest fragments, probability)
SIZE_MIX: tuple[tuple[int, int, float], ...] = ((1, 1, 0.70), (2, 30, 0.20), (31, 100, 0.10))
CLASSES = ("1", "2-30", "31-100")
FRAGMENT_BYTES = 640  # 100 of them fit one 64 KiB frame (the routers' limit)
MAILBOX_CREATOR = 0x5EED
STAMP = struct.Struct("!HIHHd")  # sender index, message id, fragment index, count, send time
REPO_TOPOLOGIES = SHIPPED
SEED_TOPOLOGIES = ("ring-bi-20", "linear-20", "cdnnet-15")


def size_class(n: int) -> str:
    return "1" if n == 1 else "2-30" if n <= 30 else "31-100"


def draw_size(rng: Any) -> int:
    """Fragments in one message, from seed 000's Table 6.1."""
    x = rng.random()
    for lo, hi, p in SIZE_MIX:
        if x < p:
            return lo if lo == hi else rng.randint(lo, hi)
        x -= p
    return SIZE_MIX[-1][1]


def link_bandwidth(t: float, fragment: int = FRAGMENT_BYTES) -> float:
    """Bits/s at which one fragment frame (header included) takes *t* seconds."""
    return (fragment + HEADER_SIZE) * 8.0 / t


@dataclass
class _Partial:
    count: int
    sent_at: float
    got: set[int] = field(default_factory=set)


class MailWorkload:
    """Seed 000's message transfer: every user agent mails random others."""

    def __init__(self, net: SimNetwork, *, interarrival: float = 50.0, fragmenting: bool = True,
                 fragment: int = FRAGMENT_BYTES, start: float = 5.0,
                 stop: float | None = None, lsid: int = 0x10) -> None:
        if interarrival <= 0 or fragment < STAMP.size:
            raise ValueError("interarrival must be positive, fragment >= "
                             f"{STAMP.size} bytes")
        self.net = net
        self.interarrival = interarrival
        self.fragmenting = fragmenting
        self.fragment = fragment
        self.start = start
        self.stop = stop
        self.names = sorted(net.endpoints)
        if len(self.names) < 2:
            raise ValueError("the mail workload needs at least two endpoints")
        self.index = {n: i for i, n in enumerate(self.names)}
        self.mailbox = {n: FlowID(MAILBOX_CREATOR, lsid, i + 1)
                        for i, n in enumerate(self.names)}
        self._owner = {f.key: n for n, f in self.mailbox.items()}
        self.rng = net.rng
        self.next_id = 0
        self.sent: Counter[str] = Counter()  #: messages sent per size class
        self.sent_fragments = 0
        self.done: Counter[str] = Counter()  #: complete messages per size class
        self.done_fragments = 0
        self.delays: dict[str, list[float]] = {c: [] for c in CLASSES}
        self._partial: dict[tuple[int, int], _Partial] = {}
        self.duplicates = 0
        self.misdelivered = 0

    def install(self) -> None:
        for name in self.names:
            ep = self.net.endpoints[name]
            ep.join(self.mailbox[name], DEFAULT_DATA_BAND)
            ep.on_delivery = self._on_delivery
            self.net.schedule(self.start + self.rng.expovariate(1.0 / self.interarrival),
                              self._originate, name)

    def _originate(self, name: str) -> None:
        now = self.net.now
        if self.stop is not None and now >= self.stop:
            return
        others = [n for n in self.names if n != name]
        dest = others[self.rng.randrange(len(others))]
        n = draw_size(self.rng)
        self.next_id += 1
        mid = self.next_id
        ep = self.net.endpoints[name]
        flow = self.mailbox[dest]
        src = self.index[name]
        self.sent[size_class(n)] += 1
        self.sent_fragments += n
        if self.fragmenting:
            pad = bytes(self.fragment - STAMP.size)
            for i in range(n):
                ep.send(flow, DEFAULT_DATA_BAND, STAMP.pack(src, mid, i, n, now) + pad)
        else:
            ep.send(flow, DEFAULT_DATA_BAND,
                    STAMP.pack(src, mid, 0, n, now) + bytes(n * self.fragment - STAMP.size))
        self.net.after(self.rng.expovariate(1.0 / self.interarrival), self._originate, name)

    def _on_delivery(self, ep: SimEndpoint, d: Delivery) -> None:
        ep.deliveries.clear()  # long runs: keep no per-frame history
        if self._owner.get(d.flow.key) != ep.name or len(d.payload) < STAMP.size:
            self.misdelivered += 1
            return
        src, mid, idx, n, sent_at = STAMP.unpack_from(d.payload)
        if not self.fragmenting:
            self._complete(n, sent_at)
            return
        key = (src, mid)
        part = self._partial.get(key)
        if part is None:
            part = self._partial[key] = _Partial(n, sent_at)
        if idx in part.got:
            self.duplicates += 1
            return
        part.got.add(idx)
        if len(part.got) == part.count:
            del self._partial[key]
            self._complete(n, sent_at)

    def _complete(self, n: int, sent_at: float) -> None:
        c = size_class(n)
        self.done[c] += 1
        self.done_fragments += n
        self.delays[c].append(self.net.now - sent_at)

    def summary(self, measured: float) -> dict[str, Any]:
        """Throughput: fragments of complete messages per hour of virtual time."""
        per_class = {}
        for c in CLASSES:
            d = self.delays[c]
            per_class[c] = {"sent": self.sent[c], "complete": self.done[c],
                            "mean_delay": statistics.fmean(d) if d else None}
        return {"fragmenting": self.fragmenting, "interarrival": self.interarrival,
                "fragment_bytes": self.fragment,
                "messages_sent": sum(self.sent.values()),
                "messages_complete": sum(self.done.values()),
                "fragments_sent": self.sent_fragments,
                "fragments_complete": self.done_fragments,
                "throughput_fragments_per_hour": self.done_fragments * 3600.0 / measured,
                "incomplete": len(self._partial), "duplicates": self.duplicates,
                "misdelivered": self.misdelivered, "classes": per_class}


def build(topo: Topology, *, t: float, buffer_fragments: int, max_fragments: int,
          fragment: int, seed: int, tick: float, epoch: float = 600.0) -> SimNetwork:
    """The topology's routers, links and endpoints with the seed's link speed and buffers."""
    net = SimNetwork(seed, tick_interval=tick, strict=False)
    net.topology = topo
    max_payload = max(max_fragments * fragment, 64 * 1024)
    for r in topo.routers:
        params: dict[str, Any] = topo.router_params(r.name)
        for k in ("ping_after", "delete_after", "max_flows"):
            if k in params:
                params[k] = int(params[k])
        params["max_payload"] = max_payload
        params["epoch"] = epoch
        net.add_router(r.name, core_lsids=r.core_lsids, routes=dict(r.routes),
                       default_route=r.default_route, site=r.site, **params)
    queue = buffer_fragments * (fragment + HEADER_SIZE)
    for lk in topo.links:
        net.add_link(lk.a, lk.b, name=lk.name, transport=lk.transport,
                     bandwidth=link_bandwidth(t, fragment), delay=lk.delay, loss=lk.loss,
                     modifiers=lk.modifiers, oneway=lk.oneway, queue_limit=queue)
    for e in topo.endpoints:
        net.add_endpoint(e.name, e.router, delay=e.delay, bandwidth=e.bandwidth,
                         modifiers=e.modifiers, max_payload=max_payload)
    return net


def run_one(topo: Topology, *, fragmenting: bool, t: float = 2.0, interarrival: float = 50.0,
            duration: float = 20000.0, warmup: float = 0.1, seed: int = 1,
            fragment: int = FRAGMENT_BYTES, buffer_fragments: int = 500,
            tick: float = 1.0) -> dict[str, Any]:
    """One simulation; messages sent in the first *warmup* fraction are not counted."""
    wall0 = time.perf_counter()
    max_frag = max(hi for _, hi, _ in SIZE_MIX)
    net = build(topo, t=t, buffer_fragments=buffer_fragments, max_fragments=max_frag,
                fragment=fragment, seed=seed, tick=tick)
    wl = MailWorkload(net, interarrival=interarrival, fragmenting=fragmenting,
                      fragment=fragment, stop=duration)
    wl.install()
    skip = duration * warmup
    net.run_until(skip)
    base_done = wl.done_fragments
    wl.done_fragments = 0
    wl.done.clear()
    wl.delays = {c: [] for c in CLASSES}
    net.run_until(duration)
    out = wl.summary(duration - skip)
    out.update(topology=topo.name, t=t, seed=seed, duration=duration, warmup=skip,
               fragments_before_warmup=base_done,
               link_drops=dict(net.link_drops()),
               router_drops={k: v for k, v in net.router_counters().items()
                             if k.startswith("drop")},
               router_errors=len(net.errors), wall_seconds=time.perf_counter() - wall0)
    return out


def sweep(topologies: list[str], *, ts: list[float], interarrivals: list[float],
          duration: float, seed: int, fragment: int = FRAGMENT_BYTES) -> list[dict[str, Any]]:
    rows = []
    for name in topologies:
        path = Path(name)
        topo = load(path if path.suffix == ".toml" else REPO_TOPOLOGIES / f"{name}.toml")
        for t in ts:
            for ia in interarrivals:
                for frag in (True, False):
                    rows.append(run_one(topo, fragmenting=frag, t=t, interarrival=ia,
                                        duration=duration, seed=seed, fragment=fragment))
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """One line per (topology, t, interarrival): both systems' throughput and delays."""
    lines = ["| topology | t (s) | mean interarrival (s) | system | fragments/h complete | "
             "msgs complete/sent | mean delay 1 / 2-30 / 31-100 (s) | link drops |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = [r["classes"][c]["mean_delay"] for c in CLASSES]
        ds = " / ".join("-" if x is None else f"{x:.0f}" for x in d)
        drops = sum(r["link_drops"].values())
        lines.append(f"| {r['topology']} | {r['t']:g} | {r['interarrival']:g} | "
                     f"{'fragmenting' if r['fragmenting'] else 'non-fragmenting'} | "
                     f"{r['throughput_fragments_per_hour']:.0f} | "
                     f"{r['messages_complete']}/{r['messages_sent']} | {ds} | {drops} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flowrouter.testbed.sim.seedmix",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--topology", action="append",
                   help=f"name in topologies/ or a .toml path (default: {SEED_TOPOLOGIES})")
    p.add_argument("--t", type=float, action="append",
                   help="seconds per fragment per link (default 1.0 and 2.0)")
    p.add_argument("--interarrival", type=float, action="append",
                   help="mean seconds between a node's messages (default 25, 50, 100)")
    p.add_argument("--duration", type=float, default=20000.0, help="virtual seconds")
    p.add_argument("--fragment", type=int, default=FRAGMENT_BYTES)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true",
                   help="one topology, t=1, one load, 2000 s (a smoke test)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    if a.quick:
        topos, ts, ias, dur = ["cdnnet-15"], [1.0], [50.0], 2000.0
    else:
        topos = a.topology or list(SEED_TOPOLOGIES)
        ts = a.t or [1.0, 2.0]
        ias = a.interarrival or [25.0, 50.0, 100.0]
        dur = a.duration
    rows = sweep(topos, ts=ts, interarrivals=ias, duration=dur, seed=a.seed,
                 fragment=a.fragment)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
    if a.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
