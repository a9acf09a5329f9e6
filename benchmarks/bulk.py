"""Bulk message rate through routers, next to raw TCP and nats-server, in one run.

What it measures (issue 16): the routers' own forwarding rate, not a client library's. The
publisher writes **pre-built frames in 64 KiB batches** on a blocking socket as fast as the
socket takes them; the subscriber only **counts bytes** (messages = bytes / frame size).
Each system gets the same two processes:

* **raw TCP** — publisher connects straight to the subscriber: the loopback ceiling;
* **flownet** — both endpoints speak the wire protocol directly (HELLO, JOIN, wait for the
  JOIN_ACK, then data frames) to a chain of 1 or 3 ``flowrouter run`` processes; the
  publisher sits on the first router, the subscriber on the last (the core);
* **NATS** — the text protocol (CONNECT, SUB / PUB) to one nats-server, or to a chain of
  three joined by leaf-node connections (a cluster's routes never forward more than one hop,
  leaf nodes do), publisher on the first, subscriber on the last.

The rate is taken at the subscriber over a window that starts ``--warmup`` seconds after its
first byte and lasts ``--duration`` seconds, while the publisher is still sending. CPU per
message: CPU seconds (user + system, /proc) of each router or nats-server process over the
publisher's whole run, divided by the messages the subscriber received in that run, quoted
per million messages. Nothing is lost in a flownet chain (TCP pushes back); a NATS server
may cut a slow subscriber off, which the row's ``note`` says.

``--rounds R`` measures every chain's row R times per size, the chains taking turns, and
the tables give each row's median round: one run of a row on a shared 2-core machine moves
by 10-20%, enough to hide or invent a difference between two rows (``--flows 1 100000``:
the ratio of their medians, and of each round's pair, is printed below the table).

Round trip (``--rtt``): blocking-socket ping-pong of one 64-byte message between two
endpoints, through nothing (raw TCP echo), one router, one nats-server; ``--rtt-passes``
passes (5) in which the three take turns, reported as the median of each one's pass medians.

    python3 benchmarks/bulk.py --sizes 16 256 1024 16384 65536 --hops 1 3 --duration 3 \\
        --out benchmarks/results/bulk.json

``client``-driven throughput (flowlib and nats-py on both ends) stays in throughput.py: that
measures the client libraries as much as the routers.

This module is the orchestration (the NATS chain, one rate row and one round trip at a time,
profiling, tables, the command line); the processes it starts are bulk_workers.py's
(``bulk.py --worker ROLE 'JSON'`` runs one). Imports the standard library, ``common`` and
``bulk_workers``; ``profile_hotpath`` only with ``--profile``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bulk_workers import WORKERS  # noqa: E402
from common import (  # noqa: E402
    HOST,
    LSID,
    Child,
    RouterChain,
    free_port,
    load_average,
    log_directory,
    machine_info,
    proc_cpu_seconds,
    say,
    table,
    write_json,
)


# ---------------------------------------------------------------------------- NATS chain
class NatsChain:
    """1 nats-server, or N joined in a line by leaf-node links (n1 -> n2 -> ... -> nN)."""

    def __init__(self, n: int, log_dir: Path) -> None:
        self.n = n
        self.log_dir = log_dir
        self.procs: list[Child] = []
        self.ports: list[int] = []

    async def __aenter__(self) -> NatsChain:
        exe = shutil.which("nats-server")
        if exe is None:
            raise RuntimeError("nats-server is not installed")
        self.ports = [free_port() for _ in range(self.n)]
        leaf = [free_port() for _ in range(self.n)]
        for i in range(self.n - 1, -1, -1):
            conf = [f"listen: {HOST}:{self.ports[i]}", f'server_name: "n{i + 1}"',
                    "leafnodes {"]
            if i > 0:
                conf.append(f"  listen: {HOST}:{leaf[i]}")
            if i < self.n - 1:
                conf.append(f'  remotes: [{{url: "nats-leaf://{HOST}:{leaf[i + 1]}"}}]')
            conf.append("}")
            path = self.log_dir / f"nats-n{i + 1}.conf"
            path.write_text("\n".join(conf) + "\n")
            self.procs.insert(0, await Child.start(f"nats-n{i + 1}", [exe, "-c", str(path)],
                                                   self.log_dir))
        deadline = time.monotonic() + 20
        for port in self.ports:
            while True:
                try:
                    _r, w = await asyncio.open_connection(HOST, port)
                    w.close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError("nats-server did not come up") from None
                    await asyncio.sleep(0.05)
        await asyncio.sleep(0.5 if self.n > 1 else 0)  # leaf connections
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(p.stop() for p in self.procs), return_exceptions=True)

    @property
    def first(self) -> str:
        return f"{HOST}:{self.ports[0]}"

    @property
    def last(self) -> str:
        return f"{HOST}:{self.ports[-1]}"

    def cpu(self) -> list[float]:
        return [proc_cpu_seconds(p.pid) for p in self.procs]


# ---------------------------------------------------------------------------- orchestration
def _argv(role: str, **params: Any) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", role, json.dumps(params)]


async def _profile(args: argparse.Namespace, label: str, hops: int, size: int,
                   pids: list[int]) -> list[tuple[Any, Path]]:
    """Start ``py-spy record`` on each router over the measured window (``--profile``)."""
    spy = shutil.which("py-spy")
    if not args.profile or spy is None or not pids:
        return []
    out_dir = Path(args.profile)  # made by main() before the run
    await asyncio.sleep(args.warmup)
    spies = []
    for i, pid in enumerate(pids):
        out = out_dir / f"{label}-{hops}h-{size}B-r{i + 1}.collapsed.txt"
        proc = await asyncio.create_subprocess_exec(
            spy, "record", "-p", str(pid), "-d", str(max(1, round(args.duration))), "-r",
            "200", "-f", "raw", "--nonblocking", "-o", str(out),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        spies.append((proc, out))
    return spies


async def _profile_summary(spies: list[tuple[Any, Path]]) -> None:
    """Wait for the py-spy runs; print each router's top functions by self time."""
    from profile_hotpath import summarize_collapsed

    for proc, out in spies:
        await proc.wait()
        if not out.exists():
            continue
        summary = summarize_collapsed(out.read_text(), 6)
        out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
        say(f"    {out.name}: {summary['samples']} busy samples; self: " + "; ".join(
            f"{r['share']:.0%} {r['function']}" for r in summary["self"]))


async def _one_rate(system: str, hops: int, size: int, args: argparse.Namespace,
                    log_dir: Path, pub_addr: str, sub_addr: str, cpu_of: Any,
                    key: str = "", label: str = "", join: bool = True,
                    pids: list[int] | None = None, flows: int = 1) -> dict[str, Any]:
    """One rate row; *label* names it in the tables (default: *system*); *pids*: the
    routers to profile with ``--profile``."""
    label = label or system
    seconds = args.warmup + args.duration + 1.0
    sub = await Child.start(f"sub-{system}", _argv(
        "subscriber", system=system, addr=sub_addr, size=size, key=key,
        warmup=args.warmup, duration=args.duration, idle=1.0, flows=flows), log_dir,
        stdin=True)
    try:
        if system == "raw":
            pub_addr = (await sub.expect("listening", 10))["addr"]
        pub = await Child.start(f"pub-{system}", _argv(
            "publisher", system=system, addr=pub_addr, size=size, key=key, seconds=seconds,
            join=join, flows=flows),
            log_dir, stdin=True)
        try:
            if system != "raw":
                await sub.expect("ready", 20 + flows / 500)
            await pub.expect("ready", 20)
            if system == "nats" and hops > 1:
                await asyncio.sleep(0.5)  # subscription interest crossing the leaf links
            cpu0 = cpu_of()
            pub.tell("go")
            await pub.proc.stdin.drain()  # type: ignore[union-attr]
            spies = await _profile(args, label, hops, size, pids or [])
            sent = await pub.expect("result", seconds + 30)
            await _profile_summary(spies)
            got = await sub.expect("result", 30)
            cpu1 = cpu_of()
        finally:
            await pub.stop()
    finally:
        await sub.stop()
    msgs = max(got["msgs"], 1)
    cpu = [(b - a) / msgs * 1e6 for a, b in zip(cpu0, cpu1)]
    row = {"system": label, "hops": hops, "size": size, "msg_rate": got["msg_rate"],
           "mb_s": got["msg_rate"] * size / 1e6,
           "sent_msgs": sent["sent"] // got["per_msg"], "recv_msgs": got["msgs"],
           "cpu_s_per_M": cpu, "cpu_s_per_M_max": max(cpu) if cpu else None}
    if sent.get("error"):
        row["note"] = f"publisher: {sent['error']}"
    elif system == "nats" and got["msgs"] < sent["sent"] // got["per_msg"] * 0.99:
        row["note"] = "subscriber got less than was published"
    say(f"  {label:8s} hops={hops} {size:>6} B: {got['msg_rate']:>12,.0f} msg/s  "
        f"cpu/M msgs {['%.2f' % c for c in cpu]}")
    return row


#: lets one host hold many connections and flows and join them fast (``--flows``, and
#: fanout_bulk.py's 1,000 receivers): each router's ``--name`` overrides the name
ROUTER_CONFIG = """[router]
name = "bench"
max_flows_per_endpoint = 2000000

[quota]
flows = 2000000
connections_per_host = 5000
joins_per_second = 10000000.0
join_burst = 10000000
"""


def router_config(log_dir: Path) -> list[str]:
    """``flowrouter run`` arguments for ROUTER_CONFIG (written into *log_dir*)."""
    conf = log_dir / "bench-router.toml"
    conf.write_text(ROUTER_CONFIG)
    return ["--config", str(conf)]


def flownet_sides(args: argparse.Namespace) -> list[tuple[str, Path | None, bool, int]]:
    """(label, code or None for this checkout, sender joins, flows) of each flownet row
    kind: ``flownet`` / ``flownet-stranger`` (a sender that is not a member), with
    ``--base`` the same from that checkout, labelled ``base`` / ``base-stranger``, and with
    ``--flows`` one kind per flow count (``... xN``: the sender cycles over N flows)."""
    codes: list[tuple[str, Path | None]] = [("flownet", None)]
    if args.base:
        codes.insert(0, ("base", Path(args.base).resolve()))
    return [(name + ("" if sender == "member" else f"-{sender}")
             + ("" if not args.flows else f" x{flows}"), code, sender == "member", flows)
            for name, code in codes for sender in args.senders
            for flows in (args.flows or [1])]


async def run_rates(args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    """Per chain length, every system's chain is started first, then each payload size is
    measured on each in turn (so load from elsewhere on the machine hits them alike)."""
    rows: list[dict[str, Any]] = []
    for size in args.sizes:
        rows.append(await _one_rate("raw", 0, size, args, log_dir, "", "", lambda: []))
    extra = router_config(log_dir) if args.flows else []
    for hops in args.hops:
        async with contextlib.AsyncExitStack() as stack:
            chains = []
            for label, code, join, flows in flownet_sides(args):
                chain = await stack.enter_async_context(RouterChain(hops, log_dir, extra,
                                                                    code=code))
                chains.append((label, chain, join, flows))
            nats = None if args.no_nats else await stack.enter_async_context(
                NatsChain(hops, log_dir))
            for size in args.sizes:
                for rnd in range(args.rounds):
                    for label, chain, join, flows in chains:
                        key = os.urandom(8).hex() + f"{LSID:08x}" + os.urandom(4).hex()
                        row = await _one_rate("flownet", hops, size, args, log_dir,
                                              chain.listen[0], chain.listen[-1], chain.cpu,
                                              key, label, join,
                                              [p.pid for p in chain.procs], flows)
                        rows.append({**row, "round": rnd + 1})
                    if nats is not None:
                        row = await _one_rate("nats", hops, size, args, log_dir, nats.first,
                                              nats.last, nats.cpu)
                        rows.append({**row, "round": rnd + 1})
    return rows


def median_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per system, hops and size: with ``--rounds`` the median round's rate (and
    CPU), every round's rate beside it (``round_rates``); rows of one round as they are."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["system"], r["hops"], r["size"]), []).append(r)
    out = []
    for runs in groups.values():
        if len(runs) == 1:
            out.append(runs[0])
            continue
        ranked = sorted(runs, key=lambda r: r["msg_rate"])
        mid = ranked[(len(ranked) - 1) // 2]  # the lower median: a real round's row
        out.append({**mid, "round_rates": [round(r["msg_rate"]) for r in runs]})
    return out


def flow_ratios(rows: list[dict[str, Any]]) -> list[str]:
    """With ``--flows``: each ``xN`` row's rate over the ``x1`` row's of the same sender
    kind, hops and size (medians with ``--rounds``), and per round when there were rounds."""
    lines = []
    by = {(r["system"], r["hops"], r["size"]): r for r in rows}
    for (system, hops, size), r in sorted(by.items()):
        head, _, n = system.rpartition(" x")
        one = by.get((f"{head} x1", hops, size))
        if not head or n == "1" or one is None:
            continue
        line = (f"{system} / x1, {hops}h {size} B: {r['msg_rate'] / one['msg_rate']:.0%}")
        if "round_rates" in r and "round_rates" in one:
            line += " (rounds: " + ", ".join(
                f"{a / b:.0%}" for a, b in zip(r["round_rates"], one["round_rates"])) + ")"
        lines.append(line)
    return lines


async def _one_rtt(system: str, args: argparse.Namespace, log_dir: Path, addr: str,
                   key: str = "") -> dict[str, Any]:
    echo = await Child.start(f"echo-{system}", _argv("echo", system=system, addr=addr,
                                                     size=args.rtt_size, key=key), log_dir)
    try:
        if system == "raw":
            addr = (await echo.expect("listening", 10))["addr"]
        else:
            await echo.expect("ready", 20)
        if system == "nats":
            await asyncio.sleep(0.2)
        ping = await Child.start(f"ping-{system}", _argv(
            "pinger", system=system, addr=addr, size=args.rtt_size, key=key,
            warm=500, rounds=args.rtt_rounds), log_dir)
        try:
            res = await ping.expect("result", 120)
        finally:
            await ping.stop()
    finally:
        await echo.stop()
    say(f"  rtt {system:8s}: median {res['median_us']:.1f} us, p99 {res['p99_us']:.1f} us")
    return {"system": system, **res}


async def run_rtt(args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    """``--rtt-passes`` passes, the systems taking turns in each (round trips on a shared
    machine drift by tens of microseconds from one minute to the next); per system the
    median of its passes' medians, and every pass's."""
    key = os.urandom(8).hex() + f"{LSID:08x}" + os.urandom(4).hex()
    passes: dict[str, list[dict[str, Any]]] = {"raw": [], "flownet": [], "nats": []}
    async with contextlib.AsyncExitStack() as stack:
        chain = await stack.enter_async_context(RouterChain(1, log_dir))
        nats = None if args.no_nats else await stack.enter_async_context(NatsChain(1, log_dir))
        for _ in range(args.rtt_passes):
            passes["raw"].append(await _one_rtt("raw", args, log_dir, ""))
            passes["flownet"].append(await _one_rtt("flownet", args, log_dir,
                                                    chain.listen[0], key))
            if nats is not None:
                passes["nats"].append(await _one_rtt("nats", args, log_dir, nats.first))
    rows = []
    for system, runs in passes.items():
        if runs:
            med = sorted(r["median_us"] for r in runs)
            p99 = sorted(r["p99_us"] for r in runs)
            rows.append({"system": system, "median_us": med[len(med) // 2],
                         "p99_us": p99[len(p99) // 2], "rounds": sum(r["rounds"] for r in runs),
                         "pass_medians_us": [round(r["median_us"], 1) for r in runs]})
    return rows


def print_tables(result: dict[str, Any]) -> None:
    rows = median_rows(result["rates"])
    by = {(r["system"], r["hops"], r["size"]): r for r in rows}
    kinds = sorted({(r["hops"], r["system"]) for r in rows if r["hops"]},
                   key=lambda hk: (hk[0], hk[1] == "nats", hk[1]))
    out = []
    for size in sorted({r["size"] for r in rows}):
        line: dict[str, Any] = {"size": size}
        raw = by.get(("raw", 0, size))
        line["raw"] = raw["msg_rate"] if raw else None
        for hops, system in kinds:
            r = by.get((system, hops, size))
            line[f"{system}{hops}"] = r["msg_rate"] if r else None
            line[f"{system}{hops}cpu"] = r["cpu_s_per_M_max"] if r else None
        out.append(line)
    cols = [("size", "payload", ">8"), ("raw", "raw TCP", ">12,.0f")]
    for hops, system in kinds:
        cols.append((f"{system}{hops}", f"{system} {hops}h", ">12,.0f"))
    for hops, system in kinds:
        cols.append((f"{system}{hops}cpu", f"cpu/M {system} {hops}h", ">10.2f"))
    say(table(out, cols))
    for r in rows:
        if "round_rates" in r:
            say(f"{r['system']} {r['hops']}h {r['size']} B, each round: "
                + ", ".join(f"{x:,}" for x in r["round_rates"])
                + f" (median {r['msg_rate']:,.0f})")
    for line in flow_ratios(rows):
        say(line)
    say(f"load average at the start {result['machine'].get('loadavg')}, at the end "
        f"{result.get('loadavg_end')}")
    for r in result.get("rtt", []):
        say(f"rtt {r['system']}: median {r['median_us']:.1f} us p99 {r['p99_us']:.1f} us "
            f"(pass medians {r.get('pass_medians_us')})")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    async with log_directory(args.keep_logs) as log_dir:
        say(f"logs in {log_dir}")
        result: dict[str, Any] = {"machine": machine_info(), "command": " ".join(sys.argv),
                                  "rates": [], "rtt": []}
        if not args.rtt_only:
            result["rates"] = await run_rates(args, log_dir)
        if args.rtt or args.rtt_only:
            result["rtt"] = await run_rtt(args, log_dir)
        result["loadavg_end"] = load_average()
        return result


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1024, 16384, 65536])
    ap.add_argument("--hops", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--no-nats", action="store_true")
    ap.add_argument("--rounds", type=_at_least_one, default=1,
                    help="measure each chain's rows this many times per size, the chains "
                         "taking turns; the tables give each row's median round (one "
                         "run of a row on a shared machine moves by 10-20%%)")
    ap.add_argument("--senders", nargs="+", choices=["member", "stranger"],
                    default=["member"],
                    help="flownet publishers: members (joined on the membership band) "
                         "and/or strangers (HELLO only, not members: their frames travel "
                         "toward the location service until they meet the tree)")
    ap.add_argument("--flows", type=int, nargs="+",
                    help="flownet rows with the subscriber joined to N flows and the "
                         "publisher cycling over them, one row kind per N (the routers get "
                         "a config that lets one application hold that many)")
    ap.add_argument("--base", metavar="CHECKOUT",
                    help="also run the flownet rows with routers from this checkout "
                         "(labelled base), taking turns with this one's in the same run")
    ap.add_argument("--no-native", action="store_true",
                    help="routers forward in Python only (FLOWNET_NATIVE=0)")
    ap.add_argument("--no-uvloop", action="store_true",
                    help="routers run on asyncio's own event loop (FLOWNET_UVLOOP=0), not "
                         "uvloop, their default")
    ap.add_argument("--rtt", action="store_true", help="also measure ping-pong round trips")
    ap.add_argument("--rtt-only", action="store_true")
    ap.add_argument("--rtt-size", type=int, default=64)
    ap.add_argument("--rtt-rounds", type=int, default=5000)
    ap.add_argument("--rtt-passes", type=int, default=5,
                    help="round-trip passes, the systems taking turns (median of medians)")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--profile", metavar="DIR",
                    help="sample each router with py-spy over each flownet row's window; "
                         "collapsed stacks and a summary per router go to DIR")
    ap.add_argument("--out", help="write the JSON result here")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        WORKERS[argv[1]](json.loads(argv[2]))
        return 0
    args = build_parser().parse_args(argv)
    if args.no_native:
        os.environ["FLOWNET_NATIVE"] = "0"
    if args.no_uvloop:
        os.environ["FLOWNET_UVLOOP"] = "0"
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(main_async(args))
    print_tables(result)
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
