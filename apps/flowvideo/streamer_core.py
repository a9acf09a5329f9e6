"""The streamer's decisions, sans-I/O: which resolutions run, at what rate and quality, when
to advertise, when to publish state, and when a backup takes over.

:class:`StreamerCore` takes events (``on_request``, ``on_feedback``) and the time, and
``poll(now)`` returns the actions due (:class:`Encode`, :class:`Send`, :class:`Started`,
:class:`Stopped`, :class:`RateChanged`); ``next_deadline()`` says when to poll again. The
asyncio shell (:mod:`flowvideo.streamer`) captures, encodes and sends; tests drive the core
with a fake clock.

How the streamer learns who watches: **requests, refreshed**. A viewer sends a request for
its band when it subscribes and then every ``request_period`` (the advertisement tells viewers
the period). A resolution with no request for ``expire_periods`` periods stops. A request
for an inactive resolution starts it at once. (Router membership is not visible to an
application, and a refresh also survives a viewer's move to another router.)

Rate control from the network (seed 002 section 3.5): viewers report congestion of their
band on the feedback band (frames lost to their queue or to a router, a router's
link-congested fault, a queueing delay over ``delay_limit``); each band has its own
:class:`~flowvideo.ratecontrol.BandRate`, which lowers the frame rate, then the quality, then
the picture scale of that band only, and raises them again, probing, once the reports stop
(see :mod:`flowvideo.ratecontrol`).

Sound (``audio``): while any resolution is active, an :class:`EncodeAudio` every
``audio_chunk_ms`` of media time, for the chunk that just ended (numbered on; after a stall
the position skips ahead rather than bursting). Its media time is the pictures' clock.

Key pictures: a request from a viewer new on a band, or one flagged ``key`` (a viewer that
lost a picture an inter-frame decoder needs), marks the band's next picture as a key picture
(:attr:`Encode.key`); so do a start, a change of scale and a takeover. At most one per
``key_interval`` (0.5 s) per band: a sender repeating key requests gets no more.

**What one viewer can make the streamer do** (a viewer is a name in its messages: flowlib
tells no sender's identity, so names are claims). A name holds one band at a time: its
request for another band takes it off the first, and a band whose viewers all left or
went silent stops. A band tracks at most ``max_viewers`` names; ``max_active`` (when set)
caps the resolutions encoding at once, whatever names ask. Feedback counts only from a
current viewer of the band, once per viewer per ``feedback window`` (the larger of
``feedback_hold`` and ``request_period``), and cuts the band only when more than
``feedback_share`` of its viewers reported: a viewer alone on a band is heard at once, one
of several cannot degrade the others' pictures (nor keep a cut from recovering).

**State from the peer only.** With ``state_key`` set, state messages carry an HMAC-SHA256
under it (:func:`~flowvideo.protocol.seal_state`) and states without one are refused
(:func:`read_state`), so only the configured primary/backup pair can make a primary step
down or keep a backup from taking over. A backup believes a state of the stream it follows
only if its media position moved on (a replayed state is stale). Any field value is
survived: resuming clamps what it continues to the fields' ranges.

Two primaries on one flow (two backups took over, a restarted primary): each primary also
hears the state band, and the one ranked lower by :meth:`StreamerCore.outranked_by` steps
down to a backup.

Redundant server (Figure 3.3): the primary publishes a :class:`~flowvideo.protocol.State`
every ``state_period`` on the state band. :class:`BackupWatch` follows it and says
:class:`TakeOver` when nothing was heard for ``dead_after`` seconds; the backup then runs a
:class:`StreamerCore` made by :meth:`StreamerCore.resume`, which keeps the stream id, the
media position, the frame numbers and the active encodings (each given one request period
of grace for its viewers' next refresh).

Imports only the standard library, :mod:`flowvideo.protocol` and
:mod:`flowvideo.ratecontrol`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from . import protocol as P
from .protocol import Resolution
from .ratecontrol import BandRate, RateLimits


@dataclass(frozen=True)
class StreamConfig:
    resolutions: tuple[Resolution, ...] = (Resolution(320, 240), Resolution(160, 120))
    fps: float = 10.0
    quality: int = 75
    request_period: float = 1.0
    expire_periods: int = 3
    advert_period: float = 0.5
    state_period: float = 0.2
    dead_after: float = 0.8   #: a backup takes over after this long without state
    min_fps: float = 1.0
    min_quality: int = 20
    quality_step: int = 20
    fps_step: float = 2.0
    feedback_hold: float = 0.5
    recover_after: float = 2.0
    max_active: int = 0        #: resolutions encoding at once at most (0: all of them)
    max_viewers: int = 64      #: viewer names tracked per band (more are refused)
    max_scale: int = 4         #: congestion may send a band's pictures at 1/max_scale size
    delay_limit: float = 0.3   #: queueing delay (s) at a viewer that counts as congestion
    #: longest wait before probing upward again (at least recover_after)
    max_recover_after: float = 16.0
    codec: int = P.CODEC_JPEG  #: how pictures are encoded (JPEG needs no extra package)
    key_interval: float = 0.5  #: asked-for key pictures of a band at most one per this
    audio: bool = False        #: send sound on the audio band
    audio_chunk_ms: int = 40   #: media milliseconds of sound per audio message
    feedback_share: float = 0.5  #: a cut needs reports from more than this share of viewers
    #: shared by a primary and its backup: state messages are sealed with it and only
    #: sealed ones are believed (None: any state on the band is believed)
    state_key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.resolutions or len(self.resolutions) > P.MAX_RESOLUTIONS:
            raise ValueError(f"1..{P.MAX_RESOLUTIONS} resolutions")
        if not 0 < self.min_fps <= self.fps <= 100:
            raise ValueError("need 0 < min_fps <= fps <= 100")
        if not 1 <= self.min_quality <= self.quality <= 95:
            raise ValueError("need 1 <= min_quality <= quality <= 95")
        for name in ("request_period", "advert_period", "state_period", "dead_after",
                     "feedback_hold", "recover_after", "fps_step", "key_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.expire_periods < 1:
            raise ValueError("expire_periods must be at least 1")
        if self.max_active < 0 or self.max_viewers < 1:
            raise ValueError("need max_active >= 0 and max_viewers >= 1")
        if not 0 <= self.feedback_share < 1:
            raise ValueError("feedback_share must be in [0, 1)")
        if not 10 <= self.audio_chunk_ms <= 1000 or self.audio_chunk_ms % 20:
            raise ValueError("audio_chunk_ms is a multiple of 20 in 20..1000")
        if self.max_scale not in P.SCALES:
            raise ValueError(f"max_scale is one of {P.SCALES}")
        if self.codec not in P.CODEC_NAMES:
            raise ValueError(f"unknown codec {self.codec}")
        if not 0 < self.delay_limit <= 60:
            raise ValueError("need 0 < delay_limit <= 60")
        if self.state_key is not None and len(self.state_key) < P.MIN_STATE_KEY:
            raise ValueError(f"a state key has at least {P.MIN_STATE_KEY} bytes")

    @property
    def feedback_window(self) -> float:
        return max(self.feedback_hold, self.request_period)

    def rate_limits(self) -> RateLimits:
        return RateLimits(self.fps, self.quality, self.min_fps, self.min_quality,
                          self.quality_step, self.fps_step, self.max_scale, self.feedback_hold,
                          self.recover_after, max(self.recover_after, self.max_recover_after),
                          self.delay_limit)


def read_state(config: StreamConfig, payload: bytes) -> P.State:
    """A state message from the state band: opened with the state key if one is set (else
    taken as it is), decoded; :class:`~flowvideo.protocol.ProtocolError` otherwise
    (:class:`~flowvideo.protocol.Unauthenticated` for a missing or wrong MAC)."""
    data = bytes(payload)
    if config.state_key is not None:
        data = P.open_state(data, config.state_key)
    msg = P.decode(data)
    if not isinstance(msg, P.State):
        raise P.ProtocolError(f"a {type(msg).__name__.lower()} on the state band")
    return msg


# ------------------------------------------------------------------------------ actions
@dataclass(frozen=True)
class Encode:
    """Capture the source at *media_ms* and send it on *band* at this size (the band's
    resolution, scaled down under congestion) and quality; *key*: a key picture."""

    band: int
    resolution: Resolution
    quality: int
    fps: float
    seq: int
    media_ms: int
    key: bool = True


@dataclass(frozen=True)
class Send:
    band: int
    payload: bytes


@dataclass(frozen=True)
class Started:
    band: int
    resolution: Resolution
    viewer: str


@dataclass(frozen=True)
class Stopped:
    band: int
    resolution: Resolution
    idle: float


@dataclass(frozen=True)
class RateChanged:
    band: int
    fps: float
    quality: int
    why: str   #: "congestion" or "recovered"
    scale: int = 1


@dataclass(frozen=True)
class EncodeAudio:
    """Read and send the sound of media time [*media_ms*, *media_ms* + *ms*)."""

    seq: int
    media_ms: int
    ms: int


Action = Encode | EncodeAudio | Send | Started | Stopped | RateChanged


@dataclass
class Encoding:
    """One resolution's encoder state."""

    band: int
    resolution: Resolution
    rate: BandRate
    active: bool = False
    last_request: float = 0.0
    next_due: float = 0.0
    frames: int = 0           #: frames sent (the next frame's seq)
    key_due: bool = True      #: the next picture is a key picture
    last_key: float = float("-inf")  #: when the last key picture was due
    viewers: dict[str, float] = field(default_factory=dict)  #: name -> last request
    reports: dict[str, float] = field(default_factory=dict)  #: name -> last congestion report
    grace_until: float = float("-inf")  #: resumed: kept on until then without any viewer

    @property
    def fps(self) -> float:
        return self.rate.fps

    @property
    def quality(self) -> int:
        return self.rate.quality

    @property
    def scale(self) -> int:
        return self.rate.scale

    @property
    def cuts(self) -> int:
        return self.rate.cuts

    @property
    def raises(self) -> int:
        return self.rate.raises

    def size(self) -> Resolution:
        """The size its pictures go at now."""
        return self.resolution.scaled(self.rate.scale)


MAX_POSITION = 1 << 62  #: media milliseconds and frame numbers resumed at most


class StreamerCore:
    def __init__(self, config: StreamConfig, now: float, *, stream: int | None = None,
                 incarnation: int = 1, media_ms: int = 0, server: int | None = None) -> None:
        self.cfg = config
        self.stream = random.getrandbits(32) if stream is None else stream
        self.server = random.getrandbits(32) if server is None else server
        self.incarnation = incarnation
        self._media_origin = now - media_ms / 1000
        limits = config.rate_limits()
        self.encodings = [Encoding(P.band_of(i), res, BandRate(limits, last_change=now))
                          for i, res in enumerate(config.resolutions)]
        self._by_band = {e.band: e for e in self.encodings}
        self._viewer_band: dict[str, int] = {}  #: viewer name -> the one band it holds
        self._advert_seq = 0
        self._next_advert = now
        self._next_state = now
        self._audio_ms: int | None = None  #: media time of the next sound chunk
        self.audio_chunks = 0
        self.counters: dict[str, int] = {}

    @classmethod
    def resume(cls, config: StreamConfig, state: P.State, now: float,
               silent_for: float, server: int | None = None) -> StreamerCore:
        """A core that continues *state* (a backup taking over *silent_for* seconds after the
        primary's last state): same stream, next incarnation, media time moved on by the
        silence, the same encodings active with their rates and a grace period, and frame
        numbers past any the primary can have sent since the state (it sent at most one per
        period of the higher of its rate and ours): numbers never repeat or go back."""
        # every field is clamped to what this streamer can carry on (a state at the top of
        # a field's range must not crash the backup that continues it)
        core = cls(config, now, stream=state.stream & P.U32,
                   incarnation=min(state.incarnation + 1, P.U32),
                   media_ms=min(state.media_ms, MAX_POSITION) + round(silent_for * 1000),
                   server=server)
        for es in state.encodings:
            enc = core._by_band.get(es.band)
            if enc is None or enc.resolution != es.resolution:
                core._count("resume.unknown-encoding")
                continue
            enc.active, enc.last_request, enc.next_due = True, now, now
            enc.grace_until = now + config.expire_periods * config.request_period
            enc.rate.resume(es.fps, es.quality, es.scale, now)
            sent_since = math.ceil(silent_for * max(es.fps, config.fps)) + 1
            enc.frames = min(es.frames, MAX_POSITION) + sent_since
            enc.key_due = True
        return core

    def outranked_by(self, state: P.State) -> bool:
        """Another streamer publishes state on our flow: step down if it ranks higher.

        Two streamers may both think they are the primary (two backups took over, or a
        restarted primary came back on the same flow). The one with the higher
        (incarnation, server) keeps streaming; the other goes back to following it, so
        viewers soon hear one stream again."""
        if state.server == self.server:
            return False
        return (state.incarnation, state.server) > (self.incarnation, self.server)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def media_ms(self, now: float) -> int:
        return max(0, round((now - self._media_origin) * 1000))

    def clock_of(self, media_ms: int) -> float:
        """The time (on the clock passed in) at which media time *media_ms* was taken: a
        frame's capture time, for measuring delays where the clocks are shared (tests)."""
        return self._media_origin + media_ms / 1000

    def active(self) -> list[Encoding]:
        return [e for e in self.encodings if e.active]

    def encoding(self, band: int) -> Encoding | None:
        return self._by_band.get(band)

    # ---------------------------------------------------------------------- events
    def on_message(self, msg: P.Message, now: float) -> list[Action]:
        if isinstance(msg, P.Request):
            return self.on_request(msg.viewer, msg.band, now, key=msg.key)
        if isinstance(msg, P.Feedback):
            return self.on_feedback(msg.viewer, msg.band, msg.dropped, now,
                                    delay_ms=msg.delay_ms, congested=msg.congested,
                                    media_ms=msg.media_ms, received=msg.rate)
        self._count("ignored." + type(msg).__name__.lower())
        return []

    def on_request(self, viewer: str, band: int, now: float, *,
                   key: bool = False) -> list[Action]:
        enc = self._by_band.get(band)
        if enc is None:
            self._count("requests.unknown-band")
            return []
        expire = self.cfg.expire_periods * self.cfg.request_period
        if viewer not in enc.viewers and len(enc.viewers) >= self.cfg.max_viewers:
            self._forget_expired(enc, now - expire)
            if len(enc.viewers) >= self.cfg.max_viewers:
                self._count("requests.viewers-full")
                return []
        if not enc.active and self.cfg.max_active \
                and len(self.active()) >= self.cfg.max_active:
            self._count("requests.max-active")
            return []
        out: list[Action] = []
        held = self._viewer_band.get(viewer)
        if held is not None and held != band:  # one band per viewer: it left the other
            old = self._by_band[held]
            old.viewers.pop(viewer, None)
            old.reports.pop(viewer, None)
            self._count("requests.viewer-moved")
            if old.active and not old.viewers and now > old.grace_until:
                out.append(self._stop(old, now))  # nobody else watches it: stop now
        self._viewer_band[viewer] = band
        self._count("requests")
        if key or viewer not in enc.viewers:  # joined, switched or lost a key picture
            enc.key_due = True
        enc.last_request = now
        enc.viewers[viewer] = now
        if enc.active:
            return out
        enc.active, enc.next_due, enc.key_due = True, now, True
        enc.rate.reset(now)
        enc.reports.clear()
        self._next_advert = now  # tell viewers at once
        return out + [Started(band, enc.resolution, viewer)]

    def on_sent(self, band: int, nbytes: int) -> None:
        """The shell sent a picture of *nbytes* on *band* (cuts aim with the mean size)."""
        enc = self._by_band.get(band)
        if enc is not None:
            enc.rate.sent(nbytes)

    def on_send_failed(self, band: int) -> None:
        """A key picture of *band* could not be sent: the next one is a key picture."""
        enc = self._by_band.get(band)
        if enc is not None:
            enc.key_due = True

    def _stop(self, enc: Encoding, now: float) -> Stopped:
        enc.active = False
        enc.reports.clear()
        self._next_advert = now
        return Stopped(enc.band, enc.resolution, now - enc.last_request)

    def _forget_expired(self, enc: Encoding, before: float) -> None:
        for v in [v for v, t in enc.viewers.items() if t < before]:
            del enc.viewers[v]
            enc.reports.pop(v, None)
            if self._viewer_band.get(v) == enc.band:
                del self._viewer_band[v]

    def on_feedback(self, viewer: str, band: int, dropped: int, now: float, *,
                    delay_ms: int = 0, congested: bool = False,
                    media_ms: int = 0, received: int = 0) -> list[Action]:
        """A viewer's congestion report for its band (see the module docs for who counts)."""
        enc = self._by_band.get(band)
        if enc is None or not enc.active:
            self._count("feedback.ignored")
            return []
        if viewer not in enc.viewers:
            self._count("feedback.not-a-viewer")
            return []
        delay = delay_ms / 1000
        if not enc.rate.is_signal(dropped, delay, congested):
            self._count("feedback.no-congestion")
            return []
        self._count("feedback")
        window = self.cfg.feedback_window
        enc.reports = {v: t for v, t in enc.reports.items()
                       if now - t <= window and v in enc.viewers}
        enc.reports[viewer] = now
        if len(enc.reports) <= self.cfg.feedback_share * len(enc.viewers):
            self._count("feedback.below-share")  # others on this band are fine
            return []
        scale = enc.rate.scale
        captured = self.clock_of(media_ms) if media_ms else None
        if not enc.rate.congested(now, lost=dropped > 0 or congested, delay=delay,
                                  captured=captured, received=received):
            self._count("feedback.same-episode")
            return []
        self._count("feedback.cut")
        enc.reports.clear()  # the next cut needs the share again
        enc.next_due = min(enc.next_due, now + 1 / enc.fps)
        enc.key_due = enc.key_due or enc.rate.scale != scale
        self._next_advert = now
        return [RateChanged(band, enc.fps, enc.quality, "congestion", enc.scale)]

    # ---------------------------------------------------------------------- time
    def poll(self, now: float) -> list[Action]:
        out: list[Action] = []
        cfg = self.cfg
        expire = cfg.expire_periods * cfg.request_period
        for enc in self.encodings:
            if not enc.active:
                continue
            self._forget_expired(enc, now - expire)
            if not enc.viewers and now > enc.grace_until:
                out.append(self._stop(enc, now))
                continue
            changed = self._maybe_recover(enc, now)
            if changed is not None:
                out.append(changed)
            if now >= enc.next_due:
                # asked-for key pictures at most one per key_interval (requests are claims:
                # a sender repeating them must not turn a band into key pictures only)
                key = enc.key_due and now - enc.last_key >= cfg.key_interval
                out.append(Encode(enc.band, enc.size(), enc.quality, enc.fps, enc.frames,
                                  self.media_ms(now), key))
                enc.frames += 1
                if key:
                    enc.key_due, enc.last_key = False, now
                # the next frame one period after this one's slot; never a burst to catch up
                enc.next_due = max(enc.next_due + 1 / enc.fps, now)
        out += self._audio_due(now)
        if now >= self._next_advert:
            out.append(Send(P.BAND_ADVERT, P.encode_advert(self.advert())))
            self._next_advert = now + cfg.advert_period
        if now >= self._next_state:
            state = P.encode_state(self.state(now))
            if cfg.state_key is not None:
                state = P.seal_state(state, cfg.state_key)
            out.append(Send(P.BAND_STATE, state))
            self._next_state = now + cfg.state_period
        return out

    def _audio_due(self, now: float) -> list[Action]:
        if not self.cfg.audio or not any(e.active for e in self.encodings):
            self._audio_ms = None
            return []
        chunk, media = self.cfg.audio_chunk_ms, self.media_ms(now)
        if self._audio_ms is None or media - self._audio_ms > 5 * chunk:
            self._audio_ms = media - media % chunk  # (re)start at a chunk boundary
            return []
        out: list[Action] = []
        while self._audio_ms + chunk <= media:
            out.append(EncodeAudio(self.audio_chunks, self._audio_ms, chunk))
            self.audio_chunks += 1
            self._audio_ms += chunk
        return out

    def _maybe_recover(self, enc: Encoding, now: float) -> RateChanged | None:
        scale = enc.rate.scale
        if not enc.rate.recover(now):
            return None
        enc.key_due = enc.key_due or enc.rate.scale != scale
        self._next_advert = now
        return RateChanged(enc.band, enc.fps, enc.quality, "recovered", enc.scale)

    def next_deadline(self) -> float:
        times = [self._next_advert, self._next_state]
        if self._audio_ms is not None:
            times.append(self.clock_of(self._audio_ms + self.cfg.audio_chunk_ms))
        for enc in self.active():
            times.append(enc.next_due)
            times.append(max(max(enc.viewers.values(), default=float("-inf"))
                             + self.cfg.expire_periods * self.cfg.request_period,
                             enc.grace_until))
            recover = enc.rate.next_recover()
            if recover is not None:
                times.append(recover)
        return min(times)

    # ---------------------------------------------------------------------- messages
    def advert(self) -> P.Advert:
        self._advert_seq += 1
        return P.Advert(self.stream, self.incarnation, self._advert_seq,
                        self.cfg.request_period,
                        tuple(P.Offer(e.band, e.resolution, e.active, e.fps, e.quality,
                                      e.scale, self.cfg.codec) for e in self.encodings))

    def state(self, now: float) -> P.State:
        return P.State(self.stream, self.incarnation, self.media_ms(now), self.cfg.state_period,
                       tuple(P.EncodingState(e.band, e.resolution, e.fps, e.quality, e.frames,
                                             e.scale) for e in self.active()), self.server)


# ------------------------------------------------------------------------------ backup
@dataclass(frozen=True)
class TakeOver:
    """The primary is silent: continue *state* (None: no primary was ever heard)."""

    state: P.State | None
    silent_for: float


class BackupWatch:
    """Follows the primary's state band; says when to take over."""

    def __init__(self, config: StreamConfig, now: float) -> None:
        self.cfg = config
        self.started = now
        self.last_heard: float | None = None
        self.state: P.State | None = None
        self.taken_over = False
        self.states = 0
        self.stale = 0  #: states ignored: no newer than the last one of their streamer

    def on_state(self, state: P.State, now: float) -> None:
        last = self.state
        if last is not None and state.stream != last.stream \
                and state.incarnation < last.incarnation:
            return  # an older stream's leftovers
        if last is not None and (state.stream, state.incarnation, state.server) == \
                (last.stream, last.incarnation, last.server) and state.media_ms <= last.media_ms:
            self.stale += 1  # a replayed (or reordered) state: no sign of life
            return
        self.state, self.last_heard = state, now
        self.states += 1

    def dead_after(self) -> float:
        """The primary's own period decides: ``dead_after`` or 4 of its periods, the larger.
        Before any state was heard, five times that (a backup started first waits for the
        primary to come up before it streams on its own)."""
        if self.state is None:
            return 5 * max(self.cfg.dead_after, 4 * self.cfg.state_period)
        # the primary's period, but not beyond what this backup would wait for anyway
        # (a state claiming a period of days must not keep it from ever taking over)
        period = min(self.state.period, max(self.cfg.dead_after, 2.0))
        return max(self.cfg.dead_after, 4 * period)

    def next_deadline(self) -> float:
        return (self.last_heard if self.last_heard is not None else self.started) \
            + self.dead_after()

    def poll(self, now: float) -> TakeOver | None:
        if self.taken_over or now < self.next_deadline():
            return None
        self.taken_over = True
        since = self.last_heard if self.last_heard is not None else self.started
        return TakeOver(self.state, now - since)
