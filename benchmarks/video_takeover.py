"""How long viewers' pictures stop when a flowvideo primary is killed and its backup takes
over (seed 002 Figure 3.3), and when a viewer moves to another router.

Three router processes (the demo's r1 - r0 - r2, flowrouter.testbed.launcher). Each trial:
a primary ``flowvideo serve`` process on r0 (test pattern, 320x240 and 80x60 at --fps), a
backup streamer on r1 following its state band, viewer A (320x240) on r1 and viewer B
(80x60) on r2; once both see pictures, B moves to r1 (make-before-break) and back, then the
primary process gets SIGKILL. Per trial: the backup's measured primary silence, each
viewer's longest picture gap after the kill, and B's longest gap around its moves.

    python3 benchmarks/video_takeover.py --trials 10 --out benchmarks/results/video-takeover.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# the checkout's packages (flowrouter, flowlib; flowvideo in apps/), for this process and the
# streamer process it starts
REPO = Path(__file__).resolve().parent.parent
SOURCE_DIRS = [str(REPO), str(REPO / "apps"), str(REPO / "directory")]
sys.path[:0] = SOURCE_DIRS
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [*SOURCE_DIRS, *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])}

import flowlib  # noqa: E402
from flowrouter.testbed import topology as T  # noqa: E402
from flowrouter.testbed.launcher import Launcher  # noqa: E402
from flowvideo.demo import TOPOLOGY, _free_base  # noqa: E402
from flowvideo.protocol import Resolution  # noqa: E402
from flowvideo.sources import PatternSource  # noqa: E402
from flowvideo.streamer import Streamer  # noqa: E402
from flowvideo.streamer_core import StreamConfig  # noqa: E402
from flowvideo.viewer import Viewer  # noqa: E402

HIGH, LOW = Resolution(320, 240), Resolution(80, 60)


def _gap(arrivals: list[float], t0: float, t1: float) -> float:
    """The longest time between pictures that spans part of [t0, t1]."""
    times = [t for t in arrivals if t0 <= t <= t1]
    before = [t for t in arrivals if t < t0]
    if before:
        times.insert(0, before[-1])
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


async def trial(addr: dict[str, str], fps: float, dead_after: float) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flowvideo.cli", "serve", "--router", addr["r0"],
        "--source", "pattern:320x240", "--resolutions", f"{HIGH},{LOW}", "--fps", str(fps),
        "--state-period", "0.2", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, env=CHILD_ENV)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    flow = flowlib.FlowID.parse(line.split()[1])
    cfg = StreamConfig(resolutions=(HIGH, LOW), fps=fps, state_period=0.2,
                       dead_after=dead_after)
    backup_c = await flowlib.connect(addr["r1"], name="backup", fragment_size=8000)
    backup = Streamer(backup_c, flow, PatternSource(HIGH), cfg, backup=True)
    btask = asyncio.ensure_future(backup.run())
    loop = asyncio.get_running_loop()
    seen: dict[str, list[float]] = {"A": [], "B": []}
    va = Viewer([addr["r1"]], flow, HIGH, name="A", playout=5.0,
                on_frame=lambda f: seen["A"].append(loop.time()))
    vb = Viewer([addr["r2"]], flow, LOW, name="B", playout=5.0,
                on_frame=lambda f: seen["B"].append(loop.time()))
    try:
        await va.start()
        await vb.start()
        while va.stats.frames < 5 or vb.stats.frames < 5 or backup.watch is None \
                or backup.watch.states < 3:
            await asyncio.sleep(0.05)
        t_move = loop.time()
        await vb.move([addr["r1"]])
        await asyncio.sleep(1.0)
        await vb.move([addr["r2"]])
        await asyncio.sleep(1.0)
        move_gap = _gap(seen["B"], t_move, loop.time())
        before = {v.name: v.stats.frames for v in (va, vb)}
        t_kill = loop.time()
        proc.kill()
        await proc.wait()
        while va.stats.takeovers < 1 or vb.stats.takeovers < 1 \
                or min(v.stats.frames - before[v.name] for v in (va, vb)) < 3:
            await asyncio.sleep(0.05)
        now = loop.time()
        return {"silence": backup.silence or 0.0, "gap_a": _gap(seen["A"], t_kill, now),
                "gap_b": _gap(seen["B"], t_kill, now), "move_gap_b": move_gap}
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        btask.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await btask
        await va.close()
        await vb.close()
        await backup_c.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    topo = T.loads(TOPOLOGY.replace("{base}", str(_free_base())), "video-bench")
    launcher = Launcher(topo, view=False, duration=60)
    await launcher.start_routers()
    rows = []
    try:
        addr = {n: "%s:%d" % hp for n, hp in launcher.listen.items()}
        for i in range(args.trials):
            row = await asyncio.wait_for(trial(addr, args.fps, args.dead_after), 120)
            print(f"trial {i + 1}: " + ", ".join(f"{k} {v:.3f}s" for k, v in row.items()),
                  flush=True)
            rows.append(row)
    finally:
        await launcher.stop_routers()

    def summary(key: str) -> dict[str, float]:
        vals = sorted(r[key] for r in rows)
        return {"median": statistics.median(vals), "max": vals[-1],
                "p90": vals[min(len(vals) - 1, int(0.9 * len(vals)))]}

    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "load": list(os.getloadavg()),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python "
                       f"{platform.python_version()}",
            "command": " ".join(sys.argv), "fps": args.fps, "dead_after": args.dead_after,
            "trials": rows, "summary": {k: summary(k) for k in rows[0]}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--fps", type=float, default=5.0)
    p.add_argument("--dead-after", type=float, default=0.8)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    for key, s in result["summary"].items():
        print(f"{key}: median {s['median']:.3f}s, p90 {s['p90']:.3f}s, max {s['max']:.3f}s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
