"""The flow client's protocol with one router link, sans-I/O: bytes and time in; events,
bytes to send and the next timer out.

:class:`ClientProtocol` is what :class:`flowlib.FlowClient` (the asyncio shell) drives, the
way aioquic's ``QuicConnection`` is driven by its asyncio protocol: the shell calls
:meth:`~ClientProtocol.receive_data` with each read and the loop's time,
:meth:`~ClientProtocol.handle_timer` when :meth:`~ClientProtocol.next_deadline` comes, and
the commands (:meth:`~ClientProtocol.join`, :meth:`~ClientProtocol.leave`,
:meth:`~ClientProtocol.send_message`, ...); then it writes
:meth:`~ClientProtocol.data_to_send` and acts on :meth:`~ClientProtocol.next_event`
(:mod:`flowlib.events`); received messages, the common case, may go instead to a sink given
at construction, one list per read. One protocol serves one link: failover makes a fresh
one for the next router and replays the flow table into it.

It owns small parts, each its own object: the stream codec the routers use too
(:class:`flowrouter.wire.streamcodec.StreamCodec`: handshake frames, then sealed records or
plain frames), the handshake (:mod:`flowlib.handshake`), liveness and refresh digests
(:mod:`flowlib.liveness`);
the flow table (:mod:`flowlib.flowtable`) and the reassembler (:mod:`flowlib.fragment`) are
given to it, because they outlive the link. Imports only the wire layer of flowrouter and
flowlib's parts.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.appmembers import decode_notice
from flowrouter.wire.bands import (
    BAND_APP_MEMBERSHIP,
    BAND_FAULT,
    BAND_GC,
    BAND_MEMBERSHIP,
    ROUTER_BANDS_END,
    ROUTER_ONLY_BANDS,
)
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import DEFAULT_TTL, OFF_TTL, MalformedFrame, pack_header
from flowrouter.wire.streamcodec import BadRecord, StreamCodec

from .events import (
    EchoAnswered,
    Event,
    HandshakeDone,
    JoinAnswered,
    LinkFailed,
    MessageDropped,
    MessageReceived,
    MessageSink,
    Received,
    RejoinNeeded,
    RouterFault,
)
from .flowtable import FlowEntry, FlowTable
from .fragment import (
    ESCAPE_PREFIX,
    ESCAPE_SIZE,
    KIND_ESCAPE,
    KIND_FRAGMENT,
    MAGIC,
    FragmentDropped,
    Reassembler,
    iter_fragments,
    plan_message,
)
from .handshake import Handshake
from .liveness import JoinResends, Liveness, RefreshDigests
from .message import Message

log = logging.getLogger("flowlib")

LINK_KEY = LINK_LOCAL_FLOW.key
_ZERO_LSID = b"\0\0\0\0"


class ClientProtocol:
    """One router link's protocol state: handshake, then joins, data, liveness, refresh."""

    def __init__(self, handshake: Handshake, flows: FlowTable, reassembler: Reassembler, *,
                 now: float, liveness_interval: float, dead_after: float,
                 refresh_interval: float, counters: Counter[str] | None = None,
                 rtt: float | None = None, address: str = "", first_request: int = 1,
                 sink: MessageSink | None = None, payload_cap: int | None = None,
                 join_resend: float | None = None) -> None:
        self.handshake = handshake
        self.flows = flows
        self._entries = flows.entries  # the receive path's lookup
        self.reassembler = reassembler
        self.address = address
        #: the largest payload the link itself carries (a datagram link's), if any
        self.payload_cap = payload_cap
        #: counters of things worth seeing that are not errors (shared with the shell)
        self.counters: Counter[str] = Counter() if counters is None else counters
        #: bytes <-> frames: the handshake, then sealed records or plain frames
        self.codec = StreamCodec(handshake.max_payload)
        self.liveness = Liveness(liveness_interval, dead_after, now, rtt)
        self.refresh = RefreshDigests(refresh_interval, now)
        #: the router's HELLO once the handshake is over
        self.hello: C.Hello | None = None
        #: a datagram link's cipher once its handshake negotiated encryption
        #: (:mod:`flowlib.dgram` seals and opens each datagram with it)
        self.datagram_cipher: Any = None
        #: we gave up on this link (refusal, protocol error, silence): nothing more is read
        self.failed: str | None = None
        self._now = now
        self._events: deque[Event] = deque()
        self._out: list[Any] = list(handshake.opening())
        self._next_req = first_request
        self._pending: dict[int, bytes] = {}  # JOIN request -> flow key
        #: a datagram link's unanswered JOINs, sent again every *join_resend* seconds
        self.resends = JoinResends(join_resend) if join_resend else None
        self._sweep_due: float | None = None
        #: takes each read's received messages at once, when given (else each is a
        #: :class:`MessageReceived` event)
        self.sink = sink
        #: something may have made :meth:`next_deadline` earlier since it was last asked
        #: (reads alone only push it later, so a shell need not ask after every read)
        self.deadline_moved = True
        self._arm_sweep(now)

    # ------------------------------------------------------------------ what the shell reads
    @property
    def up(self) -> bool:
        """The handshake is over and the link was not given up."""
        return self.hello is not None and self.failed is None

    @property
    def max_payload(self) -> int:
        """The largest payload we may send: the router's (0 before its HELLO), within what
        the link carries."""
        if self.hello is None:
            return 0
        cap = self.payload_cap
        return self.hello.max_payload if cap is None else min(cap, self.hello.max_payload)

    @property
    def speaks_soft_state(self) -> bool:
        """The router takes ECHO and REFRESH (its HELLO says so, or it sent an ECHO)."""
        return bool(self.handshake.router_features & C.FEATURE_SOFT_STATE) \
            or self.liveness.router_speaks

    @property
    def next_request(self) -> int:
        """The ID the next JOIN gets (the next link's protocol continues from it, so an
        answer meant for the old link is never taken for a new request's)."""
        return self._next_req

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def events(self) -> list[Event]:
        """Every pending event, oldest first (what :meth:`next_event` would give one by
        one)."""
        if not self._events:
            return []
        out = list(self._events)
        self._events.clear()
        return out

    def data_to_send(self) -> list[Any]:
        """The buffers to write, in order (each sealed record is one)."""
        out, self._out = self._out, []
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must run next (None: nothing pending)."""
        self.deadline_moved = False
        due = self._sweep_due
        if self.up:
            soft = self.speaks_soft_state
            t = self.liveness.next_deadline(soft)
            if soft:
                t = min(t, self.refresh.next_deadline())
            if self.resends is not None:
                t = min(t, self.resends.next_deadline())
            if t != float("inf") and (due is None or t < due):
                due = t
        return due

    # ------------------------------------------------------------------ time
    def handle_timer(self, now: float) -> None:
        """Echoes, the dead-router check, digest chunks, the reassembly sweep."""
        self._now = now
        self.deadline_moved = True
        if self._sweep_due is not None and now >= self._sweep_due:
            self._sweep(now)
        if not self.up:
            return
        silent = self.liveness.silent_for(now)
        if silent is not None:
            self.counters["liveness.dead"] += 1
            name = self.handshake.hello.name if self.handshake.hello else self.address
            log.warning("router %r silent for %.1fs (dead after %gs): dropping the link",
                        name, silent, self.liveness.dead_after)
            self._fail(f"router {name!r} silent for {silent:.1f}s: hung or unreachable")
            return
        if self.resends is not None:
            for key, msg, loc in self.resends.poll(now):
                self.write_control(key, BAND_MEMBERSHIP, msg, loc)
                self.counters["join.resent"] += 1
        if not self.speaks_soft_state:
            return  # a router from before soft state would drop the link on our first ECHO
        echo = self.liveness.echo(now)
        if echo is not None:
            self.write_control(LINK_KEY, BAND_MEMBERSHIP, echo)
        before = self.refresh.rounds
        for chunk in self.refresh.poll(now, self._refresh_snapshot, self._refresh_line,
                                       self.max_payload):
            self.write_control(LINK_KEY, BAND_MEMBERSHIP, chunk)
        if self.refresh.rounds != before:
            self.counters["refresh.rounds"] += 1

    def _refresh_snapshot(self) -> list[bytes]:
        return [fe.flow.key for fe in self.flows if fe.on_router and fe.wanted]

    def _refresh_line(self, key: bytes) -> tuple[bytes, int, int] | None:
        fe = self.flows.get(key)
        if fe is None or not fe.on_router or not fe.wanted:
            return None
        return fe.refresh_entry()

    def _arm_sweep(self, now: float) -> None:
        if self._sweep_due is None and self.reassembler.partials:
            self._sweep_due = now + max(0.02, self.reassembler.timeout / 4)
            self.deadline_moved = True

    def _sweep(self, now: float) -> None:
        """Drop incomplete messages that stopped receiving fragments (seed 000, 5.1)."""
        self._sweep_due = None
        for ex in self.reassembler.expire(now):
            self.counters["fragments.reassembly-timeout"] += 1
            fe = self.flows.get(ex.flow_key)
            detail = (f"incomplete message of {ex.total} bytes timed out with {ex.received} "
                      f"of {ex.count} fragments")
            log.info("flow %s band %d: %s", fe.flow if fe else "?", ex.band, detail)
            if fe is not None:
                self._events.append(MessageDropped(
                    ex.flow_key, ex.band, "reassembly-timeout", detail, ex.origin, ex.msg_id,
                    ex.total, f"{ex.received}/{ex.count}"))
        self._arm_sweep(now)

    # ------------------------------------------------------------------ bytes in
    def receive_data(self, data: bytes, now: float) -> bool:
        """Bytes read from the router at time *now*.

        With a :attr:`sink`, the messages this read completes go to it as one list at the
        end, unless an event came before them in this read (they then follow it as
        :class:`MessageReceived` events, so the shell sees everything in order). Returns
        whether the shell has anything else to do: events to take, bytes to send, or a
        deadline that may be earlier; a read of data frames alone leaves it nothing.
        """
        if self.failed is not None:
            return False
        self._now = now
        self.liveness.heard = now  # anything read is a sign of life
        events = self._events
        sink = self.sink
        received: list[Received] = []
        try:
            # the handshake's frames one at a time (it may end between two), then each
            # read's frames as one list
            frames = self.codec.receive_data(data) if self.hello is None \
                else self.codec.receive_frames(data)
            entries = self._entries
            counters = self.counters
            for header, payload in frames:
                band = header[20]
                if band < ROUTER_BANDS_END:
                    self._on_control(header, payload)
                    if self.failed is not None:
                        break
                    continue
                # a data frame: a message for the listeners whose mask has the band
                key = bytes(header[:16])
                if ROUTER_ONLY_BANDS >> band & 1 and not self._from_router(band, header,
                                                                             payload):
                    continue
                if key[8:12] == _ZERO_LSID:  # only our router itself speaks link-local
                    self._on_link_notice(band, payload)
                    continue
                if payload and payload[0] == 0xFF:  # maybe a fragment or an escape
                    msg = self._on_marked(key, header, payload, band, now)
                    if msg is None:
                        continue
                else:
                    fe = entries.get(key)
                    if fe is None or not fe.union & (1 << band):
                        counters["drop.no-listener"] += 1
                        continue
                    counters["received"] += 1
                    msg = Message(fe.flow, band, bytes(payload), header[21], header[22],
                                  header[23])
                if sink is None or events:
                    events.append(MessageReceived(key, band, msg))
                else:
                    received.append((key, band, msg))
        except BadRecord as exc:
            self._protocol_error(f"bad sealed record from the router: {exc.detail}")
        except MalformedFrame as exc:
            self._protocol_error(f"malformed frame from the router: {exc}")
        if received and sink is not None:
            sink(received)
        return bool(events or self._out or self.deadline_moved)

    def _on_link_notice(self, band: int, payload: memoryview) -> None:
        """A frame on a band >= 16 of the link-local flow: the router's own word about this
        link. A fault (band 17, already checked to be a whole fault message) becomes a
        :class:`RouterFault` event; anything else is counted and ignored."""
        if band != BAND_FAULT:
            self.counters["control.ignored-link-band"] += 1
            return
        fault = C.decode(payload)
        assert isinstance(fault, C.Fault)  # _from_router let nothing else through
        self.counters["faults.router"] += 1
        self._events.append(RouterFault(fault))

    def _protocol_error(self, reason: str) -> None:
        """The router sent something we cannot trust: drop the link, say why."""
        log.warning("router %s: %s; closing the link", self.address, reason)
        self._fail(reason)

    def _fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = reason
            self._events.append(LinkFailed(reason))

    def _on_control(self, header: memoryview, payload: memoryview) -> None:
        """A router band (< 16): link-local HELLO/ERROR/AUTH and soft state, join acks and
        GC pings. Other router bands (e.g. location-service coordination) are not meant for
        endpoints and are ignored rather than parsed."""
        key = bytes(header[:16])
        band = header[20]
        link_local = key[8:12] == _ZERO_LSID
        if not link_local and band not in (BAND_MEMBERSHIP, BAND_GC):
            self.counters["control.ignored-band"] += 1
            return
        try:
            msg = C.decode(payload)
        except C.UnknownControlType:
            # a newer router's message: counted and ignored (flowrouter.wire.control)
            self.counters["control.unknown-type"] += 1
            return
        except MalformedFrame as exc:
            self._protocol_error(f"malformed control message: {exc}")
            return
        if link_local:
            self._on_link_control(msg, header)
        elif self.hello is None:
            self._protocol_error("the router sent flow traffic before its HELLO")
        else:
            self._on_flow_control(key, band, msg)

    def _on_link_control(self, msg: C.ControlMessage, header: memoryview) -> None:
        if isinstance(msg, (C.Echo, C.EchoReply)) and not self.liveness.router_speaks:
            self.deadline_moved = True  # echoes and the dead-router check start now
        if isinstance(msg, C.Echo):
            self.write_control(LINK_KEY, BAND_MEMBERSHIP, self.liveness.on_echo(msg))
            return
        if isinstance(msg, C.EchoReply):
            if self.liveness.on_echo_reply(msg, self._now):
                self._events.append(EchoAnswered(msg.seq))
            return
        if isinstance(msg, (C.NotOnTree, C.Prune)):
            what = "prune" if isinstance(msg, C.Prune) else "not-on-tree"
            self.counters[f"refresh.{what}-received"] += 1
            for key in msg.keys:
                fe = self.flows.get(key)
                if fe is None or not fe.wanted:
                    continue
                log.info("router %r has no state for flow %s (%s): joining again",
                         self.hello.name if self.hello else self.address, fe.flow, what)
                self.counters["refresh.rejoins"] += 1
                fe.router_forgot()
                self._events.append(RejoinNeeded(key))
            return
        step = self.handshake.on_message(msg, header)
        if step is None:
            self.counters[f"control.ignored.{type(msg).__name__.lower()}"] += 1
            return
        if step.failed is not None:
            if step.protocol_error:
                self._protocol_error(step.failed)
            else:
                self._fail(step.failed)
            return
        if step.reply is not None:
            self.write_control(LINK_KEY, BAND_MEMBERSHIP, step.reply)
        if step.done is not None:
            if step.secure is not None and self.handshake.datagram:
                self.datagram_cipher = step.secure  # the datagram shell seals with it
            elif step.secure is not None:
                self.codec.start_sealed(step.secure)
            self.codec.end_handshake()
            self.hello = step.done
            self.liveness = Liveness(self.liveness.interval, self.liveness.dead_after,
                                     self._now, self.liveness.rtt)
            self.refresh = RefreshDigests(self.refresh.interval, self._now)
            self.deadline_moved = True
            self._events.append(HandshakeDone(step.done))

    def _on_flow_control(self, key: bytes, band: int, msg: C.ControlMessage) -> None:
        if band == BAND_MEMBERSHIP and isinstance(msg, C.JoinAck):
            if self._pending.get(msg.req_id) != key:
                self.counters["control.stale-ack"] += 1
                return
            del self._pending[msg.req_id]
            if self.resends is not None:
                self.resends.answered(msg.req_id)
            self._events.append(JoinAnswered(msg.req_id, key, msg))
        elif band == BAND_GC and isinstance(msg, C.Ping):
            fe = self.flows.get(key)
            if fe is not None and fe.wanted:
                self.write_control(key, BAND_GC, C.Pong(msg.epoch))
                self.counters["gc.pongs"] += 1
            else:
                self.counters["gc.pings-ignored"] += 1
        else:
            self.counters[f"control.ignored.{type(msg).__name__.lower()}"] += 1

    def _from_router(self, band: int, header: memoryview, payload: memoryview) -> bool:
        """Whether a frame on a band only routers originate (17 faults, 18 overflow
        notices, 19 membership notices; routers drop such frames from applications) is
        one this client may believe.

        Routers send each as one whole frame: a fragment or an escaped payload on these
        bands was made by an application and is refused. A fault or overflow notice must
        be a fault message (:class:`flowrouter.wire.control.Fault`). A membership notice
        names the router that reports: never 0 or this client; its own router's notices
        come straight from it (the TTL it sent them with,
        :data:`~flowrouter.wire.header.DEFAULT_TTL`), every other router's through at least
        one more router, which takes one off the TTL; a notice claiming an origin it cannot
        have is refused. Each refusal is counted (``members.refused.<why>`` on band 19,
        ``control.refused.<why>`` on 17 and 18)."""
        why = ""
        if payload and payload[0] == 0xFF:
            why = "fragment"
        elif band != BAND_APP_MEMBERSHIP:
            try:
                fault = C.decode(payload)
            except MalformedFrame:
                why = "malformed"
            else:
                if not isinstance(fault, C.Fault):
                    why = "malformed"
        else:
            try:
                rid = decode_notice(payload).router
            except ValueError:
                why = "malformed"
            else:
                mine = self.hello.node_id if self.hello is not None else 0
                if rid in (0, self.handshake.node_id) \
                        or (rid == mine) != (header[OFF_TTL] == DEFAULT_TTL):
                    why = "origin"
        if not why:
            return True
        what = "members" if band == BAND_APP_MEMBERSHIP else "control"
        self.counters[f"{what}.refused.{why}"] += 1
        log.debug("router %s: refused a band-%d frame (%s)", self.address, band, why)
        return False

    def _on_marked(self, key: bytes, header: memoryview, payload: memoryview, band: int,
                   now: float) -> Message | None:
        """A data frame of flow *key* whose payload starts with 0xFF: maybe a fragment or an
        escaped message. The message to deliver, if any."""
        fe = self._entries.get(key)
        if fe is None or not fe.union & (1 << band):
            self.counters["drop.no-listener"] += 1
            return None
        if len(payload) > 4 and payload[:4] == MAGIC:
            kind = payload[4]
            if kind == KIND_FRAGMENT:
                return self._on_fragment(fe, key, header, payload, band, now)
            if kind == KIND_ESCAPE:
                payload = payload[ESCAPE_SIZE:]
            else:
                self.counters["fragments.unknown-kind"] += 1  # delivered as it came
        self.counters["received"] += 1
        return Message(fe.flow, band, bytes(payload), header[21], header[22], header[23])

    def _on_fragment(self, fe: FlowEntry, key: bytes, header: memoryview,
                     payload: memoryview, band: int, now: float) -> Message | None:
        reasm = self.reassembler
        try:
            data = reasm.feed(key, band, payload, now)
        except FragmentDropped as exc:
            self.counters[f"fragments.{exc.reason}"] += 1
            log.info("flow %s band %d: dropped a fragmented message: %s", fe.flow, band,
                     exc.detail)
            self._events.append(MessageDropped(key, band, exc.reason, exc.detail, exc.origin,
                                               exc.msg_id, exc.total))
            return None
        self.counters["fragments.received"] += 1
        if data is None:
            self._arm_sweep(now)
            return None
        self.counters["fragments.messages"] += 1
        self.counters["received"] += 1
        return Message(fe.flow, band, data, header[21], header[22], header[23])

    # ------------------------------------------------------------------ commands: bytes out
    def _write(self, buffers: list[Any]) -> None:
        """One message's buffers to send: as they are, or as one sealed record."""
        codec = self.codec
        if codec.sealed is None:
            self._out += buffers
        else:
            self._out.append(codec.send_data(b"".join(buffers)))

    @property
    def sealed(self) -> bool:
        """The link travels in sealed records (or, a datagram link, sealed datagrams)."""
        return self.codec.sealed is not None or self.datagram_cipher is not None

    def write_control(self, key: bytes, band: int, msg: C.ControlMessage,
                      loc: tuple[int, int] = (0, 0)) -> None:
        body = msg.encode()
        self._write([pack_header(key, len(body), band, loc[0], loc[1]), body])

    def flush_echo(self, now: float) -> int:
        """Write an ECHO whose reply (:class:`~flowlib.events.EchoAnswered`, with the
        sequence number returned here) tells that the router has read everything written
        before it. Only for a router that :attr:`speaks_soft_state`."""
        echo = self.liveness.flush_echo(now)
        self.write_control(LINK_KEY, BAND_MEMBERSHIP, echo)
        return echo.seq

    def join(self, fe: FlowEntry) -> int:
        """Send the JOIN that tells the router what we want of *fe* now; its request ID (the
        answer comes as :class:`~flowlib.events.JoinAnswered`)."""
        req = self._next_req
        self._next_req = (req + 1) & 0xFFFFFFFF or 1
        self._pending[req] = fe.flow.key
        msg, loc = fe.join(req)
        self.write_control(fe.flow.key, BAND_MEMBERSHIP, msg, loc)
        if self.resends is not None:
            self.resends.sent(req, (fe.flow.key, msg, loc), self._now)
            self.deadline_moved = True
        return req

    def forget_request(self, req: int) -> None:
        """Nobody waits for JOIN *req* any more (a late answer is counted as stale)."""
        self._pending.pop(req, None)
        if self.resends is not None:
            self.resends.answered(req)

    def leave(self, fe: FlowEntry) -> None:
        """Tell the router we want nothing of *fe* any more."""
        self.write_control(fe.flow.key, BAND_MEMBERSHIP, C.Leave())
        fe.router_forgot()

    def publish_policy(self, raw: bytes) -> None:
        self.write_control(LINK_KEY, BAND_MEMBERSHIP, C.PolicyMsg(raw))

    def plan(self, payload: bytes | bytearray | memoryview, size: int, fragment: bool | None,
             max_message_size: int, fragment_size: int | None) -> int:
        """How to send a message over this link (:func:`flowlib.fragment.plan_message`
        with the router's maximum payload): 0 plain, -1 escaped, n > 0 fragments of n
        data bytes. Raises MessageTooLarge."""
        return plan_message(payload, size, self.max_payload, fragment, max_message_size,
                            fragment_size)

    def send_message(self, key: bytes, payload: bytes | bytearray | memoryview, size: int,
                     plan: int, band: int, loc_type: int, loc_value: int, ttl: int,
                     origin: int = 0, msg_id: int = 0) -> None:
        """Write a message now: plain (*plan* 0), escaped (-1), or all its fragments."""
        if plan == 0:
            self._write([pack_header(key, size, band, loc_type, loc_value, ttl), payload])
        elif plan < 0:
            self._write([pack_header(key, size + ESCAPE_SIZE, band, loc_type, loc_value, ttl),
                         ESCAPE_PREFIX, payload])
        else:
            for fh, chunk in iter_fragments(memoryview(payload), origin, msg_id, plan):
                self.send_fragment(key, fh, chunk, band, loc_type, loc_value, ttl)
            self.counters["fragments.sent-messages"] += 1

    def send_fragment(self, key: bytes, fh: bytes, chunk: memoryview, band: int,
                      loc_type: int, loc_value: int, ttl: int) -> None:
        self._write([pack_header(key, len(fh) + len(chunk), band, loc_type, loc_value, ttl),
                     fh, chunk])
