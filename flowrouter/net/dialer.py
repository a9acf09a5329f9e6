"""Dialling configured peers: the asyncio half of re-dialling, beside its sans-I/O schedule.

A router keeps dialling each ``[[peer]]`` whose link is not up. *When* to dial again and
what to log is :class:`~flowrouter.net.redial.DialSchedule`'s (virtual-time tested); this
module does the dialling itself: it waits out the back-off (cut short when an operator
brings the peer back), opens the TCP connection under ``dial_timeout`` or hands a UDP
peer to the datagram socket, and keeps what a status query shows of each peer (the last
error, and whether it is administratively down).

It sees the router only as the node interface (:class:`flowrouter.net.nodeapi.Node`) plus
the two callables it is given (spawning a task the node cancels at stop, and the node's
UDP socket, which exists only once the node has started), so the node stays the one place
that owns tasks and sockets.

May import the transports (:mod:`flowrouter.net.tcp`, :mod:`flowrouter.net.udp`) and
everything below them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from flowrouter.net.config import NodeConfig, PeerConfig, parse_address
from flowrouter.net.nodeapi import Node
from flowrouter.net.redial import DialSchedule
from flowrouter.net.tcp import TcpLink
from flowrouter.net.udp import UdpLinks

log = logging.getLogger("flowrouter.net.runtime")

Spawn = Callable[[Coroutine[Any, Any, None]], object]


class Dialer:
    """Dials configured peers and re-dials them after failures, with the schedule's back-off.

    *spawn* starts a task the node owns (and cancels when it stops); *udp* returns the
    node's UDP socket, or None when it has none.
    """

    def __init__(self, node: Node, spawn: Spawn, udp: Callable[[], UdpLinks | None]) -> None:
        self.node = node
        self.spawn = spawn
        self.udp = udp
        #: when to dial each configured peer again, and what to log about it
        self.schedule = DialSchedule(node.config.reconnect_min, node.config.reconnect_max)
        #: configured peer address -> (Unix time, why its link is not up): for /status
        self.errors: dict[str, tuple[float, str]] = {}
        #: peer names administratively down: not dialled until they are up again
        self.blocked: set[str] = set()
        #: per peer address: set to end the wait of its next dial at once
        self.wakes: dict[str, asyncio.Event] = {}
        self.stopping = False

    def start(self, peer: PeerConfig, delay: float = 0.0) -> None:
        """Dial *peer* after *delay* seconds."""
        self.spawn(self._dial(peer, delay))

    def dial(self, peer: PeerConfig) -> None:
        """Start dialling *peer* afresh (a peer a reload added)."""
        self.schedule.reset(peer.address)
        self.start(peer)

    @property
    def config(self) -> NodeConfig:
        """The node's configuration as it is now (a reload replaces it)."""
        return self.node.config

    def redial(self, peer: PeerConfig, why: str | None = None) -> None:
        """The dial of *peer* failed or its link went down: dial again after the back-off,
        logging only changes of state."""
        reason = why or "link closed"
        if why is not None:
            self.errors[peer.address] = (time.time(), why)
        if self.stopping:
            return
        step = self.schedule.failed(peer.address, self.node.now(), reason)
        who = f"{peer.name or 'peer'} ({peer.address})"
        if step.note:
            log.info("router %s: %s %s; dialling again in %.1fs, then backing off up to "
                     "%.1fs", self.config.name, who, step.note, step.wait,
                     self.config.reconnect_max)
        else:
            log.debug("router %s: %s still down (%s); dialling again in %.1fs",
                      self.config.name, who, reason, step.wait)
        self.start(peer, step.wait)

    def reached(self, peer: PeerConfig) -> None:
        """The link to *peer* is up (its handshake done): the back-off may start over once
        it stays up."""
        note = self.schedule.up(peer.address, self.node.now())
        if note:
            log.info("router %s: %s (%s) %s", self.config.name, peer.name or "peer",
                     peer.address, note)

    def forget(self, address: str) -> None:
        """Stop keeping state for a peer a reload removed."""
        self.schedule.forget(address)
        self.errors.pop(address, None)

    def unblock(self, name: str) -> None:
        """Router *name* is administratively up again: its dials go now, not after the
        back-off they were waiting out."""
        self.blocked.discard(name)
        for p in self.config.peers:
            if p.name == name:
                self.schedule.reset(p.address)
                wake = self.wakes.get(p.address)
                if wake is not None:
                    wake.set()

    async def _dial(self, peer: PeerConfig, delay: float) -> None:
        if delay:  # the back-off, cut short when the peer is brought back (unblock)
            wake = self.wakes.setdefault(peer.address, asyncio.Event())
            try:
                await asyncio.wait_for(wake.wait(), delay)
            except TimeoutError:
                pass
            wake.clear()
        if self.stopping or peer not in self.config.peers:
            return  # stopping, or the peer left the configuration (a reload)
        if peer.name in self.blocked:
            self.redial(peer, "administratively down")  # goes through once it is up again
            return
        host, port = parse_address(peer.address, "peer address")
        if peer.transport == "udp":
            udp = self.udp()
            if udp is None:
                log.error("peer %s uses UDP but this router has no [router] udp address",
                          peer.address)
                return
            self.schedule.attempt(peer.address, self.node.now())
            udp.dial((host, port), peer)
            return
        self.schedule.attempt(peer.address, self.node.now())
        timeout = self.config.dial_timeout
        node = self.node
        try:
            # A time-out of its own: a connect into a blackout would otherwise wait on the
            # kernel's SYN repeats (minutes), long after the network healed.
            await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(lambda: TcpLink(node, peer),
                                                             host, port), timeout)
        except TimeoutError:
            self.redial(peer, f"no answer within {timeout:g}s (dial_timeout)")
        except OSError as exc:
            self.redial(peer, f"cannot connect: {exc.strerror or exc}")
