"""Every exception flowlib raises, under one base class.

Applications catch :class:`FlowError` to handle "anything the flow network said no to". The
classes also inherit the matching built-in where one exists (``ConnectionError``,
``TimeoutError``, ``ValueError``) so that generic code that already catches those keeps working
without knowing about flowlib.

Each exception is built from a single message string (the built-in ``OSError`` family would
otherwise read a second argument as an errno), and keeps its structured details as attributes.
"""

from __future__ import annotations

from collections.abc import Iterable

from flowrouter.wire.control import JoinStatus


class FlowError(Exception):
    """Base class of every flowlib error."""

    #: a command ended by one exits 1 with its message on one line, never a traceback
    #: (flowrouter.console reads ``exit_code`` from any exception that has one)
    exit_code = 1


class ConnectError(FlowError, ConnectionError):
    """No router in the list accepted us; ``attempts`` says what each address answered."""

    def __init__(self, attempts: Iterable[tuple[str, str]]) -> None:
        self.attempts: list[tuple[str, str]] = list(attempts)
        if self.attempts:
            detail = "; ".join(f"{addr}: {why}" for addr, why in self.attempts)
        else:
            detail = "no router address was given"
        super().__init__(f"could not connect to a flow router ({detail})")


class JoinRefused(FlowError):
    """The router answered a JOIN with a non-OK status; ``reason`` is the router's own text."""

    def __init__(self, status: JoinStatus, reason: str, flow: object = None) -> None:
        self.status = status
        self.reason = reason
        self.flow = flow
        where = f" for flow {flow}" if flow is not None else ""
        super().__init__(f"join{where} refused: {status.name}"
                         + (f" ({reason})" if reason else ""))


class FlowTimeout(FlowError, TimeoutError):
    """A request to the router (e.g. a JOIN) got no answer in time."""


class MessageTooLarge(FlowError, ValueError):
    """The message is larger than the sender may send; ``size`` and ``limit`` say by how much.

    Raised before anything is written, so nothing reaches the network. Messages larger than
    the router's maximum payload are fragmented by the library (:mod:`flowlib.fragment`), so
    this means either the message exceeds the client's ``max_message_size`` (``what`` is
    ``"max_message_size"``), or the send asked for no fragmentation (``fragment=False``) and
    the payload exceeds the router's maximum payload (``what`` is ``"max_payload"``).
    """

    def __init__(self, size: int, limit: int, what: str = "max_payload") -> None:
        self.size = size
        self.limit = limit
        self.what = what
        if what == "max_payload":
            text = f"the router's maximum payload of {limit} bytes"
        elif what == "max_message_size":
            text = f"the maximum message size of {limit} bytes (max_message_size)"
        else:
            text = f"{what} of {limit} bytes"
        super().__init__(f"message of {size} bytes exceeds {text}")


class ConnectionLost(FlowError, ConnectionError):
    """The link to the router is gone for good (or the client was closed); ``reason`` says why.

    With failover enabled this is raised only once every router in the client's list has
    failed for ``failover_timeout`` seconds; a single lost router is survived silently (apart
    from a FAILOVER notice on the fault band).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"connection to the flow router lost: {reason}")


class FailoverInProgress(FlowError, ConnectionError):
    """The client lost its router and is connecting to another one (failover).

    Raised by ``send_nowait`` (which never waits) and by ``send`` once its wait bound
    (``failover_send_timeout``) has passed. The client is still usable: listeners keep their
    messages and waiting readers, and sending works again as soon as a router answers.
    ``router`` names the router that was lost, ``since`` is how long ago (seconds).
    """

    def __init__(self, router: str, since: float, hint: str = "") -> None:
        self.router = router
        self.since = since
        super().__init__(f"not connected: failing over after losing router {router} "
                         f"{since * 1000:.0f} ms ago" + (f"; {hint}" if hint else ""))


class Empty(FlowError):
    """``get_nowait()`` found no message in the listener's queue."""


class ListenerClosed(FlowError):
    """The listener was removed (``unlisten``) or its client closed, and its queue is drained."""


__all__ = ["FlowError", "ConnectError", "JoinRefused", "FlowTimeout", "MessageTooLarge",
           "ConnectionLost", "FailoverInProgress", "Empty", "ListenerClosed"]
