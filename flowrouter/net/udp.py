"""UDP links: one shared, non-blocking socket, a link per remote address, batched I/O.

:class:`UdpLinks` owns the node's UDP socket, its links by remote address and its batched
datagram I/O (:mod:`flowrouter.net.udpio`: ``recvmmsg``/``sendmmsg`` when built, else
Python loops). When the socket is readable (``loop.add_reader``) it takes up to
:data:`flowrouter.net.udpio.BATCH` datagrams at once (the rest wait for the next wake-up, so
TCP reads and timers get their turn) and handles them in one read batch
(:class:`~flowrouter.net.nodeapi.ReadBatch`): what the node sends meanwhile to UDP links is
gathered and leaves in one batch when the read ends, a full socket buffer a counted drop.

Per-link semantics are those of a datagram at a time: a new sender address is a new link,
``last_rx`` is refreshed, a datagram that is not exactly one valid frame drops its link
(``split_datagram`` says why), the core sees every datagram the forwarding fast path stops
at, in arrival order, and a link silent for ``udp_idle_timeout`` is closed (a configured
peer is dialled again). :class:`UdpLink` is one remote address; it sends through a
:class:`~flowrouter.net.output.LinkOutput` like a TCP link, never pauses (one socket serves
every peer).

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire`, :mod:`flowrouter.net.config`,
:mod:`flowrouter.net.udpio`, :mod:`flowrouter.net.output` and :mod:`flowrouter.net.nodeapi`
(the node is seen only through that interface).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from flowrouter.core.fastpath import STOP_END
from flowrouter.core.tables import LinkState
from flowrouter.net.config import PeerConfig, parse_address
from flowrouter.net.output import LinkOutput
from flowrouter.net.udpio import io_choice
from flowrouter.wire.header import HEADER_SIZE, UDP_MAX_PAYLOAD, MalformedFrame, split_datagram

if TYPE_CHECKING:
    from flowrouter.net.nodeapi import Node

log = logging.getLogger("flowrouter.net.runtime")


class UdpLink:
    """One remote UDP address on the node's shared socket."""

    __slots__ = ("udp", "addr", "link_id", "peer", "last_rx", "address", "out", "dest",
                 "bytes_in", "bytes_out")

    #: never paused: one socket serves every UDP peer (flow control leaves it alone)
    reading = None

    def __init__(self, udp: UdpLinks, addr: tuple[str, int], peer: PeerConfig | None) -> None:
        self.udp = udp
        self.addr = addr
        self.peer = peer
        self.link_id = 0
        self.last_rx = udp.node.now()
        self.address = f"{addr[0]}:{addr[1]}"
        self.out: LinkOutput | None = None
        #: *addr* as the node's datagram I/O sends to it (flowrouter.net.udpio)
        self.dest: Any = addr
        #: datagram bytes received from and handed to the socket for this address (status)
        self.bytes_in = 0
        self.bytes_out = 0

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        self.out.send(header, payload)  # type: ignore[union-attr]

    def set_reading(self, on: bool) -> None:
        pass  # one socket serves every UDP peer: nothing to pause per link

    def write(self, header: bytes, payload: Any) -> None:
        self.bytes_out += len(header) + len(payload)
        self.udp.gather(self.dest, [header, payload])

    def write_many(self, buffers: list[Any]) -> None:
        """Whole frames (a frame may be a header and its payload in two buffers): each
        becomes a datagram (:meth:`UdpLinks.gather`)."""
        self.bytes_out += sum(map(len, buffers))
        self.udp.gather(self.dest, buffers)

    def close(self, reason: str) -> None:
        if self.out is not None:
            self.out.close()
        self.udp.links.pop(self.addr, None)

    abort = close


class UdpLinks:
    """The node's UDP socket and the links on it (one per remote address)."""

    def __init__(self, node: Node, sock: socket.socket, io: Any, io_info: str) -> None:
        self.node = node
        self.sock = sock
        #: the batched datagram I/O (None once stopped: nothing may be sent on the closed
        #: socket's number, the kernel reuses it), and which one and why (log, status)
        self.io: Any = io
        self.io_info = io_info
        self.links: dict[tuple[str, int], UdpLink] = {}
        #: datagrams to send, gathered while the node processes a read: (dest, buffers)
        self.out: list[tuple[Any, list[Any]]] = []

    @classmethod
    def bind(cls, node: Node, address: str) -> UdpLinks:
        """A non-blocking UDP socket bound to *address*, with the node's buffer sizes."""
        cfg = node.config
        host, port = parse_address(address, "udp")
        # Our own socket object: asyncio's wrapper would forbid the zero-copy sendmsg.
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        sock = socket.socket(info[0], socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(info[4])
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF) if cfg.udp_socket_buffer else ():
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, cfg.udp_socket_buffer)
            except OSError as exc:
                log.warning("router %s: UDP socket buffer of %d bytes refused: %s",
                            cfg.name, cfg.udp_socket_buffer, exc)
        io_cls, io_info = io_choice()
        return cls(node, sock, io_cls(sock), io_info)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def start(self) -> None:
        self.node.loop.add_reader(self.sock.fileno(), self.readable)
        log.info("router %s listening for UDP links on %s:%d (%s; receive buffer %d "
                 "bytes)", self.node.config.name, *self.address, self.io_info,
                 self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    def stop(self) -> None:
        self.node.loop.remove_reader(self.sock.fileno())
        self.io, self.out = None, []
        self.sock.close()

    def status(self) -> dict[str, Any] | None:
        if self.io is None:
            return None
        sock = self.sock
        return {"io": self.io_info, "native": bool(self.io.native), "batch": self.io.batch,
                "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                "sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)}

    # links ------------------------------------------------------------------------------------
    def link(self, addr: tuple[str, int], peer: PeerConfig | None) -> UdpLink:
        """A new link to *addr* (dialled for a configured *peer*, or a new sender)."""
        node = self.node
        link = UdpLink(self, addr, peer)
        link.link_id = node.register(link)
        link.dest = self.io.dest(addr)
        link.out = LinkOutput(node, link.link_id, link.write, link.write_many)
        self.links[addr] = link
        mods = peer.modifiers if peer else None  # accepted: learnt at HELLO
        actions = node.core.open_link(link.link_id, node.now(), transport="udp",
                                      address=link.address, modifiers=mods,
                                      expected_peer=peer.name if peer else None)
        node.core.links[link.link_id].max_payload = min(node.config.max_payload,
                                                        UDP_MAX_PAYLOAD)
        node.execute(actions)
        return link

    def dial(self, addr: tuple[str, int], peer: PeerConfig) -> None:
        existing = self.links.get(addr)
        if existing is not None:  # the peer dialled us meanwhile: that link is ours
            if existing.peer is None:
                existing.peer = peer
            return
        self.link(addr, peer)

    def reap_idle(self, now: float) -> None:
        """Close the links silent for ``udp_idle_timeout``; dial configured peers again."""
        node = self.node
        idle = node.config.udp_idle_timeout
        for addr, link in list(self.links.items()):
            if now - link.last_rx > idle:
                log.info("UDP link %d (%s) idle for %.0fs; closing", link.link_id,
                         link.address, idle)
                node.execute(node.core.close_link(link.link_id, now, "UDP peer silent"))
                self.links.pop(addr, None)
                node.unregister(link.link_id)
                if link.peer is not None:
                    node.redial(link.peer)

    # receiving --------------------------------------------------------------------------------
    def readable(self) -> None:
        """The socket is readable: take a bounded batch of datagrams and handle them all in
        one read batch; what they caused is sent when it ends."""
        node = self.node
        try:
            blob, grams = self.io.recv()
        except OSError as exc:
            node.core.counters["drop.udp-error"] += 1
            log.debug("router %s: UDP receive failed: %s", node.config.name, exc)
            return
        if not grams:
            return
        reads = node.begin_read(0)
        try:
            self.datagrams(memoryview(blob), grams)
        finally:
            reads.end()

    def datagrams(self, view: memoryview, grams: list[tuple[tuple[str, int], int]]) -> None:
        """One datagram is one frame of the link of its sender's address (a new address is a
        new link): each run of datagrams from one address is one read of its link. Runs of
        well-formed datagrams go through the forwarding fast path in one call; the core gets
        every datagram the engine stops at, and each malformed one (which drops its link)."""
        node = self.node
        core, fast, links, all_links = node.core, node.fast, self.links, node.links
        max_payload = min(node.config.max_payload, UDP_MAX_PAYLOAD)
        now = node.now()
        n = len(grams)
        i = pos = 0
        while i < n:
            addr, size = grams[i]
            link = links.get(addr)
            if link is None:
                link = self.link(addr, None)
            link.last_rx = now
            link_id = link.link_id
            node.begin_read(link_id)
            if fast is not None:
                j, end = i, pos
                while j < n:  # the run: whole frames from this address, one per datagram
                    a, sz = grams[j]
                    if (a != addr or sz < HEADER_SIZE or int.from_bytes(
                            view[end + 16:end + 20], "big") != sz - HEADER_SIZE):
                        break
                    end += sz
                    j += 1
                if j > i:
                    p, stop, outs = fast.forward(link_id, view[:end], pos, max_payload)
                    for lk, frames, count in outs:
                        out_link = all_links.get(lk)
                        if out_link is not None and out_link.out is not None:
                            out_link.out.send_frames(frames, count)
                    taken = pos
                    while pos < p:  # the datagrams the engine took
                        pos += grams[i][1]
                        i += 1
                    link.bytes_in += pos - taken
                    if stop == STOP_END:
                        self._changed(link)
                        continue
                    size = grams[i][1]  # the engine stopped here: the core's datagram
            end = pos + size
            link.bytes_in += size
            try:
                header, payload = split_datagram(view[pos:end], max_payload)
            except MalformedFrame as exc:
                node.execute(core.drop_link(link_id, exc, now))
            else:
                actions = core.receive(link_id, header, payload, now)
                if actions:
                    node.execute(actions)
            pos = end
            i += 1
            self._changed(link)

    def _changed(self, link: UdpLink) -> None:
        """Links changed: tell the node; a configured peer's link that came up resets its
        re-dial back-off."""
        node = self.node
        if node.core.generation != node.reads.generation:
            node.link_state_changed()
            if link.peer is not None:
                lk = node.core.links.get(link.link_id)
                if lk is not None and lk.state is LinkState.UP:
                    node.reached(link.peer)

    # sending ----------------------------------------------------------------------------------
    def gather(self, dest: Any, buffers: list[Any]) -> None:
        """Datagrams (whole frames) for *dest*: while the node handles a read they wait for
        its end and leave in one batch; otherwise they leave now."""
        if self.io is None:
            return  # stopped
        out = self.out
        out.append((dest, buffers))
        reads = self.node.reads
        if not reads.open:
            self.flush()
        elif len(out) == 1:
            reads.after.append(self)

    def flush(self) -> None:
        """Send the gathered datagrams in one batch; a full socket buffer
        (``drop.link-congested``) or an error (``drop.udp-error``) loses a datagram,
        counted."""
        items, self.out = self.out, []
        if self.io is None or not items:
            return
        _sent, congested, failed, err = self.io.send(items)
        if congested:
            self.node.core.counters["drop.link-congested"] += congested
        if failed:
            self.node.core.counters["drop.udp-error"] += failed
            log.debug("router %s: %d UDP datagrams not sent: %s", self.node.config.name,
                      failed, os.strerror(err) if err else "?")
