"""The web dashboard end to end: `flowrouter up --web` on a three-router overlay with one link
cut by its fault schedule, rendered by headless Chromium; the DOM and the screenshot must show
every router and the cut link."""

from __future__ import annotations

import asyncio
import json
import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest

from flownet.traffic import Traffic
from flowrouter.testbed.launcher import Launcher
from flowrouter.testbed.topology import loads

from .ports import free_port_block

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

TOPO = """
name = "dash"
duration = 60

[defaults.link]
delay = "1ms"

[defaults.router]
base_port = {base}

[[routers]]
name = "north"
[[routers]]
name = "east"
[[routers]]
name = "west"

[[endpoints]]
name = "n1"
router = "north"
[[endpoints]]
name = "w1"
router = "west"

[[links]]
a = "north"
b = "east"
[[links]]
a = "east"
b = "west"
[[links]]
a = "west"
b = "north"

[[location_services]]
lsid = 0x10
cores = ["north"]

[scenarios.cut]
faults = [ {{ link = "east-west", at = 0.2 }} ]
"""

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--hide-scrollbars", "--window-size=1280,900",
                "--virtual-time-budget=4000"]


async def _get_json(url: str) -> Any:
    host, _, rest = url.removeprefix("http://").partition(":")
    port, _, path = rest.partition("/")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /{path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return json.loads(data.partition(b"\r\n\r\n")[2])


async def _chromium(profile: Path, *args: str) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM or "chromium", *CHROME_FLAGS, f"--user-data-dir={profile}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, f"chromium exited with {proc.returncode}"
    return out


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB(A) PNG (what Chromium writes) into rows of raw pixels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = channels = 0
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            assert body[8] == 8, "8-bit channels"
            channels = {2: 3, 6: 4}[body[9]]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    i = 0
    for _ in range(height):
        ftype, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b, c = prev[x], prev[x - channels] if x >= channels else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 0xFF
            elif ftype == 2:
                line[x] = (line[x] + b) & 0xFF
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) \
                    & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, channels, rows


def _count_colour(png: bytes, rgb: tuple[int, int, int], tol: int = 12) -> int:
    width, channels, rows = _png_pixels(png)
    n = 0
    for row in rows:
        for x in range(0, width * channels, channels):
            if all(abs(row[x + k] - rgb[k]) <= tol for k in range(3)):
                n += 1
    return n


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (.ci/install adds it)")
def test_dashboard_shows_the_routers_and_the_cut_link(tmp_path: Path) -> None:
    topo = loads(TOPO.format(base=free_port_block(10)), source="dash.toml")
    launcher = Launcher(topo, scenario="cut", view=False, workdir=str(tmp_path / "up"),
                        web="127.0.0.1:0")
    shot = tmp_path / "dashboard.png"

    async def go() -> tuple[str, dict[str, Any]]:
        traffic = Traffic(launcher, rate=5.0)
        run = asyncio.ensure_future(traffic.run())
        try:
            doc: dict[str, Any] = {}
            for _ in range(600):  # until the dashboard reports the scheduled cut
                if run.done():
                    run.result()
                if launcher.web_url:
                    doc = await _get_json(launcher.web_url + "/api/overlay")
                    if any(lk["state"] == "cut" for lk in doc["links"]) and doc["flows"]:
                        break
                await asyncio.sleep(0.1)
            url = launcher.web_url + "/"
            dom = (await _chromium(tmp_path / "p1", "--dump-dom", url)).decode()
            await _chromium(tmp_path / "p2", f"--screenshot={shot}", url)
            return dom, doc
        finally:
            traffic.stop.set()
            await asyncio.wait_for(run, 60)

    dom, doc = asyncio.run(go())
    states = {lk["name"]: lk["state"] for lk in doc["links"]}
    assert states == {"north-east": "up", "east-west": "cut", "west-north": "up"}, states
    assert any("east-west down" in ev["what"] for ev in doc["events"])
    for router in ("north", "east", "west"):
        assert f'data-router="{router}"' in dom, router
    assert 'data-link="east-west" data-state="cut"' in dom
    assert 'data-state="up"' in dom and "frames/s" in dom
    tree = dom[dom.index('id="tree"'):]
    assert "n1" in tree and "w1" in tree and "[32]" in tree, "the flow tree with its masks"
    assert "east-west down" in dom  # the event list
    import os
    if os.environ.get("FLOWNET_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["FLOWNET_KEEP_SCREENSHOT"])
    png = shot.read_bytes()
    assert _count_colour(png, (0xD6, 0x27, 0x28)) > 200, "the cut link is drawn in red"
    assert _count_colour(png, (0x2C, 0xA0, 0x2C)) > 200, "up links are drawn in green"
    assert _count_colour(png, (0x1F, 0x77, 0xB4)) > 3 * 600, "three router nodes"
