"""Run an IGO site on a real flow through flowlib (asyncio, wall-clock time).

:class:`FlowSite` listens on the room flow's IGO bands (:meth:`SiteOrdering.bands`: heartbeat,
repair, order, the data band and this site's inbox band), feeds every message to the state
machine with ``time.time() - clock_origin`` as the clock, ticks it every ``tick`` seconds, and
carries out its actions: ``Send`` becomes ``FlowClient.send_nowait`` (a send that fails while
the client fails over or after it lost its router is counted in ``counters`` and repaired by
the protocol later, as any lost frame), deliveries and events go to the callbacks and, if
``keep`` is set, to :attr:`deliveries` / :attr:`events`. When the room flow is lost for good
(the client gave up on its routers) ``on_lost`` is called; :meth:`FlowSite.rebind` carries on
over a new client with the same ordering state.

Times are wall-clock seconds (``time.time()``), so send-to-delivery latencies between hosts
assume synchronised clocks (they are only displayed and logged; ordering never uses them).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

import flowlib
from flowlib import FlowClient, FlowError, FlowID

from .igo import (
    Conflict,
    Congestion,
    Deliver,
    Delivery,
    FrameAuth,
    IGOConfig,
    MembershipChange,
    Send,
    SiteOrdering,
    StateChange,
    new_incarnation,
)

log = logging.getLogger("flowchat.flow")


class FlowSite:
    def __init__(self, client: FlowClient, flow: FlowID | str, config: IGOConfig, site: str,
                 *, tick: float = 0.1, incarnation: int | None = None,
                 keep: int | None = None, clock_origin: float = 0.0,
                 on_deliver: Callable[[Delivery], Any] | None = None,
                 on_event: Callable[[Any], Any] | None = None,
                 on_lost: Callable[[Exception], Any] | None = None,
                 auth: FrameAuth | None = None,
                 shown: Iterable[tuple[str, int, int]] = (),
                 sent: tuple[int, int] | None = None) -> None:
        self.client = client
        self.flow = flow if isinstance(flow, FlowID) else FlowID.parse(flow)
        self.site = site
        self.tick_interval = tick
        self.clock_origin = clock_origin
        # this run's incarnation: from the wall clock (not self.now(), which may be relative
        # to a shared origin), so a restarted server's is larger than its last run's
        self.ordering = SiteOrdering(config, site, self.now(),
                                     incarnation=incarnation if incarnation is not None
                                     else new_incarnation(time.time()), auth=auth,
                                     shown=shown, sent=sent)
        #: every delivery (keep=None) or the last *keep* ones
        self.deliveries: deque[Delivery] | list[Delivery] = \
            [] if keep is None else deque(maxlen=keep)
        self.events: deque[Any] | list[Any] = [] if keep is None else deque(maxlen=keep)
        self.on_deliver = on_deliver
        self.on_event = on_event
        self.on_lost = on_lost  #: called when the room flow is lost for good (router gone)
        self.counters: Counter[str] = Counter()
        self._listener: flowlib.Listener | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._started = asyncio.Event()
        self._old_version_seen = 0

    def now(self) -> float:
        return time.time() - self.clock_origin

    async def start(self) -> None:
        self._listener = await self.client.listen(self.flow, self.ordering.bands(),
                                                  size=100_000, name=f"igo-{self.site}")
        self._tasks = [asyncio.ensure_future(self._read()),
                       asyncio.ensure_future(self._ticker())]
        self._apply(self.ordering.tick(self.now()))
        self._started.set()

    async def rebind(self, client: FlowClient) -> None:
        """Carry on over a new flowlib client (after the old one lost its router for good):
        listen on the room flow again; the ordering state (sequence numbers, what was
        delivered) is kept, and the protocol repairs what was missed meanwhile."""
        self.client = client
        self._listener = await client.listen(self.flow, self.ordering.bands(), size=100_000,
                                             name=f"igo-{self.site}")
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.ensure_future(self._read()))
        self.counters["flow.rejoined"] += 1
        self._apply(self.ordering.tick(self.now()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        if self._listener is not None and not self.client.closed:
            with contextlib.suppress(FlowError, Exception):
                await self.client.unlisten(self._listener)
        self._listener = None

    def submit(self, payload: bytes) -> int:
        """A message from this site's clients; returns its sequence number (while the site
        is congested the message waits in the outbox; raises
        :class:`~flowchat.igo.OutboxFull` when that is full)."""
        self._apply(self.ordering.submit(payload, self.now()))
        return self.ordering.seq

    # ------------------------------------------------------------------ loops
    async def _read(self) -> None:
        assert self._listener is not None
        try:
            async for msg in self._listener:
                self._apply(self.ordering.on_message(msg.band, msg.payload, self.now()))
                self._warn_old_version()
        except FlowError as exc:
            log.warning("site %s: lost the room flow: %s", self.site, exc)
            self.counters["flow.lost"] += 1
            self._call(self.on_lost, exc)

    def _warn_old_version(self) -> None:
        """One log line for the first frame of an older IGO wire version, then one per
        thousand (all of them counted in the ordering's ``refused.old-version``)."""
        n = self.ordering.counters.get("refused.old-version", 0)
        if n and n != self._old_version_seen and (self._old_version_seen == 0
                                                   or n % 1000 == 0):
            log.warning("site %s: refused %d IGO frame(s) of an older wire version (no "
                        "incarnations); every site server of the room must be upgraded",
                        self.site, n)
        self._old_version_seen = n

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval)
            self._apply(self.ordering.tick(self.now()))

    def _apply(self, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, Send):
                try:
                    self.client.send_nowait(self.flow, a.payload, band=a.band)
                    self.counters[f"sent.{a.kind}"] += 1
                except FlowError as exc:
                    self.counters["send.failed"] += 1
                    log.debug("site %s: send failed (%s); the protocol will repair", self.site,
                              exc)
            elif isinstance(a, Deliver):
                self.deliveries.append(a.delivery)
                self._call(self.on_deliver, a.delivery)
            elif isinstance(a, (MembershipChange, StateChange, Conflict, Congestion)):
                self.events.append(a)
                self._call(self.on_event, a)

    def _call(self, fn: Callable[[Any], Any] | None, arg: Any) -> None:
        if fn is None:
            return
        try:
            r = fn(arg)
            if inspect.isawaitable(r):
                asyncio.ensure_future(r)
        except Exception:  # the application's callback must not break the protocol
            log.exception("site %s: callback raised", self.site)
