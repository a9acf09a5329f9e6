"""The node's flow control, as the runtime carries it out.

What flow control decides (which input stops reading and when, which output holds credit,
which is a slow consumer) is :class:`flowrouter.core.flowcontrol.FlowControl`'s, a sans-I/O
object with its rules in its docstring. :class:`Backpressure` is the thin shell around it:
outputs report their events here (frames queued, written, dropped; their transport pushed
back or resumed; closed), and it carries out the decisions that come back: pause or resume
a transport's reading (and tell the core's liveness), log a slow consumer, ask the node to
evict one. It arms one timer, at the object's :meth:`~FlowControl.next_deadline`.

May import :mod:`flowrouter.core` and :mod:`flowrouter.net.nodeapi`: the node and its links
are seen only through that interface.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from flowrouter.core.flowcontrol import FlowControl, FlowLimits, OutputFlow
from flowrouter.core.flowstates import Decision, Evict, ReadAgain, SlowConsumer, StopReading

if TYPE_CHECKING:
    from flowrouter.net.nodeapi import Link, Node

log = logging.getLogger("flowrouter.net.runtime")


class Backpressure:
    """A node's flow control: the sans-I/O :class:`FlowControl` (``control``), fed events,
    its decisions carried out (module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        cfg = node.config
        self.control = FlowControl(cfg.flow_limits(), node.core.counters)
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0

    @property
    def limits(self) -> FlowLimits:
        """The limits flow control applies (the node's config, read once at start)."""
        return self.control.limits

    # links ------------------------------------------------------------------------------------
    def opened(self, link_id: int, link: Link) -> None:
        """A new link: a TCP link can stop reading; a UDP link (``reading`` None) shares
        the socket with every other peer and is never paused."""
        self.control.open(link_id, pausable=link.reading is not None)

    def output(self, link_id: int) -> OutputFlow:
        """What flow control keeps of output *link_id* (its hot path notes there which
        input's frames it writes, in which read)."""
        rec = self.control.output(link_id)
        if rec is None:  # never registered, or closed already: a record nobody consults
            rec = OutputFlow(link_id, self.control.limits)
        return rec

    def forget(self, link_id: int) -> None:
        """*link_id* is gone, or its output closed: it holds and feeds nothing any more."""
        self.carry(self.control.closed(link_id))

    # events from outputs ----------------------------------------------------------------------
    def queue_started(self, link_id: int, now: float) -> None:
        self.control.queue_started(link_id, now)
        self._arm()

    def queued(self, link_id: int, origin: int, size: int, now: float) -> None:
        decisions = self.control.queued(link_id, origin, size, now)
        if decisions:  # nothing else in it moves a deadline
            self.carry(decisions)

    def shed(self, link_id: int, count: int, size: int, queued: int, now: float) -> bool:
        """Whether a stuck output over its bound drops these frames at once (counted)."""
        decisions = self.control.shed(link_id, count, size, queued, now)
        if decisions is None:
            return False
        if decisions:
            self.carry(decisions)
        return True

    def dropped(self, link_id: int, drops: Iterable[tuple[bytes, int, int]], now: float) -> None:
        self.carry(self.control.dropped(link_id, drops, now))

    def written(self, link_id: int, gone: dict[int, int], queued: int, now: float, *,
                moved: bool, backlog: bool) -> None:
        self.carry(self.control.written(link_id, gone, queued, now, moved=moved,
                                        backlog=backlog))

    def pushed_back(self, link_id: int) -> None:
        node = self.node
        self.carry(self.control.pushed_back(link_id, node.reads.number, node.now()))

    def resumed(self, link_id: int) -> None:
        self.carry(self.control.resumed(link_id, self.node.now()))

    def waits_for_credit(self, origin: int) -> bool:
        """Whether input *origin* is over its credit (a queue draining its frames says
        so: the input it is fed by)."""
        return self.control.over_credit(origin)

    def check(self, now: float) -> None:
        """Do what is due at *now* (the timer does, at flow control's next deadline)."""
        self.carry(self.control.tick(now))

    # decisions --------------------------------------------------------------------------------
    def carry(self, decisions: list[Decision]) -> None:
        """Carry out flow control's decisions, then re-arm its timer."""
        node = self.node
        for d in decisions:
            if type(d) is StopReading or type(d) is ReadAgain:
                on = type(d) is ReadAgain
                link = node.links.get(d.link)
                if link is not None:
                    link.set_reading(on)
                    # while it does not read, the peer's silence proves nothing to liveness
                    node.core.input_paused(d.link, not on, node.now())
            elif type(d) is SlowConsumer:
                lim = self.limits
                lk = node.core.links.get(d.link)
                log.warning("router %s: %s cannot keep up (%d bytes queued); dropping its "
                            "frames (%s)", node.config.name,
                            lk.describe() if lk else f"link {d.link}", lim.queue_bound,
                            lim.drop_kind)
            elif type(d) is Evict:
                node.close_slow_consumer(d.link, d.reason)
        self._arm()

    def _arm(self) -> None:
        """One timer, at flow control's next deadline (earlier than the armed one)."""
        due = self.control.next_deadline()
        if due is None or (self._timer is not None and self._due <= due):
            return
        loop = self.node.loop
        if self._timer is not None:
            self._timer.cancel()
        self._due = due
        self._timer = loop.call_at(due, self._fire)

    def _fire(self) -> None:
        # a loop may run a timer up to its clock's resolution early: it is due
        self._timer = None
        self.check(max(self.node.now(), self._due))

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
