"""Picture codecs: JPEG (Pillow, the zero-dependency default) and the inter-frame codecs
H.264 and VP8 (PyAV, which bundles FFmpeg with libx264 and libvpx: ``pip install
'flownet[video]'``).

One :class:`PictureEncoder` per resolution band: an inter-frame encoder keeps the previous
pictures it predicts from, so its band's pictures must reach a viewer in order and from a
key picture on (the viewer core waits for one after joining, switching or a loss, and asks
for it; the streamer core marks the next picture ``key``). Encoders are tuned for live
streaming: no picture is held back (x264 ``zerolatency``, libvpx ``lag-in-frames=0``), key
pictures only when asked for or after a change of size or quality (which opens a new encoder),
and the quality knob 1..95 maps to the codec's constant-quality setting.

:class:`PictureDecoder` turns a band's pictures back into images (the web viewer's player
stream and the tests use it).

Imports Pillow, PyAV (only when an inter-frame codec is asked for),
:mod:`flowvideo.protocol` and :mod:`flowvideo.sources` (its JPEG encoder).
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any, Protocol

from PIL import Image

from . import protocol as P
from .protocol import Resolution
from .sources import encode_jpeg

#: codec names on the command line -> protocol codec numbers
CODECS = {"jpeg": P.CODEC_JPEG, "h264": P.CODEC_H264, "vp8": P.CODEC_VP8}
_FFMPEG_ENCODER = {P.CODEC_H264: "libx264", P.CODEC_VP8: "libvpx"}
_FFMPEG_DECODER = {P.CODEC_H264: "h264", P.CODEC_VP8: "vp8"}
KEY_INTERVAL = 600  #: pictures between unasked key pictures at most (a safety net)


class CodecUnavailable(RuntimeError):
    """An inter-frame codec was asked for without PyAV (the message says how to get it)."""


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise CodecUnavailable("H.264 and VP8 need PyAV: pip install 'flownet[video]'") \
            from None
    return av


def available(codec: int) -> bool:
    """Whether *codec* can be encoded here."""
    if codec == P.CODEC_JPEG:
        return True
    try:
        av = _av()
    except CodecUnavailable:
        return False
    return _FFMPEG_ENCODER[codec] in av.codecs_available


def parse_codec(text: str) -> int:
    """``jpeg``, ``h264`` or ``vp8`` -> the protocol's codec number (ValueError otherwise)."""
    try:
        return CODECS[text.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown codec {text!r} (jpeg, h264 or vp8)") from None


def scale_to(im: Image.Image, size: Resolution) -> Image.Image:
    if im.size != (size.width, size.height):
        im = im.resize((size.width, size.height), Image.Resampling.BILINEAR)
    return im


class PictureEncoder(Protocol):
    codec: int

    def encode(self, im: Image.Image, size: Resolution, quality: int, fps: float,
               media_ms: int, key: bool) -> tuple[bytes, bool]:
        """The picture's bytes and whether it is a key picture."""
        ...


class JpegEncoder:
    """Every picture on its own (every one is a key picture)."""

    codec = P.CODEC_JPEG

    def encode(self, im: Image.Image, size: Resolution, quality: int, fps: float,
               media_ms: int, key: bool) -> tuple[bytes, bool]:
        return encode_jpeg(im, size, quality), True


def _constant_quality(codec: int, quality: int) -> int:
    """Quality 1..95 (JPEG's scale, as rate control steps it) -> x264's CRF 51..~15 or
    libvpx's CRF 63..~10: higher quality, lower CRF."""
    q = min(max(quality, 1), 95) / 95
    return round(51 - 36 * q) if codec == P.CODEC_H264 else round(63 - 53 * q)


class AvEncoder:
    """H.264 (libx264) or VP8 (libvpx) for one band, through PyAV."""

    def __init__(self, codec: int) -> None:
        if codec not in _FFMPEG_ENCODER:
            raise ValueError(f"not an inter-frame codec: {codec}")
        self.av = _av()
        if _FFMPEG_ENCODER[codec] not in self.av.codecs_available:
            raise CodecUnavailable(f"this PyAV has no {_FFMPEG_ENCODER[codec]}")
        self.codec = codec
        self._ctx: Any = None
        self._params: tuple[Resolution, int] | None = None
        self._since_key = 0
        self.opened = 0  #: encoders opened (a new size or quality opens one)

    def _open(self, size: Resolution, quality: int, fps: float) -> None:
        ctx = self.av.CodecContext.create(_FFMPEG_ENCODER[self.codec], "w")
        ctx.width, ctx.height = size.width, size.height
        ctx.pix_fmt = "yuv420p"
        ctx.time_base = Fraction(1, 1000)
        ctx.framerate = Fraction(max(1, round(fps)))
        ctx.gop_size = KEY_INTERVAL
        crf = str(_constant_quality(self.codec, quality))
        if self.codec == P.CODEC_H264:
            ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": crf}
        else:
            ctx.bit_rate = 4_000_000  # a ceiling: the CRF decides
            ctx.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0",
                           "crf": crf}
        ctx.open()
        self._ctx, self._params = ctx, (size, quality)
        self.opened += 1

    def encode(self, im: Image.Image, size: Resolution, quality: int, fps: float,
               media_ms: int, key: bool) -> tuple[bytes, bool]:
        if self._params != (size, quality):
            self._open(size, quality, fps)  # a new encoder starts with a key picture
        frame = self.av.VideoFrame.from_image(scale_to(im, size).convert("RGB"))
        frame = frame.reformat(format="yuv420p")
        frame.pts = media_ms
        if key:
            frame.pict_type = self.av.video.frame.PictureType.I
        packets = self._ctx.encode(frame)
        data = b"".join(bytes(p) for p in packets)
        is_key = any(p.is_keyframe for p in packets)
        return data, is_key


def make_encoder(codec: int) -> PictureEncoder:
    return JpegEncoder() if codec == P.CODEC_JPEG else AvEncoder(codec)


class PictureDecoder:
    """A band's pictures back to RGB images, whatever their codec (an inter-frame decoder
    needs them in order from a key picture; a new size opens a new one)."""

    def __init__(self) -> None:
        self._ctx: Any = None
        self._codec: int | None = None
        self.errors = 0

    def decode(self, frame: P.Frame) -> Image.Image | None:
        """The picture, or None when the decoder has no picture for it (yet) or it is
        damaged (counted in ``errors``)."""
        if frame.codec == P.CODEC_JPEG:
            try:
                return Image.open(io.BytesIO(frame.picture)).convert("RGB")
            except (OSError, ValueError):
                self.errors += 1
                return None
        av = _av()
        if self._ctx is None or self._codec != frame.codec:
            self._ctx = av.CodecContext.create(_FFMPEG_DECODER[frame.codec], "r")
            self._codec = frame.codec
        try:
            pictures = self._ctx.decode(av.Packet(frame.picture))
        except (av.error.FFmpegError, ValueError):
            self.errors += 1
            return None
        return pictures[-1].to_image() if pictures else None
