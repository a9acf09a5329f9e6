"""Picture sources and the JPEG encoder (Pillow).

* :class:`PatternSource`: a synthetic test pattern drawn from the media time (colour bars, a
  moving box and the time as text), so a backup that continues the media time continues the
  picture;
* :class:`ScreenSource`: the screen of an X display, grabbed with ``PIL.ImageGrab`` (Pillow's
  XCB support; an Xvfb display in tests);
* :class:`FileSource`: an animated image file Pillow reads (GIF, APNG, WebP, or a still
  picture), played in a loop at its own frame durations;
* video files (MP4, MKV, WebM, ...) and cameras: :mod:`flowvideo.avsources` (PyAV), chosen by
  :func:`open_source` for ``file:`` paths with a video container's suffix (or that Pillow
  cannot read) and for ``camera[:DEVICE]``.

``grab(media_ms)`` returns an RGB image; :func:`encode_jpeg` scales and encodes it. Both run
in a worker thread in the shell. Imports Pillow and :mod:`flowvideo.protocol` (and
:mod:`flowvideo.avsources`, when a video file or a camera is asked for).
"""

from __future__ import annotations

import io
from typing import Protocol

from PIL import Image, ImageDraw

from .protocol import Resolution


class SourceError(RuntimeError):
    """A source that cannot be opened or read (the message is one line)."""


class Source(Protocol):
    name: str

    def grab(self, media_ms: int) -> Image.Image: ...


_BARS = [(235, 235, 235), (235, 235, 16), (16, 235, 235), (16, 235, 16), (235, 16, 235),
         (235, 16, 16), (16, 16, 235), (16, 16, 16)]


class PatternSource:
    def __init__(self, size: Resolution | None = None, detail: bool = True) -> None:
        size = size or Resolution(640, 480)
        self.size = size
        self.detail = detail
        self.name = f"pattern {size}"

    def grab(self, media_ms: int) -> Image.Image:
        w, h = self.size.width, self.size.height
        im = Image.new("RGB", (w, h))
        d = ImageDraw.Draw(im)
        bar = max(1, w // len(_BARS))
        for i, colour in enumerate(_BARS):
            d.rectangle([i * bar, 0, (i + 1) * bar - 1, h * 2 // 3], fill=colour)
        if self.detail:  # fine stripes make the big sizes big, as real screens are
            for x in range(0, w, 4):
                shade = (x * 255 // max(1, w) + media_ms // 20) % 256
                d.line([x, h * 2 // 3, x, h - 1], fill=(shade, 255 - shade, (x * 7) % 256))
        t = media_ms / 1000
        box = max(4, min(w, h) // 5)
        x = int((w - box) * (0.5 + 0.5 * _tri(t / 4)))
        y = int((h - box) * (0.5 + 0.5 * _tri(t / 3)))
        d.rectangle([x, y, x + box, y + box], fill=(255, 128, 0), outline=(0, 0, 0))
        d.text((4, 4), f"{t:8.2f}s", fill=(0, 0, 0))
        return im


def _tri(x: float) -> float:
    """A triangle wave in -1..1 with period 1."""
    f = x % 1.0
    return 4 * f - 1 if f < 0.5 else 3 - 4 * f


class ScreenSource:
    def __init__(self, display: str) -> None:
        from PIL import features

        if not features.check("xcb"):
            raise SourceError("this Pillow has no XCB support: it cannot grab an X screen")
        self.display = display
        self.name = f"screen {display}"
        self.grab(0)  # fail now, in one line, if the display is not there

    def grab(self, media_ms: int) -> Image.Image:
        from PIL import ImageGrab

        try:
            return ImageGrab.grab(xdisplay=self.display).convert("RGB")
        except OSError as exc:
            raise SourceError(f"cannot grab X display {self.display}: {exc}") from None


class FileSource:
    def __init__(self, path: str, max_frames: int = 10_000) -> None:
        try:
            im = Image.open(path)
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot read {path}: {exc}") from None
        self.name = f"file {path}"
        self.frames: list[Image.Image] = []
        self.ends: list[int] = []  # media ms at which each frame ends
        t = 0
        n = getattr(im, "n_frames", 1)
        if n > max_frames:
            raise SourceError(f"{path} has {n} frames (at most {max_frames})")
        for i in range(n):
            im.seek(i)
            self.frames.append(im.convert("RGB"))
            t += max(20, int(im.info.get("duration", 100) or 100))
            self.ends.append(t)

    def grab(self, media_ms: int) -> Image.Image:
        pos = media_ms % self.ends[-1]
        for frame, end in zip(self.frames, self.ends):
            if pos < end:
                return frame
        return self.frames[-1]


VIDEO_SUFFIXES = (".mp4", ".m4v", ".mkv", ".webm", ".mov", ".avi", ".ts", ".mpg", ".ogv")


def open_source(spec: str) -> Source:
    """``pattern[:WxH]``, ``screen:DISPLAY`` (e.g. ``screen::99``), ``file:PATH`` (an
    animated image, or a video file) or ``camera[:DEVICE[@FORMAT]]`` (default /dev/video0,
    Video4Linux2; FORMAT is FFmpeg's input format, e.g. ``avfoundation``, ``dshow``,
    ``x11grab`` or ``lavfi``)."""
    kind, _, arg = spec.partition(":")
    if kind == "pattern":
        return PatternSource(Resolution.parse(arg) if arg else Resolution(640, 480))
    if kind == "screen":
        if not arg:
            raise SourceError("screen source needs a display: screen::99")
        return ScreenSource(arg)
    if kind == "file":
        if not arg:
            raise SourceError("file source needs a path: file:movie.mp4")
        if arg.lower().endswith(VIDEO_SUFFIXES):
            from .avsources import VideoFileSource

            return VideoFileSource(arg)
        return FileSource(arg)
    if kind == "camera":
        from .avsources import CameraSource

        device, at, fmt = (arg or "/dev/video0").rpartition("@")
        return CameraSource(device, fmt) if at else CameraSource(fmt)
    raise SourceError(f"unknown source {spec!r} (pattern[:WxH], screen:DISPLAY, file:PATH, "
                      "camera[:DEVICE])")


def encode_jpeg(im: Image.Image, size: Resolution, quality: int) -> bytes:
    """Scale *im* to *size* (unless it has it) and encode it as a baseline JPEG."""
    if im.size != (size.width, size.height):
        im = im.resize((size.width, size.height), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()
