"""Addresses as operators write them (``host:port``, ``[v6]:port``): one parser for routers,
configs, command lines and flowlib. Wire layer: imports nothing of flownet."""

from __future__ import annotations

__all__ = ["AddressError", "parse_address"]


#: characters of host names, IPv4 and IPv6 addresses (with a %scope); anything else (a comma,
#: an '@', a space) is a typo worth naming rather than a name to resolve
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:%")


class AddressError(ValueError):
    """A malformed address or configuration value; the message says which and why."""


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port), with a message that says what is wrong."""
    text = text.strip()
    host, sep, port_s = text.rpartition(":")
    if not sep or not host:
        raise AddressError(f"{what} {text!r} must look like HOST:PORT, e.g. 127.0.0.1:7001")
    host = host.strip("[]")
    if not host or not set(host) <= _HOST_CHARS:
        hint = " (one address per entry: use a list for several)" if "," in host else ""
        raise AddressError(f"{what} {text!r}: {host!r} is not a host name or IP address"
                           f"{hint}")
    try:
        port = int(port_s)
    except ValueError:
        raise AddressError(f"{what} {text!r}: port {port_s!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise AddressError(f"{what} {text!r}: port must be 0..65535")
    return host, port
