"""What the parts of a simulated network need of the network they are part of.

Links (:mod:`.links`) and endpoints (:mod:`.endpoint`) are built by a
:class:`~flowrouter.testbed.sim.network.SimNetwork` and live inside it; they reach it only
through :class:`SimContext`, which the network satisfies, so they need not import the network
module (which imports them). Imports only the event queue (:mod:`.engine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from flowrouter.testbed.sim.engine import EventQueue


class FrameSink(Protocol):
    """A link end that frames arrive at: a router's glue or an endpoint."""

    def on_frame(self, lid: int, header: bytes, payload: bytes | memoryview) -> None: ...


class SimContext(Protocol):
    """The network as its links and endpoints see it.

    Its event queue and clock (they schedule their own events), its seed (a link draws its
    randomness from the seed and its own name), the link ends by name (where a link delivers)
    and the trace: ``trace`` is None on an untraced network, which the per-frame paths test
    before building a record for :meth:`record`.
    """

    @property
    def queue(self) -> EventQueue: ...

    @property
    def now(self) -> float: ...

    @property
    def seed(self) -> int: ...

    @property
    def trace(self) -> Sequence[object] | None: ...

    def record(self, t: float, event: str, link: str, node: str, band: int, size: int,
               detail: str) -> None: ...

    def link_end(self, name: str) -> FrameSink: ...
