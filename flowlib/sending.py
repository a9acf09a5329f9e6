"""The sending layer of the flow client: checked, back-pressured sends, and fragmentation of
messages larger than the router's maximum payload.

A payload larger than the router's maximum is cut into fragments (:mod:`flowlib.fragment`);
``send`` paces them at the rate the link takes them, and sends a message again whole if a
failover cut it. A payload that merely looks like a fragment is escaped. During a failover
``send_nowait`` raises :class:`~flowlib.errors.FailoverInProgress` and ``send`` waits for the
next router (at most ``failover_send_timeout``).

Builds on :mod:`flowlib.failover`; imports asyncio and the wire layer of flowrouter.
"""

from __future__ import annotations

import secrets

from flowrouter.wire.bands import DEFAULT_DATA_BAND
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import DEFAULT_TTL, pack_header

from .checks import (
    LocalitySpec,
    check_data_band,
    check_flow,
    check_locality,
    check_payload,
    check_ttl,
)
from .connection import log
from .errors import MessageTooLarge
from .failover import Failover
from .fragment import (
    ESCAPE_PREFIX,
    ESCAPE_SIZE,
    FRAGMENT_HEADER_SIZE,
    iter_fragments,
    needs_escape,
)


class Sending(Failover):
    """``send`` and ``send_nowait``: plain, escaped or fragmented messages."""

    def _init_sending(self, *, fragment_size: int | None) -> None:
        #: the largest fragment (None: the router's maximum payload)
        self.fragment_size = fragment_size
        self._origin = secrets.randbits(64)
        self._next_msg_id = secrets.randbits(32)

    # ------------------------------------------------------------------ sending
    def _plan(self, payload: bytes | bytearray | memoryview, size: int,
              fragment: bool | None) -> int:
        """How to send: 0 plain, -1 plain with the escape prefix, n > 0 in fragments of n
        data bytes. Raises MessageTooLarge."""
        escape = needs_escape(payload)
        wire = size + ESCAPE_SIZE if escape else size
        if fragment is None:
            fragment = wire > self.max_payload
        if not fragment or size == 0:
            if wire > self.max_payload:
                raise MessageTooLarge(size, self.max_payload)
            return -1 if escape else 0
        if size > self.max_message_size:
            raise MessageTooLarge(size, self.max_message_size, "max_message_size")
        limit = self.max_payload if self.fragment_size is None \
            else min(self.fragment_size, self.max_payload)
        data = limit - FRAGMENT_HEADER_SIZE
        if data < 1:
            raise MessageTooLarge(size, self.max_payload)
        return data

    def _checked(self, flow: FlowID | str, payload: bytes | bytearray | memoryview, band: int,
                 locality: LocalitySpec, ttl: int
                 ) -> tuple[FlowID, bytes | bytearray | memoryview, int, int, int]:
        """A send's arguments checked, before anything is sent: ``(flow, payload, size,
        locality type, locality value)``. Raises as ``send``/``send_nowait`` document."""
        flow = check_flow(flow)
        check_data_band(band)
        loc_type, loc_value = check_locality(locality)
        check_ttl(ttl)
        payload, size = check_payload(payload)
        if size > self.max_message_size:
            raise MessageTooLarge(size, self.max_message_size, "max_message_size")
        return flow, payload, size, loc_type, loc_value

    def _new_msg_id(self) -> int:
        msg_id = self._next_msg_id
        self._next_msg_id = (msg_id + 1) & 0xFFFFFFFF
        return msg_id

    def _write(self, key: bytes, payload: bytes | bytearray | memoryview, size: int, plan: int,
               band: int, loc_type: int, loc_value: int, ttl: int) -> None:
        """Write a message that needs no waiting: plain, escaped, or all its fragments."""
        transport = self._transport
        assert transport is not None
        if plan == 0:
            transport.writelines([pack_header(key, size, band, loc_type, loc_value, ttl),
                                  payload])
        elif plan < 0:
            transport.writelines([pack_header(key, size + ESCAPE_SIZE, band, loc_type,
                                              loc_value, ttl), ESCAPE_PREFIX, payload])
        else:
            view = memoryview(payload)
            for fh, chunk in iter_fragments(view, self._origin, self._new_msg_id(), plan):
                transport.writelines([pack_header(key, len(fh) + len(chunk), band, loc_type,
                                                  loc_value, ttl), fh, chunk])
            self.counters["fragments.sent-messages"] += 1

    def send_nowait(self, flow: FlowID | str, payload: bytes | bytearray | memoryview,
                    band: int = DEFAULT_DATA_BAND, locality: LocalitySpec = None,
                    ttl: int = DEFAULT_TTL, *, fragment: bool | None = None) -> None:
        """Write one message to *flow* now (no back-pressure; see :meth:`send`).

        Messages go to the flow's members, never back to this client. *band* must be an
        application band (16..127); *locality* is ``None`` or ``(type, value)`` such as
        ``(Locality.GEOGRAPHY, 2)``; *ttl* counts router hops (1..255).

        A payload larger than the router's maximum is fragmented (all fragments are written at
        once: prefer :meth:`send` for large messages, which paces them); *fragment* ``False``
        refuses to and raises :class:`~flowlib.errors.MessageTooLarge` instead, ``True``
        fragments even a message that would fit. A message over ``max_message_size`` raises
        :class:`~flowlib.errors.MessageTooLarge` and sends nothing. During a failover this
        raises :class:`~flowlib.errors.FailoverInProgress` (nothing is sent).
        """
        flow, payload, size, loc_type, loc_value = self._checked(flow, payload, band,
                                                                 locality, ttl)
        self._check_open()
        plan = self._plan(payload, size, fragment)
        self._write(flow.key, payload, size, plan, band, loc_type, loc_value, ttl)

    async def send(self, flow: FlowID | str, payload: bytes | bytearray | memoryview,
                   band: int = DEFAULT_DATA_BAND, locality: LocalitySpec = None,
                   ttl: int = DEFAULT_TTL, *, fragment: bool | None = None) -> None:
        """Like :meth:`send_nowait`, then wait while the link's write buffer is full, so a
        fast sender is slowed to what the router takes instead of growing memory.

        Large messages are sent fragment by fragment at the pace the link takes them. During
        a failover this waits for the next router (at most ``failover_send_timeout`` seconds
        if set, else as long as the failover lasts) and then raises
        :class:`~flowlib.errors.FailoverInProgress` or, if every router failed,
        :class:`~flowlib.errors.ConnectionLost`. A fragmented message cut by a failover is
        sent again whole on the new router.
        """
        flow, payload, size, loc_type, loc_value = self._checked(flow, payload, band,
                                                                 locality, ttl)
        if not self._up or self._closing:
            await self._ready(self.failover_send_timeout)
        plan = self._plan(payload, size, fragment)
        if plan <= 0:
            self._write(flow.key, payload, size, plan, band, loc_type, loc_value, ttl)
            if self._paused:
                await self._drain()
            return
        await self._send_fragments(flow.key, memoryview(payload), plan, fragment, band,
                                   loc_type, loc_value, ttl)

    async def _send_fragments(self, key: bytes, view: memoryview, fsize: int,
                              fragment: bool | None, band: int, loc_type: int, loc_value: int,
                              ttl: int) -> None:
        msg_id = self._new_msg_id()
        while True:
            gen = self._gen
            complete = True
            for fh, chunk in iter_fragments(view, self._origin, msg_id, fsize):
                if self._gen != gen or not self._up:
                    complete = False
                    break
                assert self._transport is not None
                self._transport.writelines([pack_header(key, len(fh) + len(chunk), band,
                                                        loc_type, loc_value, ttl), fh, chunk])
                if self._paused:
                    await self._drain()
            if complete and self._gen == gen and self._up:
                self.counters["fragments.sent-messages"] += 1
                return
            # The link changed under us: fragments may have died with it. Send the message
            # again on the new router; receivers ignore the fragments they already hold.
            self.counters["fragments.resent-messages"] += 1
            log.info("router link changed while sending a %d-byte message in fragments; "
                     "sending it again", len(view))
            await self._ready(self.failover_send_timeout)
            new_size = self._plan(view, len(view), True if fragment is None else fragment)
            if new_size != fsize:  # different router maximum: a differently cut message
                fsize, msg_id = new_size, self._new_msg_id()
