"""flowvideo's sans-I/O parts with a fake clock: the message formats (and what they refuse),
the streamer core (requests start encoders, expiry stops them, overflow feedback lowers and
recovery raises the rate), the backup watch and takeover, the viewer core; plus the CLI's
help and one-line errors.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowvideo import protocol as P
from flowvideo.cli import main as cli_main
from flowvideo.protocol import Resolution
from flowvideo.sources import PatternSource, encode_jpeg, open_source
from flowvideo.streamer_core import (
    BackupWatch,
    Encode,
    RateChanged,
    Send,
    Started,
    Stopped,
    StreamConfig,
    StreamerCore,
)
from flowvideo.viewer_core import SendMsg, Show, Subscribe, ViewerCore, parse_want

HIGH, LOW = Resolution(320, 240), Resolution(80, 60)
JPEG = b"\xff\xd8" + b"x" * 50


def cfg(**kw: object) -> StreamConfig:
    base: dict[str, object] = dict(resolutions=(HIGH, LOW), fps=5.0, quality=80,
                                   request_period=1.0, expire_periods=3, recover_after=2.0,
                                   feedback_hold=0.5, min_fps=1.0, min_quality=20)
    base.update(kw)
    return StreamConfig(**base)  # type: ignore[arg-type]


def run_core(core: StreamerCore, t0: float, t1: float, step: float = 0.05,
             refresh: dict[int, float] | None = None) -> list[tuple[float, object]]:
    """Poll *core* from t0 to t1; *refresh* maps band -> request period of that band's
    viewer (one viewer per band, ``v<band>``: a viewer holds one band at a time)."""
    out: list[tuple[float, object]] = []
    last: dict[int, float] = {}
    t = t0
    while t <= t1 + 1e-9:
        for band, period in (refresh or {}).items():
            if t - last.get(band, -1e9) >= period:
                core.on_request(f"v{band}", band, t)
                last[band] = t
        out += [(t, a) for a in core.poll(t)]
        t = round(t + step, 6)
    return out


# ------------------------------------------------------------------------------ protocol
def test_every_message_round_trips() -> None:
    msgs = [
        P.Advert(7, 2, 9, 1.5, (P.Offer(40, HIGH, True, 7.5, 80), P.Offer(41, LOW, False, 5, 60))),
        P.Advert(7, 2, 9, 1.5, (P.Offer(40, HIGH, True, 7.5, 80, 4, P.CODEC_H264),)),
        P.Request("viewer-ä", 41),
        P.Request("v", 41, key=True),
        P.Feedback("v", 40, 12),
        P.Feedback("v", 40, 0, 1234, congested=True, media_ms=99, rate=12500),
        P.State(7, 2, 123456, 0.2, (P.EncodingState(40, HIGH, 2.5, 40, 99),), 0xABCDEF01),
        P.State(7, 2, 123456, 0.2, (P.EncodingState(40, HIGH, 2.5, 40, 99, 2),), 1),
        P.Frame(7, 2, 5, 1000, 41, LOW, 60, 5.0, JPEG),
        P.Frame(7, 2, 5, 1000, 41, LOW, 60, 5.0, b"\0\0\1h264", P.CODEC_H264, key=False),
    ]
    for m in msgs:
        assert P.decode(P.encode(m)) == m


@pytest.mark.parametrize("data, why", [
    (b"", "truncated header"),
    (b"XX\x01\x01", "bad magic"),
    (b"FV\x09\x01", "unsupported flowvideo version"),
    (b"FV\x02\x63", "unknown flowvideo message kind"),
    (b"FV\x02\x02\x01v\x05\x00", "not a resolution band"),
    (b"FV\x02\x02\x01v\x28\x00\x00", "stray bytes"),
    (b"FV\x02\x02\x05v", "bad viewer name length"),
    (b"FV\x01\x02\x01v\x28", "unsupported flowvideo version 1"),
    (P.encode_frame(P.Frame(1, 1, 1, 1, 40, HIGH, 50, 1, JPEG))[:-50][:20] + b"notjpeg",
     "truncated frame"),
    (P.encode_frame(P.Frame(1, 1, 1, 1, 40, HIGH, 50, 1, JPEG))[:38] + b"GIF89a",
     "not a JPEG"),
    (P.encode_frame(P.Frame(1, 1, 1, 1, 40, HIGH, 50, 1, JPEG, 9)), "unknown picture codec"),
    (P.encode_state(P.State(1, 1, 1, 1, (P.EncodingState(40, HIGH, 1, 1, 1, 3),))),
     "bad picture scale 3"),
    (P.encode_advert(P.Advert(1, 1, 1, 1.0, ()))[:-1] + b"\x20", "advert lists 32"),
])
def test_malformed_messages_are_refused_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(P.ProtocolError, match=why):
        P.decode(data)


@given(st.binary(max_size=80))
def test_decoding_garbage_raises_only_protocol_errors(data: bytes) -> None:
    for blob in (data, b"FV\x02" + data[:1] + data[1:]):
        try:
            P.decode(blob)
        except P.ProtocolError:
            pass


def test_resolution_lists_are_checked() -> None:
    assert P.parse_resolutions("320x240, 80x60") == (HIGH, LOW)
    for bad in ("", "320", "320x240,320x240", "0x10", "99999x1", ",".join(["8x8"] * 17)):
        with pytest.raises(ValueError):
            P.parse_resolutions(bad)
    assert parse_want("Lowest") == "lowest" and parse_want("80x60") == LOW


# ------------------------------------------------------------------------------ streamer core
def test_nothing_is_encoded_until_someone_asks_and_a_request_starts_that_band_only() -> None:
    core = StreamerCore(cfg(), 0.0)
    actions = run_core(core, 0.0, 2.0)
    assert not any(isinstance(a, Encode) for _, a in actions)
    adverts = [P.decode(a.payload) for _, a in actions if isinstance(a, Send)
               and a.band == P.BAND_ADVERT]
    assert adverts and all(not o.active for o in adverts[-1].offers)  # type: ignore[union-attr]
    assert core.on_request("v", 41, 2.0) == [Started(41, LOW, "v")]
    actions = run_core(core, 2.0, 4.0, refresh={41: 1.0})
    encodes = [a for _, a in actions if isinstance(a, Encode)]
    assert {e.band for e in encodes} == {41} and all(e.resolution == LOW for e in encodes)
    assert 9 <= len(encodes) <= 11  # 5 fps for 2 s
    assert [e.seq for e in encodes] == list(range(len(encodes)))


def test_a_resolution_stops_after_expire_periods_without_a_request() -> None:
    core = StreamerCore(cfg(), 0.0)
    core.on_request("v", 40, 0.0)
    actions = run_core(core, 0.0, 5.0, refresh={40: 1.0})  # refreshed: keeps running
    assert not any(isinstance(a, Stopped) for _, a in actions)
    actions = run_core(core, 5.05, 10.0)                     # the viewer is gone
    stops = [(t, a) for t, a in actions if isinstance(a, Stopped)]
    assert len(stops) == 1 and stops[0][1].band == 40
    assert 7.9 < stops[0][0] < 8.2  # last request at 5.0 + 3 periods of 1 s
    assert not any(isinstance(a, Encode) for t, a in actions if t > stops[0][0])
    assert core.on_request("x", 99, 10.0) == [] and core.counters["requests.unknown-band"] == 1


def test_overflow_feedback_lowers_that_band_and_recovery_raises_it_again() -> None:
    c = cfg(fps=8.0)
    core = StreamerCore(c, 0.0)
    core.on_request("slow", 40, 0.0)
    core.on_request("fine", 41, 0.0)
    assert core.on_feedback("slow", 40, 3, 1.0) == [RateChanged(40, 4.0, 80, "congestion")]
    assert core.on_feedback("slow", 40, 3, 1.2) == []       # the same episode (hold 0.5 s)
    assert core.on_feedback("slow", 40, 3, 1.8)[0].fps == 2.0
    assert core.on_feedback("slow", 40, 3, 2.4)[0].fps == 1.0
    lowered = core.on_feedback("slow", 40, 3, 3.0)           # at min fps: quality goes down
    assert lowered == [RateChanged(40, 1.0, 60, "congestion")]
    assert core.encoding(41).fps == 8.0 and core.encoding(41).cuts == 0  # type: ignore
    # the advertisement carries the lowered values
    advert = core.advert()
    assert advert.offer_for(HIGH).fps == 1.0 and advert.offer_for(HIGH).quality == 60  # type: ignore
    # frames of band 40 now come at about 1 fps
    actions = run_core(core, 3.0, 4.9, refresh={40: 1.0, 41: 1.0})
    assert sum(1 for _, a in actions if isinstance(a, Encode) and a.band == 40) <= 3
    # quiet: after recover_after the quality comes back first, then the rate step by step
    actions = run_core(core, 5.0, 30.0, refresh={40: 1.0, 41: 1.0})
    raises = [a for _, a in actions if isinstance(a, RateChanged)]
    assert raises[0] == RateChanged(40, 1.0, 80, "recovered")
    assert [r.fps for r in raises[1:]] == [3.0, 5.0, 7.0, 8.0]
    assert core.encoding(40).fps == 8.0 and core.encoding(40).quality == 80  # type: ignore


def test_key_pictures_come_on_join_and_request_but_at_most_one_per_key_interval() -> None:
    core = StreamerCore(cfg(fps=10.0, key_interval=0.5), 0.0)
    core.on_request("a", 41, 0.0)
    keys: list[float] = []
    t = 0.0
    while t < 3.0:
        if round(t * 100) % 10 == 0:   # a sender asking for a key picture every 0.1 s
            core.on_request("a", 41, t, key=True)
        if abs(t - 2.02) < 1e-9:
            core.on_request("b", 41, t)  # a new viewer joins
        keys += [t for a in core.poll(t) if isinstance(a, Encode) and a.key]
        t = round(t + 0.01, 6)
    assert keys[0] == 0.0                              # the start
    assert all(b - a >= 0.5 - 1e-9 for a, b in zip(keys, keys[1:])), keys
    assert 5 <= len(keys) <= 7                         # not 30: one per 0.5 s at most
    quiet = StreamerCore(cfg(fps=10.0), 0.0)
    quiet.on_request("a", 41, 0.0)
    late = [t for t in (x / 100 for x in range(300)) for a in quiet.poll(t)
            if isinstance(a, Encode) and a.key]
    assert late == [0.0]                               # nobody asks: no key picture


def test_feedback_for_an_idle_band_is_ignored() -> None:
    core = StreamerCore(cfg(), 0.0)
    assert core.on_feedback("v", 40, 5, 1.0) == []
    assert core.counters["feedback.ignored"] == 1


# ------------------------------------------------------------------------------ backup
def test_backup_takes_over_after_dead_after_and_continues_the_stream() -> None:
    c = cfg(state_period=0.2, dead_after=0.8)
    primary = StreamerCore(c, 0.0)
    primary.on_request("v", 41, 0.0)
    watch = BackupWatch(c, 0.0)
    last_state = None
    for t, a in run_core(primary, 0.0, 5.0, refresh={41: 1.0}):
        if isinstance(a, Send) and a.band == P.BAND_STATE:
            last_state = P.decode(a.payload)
            watch.on_state(last_state, t)  # type: ignore[arg-type]
        assert watch.poll(t) is None       # alive: never takes over
    assert isinstance(last_state, P.State) and watch.states >= 20
    # the primary dies at 5.0: the backup takes over once 0.8 s passed since the last state
    take = None
    t = 5.0
    while take is None:
        t = round(t + 0.01, 6)
        take = watch.poll(t)
    assert take.silent_for == pytest.approx(0.8, abs=0.011) and take.state == last_state
    backup = StreamerCore.resume(c, last_state, t, take.silent_for)
    assert backup.stream == primary.stream and backup.incarnation == primary.incarnation + 1
    assert abs(backup.media_ms(t) - primary.media_ms(t)) <= 60
    first = [a for a in backup.poll(t) if isinstance(a, Encode)]
    assert [a.band for a in first] == [41]
    assert first[0].seq >= primary.encoding(41).frames and first[0].key  # type: ignore
    # stated bound for the viewer's gap: the last frame before the death is at most one
    # frame period old, so the gap is below dead_after + state_period + 1/fps
    assert take.silent_for + c.state_period + 1 / c.fps < 2.0


@pytest.mark.parametrize("death", [5.0, 5.05, 5.1, 5.15, 5.2, 5.25, 5.3, 5.35])
def test_frame_numbers_and_media_time_move_on_across_a_takeover(death: float) -> None:
    """The primary sends frames after its last state reached the backup (up to a state
    period of them) and dies: the backup's first frame still comes after its last one, in
    number and in media time, at every phase of the death within the state period."""
    c = cfg(fps=10.0, state_period=0.2, dead_after=0.8)
    primary = StreamerCore(c, 0.0)
    primary.on_request("v", 41, 0.0)
    watch = BackupWatch(c, 0.0)
    shown: list[tuple[int, int]] = []  # (seq, media ms) of every frame the viewer got
    for t, a in run_core(primary, 0.0, death, step=0.01, refresh={41: 1.0}):
        if isinstance(a, Send) and a.band == P.BAND_STATE:
            watch.on_state(P.decode(a.payload), t)  # type: ignore[arg-type]
        elif isinstance(a, Encode):
            shown.append((a.seq, a.media_ms))
    t, take = death, None
    while take is None:
        t = round(t + 0.01, 6)
        take = watch.poll(t)
    assert take.state is not None
    backup = StreamerCore.resume(c, take.state, t, take.silent_for)
    backup.on_request("v", 41, t)
    for _, a in run_core(backup, t, t + 2.0, step=0.01, refresh={41: 1.0}):
        if isinstance(a, Encode):
            shown.append((a.seq, a.media_ms))
    seqs, media = [s for s, _ in shown], [m for _, m in shown]
    assert seqs == sorted(set(seqs)) and media == sorted(set(media)), shown


def test_of_two_primaries_the_lower_ranked_steps_down() -> None:
    c = cfg()
    old = StreamerCore(c, 0.0, server=9)
    taken = StreamerCore.resume(c, old.state(1.0), 2.0, 1.0, server=3)
    assert old.outranked_by(taken.state(2.0))           # a newer incarnation wins
    assert not taken.outranked_by(old.state(2.0))
    twin = StreamerCore.resume(c, old.state(1.0), 2.0, 1.0, server=7)
    assert taken.outranked_by(twin.state(2.0)) != twin.outranked_by(taken.state(2.0))
    assert not twin.outranked_by(twin.state(2.0))        # never by its own state
    fresh = StreamerCore(c, 5.0, server=0xFFFFFFFF)      # a restarted primary: incarnation 1
    assert fresh.outranked_by(taken.state(5.0))


def test_a_backup_with_no_primary_waits_longer_before_streaming_alone() -> None:
    watch = BackupWatch(cfg(dead_after=0.8, state_period=0.2), 0.0)
    assert watch.poll(3.9) is None
    take = watch.poll(4.0)
    assert take is not None and take.state is None


# ------------------------------------------------------------------------------ viewer core
def advert(active: bool = True, fps: float = 5.0) -> P.Advert:
    return P.Advert(1, 1, 1, 1.0, (P.Offer(40, HIGH, active, fps, 80),
                                   P.Offer(41, LOW, active, fps, 80)))


def frame(band: int = 41, res: Resolution = LOW, inc: int = 1, seq: int = 0) -> P.Frame:
    return P.Frame(1, inc, seq, seq * 200, band, res, 80, 5.0, JPEG)


def test_viewer_subscribes_to_its_resolution_and_refreshes_its_request() -> None:
    v = ViewerCore("v", "lowest", 0.0)
    assert v.poll(0.0) == []                               # nothing before an advert
    acts = v.on_advert(advert(), 0.1)
    assert acts[0] == Subscribe(41, LOW)
    assert isinstance(acts[1], SendMsg) and acts[1].band == P.BAND_REQUEST
    assert P.decode(acts[1].payload) == P.Request("v", 41, key=True)  # a key picture on join
    assert v.on_advert(advert(), 0.2) == []                # same choice: nothing new
    assert v.poll(0.5) == [] and len(v.poll(1.1)) == 1     # refresh every request period
    assert ViewerCore("h", "highest", 0.0).on_advert(advert(), 0)[0] == Subscribe(40, HIGH)
    assert ViewerCore("x", Resolution(1, 1), 0.0).on_advert(advert(), 0) == []


def test_viewer_checks_frames_and_counts_takeovers_gaps_and_underruns() -> None:
    v = ViewerCore("v", LOW, 0.0, playout=1.0)
    v.on_advert(advert(), 0.0)
    assert isinstance(v.on_frame(frame(), 0.2)[0], Show)
    assert v.on_frame(frame(band=40, res=HIGH), 0.3) == [] and v.stats.wrong_band == 1
    assert v.on_frame(frame(res=HIGH), 0.3) == [] and v.stats.wrong_size == 1
    assert v.on_frame(frame(inc=2, seq=5), 1.0)            # a takeover, gap 0.8 s
    assert v.stats.takeovers == 1 and v.stats.underruns == 0
    assert v.on_frame(frame(inc=1, seq=6), 1.1) == [] and v.stats.stale == 1
    v.on_frame(frame(inc=2, seq=7), 2.5)                   # 1.5 s: longer than the playout
    assert v.stats.underruns == 1 and v.stats.max_gap == pytest.approx(1.5)
    fb = v.on_overflow(4, 3.0)
    report = P.decode(fb[0].payload)  # type: ignore[union-attr]
    assert isinstance(report, P.Feedback) and (report.viewer, report.band, report.dropped) \
        == ("v", 41, 4)


def feedbacks(actions: list[object]) -> list[P.Feedback]:
    return [m for m in (P.decode(a.payload) for a in actions if isinstance(a, SendMsg))
            if isinstance(m, P.Feedback)]


def test_viewer_measures_queueing_delay_and_reports_it_for_its_band() -> None:
    v = ViewerCore("v", LOW, 0.0, delay_limit=0.3, report_interval=0.2)
    v.on_advert(advert(), 0.0)
    # frames every 200 ms of media time; the path adds 50 ms, then a queue builds up
    t, seq, reports = 0.05, 0, []
    for extra in [0, 0, 0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]:
        reports += feedbacks(v.on_frame(frame(seq=seq), t + extra))
        seq, t = seq + 1, t + 0.2
    assert v.stats.delay == pytest.approx(0.6) and v.stats.max_delay == pytest.approx(0.6)
    assert [r.delay_ms for r in reports] == [300, 400, 500, 600]
    assert all(r.band == 41 and r.dropped == 0 and not r.congested for r in reports)
    # the clocks need not agree: an offset of an hour changes nothing
    w = ViewerCore("w", LOW, 0.0)
    w.on_advert(advert(), 0.0)
    for i in range(5):
        assert feedbacks(w.on_frame(frame(seq=i), 3600 + i * 0.2)) == []
    assert w.stats.delay == pytest.approx(0.0)


def test_viewer_counts_missing_numbers_and_a_routers_congestion_fault() -> None:
    v = ViewerCore("v", LOW, 0.0, report_interval=0.2)
    v.on_advert(advert(), 0.0)
    v.on_frame(frame(seq=0), 0.0)
    assert v.on_fault(True, 0.1) == []            # a fault alone is someone else's link
    reports = feedbacks(v.on_frame(frame(seq=4), 0.8))  # 1, 2, 3 were dropped on the way
    assert v.stats.lost == 3 and v.stats.congested == 1
    assert [(r.dropped, r.congested) for r in reports] == [(3, True)]
    assert v.on_fault(False, 0.9) == []            # other faults are not about the rate
    v.on_frame(frame(inc=2, seq=9), 1.8)           # a takeover skips numbers: no loss
    assert v.stats.lost == 3


def test_viewer_reports_a_stall_after_a_congestion_fault() -> None:
    """A router shedding a picture's fragments can starve a band: no picture, no missing
    number to see. After a link-congested fault, pictures that stop are reported."""
    v = ViewerCore("v", LOW, 0.0)
    v.on_advert(advert(fps=5.0), 0.0)
    v.on_frame(frame(seq=0), 0.0)
    assert feedbacks(v.poll(3.0)) == []                  # silent, but no fault: a streamer gone?
    v.on_fault(True, 3.0)
    assert v.next_deadline() is not None and v.next_deadline() <= 3.0  # type: ignore
    reports = feedbacks(v.poll(3.1))
    assert [(r.dropped, r.congested, r.media_ms) for r in reports] == [(16, True, 0)]
    assert feedbacks(v.poll(4.0)) == []                  # one per STALL_REPORT
    assert len(feedbacks(v.poll(5.2))) == 1 and v.stats.stalls == 2
    assert feedbacks(v.poll(9.0)) == []                  # the fault is long past


def test_viewer_never_goes_back_and_waits_for_a_key_picture_of_an_inter_frame_codec() -> None:
    v = ViewerCore("v", LOW, 0.0)
    v.on_advert(advert(), 0.0)
    assert v.on_frame(frame(seq=5), 0.0)
    assert v.on_frame(frame(inc=2, seq=5), 0.9) == [] and v.stats.backwards == 1
    assert v.on_frame(frame(inc=2, seq=7, res=Resolution(40, 30)), 1.0)  # scaled: admitted
    assert v.on_frame(frame(inc=2, seq=8, res=Resolution(40, 31)), 1.2) == []
    assert v.stats.wrong_size == 1

    h = ViewerCore("h", LOW, 0.0)
    offers = (P.Offer(41, LOW, True, 5.0, 80, 1, P.CODEC_H264),)
    acts = h.on_advert(P.Advert(1, 1, 1, 1.0, offers), 0.0)
    assert P.decode(acts[1].payload) == P.Request("h", 41, key=True)  # type: ignore

    def pic(seq: int, key: bool) -> P.Frame:
        return P.Frame(1, 1, seq, seq * 200, 41, LOW, 80, 5.0, b"\0\0\1x", P.CODEC_H264, key)
    assert h.on_frame(pic(0, False), 0.0) == [] and h.stats.waiting_key == 1
    assert isinstance(h.on_frame(pic(1, True), 0.2)[-1], Show)
    assert isinstance(h.on_frame(pic(2, False), 0.4)[-1], Show)
    acts = h.on_frame(pic(4, False), 0.8)           # 3 is lost: ask for a key picture
    assert not any(isinstance(a, Show) for a in acts)
    requests = [P.decode(a.payload) for a in acts if isinstance(a, SendMsg)
                and a.band == P.BAND_REQUEST]
    assert requests == [P.Request("h", 41, key=True)]
    assert isinstance(h.on_frame(pic(5, True), 1.0)[-1], Show)


# ------------------------------------------------------------------------------ sources, CLI
def test_pattern_source_moves_and_encodes_to_each_size() -> None:
    src = open_source("pattern:160x120")
    assert isinstance(src, PatternSource)
    a, b = src.grab(0), src.grab(1500)
    assert a.size == (160, 120) and a.tobytes() != b.tobytes()
    jpeg = encode_jpeg(a, LOW, 50)
    assert jpeg.startswith(b"\xff\xd8")
    for bad in ("nope", "screen:", "file:"):
        with pytest.raises(Exception, match="source"):
            open_source(bad)


def test_file_source_plays_an_animated_image_in_a_loop(tmp_path) -> None:
    from PIL import Image

    frames = [Image.new("RGB", (40, 30), colour) for colour in ("red", "green", "blue")]
    path = tmp_path / "clip.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    src = open_source(f"file:{path}")
    picks = [src.grab(ms).getpixel((5, 5)) for ms in (0, 150, 250, 350)]
    assert picks[0] != picks[1] != picks[2] and picks[3] == picks[0]  # 300 ms loop
    with pytest.raises(Exception, match="cannot read"):
        open_source(f"file:{tmp_path / 'missing.gif'}")


def test_cli_help_explains_and_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "flowvideo.cli", "serve", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "advertisement" in out.stdout and "--backup" in out.stdout
    with pytest.raises(SystemExit) as exc:
        cli_main(["watch", "--flow", "1:2:3", "--resolution", "big"])
    assert exc.value.code == 2 and "bad resolution 'big'" in capsys.readouterr().err
    # nothing listens on port 1: one line naming the router
    assert cli_main(["serve", "--router", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("flowvideo serve: error:") and "\n" not in err
    assert cli_main(["serve", "--router", "127.0.0.1:1", "--backup"]) == 1
    assert "--backup needs --flow" in capsys.readouterr().err
    assert cli_main(["serve", "--router", "127.0.0.1:1", "--source", "screen::987"]) == 1
    err = capsys.readouterr().err.strip()
    assert "cannot grab X display :987" in err or "XCB" in err
