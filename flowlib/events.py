"""What the client protocol (:mod:`flowlib.protocol`) tells its shell: small frozen events.

The shell (:class:`flowlib.FlowClient`) takes them with ``ClientProtocol.next_event()`` and
acts on them: hands messages to listeners, answers awaiting joins, fails over when the link is
lost. Received messages may instead go to a :data:`MessageSink` the protocol was given, one
list per read (the common event, without an event object each). Imports the wire layer of
flowrouter and :mod:`flowlib.message`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flowrouter.wire import control as C

from .message import Message


@dataclass(frozen=True, slots=True)
class HandshakeDone:
    """The router accepted us: its HELLO (name, max payload, suggested LSID)."""

    hello: C.Hello


@dataclass(frozen=True, slots=True)
class LinkFailed:
    """We give up on this link (refusal, protocol error, a router silent too long): the shell
    closes the transport; *reason* says why."""

    reason: str


@dataclass(frozen=True, slots=True)
class JoinAnswered:
    """The router answered JOIN *req_id* on flow *key*."""

    req_id: int
    key: bytes
    ack: C.JoinAck


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """A message (a whole frame's payload, or a reassembled one) for the listeners of flow
    *key* whose mask has *band*."""

    key: bytes
    band: int
    message: Message


@dataclass(frozen=True, slots=True)
class MessageDropped:
    """A fragmented message on flow *key* was dropped (bounds, timeout); the shell may tell
    the flow's listeners with a rate-limited notice."""

    key: bytes
    band: int
    reason: str
    detail: str
    origin: int
    msg_id: int
    total: int
    fragments: str | None = None


@dataclass(frozen=True, slots=True)
class RouterFault:
    """The router itself reported a fault about this link on the fault band of the link-local
    flow (e.g. ``LIMIT`` / ``work-budget``: it held back or dropped some of our requests).
    Only the router we are linked to can send link-local frames; the shell tells the
    application (``FlowClient.on_router_fault``, every fault-band listener)."""

    fault: C.Fault


@dataclass(frozen=True, slots=True)
class RejoinNeeded:
    """The router holds no state for flow *key* (NOT_ON_TREE / PRUNE): join it again."""

    key: bytes


@dataclass(frozen=True, slots=True)
class EchoAnswered:
    """The router answered the flush ECHO *seq* (``ClientProtocol.flush_echo``): it had read
    everything written on the link before that ECHO."""

    seq: int


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """One completed failover, as given to ``on_failover`` and kept in ``last_failover``."""

    old_router: str
    old_address: str
    new_router: str
    new_address: str
    reason: str  #: why the old link ended
    reconnect_ms: float  #: from noticing the loss to the new router's HELLO
    attempts: tuple[tuple[str, str], ...]  #: failed attempts before success: (address, why)


#: one received message as a sink gets it: (flow key, band, message)
Received = tuple[bytes, int, Message]
#: takes the messages of one read, in order (see ``ClientProtocol(sink=...)``)
MessageSink = Callable[[list[Received]], None]

Event = HandshakeDone | LinkFailed | JoinAnswered | MessageReceived | MessageDropped | \
    RejoinNeeded | RouterFault | EchoAnswered
