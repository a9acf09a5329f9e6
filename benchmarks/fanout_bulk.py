#!/usr/bin/env python3
"""Fan-out against nats-server: one sender, N byte-counting receivers, deliveries/s.

The load generator is bulk.py's (pre-built frames written in 64 KiB batches on a blocking
socket); the receivers are **one process per system holding every receiver connection**,
counting bytes in an ``epoll`` loop with 1 MiB ``recv_into`` (each wake-up takes whatever
every ready socket holds: no Python thread or per-message work per receiver). Deliveries =
bytes received / bytes per message, summed over the receivers, over a window that starts
``--warmup`` seconds after the first byte and lasts ``--duration`` seconds (and, beside it,
every delivery over the time from the first byte to the last: a server that buffers and
delivers late shows there).

* **flownet**: ``flowrouter run`` chains of 1 or 3 routers; every receiver joins the flow
  on the data band, the sender joins on the membership band only, on r1; receivers are
  spread round-robin over the routers of the chain. The routers get bulk.py's config, whose
  ``[quota]`` lets 1,000 application connections from one host join (the defaults stop at
  256).
* **NATS**: nats-server 2.9 (1, or 3 joined by leaf-node links), the same sender and
  receiver processes speaking its text protocol (SUB / PUB).

    python3 benchmarks/fanout_bulk.py --receivers 10 100 1000 --sizes 16 1024 --hops 1
    python3 benchmarks/fanout_bulk.py --receivers 100 --sizes 16 1024 --hops 3

Each configuration's flownet chain and NATS chain are started first, then each payload size
is measured on each in turn; the load average at start and end is printed with the table.

Beside the rates, each row says what does not depend on the machine's load: the servers' CPU
time per delivery (user + system from /proc, summed over the chain's routers or
nats-server processes, from the sender's start until the receivers are done: ``cpu
us/delivery``) and the counting receivers' own (the harness must cost less than the systems
it measures); frames sent and deliveries made (``delivered`` is the share of sent x
receivers that arrived), and for flownet what the routers dropped (their ``drop.*``
counters, by kind). ``--rx-procs K`` spreads the receivers over K counting processes;
``--base DIR`` adds rows for routers run from another checkout (a before/after in one run);
``--quick`` is a seconds-long smoke run (10 receivers, 16 B, one router).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bulk  # noqa: E402
import bulk_workers  # noqa: E402
from common import (  # noqa: E402
    HOST,
    LSID,
    Child,
    RouterChain,
    code_info,
    counter_delta,
    load_average,
    log_directory,
    machine_info,
    say,
    table,
    write_json,
)

BULK = str(Path(bulk.__file__).resolve())


def worker_counter(p: dict[str, Any]) -> None:
    """Attach ``n`` receivers (round-robin over ``addrs``), then count bytes over all of
    them in one epoll loop."""
    size, system, n = p["size"], p["system"], p["n"]
    socks: list[socket.socket] = []
    for i in range(n):
        addr = p["addrs"][i % len(p["addrs"])]
        if system == "nats":
            sock = bulk_workers.nats_attach(addr)
            sock.sendall(b"SUB bulk 1\r\nPING\r\n")
            reply = b""
            while b"PONG" not in reply:
                reply += sock.recv(4096)
        else:
            sock = bulk_workers.flownet_attach(addr, f"fan-{p.get('first', 0) + i}",
                                               bytes.fromhex(p["key"]),
                                               1 | 1 << bulk_workers.DATA_BAND)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.setblocking(False)
        socks.append(sock)
    per_msg = (len(b"MSG bulk 1 %d\r\n" % size) + size + 2 if system == "nats"
               else bulk_workers.HEADER_SIZE + size)
    ep = select.epoll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        ep.register(fd, select.EPOLLIN)
    print(json.dumps({"event": "ready"}), flush=True)
    buf = bytearray(1 << 20)
    total = win_bytes = 0
    first = w_start = w_end = last_byte = None
    idle, last = p["idle"], time.monotonic()
    # nats-server PINGs each client every 2 minutes and drops it after 2 unanswered: every
    # receiver sends a PONG every 10 s (an unsolicited PONG only resets that count), so
    # its reads are never scanned (a scan of every MiB cost NATS's receivers more CPU
    # per delivery than nats-server itself)
    pong_every, pong_at = 10.0, time.monotonic()
    cpu0 = time.process_time()
    while True:
        events = ep.poll(0.2)
        now = time.monotonic()
        if system == "nats" and now - pong_at > pong_every:
            pong_at = now
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(b"PONG\r\n")
        if not events:
            if first is not None and now - last > idle or first is None and now - last > 60:
                break
            continue
        last = now
        got = 0
        if first is not None:
            last_byte = now
        for fd, _ev in events:
            sock = by_fd[fd]
            try:
                k = sock.recv_into(buf)
            except BlockingIOError:
                continue
            if not k:
                ep.unregister(fd)
                continue
            got += k
        total += got
        if first is None and got:
            first = now
            w_start, w_end = first + p["warmup"], first + p["warmup"] + p["duration"]
        if w_start is not None and w_start <= now < w_end:  # type: ignore[operator]
            win_bytes += got
    print(json.dumps({"event": "result", "bytes": total, "per_msg": per_msg,
                      "cpu_s": time.process_time() - cpu0,
                      "deliveries": total // per_msg,
                      "span_rate": total / per_msg / (last_byte - first)
                      if first and last_byte and last_byte > first else 0.0,
                      "rate": win_bytes / per_msg / p["duration"] if first else 0.0}),
          flush=True)


def _argv(role: str, **params: Any) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", role,
            json.dumps(params)]


def _split(n: int, procs: int) -> list[int]:
    """*n* receivers over at most *procs* counting processes (the first take the rest)."""
    procs = max(1, min(procs, n))
    return [n // procs + (1 if i < n % procs else 0) for i in range(procs)]


async def one(system: str, label: str, pub_addr: str, addrs: list[str], n: int, size: int,
              args: argparse.Namespace, log_dir: Path, cpu_of: Any, key: str = "",
              counters: Any = None) -> dict[str, Any]:
    """One row: start the counting receivers, then the sender; *cpu_of* gives the servers'
    CPU seconds so far, *counters* (flownet) their counters."""
    seconds = args.warmup + args.duration + 1.0
    kind = "nats" if system == "nats" else "flownet"  # what the workers speak
    rxs: list[Child] = []
    try:
        first = 0
        for i, k in enumerate(_split(n, args.rx_procs)):
            # each process attaches its receivers round-robin from where the last stopped
            mine = [addrs[(first + j) % len(addrs)] for j in range(min(k, len(addrs)))]
            rxs.append(await Child.start(f"fan-rx-{label}-{i}", _argv(
                "counter", system=kind, addrs=mine, n=k, size=size, key=key, first=first,
                warmup=args.warmup, duration=args.duration, idle=3.0), log_dir))
            first += k
        for rx in rxs:
            await rx.expect("ready", 120 + n * 0.2)
        pub = await Child.start(f"fan-tx-{label}", [
            sys.executable, BULK, "--worker", "publisher",
            json.dumps({"system": kind, "addr": pub_addr, "size": size, "key": key,
                        "seconds": seconds, "join": True})], log_dir, stdin=True)
        try:
            await pub.expect("ready", 30)
            if system == "nats":
                await asyncio.sleep(0.5)  # interest crossing the leaf links
            before = await counters() if counters else None
            cpu0 = sum(cpu_of())
            pub.tell("go")
            sent = await pub.expect("result", seconds + 40)
            gots = [await rx.expect("result", seconds + 60) for rx in rxs]
            cpu1 = sum(cpu_of())
            after = await counters() if counters else None
        finally:
            await pub.stop()
    finally:
        await asyncio.gather(*(rx.stop() for rx in rxs), return_exceptions=True)
    per_msg = gots[0]["per_msg"]
    deliveries = sum(g["deliveries"] for g in gots)
    pub_msg = len(b"PUB bulk %d\r\n" % size) + size + 2 if system == "nats" else per_msg
    sent_msgs = sent["sent"] // pub_msg
    rate = sum(g["rate"] for g in gots)
    span = sum(g["span_rate"] for g in gots)
    row: dict[str, Any] = {
        "system": label, "receivers": n, "size": size, "deliveries_per_s": rate,
        "span_rate": span, "sent_msgs": sent_msgs, "deliveries": deliveries,
        "delivered_share": deliveries / (sent_msgs * n) if sent_msgs else 0.0,
        "cpu_us_per_delivery": (cpu1 - cpu0) / deliveries * 1e6 if deliveries else None,
        "rx_cpu_us_per_delivery": sum(g["cpu_s"] for g in gots) / deliveries * 1e6
        if deliveries else None,
        "rx_procs": len(rxs)}
    if before is not None and after is not None:
        row["drops"] = counter_delta(before, after)
    if sent.get("error"):
        row["note"] = f"sender: {sent['error']}"
    drops = row.get("drops") or {}
    say(f"  {label:8s} x{n:<5} {size:>6} B: {rate:>14,.0f} deliveries/s "
        f"({span:,.0f}/s first to last byte); sent {sent_msgs:,}, delivered {deliveries:,} "
        f"({row['delivered_share']:.1%}); cpu {row['cpu_us_per_delivery'] or 0:.3f} "
        f"us/delivery (receivers {row['rx_cpu_us_per_delivery'] or 0:.3f})"
        + (f"; dropped {drops}" if drops else ""))
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"machine": machine_info(), "code": code_info(),
                              "command": " ".join(sys.argv), "quick": args.quick,
                              "rows": rows}
    sides: list[tuple[str, Path | None]] = [("flownet", None)]  # (label, code: None = this)
    if args.base:
        sides.insert(0, ("base", args.base))
    async with log_directory(args.keep_logs) as log_dir:
        extra = bulk.router_config(log_dir)
        for hops in args.hops:
            for n in args.receivers:
                async with contextlib.AsyncExitStack() as stack:
                    chains = [(name, await stack.enter_async_context(
                        RouterChain(hops, log_dir, extra, code=code))) for name, code in sides]
                    nats = None if args.no_nats else await stack.enter_async_context(
                        bulk.NatsChain(hops, log_dir))
                    for size in args.sizes:
                        for name, chain in chains:
                            key = os.urandom(8).hex() + f"{LSID:08x}" + os.urandom(4).hex()
                            row = await one(name, f"{name} {hops}h", chain.listen[0],
                                            chain.listen, n, size, args, log_dir, chain.cpu,
                                            key, chain.counters)
                            rows.append({**row, "hops": hops})
                        if nats is not None:
                            addrs = [f"{HOST}:{p}" for p in nats.ports]
                            try:
                                row = await one("nats", f"nats {hops}h", nats.first, addrs,
                                                n, size, args, log_dir, nats.cpu)
                            except (TimeoutError, RuntimeError) as exc:
                                say(f"  nats x{n} {size} B failed: {str(exc)[:200]}")
                                row = {"system": f"nats {hops}h", "receivers": n,
                                       "size": size, "deliveries_per_s": 0.0,
                                       "span_rate": 0.0, "error": str(exc)[:500]}
                            rows.append({**row, "hops": hops})
    result["loadavg_end"] = load_average()
    return result


def print_table(result: dict[str, Any]) -> None:
    by = {(r["hops"], r["receivers"], r["size"], r["system"].split()[0]): r
          for r in result["rows"]}
    lines = []
    for hops, n, size in sorted({k[:3] for k in by}):
        line: dict[str, Any] = {"routers": hops, "receivers": n, "size": size}
        for kind in ("base", "flownet", "nats"):
            r = by.get((hops, n, size, kind))
            line[kind] = r["deliveries_per_s"] if r else None
            line[f"{kind}_span"] = r["span_rate"] if r else None
            line[f"{kind}_cpu"] = r.get("cpu_us_per_delivery") if r else None
            line[f"{kind}_got"] = r.get("delivered_share") if r else None
        fr, nr = line["flownet"], line["nats"]
        line["x"] = fr / nr if fr and nr else None
        lines.append(line)
    kinds = ("base", "flownet", "nats") if any(ln["base"] for ln in lines) else ("flownet",
                                                                                  "nats")
    cols = [("routers", "routers", ">d"), ("receivers", "receivers", ">d"),
            ("size", "payload", ">d")]
    for kind in kinds:
        cols += [(kind, f"{kind} deliveries/s", ">,.0f"),
                 (f"{kind}_span", f"{kind} first-last", ">,.0f"),
                 (f"{kind}_cpu", f"{kind} cpu us/dlv", ">.3f"),
                 (f"{kind}_got", f"{kind} delivered", ">.1%")]
    cols.append(("x", "flownet/NATS", ">.2f"))
    say(table(lines, cols))
    say("deliveries/s: over the window; first-last: every delivery over the time from the "
        "first byte to the last; cpu us/dlv: the servers' CPU per delivery (/proc); "
        "delivered: deliveries / (frames sent x receivers)")
    say(f"load average at the start {result['machine'].get('loadavg')}, at the end "
        f"{result.get('loadavg_end')}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        {"counter": worker_counter}[argv[1]](json.loads(argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--receivers", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 1024])
    ap.add_argument("--hops", type=int, nargs="+", default=[1])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--no-nats", action="store_true")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--rx-procs", type=int, default=1,
                    help="counting receiver processes the receivers are spread over")
    ap.add_argument("--base", help="also measure routers run from this checkout (rows "
                    "labelled 'base')")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 10 receivers, 16 B, 1 router, half a second")
    ap.add_argument("--out", help="write the JSON result here")
    args = ap.parse_args(argv)
    if args.base:
        args.base = Path(args.base).resolve()
    if args.quick:
        args.receivers, args.sizes, args.hops = [10], [16], [1]
        args.duration, args.warmup = 0.5, 0.2
    print_table(result := asyncio.run(run(args)))
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
