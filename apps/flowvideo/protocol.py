"""The video application's bands and message formats (seed 002 section 5.2).

One flow carries one stream. Its application bands:

=====================  ===================================================================
``BAND_ADVERT`` 32     streamer -> viewers: the resolutions on offer, their bands, which
                       are active and at what rate/quality, and the request period
``BAND_REQUEST`` 33    viewers -> streamer: "I watch the resolution on band B" (refreshed)
``BAND_FEEDBACK`` 34   viewers -> streamer: "band B is congested here: N lost, delay D"
``BAND_STATE`` 35      primary -> backup: position and liveness (Figure 3.3)
``BAND_AUDIO`` 36      streamer -> viewers: the sound, in chunks stamped with media time
``40 + i``             the frames of resolution *i* (``FIRST_RESOLUTION_BAND``)
=====================  ===================================================================

Every message starts with ``b"FV"``, a version byte and a kind byte, then fixed big-endian
fields. Version 2 added what rate control and inter-frame codecs need: a frame's codec and
key flag, a request's "send a key picture" flag, a feedback's measured delay, received rate
and congestion flag, and the picture scale a band runs at (a band under congestion may send
its pictures at 1/2, 1/4 or 1/8 of its nominal size; in adverts and states).

Everything read from the network is checked: a bad message raises
:class:`ProtocolError` (a ``ValueError``) with a one-line reason, and the shells count it.

Imports only the standard library.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

BAND_ADVERT = 32
BAND_REQUEST = 33
BAND_FEEDBACK = 34
BAND_STATE = 35
BAND_AUDIO = 36
FIRST_RESOLUTION_BAND = 40
MAX_RESOLUTIONS = 16
MAX_SIDE = 8192          #: largest width or height we encode or accept
MAX_NAME = 64            #: bytes of a viewer name
MAX_FRAME_BYTES = 8 << 20  #: largest encoded picture a viewer accepts

U32 = 0xFFFFFFFF
U64 = (1 << 64) - 1
STATE_MAC_LEN = 32       #: HMAC-SHA256 trailer of a state message when a state key is set
MIN_STATE_KEY = 16       #: bytes of a state key at least

MAGIC = b"FV"
VERSION = 2
KIND_ADVERT, KIND_REQUEST, KIND_FEEDBACK, KIND_STATE, KIND_FRAME, KIND_AUDIO = 1, 2, 3, 4, 5, 6

_PREFIX = struct.Struct(">2sBB")
_ADVERT = struct.Struct(">IIIIB")          # stream, incarnation, seq, request period ms, n
_OFFER = struct.Struct(">BHHBHBBB")        # band, w, h, active, fps x10, quality, scale, codec
_STATE = struct.Struct(">IIIQIB")          # stream, inc, server, media ms, period ms, n
_STATE_ENC = struct.Struct(">BHHHBQB")     # band, w, h, fps x10, quality, frames sent, scale
_FRAME = struct.Struct(">IIQQBHHBHBB")     # stream, inc, seq, media ms, band, w, h, q, fps x10,
                                           # codec, flags
_FEEDBACK = struct.Struct(">BIIBQI")       # band, dropped, delay ms, flags, media ms, rate
_REQUEST = struct.Struct(">BB")            # band, flags
_AUDIO = struct.Struct(">IIQQBIBH")        # stream, inc, seq, media ms, codec, rate, channels,
                                           # samples

CODEC_JPEG, CODEC_H264, CODEC_VP8 = 0, 1, 2
CODEC_NAMES = {CODEC_JPEG: "jpeg", CODEC_H264: "h264", CODEC_VP8: "vp8"}
FRAME_KEY = 0x01           #: frame flag: a key picture (decodable on its own)
REQUEST_KEY = 0x01         #: request flag: send a key picture (joined, switched, lost one)
FEEDBACK_CONGESTED = 0x01  #: feedback flag: a router on the path said link-congested
MAX_SCALE = 8              #: a band's pictures are sent at 1/scale of its size at most
SCALES = (1, 2, 4, 8)
AUDIO_PCM, AUDIO_OPUS = 16, 17  #: audio codecs: 16-bit little-endian PCM; Opus packets
AUDIO_CODEC_NAMES = {AUDIO_PCM: "pcm", AUDIO_OPUS: "opus"}
MAX_AUDIO_BYTES = 64 << 10


class ProtocolError(ValueError):
    """A message that is not a well-formed flowvideo message (the reason is one line)."""


class Unauthenticated(ProtocolError):
    """A state message without a valid MAC under the configured state key."""


@dataclass(frozen=True, order=True)
class Resolution:
    width: int
    height: int

    @classmethod
    def parse(cls, text: str) -> Resolution:
        """``"320x240"`` -> Resolution(320, 240); ValueError with the reason otherwise."""
        w, sep, h = text.strip().lower().partition("x")
        if not sep or not w.isdigit() or not h.isdigit():
            raise ValueError(f"bad resolution {text!r} (want WIDTHxHEIGHT, e.g. 320x240)")
        res = cls(int(w), int(h))
        if not (1 <= res.width <= MAX_SIDE and 1 <= res.height <= MAX_SIDE):
            raise ValueError(f"bad resolution {text!r} (sides 1..{MAX_SIDE})")
        return res

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"

    def scaled(self, scale: int) -> Resolution:
        """This size divided by *scale* (a band's pictures under congestion), at least 1x1;
        sides are kept even so that every codec (4:2:0) can take them."""
        if scale <= 1:
            return self
        w, h = self.width // scale, self.height // scale
        return Resolution(max(2, w - w % 2), max(2, h - h % 2))

    def admits(self, size: Resolution) -> bool:
        """Whether a picture of *size* may come on this resolution's band: its own size or
        one of its scaled-down sizes."""
        return any(self.scaled(k) == size for k in SCALES)

    @property
    def pixels(self) -> int:
        return self.width * self.height


def parse_resolutions(text: str) -> tuple[Resolution, ...]:
    """A comma-separated list (``"640x480,160x120"``), distinct, at most MAX_RESOLUTIONS."""
    items = [Resolution.parse(part) for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError("no resolutions given")
    if len(set(items)) != len(items):
        raise ValueError(f"resolution listed twice in {text!r}")
    if len(items) > MAX_RESOLUTIONS:
        raise ValueError(f"at most {MAX_RESOLUTIONS} resolutions")
    return tuple(items)


def band_of(index: int) -> int:
    return FIRST_RESOLUTION_BAND + index


@dataclass(frozen=True)
class Offer:
    """One resolution in an advertisement."""

    band: int
    resolution: Resolution
    active: bool
    fps: float
    quality: int
    scale: int = 1        #: its pictures go at 1/scale of the resolution (congestion)
    codec: int = CODEC_JPEG


@dataclass(frozen=True)
class Advert:
    stream: int
    incarnation: int
    seq: int
    request_period: float
    offers: tuple[Offer, ...]

    def offer_for(self, resolution: Resolution) -> Offer | None:
        return next((o for o in self.offers if o.resolution == resolution), None)


@dataclass(frozen=True)
class Request:
    viewer: str
    band: int
    key: bool = False   #: the viewer needs a key picture (it joined, switched or lost one)


@dataclass(frozen=True)
class Feedback:
    """A viewer's congestion report for its band: frames lost (its queue overflowed, or
    numbers missing), the queueing delay it measures, and whether a router on its path said
    link-congested on the fault band."""

    viewer: str
    band: int
    dropped: int
    delay_ms: int = 0
    congested: bool = False
    media_ms: int = 0   #: media time of the frame the delay was measured on (0: none)
    rate: int = 0       #: picture bytes per second the viewer received lately (0: unknown)


@dataclass(frozen=True)
class EncodingState:
    band: int
    resolution: Resolution
    fps: float
    quality: int
    frames: int
    scale: int = 1


@dataclass(frozen=True)
class State:
    """What a backup needs to continue the stream: its identity, the media position, the
    state period (liveness) and the active encodings; *server* tells streamers apart (see
    :meth:`flowvideo.streamer_core.StreamerCore.outranked_by`)."""

    stream: int
    incarnation: int
    media_ms: int
    period: float
    encodings: tuple[EncodingState, ...]
    server: int = 0


@dataclass(frozen=True)
class Frame:
    stream: int
    incarnation: int
    seq: int           #: per-band frame number; a backup continues it
    media_ms: int      #: stream position in milliseconds; a backup continues it
    band: int
    resolution: Resolution
    quality: int
    fps: float
    picture: bytes     #: the encoded picture (a JPEG, or an H.264 / VP8 packet)
    codec: int = CODEC_JPEG
    key: bool = True   #: decodable on its own (every JPEG is)


@dataclass(frozen=True)
class Audio:
    """A chunk of sound: *samples* per channel from media time *media_ms* on (the same media
    clock as the pictures'). PCM: interleaved 16-bit little-endian samples; Opus: packets,
    each after its 2-byte big-endian length."""

    stream: int
    incarnation: int
    seq: int
    media_ms: int
    codec: int
    rate: int
    channels: int
    samples: int
    data: bytes


Message = Advert | Request | Feedback | State | Frame | Audio


def _prefix(kind: int) -> bytes:
    return _PREFIX.pack(MAGIC, VERSION, kind)


def _fps10(fps: float) -> int:
    return max(0, min(0xFFFF, round(fps * 10)))


def _clamp(value: int, top: int, low: int = 0) -> int:
    """A field value that fits its field: encoders never fail on a value they were given
    (a core resuming a state at the top of a field's range keeps running)."""
    return max(low, min(top, int(value)))


def _ms(seconds: float) -> int:
    return _clamp(round(seconds * 1000), U32, 1)


def _name(name: str) -> bytes:
    raw = name.encode("utf-8")[:MAX_NAME]
    return bytes([len(raw)]) + raw


def encode_advert(a: Advert) -> bytes:
    parts = [_prefix(KIND_ADVERT), _ADVERT.pack(a.stream & U32, _clamp(a.incarnation, U32),
                                                a.seq & U32, _ms(a.request_period),
                                                len(a.offers))]
    parts += [_OFFER.pack(o.band, o.resolution.width, o.resolution.height, int(o.active),
                          _fps10(o.fps), _clamp(o.quality, 0xFF), _clamp(o.scale, MAX_SCALE, 1),
                          _clamp(o.codec, 0xFF)) for o in a.offers]
    return b"".join(parts)


def encode_request(r: Request) -> bytes:
    return _prefix(KIND_REQUEST) + _name(r.viewer) + _REQUEST.pack(r.band,
                                                                    REQUEST_KEY if r.key else 0)


def encode_feedback(f: Feedback) -> bytes:
    return (_prefix(KIND_FEEDBACK) + _name(f.viewer)
            + _FEEDBACK.pack(f.band, _clamp(f.dropped, U32), _clamp(f.delay_ms, U32),
                             FEEDBACK_CONGESTED if f.congested else 0,
                             _clamp(f.media_ms, U64), _clamp(f.rate, U32)))


def encode_state(s: State) -> bytes:
    parts = [_prefix(KIND_STATE), _STATE.pack(s.stream & U32, _clamp(s.incarnation, U32),
                                              s.server & U32, _clamp(s.media_ms, U64),
                                              _ms(s.period), len(s.encodings))]
    parts += [_STATE_ENC.pack(e.band, e.resolution.width, e.resolution.height, _fps10(e.fps),
                              _clamp(e.quality, 0xFF), _clamp(e.frames, U64),
                              _clamp(e.scale, MAX_SCALE, 1))
              for e in s.encodings]
    return b"".join(parts)


def encode_frame(f: Frame) -> bytes:
    return (_prefix(KIND_FRAME)
            + _FRAME.pack(f.stream & U32, _clamp(f.incarnation, U32), _clamp(f.seq, U64),
                          _clamp(f.media_ms, U64), f.band, f.resolution.width,
                          f.resolution.height, _clamp(f.quality, 0xFF), _fps10(f.fps),
                          _clamp(f.codec, 0xFF), FRAME_KEY if f.key else 0)
            + f.picture)


def _state_mac(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, b"flowvideo-state-1" + body, hashlib.sha256).digest()


def seal_state(payload: bytes, key: bytes) -> bytes:
    """An encoded state with its HMAC-SHA256 under the primary's and backup's shared
    *key*: only a holder of the key can make another streamer step down or hold off a
    takeover."""
    return payload + _state_mac(key, payload)


def open_state(payload: bytes, key: bytes) -> bytes:
    """The state message inside a sealed one (:class:`Unauthenticated` if its MAC is not
    *key*'s)."""
    body, mac = payload[:-STATE_MAC_LEN], payload[-STATE_MAC_LEN:]
    if len(payload) <= STATE_MAC_LEN or not hmac.compare_digest(mac, _state_mac(key, body)):
        raise Unauthenticated("state message not authenticated by the state key")
    return body


def read_state_key(text: bytes) -> bytes:
    """A state key file's content: 32+ hex digits, or at least MIN_STATE_KEY raw bytes."""
    stripped = text.strip()
    try:
        key = bytes.fromhex(stripped.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = stripped
    if len(key) < MIN_STATE_KEY:
        raise ValueError(f"a state key has at least {MIN_STATE_KEY} bytes "
                         f"({2 * MIN_STATE_KEY} hex digits)")
    return key


def encode_audio(a: Audio) -> bytes:
    return (_prefix(KIND_AUDIO)
            + _AUDIO.pack(a.stream & U32, _clamp(a.incarnation, U32), _clamp(a.seq, U64),
                          _clamp(a.media_ms, U64), _clamp(a.codec, 0xFF), _clamp(a.rate, U32),
                          _clamp(a.channels, 0xFF), _clamp(a.samples, 0xFFFF))
            + a.data)


def encode(msg: Message) -> bytes:
    if isinstance(msg, Advert):
        return encode_advert(msg)
    if isinstance(msg, Request):
        return encode_request(msg)
    if isinstance(msg, Feedback):
        return encode_feedback(msg)
    if isinstance(msg, State):
        return encode_state(msg)
    if isinstance(msg, Audio):
        return encode_audio(msg)
    return encode_frame(msg)


# ------------------------------------------------------------------------------ decoding
class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, st: struct.Struct, what: str) -> tuple[int, ...]:
        if self.pos + st.size > len(self.data):
            raise ProtocolError(f"truncated {what} ({len(self.data)} bytes)")
        out = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return out

    def name(self) -> str:
        if self.pos >= len(self.data):
            raise ProtocolError("truncated viewer name")
        n = self.data[self.pos]
        raw = self.data[self.pos + 1:self.pos + 1 + n]
        if n > MAX_NAME or len(raw) != n:
            raise ProtocolError("bad viewer name length")
        self.pos += 1 + n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("viewer name is not UTF-8") from None

    def rest(self) -> bytes:
        return self.data[self.pos:]

    def end(self, what: str) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.pos} stray bytes after {what}")


def _resolution(w: int, h: int) -> Resolution:
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise ProtocolError(f"bad resolution {w}x{h}")
    return Resolution(w, h)


def _video_band(band: int) -> int:
    if not FIRST_RESOLUTION_BAND <= band < FIRST_RESOLUTION_BAND + MAX_RESOLUTIONS:
        raise ProtocolError(f"band {band} is not a resolution band")
    return band


def _scale(scale: int) -> int:
    if scale not in SCALES:
        raise ProtocolError(f"bad picture scale {scale} (one of {SCALES})")
    return scale


def decode(data: bytes) -> Message:
    """Parse one flowvideo message; :class:`ProtocolError` says what is wrong."""
    data = bytes(data)
    r = _Reader(data)
    magic, version, kind = r.take(_PREFIX, "header")
    if magic != MAGIC:  # type: ignore[comparison-overlap]
        raise ProtocolError("not a flowvideo message (bad magic)")
    if version != VERSION:
        raise ProtocolError(f"unsupported flowvideo version {version}")
    if kind == KIND_ADVERT:
        stream, inc, seq, period_ms, n = r.take(_ADVERT, "advert")
        if n > MAX_RESOLUTIONS:
            raise ProtocolError(f"advert lists {n} resolutions (max {MAX_RESOLUTIONS})")
        offers = []
        for _ in range(n):
            band, w, h, active, fps10, q, scale, codec = r.take(_OFFER, "offer")
            offers.append(Offer(_video_band(band), _resolution(w, h), bool(active),
                                fps10 / 10, q, _scale(scale), codec))
        r.end("advert")
        if period_ms == 0:
            raise ProtocolError("advert with a zero request period")
        return Advert(stream, inc, seq, period_ms / 1000, tuple(offers))
    if kind == KIND_REQUEST:
        name = r.name()
        band, flags = r.take(_REQUEST, "request")
        r.end("request")
        return Request(name, _video_band(band), bool(flags & REQUEST_KEY))
    if kind == KIND_FEEDBACK:
        name = r.name()
        band, dropped, delay_ms, flags, media_ms, rate = r.take(_FEEDBACK, "feedback")
        r.end("feedback")
        return Feedback(name, _video_band(band), dropped, delay_ms,
                        bool(flags & FEEDBACK_CONGESTED), media_ms, rate)
    if kind == KIND_STATE:
        stream, inc, server, media_ms, period_ms, n = r.take(_STATE, "state")
        if n > MAX_RESOLUTIONS:
            raise ProtocolError(f"state lists {n} encodings (max {MAX_RESOLUTIONS})")
        encs = []
        for _ in range(n):
            band, w, h, fps10, q, frames, scale = r.take(_STATE_ENC, "encoding")
            encs.append(EncodingState(_video_band(band), _resolution(w, h), fps10 / 10, q,
                                      frames, _scale(scale)))
        r.end("state")
        if period_ms == 0:
            raise ProtocolError("state with a zero period")
        return State(stream, inc, media_ms, period_ms / 1000, tuple(encs), server)
    if kind == KIND_FRAME:
        stream, inc, seq, media_ms, band, w, h, q, fps10, codec, flags = r.take(_FRAME,
                                                                                "frame")
        picture = r.rest()
        if len(picture) > MAX_FRAME_BYTES:
            raise ProtocolError(f"frame of {len(picture)} bytes (max {MAX_FRAME_BYTES})")
        if codec not in CODEC_NAMES:
            raise ProtocolError(f"unknown picture codec {codec}")
        if codec == CODEC_JPEG and not picture.startswith(b"\xff\xd8"):
            raise ProtocolError("frame picture is not a JPEG")
        if not picture:
            raise ProtocolError("frame without a picture")
        return Frame(stream, inc, seq, media_ms, _video_band(band), _resolution(w, h), q,
                     fps10 / 10, picture, codec, bool(flags & FRAME_KEY))
    if kind == KIND_AUDIO:
        stream, inc, seq, media_ms, codec, rate, channels, samples = r.take(_AUDIO, "audio")
        data = r.rest()
        if codec not in AUDIO_CODEC_NAMES:
            raise ProtocolError(f"unknown audio codec {codec}")
        if not 8000 <= rate <= 192000 or not 1 <= channels <= 8 or not data:
            raise ProtocolError(f"bad audio chunk ({rate} Hz, {channels} channels, "
                                f"{len(data)} bytes)")
        if len(data) > MAX_AUDIO_BYTES:
            raise ProtocolError(f"audio chunk of {len(data)} bytes (max {MAX_AUDIO_BYTES})")
        if codec == AUDIO_PCM and len(data) != 2 * channels * samples:
            raise ProtocolError("PCM audio chunk of the wrong length")
        return Audio(stream, inc, seq, media_ms, codec, rate, channels, samples, data)
    raise ProtocolError(f"unknown flowvideo message kind {kind}")
