"""Virtual links: two independent directions, each a FIFO wire with delay, bandwidth and loss.

Per direction, a frame of ``24 + payload`` bytes

1. is refused if the link is disconnected or that direction is cut (reason ``link-down`` /
   ``direction-down``), if the link is one-way and the frame is application traffic going
   the wrong way (``oneway``), or if more than ``queue_limit`` bytes already wait
   (``queue-full``);
2. waits behind the frames before it (one FIFO per direction), is serialised at the
   direction's bandwidth (0 = instantaneous) and then propagates for ``delay`` seconds;
   frames of the control and administration bands (below 32: joins, pings, heartbeats,
   repair requests) are served ahead of queued data, as a router's output queue serves them
   (:mod:`flowrouter.core.linkqueue`): they wait only for their own serialisation;
3. may be lost with probability ``loss``: on a ``udp`` link it is gone (``loss``); on a
   ``tcp`` link it is retransmitted after a retransmission time-out (200 ms or 4 x delay,
   doubling per further loss) and, as TCP delivers in order, holds back the frames behind it;
   after 8 losses in a row the frame is dropped (``loss``) as a real connection would have
   broken by then;
4. is lost in flight if the link (or that direction) goes down before it arrives
   (``in-flight``);
5. a control frame (router band or link-local) is lost with probability ``control_loss``
   whatever the transport (``control-loss``): emulated loss of the kind that made lost JOINs,
   MASKs and LEAVEs matter, for the soft-state tests (:meth:`SimNetwork.set_control_loss`).

Every refusal or loss is counted per direction under its reason; nothing is dropped silently.
Randomness comes from a ``random.Random`` per direction seeded from the network seed and the
link's name, so adding a link does not change the random choices of the others.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

from flowrouter.wire.bands import ADMIN_BANDS_END, ROUTER_BANDS_END
from flowrouter.wire.header import HEADER_SIZE

if TYPE_CHECKING:  # pragma: no cover
    from flowrouter.testbed.sim.context import SimContext

_LINK_LOCAL_LSID = b"\0\0\0\0"
_MAX_RETRANSMITS = 8
_MIN_RTO = 0.2


class Direction:
    """One direction of a link: the wire from ``src`` to ``dst``."""

    __slots__ = ("link", "src", "dst", "dst_lid", "bandwidth", "delay", "loss", "down",
                 "gen", "busy_until", "last_arrival", "frames", "bytes", "delivered",
                 "drops", "retransmits", "rng", "blocks_data", "tcp", "net", "q", "ok",
                 "special", "deliver", "_arrive_cb", "control_loss")

    def __init__(self, link: SimLink, src: str, dst: str, bandwidth: float, delay: float,
                 loss: float, rng: random.Random, blocks_data: bool, tcp: bool,
                 net: SimContext) -> None:
        self.link = link
        self.src = src
        self.dst = dst
        self.dst_lid: int | None = None  #: link id at the receiving node while connected
        self.bandwidth = bandwidth
        self.delay = delay
        self.loss = loss
        self.down = 0  #: active one-direction outages
        self.gen = 0  #: bumped whenever frames in flight must be lost
        self.busy_until = 0.0
        self.last_arrival = 0.0
        self.frames = 0  #: frames put on the wire
        self.bytes = 0
        self.delivered = 0
        self.drops: Counter[str] = Counter()
        self.retransmits = 0  #: tcp frames that arrived late after a simulated loss
        self.rng = rng
        self.blocks_data = blocks_data
        self.tcp = tcp
        self.net = net
        self.q = net.queue
        self.ok = False  #: connected and not cut: the fast path may skip every check
        self.control_loss = 0.0
        self.special = blocks_data or bool(link.queue_limit)
        self.deliver = net.link_end(dst).on_frame
        self._arrive_cb = self._arrive

    def refresh(self) -> None:
        self.ok = self.link.connected and not self.down

    def reset(self) -> None:
        """Forget everything queued or in flight (the connection or direction broke)."""
        self.gen += 1
        now = self.q.now
        self.busy_until = now
        self.last_arrival = now
        self.refresh()

    def backlog_bytes(self, now: float) -> float:
        if not self.bandwidth or self.busy_until <= now:
            return 0.0
        return (self.busy_until - now) * self.bandwidth / 8.0

    def _refusal(self, header: bytes, size: int, now: float) -> str | None:
        link = self.link
        if not link.connected:
            return "link-down"
        if self.down:
            return "direction-down"
        if (self.blocks_data and header[20] >= ROUTER_BANDS_END
                and header[8:12] != _LINK_LOCAL_LSID):
            return "oneway"
        if link.queue_limit and self.backlog_bytes(now) + size > link.queue_limit:
            return "queue-full"
        if (self.control_loss and (header[20] < ROUTER_BANDS_END
                                   or header[8:12] == _LINK_LOCAL_LSID)
                and self.rng.random() < self.control_loss):
            return "control-loss"
        return None

    def set_control_loss(self, p: float) -> None:
        self.control_loss = p
        self.special = self.blocks_data or bool(self.link.queue_limit) or bool(p)

    def _drop(self, now: float, header: bytes, size: int, reason: str) -> None:
        self.drops[reason] += 1
        net = self.net
        if net.trace is not None:
            net.record(now, "drop", self.link.name, self.src, header[20], size, reason)

    def transmit(self, header: bytes, payload: bytes | memoryview) -> None:
        """Put one frame on the wire now (or count why it cannot go)."""
        q = self.q
        now = q.now
        size = HEADER_SIZE + len(payload)
        if not self.ok or self.special:
            reason = self._refusal(header, size, now)
            if reason is not None:
                self._drop(now, header, size, reason)
                return
        busy = self.busy_until
        bw = self.bandwidth
        urgent = bw and busy > now and header[20] < ADMIN_BANDS_END
        if urgent:
            # a router's output queue serves control and administration bands (< 32) before
            # queued data (core.linkqueue): such a frame waits only for its own serialisation
            # and pushes later data back by as much (frames already scheduled keep their
            # times: a small frame's overlap with the one on the wire is not modelled)
            finish = now + size * 8.0 / bw
            self.busy_until = busy + size * 8.0 / bw
        else:
            start = now if busy < now else busy
            finish = start + size * 8.0 / bw if bw else start
            self.busy_until = finish
        arrive = finish + self.delay
        self.frames += 1
        self.bytes += size
        if self.loss and self.rng.random() < self.loss:
            if not self.tcp:
                self._drop(now, header, size, "loss")
                return
            rto = max(_MIN_RTO, 4.0 * self.delay)
            tries = 1
            arrive += rto
            while self.rng.random() < self.loss:
                tries += 1
                if tries > _MAX_RETRANSMITS:
                    self._drop(now, header, size, "loss")
                    return
                rto *= 2
                arrive += rto
            self.retransmits += 1
        if self.tcp and not urgent:  # (an urgent frame left the queue ahead of the data)
            if arrive < self.last_arrival:
                arrive = self.last_arrival
            self.last_arrival = arrive
        if self.net.trace is not None:
            self.net.record(now, "send", self.link.name, self.src, header[20], size,
                            f"{arrive:.9f}")
        q.push(arrive, self._arrive_cb, (self.gen, header, payload))

    def _arrive(self, gen: int, header: bytes, payload: bytes | memoryview) -> None:
        if gen != self.gen or self.dst_lid is None:
            self._drop(self.q.now, header, HEADER_SIZE + len(payload), "in-flight")
            return
        self.delivered += 1
        self.deliver(self.dst_lid, header, payload)

    def stats(self) -> dict[str, Any]:
        return {"from": self.src, "to": self.dst, "frames": self.frames, "bytes": self.bytes,
                "delivered": self.delivered, "drops": dict(sorted(self.drops.items())),
                "retransmits": self.retransmits,
                "bandwidth": self.bandwidth, "delay": self.delay, "loss": self.loss,
                "up": self.down == 0}


class SimLink:
    """A bidirectional link between two nodes (router-router or endpoint-router)."""

    __slots__ = ("name", "a", "b", "transport", "modifiers", "oneway", "queue_limit", "kind",
                 "ab", "ba", "down", "connected", "lid_a", "lid_b", "base", "connects")

    def __init__(self, net: SimContext, name: str, a: str, b: str, *, transport: str,
                 bandwidth: float, delay: float, loss: float, modifiers: Any, oneway: bool,
                 queue_limit: int, kind: str) -> None:
        if transport not in ("tcp", "udp"):
            raise ValueError(f"link {name}: transport must be tcp or udp, got {transport!r}")
        if bandwidth < 0 or delay < 0 or not 0.0 <= loss <= 1.0:
            raise ValueError(f"link {name}: needs bandwidth >= 0, delay >= 0, 0 <= loss <= 1")
        self.name = name
        self.a = a
        self.b = b
        self.transport = transport
        self.modifiers = modifiers
        self.oneway = oneway
        self.queue_limit = queue_limit
        self.kind = kind  #: "router" or "endpoint"
        tcp = transport == "tcp"
        seed = net.seed
        self.ab = Direction(self, a, b, bandwidth, delay, loss,
                            random.Random(f"{seed}/{name}/{a}>{b}"), False, tcp, net)
        self.ba = Direction(self, b, a, bandwidth, delay, loss,
                            random.Random(f"{seed}/{name}/{b}>{a}"), oneway, tcp, net)
        self.base = (bandwidth, delay, loss)
        self.down = 0  #: active symmetric outages
        self.connected = False
        self.lid_a: int | None = None
        self.lid_b: int | None = None
        self.connects = 0  #: how many times the transport came up

    def direction_from(self, node: str) -> Direction:
        if node == self.a:
            return self.ab
        if node == self.b:
            return self.ba
        raise ValueError(f"{node!r} is not an end of link {self.name!r} ({self.a} - {self.b})")

    @property
    def up(self) -> bool:
        return self.connected

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "a": self.a, "b": self.b, "kind": self.kind,
                "transport": self.transport, "connected": self.connected,
                "connects": self.connects, "oneway": self.oneway,
                "directions": [self.ab.stats(), self.ba.stats()]}
