"""Measured locality: per-link RTT and throughput samples become delay and bandwidth modifiers.

Seed 002 section 3.3: the bandwidth and delay modifiers "may be automatically tuned at flow
routers to reflect current network conditions". This module is the sans-I/O part of that: a
:class:`LinkMeter` per link takes RTT samples (from the link liveness echo) and throughput
samples (bits per second over a busy period: :class:`BusyRate`) with the time passed in,
smooths them, and maps them through a configurable :class:`LocalityMapping` to modifier
units, with hysteresis so a value hovering at a unit boundary does not make the modifier
(and the locality-limited traffic that depends on it) flap. Geography is never
measured: it stays configured.

Mapping (both configurable):

* delay: one unit per ``delay_unit`` seconds of one-way delay (half the smoothed RTT), from
  ``delay_min`` up to ``delay_max``;
* bandwidth: 0 units at ``bandwidth_ref`` bits/s or more, one more unit each time the
  throughput halves (``bandwidth_step`` = 2) below it, up to ``bandwidth_max``.

Smoothing: an exponentially weighted moving average (``alpha``, TCP's 1/8 by default) of the
samples. Hysteresis: the modifier moves to a new unit only when the smoothed value lies more
than ``hysteresis`` units beyond the middle of the current unit's range (0.5 + hysteresis
away from the current unit), after at least ``min_samples`` samples, and at most once per
``hold`` seconds. Samples that are not finite and positive are refused and counted.

May import only :mod:`flowrouter.wire` and the core's data modules (tables).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from flowrouter.core.tables import Modifiers


@dataclass(frozen=True, slots=True)
class LocalityMapping:
    """How measured delay and throughput become modifier units (all limits explicit)."""

    delay_unit: float = 0.005  #: seconds of one-way delay per delay unit
    delay_min: int = 0
    delay_max: int = 255
    bandwidth_ref: float = 1e9  #: bits/s that cost 0 bandwidth units
    bandwidth_step: float = 2.0  #: each time throughput divides by this, one more unit
    bandwidth_max: int = 255
    alpha: float = 0.125  #: EWMA weight of a new sample
    hysteresis: float = 0.25  #: units beyond the current unit's range before moving
    min_samples: int = 3
    hold: float = 5.0  #: seconds between two changes of one modifier

    def __post_init__(self) -> None:
        if not (self.delay_unit > 0 and self.bandwidth_ref > 0 and self.bandwidth_step > 1
                and 0 < self.alpha <= 1 and self.hysteresis >= 0 and self.min_samples >= 1
                and self.hold >= 0 and 0 <= self.delay_min <= self.delay_max <= 255
                and 0 <= self.bandwidth_max <= 255):
            raise ValueError("locality mapping needs delay_unit > 0, bandwidth_ref > 0, "
                             "bandwidth_step > 1, 0 < alpha <= 1, hysteresis >= 0, "
                             "min_samples >= 1, hold >= 0, 0 <= delay_min <= delay_max <= "
                             "255, 0 <= bandwidth_max <= 255")

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> LocalityMapping:
        data = dict(data or {})
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown locality mapping key(s) {unknown}; allowed: "
                             f"{sorted(cls.__dataclass_fields__)}")
        return cls(**data)

    def delay_units(self, one_way: float) -> float:
        """The continuous delay unit value of a one-way delay (seconds)."""
        return one_way / self.delay_unit

    def bandwidth_units(self, bps: float) -> float:
        """The continuous bandwidth unit value of a throughput (bits/s)."""
        if bps >= self.bandwidth_ref:
            return 0.0
        return math.log(self.bandwidth_ref / bps, self.bandwidth_step)


class _Tracker:
    """One smoothed quantity and the modifier unit it maps to, with hysteresis."""

    __slots__ = ("value", "samples", "unit", "changed_at", "changes", "lo", "hi")

    def __init__(self, lo: int, hi: int) -> None:
        self.value: float | None = None
        self.samples = 0
        self.unit: int | None = None
        self.changed_at = -math.inf
        self.changes = 0
        self.lo = lo
        self.hi = hi

    def add(self, sample: float, alpha: float) -> None:
        self.value = sample if self.value is None else self.value + alpha * (sample - self.value)
        self.samples += 1

    def settle(self, x: float, m: LocalityMapping, now: float) -> bool:
        """Move the unit toward continuous value *x* if hysteresis and hold allow."""
        if self.samples < m.min_samples:
            return False
        target = min(self.hi, max(self.lo, int(math.floor(x + 0.5))))
        if self.unit is None:
            self.unit = target
            self.changed_at = now
            return True
        if target == self.unit or now - self.changed_at < m.hold:
            return False
        if abs(x - self.unit) <= 0.5 + m.hysteresis:
            return False
        self.unit = target
        self.changed_at = now
        self.changes += 1
        return True


class BusyRate:
    """Throughput of a link as measured locality means it: the send rate achieved while the
    link's output was backlogged (frames ready to go waited for the link: its rate limit or
    a transport that paused writing). Bytes written per second of such busy time estimate
    what the link can carry (its capacity), not how much was offered (its utilisation): an
    idle or lightly used link gives no sample at all and keeps its modifier.

    Sans-I/O: the shell reports bytes written and when the backlog starts and ends, with
    the time passed in; :meth:`sample` gives bits/s once ``min_busy`` seconds of busy time
    were seen (then starts over), else None (the time so far is kept)."""

    __slots__ = ("since", "busy", "bytes", "min_busy")

    def __init__(self, min_busy: float = 0.05) -> None:
        self.since: float | None = None  #: when the current backlog began
        self.busy = 0.0  #: finished busy seconds not yet sampled
        self.bytes = 0  #: bytes written during busy time not yet sampled
        self.min_busy = min_busy

    def wrote(self, size: int) -> None:
        """Bytes written; counted only while backlogged (they had waited for the link)."""
        if self.since is not None:
            self.bytes += size

    def backlog(self, waiting: bool, now: float) -> None:
        """Whether frames are still waiting after a write attempt."""
        if waiting and self.since is None:
            self.since = now
        elif not waiting and self.since is not None:
            self.busy += now - self.since
            self.since = None

    def sample(self, now: float) -> float | None:
        """Bits/s over the busy time since the last sample, once there is enough of it."""
        busy = self.busy + (now - self.since if self.since is not None else 0.0)
        if busy < self.min_busy or self.bytes <= 0:
            return None
        bps = self.bytes * 8 / busy
        self.busy, self.bytes = 0.0, 0
        if self.since is not None:
            self.since = now
        return bps


class LinkMeter:
    """Measurements of one link and the delay/bandwidth modifiers they give."""

    def __init__(self, mapping: LocalityMapping | None = None) -> None:
        self.m = mapping or LocalityMapping()
        self._rtt = _Tracker(self.m.delay_min, self.m.delay_max)
        self._bw = _Tracker(0, self.m.bandwidth_max)
        self.refused = 0  #: samples that were not finite and positive
        self.last_rtt: float | None = None

    def rtt_sample(self, rtt: float, now: float) -> bool:
        """One round-trip time (seconds); True if the delay modifier changed."""
        if not (isinstance(rtt, (int, float)) and math.isfinite(rtt) and rtt > 0):
            self.refused += 1
            return False
        self.last_rtt = float(rtt)
        self._rtt.add(float(rtt), self.m.alpha)
        assert self._rtt.value is not None
        return self._rtt.settle(self.m.delay_units(self._rtt.value / 2), self.m, now)

    def throughput_sample(self, bps: float, now: float) -> bool:
        """Bits per second achieved over a period when the link had data waiting (so it
        measures what the link can carry, not what was offered); True if the bandwidth
        modifier changed."""
        if not (isinstance(bps, (int, float)) and math.isfinite(bps) and bps > 0):
            self.refused += 1
            return False
        self._bw.add(float(bps), self.m.alpha)
        assert self._bw.value is not None
        return self._bw.settle(self.m.bandwidth_units(self._bw.value), self.m, now)

    @property
    def delay(self) -> int | None:
        """The measured delay modifier (None until enough samples)."""
        return self._rtt.unit

    @property
    def bandwidth(self) -> int | None:
        return self._bw.unit

    def modifiers(self, configured: Modifiers) -> Modifiers:
        """*configured* with delay and bandwidth replaced where measured (geography kept)."""
        out = configured
        if self._rtt.unit is not None:
            out = replace(out, delay=self._rtt.unit)
        if self._bw.unit is not None:
            out = replace(out, bandwidth=self._bw.unit)
        return out

    def status(self) -> dict[str, Any]:
        """Measured values for the router's status (milliseconds and bits/s)."""
        srtt = self._rtt.value
        return {
            "srtt_ms": None if srtt is None else round(srtt * 1e3, 3),
            "last_rtt_ms": None if self.last_rtt is None else round(self.last_rtt * 1e3, 3),
            "rtt_samples": self._rtt.samples,
            "throughput_bps": None if self._bw.value is None else round(self._bw.value),
            "throughput_samples": self._bw.samples,
            "delay_modifier": self._rtt.unit, "bandwidth_modifier": self._bw.unit,
            "delay_changes": self._rtt.changes, "bandwidth_changes": self._bw.changes,
            "refused_samples": self.refused,
        }
