"""The browser viewer: a small asyncio HTTP server that watches a flowvideo stream and shows
it to a web browser, in a ``<video>`` element (fragmented MP4 through Media Source
Extensions: :mod:`flowvideo.player`) or as MJPEG (``multipart/x-mixed-replace``), with a
resolution picker, fit-to-window and the frame rate, delay and stalls on the page.

==========================  ===============================================================
``GET /``                   the page (:mod:`flowvideo.webpage`); ``?res=WxH`` picks the
                            resolution, ``&mode=mjpeg`` the MJPEG picture, ``&fit=0`` 1:1
``GET /stream.mp4?res=R``   the pictures at resolution R as fragmented MP4 (H.264): what the
                            page's video element plays, and ffplay / VLC / mpv open too
``GET /stream.mjpg?res=R``  the picture at resolution R, pushed frame after frame
``GET /frame.jpg?res=R``    the latest picture at R (waits for the first one)
``GET /resolutions.json``   what the advertisement offers (and whether MP4 can be served)
``GET /status.json``        the viewers behind the page (frames, gaps, delay, drops)
==========================  ===============================================================

Pictures of an inter-frame codec (H.264, VP8) are decoded as they come (in order: the
decoder needs every one); JPEG pictures are decoded only when an MP4 client needs them.

One :class:`~flowvideo.viewer.Viewer` hears the advertisements; one more per resolution
that a browser watches subscribes to that resolution's band. A resolution no browser has
watched for ``idle_close`` seconds is left, so the streamer stops it when its requests
expire. Limits: ``max_clients`` open HTTP connections (more are answered 503 and counted),
request heads of at most 8 KiB read within 10 s; anything else is a 400.

Imports asyncio, flowlib and the video modules (PyAV through :mod:`flowvideo.codecs` and
:mod:`flowvideo.player`, for what needs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import Sequence
from typing import Any

from PIL import Image

import flowlib

from . import protocol as P
from .codecs import PictureDecoder, available
from .protocol import Resolution
from .sources import encode_jpeg
from .viewer import Viewer
from .webpage import PAGE

log = logging.getLogger("flowvideo.web")

MAX_HEAD = 8192
HEAD_TIMEOUT = 10.0
BOUNDARY = "flowvideo-frame"

class FrameFeed:
    """The latest picture of one resolution and the waiters for the next one: as the JPEG
    bytes and as an image, each made from the other when first asked for."""

    def __init__(self) -> None:
        self.frame: P.Frame | None = None
        self.seq = 0
        self._jpeg: bytes | None = None
        self._image: Image.Image | None = None
        self._decoder = PictureDecoder()
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def jpeg(self) -> bytes | None:
        if self._jpeg is None and self._image is not None:
            self._jpeg = encode_jpeg(self._image, Resolution(*self._image.size), 80)
        return self._jpeg

    @property
    def image(self) -> Image.Image | None:
        if self._image is None and self._jpeg is not None:
            self._image = self._decoder.decode(self.frame) if self.frame else None
        return self._image

    @property
    def decode_errors(self) -> int:
        return self._decoder.errors

    def put(self, frame: P.Frame) -> None:
        if frame.codec == P.CODEC_JPEG:
            self._jpeg, self._image = frame.picture, None
        else:  # every picture of an inter-frame codec goes through the decoder, in order
            image = self._decoder.decode(frame)
            if image is None:
                return
            self._jpeg, self._image = None, image
        self.frame = frame
        self.seq += 1
        for w in self._waiters:
            if not w.done():
                w.set_result(None)
        self._waiters.clear()

    async def next(self, after: int, timeout: float) -> bool:
        """Wait until a picture newer than *after* is there (False on timeout)."""
        if self.seq > after:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return False
        return self.seq > after


class WebViewer:
    def __init__(self, routers: Sequence[str], flow: str, *, host: str = "127.0.0.1",
                 port: int = 8090, connect_kwargs: dict[str, Any] | None = None,
                 idle_close: float = 10.0, max_clients: int = 32, queue_size: int = 8) -> None:
        self.routers = list(routers)
        self.flow = flow
        self.host, self.port = host, port
        self.connect_kwargs = connect_kwargs or {}
        self.idle_close = idle_close
        self.max_clients = max_clients
        self.queue_size = queue_size
        self.adverts: Viewer | None = None
        self.viewers: dict[Resolution, Viewer] = {}
        self.feeds: dict[Resolution, FrameFeed] = {}
        self.watching: dict[Resolution, int] = {}   #: open streams per resolution
        self.idle_since: dict[Resolution, float] = {}
        self.counters: dict[str, int] = {}
        self._clients = 0
        self._server: asyncio.Server | None = None
        self._janitor: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[:2]

    async def start(self) -> None:
        self.adverts = Viewer(self.routers, self.flow, None, name="web-adverts",
                              connect_kwargs=self.connect_kwargs)
        await self.adverts.start()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self._janitor = asyncio.ensure_future(self._sweep())

    async def close(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        for v in [*self.viewers.values(), *([self.adverts] if self.adverts else [])]:
            await v.close()
        self.viewers.clear()

    async def __aenter__(self) -> WebViewer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---------------------------------------------------------------------- viewers
    def offers(self) -> list[dict[str, Any]]:
        core = self.adverts.core if self.adverts else None
        if core is None or core.advert is None:
            return []
        return [{"resolution": str(o.resolution), "band": o.band, "active": o.active,
                 "fps": o.fps, "quality": o.quality, "scale": o.scale,
                 "codec": P.CODEC_NAMES.get(o.codec, str(o.codec))}
                for o in sorted(core.advert.offers, key=lambda o: o.resolution.pixels)]

    async def _viewer_for(self, res: Resolution) -> Viewer:
        async with self._lock:
            v = self.viewers.get(res)
            if v is None:
                feed = self.feeds.setdefault(res, FrameFeed())

                def show(frame: P.Frame, feed: FrameFeed = feed) -> None:
                    feed.put(frame)

                v = Viewer(self.routers, self.flow, res, name=f"web-{res}",
                           queue_size=self.queue_size, connect_kwargs=self.connect_kwargs,
                           on_frame=show)
                await v.start()
                self.viewers[res] = v
            return v

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, self.idle_close / 2))
            now = loop.time()
            for res in list(self.viewers):
                if self.watching.get(res, 0) > 0:
                    self.idle_since.pop(res, None)
                    continue
                since = self.idle_since.setdefault(res, now)
                if now - since >= self.idle_close:
                    v = self.viewers.pop(res)
                    self.idle_since.pop(res, None)
                    await v.close()
                    log.info("nobody watches %s any more: left its band", res)

    # ---------------------------------------------------------------------- HTTP
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._clients >= self.max_clients:
            self._count("http.refused-busy")
            await self._reply(writer, 503, "text/plain", b"too many clients\n")
            return
        self._clients += 1
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self._count("http.disconnected")
        except flowlib.FlowError as exc:  # no router for a new resolution's viewer
            self._count("http.flow-error")
            log.warning("cannot watch: %s", exc)
            with contextlib.suppress(ConnectionError):
                await self._reply(writer, 503, "text/plain", f"{exc}\n".encode())
        finally:
            self._clients -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (TimeoutError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            self._count("http.bad-head")
            return
        if len(head) > MAX_HEAD:
            self._count("http.bad-head")
            await self._reply(writer, 431, "text/plain", b"request head too large\n")
            return
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or parts[0] not in ("GET", "HEAD"):
            self._count("http.bad-request")
            await self._reply(writer, 400, "text/plain", b"only GET is served\n")
            return
        url = urllib.parse.urlsplit(parts[1])
        query = urllib.parse.parse_qs(url.query)
        self._count("http.requests")
        if url.path == "/":
            await self._reply(writer, 200, "text/html; charset=utf-8", PAGE.encode())
        elif url.path == "/resolutions.json":
            offers = {"flow": self.flow, "offers": self.offers(),
                      "mp4": available(P.CODEC_H264)}
            await self._reply(writer, 200, "application/json", json.dumps(offers).encode())
        elif url.path == "/status.json":
            body: dict[str, Any] = {
                "flow": self.flow, "viewers": [v.snapshot() for v in self.viewers.values()],
                "counters": self.counters}
            await self._reply(writer, 200, "application/json", json.dumps(body).encode())
        elif url.path in ("/stream.mjpg", "/frame.jpg", "/stream.mp4"):
            res = self._resolution(query)
            if res is None:
                await self._reply(writer, 404, "text/plain",
                                  b"unknown resolution (see /resolutions.json)\n")
                return
            await self._viewer_for(res)
            if url.path == "/frame.jpg":
                await self._one_frame(writer, res)
            elif url.path == "/stream.mp4":
                await self._mp4(writer, res)
            else:
                await self._mjpeg(writer, res)
        else:
            self._count("http.not-found")
            await self._reply(writer, 404, "text/plain", b"not found\n")

    def _resolution(self, query: dict[str, list[str]]) -> Resolution | None:
        try:
            res = Resolution.parse(query.get("res", [""])[0])
        except ValueError:
            self._count("http.bad-resolution")
            return None
        if all(o["resolution"] != str(res) for o in self.offers()):
            self._count("http.bad-resolution")
            return None
        return res

    async def _reply(self, writer: asyncio.StreamWriter, status: int, ctype: str,
                     body: bytes) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 431: "Too Large",
                  501: "Not Implemented", 503: "Service Unavailable"}.get(status, "")
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                     f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        await writer.drain()

    async def _one_frame(self, writer: asyncio.StreamWriter, res: Resolution) -> None:
        feed = self.feeds[res]
        self.watching[res] = self.watching.get(res, 0) + 1
        try:
            if not await feed.next(0, 10.0) or feed.jpeg is None:
                await self._reply(writer, 503, "text/plain", b"no picture yet\n")
                return
            await self._reply(writer, 200, "image/jpeg", feed.jpeg)
        finally:
            self.watching[res] -= 1

    async def _mjpeg(self, writer: asyncio.StreamWriter, res: Resolution) -> None:
        feed = self.feeds[res]
        self.watching[res] = self.watching.get(res, 0) + 1
        self._count("http.streams")
        try:
            writer.write(("HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nConnection: close\r\n"
                          f"Content-Type: multipart/x-mixed-replace; boundary={BOUNDARY}"
                          "\r\n\r\n").encode())
            seen = 0
            while True:
                if not await feed.next(seen, 30.0) or feed.jpeg is None:
                    return  # the stream is gone; the browser may reload
                seen, jpeg = feed.seq, feed.jpeg
                writer.write(f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n"
                             f"Content-Length: {len(jpeg)}\r\n\r\n".encode() + jpeg + b"\r\n")
                await writer.drain()
        finally:
            self.watching[res] -= 1

    async def _mp4(self, writer: asyncio.StreamWriter, res: Resolution) -> None:
        """Fragmented MP4 for a player: headers once the first picture is encoded (they
        carry its codec string, which a Media Source needs), then a fragment per picture."""
        if not available(P.CODEC_H264):
            self._count("http.no-mp4")
            await self._reply(writer, 501, "text/plain",
                              b"MP4 needs PyAV: pip install 'flownet[video]'\n")
            return
        from .player import Mp4Stream

        feed = self.feeds[res]
        self.watching[res] = self.watching.get(res, 0) + 1
        self._count("http.mp4-streams")
        offer = next((o for o in self.offers() if o["resolution"] == str(res)), None)
        stream = Mp4Stream(res, fps=offer["fps"] if offer else 10.0)
        try:
            seen = max(0, feed.seq - 1)  # begin with the latest picture there is
            started = False
            while True:
                if not await feed.next(seen, 30.0):
                    return  # the stream is gone; the player may reload
                seen, frame, image = feed.seq, feed.frame, feed.image
                if frame is None or image is None:
                    continue
                data = await asyncio.to_thread(stream.add, image, frame.media_ms)
                if not started:
                    started = True
                    writer.write(("HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\n"
                                  f"X-Flowvideo-Codec: {stream.codec_string()}\r\n"
                                  "Access-Control-Expose-Headers: X-Flowvideo-Codec\r\n"
                                  "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
                                  ).encode())
                if data:
                    writer.write(data)
                    await writer.drain()
        finally:
            self.watching[res] -= 1
            await asyncio.to_thread(stream.close)
