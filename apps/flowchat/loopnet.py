"""A deterministic in-memory multicast network for :class:`~flowchat.igo.SiteOrdering`.

No routers: every ``Send`` of a site reaches each other site that listens to its band after a
per-pair delay, FIFO per (sender, receiver) like a path through the flow tree, unless the
pair is cut (a partition) or the frame is lost (seeded loss). Used by the unit and property
tests and handy for trying the protocol out; the simulator adapter
(:mod:`flowchat.sim_adapter`) runs the same machines over real router cores instead.

    net = LoopNet(IGOConfig(sites=("a", "b", "c")), seed=1)
    net.submit("a", b"hello")
    net.run_until(3.0)
    net.log["b"]        # deliveries at b
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .igo import (
    Conflict,
    Deliver,
    Delivery,
    FrameAuth,
    IGOConfig,
    MembershipChange,
    OutboxFull,
    Send,
    SiteOrdering,
    StateChange,
    ViewChange,
    ViewInstalled,
)


class LoopNet:
    def __init__(self, config: IGOConfig, *, seed: int = 0, delay: float = 0.01,
                 jitter: float = 0.0, loss: float = 0.0, tick: float = 0.05,
                 sites: Iterable[str] | None = None,
                 delay_fn: Callable[[str, str, float], float] | None = None,
                 auth: Mapping[str, FrameAuth] | None = None) -> None:
        self.cfg = config
        self.rng = random.Random(seed)
        self.delay = delay
        self.jitter = jitter
        self.loss = loss
        self.tick_interval = tick
        self.delay_fn = delay_fn
        self.now = 0.0
        names = list(sites) if sites is not None else list(config.sites)
        self.sites = {s: SiteOrdering(config, s, 0.0, incarnation=1000 + i,
                                      auth=(auth or {}).get(s))
                      for i, s in enumerate(names)}
        self.bands = {s: set(o.bands()) for s, o in self.sites.items()}
        self._q: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self._last_arrival: dict[tuple[str, str], float] = defaultdict(float)
        self.cut: set[frozenset[str]] = set()  #: pairs that cannot talk now
        self.log: dict[str, list[Delivery]] = {s: [] for s in self.sites}
        self.refused: dict[str, int] = {s: 0 for s in self.sites}  #: submits not taken
        self.events: dict[str, list[Any]] = {s: [] for s in self.sites}
        self.sent: dict[str, int] = defaultdict(int)
        self.frames = 0
        self.dropped = 0
        #: a fault to inject: frames (src, dst, send) for which it returns True are lost
        self.drop: Callable[[str, str, Send], bool] | None = None
        self.send_log: list[tuple[str, float, int]] = []  #: (site, time, seq) of submits
        self.delivered_at_send: dict[tuple[str, int], set[tuple[str, int]]] = {}
        for s, o in self.sites.items():
            self._apply(s, o.finish(0.0))
        self.at(0.0, self._tick)

    # ------------------------------------------------------------------ scheduling
    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._q, (max(t, self.now), self._seq, fn, args))

    def run_until(self, t: float) -> None:
        while self._q and self._q[0][0] <= t:
            when, _, fn, args = heapq.heappop(self._q)
            self.now = when
            fn(*args)
        self.now = max(self.now, t)

    def _tick(self) -> None:
        for s, o in self.sites.items():
            self._apply(s, o.tick(self.now))
        self.at(self.now + self.tick_interval, self._tick)

    # ------------------------------------------------------------------ faults
    def partition(self, *groups: Iterable[str]) -> None:
        """Cut every pair of sites that are not in the same group."""
        gs = [set(g) for g in groups]
        self.cut = set()
        names = list(self.sites)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if not any(a in g and b in g for g in gs):
                    self.cut.add(frozenset((a, b)))

    def heal(self) -> None:
        self.cut = set()

    # ------------------------------------------------------------------ traffic
    def submit(self, site: str, payload: bytes = b"") -> None:
        o = self.sites[site]
        seq = o.seq + 1
        self.send_log.append((site, self.now, seq))
        self.delivered_at_send[(site, seq)] = {(d.origin, d.seq) for d in self.log[site]}
        try:
            self._apply(site, o.submit(payload or f"{site}#{seq}".encode(), self.now))
        except OutboxFull:  # congested (or a long view change): the message was not taken
            self.refused[site] += 1
            self.send_log.pop()

    def _apply(self, site: str, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, Send):
                self._multicast(site, a)
            elif isinstance(a, Deliver):
                self.log[site].append(a.delivery)
            elif isinstance(a, (MembershipChange, StateChange, Conflict, ViewChange,
                                ViewInstalled)):
                self.events[site].append(a)

    def _multicast(self, src: str, a: Send) -> None:
        self.sent[a.kind] += 1
        for dst in self.sites:
            if dst == src or a.band not in self.bands[dst]:
                continue
            self.frames += 1
            if (frozenset((src, dst)) in self.cut or (self.loss and self.rng.random() < self.loss)
                    or self.drop is not None and self.drop(src, dst, a)):
                self.dropped += 1
                continue
            d = self.delay_fn(src, dst, self.now) if self.delay_fn else self.delay
            if self.jitter:
                d += self.rng.uniform(0, self.jitter)
            t = max(self.now + d, self._last_arrival[(src, dst)])  # FIFO per path
            self._last_arrival[(src, dst)] = t
            self.at(t, self._arrive, src, dst, a.band, a.payload)

    def inject(self, dst: str, band: int, payload: bytes) -> None:
        """A frame from outside the room's sites (an attacker on the flow) reaching *dst*
        now; whatever the site does about it is carried out like any other action."""
        self._apply(dst, self.sites[dst].on_message(band, payload, self.now))

    def _arrive(self, src: str, dst: str, band: int, payload: bytes) -> None:
        if frozenset((src, dst)) in self.cut:  # cut while in flight
            self.dropped += 1
            return
        self._apply(dst, self.sites[dst].on_message(band, payload, self.now))

    # ------------------------------------------------------------------ inspection
    def order(self, site: str, include_late: bool = True) -> list[tuple[str, int]]:
        return [(d.origin, d.seq) for d in self.log[site] if include_late or not d.late]

    def states(self, site: str) -> list[StateChange]:
        return [e for e in self.events[site] if isinstance(e, StateChange)]
