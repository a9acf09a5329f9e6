"""One resolution band's rate control, sans-I/O: what its frame rate, picture quality and
picture scale are, given the congestion signals its viewers report and the time.

The streamer hears of congestion only from its viewers (:class:`~flowvideo.protocol.Feedback`
on the feedback band): frames they lost (their own queue overflowed, or frame numbers are
missing because a router dropped them), a router's link-congested fault they heard on the
fault band, and the queueing delay they measure (arrival time minus media time, above the
least seen: a queue somewhere on the path is filling). :class:`BandRate` turns them into
steps down and, when they stop, steps back up.

**Down** (:meth:`BandRate.congested`): the frame rate drops to what fits the rate the
viewer received (``FIT`` of its picture bytes per second over the band's mean picture size,
when the report says it; less while a queue of the reported delay drains), else halves,
down to ``min_fps``; at the floor the quality drops by ``quality_step`` down to
``min_quality`` (at once when less than half the band's bytes fit); then the picture scale
doubles (the band's pictures go at 1/2, then 1/4 ... of its size) up to ``max_scale``.
Reports within ``hold`` of the last step are one episode, and so are reports about frames
captured before the last step (a report names the media time of the frame it measured): only
frames sent at the new rate can tell whether it fits. The first delay report on such a frame
is the reference (those frames wait behind the queue the old rate built); one ``hold`` later
a delay that did not fall below it steps down again: a queue that drains needs no further
cut, one that still grows does. Losses step down at once (after the hold).

**Up** (:meth:`BandRate.recover`): after ``recover_wait`` seconds without any report (plus
the path's delay: the longest delay reported in the last episode, since a raise shows at the
viewer only that much later) the
last step down is undone, one notch at a time in reverse order (scale, quality, then the
frame rate by ``fps_step``). Each raise is a probe: a report within two such waits of it
doubles ``recover_wait`` (up to ``max_recover_after``), so a band at the edge of its path's
capacity does not oscillate quickly; a raise that holds halves it back toward
``recover_after``.

Imports only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

DRAINING = 0.02  #: a delay this much below the reference: the queue drains (s)
PROBE = 2.0      #: a report within this many waits after a raise: the raise was too much
FIT = 0.85       #: share of the received rate a cut aims at (headers, other bands, margin)
DRAIN_TIME = 4.0  #: a cut aims to drain the reported queue in about this long (s)
MEAN_WEIGHT = 0.2  #: weight of a new picture in the mean picture size


@dataclass(frozen=True)
class RateLimits:
    """The configured values and bounds of a band's rate control."""

    fps: float = 10.0
    quality: int = 75
    min_fps: float = 1.0
    min_quality: int = 20
    quality_step: int = 20
    fps_step: float = 2.0
    max_scale: int = 4
    hold: float = 0.5
    recover_after: float = 2.0
    max_recover_after: float = 16.0
    delay_limit: float = 0.3   #: queueing delay (s) a viewer reports and a cut needs


@dataclass
class BandRate:
    """A band's current rate, quality and scale and the clocks of its episodes."""

    limits: RateLimits
    fps: float = 0.0
    quality: int = 0
    scale: int = 1
    last_cut: float | None = None
    last_change: float = 0.0
    last_signal: float | None = None   #: the last congestion report, acted on or not
    ref_delay: float | None = None     #: the first delay heard at the new rate ...
    ref_at: float = 0.0                #: ... and when
    recover_wait: float = 0.0
    path_delay: float = 0.0            #: the longest delay reported in the last episode
    last_raise: float | None = None
    picture_bytes: float = 0.0         #: mean size of its pictures lately
    cuts: int = 0
    raises: int = 0

    def __post_init__(self) -> None:
        self.reset(self.last_change)

    def reset(self, now: float) -> None:
        """The configured values (a band starting)."""
        lim = self.limits
        self.fps, self.quality, self.scale = lim.fps, lim.quality, 1
        self.last_cut = self.last_signal = self.last_raise = None
        self.last_change, self.ref_delay = now, None
        self.recover_wait = lim.recover_after
        self.path_delay = 0.0

    def resume(self, fps: float, quality: int, scale: int, now: float) -> None:
        """Continue another streamer's values, clamped to ours."""
        lim = self.limits
        self.fps = min(max(fps, lim.min_fps), lim.fps)
        self.quality = min(max(quality, lim.min_quality), lim.quality)
        self.scale = min(max(scale, 1), lim.max_scale)
        self.last_change = now

    @property
    def full(self) -> bool:
        lim = self.limits
        return self.fps >= lim.fps and self.quality >= lim.quality and self.scale <= 1

    def sent(self, nbytes: int) -> None:
        """A picture of *nbytes* went out (its size feeds the mean the cuts aim with)."""
        if self.picture_bytes <= 0:
            self.picture_bytes = float(nbytes)
        else:
            self.picture_bytes += MEAN_WEIGHT * (nbytes - self.picture_bytes)

    def is_signal(self, dropped: int, delay: float, congested: bool) -> bool:
        """Whether a report says this band's path is congested."""
        return dropped > 0 or congested or delay >= self.limits.delay_limit

    # ---------------------------------------------------------------------- down
    def congested(self, now: float, *, lost: bool, delay: float,
                  captured: float | None = None, received: int = 0) -> bool:
        """A congestion report that passed the streamer's checks: step down if it is a new
        episode (see the module docs). *captured*: when the frame the report measured was
        captured (on the same clock as *now*; None: unknown); *received*: picture bytes per
        second the viewer got lately (0: unknown). Returns whether anything changed."""
        lim = self.limits
        if self.last_signal is not None and now - self.last_signal > self._wait():
            self.path_delay = 0.0  # a new episode
        self.path_delay = max(self.path_delay, min(delay, lim.max_recover_after))
        probe_failed = self.last_raise is not None and now - self.last_raise < PROBE * self._wait()
        self.last_signal = now
        raised_since = self.last_raise is not None and self.last_cut is not None \
            and self.last_raise > self.last_cut
        if self.last_cut is not None and not raised_since:
            since = now - self.last_cut
            if since < lim.hold or (captured is not None and captured < self.last_cut):
                return False  # the same episode, or news from before the last step
            if not lost and captured is not None:
                if self.ref_delay is None:
                    self.ref_delay, self.ref_at = delay, now  # the new rate's first word
                    return False
                if now - self.ref_at < lim.hold or delay < self.ref_delay - DRAINING:
                    return False  # too soon to tell, or the queue drains: the step works
        if not self._step_down(received, delay):
            return False
        if probe_failed:  # the last probe upward failed: wait longer before the next one
            self.recover_wait = min(lim.max_recover_after, 2 * self.recover_wait)
            self.last_raise = None
        self.last_cut = self.last_change = now
        self.ref_delay = None
        self.cuts += 1
        return True

    def _step_down(self, received: int, delay: float) -> bool:
        lim = self.limits
        # the share of the band's current bytes per second its path carries (None: unknown)
        share = None
        if received and self.picture_bytes:
            drain = max(0.5, 1 - delay / DRAIN_TIME)
            share = FIT * drain * received / (self.picture_bytes * self.fps)
        if self.fps > lim.min_fps:
            fps = self.fps * share if share is not None and share < 1 else self.fps / 2
            self.fps = max(lim.min_fps, round(fps, 1))  # fps travel in tenths
        elif self.quality > lim.min_quality:
            step = self.quality if share is not None and share < 0.5 else lim.quality_step
            self.quality = max(lim.min_quality, self.quality - step)
        elif self.scale < lim.max_scale:
            self.scale *= 2
        else:
            return False
        return True

    # ---------------------------------------------------------------------- up
    def quiet_since(self) -> float:
        return max(self.last_cut or 0.0, self.last_change, self.last_signal or 0.0)

    def next_recover(self) -> float | None:
        """When :meth:`recover` may next raise (None: nothing to recover)."""
        return None if self.full else self.quiet_since() + self._wait()

    def _wait(self) -> float:
        return self.recover_wait + self.path_delay

    def recover(self, now: float) -> bool:
        """Undo one step down if the band was quiet for ``recover_wait``."""
        at = self.next_recover()
        if at is None or now < at:
            return False
        lim = self.limits
        if self.last_raise is not None:  # the last probe held: probe a little sooner
            self.recover_wait = max(lim.recover_after, self.recover_wait / 2)
        if self.scale > 1:
            self.scale //= 2
        elif self.quality < lim.quality:
            self.quality = min(lim.quality, self.quality + lim.quality_step)
        else:
            self.fps = min(lim.fps, self.fps + lim.fps_step)
        self.raises += 1
        self.last_change = self.last_raise = now
        return True
