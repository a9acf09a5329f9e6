"""A standard player watches a flow: the web viewer serves a resolution as fragmented MP4
(``/stream.mp4``) and headless Chromium's ``<video>`` element plays it (Media Source
Extensions): its currentTime advances while pictures arrive, the picture fits the window,
and the page shows the frame rate, the delay and the stalls. The stream itself is checked
as MP4 too (PyAV opens it as a player would).

Skipped when Chromium, chromedriver or PyAV is missing (.ci/install installs them).
"""

from __future__ import annotations

import asyncio
import io
import os
import time
import urllib.request
from pathlib import Path

import pytest

from flowvideo import protocol as P
from flowvideo.protocol import Resolution
from flowvideo.sources import PatternSource
from flowvideo.web import WebViewer

from .rawep import addr, run, until
from .test_video import config, star, streaming
from .test_video_browser import CHROMEDRIVER, CHROMIUM, WebDriver

av = pytest.importorskip("av", reason="PyAV is in the test extra (.ci/install)")
pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and CHROMEDRIVER),
                                reason="needs chromium and chromedriver (.ci/install)")


def _read(url: str, limit: int, timeout: float = 30) -> bytes:
    """The first *limit* bytes of an endless HTTP stream."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        assert resp.headers["Content-Type"] == "video/mp4"
        assert resp.headers["X-Flowvideo-Codec"].startswith("avc1.")
        data = b""
        while len(data) < limit:
            chunk = resp.read1(65536)
            if not chunk:
                break
            data += chunk
        return data


@pytest.mark.parametrize("codec", [P.CODEC_JPEG, P.CODEC_H264])
def test_chromium_plays_the_flow_in_a_video_element(codec: int, tmp_path: Path) -> None:
    async def main() -> None:
        small = Resolution(160, 120)
        cfg = config(resolutions=(Resolution(320, 240), small), fps=10.0, codec=codec)
        async with star() as (r0, _r1, r2), \
                streaming(r0, cfg, PatternSource(Resolution(320, 240)), fragment_size=4000
                          ) as (_streamer, flow):
            web = WebViewer([addr(r2)], str(flow), port=0)
            driver: WebDriver | None = None
            try:
                await web.start()
                await until(lambda: len(web.offers()) == 2, 30, "the advertisement")
                port = web.address[1]
                base = f"http://127.0.0.1:{port}"
                # what a player fetching the URL gets: an MP4 PyAV (FFmpeg) plays
                data = await asyncio.to_thread(_read, f"{base}/stream.mp4?res=160x120", 20000)
                with av.open(io.BytesIO(data), format="mp4") as mp4:
                    frames = list(mp4.decode(video=0))
                assert len(frames) >= 3 and (frames[0].width, frames[0].height) == (160, 120)
                pts = [f.pts for f in frames]
                assert pts == sorted(set(pts))

                driver = await asyncio.to_thread(WebDriver, tmp_path)
                await asyncio.to_thread(driver.cmd, "POST", "/url",
                                        {"url": f"{base}/?res=160x120"})

                async def js(expr: str) -> object:
                    assert driver is not None
                    return await asyncio.to_thread(driver.script, f"return {expr};")

                deadline = time.monotonic() + 60
                while float(await js("document.getElementById('vid').currentTime") or 0) < 0.5:
                    assert time.monotonic() < deadline, (
                        "the video element never played",
                        await js("[document.getElementById('vid').readyState, "
                                 "document.getElementById('vid').error && "
                                 "document.getElementById('vid').error.message]"))
                    await asyncio.sleep(0.3)
                times = []
                for _ in range(3):
                    await asyncio.sleep(1.0)
                    times.append(float(await js("document.getElementById('vid').currentTime")))
                assert times == sorted(times) and times[-1] - times[0] > 0.8, times
                # it stays at the live edge: at most a second behind what it has
                behind = float(await js(
                    "(() => { const v = document.getElementById('vid');"
                    " return v.buffered.end(v.buffered.length - 1) - v.currentTime; })()"))
                assert behind < 1.0
                # the picture fits the window (800x600, less the bar), keeping its shape
                box = await js("(() => { const r = document.getElementById('vid')"
                               ".getBoundingClientRect(); return [r.width, r.height,"
                               " window.innerWidth, window.innerHeight]; })()")
                w, h, win_w, win_h = box  # type: ignore[misc]
                assert w == pytest.approx(win_w, abs=2) and h > win_h * 0.8, box
                assert await js("document.getElementById('vid').videoWidth") == 160
                # frame rate, delay and stalls on the page
                deadline = time.monotonic() + 30
                while float(await js("document.getElementById('stats').dataset.fps || 0")
                            ) <= 3:
                    assert time.monotonic() < deadline, "no frame rate on the page"
                    await asyncio.sleep(0.3)
                text = str(await js("document.getElementById('stats').textContent"))
                assert "fps" in text and "delay" in text and "stalls" in text, text
                assert web.counters.get("http.mp4-streams", 0) >= 2
            finally:
                if driver is not None:
                    await asyncio.to_thread(driver.quit)
                await web.close()
    run(main(), 240)
