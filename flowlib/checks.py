"""Argument checks and the type aliases of flowlib's public calls.

Every value an application passes (flow, band, locality, TTL, payload, router address, name)
is checked here before anything is written, so a bad argument is a clear ``ValueError`` or
``TypeError`` at the call and never a malformed frame on the wire. Imports only the wire
layer of flowrouter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flowrouter.wire.address import parse_address
from flowrouter.wire.bands import (
    BAND_APP_MEMBERSHIP,
    BAND_FAULT,
    NUM_BANDS,
    ROUTER_BANDS_END,
    BandMask,
    is_router_only,
    mask_of,
)
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import MAX_TTL, Locality

Address = str | tuple[str, int]
BandsSpec = BandMask | Iterable[int] | int | str
LocalitySpec = tuple[Locality | int | str, int] | None

ROUTER_BANDS_MASK = (1 << ROUTER_BANDS_END) - 1


#: the router address schemes: TCP (the default, also written without a scheme) and
#: datagram links (UDP, :mod:`flowlib.dgram`)
SCHEMES = ("tcp", "udp")


def router_transport(addr: Address) -> tuple[str, str]:
    """``(scheme, "host:port")`` of a router address: ``udp://127.0.0.1:7011`` is a datagram
    link, ``tcp://...`` or no scheme a TCP one. ValueError for another scheme."""
    if isinstance(addr, tuple):
        return "tcp", address_text(addr)
    text = str(addr).strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        return "tcp", text
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unknown router address scheme {scheme!r} in {text!r}; use "
                         f"tcp:// (the default) or udp://")
    return scheme, rest


def parse_router_address(addr: Address) -> tuple[str, int]:
    """``(host, port)`` of a router address (with or without its ``tcp://``/``udp://``)."""
    if isinstance(addr, tuple):
        host, port = addr
        return str(host), int(port)
    return parse_address(router_transport(addr)[1], "router address")


def is_datagram(addr: Address) -> bool:
    """Whether *addr* names a datagram link (``udp://``)."""
    return router_transport(addr)[0] == "udp"


def address_text(addr: Address) -> str:
    if isinstance(addr, tuple):
        host, port = addr
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr).strip()


def check_flow(flow: FlowID | str) -> FlowID:
    if isinstance(flow, str):
        flow = FlowID.parse(flow)
    elif not isinstance(flow, FlowID):
        raise TypeError(f"flow must be a FlowID (or its text form), not {type(flow).__name__}")
    if flow.is_link_local:
        raise ValueError(f"flow {flow} uses the reserved LSID {flow.lsid}; it is not routable")
    return flow


def check_locality(locality: LocalitySpec) -> tuple[int, int]:
    """``None`` or ``(type, value)`` -> the two header bytes."""
    if locality is None:
        return 0, 0
    try:
        loc_type, value = locality
    except (TypeError, ValueError):
        raise ValueError(f"locality must be None or (type, value), e.g. "
                         f"(Locality.GEOGRAPHY, 2); got {locality!r}") from None
    try:
        kind = Locality.parse(loc_type)
    except ValueError:
        raise ValueError(f"unknown locality type {loc_type!r}; use one of "
                         + ", ".join(m.name.lower() for m in Locality)) from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError(f"locality value must be an integer 0..255, got {value!r}")
    if kind is Locality.NONE:
        return 0, 0
    return int(kind), value


def check_data_band(band: int) -> int:
    if isinstance(band, bool) or not isinstance(band, int):
        raise ValueError(f"band must be an integer {ROUTER_BANDS_END}..{NUM_BANDS - 1}, "
                         f"got {band!r}")
    if not ROUTER_BANDS_END <= band < NUM_BANDS:
        if 0 <= band < ROUTER_BANDS_END:
            raise ValueError(f"band {band} is reserved for routers; applications send on "
                             f"bands {ROUTER_BANDS_END}..{NUM_BANDS - 1}")
        raise ValueError(f"band must be {ROUTER_BANDS_END}..{NUM_BANDS - 1}, got {band}")
    if is_router_only(band):
        raise ValueError(f"band {band} carries routers' notices (faults, overflow, "
                         f"membership: {BAND_FAULT}..{BAND_APP_MEMBERSHIP}); routers drop "
                         f"what applications send there")
    return band


def check_ttl(ttl: int) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_TTL:
        raise ValueError(f"ttl must be an integer 1..{MAX_TTL}, got {ttl!r}")
    return ttl


def listen_mask(bands: BandsSpec) -> int:
    """Coerce a listener's band spec to the mask int, without the router bands.

    Bands below 16 are consumed by routers and never delivered, so they are dropped from the
    mask (which lets ``"all"`` mean "everything an application can see"); a spec with nothing
    left is an error, since such a listener could never receive anything.
    """
    try:
        bits = mask_of(bands)
    except TypeError:
        raise ValueError(f"bands must be a BandMask, band number, list of bands or text like "
                         f"'data' or '32-40,fault'; got {bands!r}") from None
    bits &= ~ROUTER_BANDS_MASK
    if not bits:
        raise ValueError(f"band spec {bands!r} names no band an application can receive "
                         f"(bands {ROUTER_BANDS_END}..{NUM_BANDS - 1})")
    return bits


def check_identity(name: str, credentials: bytes) -> None:
    """Refuse what the HELLO cannot carry intact (the control codec would truncate the name
    mid-character, and the router would drop the link as malformed)."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if len(name.encode("utf-8")) > 255:
        raise ValueError(f"name is {len(name.encode('utf-8'))} bytes in UTF-8; the HELLO "
                         "carries at most 255")
    if not isinstance(credentials, bytes) or len(credentials) > 0xFFFF:
        raise ValueError("credentials must be bytes, at most 65535 of them")


def check_payload(payload: Any) -> tuple[bytes | bytearray | memoryview, int]:
    if isinstance(payload, str):
        raise TypeError("payload must be bytes-like, not str (encode it first)")
    if isinstance(payload, memoryview):
        if not payload.contiguous:
            raise ValueError("payload memoryview must be contiguous")
        if payload.ndim != 1 or payload.itemsize != 1:
            payload = payload.cast("B")
        return payload, payload.nbytes
    if isinstance(payload, (bytes, bytearray)):
        return payload, len(payload)
    raise TypeError(f"payload must be bytes-like, not {type(payload).__name__}")
