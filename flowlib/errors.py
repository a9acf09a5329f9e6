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

from flowrouter.control import JoinStatus


class FlowError(Exception):
    """Base class of every flowlib error."""


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
    """The payload does not fit in one frame on this router link.

    Raised before anything is written, so nothing reaches the network. Large messages will be
    fragmented by the library in a later version; until then the application must split them.
    """

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"message of {size} bytes exceeds the router's maximum payload of "
                         f"{limit} bytes")


class ConnectionLost(FlowError, ConnectionError):
    """The link to the router is gone (or the client was closed); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"connection to the flow router lost: {reason}")


class Empty(FlowError):
    """``get_nowait()`` found no message in the listener's queue."""


class ListenerClosed(FlowError):
    """The listener was removed (``unlisten``) or its client closed, and its queue is drained."""


__all__ = ["FlowError", "ConnectError", "JoinRefused", "FlowTimeout", "MessageTooLarge",
           "ConnectionLost", "Empty", "ListenerClosed"]
