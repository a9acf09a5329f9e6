"""Control-message payloads: versioned, validated, one codec for every control frame.

Every control payload starts with ``version (1 byte) | type (1 byte)``. Link-local messages
(HELLO, ERROR, LS_ROUTES, AUTH, POLICY, and the soft-state messages ECHO, ECHO_REPLY,
REFRESH, PRUNE, NOT_ON_TREE, see below) travel on the reserved link-local flow; per-flow
messages (JOIN,
JOIN_ACK, LEAVE, MASK, PING, PONG) travel on the flow they concern, on the membership band (or
the GC band for PING/PONG), and are consumed and regenerated hop by hop. FAULT travels to
applications on :data:`~flowrouter.wire.bands.BAND_FAULT`.

Soft state uses five link-local messages, all aggregated per
neighbour rather than per flow:

* ``ECHO(seq, stamp)`` / ``ECHO_REPLY(seq, stamp)``: link liveness; the reply returns the
  sender's stamp (its own clock, microseconds) so the sender measures the round trip without
  keeping state;
* ``REFRESH(round, index, count, hold_ms, entries)``: one chunk of a downstream node's digest of
  the (flow, band mask) pairs it wants from this neighbour. ``count`` chunks make a round;
  ``hold_ms`` is how long the receiver may keep state the digest lists without hearing it
  again (PIM's hold time). Each entry is ``flow key (16) | mask (16) | flags (1)``. A chunk
  with ``count`` 0 (``REFRESH_UPDATE``, index 0) belongs to no round: a location-service
  member's batch of sibling-mask changes after its members' tree changed;
* ``PRUNE(keys)``: the sender dropped these flows' state for the receiver (expiry, limits);
* ``NOT_ON_TREE(keys)``: the sender holds no state for these flows although the receiver
  refreshed them or sent their traffic from the tree's side; the receiver re-joins (if it
  is downstream) or forgets the branch (if it is upstream).

A decoder that meets anything unexpected raises :class:`~flowrouter.wire.header.MalformedFrame`; the
router then drops the offending link (never itself). One exception, for forward
compatibility: a message of a type this code does not know (a newer peer's) raises
:class:`UnknownControlType`, which receivers count (``control.unknown-type``) and ignore
instead of dropping the link.

Features (what a peer speaks beyond the base protocol)
------------------------------------------------------
The soft-state messages came after the first release without a new control version, and a
node from before them drops a link on the first message of a type it does not know. Such a
node cannot be told anything new in a HELLO either: its decoder refuses any byte it does
not expect (a longer HELLO, another version). The one place it ignores is the HELLO frame's
header: link-local frames are never forwarded, so their locality fields mean nothing, and
every node has always sent its HELLO with locality type NONE and value 0. A HELLO frame's
locality value byte therefore carries the sender's **feature bits** (:func:`hello_header`,
:func:`hello_features`): 0 from a node that predates them, :data:`FEATURES` from this code.
A node sends a peer only the messages of the features that peer announced:
:data:`FEATURE_SOFT_STATE` covers ECHO, ECHO_REPLY, REFRESH, PRUNE and NOT_ON_TREE, so a peer
that does not announce it gets none of them (its liveness falls back to the hold time) and
the link stays up. :data:`FEATURE_DGRAM_BUNDLE` says a node takes UDP datagrams that carry
several whole frames back to back (``flowrouter.net.udp``); to a peer that does not announce
it a node sends one frame per datagram (a router takes bundles from anyone: a bundle may
overtake the HELLO that announces it).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

from flowrouter.wire.bands import BAND_MEMBERSHIP
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import (
    OFF_LOC_TYPE,
    OFF_LOC_VALUE,
    Locality,
    MalformedFrame,
    pack_header,
)

CONTROL_VERSION = 1
PROTOCOL_MAGIC = b"FLOW"

#: feature bit: the soft-state messages (ECHO, ECHO_REPLY, REFRESH, PRUNE, NOT_ON_TREE)
FEATURE_SOFT_STATE = 0x01
#: feature bit: on a UDP link, takes datagrams of several whole frames back to back (not
#: only one frame per datagram); a node sends such bundles only to a peer announcing it
FEATURE_DGRAM_BUNDLE = 0x02
#: the features this code speaks (what its HELLO frames announce)
FEATURES = FEATURE_SOFT_STATE | FEATURE_DGRAM_BUNDLE


def hello_header(size: int, features: int = FEATURES) -> bytes:
    """The header of a HELLO frame of *size* payload bytes announcing *features* (in the
    locality value byte, with locality type NONE: see the module docs)."""
    if not 0 <= features <= 0xFF:
        raise ValueError(f"feature bits must fit a byte, got {features!r}")
    return pack_header(LINK_LOCAL_FLOW.key, size, BAND_MEMBERSHIP, Locality.NONE, features)


def hello_features(header: bytes | memoryview) -> int:
    """The feature bits a HELLO frame's header announces (0: a node from before them)."""
    return header[OFF_LOC_VALUE] if header[OFF_LOC_TYPE] == Locality.NONE else 0


class UnknownControlType(MalformedFrame):
    """A control message of a type this code does not know: a newer peer's. Receivers count
    it and ignore it (the link stays up); see the module docs."""

    def __init__(self, mtype: int) -> None:
        super().__init__("unknown-type", f"unknown control type {mtype}")
        self.mtype = mtype


class Role(enum.IntEnum):
    ROUTER = 1
    ENDPOINT = 2


class MsgType(enum.IntEnum):
    HELLO = 1
    ERROR = 2
    LS_ROUTES = 3
    AUTH = 4
    POLICY = 5
    JOIN = 10
    JOIN_ACK = 11
    LEAVE = 12
    MASK = 13
    PING = 14
    PONG = 15
    ECHO = 16
    ECHO_REPLY = 17
    REFRESH = 18
    PRUNE = 19
    FAULT = 20
    NOT_ON_TREE = 21
    LS_TOPOLOGY = 22


class JoinStatus(enum.IntEnum):
    OK = 0
    REFUSED = 1
    NO_ROUTE = 2
    TIMEOUT = 3
    LIMIT = 4


class FaultKind(enum.IntEnum):
    LINK_DOWN = 1
    LIMIT = 2
    OVERFLOW = 3
    FAILOVER = 4


JOIN_FLAG_ADVERTISE = 0x01  #: sender-only: install the path toward the core, receive nothing

_PREFIX = struct.Struct("!BB")
# The fixed-size part of each message after the prefix. They live here, not on the message
# classes, because two places own each layout: the class's encode() and decode() below.
_HELLO = struct.Struct("!4sQBIIBBB")  # magic, node id, role, max payload, LSID, modifiers
_LS_ROUTE = struct.Struct("!IB")  # one LS_ROUTES entry: lsid, distance
_JOIN = struct.Struct("!I16sB")  # request id, band mask, flags
_JOIN_ACK = struct.Struct("!IB")  # request id, status
_ECHO = struct.Struct("!IQ")  # seq, stamp (ECHO and ECHO_REPLY alike)
_REFRESH = struct.Struct("!IHHIH")  # round, index, count, hold (ms), number of entries
_LS_TOPOLOGY = struct.Struct("!IH")  # lsid, number of entries


class _Reader:
    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: bytes | memoryview, what: str) -> None:
        self.buf = buf
        self.pos = _PREFIX.size
        self.what = what

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise MalformedFrame("bad-control", f"{self.what} truncated")
        out = bytes(self.buf[self.pos:end])
        self.pos = end
        return out

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        return st.unpack(self.take(st.size))

    def u8(self) -> int:
        return self.take(1)[0]

    def text(self, limit: int = 255) -> str:
        n = self.u8() if limit <= 255 else int.from_bytes(self.take(2), "big")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedFrame("bad-control", f"{self.what} has a non-UTF-8 string") from None

    def blob(self) -> bytes:
        return self.take(int.from_bytes(self.take(2), "big"))

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise MalformedFrame("bad-control", f"{self.what} has {len(self.buf) - self.pos} "
                                                "trailing bytes")


def _text(s: str, wide: bool = False) -> bytes:
    limit = 0xFFFF if wide else 0xFF
    raw = s.encode("utf-8")
    if len(raw) > limit:  # cut on a character boundary so the peer can decode it
        raw = raw[:limit].decode("utf-8", "ignore").encode("utf-8")
    return (len(raw).to_bytes(2, "big") if wide else bytes([len(raw)])) + raw


def _blob(b: bytes) -> bytes:
    if len(b) > 0xFFFF:
        raise ValueError("control blob too long")
    return len(b).to_bytes(2, "big") + b


@dataclass(frozen=True, slots=True)
class Hello:
    """First frame on every link, both ways: who is speaking and what it can take."""

    node_id: int
    role: Role
    name: str
    max_payload: int
    default_lsid: int = 0  #: the LSID this router suggests for new flows (routers only)
    credentials: bytes = b""
    #: what crossing this link costs per locality type (bandwidth, delay, geography), as the
    #: sender configured it; a router that accepted the link adopts it, so locality is
    #: charged in both directions without configuring every link twice
    modifiers: tuple[int, int, int] = (0, 0, 0)
    TYPE = MsgType.HELLO

    def encode(self) -> bytes:
        return (_PREFIX.pack(CONTROL_VERSION, self.TYPE)
                + _HELLO.pack(PROTOCOL_MAGIC, self.node_id, self.role, self.max_payload,
                              self.default_lsid, *self.modifiers)
                + _text(self.name) + _blob(self.credentials))


@dataclass(frozen=True, slots=True)
class Error:
    """Sent before closing a link so the peer's log says why."""

    code: int
    text: str
    TYPE = MsgType.ERROR

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + self.code.to_bytes(2, "big") + _text(
            self.text, wide=True)


@dataclass(frozen=True, slots=True)
class LsRoutes:
    """Distance-vector advertisement of the location services a router can reach."""

    routes: tuple[tuple[int, int], ...]  #: (lsid, distance in router hops)
    TYPE = MsgType.LS_ROUTES

    def encode(self) -> bytes:
        return (_PREFIX.pack(CONTROL_VERSION, self.TYPE) + len(self.routes).to_bytes(2, "big")
                + b"".join(_LS_ROUTE.pack(lsid, dist) for lsid, dist in self.routes))


@dataclass(frozen=True, slots=True)
class Auth:
    """The link-authentication proof that follows HELLO (see :mod:`flowrouter.wire.linkauth`)."""

    body: bytes
    TYPE = MsgType.AUTH

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + _blob(self.body)


@dataclass(frozen=True, slots=True)
class PolicyMsg:
    """A creator-signed flow policy (:class:`flowrouter.wire.capabilities.Policy`), gossiped
    between routers so every first-hop router can enforce it."""

    raw: bytes
    TYPE = MsgType.POLICY

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + _blob(self.raw)


@dataclass(frozen=True, slots=True)
class Join:
    req_id: int
    mask: int
    flags: int = 0
    #: a capability token (:mod:`flowrouter.wire.capabilities`) for flows under a policy
    capability: bytes = b""
    TYPE = MsgType.JOIN

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + _JOIN.pack(
            self.req_id, self.mask.to_bytes(16, "big"), self.flags) + _blob(self.capability)


@dataclass(frozen=True, slots=True)
class JoinAck:
    req_id: int
    status: JoinStatus
    reason: str = ""
    TYPE = MsgType.JOIN_ACK

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + _JOIN_ACK.pack(
            self.req_id, self.status) + _text(self.reason)


@dataclass(frozen=True, slots=True)
class Leave:
    TYPE = MsgType.LEAVE

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE)


@dataclass(frozen=True, slots=True)
class Mask:
    """The sender's new aggregate mask for this flow (sent upstream when it changes)."""

    mask: int
    TYPE = MsgType.MASK

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + self.mask.to_bytes(16, "big")


@dataclass(frozen=True, slots=True)
class Ping:
    epoch: int
    TYPE = MsgType.PING

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + self.epoch.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class Pong:
    epoch: int
    TYPE = MsgType.PONG

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + self.epoch.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class Fault:
    """Application-visible fault notice (band FAULT)."""

    kind: FaultKind
    origin: str  #: router or endpoint name that saw it
    detail: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    TYPE = MsgType.FAULT

    def encode(self) -> bytes:
        extras = list(self.extra.items())[:255]
        body = _PREFIX.pack(CONTROL_VERSION, self.TYPE) + bytes([self.kind]) + _text(
            self.origin) + _text(self.detail, wide=True) + bytes([len(extras)])
        for k, v in extras:
            body += _text(k) + _text(v, wide=True)
        return body


@dataclass(frozen=True, slots=True)
class Echo:
    """Link liveness probe; answered at once by :class:`EchoReply` with the same fields."""

    seq: int
    stamp: int  #: the sender's clock in microseconds (opaque to the receiver)
    TYPE = MsgType.ECHO

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + _ECHO.pack(self.seq, self.stamp)


@dataclass(frozen=True, slots=True)
class EchoReply:
    seq: int
    stamp: int  #: copied from the ECHO, so the prober computes the round trip statelessly
    TYPE = MsgType.ECHO_REPLY

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + _ECHO.pack(self.seq, self.stamp)


#: soft-state timing both ends default to (routers take theirs from their config, flowlib
#: from its arguments): an ECHO a second, a peer dead after three silent seconds, one digest
#: round every ten seconds, and state held 3.5 rounds (PIM's ratio: two lost rounds in a
#: row do not expire live state)
DEFAULT_LIVENESS_INTERVAL = 1.0
DEFAULT_DEAD_AFTER = 3.0
DEFAULT_REFRESH_INTERVAL = 10.0
DEFAULT_HOLD_FACTOR = 3.5
#: digest entries per second one node sends on one link at most: a round over a large table
#: takes longer than the refresh interval rather than costing more than a few per cent of a
#: core (the hold time the digest announces grows with it)
MAX_REFRESH_RATE = 20_000


def refresh_period(entries: int, interval: float, max_rate: float = MAX_REFRESH_RATE) -> float:
    """Seconds one digest round of *entries* flows takes: the refresh interval, or longer
    when sending them within it would exceed *max_rate* entries a second."""
    return max(interval, entries / max_rate) if max_rate > 0 else interval

REFRESH_SIBLING = 0x01  #: the entry is a location-service member's subtree mask (core mesh)
#: the chunk count of a REFRESH that belongs to no round: a batch of sibling-mask changes
#: (REFRESH_SIBLING entries, mask 0 too) that a tree change makes members tell each other
REFRESH_UPDATE = 0
REFRESH_ADVERTISE = 0x02  #: the sender only sends on the flow (mask 0 is an advertisement)
REFRESH_ENTRY = struct.Struct("!16s16sB")
#: bytes of a REFRESH besides its entries (prefix, round, index, count, hold, entry count)
REFRESH_OVERHEAD = _PREFIX.size + _REFRESH.size
MAX_REFRESH_ENTRIES = 1024  #: entries per chunk, whatever the link could carry


def refresh_capacity(max_payload: int) -> int:
    """Entries one REFRESH chunk may carry on a link with this maximum payload."""
    return max(1, min(MAX_REFRESH_ENTRIES,
                      (max_payload - REFRESH_OVERHEAD) // REFRESH_ENTRY.size))


@dataclass(frozen=True, slots=True)
class Refresh:
    """One chunk of a refresh digest (see the module docs)."""

    round: int
    index: int
    count: int
    hold_ms: int
    entries: tuple[tuple[bytes, int, int], ...]  #: (flow key, band mask, flags)
    TYPE = MsgType.REFRESH

    def encode(self) -> bytes:
        if len(self.entries) > 0xFFFF:
            raise ValueError("too many entries for one REFRESH chunk")
        pack = REFRESH_ENTRY.pack
        return (_PREFIX.pack(CONTROL_VERSION, self.TYPE)
                + _REFRESH.pack(self.round, self.index, self.count, self.hold_ms,
                                len(self.entries))
                + b"".join(pack(k, m.to_bytes(16, "big"), f) for k, m, f in self.entries))


def _keys_blob(keys: tuple[bytes, ...]) -> bytes:
    if len(keys) > 0xFFFF:
        raise ValueError("too many flow keys for one message")
    return len(keys).to_bytes(2, "big") + b"".join(keys)


@dataclass(frozen=True, slots=True)
class Prune:
    """The sender dropped its state for these flows on this link."""

    keys: tuple[bytes, ...]
    TYPE = MsgType.PRUNE

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + _keys_blob(self.keys)


@dataclass(frozen=True, slots=True)
class NotOnTree:
    """The sender holds no state for these flows on this link (answer to a refresh or to
    traffic from the tree's side)."""

    keys: tuple[bytes, ...]
    TYPE = MsgType.NOT_ON_TREE

    def encode(self) -> bytes:
        return _PREFIX.pack(CONTROL_VERSION, self.TYPE) + _keys_blob(self.keys)


@dataclass(frozen=True, slots=True)
class LsTopology:
    """Members of one location service tell each other who links to whom (link-state
    advertisements flooded over member-to-member links only): each entry is a member's
    name, its sequence number and the names of the fellow members it has links to. Every
    member computes the same spanning tree from them (:mod:`flowrouter.core.lstree`)."""

    lsid: int
    entries: tuple[tuple[str, int, tuple[str, ...]], ...]  #: (member, seq, its neighbours)
    TYPE = MsgType.LS_TOPOLOGY

    def encode(self) -> bytes:
        out = [_PREFIX.pack(CONTROL_VERSION, self.TYPE),
               _LS_TOPOLOGY.pack(self.lsid, len(self.entries))]
        for origin, seq, nbrs in self.entries:
            out += [_text(origin), seq.to_bytes(4, "big"), len(nbrs).to_bytes(2, "big")]
            out += [_text(n) for n in nbrs]
        return b"".join(out)


#: flow keys one PRUNE or NOT_ON_TREE may carry on a link with this maximum payload
def keys_capacity(max_payload: int) -> int:
    return max(1, min(0xFFFF, (max_payload - _PREFIX.size - 2) // 16))


ControlMessage = (Hello | Error | LsRoutes | Auth | PolicyMsg | Join | JoinAck | Leave | Mask
                  | Ping | Pong | Fault | Echo | EchoReply | Refresh | Prune | NotOnTree
                  | LsTopology)


def decode(payload: bytes | memoryview) -> ControlMessage:
    """Decode any control payload; raises MalformedFrame with a precise reason."""
    if len(payload) < _PREFIX.size:
        raise MalformedFrame("bad-control", f"control payload of {len(payload)} bytes")
    version, mtype = _PREFIX.unpack_from(payload)
    if version != CONTROL_VERSION:
        raise MalformedFrame("bad-version", f"control version {version}, this router speaks "
                                            f"{CONTROL_VERSION}")
    try:
        t = MsgType(mtype)
    except ValueError:
        raise UnknownControlType(mtype) from None
    r = _Reader(payload, t.name)
    msg: ControlMessage
    if t is MsgType.HELLO:
        magic, node_id, role, max_payload, lsid, m_bw, m_delay, m_geo = r.unpack(
            _HELLO)  # type: ignore[assignment]
        if magic != PROTOCOL_MAGIC:  # type: ignore[comparison-overlap]
            raise MalformedFrame("bad-hello", "wrong protocol magic")
        try:
            role_e = Role(role)
        except ValueError:
            raise MalformedFrame("bad-hello", f"unknown role {role}") from None
        msg = Hello(node_id, role_e, r.text(), max_payload, lsid, r.blob(),
                    (m_bw, m_delay, m_geo))
    elif t is MsgType.ERROR:
        code = int.from_bytes(r.take(2), "big")
        msg = Error(code, r.text(limit=0xFFFF))
    elif t is MsgType.LS_ROUTES:
        n = int.from_bytes(r.take(2), "big")
        msg = LsRoutes(tuple(r.unpack(_LS_ROUTE) for _ in range(n)))  # type: ignore[misc]
    elif t is MsgType.AUTH:
        msg = Auth(r.blob())
    elif t is MsgType.POLICY:
        msg = PolicyMsg(r.blob())
    elif t is MsgType.JOIN:
        req, mask, flags = r.unpack(_JOIN)
        msg = Join(req, int.from_bytes(mask, "big"), flags, r.blob())  # type: ignore[arg-type]
    elif t is MsgType.JOIN_ACK:
        req, status = r.unpack(_JOIN_ACK)
        try:
            st = JoinStatus(status)
        except ValueError:
            raise MalformedFrame("bad-control", f"unknown join status {status}") from None
        msg = JoinAck(req, st, r.text())
    elif t is MsgType.LEAVE:
        msg = Leave()
    elif t is MsgType.MASK:
        msg = Mask(int.from_bytes(r.take(16), "big"))
    elif t is MsgType.PING:
        msg = Ping(int.from_bytes(r.take(4), "big"))
    elif t is MsgType.PONG:
        msg = Pong(int.from_bytes(r.take(4), "big"))
    elif t is MsgType.ECHO:
        msg = Echo(*r.unpack(_ECHO))
    elif t is MsgType.ECHO_REPLY:
        msg = EchoReply(*r.unpack(_ECHO))
    elif t is MsgType.REFRESH:
        rnd, index, count, hold, n = r.unpack(_REFRESH)
        if index >= max(count, 1):  # count 0: an update outside any round (index 0)
            raise MalformedFrame("bad-control", f"REFRESH chunk {index} of {count}")
        raw = r.take(n * REFRESH_ENTRY.size)
        from_bytes = int.from_bytes
        msg = Refresh(rnd, index, count, hold, tuple(
            [(k, from_bytes(m, "big"), f) for k, m, f in REFRESH_ENTRY.iter_unpack(raw)]))
    elif t is MsgType.PRUNE or t is MsgType.NOT_ON_TREE:
        n = int.from_bytes(r.take(2), "big")
        raw = r.take(16 * n)
        keys = tuple(raw[i:i + 16] for i in range(0, len(raw), 16))
        msg = Prune(keys) if t is MsgType.PRUNE else NotOnTree(keys)
    elif t is MsgType.LS_TOPOLOGY:
        lsid, n = r.unpack(_LS_TOPOLOGY)
        entries = []
        for _ in range(n):
            origin = r.text()
            seq = int.from_bytes(r.take(4), "big")
            nbrs = tuple(r.text() for _ in range(int.from_bytes(r.take(2), "big")))
            entries.append((origin, seq, nbrs))
        msg = LsTopology(lsid, tuple(entries))
    else:  # FAULT
        try:
            kind = FaultKind(r.u8())
        except ValueError:
            raise MalformedFrame("bad-control", "unknown fault kind") from None
        origin, detail = r.text(), r.text(limit=0xFFFF)
        extra = {}
        for _ in range(r.u8()):
            k = r.text()
            extra[k] = r.text(limit=0xFFFF)
        msg = Fault(kind, origin, detail, extra)
    r.end()
    return msg
