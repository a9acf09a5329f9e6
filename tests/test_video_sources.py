"""Real sources and sound: video files (MP4, MKV, WebM, made here with PyAV) played by media
time and looped, their sound tracks, a camera that is not there failing in one line; sound on
its own band, scheduled by the streamer core on the pictures' media clock (virtual time),
and on real routers a viewer getting the file's pictures and sound with the audio/video skew
under 100 ms.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from PIL import Image

from flowvideo import protocol as P
from flowvideo.audio import AudioDecoder, FileAudioSource, PcmEncoder, ToneSource
from flowvideo.protocol import Resolution
from flowvideo.sources import SourceError, open_source
from flowvideo.streamer_core import EncodeAudio, StreamConfig, StreamerCore
from flowvideo.viewer import Viewer
from flowvideo.viewer_core import Play, ViewerCore

from .rawep import addr, run, until
from .test_video import star, streaming

av = pytest.importorskip("av", reason="PyAV is in the test extra (.ci/install)")

COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (230, 230, 30)]  # one per 500 ms
FORMATS = [("mp4", "libx264", "aac"), ("mkv", "libx264", "libopus"),
           ("webm", "libvpx", "libopus")]


def make_film(path: Path, vcodec: str, acodec: str, seconds: float = 2.0) -> None:
    """A film of 10 fps pictures in one colour per 500 ms, and a 440 Hz tone."""
    import numpy as np

    with av.open(str(path), "w") as c:
        v = c.add_stream(vcodec, rate=10)
        v.width, v.height, v.pix_fmt = 160, 120, "yuv420p"
        a = c.add_stream(acodec, rate=48000)
        a.layout = "mono"
        for i in range(round(seconds * 10)):
            img = np.zeros((120, 160, 3), dtype=np.uint8)
            img[:, :] = COLOURS[(i // 5) % len(COLOURS)]
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            for p in v.encode(f):
                c.mux(p)
        for p in v.encode():
            c.mux(p)
        n, size = 0, a.codec_context.frame_size or 960
        fmt = a.codec_context.format.name
        while n < seconds * 48000:
            t = (np.arange(size) + n) / 48000
            wave = np.sin(2 * np.pi * 440 * t) * 0.3
            samples = (wave * 32767).astype(np.int16) if fmt.startswith("s16") \
                else wave.astype(np.float32)
            af = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format=fmt.rstrip("p")
                                            if not fmt.endswith("p") else fmt, layout="mono")
            af.sample_rate, af.pts = 48000, n
            for p in a.encode(af):
                c.mux(p)
            n += size
        for p in a.encode():
            c.mux(p)


def colour_at(im: Image.Image) -> int:
    """Which of COLOURS *im* shows (the nearest)."""
    px = im.convert("RGB").resize((1, 1)).getpixel((0, 0))
    return min(range(len(COLOURS)),
               key=lambda i: sum((a - b) ** 2 for a, b in zip(px, COLOURS[i])))  # type: ignore


def level(pcm: bytes) -> int:
    return max((abs(x) for x in struct.unpack(f"<{len(pcm) // 2}h", pcm)), default=0)


@pytest.fixture(scope="module")
def films(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("films")
    out = {}
    for ext, vcodec, acodec in FORMATS:
        out[ext] = d / f"film.{ext}"
        make_film(out[ext], vcodec, acodec)
    return out


@pytest.mark.parametrize("ext", [f[0] for f in FORMATS])
def test_a_video_file_plays_by_media_time_and_loops(films: dict[str, Path], ext: str) -> None:
    src = open_source(f"file:{films[ext]}")
    assert type(src).__name__ == "VideoFileSource"
    seen = [colour_at(src.grab(ms)) for ms in (0, 250, 600, 1100, 1600, 1900)]
    assert seen == [0, 0, 1, 2, 3, 3]
    assert colour_at(src.grab(2100)) == 0 and colour_at(src.grab(2700)) == 1  # looped
    assert src.grab(0).size == (160, 120)
    sound = FileAudioSource(str(films[ext]))
    assert level(sound.read(300, 1600, 16000)) > 5000          # the tone, resampled
    assert abs(sound.loop_ms - 2000) < 100


def test_missing_files_and_cameras_fail_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-film.mp4"
    bad.write_bytes(b"nothing here")
    for spec in (f"file:{bad}", f"file:{tmp_path / 'missing.mkv'}", "camera:/dev/no-camera"):
        with pytest.raises(SourceError) as info:
            open_source(spec)
        assert "\n" not in str(info.value)


def test_a_capture_device_gives_its_newest_picture() -> None:
    """The camera path with FFmpeg's generated test picture as the device (no camera on
    this machine): the reader thread keeps the newest picture, which changes."""
    from flowvideo.avsources import CameraSource

    cam = open_source("camera:testsrc=size=160x120:rate=20,realtime@lavfi")
    assert isinstance(cam, CameraSource)
    try:
        first = cam.grab(0).copy()
        assert first.size == (160, 120)
        assert cam.wait_picture(cam.pictures, 10), "no newer picture came"
        assert cam.grab(0).tobytes() != first.tobytes(), "the picture never changed"
    finally:
        cam.close()


def test_the_core_sends_sound_in_chunks_on_the_pictures_media_clock() -> None:
    cfg = StreamConfig(resolutions=(Resolution(80, 60),), fps=5.0, audio=True,
                       audio_chunk_ms=40)
    core = StreamerCore(cfg, 0.0)
    t, chunks = 0.0, []
    while t < 1.0:  # nobody watches: no sound either
        assert not [a for a in core.poll(t) if isinstance(a, EncodeAudio)]
        t = round(t + 0.01, 6)
    core.on_request("v", 40, t)
    while t < 3.0:
        chunks += [(t, a) for a in core.poll(t) if isinstance(a, EncodeAudio)]
        t = round(t + 0.01, 6)
    media = [a.media_ms for _, a in chunks]
    assert [a.seq for _, a in chunks] == list(range(len(chunks)))
    assert media == list(range(media[0], media[0] + 40 * len(chunks), 40))  # no gap
    assert 45 <= len(chunks) <= 51
    # each chunk leaves once its last sample exists, no later than one poll after
    for at, a in chunks:
        assert 0 <= at - core.clock_of(a.media_ms + a.ms) <= 0.0101


def test_the_viewer_measures_audio_video_skew() -> None:
    v = ViewerCore("v", Resolution(80, 60), 0.0)
    v.on_advert(P.Advert(1, 1, 1, 1.0, (P.Offer(40, Resolution(80, 60), True, 5, 80),)), 0)
    v.on_frame(P.Frame(1, 1, 0, 1000, 40, Resolution(80, 60), 80, 5, b"\xff\xd8"), 1.05)
    chunk = P.Audio(1, 1, 7, 1000, P.AUDIO_PCM, 16000, 1, 640, b"\0" * 1280)  # 40 ms
    assert v.on_audio(chunk, 1.12) == [Play(chunk)]
    # the sound's lateness 1.12 - 1.04, the picture's 1.05 - 1.0: 30 ms behind
    assert v.stats.av_skew == pytest.approx(0.03) and v.stats.audio_chunks == 1
    v.on_audio(P.Audio(1, 1, 10, 1120, P.AUDIO_PCM, 16000, 1, 640, b"\0" * 1280), 1.2)
    assert v.stats.audio_lost == 2
    assert v.on_audio(chunk, 1.3) == [] and v.stats.backwards == 1


@pytest.mark.parametrize("audio_codec", [P.AUDIO_OPUS, P.AUDIO_PCM])
def test_a_film_with_its_sound_over_routers_stays_in_sync(films: dict[str, Path],
                                                          audio_codec: int) -> None:
    res = Resolution(160, 120)
    cfg = StreamConfig(resolutions=(res,), fps=10.0, quality=80, request_period=0.5,
                       advert_period=0.3, audio=True)

    async def main() -> None:
        pictures: list[tuple[int, int]] = []   # (media ms, colour)
        sound: list[P.Audio] = []
        async with star() as (r0, _r1, r2), \
                streaming(r0, cfg, open_source(f"file:{films['mp4']}"), fragment_size=4000,
                          audio=FileAudioSource(str(films["mp4"])), audio_codec=audio_codec
                          ) as (streamer, flow):
            async with Viewer([addr(r2)], flow, res, name="film", audio=True,
                              on_frame=lambda f: pictures.append(
                                  (f.media_ms, colour_at(Image.open(io.BytesIO(
                                      f.picture))))),
                              on_audio=sound.append) as viewer:
                await until(lambda: len(sound) >= 75 and len(pictures) >= 30, 30,
                            "3 s of sound and pictures")
                stats = viewer.stats
                core = streamer.core
                assert core is not None
                print(f"\nav skew: max {stats.max_av_skew * 1000:.0f} ms over "
                      f"{stats.audio_chunks} chunks ({P.AUDIO_CODEC_NAMES[audio_codec]})")
                assert stats.max_av_skew < 0.1
                assert stats.audio_lost == 0
        # the pictures are the film's at their media time (a colour per 500 ms, looped
        # every 2 s); allow the one picture at each change
        wrong = [(ms, c) for ms, c in pictures if c != (ms % 2000) // 500
                 and ms % 500 > 100]
        assert not wrong, wrong
        dec = AudioDecoder()
        pcm = b"".join(dec.decode(c) for c in sound[5:])
        assert level(pcm) > 5000 and dec.errors == 0
        media = [c.media_ms for c in sound]
        assert media == sorted(media)
    run(main(), 90)


def test_tone_and_pcm_need_nothing_more() -> None:
    pcm = ToneSource().read(0, 1600, 16000)
    assert len(pcm) == 3200 and level(pcm) > 5000
    assert level(ToneSource().read(500, 1600, 16000)) == 0   # between beeps
    assert PcmEncoder().encode(pcm) == pcm
    msg = P.Audio(1, 2, 3, 40, P.AUDIO_PCM, 16000, 1, 1600, pcm)
    assert P.decode(P.encode(msg)) == msg
    with pytest.raises(P.ProtocolError, match="wrong length"):
        P.decode(P.encode(P.Audio(1, 2, 3, 40, P.AUDIO_PCM, 16000, 1, 99, pcm)))
