"""The Scapy layer: every control message both ways against flowrouter.wire.control, stream
splitting and TCP reassembly, pcap write/read, and traffic of real routers on loopback
(recorded at a raw endpoint; and, where raw sockets are allowed, sniffed on ``lo``)."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.all import AsyncSniffer, Raw, TCPSession, fuzz, rdpcap, sniff, wrpcap
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether

import flowlib
from flowrouter.tools.scapy_layer import (
    FlowControl,
    FlowFault,
    FlowHeader,
    FlowHello,
    FlowJoin,
    FlowLsRoutes,
    bind_flow_ports,
    dissect_stream,
    tcp_conversation,
    tcp_streams,
)
from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import HEADER_SIZE, Header, Locality, pack_header, parse_header

from .rawep import RawEndpoint, chain, until, within

FLOW = FlowID(0xA1, 0x10, 1)

CONTROL_SAMPLES: list[C.ControlMessage] = [
    C.Hello(0x1234, C.Role.ROUTER, "r1", 65536, 0x10, b"creds\x00\xff", (1, 2, 3)),
    C.Hello(7, C.Role.ENDPOINT, "ünïcode", 1024),
    C.Error(3, "malformed frame: bad-band"),
    C.LsRoutes(((0x10, 0), (0x20, 3), (0xFFFFFFFF, 32))),
    C.LsRoutes(()),
    C.Join(9, (1 << 32) | (1 << 127), C.JOIN_FLAG_ADVERTISE),
    C.JoinAck(9, C.JoinStatus.NO_ROUTE, "no route to 0x10"),
    C.Leave(),
    C.Mask((1 << 128) - 1),
    C.Ping(77),
    C.Pong(78),
    C.Echo(5, 1_700_000_000_123_456),
    C.EchoReply(5, 1_700_000_000_123_456),
    C.Refresh(3, 1, 2, 35_000, ((FLOW.key, 1 << 32, 0), (b"k" * 16, 0, C.REFRESH_ADVERTISE))),
    C.Prune((FLOW.key,)),
    C.NotOnTree((FLOW.key, b"n" * 16)),
    C.LsTopology(0x10, (("m1", 7, ("m2", "m8")), ("m2", 1, ()))),
    C.Fault(C.FaultKind.LINK_DOWN, "r2", "link to r3 down", {"peer": "r3", "flow": "a1:10:1"}),
]


def frame_of(msg: C.ControlMessage, key: bytes = FLOW.key, band: int = 0) -> bytes:
    body = msg.encode()
    return pack_header(key, len(body), band) + body


def control_fields(pkt: Any) -> tuple[Any, ...]:
    """The decoded message a dissected control packet stands for, in control.py's terms."""
    t = C.MsgType(pkt[FlowControl].type)
    layer = pkt[FlowControl].payload
    if t is C.MsgType.HELLO:
        return (layer.node_id, layer.role, layer.node_name.decode(), layer.max_payload,
                layer.default_lsid, layer.credentials,
                (layer.mod_bandwidth, layer.mod_delay, layer.mod_geography))
    if t is C.MsgType.ERROR:
        return (layer.code, layer.text.decode())
    if t is C.MsgType.LS_ROUTES:
        return tuple((r.lsid, r.distance) for r in layer.routes)
    if t is C.MsgType.JOIN:
        return (layer.req_id, layer.mask, int(layer.flags))
    if t is C.MsgType.JOIN_ACK:
        return (layer.req_id, layer.status, layer.reason.decode())
    if t is C.MsgType.LEAVE:
        return ()
    if t is C.MsgType.MASK:
        return (layer.mask,)
    if t in (C.MsgType.PING, C.MsgType.PONG):
        return (layer.epoch,)
    if t in (C.MsgType.ECHO, C.MsgType.ECHO_REPLY):
        return (layer.seq, layer.stamp)
    if t is C.MsgType.REFRESH:
        return (layer.round, layer.index, layer.count, layer.hold_ms,
                tuple((e.key, e.mask, int(e.flags)) for e in layer.entries))
    if t in (C.MsgType.PRUNE, C.MsgType.NOT_ON_TREE):
        return tuple(k.key for k in layer.keys)
    if t is C.MsgType.LS_TOPOLOGY:
        return (layer.lsid, tuple((e.member.decode(), e.seq,
                                   tuple(n.member.decode() for n in e.neighbours))
                                  for e in layer.entries))
    return (layer.kind, layer.origin.decode(), layer.detail.decode(),
            {e.key.decode(): e.value.decode() for e in layer.extra})


def message_fields(msg: C.ControlMessage) -> tuple[Any, ...]:
    if isinstance(msg, C.Hello):
        return (msg.node_id, msg.role, msg.name, msg.max_payload, msg.default_lsid,
                msg.credentials, tuple(msg.modifiers))
    if isinstance(msg, C.Error):
        return (msg.code, msg.text)
    if isinstance(msg, C.LsRoutes):
        return tuple(msg.routes)
    if isinstance(msg, C.Join):
        return (msg.req_id, msg.mask, msg.flags)
    if isinstance(msg, C.JoinAck):
        return (msg.req_id, msg.status, msg.reason)
    if isinstance(msg, C.Leave):
        return ()
    if isinstance(msg, C.Mask):
        return (msg.mask,)
    if isinstance(msg, (C.Ping, C.Pong)):
        return (msg.epoch,)
    if isinstance(msg, (C.Echo, C.EchoReply)):
        return (msg.seq, msg.stamp)
    if isinstance(msg, C.Refresh):
        return (msg.round, msg.index, msg.count, msg.hold_ms, msg.entries)
    if isinstance(msg, (C.Prune, C.NotOnTree)):
        return msg.keys
    if isinstance(msg, C.LsTopology):
        return (msg.lsid, msg.entries)
    assert isinstance(msg, C.Fault)
    return (msg.kind, msg.origin, msg.detail, dict(msg.extra))


def check_frame(pkt: Any, raw: bytes) -> None:
    """A dissected frame says exactly what the wire bytes say (per flowrouter's own codecs)."""
    assert isinstance(pkt, FlowHeader), pkt
    hdr = parse_header(raw, max_payload=1 << 24)
    payload = raw[HEADER_SIZE:]
    assert (pkt.creator, pkt.lsid, pkt.local, pkt.size, pkt.band, pkt.loc_type, pkt.loc_value,
            pkt.ttl) == (hdr.creator, hdr.lsid, hdr.local, hdr.size, hdr.band, hdr.loc_type,
                         hdr.loc_value, hdr.ttl)
    assert bytes(pkt) == raw  # rebuilding gives the same bytes
    if hdr.band < 16 or hdr.lsid == 0:
        assert FlowControl in pkt
        assert control_fields(pkt) == message_fields(C.decode(payload))
    elif FlowControl in pkt:  # a FAULT notice on the fault band
        assert control_fields(pkt) == message_fields(C.decode(payload))
    else:
        assert pkt[Raw].load == payload if payload else Raw not in pkt


# ---------------------------------------------------------------------------------- unit
@pytest.mark.parametrize("msg", CONTROL_SAMPLES, ids=lambda m: type(m).__name__)
def test_every_control_message_dissects_like_control_decode(msg: C.ControlMessage) -> None:
    key = LINK_LOCAL_FLOW.key if isinstance(msg, (C.Hello, C.Error, C.LsRoutes, C.LsTopology)) \
        else FLOW.key
    band = 17 if isinstance(msg, C.Fault) else 0
    raw = frame_of(msg, key, band)
    pkt = FlowHeader(raw)
    check_frame(pkt, raw)
    assert pkt[FlowControl].type == msg.TYPE


def test_built_packets_decode_with_the_router_codecs() -> None:
    hello = (FlowHeader() / FlowControl() / FlowHello(node_id=5, role="router", node_name=b"x",
                                                      credentials=b"abc", mod_geography=3))
    hello.band = 0
    raw = bytes(hello)
    hdr = parse_header(raw)
    assert hdr.size == len(raw) - 24 and hdr.lsid == 0
    assert C.decode(raw[24:]) == C.Hello(5, C.Role.ROUTER, "x", 65536, 0, b"abc", (0, 0, 3))
    join = FlowHeader(creator=0xA1, lsid=0x10, local=1, band=0) / FlowControl() / FlowJoin(
        req_id=4, mask="32-33,fault", flags="advertise")
    assert C.decode(bytes(join)[24:]) == C.Join(4, (1 << 32) | (1 << 33) | (1 << 17), 1)
    routes = FlowHeader(band=0) / FlowControl() / FlowLsRoutes(routes=[])
    assert C.decode(bytes(routes)[24:]) == C.LsRoutes(())
    fault = FlowHeader(band=17) / FlowControl() / FlowFault(origin=b"r", detail=b"d")
    assert C.decode(bytes(fault)[24:]) == C.Fault(C.FaultKind.LINK_DOWN, "r", "d", {})
    data = FlowHeader(band=40, loc_type="geography", loc_value=2) / b"payload"
    assert parse_header(bytes(data)) == Header(0, 0, 0, 7, 40, Locality.GEOGRAPHY, 2, 32)
    assert "band=40" in data.summary() or "40" in data.summary()


def test_application_data_is_not_mistaken_for_control() -> None:
    raw = pack_header(FLOW.key, 2, 17) + b"\x01\x01"  # fault band, but not a FAULT payload
    pkt = FlowHeader(raw)
    assert FlowControl not in pkt and pkt[Raw].load == b"\x01\x01"
    raw = pack_header(FLOW.key, 2, 33) + b"\x01\x14"  # looks like FAULT, but a data band
    assert FlowControl not in FlowHeader(raw)
    bad_version = pack_header(FLOW.key, 3, 0) + b"\x07\x0a\x00"
    pkt = FlowHeader(bad_version)
    assert pkt[FlowControl].version == 7 and Raw in pkt


def test_dissect_stream_splits_frames_and_keeps_an_incomplete_tail() -> None:
    frames = [frame_of(m, band=17 if isinstance(m, C.Fault) else 0) for m in CONTROL_SAMPLES]
    frames.append(pack_header(FLOW.key, 0, 32))  # empty payload
    frames.append(pack_header(FLOW.key, 5, 99, 2, 7, 1) + b"hello")
    stream = b"".join(frames)
    pkts = dissect_stream(stream)
    assert len(pkts) == len(frames)
    for pkt, raw in zip(pkts, frames):
        check_frame(pkt, raw)
    cut = dissect_stream(stream + frames[-1][:20])
    assert len(cut) == len(frames) + 1 and isinstance(cut[-1], Raw)
    with pytest.raises(ValueError, match="incomplete"):
        dissect_stream(stream + b"\0" * 5, strict=True)
    # several frames in one packet: the rest is padding, as TCPSession expects
    two = FlowHeader(frames[0] + frames[1])
    assert bytes(two.payload)[:0] == b"" and two.lastlayer().name == "Padding"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_dissection_never_raises(data: bytes) -> None:
    for pkt in dissect_stream(data):
        bytes(pkt)
        pkt.summary()
    # Like every Scapy layer, a top-level FlowHeader needs its fixed fields; past them,
    # anything (a broken control payload included) dissects without raising.
    FlowHeader(b"\0" * 20 + bytes([0, 0, 0, 0]) + data)
    FlowHeader(pack_header(LINK_LOCAL_FLOW.key, len(data), 0) + data).summary()


def test_fuzz_generates_frames_the_router_can_parse_or_refuse() -> None:
    random.seed(1234)
    for _ in range(200):
        raw = bytes(fuzz(FlowHeader() / Raw(b"x" * random.randint(0, 40))))
        assert len(raw) >= HEADER_SIZE
        assert int.from_bytes(raw[16:20], "big") == len(raw) - HEADER_SIZE
        try:
            parse_header(raw)
        except ValueError:
            pass
        ctl = bytes(fuzz(FlowHeader(band=0) / FlowControl() / FlowJoin()))
        assert len(ctl) >= HEADER_SIZE + 2 + 21 + 2  # fixed part + capability length
        assert int.from_bytes(ctl[16:20], "big") == len(ctl) - HEADER_SIZE


def test_pcap_round_trip_with_segmented_stream(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bind_flow_ports(7999)
    frames = [frame_of(m, band=17 if isinstance(m, C.Fault) else 0) for m in CONTROL_SAMPLES]
    c2s = b"".join(frames[:6])
    s2c = b"".join(frames[6:])
    events = [(True, c2s[:10]), (True, c2s[10:]), (False, s2c)]
    pkts = tcp_conversation(events, ("127.0.0.1", 40000), ("127.0.0.1", 7999), mss=37,
                            client_isn=0xFFFFFF00)  # sequence numbers wrap mid-stream
    path = tmp_path / "conv.pcap"
    wrpcap(str(path), pkts)
    back = rdpcap(str(path))
    assert len(back) == len(pkts)
    streams = tcp_streams(back)
    assert streams[("127.0.0.1", 40000, "127.0.0.1", 7999)] == c2s
    assert streams[("127.0.0.1", 7999, "127.0.0.1", 40000)] == s2c
    got = [p for s in streams.values() for p in dissect_stream(s, strict=True)]
    assert sorted(bytes(p) for p in got) == sorted(frames)
    # Scapy's own TCP reassembly, through FlowHeader.tcp_reassemble: whatever the
    # segmentation, every frame comes out once (several frames completed by one segment
    # come chained in one packet). TCPSession itself does not handle wrapping sequence
    # numbers, so these captures start low.
    for mss in (None, 1, 7, 37, 100):
        pkts = tcp_conversation(events, ("127.0.0.1", 40000), ("127.0.0.1", 7999), mss=mss)
        wrpcap(str(path), pkts)
        reassembled: list[bytes] = []
        for p in sniff(offline=str(path), session=TCPSession):
            i = 1
            while (layer := p.getlayer(FlowHeader, nb=i)) is not None:
                reassembled.append(bytes(layer)[:HEADER_SIZE + layer.size])
                i += 1
        assert sorted(reassembled) == sorted(frames), mss


# ---------------------------------------------------------------------------------- live
class _Recorder:
    """Stands in for a StreamWriter: records every write."""

    def __init__(self, writer: asyncio.StreamWriter, events: list[tuple[bool, bytes]]) -> None:
        self._w = writer
        self._events = events

    def write(self, data: bytes) -> None:
        self._events.append((True, bytes(data)))
        self._w.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)


class RecordingEndpoint(RawEndpoint):
    """A raw endpoint that keeps the exact bytes it sent and received, in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.events: list[tuple[bool, bytes]] = []
        self.received: list[tuple[Header, bytes]] = []
        super().__init__(reader, writer)
        self.sock = writer.get_extra_info("sockname")[:2]
        self.peer = writer.get_extra_info("peername")[:2]
        self.writer = _Recorder(writer, self.events)  # type: ignore[assignment]

    async def _pump(self) -> None:
        try:
            while data := await self.reader.read(65536):
                self.events.append((False, data))
                for h, p in self.decoder.feed(data):
                    item = (parse_header(h, max_payload=1 << 24), bytes(p))
                    self.received.append(item)
                    self.frames.put_nowait(item)
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()


def test_live_routers_recorded_traffic_to_pcap_and_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def main() -> tuple[list[RecordingEndpoint], list[bytes]]:
        async with chain(2) as nodes:
            a = await RecordingEndpoint.connect(nodes[0], "A")
            s = await RecordingEndpoint.connect(nodes[1], "S")
            assert isinstance(a, RecordingEndpoint) and isinstance(s, RecordingEndpoint)
            assert (await a.join(FLOW, 0xF << 32)).status is C.JoinStatus.OK
            sent = [(b"plain", 32, 0, 0, 32), (b"geo", 33, Locality.GEOGRAPHY, 5, 32),
                    (b"short-ttl", 34, 0, 0, 3), (b"x" * 3000, 35, Locality.DELAY, 9, 200)]
            for payload, band, lt, lv, ttl in sent:
                s.send(FLOW, payload, band, lt, lv, ttl)
            got = await a.data(4)
            assert [p for _, p in got] == [x[0] for x in sent]
            s.send_control(FLOW.key, C.Leave())  # a stale leave: harmless control traffic
            await a.close()
            await s.close()
            return [a, s], [x[0] for x in sent]

    eps, payloads = asyncio.run(asyncio.wait_for(main(), 30))
    pkts = []
    for ep in eps:
        bind_flow_ports(ep.peer[1])
        pkts += tcp_conversation(ep.events, ep.sock, ep.peer)
    path = tmp_path / "live.pcap"
    wrpcap(str(path), pkts)
    streams = tcp_streams(rdpcap(str(path)))
    for ep in eps:
        up = streams[(*ep.sock, *ep.peer)]
        down = streams[(*ep.peer, *ep.sock)]
        assert up == b"".join(d for c, d in ep.events if c)
        sent_frames = [d for c, d in ep.events if c]  # RawEndpoint writes one frame per write
        dissected_up = dissect_stream(up, strict=True)
        assert len(dissected_up) == len(sent_frames)
        for pkt, raw in zip(dissected_up, sent_frames):
            check_frame(pkt, raw)
        dissected_down = dissect_stream(down, strict=True)
        assert len(dissected_down) == len(ep.received)
        for pkt, (hdr, payload) in zip(dissected_down, ep.received):
            check_frame(pkt, hdr.pack() + payload)
    a = eps[0]
    data = [p for p in dissect_stream(streams[(*a.peer, *a.sock)]) if p.band >= 32]
    assert [p[Raw].load for p in data] == payloads
    assert [(p.band, p.loc_type, p.loc_value, p.ttl) for p in data] == [
        (32, 0, 0, 30), (33, 3, 5, 30), (34, 0, 0, 1), (35, 2, 9, 198)]  # crossed r2, r1
    kinds = [C.MsgType(p[FlowControl].type).name for p in dissect_stream(
        streams[(*a.peer, *a.sock)]) if FlowControl in p]
    assert kinds[:2] == ["HELLO", "JOIN_ACK"]


def _sniffer_available() -> str | None:
    try:
        sniff(iface="lo", timeout=0.05, store=False)
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot sniff here"
        return f"{type(exc).__name__}: {exc}"


def test_live_capture_on_loopback_with_flowlib(tmp_path) -> None:  # type: ignore[no-untyped-def]
    why = _sniffer_available()
    if why is not None:
        pytest.skip(f"cannot sniff on lo here ({why})")
    captured: list[Any] = []
    lock = threading.Lock()
    ports: set[int] = set()

    def keep(pkt: Any) -> None:
        with lock:
            captured.append(pkt)

    def mine(pkt: Any) -> bool:
        return TCP in pkt and (pkt[TCP].sport in ports or pkt[TCP].dport in ports)

    def streams() -> dict[Any, bytes]:
        with lock:
            return tcp_streams(list(captured))

    messages = [b"m%d" % i for i in range(4)]

    async def main() -> tuple[int, int, int]:
        async with chain(2) as nodes:
            r1, r2 = (n.tcp_address[1] for n in nodes)
            ports.update((r1, r2))
            bind_flow_ports(r1, r2)
            # r1 dialled r2: on r2's side that link's address is r1's ephemeral port
            link = next(lk for lk in nodes[1].core.links.values() if lk.peer_name == "r1")
            r1_out = int(link.address.rsplit(":", 1)[1])
            started = threading.Event()
            sniffer = AsyncSniffer(iface="lo", lfilter=mine, prn=keep, store=False,
                                   started_callback=started.set)
            sniffer.start()
            try:
                assert await asyncio.to_thread(started.wait, 5)
                rx = await flowlib.connect([f"127.0.0.1:{r1}"], name="rx")
                tx = await flowlib.connect([f"127.0.0.1:{r2}"], name="tx")
                flow = await tx.create()
                listener = await rx.listen(flow, "32-35")
                for i, m in enumerate(messages):
                    await tx.send(flow, m, band=32 + i)
                for m in messages:
                    assert (await within(listener.get())).payload == m
                # wait until the capture holds the data on the receiver's connection; a
                # raw-socket sniffer in Python can drop packets on a loaded machine, which
                # says nothing about the router or the dissector: then skip, saying so
                try:
                    await until(lambda: all(
                        any(m in s for (src, sp, dst, dp), s in streams().items() if sp == r1)
                        for m in messages), 10)
                except (TimeoutError, AssertionError):
                    capture_incomplete.append(True)
                await rx.close()
                await tx.close()
            finally:
                await asyncio.to_thread(sniffer.stop)
            return r1, r2, r1_out

    capture_incomplete: list[bool] = []
    for _attempt in range(3):  # a sniffer that missed packets tries again, afresh
        capture_incomplete.clear()
        with lock:
            captured.clear()
        ports.clear()
        r1, r2, r1_out = asyncio.run(asyncio.wait_for(main(), 30))
        if not capture_incomplete:
            break
    else:
        pytest.skip("the loopback sniffer missed packets three times (machine under load); "
                    "the recorded-traffic pcap test covers the dissector deterministically")
    path = tmp_path / "lo.pcap"
    with lock:
        wrpcap(str(path), captured)
    back = rdpcap(str(path))
    assert all(Ether in p and IP in p for p in back)
    total = 0
    data_on_router_link = []
    seen_hello = 0
    for (_src, sp, _dst, dp), stream in tcp_streams(back).items():
        pkts = dissect_stream(stream)
        frames = pkts if not pkts or not isinstance(pkts[-1], Raw) else pkts[:-1]
        pos = 0
        for pkt in frames:
            raw = stream[pos:pos + HEADER_SIZE + pkt.size]
            check_frame(pkt, raw)
            pos += len(raw)
            total += 1
        if (sp, dp) == (r2, r1_out):
            data_on_router_link += [p[Raw].load for p in frames if p.band >= 32]
        elif r1_out not in (sp, dp):  # application connections were captured from the start
            assert C.MsgType(frames[0][FlowControl].type) is C.MsgType.HELLO
            seen_hello += 1
    assert seen_hello == 4  # rx and tx, both directions
    assert total >= 10
    assert data_on_router_link == messages  # the data crossed the r2 -> r1 router link
    udp_pkt = Ether() / IP() / UDP(sport=40000, dport=r1) / bytes(
        FlowHeader(band=40) / b"dgram")
    assert FlowHeader in Ether(bytes(udp_pkt))


def test_link_credentials_and_auth_proof_dissect_like_linkauth() -> None:
    from flowrouter.tools.scapy_layer import FlowAuthProof, FlowLinkCredentials
    from flowrouter.wire.linkauth import KeyRing, LinkAuthenticator, parse_hello_credentials

    ring = KeyRing({"site": bytes(range(32))})
    a = LinkAuthenticator(ring, my_name="r1", encrypt=True)
    b = LinkAuthenticator(ring, my_name="r2")
    creds = FlowLinkCredentials(a.hello_credentials())
    ref = parse_hello_credentials(a.hello_credentials())
    assert (creds.version, creds.nonce, creds.ephemeral, creds.key_id) == (
        3, ref.nonce, a.my_ephemeral, b"site")
    assert creds.flags.encrypt and not creds.flags.require_endpoints
    body = b.on_peer_hello("r1", 1, a.hello_credentials())
    proof = FlowAuthProof(body)
    assert (proof.version, proof.kind, len(proof.proof)) == (3, 2, 32)
    assert bytes(FlowLinkCredentials(nonce=ref.nonce, ephemeral=a.my_ephemeral,
                                     key_id=b"site", flags=1)) == a.hello_credentials()
