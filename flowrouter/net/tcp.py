"""TCP links: one asyncio Protocol per connection (a UDP link is :mod:`flowrouter.net.udp`'s).

A TCP link reads into one reused buffer (a ``BufferedProtocol`` over
:class:`~flowrouter.net.streamio.RecvBuffer`): with the forwarding fast path on a plain link,
frames are forwarded from it in place and written with one ``writev`` per output link
(:func:`~flowrouter.net.streamio.write_gathered`); frames the core gets are copied out first,
because the core may keep them (queues, traces) and the next read overwrites the buffer. The
handshake, sealed links and the Python-core path copy each read out whole and hand it to the
link's :class:`~flowrouter.wire.streamcodec.StreamCodec` (handshake frames one at a time,
then sealed records or plain frames), the stream reader flowlib's links use too. Each read,
the handshake's included, is one :class:`~flowrouter.net.nodeapi.ReadBatch`; the link sends
through a :class:`~flowrouter.net.output.LinkOutput`. Links whose started frame stops
arriving are closed (:func:`reap_stalled_frames`).

Every connection passes the node's :class:`~flowrouter.net.connlimits.ConnectionGate` when
it is made: an accepted one over its listen port's cap or the descriptor budget is told why
(an ERROR frame) and closed before the core sees it; one that proves it is a router stops
counting against its port. An application that used up its control messages for the tick
(the core's ``control_per_tick``) is not read further until the next tick: the rest of its
read waits in the receive buffer (plain links on the fast path) and TCP pushes back.

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire`, :mod:`flowrouter.net.config`,
:mod:`flowrouter.net.connlimits`, :mod:`flowrouter.net.output`, :mod:`flowrouter.net.streamio` and
:mod:`flowrouter.net.nodeapi` (the node is seen only through that interface).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Any

from flowrouter.core.fastpath import STOP_END, STOP_PARTIAL
from flowrouter.core.tables import LinkState
from flowrouter.net.config import PeerConfig
from flowrouter.net.connlimits import DIAL
from flowrouter.net.output import LinkOutput
from flowrouter.net.streamio import RecvBuffer, write_gathered
from flowrouter.wire import control as C
from flowrouter.wire.control import Role
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import (
    HEADER_SIZE,
    OFF_SIZE,
    MalformedFrame,
    pack_header,
    validate_header,
)
from flowrouter.wire.linkrecords import SecureStream
from flowrouter.wire.streamcodec import Phase, StreamCodec

if TYPE_CHECKING:
    from flowrouter.net.nodeapi import Node

log = logging.getLogger("flowrouter.net.runtime")

_PLAIN = Phase.PLAIN  #: looked up once per read on the fast path


class TcpLink(asyncio.BufferedProtocol):
    """One TCP connection to a router or an application (dialled or accepted)."""

    __slots__ = ("node", "peer", "link_id", "transport", "codec", "out", "address",
                 "reading", "frames_in", "partial_since", "only", "rx", "fd", "port",
                 "counted", "held", "queued", "bytes_in", "bytes_out")

    def __init__(self, node: Node, peer: PeerConfig | None,
                 only: Role | None = None) -> None:
        self.node = node
        self.peer = peer
        #: accepted on a listener for routers only or applications only (None: either)
        self.only = only
        self.link_id = 0
        self.transport: asyncio.Transport | None = None
        #: reads copied-out reads (handshake, sealed links, the Python-core path) and seals
        #: writes once keys are installed
        self.codec = StreamCodec(node.config.max_payload)
        #: what every read goes into; frames are forwarded from it in place
        self.rx = RecvBuffer(most=node.config.read_buffer)
        #: the socket's descriptor, when writes may go straight to it (asyncio's selector
        #: transports and uvloop's, whose socket nothing else writes while their buffer,
        #: libuv's write queue included, is empty)
        self.fd = -1
        self.out: LinkOutput | None = None
        self.address = "?"
        self.reading = True
        #: frames completed so far, and since when an incomplete one has been arriving (the
        #: frame progress time-out: a started frame must complete within frame_timeout)
        self.frames_in = 0
        self.partial_since: float | None = None
        #: the gate's port key while the gate counts this connection (None: not admitted),
        #: and whether it still counts against the port's cap (not a proven router)
        self.port: str | None = None
        self.counted = True
        #: reading stopped until the next tick: the application's control budget is spent
        self.held = False
        #: the decoded frames of a copied-out read (the Python-core path, sealed links)
        #: that wait for that tick; in-place reads leave them in the receive buffer
        self.queued: list[tuple[memoryview, memoryview]] = []
        #: bytes read from and handed to the connection (status, metrics)
        self.bytes_in = 0
        self.bytes_out = 0

    # asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # duck-typed: uvloop's transports are not asyncio.Transport subclasses
        self.transport = transport  # type: ignore[assignment]
        node = self.node
        # A small transport buffer (a few large frames): beyond it frames wait in our fair
        # queue, not in asyncio's.
        self.transport.set_write_buffer_limits(high=256 * 1024)  # type: ignore[union-attr]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if type(transport).__module__ in ("asyncio.selector_events", "uvloop.loop"):
                self.fd = sock.fileno()
        peername = transport.get_extra_info("peername")
        self.address = f"{peername[0]}:{peername[1]}" if peername else "?"
        if not self._admitted(transport):
            return
        self.link_id = node.register(self)
        self.out = LinkOutput(node, self.link_id, self.write, self.write_many, self.write_now)
        mods = self.peer.modifiers if self.peer else None  # accepted: learnt at HELLO
        node.execute(node.core.open_link(
            self.link_id, node.now(), transport="tcp", address=self.address, modifiers=mods,
            expected_peer=self.peer.name if self.peer else None))

    def _admitted(self, transport: asyncio.BaseTransport) -> bool:
        """Pass the gate (per-port cap, descriptor budget); refused: say why and close."""
        port = DIAL
        if self.peer is None:
            local = transport.get_extra_info("sockname")
            port = f"listen {local[0]}:{local[1]}" if local else "listen ?"
        why = self.node.gate.admit(port, self.node.now(), routers=self.only is not Role.ENDPOINT)
        if why is None:
            self.port = port
            return True
        body = C.Error(3, f"connection refused: {why}").encode()
        transport.write(pack_header(LINK_LOCAL_FLOW.key, len(body), 0)  # type: ignore[attr-defined]
                        + body)
        transport.close()
        return False

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.rx.space()

    def buffer_updated(self, nbytes: int) -> None:
        rx = self.rx
        rx.filled(nbytes)
        self.bytes_in += nbytes
        if self.codec.phase is _PLAIN and self.node.fast is not None:
            if rx.waiting:
                return  # the frame kept is still incomplete (its clock runs on)
            before = self.frames_in
            self._in_place()
            self._note_partial(before)
        else:  # copied out: the codec, the handshake and the core may keep views of it
            self.data_received(rx.take())

    @property
    def secure(self) -> SecureStream | None:
        """The record layer once the handshake installed keys (None on a plain link)."""
        return self.codec.sealed

    def pending(self) -> int:
        """Bytes of an incomplete frame received so far."""
        return self.codec.pending + self.unread()[1]

    def unread(self) -> tuple[int, int]:
        """(whole frames read and not yet handled, bytes of an incomplete frame after them):
        frames wait whole only for the control budget's next tick (decoded, or in the
        receive buffer); any other read leaves at most an incomplete frame behind."""
        rx = self.rx
        view, pos, end, n = rx.view, rx.start, rx.end, len(self.queued)
        while end - pos >= HEADER_SIZE:
            nxt = pos + HEADER_SIZE + int.from_bytes(view[pos + OFF_SIZE:pos + OFF_SIZE + 4],
                                                     "big")
            if nxt > end:
                break
            pos, n = nxt, n + 1
        return n, end - pos

    def data_received(self, data: bytes) -> None:
        before = self.frames_in
        self._data(data)
        self._note_partial(before)

    def _note_partial(self, before: int) -> None:
        """Start or stop the frame progress clock (*before*: frames_in before the read)."""
        codec = self.codec
        pending = (codec.frames.pending or self.rx.pending  # a frame not yet whole
                   or (codec.sealed is not None and codec.pending_record))
        if not pending:
            self.partial_since = None
        elif self.partial_since is None or self.frames_in != before:
            self.partial_since = self.node.now()  # a new frame started

    def _data(self, data: bytes) -> None:
        """A copied-out read, in whichever phase the stream is."""
        codec = self.codec
        if codec.phase is Phase.HANDSHAKE:
            self._handshake_bytes(data)
            return
        try:
            chunks = codec.plaintext(data)
        except MalformedFrame as exc:
            node = self.node
            node.execute(node.core.drop_link(self.link_id, exc, node.now()))
            return
        if codec.phase is Phase.SEALED and chunks:
            self.frames_in += 1  # a whole record arrived
        for chunk in chunks:
            self._frames(chunk)  # type: ignore[arg-type]

    def _handshake_bytes(self, data: bytes) -> None:
        """Handshake frames go to the core one at a time; the first frame after which the
        link is up, or sealed, ends the handshake, and the rest of the read goes on in the
        next phase (in place in the receive buffer when plain and forwarded by the engine).
        The handshake frames of a read are one read batch, as any other (what they cause is
        written when it ends; the node writes a link's batch before sealing it)."""
        node = self.node
        codec = self.codec
        reads = node.begin_read(self.link_id)
        try:
            for header, payload in codec.receive_data(data):
                node.execute(node.core.receive(self.link_id, header, payload, node.now()))
                link = node.core.links.get(self.link_id)
                if link is None:
                    return  # refused or dropped
                if (link.state is LinkState.UP and link.role is Role.ROUTER
                        and self.peer is None and self.port is not None and self.counted):
                    self.counted = False  # a proven router: not counted against its port
                    node.gate.proven_router(self.port)
                if link.state is LinkState.UP and self.only is not None and link.role is not \
                        self.only:
                    why = (f"{link.role.name.lower() if link.role else '?'} on a listener "
                           f"for {self.only.name.lower()}s only")
                    node.execute(node.core.close_link(self.link_id, node.now(), why))
                    self.close(why)
                    return
                if codec.phase is Phase.SEALED or link.state is LinkState.UP:
                    break
            else:
                return  # the handshake goes on in the next read
        except MalformedFrame as exc:
            node.execute(node.core.drop_link(self.link_id, exc, node.now()))
            return
        finally:
            reads.end()
        codec.end_handshake()
        rest = codec.take_buffered()
        if self.peer is not None and link.state is LinkState.UP:
            node.reached(self.peer)  # the back-off starts over only for a link that is up
        node.link_state_changed()
        if rest and codec.phase is _PLAIN and node.fast is not None:
            self.rx.load(rest)  # the stream goes on in the receive buffer
            self._in_place()
        elif rest:
            self._data(rest)

    def _frames(self, data: bytes) -> None:
        node = self.node
        if node.fast is not None and not (self.held or self.queued):
            self._fast_frames(data)
            return
        try:
            frames = self.codec.frames.feed(data)
        except MalformedFrame as exc:
            node.execute(node.core.drop_link(self.link_id, exc, node.now()))
            return
        if not frames:
            return
        self.frames_in += len(frames)
        if self.held or self.queued:  # held back for the control budget: these wait too
            self.queued += frames
            return
        self._to_core(frames)

    def _to_core(self, frames: list[tuple[memoryview, memoryview]]) -> None:
        """Decoded frames to the core, one by one, until the application's control budget
        for this tick is spent: the rest wait, unread, for the next tick (as the fast path
        leaves them in its receive buffer), so that one read of a flood costs the loop
        ``control_per_tick`` messages' work, not a whole buffer's."""
        node = self.node
        core, now, link_id, execute = node.core, node.now(), self.link_id, node.execute
        reads = node.begin_read(link_id)
        try:
            for i, (header, payload) in enumerate(frames):
                actions = core.receive(link_id, header, payload, now)
                if actions:
                    execute(actions)
                if core.over_control_budget(link_id):
                    self.queued = frames[i + 1:]
                    self._hold_until_tick()
                    break
        finally:
            reads.end()

    def _queue(self, rest: memoryview) -> None:
        """The rest of a copied-out read once the control budget is spent: its whole frames
        wait for the next tick (then the core takes them, as :meth:`_to_core` does), an
        incomplete one in the decoder."""
        frames = self.codec.frames.feed(bytes(rest))
        self.frames_in += len(frames)
        self.queued = frames
        self._hold_until_tick()

    def _fast_frames(self, data: bytes) -> None:
        """One read through the fast path: the engine forwards what it can decide alone in
        one pass into per-link buffers, the core gets each frame it stops at, and every
        output link is written once at the end."""
        node = self.node
        core, link_id = node.core, self.link_id
        max_payload = node.config.max_payload
        view = memoryview(data)
        n = len(view)
        reads = node.begin_read(link_id)
        try:
            pos = 0
            decoder = self.codec.frames
            if decoder.pending:  # first the frame split across reads
                whole, pos = decoder.complete(view)
                if whole is not None:
                    self.frames_in += 1
                    self._fast_pass(whole, 0, max_payload, len(whole), True)
            while pos < n and link_id in core.links:
                if core.over_control_budget(link_id):
                    self._queue(view[pos:])
                    break
                pos, done = self._fast_pass(view, pos, max_payload, n, True)
                if done:
                    if pos < n:
                        # keeps (copies) the incomplete frame; feed takes any buffer
                        decoder.feed(view[pos:])  # type: ignore[arg-type]
                    break
        except MalformedFrame as exc:
            node.execute(core.drop_link(link_id, exc, node.now()))
        finally:
            reads.end()

    def _in_place(self) -> None:
        """One read through the fast path, in place in the receive buffer: as
        :meth:`_fast_frames`, and what is left (an incomplete frame) stays in the buffer."""
        node = self.node
        core, link_id, rx = node.core, self.link_id, self.rx
        max_payload = node.config.max_payload
        n = rx.end
        view = rx.view[:n]
        pos, need = rx.start, HEADER_SIZE
        reads = node.begin_read(link_id)
        try:
            while pos < n:
                if link_id not in core.links:
                    pos = n  # dropped or closed: the rest is moot
                    break
                pos, done = self._fast_pass(view, pos, max_payload, n, False)
                if done:
                    break
                if core.over_control_budget(link_id):
                    self._hold_until_tick()  # the rest waits in the buffer
                    break
            if n - pos >= HEADER_SIZE:  # refuse an oversized frame before gathering it
                need = HEADER_SIZE + validate_header(view, pos, max_payload)
        except MalformedFrame as exc:
            pos = n
            node.execute(core.drop_link(link_id, exc, node.now()))
        finally:
            reads.end()  # before the buffer moves: the writes may point into it
        rx.keep(pos, need)

    def _fast_pass(self, view: Any, pos: int, max_payload: int, n: int, owned: bool
                   ) -> tuple[int, bool]:
        """Forward from *pos*; hand the frame the engine stopped at to the core (a copy of
        it unless *view* is *owned*, not the reused receive buffer). Returns where to go
        on, and whether the read is done (an incomplete frame may start there)."""
        node = self.node
        links = node.links
        start = pos
        # the receive buffer (not owned) is ours until the read ends: frames forwarded to
        # one link leave as a view of it, headers rewritten in it, not as a copy
        pos, stop, outs = node.fast.forward(self.link_id, view, pos, max_payload,  # type: ignore[union-attr]
                                            in_place=not owned)
        if pos > start:
            self.frames_in += 1  # whole frames went by (the progress time-out's clock)
        if outs:
            writes = node.reads.writes
            writes.begin()  # this pass's writes, together (a fan-out's on helper threads too)
            try:
                for lk, frames, count in outs:
                    link = links.get(lk)
                    if link is not None and link.out is not None:
                        link.out.send_frames(frames, count)
            finally:
                writes.run()
        if stop in (STOP_END, STOP_PARTIAL):
            return pos, True
        end = pos + HEADER_SIZE + validate_header(view, pos, max_payload)
        if end > n:
            return pos, True
        header, payload = view[pos:pos + HEADER_SIZE], view[pos + HEADER_SIZE:end]
        if not owned:  # the core may keep them (queues, traces); the buffer is reused
            header, payload = bytes(header), bytes(payload)
        actions = node.core.receive(self.link_id, header, payload, node.now())
        self.frames_in += 1
        if actions:
            node.execute(actions)
        return end, False

    def _hold_until_tick(self) -> None:
        """Stop reading until the next tick (the application's control budget is spent)."""
        if self.held or self.transport is None:
            return
        self.held = True
        if self.reading:
            self.transport.pause_reading()
        self.node.loop.call_later(self.node.config.tick_interval, self._release_hold)

    def _release_hold(self) -> None:
        """The next tick: read again (unless flow control holds the link) and go on with
        what waits in the buffer."""
        self.held = False
        transport = self.transport
        if transport is None or transport.is_closing() or not self.reading:
            return
        transport.resume_reading()
        rx = self.rx
        if self.queued:
            frames, self.queued = self.queued, []
            if self.link_id in self.node.core.links:
                self._to_core(frames)
        elif rx.pending and not rx.waiting and self.link_id in self.node.core.links:
            before = self.frames_in
            self._in_place()
            self._note_partial(before)

    def connection_lost(self, exc: Exception | None) -> None:
        node = self.node
        if self.port is None:
            return  # refused by the gate: never registered
        node.gate.release(self.port, self.counted)
        self.port = None
        reason = f"connection lost: {exc}" if exc else "connection closed by peer"
        held, tail = self.unread()
        pending = self.codec.pending + tail  # bytes of an incomplete frame
        if held and self.link_id in node.core.links:
            # read, never handled: the link closed while they waited for the next tick
            node.core.counters["drop.unread-at-close"] += held
            log.info("%s: %s with %d frames unread (held for its control budget)",
                     self._describe(), reason, held)
        if pending and self.link_id in node.core.links:  # not yet counted
            node.core.counters["malformed"] += 1
            node.core.counters["malformed.truncated"] += 1
            reason = f"truncated frame ({pending} bytes of an incomplete frame)"
            log.warning("%s: malformed input: %s; dropping the link", self._describe(),
                        reason)
        if self.out is not None:
            self.out.close()
        self.partial_since = None
        node.execute(node.core.close_link(self.link_id, node.now(), reason))
        node.unregister(self.link_id)
        if self.peer is not None:
            node.redial(self.peer, reason)

    def _describe(self) -> str:
        link = self.node.core.links.get(self.link_id)
        return link.describe() if link else f"link {self.link_id}"

    def pause_writing(self) -> None:
        if self.out is not None:
            self.out.pause()

    def resume_writing(self) -> None:
        if self.out is not None:
            self.out.resume()

    # link interface ---------------------------------------------------------------------------
    def write(self, header: bytes, payload: Any) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            codec = self.codec
            if codec.sealed is not None:  # sealing needs the bytes together anyway
                self.node.reads.writes.settle(self.fd)  # plain frames gathered go first
                record = codec.send_data(header + bytes(payload))
                self.bytes_out += len(record)
                transport.write(record)
            else:
                size = len(header) + len(payload)
                self.bytes_out += size
                self.node.reads.writes.write(transport, self.fd, [header, payload], size)

    def write_many(self, buffers: list[Any], now: bool = False) -> None:
        """Write buffers in order; they may point into a receive buffer about to be reused
        (write_gathered leaves nothing behind that does). Gathered until the batch in
        progress ends (a forwarding pass's, or the read's flush), unless *now*
        (:meth:`write_now`)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            codec = self.codec
            writes = self.node.reads.writes
            if codec.sealed is not None or now:
                writes.settle(self.fd)  # what the batch gathered for it goes first
            if codec.sealed is not None:
                record = codec.send_data(b"".join(buffers))
                self.bytes_out += len(record)
                transport.write(record)
            else:
                size = sum(map(len, buffers))
                self.bytes_out += size
                if now:
                    write_gathered(transport, self.fd, buffers)
                else:
                    writes.write(transport, self.fd, buffers, size)

    def write_now(self, buffers: list[Any]) -> None:
        """:meth:`write_many` at once, even while a batch gathers: a queue's drain writes
        until the transport pushes back, so it must see the push back when it comes."""
        self.write_many(buffers, True)

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        self.out.send(header, payload)  # type: ignore[union-attr]

    def set_reading(self, on: bool) -> None:
        if self.transport is None or on == self.reading:
            return
        self.reading = on
        if on:
            if self.partial_since is not None:  # its frame's clock stood while we did not read
                self.partial_since = self.node.now()
            if self.held:
                return  # held for its control budget: read again at the next tick
            self.transport.resume_reading()
            if self.queued or (self.rx.pending and not self.rx.waiting):  # left by a hold
                self.node.loop.call_soon(self._release_hold)
        else:
            self.transport.pause_reading()

    def close(self, reason: str) -> None:
        """Close after writing what is pending: what the read in progress gathered for it
        (the refusal or error that closes it, say), then the transport's buffer."""
        if self.transport is not None:
            if self.out is not None:
                self.out.flush()
            self.node.reads.writes.settle(self.fd)  # written now, not after the close
            self.transport.close()

    def abort(self, reason: str) -> None:
        """Close without flushing: the peer does not read, a graceful close would wait."""
        if self.transport is not None:
            self.node.reads.writes.settle(self.fd)  # what was gathered for it, as before
            self.transport.abort()


def reap_stalled_frames(node: Node, now: float) -> None:
    """Close the TCP links whose started frame has not arrived in full within
    ``frame_timeout`` seconds (slow senders hold no connection for ever), except while the
    router itself is not reading them (held or paused for credit: its clock restarts when
    reading does)."""
    limit = node.config.frame_timeout
    for link in list(node.links.values()):
        if (isinstance(link, TcpLink) and link.partial_since is not None
                and now - link.partial_since > limit and link.reading):
            link.partial_since = None
            node.core.counters["reaped.stalled-frame"] += 1
            lk = node.core.links.get(link.link_id)
            log.warning("router %s: %s: a frame started %.1fs ago is still incomplete; "
                        "closing the link", node.config.name,
                        lk.describe() if lk else f"link {link.link_id}", limit)
            node.execute(node.core.close_link(link.link_id, now, "stalled frame"))
            link.abort("stalled frame")
            node.link_state_changed()
