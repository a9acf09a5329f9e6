"""A viewer's decisions, sans-I/O: which band to subscribe to, when to refresh its request,
what to report when its queue overflows, and the playout accounting (gaps, underruns).

A viewer first hears only the advertisement band. From an advertisement it picks the
resolution it wants (an exact ``WxH``, or ``lowest``/``highest`` on offer) and says
:class:`Subscribe` (the shell listens to that band and drops the old one) and sends a request
at once; ``poll(now)`` then refreshes the request every request period (the advertisement
carries it). Frames are checked (band, size, stream) before they are shown.

Playout accounting: a player that shows frames ``playout`` seconds after they arrive runs dry
only when no frame arrives for longer than ``playout``; ``underruns`` counts such gaps and
``gaps`` keeps the recent long ones (a failover, a move) for the report. (The terminal and
web viewers show frames at once; the buffer is the model the bounds are stated against.)

Imports only the standard library and :mod:`flowvideo.protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import protocol as P
from .protocol import Resolution

MIN_REQUEST_PERIOD = 0.1  #: seconds between a viewer's requests at least ...
MAX_REQUEST_PERIOD = 60.0  #: ... and at most, whatever an advertisement says


@dataclass(frozen=True)
class Subscribe:
    band: int
    resolution: Resolution


@dataclass(frozen=True)
class SendMsg:
    band: int
    payload: bytes


@dataclass(frozen=True)
class Show:
    frame: P.Frame


Action = Subscribe | SendMsg | Show


def parse_want(text: str) -> Resolution | str:
    """``WxH``, ``lowest`` or ``highest`` (ValueError otherwise)."""
    t = text.strip().lower()
    if t in ("lowest", "highest"):
        return t
    return Resolution.parse(t)


@dataclass
class ViewerStats:
    frames: int = 0
    bytes: int = 0
    first_at: float | None = None
    last_at: float | None = None
    max_gap: float = 0.0
    underruns: int = 0
    gaps: list[tuple[float, float]] = field(default_factory=list)  #: (at, gap) over 0.5 s
    takeovers: int = 0       #: frames from a new incarnation of the same stream
    streams: int = 0         #: distinct streams seen
    wrong_band: int = 0
    wrong_size: int = 0
    stale: int = 0           #: frames of an older incarnation after a takeover
    requests: int = 0
    reports: int = 0
    dropped: int = 0         #: what our queue reported dropping


class ViewerCore:
    def __init__(self, name: str, want: Resolution | str | None, now: float, *,
                 playout: float = 2.0) -> None:
        self.name = name
        self.want = want
        self.playout = playout
        self.advert: P.Advert | None = None
        self.band: int | None = None
        self.resolution: Resolution | None = None
        self.stream: int | None = None
        self.incarnation = 0
        self.last_seq: int | None = None
        self.last_media_ms: int | None = None
        self._next_request = now
        self.stats = ViewerStats()

    # ---------------------------------------------------------------------- choosing
    def choose(self, advert: P.Advert) -> P.Offer | None:
        if self.want is None or not advert.offers:
            return None
        if isinstance(self.want, Resolution):
            return advert.offer_for(self.want)
        ordered = sorted(advert.offers, key=lambda o: o.resolution.pixels)
        return ordered[0] if self.want == "lowest" else ordered[-1]

    def on_advert(self, advert: P.Advert, now: float) -> list[Action]:
        self.advert = advert
        offer = self.choose(advert)
        if offer is None or offer.band == self.band:
            return []
        self.band, self.resolution = offer.band, offer.resolution
        self.last_seq = None
        return [Subscribe(offer.band, offer.resolution), self._request(now)]

    def set_want(self, want: Resolution | str | None, now: float) -> list[Action]:
        self.want = want
        if want is None:
            self.band = self.resolution = None
            return []
        return self.on_advert(self.advert, now) if self.advert else []

    def _request(self, now: float) -> SendMsg:
        assert self.band is not None
        period = self.advert.request_period if self.advert else 1.0
        # the advertisement's period, within sane bounds: a forged advert must not make
        # every viewer flood the request band (nor fall silent for days)
        period = min(max(period, MIN_REQUEST_PERIOD), MAX_REQUEST_PERIOD)
        self._next_request = now + period
        self.stats.requests += 1
        return SendMsg(P.BAND_REQUEST, P.encode_request(P.Request(self.name, self.band)))

    def rejoined(self, now: float) -> list[Action]:
        """After a move to another router: ask again at once (the shell re-subscribed)."""
        return [self._request(now)] if self.band is not None else []

    # ---------------------------------------------------------------------- time
    def poll(self, now: float) -> list[Action]:
        if self.band is not None and now >= self._next_request:
            return [self._request(now)]
        return []

    def next_deadline(self) -> float | None:
        return self._next_request if self.band is not None else None

    # ---------------------------------------------------------------------- frames
    def on_frame(self, frame: P.Frame, now: float) -> list[Action]:
        s = self.stats
        if frame.band != self.band:
            s.wrong_band += 1
            return []
        if frame.resolution != self.resolution:
            s.wrong_size += 1
            return []
        if frame.stream != self.stream:
            self.stream, self.incarnation = frame.stream, frame.incarnation
            self.last_media_ms = None
            s.streams += 1
        elif frame.incarnation < self.incarnation:
            s.stale += 1
            return []
        elif frame.incarnation > self.incarnation:
            self.incarnation = frame.incarnation
            s.takeovers += 1
        if s.last_at is not None:
            gap = now - s.last_at
            s.max_gap = max(s.max_gap, gap)
            if gap > self.playout:
                s.underruns += 1
            if gap > 0.5:
                s.gaps.append((now, gap))
                del s.gaps[:-20]
        if s.first_at is None:
            s.first_at = now
        s.last_at = now
        s.frames += 1
        s.bytes += len(frame.jpeg)
        self.last_seq = frame.seq
        self.last_media_ms = frame.media_ms
        return [Show(frame)]

    def on_overflow(self, dropped: int, now: float) -> list[Action]:
        """Our queue for the video band dropped *dropped* frames: tell the streamer."""
        if self.band is None or dropped <= 0:
            return []
        self.stats.dropped += dropped
        self.stats.reports += 1
        return [SendMsg(P.BAND_FEEDBACK,
                        P.encode_feedback(P.Feedback(self.name, self.band, dropped)))]
