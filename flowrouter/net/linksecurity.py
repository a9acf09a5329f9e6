"""Sealed links in the router daemon: how often they move to new keys, how that is counted,
and what the status query shows of link security.

The handshake and the record layer are :mod:`flowrouter.wire.linkauth` and
:mod:`flowrouter.wire.linkrecords`; the core hands the runtime a link's cipher
(``Secure`` action) and the runtime wraps it here. Rekeying happens after
``[link_auth] rekey_records`` records a direction sent (the cipher's budget, set by the core's
handshake) and after ``rekey_seconds`` of the daemon's clock (the stream's), whichever comes
first; every key update is counted (``auth.rekeys.sent`` / ``auth.rekeys.received``). May
import :mod:`flowrouter.wire` and :mod:`flowrouter.net.config` (a type only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from flowrouter.wire.linkauth import LinkCipher, SecureStream

if TYPE_CHECKING:
    from flowrouter.net.config import NodeConfig

__all__ = ["link_auth_status", "sealed_stream"]


def sealed_stream(cipher: LinkCipher, clock: Callable[[], float], config: NodeConfig,
                  counters: MutableMapping[str, int]) -> SecureStream:
    """The byte stream of a TCP link sealed with *cipher*: new keys by time as configured,
    every update (by time or by record count, either direction) counted in *counters*."""

    def count(direction: str) -> None:
        counters[f"auth.rekeys.{direction}"] = counters.get(f"auth.rekeys.{direction}", 0) + 1

    cipher.on_rekey = count
    return SecureStream(cipher, clock=clock, rekey_interval=config.link_rekey_seconds)


def link_auth_status(config: NodeConfig, links: Mapping[int, Any]) -> dict[str, Any] | None:
    """Link security for the status query: the keys' ids (never the keys), whether links are
    sealed, the rekey policy, and each sealed link's key generations; None without keys."""
    if not config.link_keys:
        return None
    sealed = {}
    for link_id, link in links.items():
        secure = getattr(link, "secure", None)
        if secure is not None:
            c = secure.cipher
            sealed[str(link_id)] = {"records_sent": c.sent, "tx_generation": c.tx_generation,
                                    "rx_generation": c.rx_generation}
    return {"key_id": config.link_key_id or next(iter(config.link_keys)),
            "key_ids": sorted(config.link_keys), "encrypt": config.link_encrypt,
            "require_endpoints": config.link_auth_endpoints,
            "rekey_records": config.link_rekey_records,
            "rekey_seconds": config.link_rekey_seconds, "sealed_links": sealed}
