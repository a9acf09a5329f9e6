"""flowvideo end to end with a real screen and a real browser: a streamer grabs the screen of
an Xvfb display (on which a small Tk program animates a box), routers carry the stream, the
browser viewer (`flowvideo web`) serves it as MJPEG, and headless Chromium (driven over plain
WebDriver HTTP by chromedriver) shows it. Screenshots taken over time show a non-blank,
changing picture at the resolution picked in the page.

Skipped when Xvfb, Chromium, chromedriver or Pillow's XCB support is missing (.ci/install
installs them).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageChops, features

import flowlib
from flowvideo.protocol import Resolution
from flowvideo.sources import ScreenSource
from flowvideo.streamer import Streamer
from flowvideo.web import WebViewer

from .ports import free_port
from .rawep import addr, run, until
from .test_video import config, star

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (shutil.which("Xvfb") and os.path.exists(CHROMIUM) and CHROMEDRIVER
         and features.check("xcb")),
    reason="needs Xvfb, chromium, chromedriver and Pillow with XCB (.ci/install)")

ANIMATOR = """
import tkinter as tk
root = tk.Tk()
root.geometry("320x240+0+0")
root.overrideredirect(True)
c = tk.Canvas(root, width=320, height=240, bg="#204080", highlightthickness=0)
c.pack()
box = c.create_rectangle(0, 60, 80, 140, fill="#ffcc00", outline="")
text = c.create_text(160, 200, text="0", fill="white", font=("TkFixedFont", 24))
n = 0
def step():
    global n
    n += 1
    x = (n * 12) % 260
    c.coords(box, x, 60, x + 80, 140)
    c.itemconfigure(box, fill="#%02x%02x00" % ((n * 40) % 256, 200))
    c.itemconfigure(text, text=str(n))
    root.after(100, step)
step()
root.mainloop()
"""


@pytest.fixture
def xdisplay(tmp_path: Path) -> Iterator[str]:
    """An Xvfb display with the animator running on it."""
    r, w = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", "320x240x24",
                             "-nolisten", "tcp"], pass_fds=(w,), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.close(w)
    anim = None
    try:
        with os.fdopen(r) as f:
            number = f.readline().strip()
        assert number.isdigit(), "Xvfb did not report its display"
        display = f":{number}"
        script = tmp_path / "animator.py"
        script.write_text(ANIMATOR)
        anim = subprocess.Popen([sys.executable, str(script)],
                                env={**os.environ, "DISPLAY": display},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:  # until the animation is on the screen
            with contextlib.suppress(OSError):
                from PIL import ImageGrab

                if len(ImageGrab.grab(xdisplay=display).getcolors(1 << 16) or ()) > 2:
                    break
            assert time.monotonic() < deadline, "the animator never drew on the display"
            assert anim.poll() is None, "the animator exited"
            time.sleep(0.2)
        yield display
    finally:
        if anim is not None:
            anim.kill()
            anim.wait()
        xvfb.kill()
        xvfb.wait()


class WebDriver:
    """Just enough of the W3C WebDriver protocol, over plain HTTP to chromedriver."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                self._call("GET", "/status")
                break
            except OSError:
                assert time.monotonic() < deadline, "chromedriver did not start"
                time.sleep(0.2)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-dev-shm-usage", "--window-size=800,600",
                f"--user-data-dir={tmp / 'chromium-profile'}"]
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "pageLoadStrategy": "eager",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read() or b"{}").get("value")

    def cmd(self, method: str, path: str, body: Any = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def script(self, js: str) -> Any:
        return self.cmd("POST", "/execute/sync", {"script": js, "args": []})

    def painted(self) -> None:
        """Return once the picture now in the page is decoded and a frame with it painted
        (the page's own promise and animation frames, not a guess at how long it takes)."""
        self.cmd("POST", "/execute/async", {"script": (
            "const done = arguments[arguments.length - 1];"
            "document.getElementById('pic').decode().catch(() => null).then(() =>"
            " requestAnimationFrame(() => requestAnimationFrame(() => done(true))));"),
            "args": []})

    def screenshot(self) -> Image.Image:
        return Image.open(io.BytesIO(base64.b64decode(self.cmd("GET", "/screenshot"))))

    def quit(self) -> None:
        with contextlib.suppress(Exception):
            self.cmd("DELETE", "")
        self.proc.kill()
        self.proc.wait()


def picture(driver: WebDriver) -> Image.Image:
    """The <img> part of a screenshot (in CSS pixels)."""
    shot = driver.screenshot().convert("RGB")
    rect = driver.script("const r = document.getElementById('pic').getBoundingClientRect();"
                         "return [r.left, r.top, r.width, r.height, window.devicePixelRatio];")
    x, y, w, h, dpr = rect
    box = tuple(round(v * dpr) for v in (x, y, x + w, y + h))
    assert box[2] <= shot.width and box[3] <= shot.height, ("picture outside the viewport",
                                                            box, shot.size)
    return shot.crop(box)


def test_chromium_shows_the_screen_stream_at_the_picked_resolution(
        xdisplay: str, tmp_path: Path) -> None:
    async def main() -> None:
        source = ScreenSource(xdisplay)
        assert source.grab(0).size == (320, 240)
        cfg = config(resolutions=(Resolution(320, 240), Resolution(160, 120)), fps=4.0)
        async with star() as (r0, _r1, r2):
            client = await flowlib.connect(addr(r0), name="screen", fragment_size=4000)
            flow = await client.create()
            streamer = Streamer(client, flow, source, cfg)
            stask = asyncio.ensure_future(streamer.run())
            web = WebViewer([addr(r2)], str(flow), port=0)
            driver: WebDriver | None = None
            try:
                await web.start()
                await until(lambda: len(web.offers()) == 2, 30, "the advertisement")
                port = web.address[1]
                driver = await asyncio.to_thread(WebDriver, tmp_path)
                await asyncio.to_thread(driver.cmd, "POST", "/url",
                                        {"url": f"http://127.0.0.1:{port}/"
                                                "?res=160x120&mode=mjpeg&fit=0"})

                async def natural_width() -> int:
                    assert driver is not None
                    return await asyncio.to_thread(
                        driver.script, "return document.getElementById('pic').naturalWidth;")

                deadline = time.monotonic() + 60
                while await natural_width() != 160:
                    assert time.monotonic() < deadline, "the page never showed a picture"
                    await asyncio.sleep(0.3)
                shots = []
                for i in range(3):
                    feed = web.feeds[Resolution(160, 120)]
                    seen = feed.seq
                    await until(lambda feed=feed, seen=seen: feed.seq >= seen + 3, 30,
                                "new pictures")
                    await asyncio.to_thread(driver.painted)  # the last one is on screen
                    shot = await asyncio.to_thread(picture, driver)
                    shot.save(tmp_path / f"shot-{i}.png")
                    shots.append(shot)
                for shot in shots:
                    assert shot.size == (160, 120), shot.size
                    assert len(shot.getcolors(1 << 16) or ()) > 8, "a blank picture"
                assert ImageChops.difference(shots[0], shots[-1]).getbbox() is not None, \
                    "the picture did not change"
                # the picker switches the page to the other resolution
                await asyncio.to_thread(driver.script, (
                    "const s = document.getElementById('res'); s.value = '320x240';"
                    "s.dispatchEvent(new Event('change'));"))
                deadline = time.monotonic() + 60
                while await natural_width() != 320:
                    assert time.monotonic() < deadline, "the picker did not switch"
                    await asyncio.sleep(0.3)
                big = await asyncio.to_thread(picture, driver)
                big.save(tmp_path / "shot-320.png")
                assert big.size == (320, 240)
                assert len(big.getcolors(1 << 16) or ()) > 8
                status = json.loads(await asyncio.to_thread(
                    lambda: urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/status.json", timeout=30).read()))
                assert {v["resolution"] for v in status["viewers"]} >= {"160x120", "320x240"}
            finally:
                if driver is not None:
                    await asyncio.to_thread(driver.quit)
                await web.close()
                stask.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stask
                await client.close()
    run(main(), 240)
