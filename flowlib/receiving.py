"""The receiving layer of the flow client: data frames to listeners, reassembly of
fragmented messages, and the local notices (overflow, dropped large messages) it raises.

* **Data.** Frames on bands 16..127 are delivered to the listeners whose mask has the band;
  the payload is copied out of the decoder's buffer once and shared by those listeners.
* **Large messages.** Fragments are reassembled per flow, band and sender
  (:mod:`flowlib.fragment` documents the format and bounds); an incomplete message that stops
  receiving fragments is dropped by a sweep timer.
* **Notices.** Receive-queue overflows and dropped large messages are reported by local,
  rate-limited notices on the overflow band (:mod:`flowlib.notices`).

Builds on :mod:`flowlib.membership`; imports asyncio and the wire layer of flowrouter.
"""

from __future__ import annotations

import asyncio

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_OVERFLOW

from .connection import log
from .fragment import (
    ESCAPE_SIZE,
    KIND_ESCAPE,
    KIND_FRAGMENT,
    MAGIC,
    FragmentDropped,
    Reassembler,
)
from .membership import FlowState, Membership
from .message import Message
from .notices import NoticeLimiter, overflow_fault
from .queue import Listener


class Receiving(Membership):
    """Delivery to listeners, reassembly and local notices."""

    def _init_receiving(self, *, max_message_size: int, max_reassembly_bytes: int,
                        reassembly_timeout: float, overflow_notice_every: int | None,
                        overflow_notice_interval: float) -> None:
        #: the largest message sent or reassembled
        self.max_message_size = max_message_size
        self._reasm = Reassembler(max_message_size, max_reassembly_bytes, reassembly_timeout)
        self._reasm_timer: asyncio.TimerHandle | None = None
        self._notice_every = overflow_notice_every
        self._notice_interval = overflow_notice_interval

    # ------------------------------------------------------------------ the lower layers' hooks
    def _flow_forgotten(self, key: bytes) -> None:
        self._reasm.drop_flow(key)

    def _release_all(self, reason: str, user: bool) -> None:
        if self._reasm_timer is not None:
            self._reasm_timer.cancel()
            self._reasm_timer = None
        super()._release_all(reason, user)

    # ------------------------------------------------------------------ receiving
    def _deliver(self, header: memoryview, payload: memoryview) -> None:
        """A data frame (band >= 16): hand it to every listener whose mask has the band."""
        fs = self._flows.get(bytes(header[:16]))
        if fs is None:
            self.counters["drop.no-listener"] += 1
            return
        band = header[20]
        bit = 1 << band
        if payload and payload[0] == 0xFF and len(payload) > 4 and payload[:4] == MAGIC:
            kind = payload[4]
            if kind == KIND_FRAGMENT:
                self._on_fragment(fs, header, payload, band, bit)
                return
            if kind == KIND_ESCAPE:
                payload = payload[ESCAPE_SIZE:]
            else:
                self.counters["fragments.unknown-kind"] += 1  # delivered as it came
        msg: Message | None = None
        for lst in fs.listeners:
            if lst._mask & bit:
                if msg is None:
                    msg = Message(fs.flow, band, bytes(payload), header[21], header[22],
                                  header[23])
                if lst._put(msg) and self._notice_every is not None:
                    self._overflowed(fs, lst)
        if msg is None:
            self.counters["drop.no-listener"] += 1
        else:
            self.counters["received"] += 1

    def _on_fragment(self, fs: FlowState, header: memoryview, payload: memoryview,
                     band: int, bit: int) -> None:
        for lst in fs.listeners:
            if lst._mask & bit:
                break
        else:
            self.counters["drop.no-listener"] += 1
            return
        assert self._loop is not None
        reasm = self._reasm
        try:
            data = reasm.feed(fs.flow.key, band, payload, self._loop.time())
        except FragmentDropped as exc:
            self.counters[f"fragments.{exc.reason}"] += 1
            log.info("flow %s band %d: dropped a fragmented message: %s", fs.flow, band,
                     exc.detail)
            self._reassembly_notice(fs, exc.reason, band, exc.detail, exc.origin, exc.msg_id,
                                    exc.total)
            return
        self.counters["fragments.received"] += 1
        if data is None:
            if reasm.partials and self._reasm_timer is None:
                self._schedule_sweep()
            return
        self.counters["fragments.messages"] += 1
        msg = Message(fs.flow, band, data, header[21], header[22], header[23])
        for lst in fs.listeners:
            if lst._mask & bit and lst._put(msg) and self._notice_every is not None:
                self._overflowed(fs, lst)
        self.counters["received"] += 1

    def _schedule_sweep(self) -> None:
        assert self._loop is not None
        self._reasm_timer = self._loop.call_later(max(0.02, self._reasm.timeout / 4),
                                                  self._sweep)

    def _sweep(self) -> None:
        """Drop incomplete messages that stopped receiving fragments (seed 000, 5.1)."""
        self._reasm_timer = None
        if self._lost or self._loop is None:
            return
        for ex in self._reasm.expire(self._loop.time()):
            self.counters["fragments.reassembly-timeout"] += 1
            fs = self._flows.get(ex.flow_key)
            detail = (f"incomplete message of {ex.total} bytes timed out with {ex.received} "
                      f"of {ex.count} fragments")
            log.info("flow %s band %d: %s", fs.flow if fs else "?", ex.band, detail)
            if fs is not None:
                self._reassembly_notice(fs, "reassembly-timeout", ex.band, detail, ex.origin,
                                        ex.msg_id, ex.total,
                                        fragments=f"{ex.received}/{ex.count}")
        if self._reasm.partials:
            self._schedule_sweep()

    # ------------------------------------------------------------------ local notices
    def _local_notice(self, fs: FlowState, band: int, fault: C.Fault) -> None:
        """Deliver a notice of our own to this flow's listeners on *band* (never sent out).

        A full listener drops it like any message (counted), without a notice about that.
        """
        bit = 1 << band
        msg: Message | None = None
        for lst in fs.listeners:
            if lst._mask & bit:
                if msg is None:
                    msg = Message(fs.flow, band, fault.encode())
                lst._put(msg)
        self.counters[f"notices.{'fault' if band == BAND_FAULT else 'overflow'}"] += 1

    def _overflowed(self, fs: FlowState, lst: Listener) -> None:
        """*lst* dropped a message: maybe notify (rate-limited, see :mod:`flowlib.notices`)."""
        assert self._loop is not None and self._notice_every is not None
        lim = lst._notices
        if lim is None:
            lim = lst._notices = NoticeLimiter(self._notice_every, self._notice_interval)
        n = lim.hit(self._loop.time())
        if not n:
            return
        self._local_notice(fs, BAND_OVERFLOW, overflow_fault(
            self.name, f"listener {lst.name} on flow {fs.flow} (bands {lst.mask}) dropped {n} "
                       f"message(s), {lst.dropped} in all (queue of {lst.size}, "
                       f"{lst.overflow.value})",
            reason="queue-full", flow=fs.flow, listener=lst.name, bands=lst.mask, dropped=n,
            total=lst.dropped, size=lst.size, policy=lst.overflow.value))

    def _reassembly_notice(self, fs: FlowState, reason: str, band: int, detail: str,
                           origin: int, msg_id: int, total: int, **extra: object) -> None:
        if self._notice_every is None:
            return
        assert self._loop is not None
        lim = fs.notices
        if lim is None:
            lim = fs.notices = NoticeLimiter(1, self._notice_interval)
        n = lim.hit(self._loop.time())
        if not n:
            return
        self._local_notice(fs, BAND_OVERFLOW, overflow_fault(
            self.name, f"flow {fs.flow} band {band}: {detail}"
                       + (f" ({n} such drops since the last notice)" if n > 1 else ""),
            reason=reason, flow=fs.flow, band=band, dropped=n, sender=f"{origin:016x}",
            message=msg_id, bytes=total, **extra))
