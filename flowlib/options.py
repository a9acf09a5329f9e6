"""The flow client's options, once: :class:`ClientOptions` and the defaults it starts from.

:func:`flowlib.connect` and :class:`flowlib.FlowClient` take these as keyword arguments and
build one :class:`ClientOptions` from them, so the list of what a client can be told is
written (and checked) in one place. Imports only the wire layer of flowrouter and flowlib's
leaf modules (checks, credentials, fragment, members, notices).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.header import DEFAULT_MAX_PAYLOAD

from .checks import Address
from .errors import FlowError
from .events import FailoverEvent
from .fragment import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_REASSEMBLY_BYTES,
    DEFAULT_REASSEMBLY_TIMEOUT,
    FRAGMENT_HEADER_SIZE,
)
from .members import DEFAULT_MAX_MEMBERS
from .notices import DEFAULT_NOTICE_EVERY, DEFAULT_NOTICE_INTERVAL, NoticeLimiter

#: How long a JOIN may stay unanswered by default. A router gives up on an unanswered upstream
#: join after its ``join_timeout`` (5 s by default) but only notices when its incremental GC
#: visits the entry (about once per epoch), so its TIMEOUT answer can take two of those.
DEFAULT_REQUEST_TIMEOUT = 15.0
#: How long a client keeps trying its routers after losing one before it gives up.
DEFAULT_FAILOVER_TIMEOUT = 30.0
DEFAULT_RECONNECT_MIN = 0.05  #: back-off after the first round of failed attempts (seconds)
DEFAULT_RECONNECT_MAX = 2.0  #: longest back-off between rounds (seconds)

#: ``on_disconnect``: called with ConnectionLost, or None after close()
DisconnectHook = Callable[[FlowError | None], Any]
#: ``on_failover``: called with each completed failover
FailoverHook = Callable[[FailoverEvent], Any]
#: ``on_router_fault``: called with each fault the router reports about this client's link
RouterFaultHook = Callable[[C.Fault], Any]


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Everything a flow client is configured with (:func:`flowlib.connect` documents each).

    Invalid values raise ``ValueError`` when the options are made, before any connection.
    """

    name: str = "flowlib"
    state_dir: str | os.PathLike[str] | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_payload: int = DEFAULT_MAX_PAYLOAD
    credentials: bytes = b""
    on_disconnect: DisconnectHook | None = None
    addresses: Sequence[Address] = ()
    connect_timeout: float = 5.0
    failover: bool = False
    failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT
    failover_send_timeout: float | None = None
    reconnect_min: float = DEFAULT_RECONNECT_MIN
    reconnect_max: float = DEFAULT_RECONNECT_MAX
    on_failover: FailoverHook | None = None
    on_router_fault: RouterFaultHook | None = None
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_reassembly_bytes: int = DEFAULT_MAX_REASSEMBLY_BYTES
    reassembly_timeout: float = DEFAULT_REASSEMBLY_TIMEOUT
    fragment_size: int | None = None
    overflow_notice_every: int | None = DEFAULT_NOTICE_EVERY
    overflow_notice_interval: float = DEFAULT_NOTICE_INTERVAL
    link_key: tuple[str, str | bytes] | None = None
    encrypt: bool = False
    capabilities: Iterable[Any] = ()
    liveness_interval: float = C.DEFAULT_LIVENESS_INTERVAL
    dead_after: float = C.DEFAULT_DEAD_AFTER
    refresh_interval: float = C.DEFAULT_REFRESH_INTERVAL
    max_members: int = DEFAULT_MAX_MEMBERS

    def __post_init__(self) -> None:
        for what, value in (("failover_timeout", self.failover_timeout),
                            ("reconnect_min", self.reconnect_min),
                            ("reconnect_max", self.reconnect_max),
                            ("reassembly_timeout", self.reassembly_timeout),
                            ("connect timeout", self.connect_timeout)):
            if not value > 0:
                raise ValueError(f"{what} must be positive, got {value!r}")
        if self.failover_send_timeout is not None and self.failover_send_timeout < 0:
            raise ValueError("failover_send_timeout must be >= 0 or None")
        if self.fragment_size is not None and not self.fragment_size > FRAGMENT_HEADER_SIZE:
            raise ValueError(f"fragment_size must exceed the {FRAGMENT_HEADER_SIZE}-byte "
                             f"fragment header, got {self.fragment_size!r}")
        if self.max_message_size < 1 or self.max_reassembly_bytes < 1:
            raise ValueError("max_message_size and max_reassembly_bytes must be positive")
        if self.overflow_notice_every is not None:
            NoticeLimiter(self.overflow_notice_every, self.overflow_notice_interval)
        if isinstance(self.max_members, bool) or not isinstance(self.max_members, int) \
                or self.max_members < 1:
            raise ValueError(f"max_members must be a positive integer, got "
                             f"{self.max_members!r}")
        if self.encrypt and self.link_key is None:
            raise ValueError("encrypt=True needs a link_key (the keys come from it)")
        if not self.liveness_interval > 0 or not self.refresh_interval > 0:
            raise ValueError("liveness_interval and refresh_interval must be positive")
        if not self.dead_after > self.liveness_interval:
            raise ValueError("dead_after must be longer than liveness_interval")
        # materialised once: an iterator given as capabilities must survive being read
        object.__setattr__(self, "addresses", tuple(self.addresses))
        object.__setattr__(self, "capabilities", tuple(self.capabilities))

    @classmethod
    def build(cls, options: ClientOptions | None = None, **keywords: Any) -> ClientOptions:
        """*options* (or the defaults) with *keywords* replacing fields; an unknown keyword
        raises ``TypeError`` naming it."""
        known = OPTION_NAMES
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        if options is None:
            return cls(**keywords)
        values = {f: getattr(options, f) for f in known}
        values.update(keywords)
        return cls(**values)


OPTION_NAMES = frozenset(f.name for f in fields(ClientOptions))

__all__ = ["ClientOptions", "OPTION_NAMES", "DEFAULT_REQUEST_TIMEOUT",
           "DEFAULT_FAILOVER_TIMEOUT", "DEFAULT_RECONNECT_MIN", "DEFAULT_RECONNECT_MAX",
           "DisconnectHook", "FailoverHook", "RouterFaultHook"]
