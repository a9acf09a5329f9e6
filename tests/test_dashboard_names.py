"""Names on the dashboard are text, never markup (issue 26): a router configured with a peer
named ``<img src=x onerror=...>`` shows that name literally; the page runs no script from it,
and every page is served under a Content-Security-Policy that forbids inline script.

The page is rendered by headless Chromium (as tests/test_dashboard.py does) from a router's
own HTTP endpoint."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from flowrouter.monitor import start_monitor
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.observe import router_source
from flowrouter.net.runtime import RouterNode

from .ports import free_port
from .rawep import run, within

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
EVIL = '<img src=x onerror="document.title=\'pwned\'">'
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--virtual-time-budget=4000"]


async def _get(addr: tuple[str, int], path: str) -> tuple[dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection(*addr)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = await within(reader.read())
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:]), body


def test_every_page_carries_a_policy_without_inline_script() -> None:
    async def go() -> None:
        node = RouterNode(NodeConfig("r1", listen="127.0.0.1:0"))
        await node.start()
        mon = await start_monitor(router_source(node), "127.0.0.1:0")
        assert mon is not None
        try:
            for path in ("/", "/dashboard.js", "/dashboard.css", "/api/overlay", "/status"):
                headers, body = await _get(mon.address, path)
                csp = headers["Content-Security-Policy"]
                assert "default-src 'none'" in csp and "script-src 'self'" in csp
                assert "unsafe-inline" not in csp and body
                assert headers["X-Content-Type-Options"] == "nosniff"
            _, page = await _get(mon.address, "/")
            assert b'<script src="dashboard.js">' in page
            assert b"<script>" not in page and b"<style>" not in page
            _, script = await _get(mon.address, "/dashboard.js")
            assert b"innerHTML" not in script and b"insertAdjacentHTML" not in script
        finally:
            await mon.stop()
            await node.stop()
    run(go())


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (.ci/install adds it)")
def test_a_peer_named_like_markup_is_shown_as_text(tmp_path: Path) -> None:
    async def go() -> None:
        node = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", reconnect_min=5.0,
                                     peers=[PeerConfig(f"127.0.0.1:{free_port()}",
                                                       name=EVIL)]))
        await node.start()
        mon = await start_monitor(router_source(node), "127.0.0.1:0")
        assert mon is not None
        try:
            proc = await asyncio.create_subprocess_exec(
                CHROMIUM or "chromium", *CHROME_FLAGS, f"--user-data-dir={tmp_path}",
                "--dump-dom", mon.url + "/",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            await mon.stop()
            await node.stop()
        dom = out.decode()
        assert 'data-ready="1"' in dom, "the page did not render"
        assert "pwned" not in dom.split("<title>")[1].split("</title>")[0]
        assert "<img" not in dom  # nowhere as an element: the name is text
        # shown in the links table and the graph, escaped by the DOM serialiser
        assert dom.count("&lt;img src=x onerror=") >= 2
    run(go())
