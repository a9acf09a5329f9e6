"""A viewer on a datagram link (flowlib over UDP, ``udp://``) behind a constrained path: about
210 kbit/s of pictures toward a 100 kbit/s path with a small buffer. Over a datagram link
the path loses what does not fit instead of queueing it: the viewer loses pictures (counted:
missing frame numbers, and flowlib's gaps in the datagram numbers) but never falls behind,
and its losses bring the band's rate down.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from flowvideo import protocol as P
from flowvideo.protocol import Resolution
from flowvideo.sources import PatternSource
from flowvideo.streamer_core import StreamConfig
from flowvideo.viewer import Viewer

from .dgramnet import one_router
from .rawep import run, until
from .test_dgram_onpath import ThinPath
from .test_video import streaming


def test_a_viewer_on_a_datagram_link_loses_pictures_instead_of_falling_behind(
        tmp_path: Path) -> None:
    small = Resolution(160, 120)
    cfg = StreamConfig(resolutions=(small,), fps=10.0, quality=75, request_period=0.5,
                       advert_period=0.3)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        node = one_router()
        await node.start()
        try:
            assert node.appdgram is not None
            path = await ThinPath.start(node.appdgram.address, 12_500, 4)  # 100 kbit/s
            got: list[tuple[float, P.Frame]] = []
            async with streaming(node, cfg, PatternSource(small, detail=False)) as (s, flow), \
                    Viewer([path.address], flow, small, name="over-udp",
                           connect_kwargs={"state_dir": str(tmp_path)},
                           on_frame=lambda f: got.append((loop.time(), f))) as viewer:
                await until(lambda: len(got) >= 1, 20, "a first picture over the datagram link")
                start = loop.time()
                await asyncio.sleep(10.0)
                end = loop.time()
                core = s.core
                assert core is not None
                window = [(at, f) for at, f in got if start <= at <= end]
                delay = [at - core.clock_of(f.media_ms) for at, f in window]
                client = viewer.client
                assert client is not None
                print(f"\nover udp behind 100 kbit/s: {len(window)} pictures in "
                      f"{end - start:.1f} s, delay max {max(delay):.2f} s; lost "
                      f"{viewer.stats.lost} pictures, {client.counters['dgram.lost']} "
                      f"datagrams; band at {core.encoding(40).fps} fps")  # type: ignore
                # never behind: the path drops instead of queueing (the bound, 2 s;
                # on TCP the same path held 6 s within 12 s and growing)
                assert max(delay) < 2.0, delay
                assert max(delay[len(delay) // 2:]) < 2.0  # not growing with time
                times = [start] + [at for at, _ in window] + [end]
                assert max(b - a for a, b in zip(times, times[1:])) < 2.0
                # the loss is counted, both as pictures and as datagrams
                assert viewer.stats.lost > 0 and client.counters["dgram.lost"] > 0
                assert path.lost > 0
                enc = core.encoding(40)
                assert enc is not None and enc.cuts >= 1  # and the losses cut the rate
            path.close()
        finally:
            await node.stop()
    run(main(), 90)
