"""Sound for a stream: sources, the audio encoders and decoder.

Audio goes on its own band (:data:`~flowvideo.protocol.BAND_AUDIO`), in chunks of
``chunk_ms`` (40 ms) stamped with the media time of their first sample: the same media clock
as the pictures', so a viewer can keep the two together (its core measures the skew). A
chunk leaves once all its samples exist, that is ``chunk_ms`` after its media time.

Sources give 16-bit samples for a span of media time, at the rate the encoder asks for:

* :class:`ToneSource`: a 440 Hz beep for the first 200 ms of every media second (no extra
  package); with the test pattern it makes a stream to check lip sync by ear;
* :class:`FileAudioSource`: the sound track of a video file (PyAV decodes and resamples it;
  looped with the file, as :class:`~flowvideo.avsources.VideoFileSource` loops the picture).

Encoders: :class:`PcmEncoder` (16 kHz mono, no extra package: 256 kbit/s) and
:class:`OpusEncoder` (48 kHz mono, 32 kbit/s, PyAV's libopus; 20 ms packets, each after its
2-byte length). :class:`AudioDecoder` gives PCM back.

Imports the standard library, PyAV (for Opus and files only) and :mod:`flowvideo.protocol`.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Protocol

from . import protocol as P

OPUS_RATE = 48000
OPUS_FRAME = 960          #: samples of one 20 ms Opus packet
PCM_RATE = 16000
MAX_FILE_SECONDS = 600    #: a file's sound is held in memory: ten minutes at most


class AudioError(RuntimeError):
    """Audio that cannot be read or encoded (the message is one line)."""


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise AudioError("Opus and the sound of files need PyAV: pip install "
                         "'flownet[video]'") from None
    return av


class AudioSource(Protocol):
    name: str

    def read(self, media_ms: int, samples: int, rate: int) -> bytes:
        """*samples* mono 16-bit little-endian samples at *rate* from *media_ms* on."""
        ...


class ToneSource:
    """A beep (440 Hz) for the first ``beep_ms`` of every media second."""

    name = "tone"

    def __init__(self, beep_ms: int = 200, level: float = 0.3) -> None:
        self.beep_ms = beep_ms
        self.level = level

    def read(self, media_ms: int, samples: int, rate: int) -> bytes:
        start = media_ms * rate // 1000
        out = []
        for n in range(start, start + samples):
            t = n / rate
            on = (n * 1000 // rate) % 1000 < self.beep_ms
            out.append(round(32767 * self.level * math.sin(2 * math.pi * 440 * t)) if on
                       else 0)
        return struct.pack(f"<{samples}h", *out)


class FileAudioSource:
    """A file's sound track, mono, at the rate first asked for, looped every ``loop_ms``
    (the container's duration, so that it loops with the picture)."""

    def __init__(self, path: str) -> None:
        self.av = _av()
        self.path = path
        self.name = f"sound of {path}"
        try:
            with self.av.open(path) as c:
                if not c.streams.audio:
                    raise AudioError(f"{path} has no sound track")
                self.loop_ms = max(1, (c.duration or 0) // 1000)
        except (self.av.error.FFmpegError, OSError) as exc:
            raise AudioError(f"cannot read {path}: {exc}") from None
        self._rate: int | None = None
        self._pcm = b""

    def _load(self, rate: int) -> None:
        av = self.av
        resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        parts: list[bytes] = []
        limit = MAX_FILE_SECONDS * rate * 2
        with av.open(self.path) as c:
            for frame in c.decode(audio=0):
                for out in resampler.resample(frame):
                    parts.append(bytes(out.planes[0])[:out.samples * 2])
                if sum(map(len, parts)) > limit:
                    break
            for out in resampler.resample(None):
                parts.append(bytes(out.planes[0])[:out.samples * 2])
        pcm = b"".join(parts)[:limit]
        loop = self.loop_ms * rate // 1000 * 2
        self._pcm = pcm[:loop].ljust(loop, b"\0") if loop else pcm
        self._rate = rate

    def read(self, media_ms: int, samples: int, rate: int) -> bytes:
        if self._rate != rate:
            self._load(rate)
        if not self._pcm:
            return b"\0" * (2 * samples)
        size = len(self._pcm)
        start = (media_ms * rate // 1000 * 2) % size
        out = bytearray()
        while len(out) < 2 * samples:
            take = min(2 * samples - len(out), size - start)
            out += self._pcm[start:start + take]
            start = 0
        return bytes(out)


class AudioEncoder(Protocol):
    codec: int
    rate: int

    def encode(self, pcm: bytes) -> bytes: ...


class PcmEncoder:
    codec, rate = P.AUDIO_PCM, PCM_RATE

    def encode(self, pcm: bytes) -> bytes:
        return pcm


class OpusEncoder:
    """Opus at 48 kHz mono, 32 kbit/s, 20 ms packets (a chunk is a whole number of them)."""

    codec, rate = P.AUDIO_OPUS, OPUS_RATE

    def __init__(self, bitrate: int = 32000) -> None:
        av = self.av = _av()
        if "libopus" not in av.codecs_available:
            raise AudioError("this PyAV has no libopus")
        ctx = av.CodecContext.create("libopus", "w")
        ctx.sample_rate = OPUS_RATE
        ctx.layout = "mono"
        ctx.format = "s16"
        ctx.bit_rate = bitrate
        ctx.options = {"application": "lowdelay", "frame_duration": "20"}
        ctx.open()
        self._ctx = ctx
        self._pts = 0

    def encode(self, pcm: bytes) -> bytes:
        out = bytearray()
        for at in range(0, len(pcm) - 2 * OPUS_FRAME + 1, 2 * OPUS_FRAME):
            frame = self.av.AudioFrame(format="s16", layout="mono", samples=OPUS_FRAME)
            frame.planes[0].update(pcm[at:at + 2 * OPUS_FRAME])
            frame.sample_rate = OPUS_RATE
            frame.pts = self._pts
            self._pts += OPUS_FRAME
            for packet in self._ctx.encode(frame):
                data = bytes(packet)
                out += struct.pack(">H", len(data)) + data
        return bytes(out)


def make_audio_encoder(codec: int) -> AudioEncoder:
    return PcmEncoder() if codec == P.AUDIO_PCM else OpusEncoder()


def opus_available() -> bool:
    try:
        return "libopus" in _av().codecs_available
    except AudioError:
        return False


class AudioDecoder:
    """Chunks back to mono 16-bit PCM (what a player plays; the tests check the sound)."""

    def __init__(self) -> None:
        self._ctx: Any = None
        self.errors = 0

    def decode(self, chunk: P.Audio) -> bytes:
        if chunk.codec == P.AUDIO_PCM:
            return chunk.data
        av = _av()
        if self._ctx is None:
            self._ctx = av.CodecContext.create("opus", "r")
            self._ctx.sample_rate = OPUS_RATE
            self._ctx.layout = "mono"
        out = bytearray()
        data, at = chunk.data, 0
        resampler = av.AudioResampler(format="s16", layout="mono", rate=OPUS_RATE)
        while at + 2 <= len(data):
            (n,) = struct.unpack_from(">H", data, at)
            packet = data[at + 2:at + 2 + n]
            at += 2 + n
            try:
                for frame in self._ctx.decode(av.Packet(packet)):
                    for pcm in resampler.resample(frame):
                        out += bytes(pcm.planes[0])[:pcm.samples * 2]
            except (av.error.FFmpegError, ValueError):
                self.errors += 1
        return bytes(out)
