"""Run IGO sites on simulated endpoints (:mod:`flowrouter.testbed.sim`), in virtual time.

One :class:`SimSite` per site: it joins the room flow on :meth:`SiteOrdering.bands` through
its :class:`~flowrouter.testbed.sim.SimEndpoint`, feeds every delivery of those bands to the
state machine, ticks it every ``tick`` virtual seconds, and carries out its actions (``Send``
becomes ``endpoint.send``; deliveries, membership and state changes are recorded and passed to
optional callbacks). The clock is the simulator's, so send and delivery times are virtual.

    net = SimNetwork.from_topology(topo, seed=1, scenario="A1")
    sites = {name: SimSite(net, net.endpoints[ep], flow, cfg, name) for name, ep in ...}
    for s in sites.values(): s.start()
    sites["metropol"].submit(b"hello")
    net.run_until(60)
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import Any

from flowrouter.testbed.sim import Delivery as SimDelivery
from flowrouter.testbed.sim import SimEndpoint, SimNetwork
from flowrouter.wire.flowid import FlowID

from .igo import (
    Deliver,
    Delivery,
    IGOConfig,
    MembershipChange,
    Send,
    SiteOrdering,
    StateChange,
    new_incarnation,
)


class SimSite:
    def __init__(self, net: SimNetwork, endpoint: SimEndpoint, flow: FlowID | str,
                 config: IGOConfig, site: str, *, tick: float = 0.1,
                 incarnation: int | None = None,
                 shown: Iterable[tuple[str, int, int]] = (),
                 sent: tuple[int, int] | None = None,
                 on_deliver: Callable[[Delivery], Any] | None = None,
                 on_event: Callable[[Any], Any] | None = None) -> None:
        self.net = net
        self.ep = endpoint
        self.flow = flow if isinstance(flow, FlowID) else FlowID.parse(flow)
        self.site = site
        self.tick_interval = tick
        # default incarnation: from the virtual start time (a site started again later gets
        # a larger one, as a restart must) and the site's name (deterministic: not hash(),
        # which differs from process to process)
        self.ordering = SiteOrdering(config, site, net.now,
                                     incarnation=incarnation if incarnation is not None
                                     else new_incarnation(net.now, zlib.crc32(site.encode())),
                                     shown=shown, sent=sent)
        self.deliveries: list[Delivery] = []
        self.events: list[MembershipChange | StateChange] = []
        self.on_deliver = on_deliver
        self.on_event = on_event
        self.sent_frames = 0
        self.sent_bytes = 0
        self.send_failures = 0
        self._kind_bytes: dict[str, int] = {}
        self._bands = frozenset(self.ordering.bands())
        self._running = False

    def bytes_by_kind(self) -> dict[str, int]:
        """Bytes this site sent, per kind of frame (data, heartbeat, nack, repair, ...)."""
        return dict(sorted(self._kind_bytes.items()))

    def start(self) -> None:
        self.ep.join(self.flow, sorted(self._bands))
        self.ep.on_delivery = self._on_frame
        self._running = True
        self._apply(self.ordering.tick(self.net.now))
        self.net.after(self.tick_interval, self._tick)

    def stop(self) -> None:
        self._running = False
        self.ep.on_delivery = None

    def submit(self, payload: bytes) -> int:
        """A message from this site's clients; returns its sequence number (see
        :meth:`~flowchat.igo.SiteOrdering.submit` for congestion)."""
        self._apply(self.ordering.submit(payload, self.net.now))
        return self.ordering.seq

    # ------------------------------------------------------------------ internals
    def _tick(self) -> None:
        if not self._running:
            return
        self._apply(self.ordering.tick(self.net.now))
        self.net.after(self.tick_interval, self._tick)

    def _on_frame(self, ep: SimEndpoint, d: SimDelivery) -> None:
        if d.flow != self.flow or d.band not in self._bands:
            return
        self._apply(self.ordering.on_message(d.band, d.payload, self.net.now))

    def _apply(self, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, Send):
                if self.ep.send(self.flow, a.band, a.payload):
                    self.sent_frames += 1
                    self.sent_bytes += len(a.payload)
                    self._kind_bytes[a.kind] = self._kind_bytes.get(a.kind, 0) + len(a.payload)
                else:
                    self.send_failures += 1
            elif isinstance(a, Deliver):
                self.deliveries.append(a.delivery)
                if self.on_deliver is not None:
                    self.on_deliver(a.delivery)
            else:
                self.events.append(a)
                if self.on_event is not None:
                    self.on_event(a)
