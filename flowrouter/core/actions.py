"""The actions the router core returns for its shell to carry out: Send, Close, Secure.

Holds only these small immutable records. May import :mod:`flowrouter.wire` (nothing of the
core, so every part of the core and every shell can use them).
"""

from __future__ import annotations

from typing import NamedTuple

from flowrouter.wire.linkauth import LinkCipher


class Send(NamedTuple):
    """Write one frame on *link*: ``header`` is a fresh 24 bytes, ``payload`` may be a view
    into the received buffer (never copied)."""

    link: int
    header: bytes
    payload: bytes | memoryview


class Close(NamedTuple):
    """Close *link*'s transport (the router has already forgotten the link)."""

    link: int
    reason: str


class Secure(NamedTuple):
    """From now on, seal what goes out on *link* and open what comes in with *cipher*:
    everything after the peer's AUTH frame, and everything the actions after this one
    send. Only emitted for stream (TCP) links that negotiated encryption."""

    link: int
    cipher: LinkCipher


Action = Send | Close | Secure
