"""The node interface: what a router node offers its links and outputs, and the read batch.

Links (:mod:`flowrouter.net.tcp`, :mod:`flowrouter.net.udp`), outputs
(:mod:`flowrouter.net.output`) and flow control (:mod:`flowrouter.net.backpressure`) see
the node only as :class:`Node`, a typed protocol of a few public methods and properties,
never as :class:`~flowrouter.net.node.RouterNode` itself; so they import nothing above this
module, and the node is free to change how it keeps its tables.

:class:`ReadBatch` is the bracket around one read of one input link, the same for every
read path (a TCP read in place, a copied-out TCP read, the handshake frames of a read, a
run of UDP datagrams from one address): it owns which input link is being read and the
read's number (what flow control reasons with), gathers the outputs the read gave frames to
(each writes its batch once, at the end: one system call per output link per read, as
nats-server's ``flushClients``), and when the read ends it flushes them (as one batch of
:class:`~flowrouter.net.writepool.GatheredWrites`: a large fan-out's on helper threads too)
and tells the node if the read changed the links.

:class:`Link`, :class:`Output` and :class:`FlowShell` are the views the node, the links and
flow control have of each other (typing protocols, so none imports another's module).

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire`, :mod:`flowrouter.net.config` and
:mod:`flowrouter.net.connlimits` (types only), and :mod:`flowrouter.net.writepool` (the read
batch's writes); nothing else of :mod:`flowrouter.net`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from flowrouter.net.writepool import GatheredWrites

if TYPE_CHECKING:
    from flowrouter.core.fastpath import FastPath
    from flowrouter.core.flowcontrol import FlowLimits, OutputFlow
    from flowrouter.core.measured import BusyRate
    from flowrouter.core.router import Action, Router
    from flowrouter.net.config import Emulation, NodeConfig, PeerConfig
    from flowrouter.net.connlimits import ConnectionGate


class Flushable(Protocol):
    """Something a read gathered writes in, written out when the read ends."""

    def flush(self) -> None: ...


class Output(Flushable, Protocol):
    """A link's sending side as the node and its links see it
    (:class:`flowrouter.net.output.LinkOutput`); what flow control keeps of it is flow
    control's (:class:`flowrouter.core.flowcontrol.OutputFlow`)."""

    @property
    def link_id(self) -> int: ...
    @property
    def emu(self) -> Emulation | None:
        """The link emulation it applies, if any."""
    @property
    def rate(self) -> BusyRate:
        """Its send rate while backlogged (measured locality)."""

    def send(self, header: bytes, payload: bytes | memoryview) -> None: ...
    def send_frames(self, frames: Any, count: int) -> None: ...
    def emulate(self, emu: Emulation | None) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class Link(Protocol):
    """One link of any transport, as the node and flow control see it."""

    @property
    def link_id(self) -> int: ...
    @property
    def out(self) -> Output | None: ...
    @property
    def reading(self) -> bool | None:
        """Whether the node reads it; None: it is never paused (a UDP link: one socket
        serves every UDP peer)."""
    @property
    def address(self) -> str: ...
    @property
    def bytes_in(self) -> int:
        """Bytes received on it (as read: records and handshake included)."""
    @property
    def bytes_out(self) -> int:
        """Bytes handed to its transport."""

    def send(self, header: bytes, payload: bytes | memoryview) -> None: ...
    def set_reading(self, on: bool) -> None: ...
    def close(self, reason: str) -> None: ...
    def abort(self, reason: str) -> None: ...


class FlowShell(Protocol):
    """Flow control as links and outputs see it (:class:`flowrouter.net.backpressure.
    Backpressure`, the shell around :class:`flowrouter.core.flowcontrol.FlowControl`): they
    report events, it carries out what flow control decides."""

    @property
    def limits(self) -> FlowLimits:
        """The limits it applies (queue bound, what drops count as, ...)."""
    def opened(self, link_id: int, link: Link) -> None: ...
    def forget(self, link_id: int) -> None: ...
    def output(self, link_id: int) -> OutputFlow:
        """Its record of an output; the output writes ``fed`` and ``fed_read`` there."""
    def queue_started(self, link_id: int, now: float) -> None: ...
    def queued(self, link_id: int, origin: int, size: int, now: float) -> None: ...
    def shed(self, link_id: int, count: int, size: int, queued: int, now: float) -> bool: ...
    def dropped(self, link_id: int, drops: Iterable[tuple[bytes, int, int]],
                now: float) -> None: ...
    def written(self, link_id: int, gone: dict[int, int], queued: int, now: float, *,
                moved: bool, backlog: bool) -> None: ...
    def pushed_back(self, link_id: int) -> None: ...
    def resumed(self, link_id: int) -> None: ...
    def waits_for_credit(self, origin: int) -> bool: ...


class Node(Protocol):
    """What a router node offers its links and outputs
    (:class:`flowrouter.net.node.RouterNode`)."""

    @property
    def config(self) -> NodeConfig: ...
    @property
    def core(self) -> Router: ...
    @property
    def fast(self) -> FastPath | None:
        """The forwarding fast path, or None: every frame goes through the core."""
    @property
    def links(self) -> Mapping[int, Link]:
        """Every registered link by id."""
    @property
    def reads(self) -> ReadBatch:
        """The read in progress (if any), as :meth:`begin_read` returned it."""
    @property
    def flow(self) -> FlowShell: ...
    @property
    def gate(self) -> ConnectionGate:
        """Connections per port and the descriptor budget."""
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def now(self) -> float: ...
    def register(self, link: Link) -> int:
        """A new link: its id."""
    def unregister(self, link_id: int) -> None:
        """The link is gone: forget it (flow control included)."""
    def execute(self, actions: list[Action]) -> None:
        """Carry out the core's actions."""
    def link_state_changed(self) -> None:
        """Links came up or went down: apply emulation and blocks, wake who waits."""
    def redial(self, peer: PeerConfig, why: str | None = None) -> None:
        """Dial a configured peer again, after its back-off; *why*: its link failed so (for
        the status query)."""
    def reached(self, peer: PeerConfig) -> None:
        """A configured peer's link is up: its next re-dial starts from the shortest wait."""
    def close_slow_consumer(self, link_id: int, reason: str) -> None:
        """Close the link of an output flow control evicts (*reason*: for the log and the
        fault notice)."""
    def begin_read(self, link_id: int) -> ReadBatch:
        """Frames of *link_id* are processed from now on; ``end()`` the batch returned."""


class ReadBatch:
    """The read in progress: the input link being read, the read's number, and the outputs
    it gave frames to. One per node, reused for every read (no object per read or frame).

    ``begin(link)`` starts a read (again while one is open: the next link's read joins the
    same batch, as the datagrams of one UDP wake-up do); ``end()`` writes every gathered
    output once, then what is written after them (:attr:`after`: the UDP socket's batch of
    datagrams), and tells the node when the core's generation moved (links up or down).
    """

    __slots__ = ("link", "number", "open", "dirty", "after", "generation", "node", "writes")

    def __init__(self, node: Node, threads: int = 0) -> None:
        self.node = node
        #: the input link whose frames are being processed (0: none, or locally generated)
        self.link = 0
        #: reads begun so far: an output notes the read an input last gave it frames in
        self.number = 0
        #: whether a read is in progress: outputs gather their writes until it ends
        self.open = False
        #: outputs that gathered writes in this read, each written once when it ends
        self.dirty: list[Flushable] = []
        #: written after the outputs (they may add to it while they flush)
        self.after: list[Flushable] = []
        #: the core's link generation the node last saw (RouterNode.link_state_changed)
        self.generation = 0
        #: batches of socket writes made together (on helper threads too when they are
        #: many): the outputs' at the read's end, and each forwarding pass's (net/tcp)
        self.writes = GatheredWrites(threads)

    def begin(self, link_id: int) -> ReadBatch:
        self.link = link_id
        self.number += 1
        self.open = True
        return self

    def end(self) -> None:
        """Write what the read gathered; tell the node if the read changed links."""
        self.link = 0
        dirty = self.dirty
        writes = self.writes
        writes.begin()  # the outputs' batches go together (a fan-out's on helper threads)
        try:
            if dirty:
                self.dirty = []
                for out in dirty:
                    out.flush()
            self.open = False
            after = self.after
            if after:
                self.after = []
                for out in after:
                    out.flush()
        finally:
            self.open = False
            writes.run()
        node = self.node
        if node.core.generation != self.generation:
            node.link_state_changed()
