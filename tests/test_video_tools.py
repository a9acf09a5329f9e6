"""flowvideo's tools: the web server refuses bad requests in a visible way, `flowvideo watch`
prints status lines and saves pictures, `flowvideo serve --codec h264 --audio tone` reaches
`flowvideo watch --audio`, and `flowvideo demo` (router processes) shows band filtering and a
backup takeover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from flowlib import BandMask
from flowvideo import protocol as P
from flowvideo.demo import run_demo
from flowvideo.protocol import Resolution
from flowvideo.web import WebViewer

from .rawep import addr, run, until
from .test_video import LOW, config, star, streaming


async def http(port: int, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(1 << 20), 30)
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, data.partition(b"\r\n\r\n")[2]


def test_web_server_answers_bad_requests_with_errors_and_counts_them() -> None:
    async def main() -> None:
        async with star() as (r0, _r1, r2), streaming(r0, config()) as (_s, flow):
            async with WebViewer([addr(r2)], str(flow), port=0, max_clients=2) as web:
                await until(lambda: len(web.offers()) == 3, what="the advertisement")
                port = web.address[1]
                status, body = await http(port, b"GET /resolutions.json HTTP/1.1\r\n\r\n")
                offers = json.loads(body)["offers"]
                assert status == 200 and [o["resolution"] for o in offers] == \
                    ["48x36", "120x90", "240x180"]
                assert (await http(port, b"POST / HTTP/1.1\r\n\r\n"))[0] == 400
                assert (await http(port, b"GET /nope HTTP/1.1\r\n\r\n"))[0] == 404
                assert (await http(port, b"GET /frame.jpg?res=7x7 HTTP/1.1\r\n\r\n"))[0] == 404
                assert (await http(port, b"GET /frame.jpg?res=big HTTP/1.1\r\n\r\n"))[0] == 404
                status, jpeg = await http(port, b"GET /frame.jpg?res=48x36 HTTP/1.1\r\n\r\n")
                assert status == 200 and jpeg.startswith(b"\xff\xd8")
                # two slow clients fill max_clients; a third is refused with 503
                held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
                await until(lambda: web._clients == 2, what="two open clients")  # noqa: SLF001
                assert (await http(port, b"GET / HTTP/1.1\r\n\r\n"))[0] == 503
                for _, w in held:
                    w.close()
                c = web.counters
                assert c["http.bad-request"] == 1 and c["http.not-found"] == 1
                assert c["http.bad-resolution"] == 2 and c["http.refused-busy"] == 1
    run(main(), 90)


def test_watch_prints_status_and_saves_pictures(tmp_path: Path) -> None:
    async def main() -> None:
        async with star() as (r0, r1, _r2), streaming(r0, config()) as (_s, flow):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "flowvideo.cli", "watch", "--router", addr(r1),
                "--flow", str(flow), "--resolution", str(LOW), "--frames", "4", "--json",
                "--save", str(tmp_path / "pics"), "--save-every", "1",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 60)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            assert proc.returncode == 0, err.decode()
            last = json.loads(out.decode().strip().splitlines()[-1])
            assert last["resolution"] == "48x36" and last["band"] == P.band_of(2)
            assert last["frames"] >= 4 and last["bad_messages"] == 0
            assert len(list((tmp_path / "pics").glob("frame-42-*.jpg"))) >= 4
    run(main(), 90)


def test_serve_h264_with_sound_and_watch_it_with_the_cli(tmp_path: Path) -> None:
    """`flowvideo serve --codec h264 --audio tone` and `flowvideo watch --audio` as processes:
    the watcher decodes the H.264 pictures it saves and hears the sound in sync."""
    pytest.importorskip("av", reason="PyAV is in the test extra (.ci/install)")

    async def main() -> None:
        async with star() as (r0, r1, _r2):
            flow_file = tmp_path / "flow"
            serve = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "flowvideo.cli", "serve", "--router", addr(r0),
                "--source", "pattern:160x120", "--resolutions", "160x120,80x60", "--codec",
                "h264", "--audio", "tone", "--flow-file", str(flow_file),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            try:
                deadline = asyncio.get_running_loop().time() + 30
                while not flow_file.exists() or not flow_file.read_text().strip():
                    assert asyncio.get_running_loop().time() < deadline, "no flow"
                    assert serve.returncode is None
                    await asyncio.sleep(0.1)
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "flowvideo.cli", "watch", "--router", addr(r1),
                    "--flow", flow_file.read_text().strip(), "--resolution", "160x120",
                    "--frames", "20", "--json", "--audio", "--save", str(tmp_path / "pics"),
                    "--save-every", "5",
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
                out, err = await asyncio.wait_for(proc.communicate(), 60)
                assert proc.returncode == 0, err.decode()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    serve.kill()
                await serve.wait()
            last = json.loads(out.decode().strip().splitlines()[-1])
            assert last["frames"] >= 20 and last["audio_chunks"] >= 10
            assert abs(last["av_skew"]) < 0.1
            pics = sorted((tmp_path / "pics").glob("frame-40-*.jpg"))
            assert len(pics) >= 2
            for pic in pics:
                assert Image.open(pic).size == (160, 120)
    run(main(), 90)


def test_serve_refuses_unknown_codecs_and_sounds_in_one_line() -> None:
    for args, code in ((["--codec", "mpeg1"], 2), (["--audio", "bells"], 1)):
        proc = subprocess.run([sys.executable, "-m", "flowvideo.cli", "serve", "--router",
                               "127.0.0.1:9", *args], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == code, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_demo_filters_by_band_and_survives_the_primary() -> None:
    result = run(run_demo(duration=6.0, quiet=True), 150)
    a, b = result["viewers"]
    assert a["resolution"] == str(Resolution(320, 240)) and a["frames"] >= 5
    assert b["resolution"] == str(Resolution(80, 60)) and b["frames"] >= 5
    assert a["takeovers"] >= 1 and b["takeovers"] >= 1 and b["underruns"] == 0
    assert result["backup"]["role"] == "primary (took over)"
    status = result["r0"]
    peer_of = {str(lk["id"]): lk["peer"] for lk in status["links"]}
    masks = {peer_of.get(link): mask for entry in status["flows"]
             for link, mask in entry["downstream"].items()}
    r2 = BandMask.parse(masks["r2"])
    assert P.band_of(2) in r2 and P.band_of(0) not in r2   # r2's subtree watches 80x60 only
