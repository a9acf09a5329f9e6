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

Overflow feedback (seed 002 section 3.5): a report for a band halves that band's frame rate
(down to ``min_fps``); at ``min_fps`` it lowers the JPEG quality by ``quality_step`` instead
(down to ``min_quality``). Reports within ``feedback_hold`` of the last cut are one episode.
After ``recover_after`` seconds without a report the quality comes back first, then the rate
grows by ``fps_step`` per ``recover_after`` until it reaches the configured values.

Two primaries on one flow (two backups took over, a restarted primary): each primary also
hears the state band, and the one ranked lower by :meth:`StreamerCore.outranked_by` steps
down to a backup.

Redundant server (Figure 3.3): the primary publishes a :class:`~flowvideo.protocol.State`
every ``state_period`` on the state band. :class:`BackupWatch` follows it and says
:class:`TakeOver` when nothing was heard for ``dead_after`` seconds; the backup then runs a
:class:`StreamerCore` made by :meth:`StreamerCore.resume`, which keeps the stream id, the
media position, the frame numbers and the active encodings (each given one request period
of grace for its viewers' next refresh).

Imports only the standard library and :mod:`flowvideo.protocol`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import protocol as P
from .protocol import Resolution


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

    def __post_init__(self) -> None:
        if not self.resolutions or len(self.resolutions) > P.MAX_RESOLUTIONS:
            raise ValueError(f"1..{P.MAX_RESOLUTIONS} resolutions")
        if not 0 < self.min_fps <= self.fps <= 100:
            raise ValueError("need 0 < min_fps <= fps <= 100")
        if not 1 <= self.min_quality <= self.quality <= 95:
            raise ValueError("need 1 <= min_quality <= quality <= 95")
        for name in ("request_period", "advert_period", "state_period", "dead_after",
                     "feedback_hold", "recover_after", "fps_step"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.expire_periods < 1:
            raise ValueError("expire_periods must be at least 1")


# ------------------------------------------------------------------------------ actions
@dataclass(frozen=True)
class Encode:
    """Capture the source at *media_ms* and send it on *band* at this size and quality."""

    band: int
    resolution: Resolution
    quality: int
    fps: float
    seq: int
    media_ms: int


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
    why: str   #: "overflow" or "recovered"


Action = Encode | Send | Started | Stopped | RateChanged


@dataclass
class Encoding:
    """One resolution's encoder state."""

    band: int
    resolution: Resolution
    fps: float
    quality: int
    active: bool = False
    last_request: float = 0.0
    next_due: float = 0.0
    frames: int = 0           #: frames sent (the next frame's seq)
    last_cut: float | None = None
    last_change: float = 0.0
    viewers: dict[str, float] = field(default_factory=dict)  #: name -> last request
    cuts: int = 0
    raises: int = 0


class StreamerCore:
    def __init__(self, config: StreamConfig, now: float, *, stream: int | None = None,
                 incarnation: int = 1, media_ms: int = 0, server: int | None = None) -> None:
        self.cfg = config
        self.stream = random.getrandbits(32) if stream is None else stream
        self.server = random.getrandbits(32) if server is None else server
        self.incarnation = incarnation
        self._media_origin = now - media_ms / 1000
        self.encodings = [Encoding(P.band_of(i), res, config.fps, config.quality)
                          for i, res in enumerate(config.resolutions)]
        self._by_band = {e.band: e for e in self.encodings}
        self._advert_seq = 0
        self._next_advert = now
        self._next_state = now
        self.counters: dict[str, int] = {}

    @classmethod
    def resume(cls, config: StreamConfig, state: P.State, now: float,
               silent_for: float, server: int | None = None) -> StreamerCore:
        """A core that continues *state* (a backup taking over *silent_for* seconds after the
        primary's last state): same stream, next incarnation, media time moved on by the
        silence, the same encodings active with their rates, numbers and a grace period."""
        core = cls(config, now, stream=state.stream, incarnation=state.incarnation + 1,
                   media_ms=state.media_ms + round(silent_for * 1000), server=server)
        for es in state.encodings:
            enc = core._by_band.get(es.band)
            if enc is None or enc.resolution != es.resolution:
                core._count("resume.unknown-encoding")
                continue
            enc.active, enc.last_request, enc.next_due = True, now, now
            enc.fps = min(max(es.fps, config.min_fps), config.fps)
            enc.quality = min(max(es.quality, config.min_quality), config.quality)
            enc.frames = es.frames
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

    def active(self) -> list[Encoding]:
        return [e for e in self.encodings if e.active]

    def encoding(self, band: int) -> Encoding | None:
        return self._by_band.get(band)

    # ---------------------------------------------------------------------- events
    def on_message(self, msg: P.Message, now: float) -> list[Action]:
        if isinstance(msg, P.Request):
            return self.on_request(msg.viewer, msg.band, now)
        if isinstance(msg, P.Feedback):
            return self.on_feedback(msg.viewer, msg.band, msg.dropped, now)
        self._count("ignored." + type(msg).__name__.lower())
        return []

    def on_request(self, viewer: str, band: int, now: float) -> list[Action]:
        enc = self._by_band.get(band)
        if enc is None:
            self._count("requests.unknown-band")
            return []
        self._count("requests")
        enc.last_request = now
        enc.viewers[viewer] = now
        if enc.active:
            return []
        enc.active, enc.next_due = True, now
        enc.fps, enc.quality = self.cfg.fps, self.cfg.quality
        enc.last_cut, enc.last_change = None, now
        self._next_advert = now  # tell viewers at once
        return [Started(band, enc.resolution, viewer)]

    def on_feedback(self, viewer: str, band: int, dropped: int, now: float) -> list[Action]:
        enc = self._by_band.get(band)
        if enc is None or not enc.active:
            self._count("feedback.ignored")
            return []
        self._count("feedback")
        if enc.last_cut is not None and now - enc.last_cut < self.cfg.feedback_hold:
            enc.last_cut = now if dropped else enc.last_cut
            return []
        enc.last_cut = now
        if enc.fps > self.cfg.min_fps:
            enc.fps = max(self.cfg.min_fps, enc.fps / 2)
        elif enc.quality > self.cfg.min_quality:
            enc.quality = max(self.cfg.min_quality, enc.quality - self.cfg.quality_step)
        else:
            self._count("feedback.at-floor")
            return []
        enc.cuts += 1
        enc.last_change = now
        enc.next_due = min(enc.next_due, now + 1 / enc.fps)
        self._next_advert = now
        return [RateChanged(band, enc.fps, enc.quality, "overflow")]

    # ---------------------------------------------------------------------- time
    def poll(self, now: float) -> list[Action]:
        out: list[Action] = []
        cfg = self.cfg
        expire = cfg.expire_periods * cfg.request_period
        for enc in self.encodings:
            if not enc.active:
                continue
            if now - enc.last_request > expire:
                enc.active = False
                enc.viewers.clear()
                self._next_advert = now
                out.append(Stopped(enc.band, enc.resolution, now - enc.last_request))
                continue
            enc.viewers = {v: t for v, t in enc.viewers.items() if now - t <= expire}
            changed = self._maybe_recover(enc, now)
            if changed is not None:
                out.append(changed)
            if now >= enc.next_due:
                out.append(Encode(enc.band, enc.resolution, enc.quality, enc.fps, enc.frames,
                                  self.media_ms(now)))
                enc.frames += 1
                # the next frame one period after this one's slot; never a burst to catch up
                enc.next_due = max(enc.next_due + 1 / enc.fps, now)
        if now >= self._next_advert:
            out.append(Send(P.BAND_ADVERT, P.encode_advert(self.advert())))
            self._next_advert = now + cfg.advert_period
        if now >= self._next_state:
            out.append(Send(P.BAND_STATE, P.encode_state(self.state(now))))
            self._next_state = now + cfg.state_period
        return out

    def _maybe_recover(self, enc: Encoding, now: float) -> RateChanged | None:
        cfg = self.cfg
        if enc.fps >= cfg.fps and enc.quality >= cfg.quality:
            return None
        quiet_since = max(enc.last_cut or 0.0, enc.last_change)
        if now - quiet_since < cfg.recover_after:
            return None
        if enc.quality < cfg.quality:
            enc.quality = min(cfg.quality, enc.quality + cfg.quality_step)
        else:
            enc.fps = min(cfg.fps, enc.fps + cfg.fps_step)
        enc.raises += 1
        enc.last_change = now
        self._next_advert = now
        return RateChanged(enc.band, enc.fps, enc.quality, "recovered")

    def next_deadline(self) -> float:
        times = [self._next_advert, self._next_state]
        for enc in self.active():
            times.append(enc.next_due)
            times.append(enc.last_request + self.cfg.expire_periods * self.cfg.request_period)
            if enc.fps < self.cfg.fps or enc.quality < self.cfg.quality:
                times.append(max(enc.last_cut or 0.0, enc.last_change) + self.cfg.recover_after)
        return min(times)

    # ---------------------------------------------------------------------- messages
    def advert(self) -> P.Advert:
        self._advert_seq += 1
        return P.Advert(self.stream, self.incarnation, self._advert_seq,
                        self.cfg.request_period,
                        tuple(P.Offer(e.band, e.resolution, e.active, e.fps, e.quality)
                              for e in self.encodings))

    def state(self, now: float) -> P.State:
        return P.State(self.stream, self.incarnation, self.media_ms(now), self.cfg.state_period,
                       tuple(P.EncodingState(e.band, e.resolution, e.fps, e.quality, e.frames)
                             for e in self.active()), self.server)


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

    def on_state(self, state: P.State, now: float) -> None:
        if self.state is not None and state.stream != self.state.stream \
                and state.incarnation < self.state.incarnation:
            return  # an older stream's leftovers
        self.state, self.last_heard = state, now
        self.states += 1

    def dead_after(self) -> float:
        """The primary's own period decides: ``dead_after`` or 4 of its periods, the larger.
        Before any state was heard, five times that (a backup started first waits for the
        primary to come up before it streams on its own)."""
        if self.state is None:
            return 5 * max(self.cfg.dead_after, 4 * self.cfg.state_period)
        return max(self.cfg.dead_after, 4 * self.state.period)

    def next_deadline(self) -> float:
        return (self.last_heard if self.last_heard is not None else self.started) \
            + self.dead_after()

    def poll(self, now: float) -> TakeOver | None:
        if self.taken_over or now < self.next_deadline():
            return None
        self.taken_over = True
        since = self.last_heard if self.last_heard is not None else self.started
        return TakeOver(self.state, now - since)
