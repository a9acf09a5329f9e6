"""Datagram links for applications: the router's UDP listener for flowlib's ``udp://`` links.

Router-to-router UDP is :mod:`flowrouter.net.udp` (frames bundled per datagram, batched I/O);
this is the application side, with the framing of :mod:`flowrouter.wire.appdgram`: each
datagram is a numbered prefix and one or more whole frames. One :class:`AppDatagrams` owns
the socket (an asyncio datagram endpoint on ``app_udp``); each remote address that opens
with a HELLO is one :class:`AppDatagramLink`, an application link to the core like any
other (``transport="dgram"``: the handshake tolerates a lost datagram by repeats; with link
keys the link must negotiate encryption, and every datagram after the handshake is sealed
here, :mod:`flowrouter.wire.appdgram`). Only applications may link here: a HELLO
that claims a router is refused. A datagram that is not whole frames, fails its seal, or
comes plain on a sealed link is dropped alone (``appdgram.refused.<why>``), gaps in a
link's datagram numbers are counted
(``appdgram.lost``), and a link silent for ``udp_idle_timeout`` is closed (liveness
normally closes a dead application first). Sends never wait: a full socket buffer drops
the datagram (``drop.link-congested``), so a constrained path loses frames instead of
queueing them.

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire`, :mod:`flowrouter.net.config`,
:mod:`flowrouter.net.output`, :mod:`flowrouter.net.udpio` (socket buffers) and
:mod:`flowrouter.net.nodeapi` (the node is seen only through that interface).
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from flowrouter.core.fastpath import STOP_END
from flowrouter.core.tables import LinkState
from flowrouter.net.config import parse_address
from flowrouter.net.output import LinkOutput
from flowrouter.net.udpio import set_buffers
from flowrouter.wire import control as C
from flowrouter.wire.appdgram import (
    MAX_PAYLOAD,
    DatagramPacker,
    DatagramSequence,
    frame_spans,
    open_datagram,
)
from flowrouter.wire.header import HEADER_SIZE, MalformedFrame

if TYPE_CHECKING:
    from flowrouter.net.nodeapi import Node

log = logging.getLogger("flowrouter.net.runtime")

#: applications one listener serves at once (a flood of HELLOs from new addresses is refused
#: past it, counted ``appdgram.refused-full``)
MAX_LINKS = 4096
#: bytes the socket's user-space buffer may hold (the kernel's was full) before datagrams are
#: dropped instead: a datagram link loses rather than queues
SEND_BACKLOG = 256 * 1024


class AppDatagramLink:
    """One application's address on the router's application datagram socket."""

    __slots__ = ("owner", "addr", "link_id", "address", "out", "packer", "rx", "last_rx",
                 "keyed", "bytes_in", "bytes_out")

    #: never paused: one socket serves every application here
    reading = None

    def __init__(self, owner: AppDatagrams, addr: tuple[str, int]) -> None:
        self.owner = owner
        self.addr = addr
        self.link_id = 0
        self.address = f"{addr[0]}:{addr[1]}"
        self.out: LinkOutput | None = None
        self.packer = DatagramPacker(rekey_interval=owner.node.config.link_rekey_seconds)
        self.rx = DatagramSequence()
        self.last_rx = owner.node.now()
        #: the handshake's keys were looked at (sealing starts then, if it was negotiated)
        self.keyed = False
        #: datagram bytes received on it and handed to the socket for it
        self.bytes_in = 0
        self.bytes_out = 0

    def send(self, header: bytes, payload: bytes | memoryview) -> None:
        self.out.send(header, payload)  # type: ignore[union-attr]

    def set_reading(self, on: bool) -> None:
        pass  # one socket serves every application here: nothing to pause per link

    @property
    def secure(self) -> Any:
        """What the status query reads of a sealed link (its ``cipher``), else None."""
        cipher = self.packer.cipher
        return None if cipher is None else SimpleNamespace(cipher=cipher)

    def write(self, header: bytes, payload: Any) -> None:
        self.write_many([header, payload])

    def write_many(self, buffers: list[Any]) -> None:
        """Whole frames, back to back: packed into as few datagrams as fit."""
        datagrams = self.packer.pack(frame_spans(buffers), self.owner.node.now())
        self.bytes_out += self.owner.sendto(datagrams, self.addr)

    def close(self, reason: str) -> None:
        self.owner.forget(self)

    abort = close


class AppDatagrams(asyncio.DatagramProtocol):
    """The router's datagram socket for applications and the links on it."""

    def __init__(self, node: Node) -> None:
        self.node = node
        #: the datagram endpoint (typed loosely: asyncio's and uvloop's both report their
        #: user-space buffer with get_write_buffer_size, which the stubs do not declare)
        self.transport: Any = None
        self.links: dict[tuple[str, int], AppDatagramLink] = {}

    @classmethod
    async def open(cls, node: Node, address: str) -> AppDatagrams:
        host, port = parse_address(address, "app_udp")
        me = cls(node)
        await node.loop.create_datagram_endpoint(lambda: me, local_addr=(host, port))
        size = node.config.udp_socket_buffer
        sock = me.transport.get_extra_info("socket")
        capped = set_buffers(sock, size)[2] if size and sock is not None else ""
        if capped:
            log.warning("router %s: application datagram socket buffers smaller than "
                        "udp_socket_buffer asks: %s", node.config.name, capped)
        log.info("router %s listening for application datagram links on %s:%d",
                 node.config.name, *me.address)
        return me

    @property
    def address(self) -> tuple[str, int]:
        assert self.transport is not None
        host, port = self.transport.get_extra_info("sockname")[:2]
        return host, port

    def close(self) -> None:
        for link in list(self.links.values()):
            self._close(link, "router stopping")
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    # asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def error_received(self, exc: Exception) -> None:
        self.node.core.counters["drop.udp-error"] += 1
        log.debug("router %s: application datagram error: %s", self.node.config.name, exc)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        node = self.node
        core = node.core
        addr = (addr[0], addr[1])
        link = self.links.get(addr)
        max_payload = min(node.config.max_payload, MAX_PAYLOAD)
        try:
            seq, frames = open_datagram(data, link.packer.cipher if link else None,
                                        max_payload)
        except MalformedFrame as exc:
            core.counters[f"appdgram.refused.{exc.reason}"] += 1
            log.debug("router %s: datagram from %s:%d dropped: %s", node.config.name, *addr,
                      exc)
            return
        if link is None:
            link = self._new_link(addr, frames)
            if link is None:
                return
        now = node.now()
        link.last_rx = now
        link.bytes_in += len(data)
        lost = link.rx.seen(seq)
        if lost:
            core.counters["appdgram.lost"] += lost
        link_id = link.link_id
        fast = node.fast if link.keyed else None  # the handshake's frames: the core's
        reads = node.begin_read(link_id)
        try:
            pos, n = 0, len(frames)
            while pos < n and link_id in core.links:
                if fast is not None:  # what the engine may decide alone, in one pass
                    pos, stop, outs = fast.forward(link_id, frames, pos, max_payload)
                    for out_id, out_frames, count in outs:
                        out_link = node.links.get(out_id)
                        if out_link is not None and out_link.out is not None:
                            out_link.out.send_frames(out_frames, count)
                    if stop == STOP_END:
                        break
                end = pos + HEADER_SIZE + int.from_bytes(frames[pos + 16:pos + 20], "big")
                header, payload = bytes(frames[pos:pos + HEADER_SIZE]), bytes(
                    frames[pos + HEADER_SIZE:end])
                pos = end
                try:
                    actions = core.receive(link_id, header, payload, now)
                except MalformedFrame as exc:
                    node.execute(core.drop_link(link_id, exc, now))
                    break
                lk = core.links.get(link_id)
                if lk is not None and lk.state is LinkState.UP and not link.keyed:
                    if lk.role is not C.Role.ENDPOINT:
                        why = "router on the application datagram listener"
                        node.execute(core.close_link(link_id, now, why))
                        self._close(link, why)
                        break
                    link.keyed = True  # what the link sends from now on is sealed
                    auth = lk.auth
                    if auth is not None and auth.authenticated:
                        link.packer.seal_with(auth.cipher(ordered=False), now)
                if actions:
                    node.execute(actions)
        finally:
            reads.end()
        if link_id not in core.links and self.links.get(addr) is link:
            self._close(link, "closed by the core")

    def _new_link(self, addr: tuple[str, int], frames: memoryview) -> AppDatagramLink | None:
        """A link for a new address, if its datagram opens with a HELLO (else nothing is
        kept for it: garbage from anywhere costs no state)."""
        node = self.node
        if frames[20] != 0 or frames[8:12] != b"\0\0\0\0":
            node.core.counters["appdgram.no-hello"] += 1
            return None
        if len(self.links) >= MAX_LINKS:
            node.core.counters["appdgram.refused-full"] += 1
            return None
        link = AppDatagramLink(self, addr)
        link.link_id = node.register(link)
        link.out = LinkOutput(node, link.link_id, link.write, link.write_many)
        self.links[addr] = link
        actions = node.core.open_link(link.link_id, node.now(), transport="dgram",
                                      address=link.address)
        node.core.links[link.link_id].max_payload = min(node.config.max_payload, MAX_PAYLOAD)
        node.execute(actions)
        return link

    # links ------------------------------------------------------------------------------------
    def forget(self, link: AppDatagramLink) -> None:
        """*link* is closed (by the core's Close action or here): drop it and its output."""
        if self.links.get(link.addr) is link:
            del self.links[link.addr]
            if link.out is not None:
                link.out.close()
            self.node.unregister(link.link_id)

    def _close(self, link: AppDatagramLink, reason: str) -> None:
        node = self.node
        if link.link_id in node.core.links:
            node.execute(node.core.close_link(link.link_id, node.now(), reason))
        self.forget(link)

    def reap_idle(self, now: float) -> None:
        """Close the links silent for ``udp_idle_timeout``."""
        idle = self.node.config.udp_idle_timeout
        for link in list(self.links.values()):
            if now - link.last_rx > idle:
                log.info("application datagram link %d (%s) idle for %.0fs; closing",
                         link.link_id, link.address, idle)
                self._close(link, "application silent")

    def sendto(self, datagrams: list[bytes], addr: tuple[str, int]) -> int:
        """Send now, or drop (counted): never queue behind a full socket buffer. The bytes
        handed to the socket."""
        transport = self.transport
        if transport is None:
            return 0
        sent = 0
        for d in datagrams:
            if transport.get_write_buffer_size() > SEND_BACKLOG:
                self.node.core.counters["drop.link-congested"] += 1
                continue
            try:
                transport.sendto(d, addr)
            except OSError:
                self.node.core.counters["drop.udp-error"] += 1
            else:
                sent += len(d)
        return sent

    def status(self) -> dict[str, Any]:
        return {"address": "%s:%d" % self.address, "links": len(self.links)}
