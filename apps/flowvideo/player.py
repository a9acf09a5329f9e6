"""A stream a standard player opens: pictures of one resolution as fragmented MP4 (H.264), the
format a browser's ``<video>`` element plays through Media Source Extensions and that ffplay,
VLC or mpv play from an HTTP URL.

The web viewer (:mod:`flowvideo.web`) gives every HTTP client of ``/stream.mp4`` its own
:class:`Mp4Stream`: an H.264 encoder (libx264 through PyAV) and an MP4 muxer writing an
initialisation segment and then one fragment per picture (``frag_every_frame``, so a picture
leaves at once; the muxer writes a picture's fragment when the next one comes, since it needs
its duration). Each client therefore starts with a key picture whenever it joins, whatever
the flow's codec (JPEG, H.264 or VP8 pictures are decoded by the web viewer first), and keeps
one picture size: pictures that rate control sent smaller are scaled back to the
resolution's size. Timestamps are the pictures' media times, from the first one the client
got, strictly increasing.

Imports Pillow and PyAV (``pip install 'flownet[video]'``) and :mod:`flowvideo.protocol`.
"""

from __future__ import annotations

import threading
from fractions import Fraction
from typing import Any

from PIL import Image

from .protocol import Resolution

MOVFLAGS = "frag_every_frame+empty_moov+default_base_moof"


class _Sink:
    """Where the muxer writes: the bytes since the last take()."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class Mp4Stream:
    """Pictures in, fragmented MP4 bytes out (see the module docs)."""

    def __init__(self, size: Resolution, fps: float = 10.0, quality_crf: int = 23) -> None:
        import av

        self.av = av
        self.size = size
        self._sink = _Sink()
        self._container = av.open(self._sink, mode="w", format="mp4",
                                  options={"movflags": MOVFLAGS})
        stream = self._container.add_stream(
            "libx264", rate=max(1, round(fps)),
            options={"preset": "ultrafast", "tune": "zerolatency", "crf": str(quality_crf),
                     "profile": "baseline"})
        stream.width, stream.height = size.width, size.height
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, 1000)
        stream.codec_context.time_base = Fraction(1, 1000)
        self._stream = stream
        self._origin: int | None = None
        self._last_pts = -1
        self.pictures = 0
        # The web viewer encodes in a worker thread and closes from another when the client
        # goes away (a cancelled task leaves its thread running): libav's encoder and muxer
        # are not safe to close while they encode, so one lock orders the two.
        self._lock = threading.Lock()
        self.closed = False

    def add(self, im: Image.Image, media_ms: int) -> bytes:
        """Encode one picture taken at *media_ms*; the MP4 bytes ready to send now (none once
        the stream is closed)."""
        with self._lock:
            if self.closed:
                return b""
            return self._add(im, media_ms)

    def _add(self, im: Image.Image, media_ms: int) -> bytes:
        if im.size != (self.size.width, self.size.height):
            im = im.resize((self.size.width, self.size.height), Image.Resampling.BILINEAR)
        if self._origin is None:
            self._origin = media_ms
        pts = max(self._last_pts + 1, media_ms - self._origin)
        self._last_pts = pts
        frame = self.av.VideoFrame.from_image(im.convert("RGB")).reformat(format="yuv420p")
        frame.pts = pts
        frame.time_base = Fraction(1, 1000)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self.pictures += 1
        return self._sink.take()

    def codec_string(self) -> str:
        """The RFC 6381 codecs parameter (``avc1.PPCCLL``) a Media Source needs; known once
        the encoder is open (after the first picture)."""
        with self._lock:
            extra = b"" if self.closed else bytes(self._stream.codec_context.extradata or b"")
        if extra[:1] == b"\x01" and len(extra) >= 4:  # an avcC record
            return "avc1." + extra[1:4].hex().upper()
        at = extra.find(b"\x00\x00\x01")
        while at >= 0:  # Annex B: the SPS NAL unit (type 7) carries profile and level
            nal = extra[at + 3:]
            if nal[:1] and nal[0] & 0x1F == 7 and len(nal) >= 4:
                return "avc1." + nal[1:4].hex().upper()
            at = extra.find(b"\x00\x00\x01", at + 3)
        return "avc1.42E01E"  # baseline 3.0: what this encoder's settings produce at most

    def close(self) -> None:
        """Flush and free the encoder; waits for a picture being encoded. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._container.close()
            except (self.av.error.FFmpegError, ValueError, OSError):
                pass
