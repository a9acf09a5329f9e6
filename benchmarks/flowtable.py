#!/usr/bin/env python3
"""Flow-table cost of the sans-I/O router core: memory per entry, lookup time, soft-state upkeep.

No sockets and no event loop: one :class:`flowrouter.core.router.Router` is driven directly.

Set-up (the same for every table size): the router is a transit router, not the core. Link 1
is a neighbouring router (HELLO as ROUTER, then an LS_ROUTES vector naming LSID 0x10 at
distance 0, so link 1 is the way to the core); link 2 is an application (HELLO as
ENDPOINT). Each flow is installed exactly as on the wire: a JOIN (band mask {32}) from link 2
goes through ``Router.receive``, the router sends its own JOIN up link 1, and the JOIN_ACK
from link 1 goes through ``Router.receive`` too. The entry then has an upstream link, one
downstream link with a mask, and its GC state, like any entry on a router in the middle of a
tree.

* **memory**: ``tracemalloc`` traced bytes after the build minus before, divided by the
  number of flows (the entry, its dictionaries, the 16-byte key, the flow-table slot, the
  link's dependent-set slot). The process RSS growth is shown too.
* **lookup**: ``Router.receive`` of a 16-byte data frame on band 32 from the upstream link
  for a flow picked at random (uniformly over the table, so large tables pay cache misses),
  returning one ``Send`` to link 2. The header is a memoryview into one receive buffer, as the
  runtime's FrameDecoder produces. ``dict.get`` alone on the same keys is shown for scale.
* **upkeep** (soft state: refresh digests and hold times; see :func:`measure_maintenance`): three
  refresh intervals of idle flows kept by the application's refresh digests (CPU share of
  one core, control frames per second per link and direction, the longest single call,
  which is how long the runtime's event loop would be blocked), then the hold-time expiry
  of every entry once the application stops refreshing. (Before soft state this section
  measured the per-(flow, link) PING sweeps; BENCHMARKS.md keeps those numbers.)

``--build direct`` skips the wire (constructs the entries with the same fields as the join
path produces) for faster runs at 10^6; the default is the join path for every size.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from flowrouter.core.router import Router, RouterParams, Send  # noqa: E402
from flowrouter.core.tables import FlowEntry  # noqa: E402
from flowrouter.wire import control as C  # noqa: E402
from flowrouter.wire.bands import BAND_MEMBERSHIP  # noqa: E402
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID  # noqa: E402
from flowrouter.wire.header import HEADER_SIZE, pack_header  # noqa: E402

UP, EP = 1, 2
BAND = 32
MASK = 1 << BAND
LSID = 0x10
CREATOR = 0x5EED_F10E_0000_0001
TICK = 0.25
cpu_clock = time.thread_time  #: CPU time of this thread (the upkeep's cost, not the waits)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_router(n_flows: int) -> Router:
    limit = max(n_flows, 1) * 2
    kw: dict[str, Any] = {"max_flows": limit}
    names = {f.name for f in dataclasses.fields(RouterParams)}
    if "max_flows_per_endpoint" in names:  # one application link holds every flow here
        kw["max_flows_per_endpoint"] = limit
    if "quota" in names:  # ... and the application's principal may hold and join them all
        from flowrouter.core.quotas import QuotaLimits

        kw["quota"] = QuotaLimits(flows=limit, joins_per_second=1e12, join_burst=limit)
    if "control_per_tick" in names:  # ... and send them all between two ticks
        kw["control_per_tick"] = limit * 2
    r = Router(RouterParams(name="bench", node_id=1, **kw), 0.0)
    link_key = LINK_LOCAL_FLOW.key
    for lid, role, name in ((UP, C.Role.ROUTER, "up"), (EP, C.Role.ENDPOINT, "app")):
        # the upstream router is one we "dialled" (a proven router link)
        r.open_link(lid, 0.0, transport="sim", address=name,
                    expected_peer=name if role is C.Role.ROUTER else None)
        hello = C.Hello(100 + lid, role, name, 65536).encode()
        r.receive(lid, pack_header(link_key, len(hello), BAND_MEMBERSHIP), hello, 0.0)
    routes = C.LsRoutes(((LSID, 0),)).encode()
    r.receive(UP, pack_header(link_key, len(routes), BAND_MEMBERSHIP), routes, 0.0)
    assert r.routing.link_for(LSID) == UP, "the fake upstream router did not become the route"
    return r


def flow_key(i: int) -> bytes:
    return FlowID(CREATOR, LSID, i).key


def build_join(r: Router, n: int) -> None:
    """Install n flows through Router.receive: JOIN from the app, JOIN_ACK from upstream."""
    receive = r.receive
    decode = C.decode
    ok = C.JoinStatus.OK
    for i in range(n):
        key = flow_key(i)
        body = C.Join(i + 1, MASK).encode()
        out = receive(EP, pack_header(key, len(body), BAND_MEMBERSHIP), body, 0.0)
        sent = out[0]
        assert isinstance(sent, Send)
        up_join = decode(sent.payload)  # the router's own JOIN toward the core
        assert isinstance(up_join, C.Join), up_join
        ack = C.JoinAck(up_join.req_id, ok).encode()
        receive(UP, pack_header(key, len(ack), BAND_MEMBERSHIP), ack, 0.0)


def build_direct(r: Router, n: int) -> None:
    """The same entries as build_join, made without the wire (documented shortcut)."""
    flows = r.flows
    up_dep = r.links[UP].dependent
    ep_dep = r.links[EP].dependent
    epoch = r.epoch
    for i in range(n):
        key = flow_key(i)
        e = FlowEntry(UP, True, 0.0)
        if hasattr(e, "set_down"):
            e.set_down(EP, MASK, epoch)
        else:  # a checkout from before the downstream links were folded (FLOWNET_BENCH_CODE)
            e.down[EP] = MASK
            e.traffic[EP] = epoch
        e.agg = MASK
        e.sent_up_mask = MASK
        flows[key] = e
        up_dep.add(key)
        ep_dep.add(key)
    if hasattr(r.links[EP], "downstream"):  # soft state counts a link's downstream pairs
        r.links[EP].downstream += n
    r.counters["flows.created"] += n


def measure_lookup(r: Router, n: int, samples: int, seed: int = 1) -> dict[str, float]:
    rng = random.Random(seed)
    picks = [rng.randrange(n) for _ in range(samples)]
    payload = b"p" * 16
    frame = pack_header(b"\0" * 16, len(payload), BAND) + payload
    # one receive buffer of frames, headers as memoryviews into it (as the decoder does)
    buf = bytearray()
    for i in picks:
        buf += flow_key(i) + frame[16:]
    view = memoryview(bytes(buf))
    step = HEADER_SIZE + len(payload)
    headers = [view[k * step:k * step + HEADER_SIZE] for k in range(samples)]
    payloads = [view[k * step + HEADER_SIZE:(k + 1) * step] for k in range(samples)]
    receive = r.receive
    # correctness check on one frame
    out = receive(UP, headers[0], payloads[0], 1.0)
    assert len(out) == 1 and type(out[0]) is Send and out[0].link == EP, out
    keys = [bytes(h[:16]) for h in headers]
    get = r.flows.get
    rounds = 5
    chunk = max(samples // rounds, 1)
    t_receive: list[float] = []
    t_get: list[float] = []
    gc.disable()
    try:
        for k in range(rounds):  # best of 5 rounds: the machine may be shared
            hs, ps = headers[k * chunk:(k + 1) * chunk], payloads[k * chunk:(k + 1) * chunk]
            t0 = time.perf_counter()
            for h, p in zip(hs, ps):
                receive(UP, h, p, 1.0)
            t_receive.append((time.perf_counter() - t0) / len(hs))
            ks = keys[k * chunk:(k + 1) * chunk]
            t0 = time.perf_counter()
            for key in ks:
                get(key)
            t_get.append((time.perf_counter() - t0) / len(ks))
    finally:
        gc.enable()
    return {"receive_ns": min(t_receive) * 1e9,
            "receive_ns_median": sorted(t_receive)[rounds // 2] * 1e9,
            "dict_get_ns": min(t_get) * 1e9, "samples": chunk * rounds}


def _link_frame(msg: Any) -> tuple[bytes, bytes]:
    body = msg.encode()
    return pack_header(LINK_LOCAL_FLOW.key, len(body), BAND_MEMBERSHIP), body


def measure_maintenance(r: Router, n: int) -> list[dict[str, Any]]:
    """Soft-state upkeep of n idle flows (refresh digests, hold times), in virtual time.

    *steady*: three refresh intervals in which the application refreshes every flow (its
    digest chunks, spread over 80% of the interval as flowlib sends them, go through
    ``Router.receive``), both neighbours send an ECHO a second, and ``Router.tick`` runs
    every 0.25 s (ECHOs, the router's own digest toward its upstream, hold-time checks).
    CPU share = router CPU time (``time.thread_time``: a shared machine's waits do not
    count) / virtual time. Frames per second are counted per link and
    direction. *expiry*: the application goes quiet; ticks go on until the hold time has
    collected every entry (the cost of that sweep, and the longest tick).
    """
    p = r.p
    # a round over n flows lasts the refresh interval, or longer for huge tables (at most
    # max_refresh_rate entries a second), as flowlib and the router both pace it
    interval = C.refresh_period(n, p.refresh_interval, p.max_refresh_rate)
    hold_ms = int(p.hold_factor * interval * 1000)
    per = C.refresh_capacity(65536)
    keys = [flow_key(i) for i in range(n)]
    count = max(1, -(-n // per))
    chunks = [_link_frame(C.Refresh(0, i, count, hold_ms, tuple(
        (k, MASK, 0) for k in keys[i * per:(i + 1) * per]))) for i in range(count)]
    echo = _link_frame(C.Echo(1, 0))
    receive, tick = r.receive, r.tick
    frames = {"ep_in": 0, "up_in": 0, "ep_out": 0, "up_out": 0}
    cpu = 0.0
    max_call = 0.0
    rounds = 3
    span = interval * 0.8
    sent_chunks = 0
    t = 0.0
    gc.disable()
    try:
        while t < rounds * interval - 1e-9:
            t = round(t + TICK, 9)
            feed: list[tuple[int, tuple[bytes, bytes]]] = []
            k, into = divmod(t, interval)
            due = min(count, int(count * into / span) + 1) + int(k) * count
            while sent_chunks < due:
                feed.append((EP, chunks[sent_chunks % count]))
                sent_chunks += 1
            if abs(t - round(t)) < 1e-9:  # an ECHO a second from each neighbour
                feed += [(EP, echo), (UP, echo)]
            for lid, (h, b) in feed:
                frames["ep_in" if lid == EP else "up_in"] += 1
                t0 = cpu_clock()
                out = receive(lid, h, b, t)
                dt = cpu_clock() - t0
                cpu += dt
                max_call = max(max_call, dt)
                for a in out:
                    frames["ep_out" if a.link == EP else "up_out"] += 1
            t0 = cpu_clock()
            out = tick(t)
            dt = cpu_clock() - t0
            cpu += dt
            max_call = max(max_call, dt)
            for a in out:
                if type(a) is Send:
                    frames["ep_out" if a.link == EP else "up_out"] += 1
        assert len(r.flows) == n, "live flows were collected"
        span_s = rounds * interval
        steady = {"phase": "steady (refresh)", "flows": n, "round_s": interval,
                  "cpu_share": cpu / span_s,
                  "cpu_ms_per_s": cpu / span_s * 1e3, "max_call_ms": max_call * 1e3,
                  "us_per_flow_round": cpu / (n * rounds) * 1e6,
                  **{f"{k}_per_s": v / span_s for k, v in frames.items()}}
        # expiry: the application stops refreshing (its ECHOs go on: it is alive)
        cpu = max_call = 0.0
        start = t
        while r.flows and t < start + 3 * p.hold_factor * interval:
            t = round(t + TICK, 9)
            if abs(t - round(t)) < 1e-9:
                receive(EP, *echo, t)
                receive(UP, *echo, t)
            t0 = cpu_clock()
            tick(t)
            dt = cpu_clock() - t0
            cpu += dt
            max_call = max(max_call, dt)
        expiry = {"phase": "expiry (hold)", "flows": n, "left": len(r.flows),
                  "after_s": t - start, "cpu_ms": cpu * 1e3, "max_call_ms": max_call * 1e3,
                  "us_per_flow_expired": cpu / max(n - len(r.flows), 1) * 1e6}
    finally:
        gc.enable()
    return [steady, expiry]


def build_mode(n: int, build: str) -> str:
    if build != "auto":
        return build
    return "join" if n <= 100_000 else "direct"


def run_size(n: int, build: str, samples: int, do_gc: bool) -> dict[str, Any]:
    mode = build_mode(n, build)
    gc.collect()
    r = make_router(n)
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    t0 = time.perf_counter()
    (build_join if mode == "join" else build_direct)(r, n)
    build_s = time.perf_counter() - t0
    gc.collect()
    cur, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(r.flows) == n, (len(r.flows), n)
    row: dict[str, Any] = {
        "flows": n, "build": mode, "build_s_traced": build_s,
        "bytes_per_flow": (cur - base) / n, "table_mib": (cur - base) / 2**20,
    }
    row.update(rss_in_child(n, mode))
    row.update(measure_lookup(r, n, min(samples, max(n * 4, 1000))))
    if do_gc:
        row["maintenance"] = measure_maintenance(r, n)
    del r
    gc.collect()
    return row


def rss_in_child(n: int, mode: str) -> dict[str, Any]:
    """Build the same table in a fresh process without tracemalloc: real RSS growth."""
    cmd = [sys.executable, __file__, "--rss-child", str(n), "--build", mode]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True,
                             env=common.child_env())
        return json.loads(out.stdout)
    except (subprocess.SubprocessError, ValueError) as exc:
        common.say(f"flowtable: RSS measurement for {n} flows failed: {exc}")
        return {}


def rss_child(n: int, mode: str) -> None:
    gc.collect()
    r = make_router(n)
    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    (build_join if mode == "join" else build_direct)(r, n)
    build_s = time.perf_counter() - t0
    gc.collect()
    rss1 = rss_bytes()
    print(json.dumps({"rss_growth_mib": (rss1 - rss0) / 2**20, "rss_mib": rss1 / 2**20,
                      "rss_bytes_per_flow": (rss1 - rss0) / n, "build_s": build_s,
                      "build_us_per_flow": build_s / n * 1e6}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Sizes default to 10^4 10^5 10^6 (GC at the largest).")
    p.add_argument("--quick", action="store_true", help="tiny sizes (10^3, 10^4), a second")
    p.add_argument("--sizes", type=int, nargs="+", help="table sizes (flows)")
    p.add_argument("--gc-at", type=int, nargs="+",
                   help="table sizes whose soft-state upkeep is measured (default: all)")
    p.add_argument("--build", choices=("auto", "join", "direct"), default="auto",
                   help="install flows via JOIN/JOIN_ACK through Router.receive ('join'), or "
                        "construct the same entries directly ('direct', faster); 'auto' "
                        "(default) joins up to 10^5 flows and constructs above")
    p.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--samples", type=int, default=300_000,
                   help="lookups timed per size (default 300000)")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    args = p.parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child, build_mode(args.rss_child, args.build))
        return 0
    sizes = args.sizes or ([1_000, 10_000] if args.quick else [10_000, 100_000, 1_000_000])
    samples = 20_000 if args.quick else args.samples
    gc_at = set(args.gc_at or sizes)
    rows = []
    for n in sizes:
        common.say(f"flowtable: {n} flows ({build_mode(n, args.build)}) ...")
        rows.append(run_size(n, args.build, samples, do_gc=(n in gc_at)))
    result = {"benchmark": "flowtable", "machine": common.machine_info(), "quick": args.quick,
              "build": args.build,
              "sizes": [{k: v for k, v in r.items() if k != "maintenance"} for r in rows],
              "maintenance": [m for r in rows for m in r.get("maintenance", [])]}
    small, large = rows[0], rows[-1]
    result["lookup_growth"] = large["receive_ns"] / small["receive_ns"]
    common.say("\nFlow table (sans-I/O core)")
    common.say(common.table(rows, [
        ("flows", "flows", ">d"), ("build", "build", "<s"),
        ("build_us_per_flow", "build us/flow", ">.1f"),
        ("bytes_per_flow", "traced B/flow", ">.0f"), ("table_mib", "traced MiB", ">.1f"),
        ("rss_bytes_per_flow", "RSS B/flow", ">.0f"), ("rss_growth_mib", "RSS growth MiB", ">.1f"),
        ("receive_ns", "receive ns", ">.0f"), ("dict_get_ns", "dict.get ns", ">.0f")]))
    common.say(f"lookup cost x{result['lookup_growth']:.2f} from {small['flows']} to "
               f"{large['flows']} flows")
    common.say("\nSoft-state upkeep of idle flows (refresh digests, echoes, hold times)")
    common.say(common.table([m for m in result["maintenance"] if "cpu_share" in m], [
        ("flows", "flows", ">d"), ("round_s", "round s", ">.0f"),
        ("cpu_share", "CPU share", ">.2%"),
        ("us_per_flow_round", "us/flow/round", ">.2f"), ("max_call_ms", "max call ms", ">.1f"),
        ("ep_in_per_s", "app->r fr/s", ">.1f"), ("up_out_per_s", "r->up fr/s", ">.1f"),
        ("ep_out_per_s", "r->app fr/s", ">.1f")]))
    common.say(common.table([m for m in result["maintenance"] if "after_s" in m], [
        ("flows", "flows", ">d"), ("after_s", "collected after s", ">.1f"),
        ("cpu_ms", "sweep ms", ">.1f"), ("us_per_flow_expired", "us/flow", ">.2f"),
        ("max_call_ms", "max tick ms", ">.1f"), ("left", "left", ">d")]))
    common.write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
