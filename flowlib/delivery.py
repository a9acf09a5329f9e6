"""The client's listeners: messages to receive queues, and the local notices about them.

:class:`Delivery` keeps the listeners of every flow, hands each received message to those
whose mask has its band (the payload was copied out of the read buffer once and is shared),
and raises rate-limited local notices (:mod:`flowlib.notices`) on the overflow band when a
queue overflows or a fragmented message is dropped, and on the fault band for failovers
and for the router's faults about the whole link (to every fault-band listener). Part
of the asyncio shell (listeners are asyncio queues); imports flowlib's leaf modules and the
wire layer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_OVERFLOW
from flowrouter.wire.flowid import FlowID

from .errors import FlowError
from .events import MessageDropped, MessageReceived, Received
from .flowtable import FlowEntry
from .members import MemberView
from .message import Message
from .notices import NoticeLimiter, overflow_fault
from .queue import Listener


class Delivery:
    """Listeners by flow key; delivery to them and notices."""

    def __init__(self, origin: str, counters: Counter[str], notice_every: int | None,
                 notice_interval: float, clock: Callable[[], float]) -> None:
        self.origin = origin
        self.counters = counters
        self.notice_every = notice_every
        self.notice_interval = notice_interval
        self.clock = clock
        self.by_flow: dict[bytes, list[Listener]] = {}

    def add(self, lst: Listener) -> None:
        self.by_flow.setdefault(lst.flow.key, []).append(lst)

    def remove(self, lst: Listener) -> bool:
        """Stop delivering to *lst*; False if it was not here."""
        lsts = self.by_flow.get(lst.flow.key)
        if not lsts or lst not in lsts:
            return False
        lsts.remove(lst)
        if not lsts:
            del self.by_flow[lst.flow.key]
        return True

    def of(self, key: bytes) -> list[Listener]:
        return self.by_flow.get(key, [])

    def all(self) -> list[Listener]:
        return [lst for lsts in self.by_flow.values() for lst in lsts]

    def close_all(self, error: Callable[[], FlowError]) -> None:
        lsts = self.all()
        self.by_flow.clear()
        for lst in lsts:
            lst.end(error)

    # ------------------------------------------------------------------ receiving
    def deliver(self, event: MessageReceived) -> None:
        bit = 1 << event.band
        msg = event.message
        for lst in self.by_flow.get(event.key, ()):
            if lst.bits & bit and lst.feed(msg) and self.notice_every is not None:
                self.overflowed(lst)

    def deliver_all(self, received: list[Received]) -> None:
        """One read's messages, in order (as :meth:`deliver` would take them one by one)."""
        by_flow = self.by_flow
        for key, band, msg in received:
            bit = 1 << band
            for lst in by_flow.get(key, ()):
                if lst.bits & bit and lst.feed(msg) and self.notice_every is not None:
                    self.overflowed(lst)

    def dropped(self, event: MessageDropped, fe: FlowEntry) -> None:
        """A fragmented message of *fe* was dropped: maybe tell its listeners."""
        if self.notice_every is None:
            return
        lim = fe.notices
        if lim is None:
            lim = fe.notices = NoticeLimiter(1, self.notice_interval)
        n = lim.hit(self.clock())
        if not n:
            return
        extra: dict[str, object] = {}
        if event.fragments is not None:
            extra["fragments"] = event.fragments
        self.local_notice(fe.flow, BAND_OVERFLOW, overflow_fault(
            self.origin, f"flow {fe.flow} band {event.band}: {event.detail}"
                         + (f" ({n} such drops since the last notice)" if n > 1 else ""),
            reason=event.reason, flow=fe.flow, band=event.band, dropped=n,
            sender=f"{event.origin:016x}", message=event.msg_id, bytes=event.total, **extra))

    def view_overflowed(self, flow: FlowID, view: MemberView, refused: int,
                        lim: NoticeLimiter) -> None:
        """A member view of *flow* was full and refused *refused* members: tell the flow's
        overflow listeners (at most one notice per interval per view: *lim* is the view's)."""
        if self.notice_every is None:
            return
        n = lim.hit(self.clock(), refused)
        if not n:
            return
        self.local_notice(flow, BAND_OVERFLOW, overflow_fault(
            self.origin, f"member view of flow {flow} is full ({view.max_members} members): "
                         f"{n} member(s) not kept, {view.overflowed} in all",
            reason="member-view-full", flow=flow, dropped=n, total=view.overflowed,
            size=view.max_members))

    # ------------------------------------------------------------------ local notices
    def local_notice(self, flow: FlowID, band: int, fault: C.Fault) -> None:
        """Deliver a notice of our own to *flow*'s listeners on *band* (never sent out).

        A full listener drops it like any message (counted), without a notice about that.
        """
        bit = 1 << band
        msg: Message | None = None
        for lst in self.by_flow.get(flow.key, ()):
            if lst.bits & bit:
                if msg is None:
                    msg = Message(flow, band, fault.encode())
                lst.feed(msg)
        self.counters[f"notices.{'fault' if band == BAND_FAULT else 'overflow'}"] += 1

    def link_notice(self, band: int, fault: C.Fault) -> None:
        """Deliver a notice about the whole router link to every listener, of any flow,
        whose mask has *band* (each gets it as a message of its own flow)."""
        bit = 1 << band
        data = fault.encode()
        for listeners in self.by_flow.values():
            for lst in listeners:
                if lst.bits & bit:
                    lst.feed(Message(lst.flow, band, data))
        self.counters["notices.link"] += 1

    def overflowed(self, lst: Listener) -> None:
        """*lst* dropped a message: maybe notify (rate-limited, see :mod:`flowlib.notices`)."""
        assert self.notice_every is not None
        lim = lst.notices
        if lim is None:
            lim = lst.notices = NoticeLimiter(self.notice_every, self.notice_interval)
        n = lim.hit(self.clock())
        if not n:
            return
        self.local_notice(lst.flow, BAND_OVERFLOW, overflow_fault(
            self.origin, f"listener {lst.name} on flow {lst.flow} (bands {lst.mask}) dropped "
                         f"{n} message(s), {lst.dropped} in all (queue of {lst.size}, "
                         f"{lst.overflow.value})",
            reason="queue-full", flow=lst.flow, listener=lst.name, bands=lst.mask, dropped=n,
            total=lst.dropped, size=lst.size, policy=lst.overflow.value))
