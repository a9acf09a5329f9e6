"""UDP links: one shared, non-blocking socket, a link per remote address, batched I/O.

:class:`UdpLinks` owns the node's UDP socket, its links by remote address and its batched
datagram I/O (:mod:`flowrouter.net.udpio`: ``recvmmsg``/``sendmmsg`` when built, else
Python loops). When the socket is readable (``loop.add_reader``) it takes up to
:data:`flowrouter.net.udpio.BATCH` datagrams at once (the rest wait for the next wake-up, so
TCP reads and timers get their turn) and handles them in one read batch
(:class:`~flowrouter.net.nodeapi.ReadBatch`): what the node sends meanwhile to UDP links is
gathered and leaves in one batch when the read ends, a full socket buffer a counted drop.

A datagram carries one or more whole frames (**bundles**: several only toward a peer whose
HELLO announced ``FEATURE_DGRAM_BUNDLE``, packed up to ``udp_bundle`` bytes by the datagram
I/O; taken from any peer). Per-link semantics are those of a stream of whole frames: a new
sender address is a new link, ``last_rx`` is refreshed, a datagram that is not whole frames
drops its link (counted ``malformed.<why>``), the core sees every frame the forwarding fast
path stops at, in arrival order, and a link silent for ``udp_idle_timeout`` is closed (a configured
peer is dialled again). :class:`UdpLink` is one remote address; it sends through a
:class:`~flowrouter.net.output.LinkOutput` like a TCP link, never pauses (one socket serves
every peer).

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire`, :mod:`flowrouter.net.config`,
:mod:`flowrouter.net.udpio`, :mod:`flowrouter.net.output` and :mod:`flowrouter.net.nodeapi`
(the node is seen only through that interface).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from flowrouter.core.fastpath import STOP_END
from flowrouter.core.tables import LinkState
from flowrouter.net.config import PeerConfig, parse_address
from flowrouter.net.output import LinkOutput
from flowrouter.net.udpio import io_choice, set_buffers
from flowrouter.wire.control import FEATURE_DGRAM_BUNDLE
from flowrouter.wire.header import (
    HEADER_SIZE,
    UDP_MAX_PAYLOAD,
    MalformedFrame,
    validate_header,
)

if TYPE_CHECKING:
    from flowrouter.net.nodeapi import Node

log = logging.getLogger("flowrouter.net.runtime")

#: the largest UDP datagram over IPv4: a bundle toward a loopback address
UDP_MAX_DATAGRAM = 65507
#: a bundle toward any other address: an Ethernet frame (1500) less the IPv4 and UDP headers
#: (IPv6: 20 bytes less)
UDP_MTU_DATAGRAM = 1472


class UdpLink:
    """One remote UDP address on the node's shared socket."""

    __slots__ = ("udp", "addr", "link_id", "peer", "last_rx", "address", "out", "dest",
                 "bytes_in", "bytes_out", "bundle")

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
        #: the largest datagram its frames are bundled into (0: a frame per datagram, until
        #: the peer announces FEATURE_DGRAM_BUNDLE; see UdpLinks.bundle_for)
        self.bundle = 0

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        self.out.send(header, payload)  # type: ignore[union-attr]

    def set_reading(self, on: bool) -> None:
        pass  # one socket serves every UDP peer: nothing to pause per link

    def write(self, header: bytes, payload: Any) -> None:
        self.bytes_out += len(header) + len(payload)
        self.udp.gather(self.dest, [header, payload], self.bundle)

    def write_many(self, buffers: list[Any]) -> None:
        """Whole frames (a frame may be a header and its payload in two buffers), in
        datagrams of up to ``bundle`` bytes (:meth:`UdpLinks.gather`)."""
        self.bytes_out += sum(map(len, buffers))
        self.udp.gather(self.dest, buffers, self.bundle)

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
        #: datagrams to send, gathered while the node processes a read: (dest, buffers,
        #: bundle)
        self.out: list[tuple[Any, list[Any], int]] = []
        #: the kernel's count of datagrams it dropped on this socket (SO_RXQ_OVFL), as last
        #: seen, and why the socket buffers are smaller than asked ("" if they are not)
        self.kernel_drops = 0
        self.buffers_capped = ""
        #: a flush is due at the end of the read in progress / of this event-loop turn
        self.after_read = False
        self.soon = False
        #: datagrams read and sent (status: with the frames forwarded, the bundling factor)
        self.datagrams_in = 0
        self.datagrams_out = 0

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
        capped = ""
        if cfg.udp_socket_buffer:
            capped = set_buffers(sock, cfg.udp_socket_buffer)[2]
            if capped:
                log.warning("router %s: UDP socket buffers smaller than udp_socket_buffer "
                            "asks, so bursts are lost sooner (drop.udp-rcvbuf): %s",
                            cfg.name, capped)
        io_cls, io_info = io_choice()
        me = cls(node, sock, io_cls(sock), io_info)
        me.buffers_capped = capped
        return me

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def start(self) -> None:
        self.node.loop.add_reader(self.sock.fileno(), self.readable)
        off = self.io.offloads
        log.info("router %s listening for UDP links on %s:%d (%s; receive buffer %d "
                 "bytes; bundles of up to %s bytes; GSO %s, GRO %s)", self.node.config.name,
                 *self.address, self.io_info,
                 self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                 self.node.config.udp_bundle, "on" if off.gso else "off",
                 "on" if off.gro else "off")

    def stop(self) -> None:
        self.node.loop.remove_reader(self.sock.fileno())
        self.flush()  # what waits for the end of this turn of the loop still leaves
        self.io, self.out = None, []
        self.sock.close()

    def status(self) -> dict[str, Any] | None:
        if self.io is None:
            return None
        sock = self.sock
        return {"io": self.io_info, "native": bool(self.io.native), "batch": self.io.batch,
                "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                "sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                "buffers_capped": self.buffers_capped,
                "kernel_drops_visible": bool(self.io.drops_visible),
                "kernel_drops": self.kernel_drops, "bundle": self.node.config.udp_bundle,
                "gso": self.io.offloads.gso, "gro": self.io.offloads.gro,
                "gso_refused": self.io.offloads.gso_refused,
                "datagrams_in": self.datagrams_in, "datagrams_out": self.datagrams_out,
                "links_bundling": sum(1 for lk in self.links.values() if lk.bundle)}

    def bundle_for(self, link: UdpLink) -> int:
        """The largest datagram *link*'s frames are bundled into: 0 (a frame per datagram)
        unless its peer announced ``FEATURE_DGRAM_BUNDLE``; else ``udp_bundle`` bytes, or
        with ``"auto"`` 65507 toward a loopback address (no wire to fragment on) and an
        Ethernet frame's worth otherwise (1472 bytes over IPv4, 1452 over IPv6)."""
        if not self.peer_features(link) & FEATURE_DGRAM_BUNDLE:
            return 0
        conf = self.node.config.udp_bundle
        if conf != "auto":
            return int(conf)
        try:
            ip = ipaddress.ip_address(link.addr[0].split("%")[0])
        except ValueError:
            return UDP_MTU_DATAGRAM
        if ip.is_loopback:
            return UDP_MAX_DATAGRAM
        return UDP_MTU_DATAGRAM if ip.version == 4 else UDP_MTU_DATAGRAM - 20

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
            blob, grams, drops = self.io.recv()
        except OSError as exc:
            node.core.counters["drop.udp-error"] += 1
            log.debug("router %s: UDP receive failed: %s", node.config.name, exc)
            return
        if drops != self.kernel_drops:  # the kernel's count for this socket (SO_RXQ_OVFL)
            if drops > self.kernel_drops:
                node.core.counters["drop.udp-rcvbuf"] += drops - self.kernel_drops
            self.kernel_drops = drops
        if not grams:
            return
        self.datagrams_in += len(grams)
        reads = node.begin_read(0)
        try:
            self.datagrams(blob, grams)  # a view into the I/O's reused buffer
        finally:
            reads.end()

    def datagrams(self, view: memoryview, grams: list[tuple[tuple[str, int], int, int]]
                  ) -> None:
        """A datagram holds one or more whole frames of the link of its sender's address (a
        new address is a new link; bundles are taken from any peer, though sent only to
        peers that announce ``FEATURE_DGRAM_BUNDLE``). Each run of well-formed datagrams
        from one address is one read of its link (:meth:`frames`); a datagram that is not
        whole frames is malformed and drops its link, as a bad frame drops a TCP link."""
        node = self.node
        links = self.links
        max_payload = min(node.config.max_payload, UDP_MAX_PAYLOAD)
        now = node.now()
        n = len(grams)
        i = pos = 0
        while i < n:
            addr, size, _count = grams[i]
            link = links.get(addr)
            if link is None:
                link = self.link(addr, None)
            link.last_rx = now
            node.begin_read(link.link_id)
            j, end = i, pos
            while j < n:  # the run: datagrams of whole frames from this address
                a, sz, nf = grams[j]
                if a != addr or not nf:
                    break
                end += sz
                j += 1
            if j == i:
                link.bytes_in += size
                exc = _malformed(view[pos:pos + size], max_payload)
                node.execute(node.core.drop_link(link.link_id, exc, now))
                pos += size
                i += 1
            else:
                link.bytes_in += end - pos
                stopped = self.frames(link, view[:end], pos, max_payload, now)
                if stopped < end:  # the link closed: the rest of that datagram goes with it
                    while pos < stopped:
                        pos += grams[i][1]
                        i += 1
                else:
                    pos, i = end, j
            self._changed(link)

    def frames(self, link: UdpLink, view: memoryview, pos: int, max_payload: int,
               now: float) -> int:
        """Whole frames from *link*, ``view[pos:]``: the forwarding fast path takes what it
        may decide alone in one call; the core gets each frame it stops at, in order.
        Returns where it stopped: the end, or the frame after which the link was closed."""
        node = self.node
        core, fast, all_links = node.core, node.fast, node.links
        link_id = link.link_id
        end = len(view)
        while pos < end:
            if fast is not None:
                pos, stop, outs = fast.forward(link_id, view, pos, max_payload)
                for lk, out_frames, count in outs:
                    out_link = all_links.get(lk)
                    if out_link is not None and out_link.out is not None:
                        out_link.out.send_frames(out_frames, count)
                if stop == STOP_END:
                    return end
            try:  # the core's frame
                size = validate_header(view, pos, max_payload)
            except MalformedFrame as exc:
                node.execute(core.drop_link(link_id, exc, now))
                return pos + 1
            body = pos + HEADER_SIZE
            actions = core.receive(link_id, view[pos:body], view[body:body + size], now)
            if actions:
                node.execute(actions)
            pos = body + size
            if self.links.get(link.addr) is not link:
                return pos  # closed by the core
        return end

    def peer_features(self, link: UdpLink) -> int:
        """The feature bits *link*'s peer announced in its HELLO (0 before it)."""
        lk = self.node.core.links.get(link.link_id)
        return lk.features if lk is not None else 0

    def _changed(self, link: UdpLink) -> None:
        """Links changed: tell the node; a configured peer's link that came up resets its
        re-dial back-off."""
        node = self.node
        if node.core.generation != node.reads.generation:
            node.link_state_changed()
            link.bundle = self.bundle_for(link)
            if link.peer is not None:
                lk = node.core.links.get(link.link_id)
                if lk is not None and lk.state is LinkState.UP:
                    node.reached(link.peer)

    # sending ----------------------------------------------------------------------------------
    def gather(self, dest: Any, buffers: list[Any], bundle: int = 0) -> None:
        """Whole frames for *dest*, in datagrams of up to *bundle* bytes (0: a frame per
        datagram): while the node handles a read they wait for its end and leave in one
        batch; otherwise (a timer's sends) at the end of this turn of the event loop, so
        what one tick sends shares datagrams too."""
        if self.io is None:
            return  # stopped
        self.out.append((dest, buffers, bundle))
        reads = self.node.reads
        if reads.open:
            if not self.after_read:
                self.after_read = True
                reads.after.append(self)
        elif not self.soon:
            self.soon = True
            self.node.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send the gathered frames in one batch (the frames of consecutive gathers for one
        address share datagrams); a full socket buffer (``drop.link-congested``) or an
        error (``drop.udp-error``) loses a datagram, counted."""
        self.after_read = self.soon = False
        items, self.out = self.out, []
        if self.io is None or not items:
            return
        if len(items) > 1:
            items = _merged(items)
        sent, congested, failed, err = self.io.send(items)
        self.datagrams_out += sent
        if congested:
            self.node.core.counters["drop.link-congested"] += congested
        if failed:
            self.node.core.counters["drop.udp-error"] += failed
            log.debug("router %s: %d UDP datagrams not sent: %s", self.node.config.name,
                      failed, os.strerror(err) if err else "?")


def _merged(items: list[tuple[Any, list[Any], int]]) -> list[tuple[Any, list[Any], int]]:
    """*items* with each run of consecutive items for one destination made one."""
    out: list[tuple[Any, list[Any], int]] = []
    for dest, buffers, bundle in items:
        if out and out[-1][0] is dest and out[-1][2] == bundle:
            out[-1][1].extend(buffers)
        else:
            out.append((dest, list(buffers), bundle))
    return out


def _malformed(view: memoryview, max_payload: int) -> MalformedFrame:
    """Why a datagram that is not whole frames is refused."""
    if len(view) < HEADER_SIZE:
        return MalformedFrame("truncated", f"datagram of {len(view)} bytes, a header needs 24")
    try:
        validate_header(view, 0, max_payload)
    except MalformedFrame as exc:
        return exc
    return MalformedFrame("bad-datagram", f"a datagram of {len(view)} bytes that is not "
                                          "whole frames")
