"""Scapy layers for flownet: dissect captures, build and fuzz frames.

* :class:`FlowHeader` — the 24-byte header of :mod:`flowrouter.wire.header`; its payload is exactly
  ``size`` bytes (what follows is Scapy ``Padding``: the next frame on a TCP segment).
  ``size`` is filled in from the payload when left unset.
* :class:`FlowControl` — ``version | type`` of a control payload, followed by one of
  :class:`FlowHello`, :class:`FlowError`, :class:`FlowLsRoutes`, :class:`FlowJoin`,
  :class:`FlowJoinAck`, :class:`FlowLeave`, :class:`FlowMask`, :class:`FlowPing`,
  :class:`FlowPong`, :class:`FlowFault`; a HELLO's credentials and an AUTH's body dissect
  as :class:`FlowLinkCredentials` and :class:`FlowAuthProof`. A header's payload is control
  when its band is below 16 or its LSID is 0 (link-local), or when it is a router's FAULT
  notice on the fault band; anything else is application data (``Raw``).
* :func:`bind_flow_ports` binds the header to TCP/UDP ports (flownet has no well-known port).
* A TCP segment need not hold whole frames: :func:`dissect_stream` splits a reassembled byte
  stream into frames, :func:`tcp_streams` reassembles the streams of a capture (by sequence
  number, ignoring duplicates and wrapping sequence numbers), and
  :meth:`FlowHeader.tcp_reassemble` lets Scapy's own ``TCPSession`` do it while sniffing
  (``sniff(session=TCPSession, ...)``; frames completed by the same segment come chained in
  one packet: walk them with ``pkt.getlayer(FlowHeader, nb=i)``).
* :func:`tcp_conversation` wraps recorded bytes in Ether/IP/TCP (handshake, sequence
  numbers, FIN) so recordings made without a capture can be written with ``wrpcap``.

Example::

    from scapy.all import rdpcap
    from flowrouter.tools.scapy_layer import bind_flow_ports, tcp_streams, dissect_stream
    bind_flow_ports(7001, 7002)
    for (src, sport, dst, dport), data in tcp_streams(rdpcap("cap.pcap")).items():
        for frame in dissect_stream(data):
            frame.show()
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, ClassVar

from scapy.config import conf
from scapy.fields import (
    AnyField,
    ByteEnumField,
    ByteField,
    Field,
    FieldLenField,
    FlagsField,
    IntField,
    LongField,
    PacketListField,
    ShortField,
    StrFixedLenField,
    StrLenField,
    XIntField,
    XLongField,
)
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers
from scapy.volatile import RandNum

from flowrouter.wire import control as C
from flowrouter.wire.bands import (
    BAND_FAULT,
    BAND_NAMES,
    DEFAULT_DATA_BAND,
    ROUTER_BANDS_END,
    BandMask,
)
from flowrouter.wire.header import DEFAULT_TTL, HEADER_SIZE, Locality

__all__ = [
    "BandMaskField",
    "FlowControl",
    "FlowError",
    "FlowFault",
    "FlowFaultExtra",
    "FlowHeader",
    "FlowHello",
    "FlowJoin",
    "FlowJoinAck",
    "FlowLeave",
    "FlowLsRoute",
    "FlowLsRoutes",
    "FlowMask",
    "FlowPing",
    "FlowPong",
    "StreamKey",
    "bind_flow_ports",
    "dissect_stream",
    "tcp_conversation",
    "tcp_streams",
]

LOCALITY_TYPES = {m.value: m.name.lower() for m in Locality}
MSG_TYPES = {m.value: m.name for m in C.MsgType}
ROLES = {m.value: m.name.lower() for m in C.Role}
JOIN_STATUS = {m.value: m.name.lower() for m in C.JoinStatus}
FAULT_KINDS = {m.value: m.name.lower() for m in C.FaultKind}
_FAULT_PREFIX = bytes([C.CONTROL_VERSION, C.MsgType.FAULT])


class BandMaskField(Field[int, bytes]):
    """A 128-bit band mask on the wire (16 bytes, bit b = band b); shown as ``32-40,50``."""

    def __init__(self, name: str, default: int | None) -> None:
        Field.__init__(self, name, default, "16s")

    def i2m(self, pkt: Packet | None, x: Any) -> bytes:
        return int(x or 0).to_bytes(16, "big")

    def m2i(self, pkt: Packet | None, x: bytes) -> int:
        return int.from_bytes(x, "big")

    def any2i(self, pkt: Packet | None, x: Any) -> Any:
        if isinstance(x, str):
            return BandMask.parse(x).bits
        if isinstance(x, BandMask):
            return x.bits
        return x

    def i2repr(self, pkt: Packet | None, x: Any) -> str:
        try:
            return str(BandMask(int(x)))
        except (TypeError, ValueError):
            return repr(x)

    def randval(self) -> RandNum:
        return RandNum(0, (1 << 128) - 1)


# ---------------------------------------------------------------------------------- header
class FlowHeader(Packet):
    name = "FlowHeader"
    fields_desc: ClassVar[list[AnyField]] = [
        XLongField("creator", 0),
        XIntField("lsid", 0),
        XIntField("local", 0),
        IntField("size", None),
        ByteEnumField("band", DEFAULT_DATA_BAND, dict(BAND_NAMES)),
        ByteEnumField("loc_type", 0, LOCALITY_TYPES),
        ByteField("loc_value", 0),
        ByteField("ttl", DEFAULT_TTL),
    ]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.size is None:
            pkt = pkt[:16] + struct.pack("!I", len(pay)) + pkt[20:]
        return pkt + pay

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        size = self.size if isinstance(self.size, int) else len(s)
        return s[:size], s[size:]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        band, lsid = self.band, self.lsid
        if isinstance(band, int) and isinstance(lsid, int):
            if band < ROUTER_BANDS_END or lsid == 0:
                return FlowControl
            if band == BAND_FAULT and payload[:2] == _FAULT_PREFIX:
                return FlowControl
        return conf.raw_layer

    @property
    def flow_key(self) -> bytes:
        return bytes(self)[:16]

    def mysummary(self) -> str:
        return self.sprintf("Flow %FlowHeader.creator%:%FlowHeader.lsid%:%FlowHeader.local% "
                            "band=%FlowHeader.band% size=%FlowHeader.size% "
                            "ttl=%FlowHeader.ttl%")

    @classmethod
    def tcp_reassemble(cls, data: bytes, metadata: dict[str, Any],
                       session: dict[str, Any]) -> Packet | None:
        """For ``sniff(session=TCPSession)``: once at least one whole frame is buffered,
        every complete frame, chained one after the other (walk them with
        ``pkt.getlayer(FlowHeader, nb=i)``); an incomplete last frame comes back as padding,
        which the session keeps for the next segment."""
        pos, n = 0, len(data)
        first: Packet | None = None
        while n - pos >= HEADER_SIZE:
            end = pos + HEADER_SIZE + int.from_bytes(data[pos + 16:pos + 20], "big")
            if end > n:
                break
            frame = cls(data[pos:end])
            if first is None:
                first = frame
            else:
                first.add_payload(frame)
            pos = end
        if first is None:
            if n >= HEADER_SIZE:
                metadata["tcp_min_len"] = HEADER_SIZE + int.from_bytes(data[16:20], "big")
            return None
        if pos < n:
            first.add_payload(conf.padding_layer(data[pos:]))
        return first


# ---------------------------------------------------------------------------------- control
class FlowControl(Packet):
    name = "FlowControl"
    fields_desc: ClassVar[list[AnyField]] = [
        ByteField("version", C.CONTROL_VERSION),
        ByteEnumField("type", C.MsgType.HELLO, MSG_TYPES),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if self.version != C.CONTROL_VERSION:
            return conf.raw_layer
        return super().guess_payload_class(payload)

    def mysummary(self) -> str:
        return self.sprintf("FlowControl %FlowControl.type%")


def _sized(length: str, fmt: str, name: str, max_length: int) -> list[AnyField]:
    """Bytes after their length: the field *length* (a struct *fmt*) counts the bytes of
    *name*, at most *max_length*; filled in on build when left unset."""
    return [FieldLenField(length, None, length_of=name, fmt=fmt),
            StrLenField(name, b"", length_from=lambda p: getattr(p, length),
                        max_length=max_length)]


def _counted(count: str, fmt: str, name: str, element: type[Packet]) -> list[AnyField]:
    """A list after its length: the field *count* (a struct *fmt*) counts the *element*
    packets of *name*; filled in on build when left unset."""
    return [FieldLenField(count, None, count_of=name, fmt=fmt),
            PacketListField(name, [], element, count_from=lambda p: getattr(p, count))]


class _Sub(Packet):
    """An element of a list field: consumes its own bytes, leaves the rest to the list."""

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


class FlowHello(Packet):
    name = "FlowHello"
    fields_desc: ClassVar[list[AnyField]] = [
        StrFixedLenField("magic", C.PROTOCOL_MAGIC, 4),
        XLongField("node_id", 0),
        ByteEnumField("role", C.Role.ENDPOINT, ROLES),
        IntField("max_payload", 65536),
        XIntField("default_lsid", 0),
        # what crossing the link costs per locality type, as the sender configured it
        ByteField("mod_bandwidth", 0),
        ByteField("mod_delay", 0),
        ByteField("mod_geography", 0),
        *_sized("name_len", "B", "node_name", 255),
        *_sized("cred_len", "!H", "credentials", 1024),
    ]


class FlowError(Packet):
    name = "FlowError"
    fields_desc: ClassVar[list[AnyField]] = [
        ShortField("code", 1),
        *_sized("text_len", "!H", "text", 1024),
    ]


class FlowLsRoute(_Sub):
    name = "FlowLsRoute"
    fields_desc: ClassVar[list[AnyField]] = [XIntField("lsid", 0), ByteField("distance", 0)]


class FlowLsRoutes(Packet):
    name = "FlowLsRoutes"
    fields_desc: ClassVar[list[AnyField]] = _counted("count", "!H", "routes", FlowLsRoute)


class FlowJoin(Packet):
    name = "FlowJoin"
    fields_desc: ClassVar[list[AnyField]] = [
        IntField("req_id", 1),
        BandMaskField("mask", 0),
        FlagsField("flags", 0, 8, ["advertise"]),
        *_sized("cap_len", "!H", "capability", 4096),
    ]


class FlowAuth(Packet):
    """The link-authentication proof after HELLO (flowrouter.wire.linkauth)."""

    name = "FlowAuth"
    fields_desc: ClassVar[list[AnyField]] = _sized("body_len", "!H", "body", 1024)


class FlowLinkCredentials(Packet):
    """What a HELLO's ``credentials`` hold under link authentication (version 3: nonce and
    ephemeral X25519 key, flowrouter.wire.linkauth). Dissect with
    ``FlowLinkCredentials(hello.credentials)``; the HELLO keeps them as opaque bytes."""

    name = "FlowLinkCredentials"
    fields_desc: ClassVar[list[AnyField]] = [
        ByteField("version", 3),
        ByteEnumField("scheme", 2, {2: "psk-hmac-sha256+x25519"}),
        FlagsField("flags", 0, 8, ["encrypt", "require_endpoints"]),
        StrFixedLenField("nonce", b"\0" * 32, 32),
        StrFixedLenField("ephemeral", b"\0" * 32, 32),
        *_sized("key_id_len", "B", "key_id", 64),
    ]


class FlowAuthProof(Packet):
    """The body of an AUTH message (``FlowAuthProof(auth.body)``)."""

    name = "FlowAuthProof"
    fields_desc: ClassVar[list[AnyField]] = [
        ByteField("version", 3),
        ByteField("kind", 2),
        StrFixedLenField("proof", b"\0" * 32, 32),
    ]


class FlowPolicy(Packet):
    """A creator-signed flow policy (flowrouter.wire.capabilities.Policy)."""

    name = "FlowPolicy"
    fields_desc: ClassVar[list[AnyField]] = _sized("policy_len", "!H", "policy", 65535)


class FlowJoinAck(Packet):
    name = "FlowJoinAck"
    fields_desc: ClassVar[list[AnyField]] = [
        IntField("req_id", 1),
        ByteEnumField("status", C.JoinStatus.OK, JOIN_STATUS),
        *_sized("reason_len", "B", "reason", 255),
    ]


class FlowLeave(Packet):
    name = "FlowLeave"
    fields_desc: ClassVar[list[AnyField]] = []


class FlowMask(Packet):
    name = "FlowMask"
    fields_desc: ClassVar[list[AnyField]] = [BandMaskField("mask", 0)]


class FlowPing(Packet):
    name = "FlowPing"
    fields_desc: ClassVar[list[AnyField]] = [IntField("epoch", 0)]


class FlowPong(Packet):
    name = "FlowPong"
    fields_desc: ClassVar[list[AnyField]] = [IntField("epoch", 0)]


class FlowFaultExtra(_Sub):
    name = "FlowFaultExtra"
    fields_desc: ClassVar[list[AnyField]] = [
        *_sized("key_len", "B", "key", 255),
        *_sized("value_len", "!H", "value", 1024),
    ]


class FlowFault(Packet):
    name = "FlowFault"
    fields_desc: ClassVar[list[AnyField]] = [
        ByteEnumField("kind", C.FaultKind.LINK_DOWN, FAULT_KINDS),
        *_sized("origin_len", "B", "origin", 255),
        *_sized("detail_len", "!H", "detail", 1024),
        *_counted("n_extra", "B", "extra", FlowFaultExtra),
    ]


class FlowEcho(Packet):
    """Link liveness probe (soft state); ECHO_REPLY copies both fields back."""

    name = "FlowEcho"
    fields_desc: ClassVar[list[AnyField]] = [IntField("seq", 0), LongField("stamp", 0)]


class FlowEchoReply(Packet):
    name = "FlowEchoReply"
    fields_desc: ClassVar[list[AnyField]] = [IntField("seq", 0), LongField("stamp", 0)]


class FlowRefreshEntry(_Sub):
    name = "FlowRefreshEntry"
    fields_desc: ClassVar[list[AnyField]] = [
        StrFixedLenField("key", b"\0" * 16, 16),
        BandMaskField("mask", 0),
        FlagsField("flags", 0, 8, ["sibling", "advertise"]),
    ]


class FlowRefresh(Packet):
    """One chunk of a refresh digest: (flow, band mask) pairs wanted from the receiver."""

    name = "FlowRefresh"
    fields_desc: ClassVar[list[AnyField]] = [
        IntField("round", 0), ShortField("index", 0), ShortField("count", 1),
        IntField("hold_ms", 0),
        *_counted("n_entries", "!H", "entries", FlowRefreshEntry),
    ]


class FlowKey(_Sub):
    name = "FlowKey"
    fields_desc: ClassVar[list[AnyField]] = [StrFixedLenField("key", b"\0" * 16, 16)]


class FlowPrune(Packet):
    """The sender dropped its state for these flows on this link."""

    name = "FlowPrune"
    fields_desc: ClassVar[list[AnyField]] = _counted("n_keys", "!H", "keys", FlowKey)


class FlowNotOnTree(Packet):
    """The sender holds no state for these flows on this link."""

    name = "FlowNotOnTree"
    fields_desc: ClassVar[list[AnyField]] = _counted("n_keys", "!H", "keys", FlowKey)


class FlowLsName(_Sub):
    name = "FlowLsName"
    fields_desc: ClassVar[list[AnyField]] = _sized("name_len", "B", "member", 255)


class FlowLsMember(_Sub):
    """One member's advertisement: its name, sequence number and fellow members."""

    name = "FlowLsMember"
    fields_desc: ClassVar[list[AnyField]] = [
        *_sized("name_len", "B", "member", 255),
        IntField("seq", 0),
        *_counted("n_neighbours", "!H", "neighbours", FlowLsName),
    ]


class FlowLsTopology(Packet):
    """Members of a location service: who links to whom (flowrouter.core.lstree)."""

    name = "FlowLsTopology"
    fields_desc: ClassVar[list[AnyField]] = [
        XIntField("lsid", 0),
        *_counted("n_entries", "!H", "entries", FlowLsMember),
    ]


CONTROL_LAYERS: dict[C.MsgType, type[Packet]] = {
    C.MsgType.HELLO: FlowHello, C.MsgType.ERROR: FlowError, C.MsgType.LS_ROUTES: FlowLsRoutes,
    C.MsgType.JOIN: FlowJoin, C.MsgType.JOIN_ACK: FlowJoinAck, C.MsgType.LEAVE: FlowLeave,
    C.MsgType.MASK: FlowMask, C.MsgType.PING: FlowPing, C.MsgType.PONG: FlowPong,
    C.MsgType.FAULT: FlowFault, C.MsgType.AUTH: FlowAuth, C.MsgType.POLICY: FlowPolicy,
    C.MsgType.ECHO: FlowEcho, C.MsgType.ECHO_REPLY: FlowEchoReply,
    C.MsgType.REFRESH: FlowRefresh, C.MsgType.PRUNE: FlowPrune,
    C.MsgType.NOT_ON_TREE: FlowNotOnTree, C.MsgType.LS_TOPOLOGY: FlowLsTopology,
}
for _t, _cls in CONTROL_LAYERS.items():
    bind_layers(FlowControl, _cls, type=int(_t))

_bound: set[tuple[str, int]] = set()


def bind_flow_ports(*ports: int, tcp: bool = True, udp: bool = True) -> None:
    """Dissect TCP/UDP traffic to or from these ports as flownet frames (idempotent)."""
    for port in ports:
        for proto, enabled in ((TCP, tcp), (UDP, udp)):
            if not enabled or (proto.__name__, port) in _bound:
                continue
            bind_layers(proto, FlowHeader, sport=port)
            bind_layers(proto, FlowHeader, dport=port)
            _bound.add((proto.__name__, port))


# ---------------------------------------------------------------------------------- streams
def dissect_stream(data: bytes | bytearray | memoryview, *, strict: bool = False
                   ) -> list[Packet]:
    """Split a reassembled TCP byte stream into :class:`FlowHeader` packets.

    An incomplete frame at the end is returned as ``Raw`` (or raises ValueError when
    *strict*), so a capture cut mid-frame still shows everything before the cut.
    """
    data = bytes(data)
    out: list[Packet] = []
    pos, n = 0, len(data)
    while n - pos >= HEADER_SIZE:
        size = int.from_bytes(data[pos + 16:pos + 20], "big")
        end = pos + HEADER_SIZE + size
        if end > n:
            break
        out.append(FlowHeader(data[pos:end]))
        pos = end
    if pos < n:
        if strict:
            raise ValueError(f"stream ends with {n - pos} bytes of an incomplete frame")
        out.append(conf.raw_layer(data[pos:]))
    return out


StreamKey = tuple[str, int, str, int]  #: (src, sport, dst, dport)


def tcp_streams(packets: Iterable[Packet]) -> dict[StreamKey, bytes]:
    """Reassemble each direction of each TCP connection in a capture.

    Segments are placed by sequence number (relative to the SYN when captured, else to the
    first segment; modulo 2^32), so duplicates (loopback captures show every packet twice)
    and retransmissions collapse; a gap ends that stream's bytes.
    """
    segs: dict[StreamKey, list[tuple[int, bytes]]] = {}
    isn: dict[StreamKey, int] = {}
    for pkt in packets:
        if TCP not in pkt or IP not in pkt:
            continue
        ip, tcp = pkt[IP], pkt[TCP]
        key = (ip.src, tcp.sport, ip.dst, tcp.dport)
        if tcp.flags.S:
            isn[key] = (tcp.seq + 1) & 0xFFFFFFFF
        payload = bytes(tcp.payload)
        if payload:
            segs.setdefault(key, []).append((tcp.seq, payload))
    out: dict[StreamKey, bytes] = {}
    for key, items in segs.items():
        base = isn.get(key, items[0][0])
        rel = sorted(((seq - base) & 0xFFFFFFFF, data) for seq, data in items)
        buf = bytearray()
        for off, data in rel:
            if off > len(buf):
                break  # a gap: nothing after it can be trusted as contiguous
            buf += data[len(buf) - off:]
        out[key] = bytes(buf)
    return out


def tcp_conversation(events: Iterable[tuple[bool, bytes]], client: tuple[str, int],
                     server: tuple[str, int], *, client_isn: int = 1000,
                     server_isn: int = 5000, mss: int | None = None) -> list[Packet]:
    """Ether/IP/TCP packets for a recorded TCP conversation.

    *events*: ``(from_client, data)`` in the order they happened. Emits the three-way
    handshake, one PSH/ACK segment per event (split at *mss* if given) with correct
    sequence and acknowledgement numbers, and FINs at the end.
    """
    (cip, cport), (sip, sport) = client, server
    seq = {True: client_isn, False: server_isn}

    def seg(from_client: bool, flags: str, data: bytes = b"") -> Packet:
        src, sp, dst, dp = (cip, cport, sip, sport) if from_client else (sip, sport, cip, cport)
        pkt = (Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
               / IP(src=src, dst=dst) / TCP(sport=sp, dport=dp, flags=flags,
                                            seq=seq[from_client] & 0xFFFFFFFF,
                                            ack=seq[not from_client] & 0xFFFFFFFF))
        if data:
            pkt = pkt / Raw(data)
        return pkt

    out = [seg(True, "S")]
    out[0][TCP].ack = 0
    seq[True] += 1
    out.append(seg(False, "SA"))
    seq[False] += 1
    out.append(seg(True, "A"))
    for from_client, data in events:
        data = bytes(data)
        step = mss or max(1, len(data))
        for i in range(0, len(data), step):
            chunk = data[i:i + step]
            out.append(seg(from_client, "PA", chunk))
            seq[from_client] += len(chunk)
    out.append(seg(True, "FA"))
    seq[True] += 1
    out.append(seg(False, "FA"))
    seq[False] += 1
    out.append(seg(True, "A"))
    return out
