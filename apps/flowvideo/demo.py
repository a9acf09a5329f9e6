"""``flowvideo demo``: the seed's video example on a small overlay of real router processes.

Topology (``flowrouter.testbed.launcher`` starts one router process per router)::

    viewer A (320x240) -- r1 -- r0 (core; primary streamer) -- r2 -- viewer B (80x60)
                           |
                      backup streamer

A primary streams a test pattern in three resolutions; A and B ask for different ones, so
only two encoders run, and the link r0 -> r2 carries only B's band (the demo prints the
routers' masks and link counters to show it). Halfway through, the primary is killed; the
backup, which follows it on the state band, takes over, and the demo prints the gap each
viewer saw. With ``--web PORT`` a browser viewer on r2 serves the stream as well.

Imports flowlib, flowrouter.testbed and the video modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import flowlib
from flowrouter.testbed import topology as T
from flowrouter.testbed.launcher import Launcher, query_control
from flowrouter.testbed.ports import free_port_block

from . import protocol as P
from .protocol import Resolution
from .sources import PatternSource
from .streamer import Streamer
from .streamer_core import StreamConfig
from .viewer import Viewer

TOPOLOGY = """
name = "video-demo"
description = "flowvideo demo: a core with two leaf routers"
[defaults.link]
delay = "1ms"
bandwidth = "100M"
[defaults.router]
host = "127.0.0.1"
base_port = {base}
epoch = 2.0
[[sites]]
name = "lab"
[[routers]]
name = "r0"
site = "lab"
core_lsids = [0x10]
port_offset = 0
[[routers]]
name = "r1"
site = "lab"
port_offset = 1
[[routers]]
name = "r2"
site = "lab"
port_offset = 2
[[links]]
name = "r1-r0"
a = "r1"
b = "r0"
[[links]]
name = "r2-r0"
a = "r2"
b = "r0"
"""


async def run_demo(duration: float = 12.0, web_port: int | None = None,
                   quiet: bool = False) -> dict[str, Any]:
    def say(text: str) -> None:
        if not quiet:
            print(text, flush=True)

    topo = T.loads(TOPOLOGY.replace("{base}", str(free_port_block(3))), "video-demo")
    launcher = Launcher(topo, view=False, duration=duration)
    result: dict[str, Any] = {}
    await launcher.start_routers()
    try:
        addr = {n: "%s:%d" % hp for n, hp in launcher.listen.items()}
        say("routers up: " + ", ".join(f"{n} {a}" for n, a in sorted(addr.items()))
            + f" (configs and logs in {launcher.workdir})")
        result = await _run(addr, launcher, duration, web_port, say)
    finally:
        await launcher.stop_routers()
    return result


async def _run(addr: dict[str, str], launcher: Launcher, duration: float,
               web_port: int | None, say: Any) -> dict[str, Any]:
    cfg = StreamConfig(resolutions=(Resolution(320, 240), Resolution(160, 120),
                                    Resolution(80, 60)), fps=5.0, quality=70,
                       request_period=1.0, state_period=0.2, dead_after=0.8)
    source = PatternSource(Resolution(320, 240))
    primary_c = await flowlib.connect(addr["r0"], name="primary", fragment_size=8000)
    backup_c = await flowlib.connect(addr["r1"], name="backup", fragment_size=8000)
    flow = await primary_c.create()
    say(f"flow {flow}: advert band {P.BAND_ADVERT}, requests {P.BAND_REQUEST}, feedback "
        f"{P.BAND_FEEDBACK}, state {P.BAND_STATE}, resolutions on bands "
        + ", ".join(f"{r}={P.band_of(i)}" for i, r in enumerate(cfg.resolutions)))
    primary = Streamer(primary_c, flow, source, cfg, on_event=lambda t: say("  primary: " + t))
    backup = Streamer(backup_c, flow, source, cfg, backup=True,
                      on_event=lambda t: say("  " + t))
    tasks = [asyncio.ensure_future(primary.run())]
    await primary.serving.wait()
    tasks.append(asyncio.ensure_future(backup.run()))
    va = Viewer([addr["r1"]], flow, Resolution(320, 240), name="viewer-A")
    vb = Viewer([addr["r2"]], flow, Resolution(80, 60), name="viewer-B")
    web = None
    await va.start()
    await vb.start()
    if web_port is not None:
        from .web import WebViewer

        web = WebViewer([addr["r2"]], str(flow), port=web_port)
        await web.start()
        say(f"browser viewer: http://127.0.0.1:{web.address[1]}/")
    t0 = time.monotonic()
    killed = False
    try:
        while time.monotonic() - t0 < duration:
            await asyncio.sleep(1.0)
            say(f"[{time.monotonic() - t0:5.1f}s] "
                + "  ".join(f"{v.name}: {v.snapshot()['resolution']} {v.stats.frames} frames"
                            for v in (va, vb)))
            if not killed and time.monotonic() - t0 >= duration / 2:
                killed = True
                say("stopping the primary streamer: the backup hears no more state")
                tasks[0].cancel()
                await primary_c.close(timeout=0.1)
        status = (await query_control(launcher.control["r0"]))["status"]
        say(_filtering_report(status, flow))
        for v in (va, vb):
            s = v.stats
            say(f"{v.name}: {s.frames} frames at {v.snapshot()['resolution']}, longest gap "
                f"{s.max_gap:.2f}s (the takeover), buffer underruns {s.underruns} "
                f"(playout {v.core.playout:.1f}s)")  # type: ignore[union-attr]
        if backup.silence is not None:
            say(f"backup took over after {backup.silence:.2f}s of primary silence")
        return {"viewers": [va.snapshot(), vb.snapshot()], "backup": backup.snapshot(),
                "r0": status}
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if web is not None:
            await web.close()
        await va.close()
        await vb.close()
        await backup_c.close()
        with contextlib.suppress(Exception):
            await primary_c.close()


def _filtering_report(status: dict[str, Any], flow: flowlib.FlowID) -> str:
    peers = {str(lk["id"]): lk for lk in status["links"]}
    lines = ["router r0, flow masks per downstream link (what each link carries):"]
    for entry in status["flows"]:
        if entry["flow"] != str(flow):
            continue
        for link, mask in entry["downstream"].items():
            lk = peers.get(link, {})
            lines.append(f"  -> {lk.get('peer', link)}: bands {mask}; frames sent on the "
                         f"link {lk.get('tx', '?')}")
    return "\n".join(lines)
