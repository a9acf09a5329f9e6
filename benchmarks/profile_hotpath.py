#!/usr/bin/env python3
"""Profile the forwarding hot path with py-spy: where routers and flowlib spend their CPU.

Starts the 3-router chain of ``throughput.py`` (r1 - r2 - r3, each its own process), a
flowlib receiver on r3 and a flowlib sender on r1, and while the sender sends, samples the
chosen processes with ``py-spy record`` (py-spy leaves out samples where a thread is idle, e.g.
an event loop waiting in ``epoll``; system calls such as the socket ``send()`` count, unless
``--gil`` asks for Python-only samples). For each process it prints the functions with the most
**self** time (the frame on top of the stack) and the most **inclusive** time (anywhere on
the stack), as percentages of that process's busy samples (samples blocked in ``epoll`` are
counted apart as waiting), and saves the raw collapsed
stacks (``--keep DIR``) for flame graphs.

Needs py-spy (``pip install py-spy``) and permission to trace processes (root, or
``ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import RouterChain, say  # noqa: E402

TARGETS = ("r1", "r2", "r3", "sender", "receiver")
#: a leaf frame that means "waiting for I/O" (py-spy does not always see it as idle)
WAIT_LEAF = re.compile(r"^(EpollSelector|PollSelector|SelectSelector)\.select \(selectors\.py")


def summarize_collapsed(text: str, top: int) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output."""
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    self_line: Counter[str] = Counter()
    total = 0
    waiting = 0
    for line in text.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        n = int(count_s)
        frames = stack.split(";")
        if WAIT_LEAF.search(frames[-1]):
            waiting += n  # the event loop blocked in epoll: waiting for I/O, not work
            continue
        total += n
        funcs = [re.sub(r":\d+\)$", ")", f) for f in frames]
        self_c[funcs[-1]] += n
        self_line[frames[-1]] += n
        for f in set(funcs):
            incl_c[f] += n
    def rows(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "samples": k, "share": k / total if total else 0.0}
                for f, k in c.most_common(top)]
    return {"samples": total, "waiting_samples": waiting, "self": rows(self_c),
            "inclusive": rows(incl_c), "self_lines": rows(self_line)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    result: dict[str, Any] = {"benchmark": "profile", "machine": common.machine_info(),
                              "params": {"payload": args.payload, "duration": args.duration,
                                         "rate": args.rate, "targets": args.targets,
                                         "gil_only": args.gil},
                              "processes": {}}
    async with common.log_directory(args.keep_logs) as logs:
        keep = Path(args.keep) if args.keep else logs
        keep.mkdir(parents=True, exist_ok=True)
        async with RouterChain(3, logs) as chain:
            flow = common.new_flow_text(900)
            lim = {"idle": 1.0, "first_timeout": 20.0, "max_time": args.duration + 90}
            async with common.children() as kids:
                rx = await common.start_worker(
                    "flow-recv", "prof-recv", logs, flow=flow,
                    clients=[{"router": chain.listen[2], "bands": "32"}], queue=1 << 16, **lim)
                kids.append(rx)
                await rx.expect("ready", 30)
                tx = await common.start_worker(
                    "flow-send", "prof-send", logs, stdin=True, router=chain.listen[0],
                    flow=flow, payload=args.payload, bands=[32], duration=args.duration + 1.0,
                    max_count=50_000_000, **lim)
                kids.append(tx)
                await tx.expect("ready", 30)
                pids = {"r1": chain.procs[0].pid, "r2": chain.procs[1].pid,
                        "r3": chain.procs[2].pid, "sender": tx.pid, "receiver": rx.pid}
                tx.tell("go")
                await asyncio.sleep(0.5)  # past the start-up transient
                spies = {}
                for name in args.targets:
                    out = keep / f"{name}.collapsed.txt"
                    seconds = str(max(1, round(args.duration)))  # py-spy takes whole seconds
                    argv = [spy, "record", "-p", str(pids[name]), "-d", seconds,
                            "-r", str(args.rate), "-f", "raw", "-o", str(out)]
                    if args.nonblocking:
                        argv.append("--nonblocking")
                    if args.gil:
                        argv.append("--gil")
                    spies[name] = (await asyncio.create_subprocess_exec(
                        *argv, stdout=asyncio.subprocess.DEVNULL,
                        stderr=asyncio.subprocess.PIPE), out)
                for name, (proc, out) in spies.items():
                    try:
                        _, err = await asyncio.wait_for(proc.communicate(), args.duration + 30)
                    except TimeoutError:
                        proc.kill()
                        await proc.wait()
                        err = b"py-spy timed out"
                    if not out.exists():
                        result["processes"][name] = {"error": err.decode(errors="replace")[-500:]}
                        continue
                    summary = summarize_collapsed(out.read_text(), args.top)
                    summary["raw_file"] = str(out) if args.keep else None
                    result["processes"][name] = summary
                sent = await tx.expect("result", args.duration + 60)
                got = await rx.expect("result", args.duration + 60)
                tx.tell("exit")
                result["traffic"] = {"sent": sent["sent"], "delivered": got["count"],
                                     "seconds": got["last"] - got["first"]}
    return result


def print_report(result: dict[str, Any], top: int) -> None:
    t = result.get("traffic", {})
    say(f"\nProfile: {result['params']['payload']} B messages r1 -> r2 -> r3, "
        f"{t.get('delivered', 0)} delivered in {t.get('seconds', 0):.1f} s")
    for name, s in result["processes"].items():
        if "error" in s:
            say(f"\n[{name}] py-spy failed: {s['error']}")
            continue
        say(f"\n[{name}] {s['samples']} busy samples ({s['waiting_samples']} more waiting in "
            "epoll, left out)")
        say("  self time (top of stack):")
        for r in s["self"][:top]:
            say(f"    {r['share']:6.1%}  {r['function']}")
        say("  inclusive time:")
        for r in s["inclusive"][:top]:
            say(f"    {r['share']:6.1%}  {r['function']}")
        say("  self time by line:")
        for r in s["self_lines"][:top]:
            say(f"    {r['share']:6.1%}  {r['function']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 s of sampling, r2 only")
    p.add_argument("--payload", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--duration", type=float, help="seconds of sampling (default 8, quick 2)")
    p.add_argument("--rate", type=int, default=250, help="samples per second (default 250)")
    p.add_argument("--targets", nargs="+", choices=TARGETS, help="processes to sample "
                   "(default: all five)")
    p.add_argument("--nonblocking", action="store_true",
                   help="do not pause the processes while sampling (less overhead, less exact)")
    p.add_argument("--gil", action="store_true",
                   help="count only samples holding the GIL (Python code running); by default "
                        "time in system calls such as the socket send() is counted too")
    p.add_argument("--top", type=int, default=15, help="functions listed per table")
    p.add_argument("--keep", metavar="DIR", help="keep the collapsed stacks here")
    common.add_output_options(p)
    args = p.parse_args(argv)
    return common.run_benchmark(args, main_async, lambda result: print_report(result, args.top),
                                duration=(2.0, 8.0), targets=(["r2"], list(TARGETS)))


if __name__ == "__main__":
    sys.exit(main())
