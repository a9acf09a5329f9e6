"""Sending: checked, back-pressured sends, and fragmentation of messages larger than the
router's maximum payload.

A payload larger than the router's maximum is cut into fragments (:mod:`flowlib.fragment`);
``send`` paces them at the rate the link takes them, and sends a message again whole if a
failover cut it. A payload that merely looks like a fragment is escaped. During a failover
``send_nowait`` raises :class:`~flowlib.errors.FailoverInProgress` and ``send`` waits for the
next router (at most ``failover_send_timeout``). The bytes are the protocol's
(:meth:`flowlib.protocol.ClientProtocol.send_message`); :class:`Sender` is the shell's part
that checks, waits and paces. ``flush`` waits for the router's answer to an ECHO sent after
the messages (:meth:`flowlib.protocol.ClientProtocol.flush_echo`). Imports asyncio and
flowlib's connection layer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from flowrouter.wire.flowid import FlowID

from .checks import (
    LocalitySpec,
    check_data_band,
    check_flow,
    check_locality,
    check_payload,
    check_ttl,
)
from .connection import Connection
from .errors import ConnectionLost, FlowTimeout, MessageTooLarge
from .fragment import iter_fragments
from .link import Link

log = logging.getLogger("flowlib")

Payload = bytes | bytearray | memoryview
#: seconds between a flush's ECHOs while it waits
FLUSH_RESEND = 1.0


class Sender:
    """``send`` and ``send_nowait``: plain, escaped or fragmented messages."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        o = conn.options
        self.max_message_size = o.max_message_size
        self.fragment_size = o.fragment_size
        self.failover_send_timeout = o.failover_send_timeout
        self.origin = secrets.randbits(64)
        self.next_msg_id = secrets.randbits(32)
        #: flushes waiting for their ECHO's reply: seq -> (the link, the flush's future)
        self.flushes: dict[int, tuple[Link, asyncio.Future[None]]] = {}
        conn.on_link_down.append(self.link_down)
        conn.on_finish.append(self.release)

    def checked(self, flow: FlowID | str, payload: Payload, band: int, locality: LocalitySpec,
                ttl: int) -> tuple[FlowID, Payload, int, int, int]:
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

    def new_msg_id(self) -> int:
        msg_id = self.next_msg_id
        self.next_msg_id = (msg_id + 1) & 0xFFFFFFFF
        return msg_id

    def send_nowait(self, flow: FlowID | str, payload: Payload, band: int,
                    locality: LocalitySpec, ttl: int, fragment: bool | None) -> None:
        flow, payload, size, loc_type, loc_value = self.checked(flow, payload, band,
                                                                locality, ttl)
        link = self.conn.check_open()
        protocol = link.protocol
        plan = protocol.plan(payload, size, fragment, self.max_message_size,
                             self.fragment_size)
        protocol.send_message(flow.key, payload, size, plan, band, loc_type, loc_value, ttl,
                              self.origin, self.new_msg_id() if plan > 0 else 0)
        link.flush()

    async def send(self, flow: FlowID | str, payload: Payload, band: int,
                   locality: LocalitySpec, ttl: int, fragment: bool | None) -> None:
        flow, payload, size, loc_type, loc_value = self.checked(flow, payload, band,
                                                                locality, ttl)
        conn = self.conn
        link = conn.link
        if not conn.up or conn.closing or link is None:
            link = await conn.ready(self.failover_send_timeout)
        protocol = link.protocol
        plan = protocol.plan(payload, size, fragment, self.max_message_size,
                             self.fragment_size)
        if plan <= 0:
            protocol.send_message(flow.key, payload, size, plan, band, loc_type, loc_value,
                                  ttl)
            link.flush()
            if link.paused:
                await link.drain()
                if conn.closed:
                    raise conn.stopped()
            return
        await self.send_fragments(flow.key, memoryview(payload), plan, fragment, band,
                                  loc_type, loc_value, ttl)

    async def send_fragments(self, key: bytes, view: memoryview, fsize: int,
                             fragment: bool | None, band: int, loc_type: int, loc_value: int,
                             ttl: int) -> None:
        conn = self.conn
        msg_id = self.new_msg_id()
        while True:
            gen = conn.gen
            link = conn.link
            complete = link is not None
            for fh, chunk in iter_fragments(view, self.origin, msg_id, fsize):
                if conn.gen != gen or not conn.up or link is None or link is not conn.link:
                    complete = False
                    break
                link.protocol.send_fragment(key, fh, chunk, band, loc_type, loc_value, ttl)
                link.flush()
                if link.paused:
                    await link.drain()
                    if conn.closed:
                        raise conn.stopped()
            if complete and conn.gen == gen and conn.up:
                conn.counters["fragments.sent-messages"] += 1
                return
            # The link changed under us: fragments may have died with it. Send the message
            # again on the new router; receivers ignore the fragments they already hold.
            conn.counters["fragments.resent-messages"] += 1
            log.info("router link changed while sending a %d-byte message in fragments; "
                     "sending it again", len(view))
            link = await conn.ready(self.failover_send_timeout)
            new_size = link.protocol.plan(view, len(view), True if fragment is None
                                          else fragment, self.max_message_size,
                                          self.fragment_size)
            if new_size != fsize:  # different router maximum: a differently cut message
                fsize, msg_id = new_size, self.new_msg_id()

    # ------------------------------------------------------------------ flush
    async def flush(self, timeout: float | None) -> None:
        """Wait until the router has read what was sent before (see ``FlowClient.flush``)."""
        conn = self.conn
        link = conn.check_open("a flush answers for the link messages were sent on")
        limit = conn.options.request_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        seqs: list[int] = []
        deadline = loop.time() + limit
        try:
            if not link.protocol.speaks_soft_state:
                # a router from before ECHO would drop the link on one: what was written
                # can only be handed to the kernel
                link.flush()
                await asyncio.wait_for(link.drain(), limit)
                return
            while True:
                # again after each resend interval: on a datagram link an ECHO or its
                # reply can be lost (on a stream link this only adds an ECHO a second)
                seq = link.protocol.flush_echo(loop.time())
                link.flush()
                seqs.append(seq)
                self.flushes[seq] = (link, fut)
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait([fut], timeout=min(left, FLUSH_RESEND))
                if done:
                    fut.result()  # raises if the link went down first
                    return
        except TimeoutError:
            raise FlowTimeout(f"router {conn.router_name!r} did not answer the flush within "
                              f"{limit:g}s") from None
        finally:
            for seq in seqs:
                self.flushes.pop(seq, None)

    def on_echo_answered(self, seq: int) -> None:
        entry = self.flushes.get(seq)
        if entry is not None and not entry[1].done():
            entry[1].set_result(None)

    def link_down(self, link: Link, reason: str) -> None:
        """A link ended and a failover began (had the client ended, :meth:`release` came
        first): its flushes fail, as what was sent on it may be lost with it."""
        for seq, (lk, fut) in list(self.flushes.items()):
            if lk is link:
                del self.flushes[seq]
                if not fut.done():
                    fut.set_exception(self.conn.failover_error(
                        f"the link was lost before the router answered the flush ({reason}); "
                        "what was sent on it may be lost"))

    def release(self, reason: str, user: bool) -> None:
        """The client ended: every flush fails."""
        entries = list(self.flushes.values())
        self.flushes.clear()
        for _link, fut in entries:
            if not fut.done():
                fut.set_exception(ConnectionLost(reason))
