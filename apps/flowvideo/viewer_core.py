"""A viewer's decisions, sans-I/O: which band to subscribe to, when to refresh its request,
what to report when its queue overflows, and the playout accounting (gaps, underruns).

A viewer first hears only the advertisement band. From an advertisement it picks the
resolution it wants (an exact ``WxH``, or ``lowest``/``highest`` on offer) and says
:class:`Subscribe` (the shell listens to that band and drops the old one) and sends a request
at once; ``poll(now)`` then refreshes the request every request period (the advertisement
carries it). Frames are checked (band, size, stream) before they are shown.

Congestion (what the streamer's rate control hears from this viewer, for its band only): the
viewer measures each frame's **queueing delay** (arrival time minus media time, above the
least seen in this incarnation of the stream: clocks need not agree, only the part that
grows counts), counts **lost frames** (numbers missing on its band, within one incarnation),
and notes **link-congested faults** a router sent on the fault band (they reach every member
of the flow, so one counts only with a loss, a delay or a stall of this viewer's own: a router
that sheds a picture's fragments can starve a band entirely, and then the only evidence is
that pictures stopped coming; such a **stall** is reported every ``STALL_REPORT`` seconds while
it lasts after a fault). It reports on
the feedback band when it lost frames or its delay is over ``delay_limit``, at most every
``report_interval``, with the delay it measures and the picture bytes per second it received
over the last ``RATE_WINDOW`` (under congestion, what its path carries: the streamer cuts
the frame rate to fit it); the streamer decides what to cut.

Monotonic playout: within a stream a frame whose number or media time does not move past the
last one shown (a late frame of an old primary, a reordering) is not shown (``backwards``).
Inter-frame codecs: after joining, switching or a loss the viewer shows nothing until a key
picture (``waiting_key``), and asks for one with its next request (``Request.key``).

Sound (when the viewer listens to the audio band): chunks of the same stream are played as
they come (:class:`Play`), numbers missing are counted (``audio_lost``), and the **audio/video
skew** is measured: how much later a chunk's sound is than the newest picture, both against
the stream's media clock (a chunk's offset is its arrival minus the media time of its end,
when all its samples existed; a picture's its arrival minus its media time). A player that
presents both on that clock is in sync to within this skew (``av_skew``, ``max_av_skew``).

Playout accounting: a player that shows frames ``playout`` seconds after they arrive runs dry
only when no frame arrives for longer than ``playout``; ``underruns`` counts such gaps and
``gaps`` keeps the recent long ones (a failover, a move) for the report. (The terminal and
web viewers show frames at once; the buffer is the model the bounds are stated against.)

Imports only the standard library and :mod:`flowvideo.protocol`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from . import protocol as P
from .protocol import Resolution

MIN_REQUEST_PERIOD = 0.1  #: seconds between a viewer's requests at least ...
MAX_REQUEST_PERIOD = 60.0  #: ... and at most, whatever an advertisement says
RATE_WINDOW = 1.0  #: seconds of arrivals the received rate is measured over
STALL_AFTER = 1.0  #: no picture for this long (or 3 frame periods) after a fault: a stall
STALL_REPORT = 2.0  #: seconds between two stall reports at least
FAULT_MEMORY = 5.0  #: a link-congested fault counts this long (routers repeat them slower)


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


@dataclass(frozen=True)
class Play:
    chunk: P.Audio


Action = Subscribe | SendMsg | Show | Play


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
    lost: int = 0            #: frame numbers missing (dropped on the path)
    backwards: int = 0       #: frames not shown: number or media time not past the last
    waiting_key: int = 0     #: inter-frame pictures not shown while waiting for a key one
    congested: int = 0       #: link-congested faults heard on the fault band
    stalls: int = 0          #: stalls reported (no picture for a while after a fault)
    delay: float = 0.0       #: the last frame's queueing delay (s)
    max_delay: float = 0.0
    audio_chunks: int = 0
    audio_lost: int = 0
    av_skew: float = 0.0     #: the last chunk's sound minus the newest picture, in lateness
    max_av_skew: float = 0.0  #: the largest skew either way


class ViewerCore:
    def __init__(self, name: str, want: Resolution | str | None, now: float, *,
                 playout: float = 2.0, delay_limit: float = 0.3,
                 report_interval: float = 0.2) -> None:
        self.name = name
        self.want = want
        self.playout = playout
        self.delay_limit = delay_limit
        self.report_interval = report_interval
        self.codec = P.CODEC_JPEG
        self.need_key = False
        self._base: float | None = None      #: least (arrival - media time) seen
        self._lost_unreported = 0
        self._last_report = float("-inf")
        self._fault_at = float("-inf")
        self._key_asked = False
        self._last_stall = float("-inf")
        self._arrivals: deque[tuple[float, int]] = deque()  #: (time, picture bytes)
        self._video_offset: tuple[float, float] | None = None  #: (arrival, arrival - media)
        self._audio_seq: tuple[int, int, int] | None = None    #: (stream, incarnation, seq)
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
        self.codec = offer.codec
        self.last_seq = None
        self._arrivals.clear()
        self.need_key = offer.codec != P.CODEC_JPEG
        return [Subscribe(offer.band, offer.resolution), self._request(now, key=True)]

    def set_want(self, want: Resolution | str | None, now: float) -> list[Action]:
        self.want = want
        if want is None:
            self.band = self.resolution = None
            return []
        return self.on_advert(self.advert, now) if self.advert else []

    def _request(self, now: float, key: bool = False) -> SendMsg:
        assert self.band is not None
        period = self.advert.request_period if self.advert else 1.0
        # the advertisement's period, within sane bounds: a forged advert must not make
        # every viewer flood the request band (nor fall silent for days)
        period = min(max(period, MIN_REQUEST_PERIOD), MAX_REQUEST_PERIOD)
        self._next_request = now + period
        self.stats.requests += 1
        self._key_asked = key
        return SendMsg(P.BAND_REQUEST, P.encode_request(P.Request(self.name, self.band, key)))

    def rejoined(self, now: float) -> list[Action]:
        """After a move to another router: ask again at once (the shell re-subscribed)."""
        return [self._request(now)] if self.band is not None else []

    # ---------------------------------------------------------------------- time
    def poll(self, now: float) -> list[Action]:
        out: list[Action] = []
        if self.band is not None and now >= self._next_request:
            out.append(self._request(now, key=self.need_key))
        return out + self._stalled(now)

    def next_deadline(self) -> float | None:
        if self.band is None:
            return None
        stall = self._stall_check()
        return self._next_request if stall is None else min(self._next_request, stall)

    def _stall_after(self) -> float:
        offer = next((o for o in self.advert.offers if o.band == self.band), None) \
            if self.advert else None
        return max(STALL_AFTER, 3 / offer.fps) if offer and offer.fps > 0 else STALL_AFTER

    def _stall_check(self) -> float | None:
        """When a stall would be reported (None: no recent fault, nothing to watch)."""
        last = self.stats.last_at
        if last is None or self._fault_at == float("-inf"):
            return None
        return max(last + self._stall_after(), self._last_stall + STALL_REPORT)

    def _stalled(self, now: float) -> list[Action]:
        at = self._stall_check()
        if at is None or now < at or now - self._fault_at > FAULT_MEMORY \
                or self.band is None:
            return []
        last = self.stats.last_at
        assert last is not None
        gap = now - last
        offer = next((o for o in self.advert.offers if o.band == self.band), None) \
            if self.advert else None
        missing = max(1, round(gap * offer.fps)) if offer else 1
        self._last_stall = self._last_report = now
        self.stats.reports += 1
        self.stats.stalls += 1
        return [SendMsg(P.BAND_FEEDBACK, P.encode_feedback(P.Feedback(
            self.name, self.band, missing, round(gap * 1000), True, 0,
            self.received_rate(now))))]

    # ---------------------------------------------------------------------- frames
    def on_frame(self, frame: P.Frame, now: float) -> list[Action]:
        s = self.stats
        if frame.band != self.band:
            s.wrong_band += 1
            return []
        if self.resolution is None or not self.resolution.admits(frame.resolution):
            s.wrong_size += 1
            return []
        out: list[Action] = []
        if frame.stream != self.stream:
            self.stream, self.incarnation = frame.stream, frame.incarnation
            self.last_media_ms = self.last_seq = self._base = None
            self._arrivals.clear()
            s.streams += 1
        elif frame.incarnation < self.incarnation:
            s.stale += 1
            return []
        elif frame.incarnation > self.incarnation:
            self.incarnation = frame.incarnation
            self._base = None  # another streamer's clock
            s.takeovers += 1
        elif self.last_seq is not None and frame.seq > self.last_seq + 1:
            lost = frame.seq - self.last_seq - 1
            s.lost += lost
            self._lost_unreported += lost
            self.need_key = self.codec != P.CODEC_JPEG
        if (self.last_seq is not None and frame.seq <= self.last_seq) or \
                (self.last_media_ms is not None and frame.media_ms <= self.last_media_ms):
            s.backwards += 1
            return []
        self.last_media_ms = frame.media_ms
        out += self._measure(frame, now)
        if self.need_key:
            if not frame.key:
                s.waiting_key += 1
                self.last_seq, self.last_media_ms = frame.seq, frame.media_ms
                if not self._key_asked and self.band is not None:
                    out.append(self._request(now, key=True))
                return out
            self.need_key = self._key_asked = False
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
        s.bytes += len(frame.picture)
        self.last_seq = frame.seq
        self.last_media_ms = frame.media_ms
        return out + [Show(frame)]

    # ---------------------------------------------------------------------- congestion
    def _measure(self, frame: P.Frame, now: float) -> list[Action]:
        """The frame's queueing delay; a report when it or a loss says congestion."""
        s = self.stats
        self._arrivals.append((now, len(frame.picture)))
        while self._arrivals[0][0] < now - RATE_WINDOW:
            self._arrivals.popleft()
        offset = now - frame.media_ms / 1000
        self._video_offset = (now, offset)
        if self._base is None or offset < self._base:
            self._base = offset
        s.delay = offset - self._base
        s.max_delay = max(s.max_delay, s.delay)
        return self._maybe_report(now)

    def _maybe_report(self, now: float) -> list[Action]:
        s = self.stats
        lost = self._lost_unreported
        congested = now - self._fault_at <= 1.0 and (lost > 0 or s.delay >= self.delay_limit / 2)
        if not (lost or congested or s.delay >= self.delay_limit):
            return []
        if self.band is None or now - self._last_report < self.report_interval:
            return []
        self._last_report = now
        self._lost_unreported = 0
        s.reports += 1
        return [SendMsg(P.BAND_FEEDBACK, P.encode_feedback(P.Feedback(
            self.name, self.band, lost, round(s.delay * 1000), congested,
            self.last_media_ms or 0, self.received_rate(now))))]

    def received_rate(self, now: float) -> int:
        """Picture bytes per second over the last RATE_WINDOW: the bytes of the pictures
        after the window's first over the time from its arrival to the last one's (under
        congestion pictures arrive back to back: the path's rate). 0 with fewer than three
        pictures or a third of a window of them."""
        a = self._arrivals
        if len(a) < 3 or a[-1][0] - a[0][0] < RATE_WINDOW / 3:
            return 0
        return round(sum(n for _, n in list(a)[1:]) / (a[-1][0] - a[0][0]))

    def on_audio(self, chunk: P.Audio, now: float) -> list[Action]:
        """A chunk of sound: played if it belongs to the stream shown (see the module docs
        for the skew)."""
        s = self.stats
        if self.stream is not None and (chunk.stream, chunk.incarnation) != \
                (self.stream, self.incarnation):
            s.stale += 1
            return []
        key = (chunk.stream, chunk.incarnation)
        if self._audio_seq is not None and self._audio_seq[:2] == key:
            if chunk.seq <= self._audio_seq[2]:
                s.backwards += 1
                return []
            s.audio_lost += chunk.seq - self._audio_seq[2] - 1
        self._audio_seq = (*key, chunk.seq)
        s.audio_chunks += 1
        if self._video_offset is not None and now - self._video_offset[0] <= 1.0:
            end_ms = chunk.media_ms + 1000 * chunk.samples / max(1, chunk.rate)
            s.av_skew = (now - end_ms / 1000) - self._video_offset[1]
            s.max_av_skew = max(s.max_av_skew, abs(s.av_skew))
        return [Play(chunk)]

    def on_fault(self, congested: bool, now: float) -> list[Action]:
        """A router said on the fault band that it drops this flow's frames on a congested
        link (*congested*; other faults are not about the rate)."""
        if not congested:
            return []
        self.stats.congested += 1
        self._fault_at = now
        return self._maybe_report(now)

    def on_overflow(self, dropped: int, now: float) -> list[Action]:
        """Our queue for the video band dropped *dropped* frames: tell the streamer."""
        if self.band is None or dropped <= 0:
            return []
        self.stats.dropped += dropped
        self.stats.reports += 1
        self.need_key = self.codec != P.CODEC_JPEG
        return [SendMsg(P.BAND_FEEDBACK, P.encode_feedback(P.Feedback(
            self.name, self.band, dropped, round(self.stats.delay * 1000),
            media_ms=self.last_media_ms or 0)))]
