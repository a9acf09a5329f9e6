"""Backbone regions: what an edge router knows of its region, and the messages edges send
each other across it.

A region is a set of routers; its edges are those of its routers with links or applications
outside it, and the rest (its core routers) are ordinary routers that never see an end flow:
edges carry end flows across the region inside aggregate flows
(:mod:`flowrouter.core.aggregates`) and tell each other about end flows' members with the
messages below. Each edge ``i`` is the core of one region LSID (``lsid_base + i``); a frame
of the edge's *inbox* flow (``creator | lsid_base + i | 0``) travels to it by LS routes
alone, as any non-member's frame travels toward a core, so edge-to-edge messages cost core
routers no table entry at all.

Messages (the payload of an inbox frame, on :data:`~flowrouter.wire.bands.BAND_REGION`; one
type byte, then big-endian fields; masks are 16 bytes):

========  ===================================================================
JOIN      flow, edge, request id, mask: the edge wants the flow (to its exit)
ACK       flow, request id, status, reason: the exit's answer
MASK      flow, edge, mask: the edge's mask changed
LEAVE     flow, edge: the edge wants the flow no more
BIND      flow, version, (edge, mask)*: the flow's edges, from its exit to them
DIGEST    edge, (flow, mask, bind version)*: the edge's refresh of its joins
DATA      edge, an end flow's whole frame: toward its exit, or to one member edge
EXITS     edge, (LSID, distance)*: the location services the edge reaches without
          crossing the region (its best LS route leaves it), so it may be their exit
========  ===================================================================

May import :mod:`flowrouter.wire` and :mod:`flowrouter.core.tables`.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import NamedTuple

from flowrouter.core.tables import Modifiers

JOIN, ACK, MASK, LEAVE, BIND, DIGEST, DATA, EXITS = range(1, 9)
#: link ids of an edge's two sides of its region (never a real link's: shells number links
#: from 1 and upward, far below these): the region as one neighbour, and the aggregates'
#: local member (where aggregate frames are unwrapped)
REGION_LINK = 0x7FFF_FF01
UNWRAP_LINK = 0x7FFF_FF02
#: the first LSID of a region's edges when the topology names none
DEFAULT_LSID_BASE = 0x7E00_0000

_KEY_MASK = struct.Struct("!16s16s")
_U16 = struct.Struct("!H")
_JOIN = struct.Struct("!16sHI16s")
_ACK = struct.Struct("!16sIB")
_MASK = struct.Struct("!16sH16s")
_LEAVE = struct.Struct("!16sH")
_BIND_HEAD = struct.Struct("!16sIH")
_BIND_ITEM = struct.Struct("!H16s")
_DIGEST_HEAD = struct.Struct("!HH")
_DIGEST_ITEM = struct.Struct("!16s16sI")
DIGEST_ITEM_SIZE = _DIGEST_ITEM.size
_EXITS_ITEM = struct.Struct("!IB")


def region_creator(name: str) -> int:
    """The creator ID of a region's own flows (inboxes, aggregates), from its name."""
    raw = hashlib.blake2b(b"flownet-region/" + name.encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big") | 1


@dataclass(frozen=True, slots=True)
class RegionParams:
    """What one edge router knows of its region (the topology fills it in)."""

    name: str
    #: every edge of the region, sorted (an edge's number is its index here)
    edges: tuple[str, ...]
    me: str
    lsid_base: int = DEFAULT_LSID_BASE
    group_size: int = 5
    max_extra: int = 1
    #: LSID -> the edge through which the region reaches that location service, fixed by
    #: the operator (an override: without one, the edges learn each LSID's exit from their
    #: LS routes, flowrouter.core.regionexits)
    exits: tuple[tuple[int, str], ...] = ()
    #: what crossing the region costs a frame's locality budget
    modifiers: Modifiers = Modifiers()
    #: every router of the region: the region's own flows (inboxes, aggregates) are taken
    #: only from links to these (empty: from any router link, never from applications)
    routers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.me not in self.edges:
            raise ValueError(f"router {self.me!r} is not an edge of region {self.name!r}")
        if list(self.edges) != sorted(set(self.edges)):
            raise ValueError("a region's edges are listed sorted, each once")

    @property
    def creator(self) -> int:
        return region_creator(self.name)

    @property
    def index(self) -> int:
        return self.edges.index(self.me)

    def inbox_lsid(self, edge: int) -> int:
        return self.lsid_base + edge

    def inbox_key(self, edge: int) -> bytes:
        return _key(self.creator, self.lsid_base + edge, 0)

    def aggregate_key(self, root: int, bits: int) -> bytes:
        return _key(self.creator, self.lsid_base + root, bits)

    def region_lsids(self) -> frozenset[int]:
        return frozenset(self.lsid_base + i for i in range(len(self.edges)))


def _key(creator: int, lsid: int, local: int) -> bytes:
    return creator.to_bytes(8, "big") + lsid.to_bytes(4, "big") + local.to_bytes(4, "big")


def _mask(m: int) -> bytes:
    return m.to_bytes(16, "big")


class Join(NamedTuple):
    flow: bytes
    edge: int
    req: int
    mask: int


class Ack(NamedTuple):
    flow: bytes
    req: int
    status: int
    reason: str


class Mask(NamedTuple):
    flow: bytes
    edge: int
    mask: int


class Leave(NamedTuple):
    flow: bytes
    edge: int


class Bind(NamedTuple):
    flow: bytes
    version: int
    members: tuple[tuple[int, int], ...]  #: (edge, mask)


class Digest(NamedTuple):
    edge: int
    items: tuple[tuple[bytes, int, int], ...]  #: (flow, mask, bind version)


class Data(NamedTuple):
    edge: int  #: the edge that sent it into the region
    frame: bytes  #: the end flow's 24-byte header and payload


class Exits(NamedTuple):
    edge: int
    items: tuple[tuple[int, int], ...]  #: (LSID, distance in hops)


RegionMessage = Join | Ack | Mask | Leave | Bind | Digest | Data | Exits


class BadRegionMessage(ValueError):
    """An inbox frame that does not parse."""


def encode(msg: RegionMessage) -> bytes:
    if isinstance(msg, Join):
        return bytes([JOIN]) + _JOIN.pack(msg.flow, msg.edge, msg.req, _mask(msg.mask))
    if isinstance(msg, Ack):
        return bytes([ACK]) + _ACK.pack(msg.flow, msg.req, msg.status) + msg.reason.encode()
    if isinstance(msg, Mask):
        return bytes([MASK]) + _MASK.pack(msg.flow, msg.edge, _mask(msg.mask))
    if isinstance(msg, Leave):
        return bytes([LEAVE]) + _LEAVE.pack(msg.flow, msg.edge)
    if isinstance(msg, Bind):
        return (bytes([BIND]) + _BIND_HEAD.pack(msg.flow, msg.version, len(msg.members))
                + b"".join(_BIND_ITEM.pack(e, _mask(m)) for e, m in msg.members))
    if isinstance(msg, Digest):
        return (bytes([DIGEST]) + _DIGEST_HEAD.pack(msg.edge, len(msg.items))
                + b"".join(_DIGEST_ITEM.pack(f, _mask(m), v) for f, m, v in msg.items))
    if isinstance(msg, Exits):
        return (bytes([EXITS]) + _DIGEST_HEAD.pack(msg.edge, len(msg.items))
                + b"".join(_EXITS_ITEM.pack(lsid, min(d, 255)) for lsid, d in msg.items))
    return bytes([DATA]) + _U16.pack(msg.edge) + msg.frame


def decode(body: bytes | memoryview) -> RegionMessage:
    raw = bytes(body)
    try:
        kind, rest = raw[0], raw[1:]
        if kind == JOIN:
            f, e, r, m = _JOIN.unpack(rest)
            return Join(f, e, r, int.from_bytes(m, "big"))
        if kind == ACK:
            f, r, s = _ACK.unpack_from(rest)
            return Ack(f, r, s, rest[_ACK.size:].decode())
        if kind == MASK:
            f, e, m = _MASK.unpack(rest)
            return Mask(f, e, int.from_bytes(m, "big"))
        if kind == LEAVE:
            return Leave(*_LEAVE.unpack(rest))
        if kind == BIND:
            f, v, n = _BIND_HEAD.unpack_from(rest)
            items = tuple((e, int.from_bytes(m, "big")) for e, m in
                          _BIND_ITEM.iter_unpack(rest[_BIND_HEAD.size:]))
            if len(items) != n:
                raise BadRegionMessage("BIND count does not match")
            return Bind(f, v, items)
        if kind == DIGEST:
            e, n = _DIGEST_HEAD.unpack_from(rest)
            ditems = tuple((f, int.from_bytes(m, "big"), v) for f, m, v in
                           _DIGEST_ITEM.iter_unpack(rest[_DIGEST_HEAD.size:]))
            if len(ditems) != n:
                raise BadRegionMessage("DIGEST count does not match")
            return Digest(e, ditems)
        if kind == DATA:
            if len(rest) < 2 + 24:
                raise BadRegionMessage("DATA shorter than a frame header")
            return Data(_U16.unpack_from(rest)[0], rest[2:])
        if kind == EXITS:
            e, n = _DIGEST_HEAD.unpack_from(rest)
            xitems = tuple(_EXITS_ITEM.iter_unpack(rest[_DIGEST_HEAD.size:]))
            if len(xitems) != n:
                raise BadRegionMessage("EXITS count does not match")
            return Exits(e, xitems)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise BadRegionMessage(str(exc)) from None
    raise BadRegionMessage(f"unknown region message type {raw[0] if raw else None}")
