"""``flowtrace synth``: options, the size estimate and guard, progress lines.

Before writing, a pilot run of the same network with 1/50 of the flows (into a temporary
directory) gives the bytes per flow; the estimate (pilot snapshots + per-flow bytes x flows)
is printed, and a run estimated above ``--max-bytes`` (default 1 GiB) stops with a message
unless ``--yes`` is given. While writing, a progress line goes to stderr every few seconds.
Imports :mod:`flowtrace.synth` and the standard library.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from typing import Any

from .synth import SynthConfig, generate

MAX_BYTES = 2**30
PILOT_SHARE = 50


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return str(n)  # pragma: no cover


def estimate_bytes(cfg: SynthConfig) -> int:
    """Bytes the run will write, from a pilot with 1/PILOT_SHARE of the flows: what does not
    depend on flows (link records, snapshots: the pilot with one flow) plus the per-flow
    bytes scaled up."""
    if cfg.flows <= PILOT_SHARE:
        return 0  # small enough to just run
    with tempfile.TemporaryDirectory(prefix="flowtrace-synth-pilot-") as d:
        base = generate(dataclasses.replace(cfg, flows=1, out=d + "/a"))["bytes"]
        n = max(2, cfg.flows // PILOT_SHARE)
        pilot = generate(dataclasses.replace(cfg, flows=n, out=d + "/b"))["bytes"]
    return int(base + (pilot - base) * cfg.flows / (n - 1))


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = SynthConfig()
    p.add_argument("--routers", type=int, default=d.routers,
                   help=f"number of routers (default {d.routers})")
    p.add_argument("--flows", type=int, default=d.flows,
                   help=f"number of flows over the run (default {d.flows})")
    p.add_argument("--out", "-o", default=d.out, metavar="DIR",
                   help=f"output directory for synth-NNN.jsonl (default {d.out})")
    p.add_argument("--duration", type=float, default=d.duration, metavar="SECONDS",
                   help=f"simulated time (default {d.duration:g} s)")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default 1)")
    p.add_argument("--sample-rate", type=float, default=d.sample_rate, metavar="RATE",
                   help=f"fwd/drop sampling rate (default {d.sample_rate}; 0: none)")
    p.add_argument("--epoch", type=float, default=d.epoch, metavar="SECONDS",
                   help=f"GC epoch length (default {d.epoch:g} s)")
    p.add_argument("--gc-ping-after", type=int, default=d.gc_ping_after, metavar="T1",
                   help=f"idle epochs before a keep-alive ping (default {d.gc_ping_after})")
    p.add_argument("--gc-delete-after", type=int, default=d.gc_delete_after, metavar="T2",
                   help=f"idle epochs before GC removes the link "
                        f"(default {d.gc_delete_after})")
    p.add_argument("--snapshot-interval", type=float, default=d.snapshot_interval,
                   metavar="SECONDS", help=f"period of snapshot records per router "
                                           f"(default {d.snapshot_interval:g} s)")
    p.add_argument("--cores", type=int, default=d.cores,
                   help="core routers (one LSID each; default routers/100, at least 1)")
    p.add_argument("--hosts", type=int, default=d.hosts,
                   help=f"endpoint links per edge router (default {d.hosts})")
    p.add_argument("--members", type=float, default=d.members,
                   help=f"mean members per flow (default {d.members:g})")
    p.add_argument("--silent", type=float, default=d.silent, metavar="FRACTION",
                   help=f"share of members that vanish without leaving, collected by the GC "
                        f"(default {d.silent})")
    p.add_argument("--receivers", type=float, default=d.receivers, metavar="FRACTION",
                   help=f"share of members that only listen (default {d.receivers})")
    p.add_argument("--rate", type=float, default=d.rate, metavar="MSGS",
                   help=f"mean messages/s per sending member (default {d.rate})")
    p.add_argument("--shards", type=int, default=d.shards,
                   help=f"output files (default {d.shards})")
    p.add_argument("--run", default=None, metavar="NAME",
                   help="tag every record with this run name (to analyse several networks "
                        "together)")
    p.add_argument("--max-bytes", type=float, default=MAX_BYTES, metavar="BYTES",
                   help=f"refuse a run estimated to write more than this (default "
                        f"{_size(MAX_BYTES)}) unless --yes")
    p.add_argument("--yes", "-y", action="store_true",
                   help="write even when the estimate is above --max-bytes")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")


def config_from_args(args: argparse.Namespace) -> SynthConfig:
    fields = SynthConfig.__dataclass_fields__
    return SynthConfig(**{k: v for k, v in vars(args).items() if k in fields})


def run(args: argparse.Namespace) -> int:
    def err(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        cfg = config_from_args(args)
        est = estimate_bytes(cfg)
        if est:
            err(f"flowtrace synth: will write about {_size(est)} under {cfg.out}")
        if est > args.max_bytes and not args.yes:
            err(f"flowtrace synth: the estimate ({_size(est)}) is above --max-bytes "
                f"({_size(args.max_bytes)}); pass --yes to write it anyway")
            return 1
        last = [time.monotonic()]

        def progress(frac: float, records: int, nbytes: int) -> None:
            now = time.monotonic()
            if not args.quiet and now - last[0] >= 5:
                last[0] = now
                err(f"  synth: {100 * frac:5.1f}% of simulated time, {records:,} records, "
                    f"{_size(nbytes)}" + (f" of ~{_size(est)}" if est else ""))

        stats: dict[str, Any] = generate(cfg, progress)
    except ValueError as exc:
        err(f"flowtrace synth: {exc}")
        return 2
    print(f"synth: {cfg.routers} routers ({stats['cores']} core, {stats['edges']} edge), "
          f"{cfg.flows} flows, {cfg.duration:g} s: {stats['records']:,} records "
          f"({stats['bytes'] / 2**20:.1f} MiB) in {stats['files']} files under {cfg.out}; "
          f"{stats['wall_seconds']} s, {stats['records_per_second']:,} records/s")
    print("  " + ", ".join(f"{k} {v:,}" for k, v in stats["records_by_kind"].items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="flowtrace-synth",
                                description="Synthetic router traces (flowtrace.synth).")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
