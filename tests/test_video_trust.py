"""What senders on a video flow can make the streamer do (issue 26), on the sans-I/O cores
with a fake clock, plus fuzzing of the control decoders and of the cores, and the attacks on
a real router: a forged state does not make a keyed primary step down, and one with
incarnation 0xFFFFFFFF does not crash an unkeyed one."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowlib
from flowvideo import protocol as P
from flowvideo.protocol import Resolution
from flowvideo.sources import PatternSource
from flowvideo.streamer import Streamer
from flowvideo.streamer_core import (
    BackupWatch,
    Encode,
    RateChanged,
    Send,
    Started,
    Stopped,
    StreamConfig,
    StreamerCore,
    read_state,
)
from flowvideo.viewer_core import MIN_REQUEST_PERIOD, SendMsg, ViewerCore

from .rawep import addr, mesh, run, until

HIGH, MID, LOW = Resolution(320, 240), Resolution(160, 120), Resolution(80, 60)
BANDS = [P.band_of(i) for i in range(3)]
KEY = bytes(range(32))
JPEG = b"\xff\xd8" + b"x" * 20


def cfg(**kw: object) -> StreamConfig:
    base: dict[str, object] = dict(resolutions=(HIGH, MID, LOW), fps=8.0, quality=80,
                                   request_period=1.0, expire_periods=3, recover_after=2.0,
                                   feedback_hold=0.5, min_fps=1.0, min_quality=20)
    base.update(kw)
    return StreamConfig(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ requests
def test_one_viewer_cannot_start_every_encoder() -> None:
    core = StreamerCore(cfg(), 0.0)
    for band in BANDS:
        core.on_request("mallory", band, 0.0)
    assert [e.band for e in core.active()] == [BANDS[2]]  # it holds one band: the last
    assert core.counters["requests.viewer-moved"] == 2
    assert not any(isinstance(a, Encode) and a.band != BANDS[2] for a in core.poll(0.01))


def test_a_viewer_switching_resolution_releases_the_old_one_at_once() -> None:
    core = StreamerCore(cfg(), 0.0)
    core.on_request("v", BANDS[0], 0.0)
    core.on_request("w", BANDS[0], 0.0)
    core.on_request("v", BANDS[1], 0.5)
    assert {e.band for e in core.active()} == {BANDS[0], BANDS[1]}  # w still watches 0
    stops = [a for a in core.on_request("w", BANDS[2], 0.6) if isinstance(a, Stopped)]
    assert [s.band for s in stops] == [BANDS[0]]
    assert {e.band for e in core.active()} == {BANDS[1], BANDS[2]}


def test_invented_names_are_bounded_by_max_active_and_max_viewers() -> None:
    core = StreamerCore(cfg(max_active=1, max_viewers=3), 0.0)
    for i, band in enumerate(BANDS):
        core.on_request(f"sybil-{i}", band, 0.0)
    assert len(core.active()) == 1 and core.counters["requests.max-active"] == 2
    for i in range(10):
        core.on_request(f"crowd-{i}", BANDS[0], 0.1)
    enc = core.encoding(BANDS[0])
    assert enc is not None and len(enc.viewers) == 3
    assert core.counters["requests.viewers-full"] == 8
    # names that went silent make room again
    core.poll(3.5)
    assert core.on_request("late", BANDS[0], 3.5) == [Started(BANDS[0], HIGH, "late")]


# ------------------------------------------------------------------------------ feedback
def test_one_viewer_cannot_cut_a_band_others_watch() -> None:
    core = StreamerCore(cfg(), 0.0)
    for v in ("alice", "bob", "mallory"):
        core.on_request(v, BANDS[0], 0.0)
    assert core.on_feedback("mallory", BANDS[0], 5, 1.0) == []
    assert core.on_feedback("mallory", BANDS[0], 5, 1.6) == []  # repeating does not add up
    enc = core.encoding(BANDS[0])
    assert enc is not None and (enc.fps, enc.quality) == (8.0, 80)
    assert core.counters["feedback.below-share"] == 2
    # most of the band's viewers overflowing is a real overflow: cut
    assert core.on_feedback("alice", BANDS[0], 5, 1.7) == \
        [RateChanged(BANDS[0], 4.0, 80, "congestion")]


def test_feedback_from_a_non_viewer_of_the_band_is_ignored() -> None:
    core = StreamerCore(cfg(), 0.0)
    core.on_request("alice", BANDS[0], 0.0)
    core.on_request("mallory", BANDS[1], 0.0)
    for t in range(1, 30):
        assert core.on_feedback("mallory", BANDS[0], 9, t / 10) == []
        assert core.on_feedback("stranger", BANDS[0], 9, t / 10) == []
    enc = core.encoding(BANDS[0])
    assert enc is not None and (enc.fps, enc.quality) == (8.0, 80)
    assert core.counters["feedback.not-a-viewer"] == 58


def test_a_viewer_alone_on_its_band_is_heard_at_once() -> None:
    core = StreamerCore(cfg(), 0.0)
    core.on_request("slow", BANDS[2], 0.0)
    assert core.on_feedback("slow", BANDS[2], 3, 1.0) == \
        [RateChanged(BANDS[2], 4.0, 80, "congestion")]


def test_one_viewer_cannot_keep_a_cut_band_from_recovering() -> None:
    core = StreamerCore(cfg(), 0.0)
    for v in ("alice", "bob", "mallory"):
        core.on_request(v, BANDS[0], 0.0)
    core.on_feedback("alice", BANDS[0], 5, 1.0)
    assert core.on_feedback("bob", BANDS[0], 5, 1.0)  # a real episode: cut to 4 fps
    t, raised = 1.0, []
    while t < 6.0:
        t = round(t + 0.1, 6)
        core.on_feedback("mallory", BANDS[0], 5, t)
        for v in ("alice", "bob", "mallory"):
            if round(t * 10) % 5 == 0:
                core.on_request(v, BANDS[0], t)
        raised += [a for a in core.poll(t) if isinstance(a, RateChanged)]
    assert raised and raised[0].why == "recovered"


# ------------------------------------------------------------------------------ state
def state(inc: int = 5, server: int = 77, media_ms: int = 1000, period: float = 0.2,
          encs: tuple[P.EncodingState, ...] = ()) -> P.State:
    return P.State(0xABC, inc, media_ms, period, encs, server)


def test_with_a_state_key_only_sealed_states_are_believed() -> None:
    keyed = cfg(state_key=KEY)
    primary = StreamerCore(keyed, 0.0, server=1)
    sealed = [a.payload for a in primary.poll(0.0) if isinstance(a, Send)
              and a.band == P.BAND_STATE]
    assert read_state(keyed, sealed[0]).server == 1
    forged = P.encode_state(state(inc=0xFFFFFFFF))
    for bad in (forged, P.seal_state(forged, b"another key of 16+ bytes"), sealed[0][:-1],
                sealed[0][:-32] + bytes(32)):
        with pytest.raises(P.Unauthenticated):
            read_state(keyed, bad)
    assert read_state(cfg(), forged).incarnation == 0xFFFFFFFF  # unkeyed: believed
    with pytest.raises(ValueError):
        cfg(state_key=b"short")
    assert "state_key" not in repr(keyed) or KEY.hex() not in repr(keyed)
    assert P.read_state_key(KEY.hex().encode() + b"\n") == KEY
    with pytest.raises(ValueError):
        P.read_state_key(b"abcd")


def test_a_replayed_state_is_no_sign_of_life() -> None:
    watch = BackupWatch(cfg(), 0.0)
    old = state(media_ms=1000)
    watch.on_state(old, 0.0)
    watch.on_state(state(media_ms=1200), 0.2)
    for t in (0.4, 0.6, 0.8, 1.0):
        watch.on_state(old, t)  # an attacker replays what it recorded
    assert watch.stale == 4 and watch.last_heard == 0.2
    assert watch.poll(1.01) is not None  # the primary is silent since 0.2: take over


def test_a_state_claiming_a_huge_period_does_not_stall_the_backup_for_ever() -> None:
    watch = BackupWatch(cfg(dead_after=0.8), 0.0)
    watch.on_state(state(period=4_000_000.0), 0.0)
    assert watch.next_deadline() <= 8.0


def test_resuming_a_state_at_the_top_of_every_field_keeps_streaming() -> None:
    top = state(inc=0xFFFFFFFF, server=0xFFFFFFFF, media_ms=P.U64, period=4294967.295,
                encs=(P.EncodingState(BANDS[0], HIGH, 6553.5, 255, P.U64),))
    c = cfg()
    core = StreamerCore.resume(c, top, 10.0, 1e6)
    assert core.incarnation == 0xFFFFFFFF
    for t in (10.0, 10.5, 11.0):
        for a in core.poll(t):
            if isinstance(a, Send):
                P.decode(a.payload)
            elif isinstance(a, Encode):
                P.decode(P.encode_frame(P.Frame(core.stream, core.incarnation, a.seq,
                                                a.media_ms, a.band, a.resolution, a.quality,
                                                a.fps, JPEG)))
    P.decode(P.encode_state(core.state(11.0)))


# ------------------------------------------------------------------------------ fuzzing
U8, U16, U32, U64 = (st.integers(0, (1 << n) - 1) for n in (8, 16, 32, 64))
NAME = st.binary(max_size=70)


def _raw(kind: int, body: bytes) -> bytes:
    return struct.pack(">2sBB", b"FV", P.VERSION, kind) + body


RAW_MESSAGES = st.one_of(
    st.builds(lambda a, b, c, d, offers: _raw(P.KIND_ADVERT, struct.pack(
        ">IIIIB", a, b, c, d, len(offers)) + b"".join(offers)), U32, U32, U32, U32,
        st.lists(st.builds(lambda *f: struct.pack(">BHHBHBBB", *f), U8, U16, U16, U8, U16, U8,
                           U8, U8), max_size=4)),
    st.builds(lambda n, b, f: _raw(P.KIND_REQUEST, bytes([len(n) & 0xFF]) + n + bytes([b, f])),
              NAME, U8, U8),
    st.builds(lambda n, b, d, ms, f, m, r: _raw(P.KIND_FEEDBACK, bytes([len(n) & 0xFF]) + n
                                                + struct.pack(">BIIBQI", b, d, ms, f, m, r)),
              NAME, U8, U32, U32, U8, U64, U32),
    st.builds(lambda a, b, c, d, e, encs: _raw(P.KIND_STATE, struct.pack(
        ">IIIQIB", a, b, c, d, e, len(encs)) + b"".join(encs)), U32, U32, U32, U64, U32,
        st.lists(st.builds(lambda *f: struct.pack(">BHHHBQB", *f), U8, U16, U16, U16, U8, U64,
                           U8), max_size=4)),
    st.builds(lambda f, tail: _raw(P.KIND_FRAME, struct.pack(">IIQQBHHBHBB", *f) + tail),
              st.tuples(U32, U32, U64, U64, U8, U16, U16, U8, U16, U8, U8),
              st.sampled_from([b"", JPEG, b"GIF"])),
)


@st.composite
def any_length(draw: st.DrawFn) -> bytes:
    """A message with every field drawn from its whole range, then cut or extended."""
    data = draw(RAW_MESSAGES)
    how = draw(st.sampled_from(["whole", "cut", "extend", "kind"]))
    if how == "cut":
        return data[:draw(st.integers(0, len(data)))]
    if how == "extend":
        return data + draw(st.binary(min_size=1, max_size=20))
    if how == "kind":
        return data[:3] + bytes([draw(U8)]) + data[4:]
    return data


@settings(max_examples=400, deadline=None)
@given(any_length())
def test_control_decoders_survive_every_field_and_length(data: bytes) -> None:
    try:
        msg = P.decode(data)
    except P.ProtocolError:
        return
    again = P.decode(P.encode(msg))  # what was accepted can be re-encoded
    assert type(again) is type(msg)


def _message(data: bytes) -> P.Message | None:
    try:
        return P.decode(data)
    except P.ProtocolError:
        return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(any_length(), st.floats(0, 5)), max_size=25),
       st.sampled_from([0, 1, 2]))
def test_the_streamer_and_backup_cores_survive_random_messages(script, max_active) -> None:
    c = cfg(max_active=max_active, max_viewers=4)
    core = StreamerCore(c, 0.0, server=5)
    watch = BackupWatch(c, 0.0)
    t = 0.0
    for data, dt in script:
        t += dt
        msg = _message(data)
        if isinstance(msg, P.State):
            core.outranked_by(msg)
            watch.on_state(msg, t)
            resumed = StreamerCore.resume(c, msg, t, dt)
            for a in resumed.poll(t):
                if isinstance(a, Send):
                    P.decode(a.payload)
        elif msg is not None:
            core.on_message(msg, t)
        for a in core.poll(t):
            if isinstance(a, Send):
                P.decode(a.payload)
        assert c.max_active == 0 or len(core.active()) <= c.max_active
        assert all(len(e.viewers) <= c.max_viewers for e in core.encodings)
        assert core.next_deadline() >= 0
        take = watch.poll(t)
        if take is not None and take.state is not None:
            StreamerCore.resume(c, take.state, t, take.silent_for).poll(t)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(any_length(), st.floats(0, 2), st.integers(0, 5)), max_size=25))
def test_the_viewer_core_survives_random_messages(script) -> None:
    v = ViewerCore("v", "lowest", 0.0)
    t = 0.0
    for data, dt, dropped in script:
        t += dt
        msg = _message(data)
        out = []
        if isinstance(msg, P.Advert):
            out = v.on_advert(msg, t)
        elif isinstance(msg, P.Frame):
            out = v.on_frame(msg, t)
        out += v.on_overflow(dropped, t) + v.poll(t)
        for a in out:
            if isinstance(a, SendMsg):
                P.decode(a.payload)
        deadline = v.next_deadline()
        if any(isinstance(a, SendMsg) and a.band == P.BAND_REQUEST for a in out):
            assert deadline is not None and deadline - t >= MIN_REQUEST_PERIOD - 1e-9


# ------------------------------------------------------------------------------ on a router
@contextlib.asynccontextmanager
async def primary(node, c: StreamConfig):
    client = await flowlib.connect(addr(node), name="streamer")
    flow = await client.create()
    streamer = Streamer(client, flow, PatternSource(Resolution(80, 60)), c)
    task = asyncio.ensure_future(streamer.run())
    try:
        await asyncio.wait_for(streamer.serving.wait(), 20)
        yield streamer, flow, task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()


def _forged_state(stream: int) -> bytes:
    return P.encode_state(P.State(stream, 0xFFFFFFFF, 0, 0.2, (), 0xFFFFFFFF))


def test_on_a_router_a_forged_state_does_not_make_a_keyed_primary_step_down() -> None:
    async def main() -> None:
        c = cfg(resolutions=(LOW,), state_key=KEY, state_period=0.1, dead_after=0.4)
        async with mesh({"r0": []}, 0x10) as (r0,), primary(r0, c) as (streamer, flow, task):
            attacker = await flowlib.connect(addr(r0), name="mallory")
            try:
                assert streamer.core is not None
                for _ in range(5):
                    await attacker.send(flow, _forged_state(streamer.core.stream),
                                        band=P.BAND_STATE)
                await until(lambda: streamer.unauthenticated >= 5)
                await asyncio.sleep(0.5)
                assert streamer.step_downs == 0 and not task.done()
                assert streamer.role == "primary"
            finally:
                await attacker.close()

    run(main())


def test_on_a_router_a_state_with_incarnation_0xffffffff_does_not_crash_the_streamer() -> None:
    async def main() -> None:
        c = cfg(resolutions=(LOW,), state_period=0.1, dead_after=0.4)
        async with mesh({"r0": []}, 0x10) as (r0,), primary(r0, c) as (streamer, flow, task):
            attacker = await flowlib.connect(addr(r0), name="mallory")
            try:
                assert streamer.core is not None
                await attacker.send(flow, _forged_state(streamer.core.stream),
                                    band=P.BAND_STATE)
                # unkeyed, the forgery outranks it (documented): it steps down, then takes
                # the stream back when the "other primary" stays silent, and keeps running
                await until(lambda: streamer.step_downs == 1)
                await until(lambda: streamer.serving.is_set() and streamer.core is not None
                            and streamer.core.incarnation == 0xFFFFFFFF)
                await asyncio.sleep(0.5)
                assert not task.done(), task.exception() if task.done() else None
            finally:
                await attacker.close()

    run(main())


def test_serve_help_documents_the_bounds_and_the_state_key(capsys) -> None:
    from flowvideo import cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for option in ("--max-active", "--max-viewers", "--feedback-share", "--state-key"):
        assert option in text
    assert "never an" in text and "argument" in text  # the secret is a file
    a = cli.build_parser().parse_args(["watch", "--router", "127.0.0.1:1", "--flow",
                                       "1:2:3", "--name", "alice"])
    assert a.name == "alice"
