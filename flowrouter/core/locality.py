"""Measured locality, the router's part: a link's costs follow its measured RTT and throughput.

With ``RouterParams.locality_mapping`` set, each router link gets a
:class:`~flowrouter.core.measured.LinkMeter` once it has samples (RTT from the soft state's
liveness echo, throughput from the shell's busy-time rate); when the meter moves a modifier,
the link's delay and bandwidth costs change (geography stays as configured) and forwarding,
the fast path included, charges the new costs.

A part of the router (see :mod:`flowrouter.core.router`): its own object, owning the meters,
over the shared :class:`~flowrouter.core.state.RouterState`; it calls no other part. The soft
state gives it RTT samples (:class:`~flowrouter.core.interfaces.RttSink`), the links part tells
it when a link closes (:class:`~flowrouter.core.interfaces.LinkMeters`).

May import :mod:`flowrouter.wire` and the core's shared modules (state, tables, measured);
never another part.
"""

from __future__ import annotations

from typing import Any

from flowrouter.core.measured import LinkMeter
from flowrouter.core.state import RouterState
from flowrouter.core.tables import Modifiers
from flowrouter.wire import control as C
from flowrouter.wire.header import Locality


class MeasuredLocality:
    """A meter per measured router link, and the costs it sets."""

    def __init__(self, state: RouterState) -> None:
        self.state = state
        #: a meter per router link once it has samples, and the link's configured costs
        #: (geography stays; the rest when unmeasured)
        self.meters: dict[int, LinkMeter] = {}
        self._configured: dict[int, Modifiers] = {}

    def measure_rtt(self, link_id: int, rtt: float, now: float) -> bool:
        """One RTT sample of a link (from the link liveness echo); True if its costs
        changed."""
        meter = self._meter(link_id)
        return meter is not None and meter.rtt_sample(rtt, now) and self._apply(link_id)

    def measure_throughput(self, link_id: int, bps: float, now: float) -> bool:
        """One throughput sample (bits/s over a period the link had data waiting)."""
        meter = self._meter(link_id)
        return (meter is not None and meter.throughput_sample(bps, now)
                and self._apply(link_id))

    def link_closed(self, link_id: int) -> None:
        self.meters.pop(link_id, None)
        self._configured.pop(link_id, None)

    def status(self, link_id: int) -> dict[str, Any] | None:
        """What the status query shows of a link's measurements (None: not measured)."""
        meter = self.meters.get(link_id)
        return None if meter is None else meter.status()

    def _meter(self, link_id: int) -> LinkMeter | None:
        mapping = self.state.p.locality_mapping
        link = self.state.links.get(link_id)
        if mapping is None or link is None or link.role is not C.Role.ROUTER:
            return None
        meter = self.meters.get(link_id)
        if meter is None:
            meter = self.meters[link_id] = LinkMeter(mapping)
            mods = link.modifiers
            self._configured[link_id] = Modifiers(
                bandwidth=mods[Locality.BANDWIDTH], delay=mods[Locality.DELAY],
                geography=mods[Locality.GEOGRAPHY])
        return meter

    def _apply(self, link_id: int) -> bool:
        return self.set_link_modifiers(
            link_id, self.meters[link_id].modifiers(self._configured[link_id]))

    def set_link_modifiers(self, link_id: int, modifiers: Modifiers) -> bool:
        """Give a link new locality costs (its delay and bandwidth measured, its geography
        as configured); True if they changed. The forwarding fast path is told, so both
        paths apply the same costs."""
        link = self.state.links.get(link_id)
        if link is None:
            return False
        new = modifiers.as_tuple()
        if link.modifiers == new:
            return False
        link.modifiers = new
        self.state.link_changed(link_id)
        self.state.counters["locality.modifier-changes"] += 1
        return True
