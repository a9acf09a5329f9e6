"""Datagram links for applications (issue 29): flowlib reaches its router over UDP
(``udp://host:port``, the router's ``app_udp`` listener) with the TCP link's API, failover
and link keys, and the listener refuses what is not an application. Real sockets on
loopback; the framing alone sans-I/O. Liveness, loss, forgery and thin paths, with a relay
on the path, are in test_dgram_onpath.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import flowlib
from flowlib.checks import is_datagram, parse_router_address, router_transport
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.appdgram import (
    MAX_PAYLOAD,
    PREFIX_SIZE,
    DatagramPacker,
    DatagramSequence,
    frame_spans,
    open_datagram,
    prefix,
    split_frames,
)
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import MalformedFrame, pack_header
from flowrouter.wire.linkrecords import LinkCipher

from .dgramnet import KEY, arrives_from_tcp, one_router, refused, udp
from .rawep import addr, core_and_edge, get, run, until, within


# ---------------------------------------------------------------- the framing, sans-I/O
def test_datagrams_carry_whole_frames_numbered() -> None:
    frames = [pack_header(b"k" * 16, n, 32) + bytes(n) for n in (0, 10, 30_000, 40_000)]
    packer = DatagramPacker()
    grams = packer.pack(frame_spans([f[:24] for f in frames[:1]] + [frames[0][24:]]
                                    + frames[1:]))
    assert len(grams) == 2 and all(len(g) <= 65507 for g in grams)
    seqs, got = [], b""
    for g in grams:
        seq, body = split_frames(g)
        seqs.append(seq)
        got += bytes(body)
    assert seqs == [1, 2] and got == b"".join(frames)
    # anything but a prefix and whole frames is refused as a whole
    for bad in (b"", grams[0][:PREFIX_SIZE + 10], grams[0][:-1], b"XX" + grams[0][2:],
                grams[0] + b"\0"):
        with pytest.raises(MalformedFrame):
            split_frames(bad)


def test_gaps_in_datagram_numbers_are_counted() -> None:
    seq = DatagramSequence()
    assert [seq.seen(n) for n in (1, 2, 5, 6, 4, 9)] == [0, 0, 2, 0, 0, 2]
    assert (seq.lost, seq.late, seq.highest) == (3, 1, 9)
    wrap = DatagramSequence()
    assert [wrap.seen(n) for n in (0xFFFFFFFE, 0xFFFFFFFF, 2)] == [0, 0, 1]


def test_sealed_datagrams_cannot_be_forged_altered_replayed_or_sent_in_clear() -> None:
    key_a, key_b = os.urandom(32), os.urandom(32)
    tx, rx = LinkCipher(key_a, key_b, ordered=False), LinkCipher(key_b, key_a, ordered=False)
    packer = DatagramPacker(rekey_interval=10.0)
    packer.seal_with(tx, 0.0)
    data = pack_header(b"k" * 16, 5, 32) + b"hello"
    first, second = packer.pack([data]), packer.pack([data])
    assert open_datagram(second[0], rx)[1].tobytes() == data
    assert open_datagram(first[0], rx)[1].tobytes() == data  # late is fine, once
    for bad, why in ((first[0], "bad-record"),  # a replay
                     (first[0][:-1] + bytes([first[0][-1] ^ 1]), "bad-record"),  # altered
                     (prefix(9) + data, "unsealed")):  # injected in clear
        with pytest.raises(MalformedFrame) as info:
            open_datagram(bad, rx)
        assert info.value.reason == why
    # handshake repeats may still come in clear
    body = C.Hello(1, C.Role.ROUTER, "r", 4096, 0).encode()
    hello = pack_header(LINK_LOCAL_FLOW.key, len(body), 0) + body
    assert open_datagram(prefix(10) + hello, rx)[1].tobytes() == hello
    # the sending key moves on with the clock; the receiver follows
    later = packer.pack([data], 11.0)
    assert tx.tx_generation == 1 and open_datagram(later[0], rx)[1].tobytes() == data
    assert rx.rx_generation == 1


def test_router_addresses_name_their_transport() -> None:
    assert router_transport("udp://127.0.0.1:7011") == ("udp", "127.0.0.1:7011")
    assert router_transport("127.0.0.1:7001") == ("tcp", "127.0.0.1:7001")
    assert router_transport("TCP://[::1]:7001") == ("tcp", "[::1]:7001")
    assert is_datagram("udp://h:1") and not is_datagram(("h", 1))
    assert parse_router_address("udp://10.0.0.1:7011") == ("10.0.0.1", 7011)
    with pytest.raises(ValueError, match="scheme"):
        router_transport("quic://h:1")


# ---------------------------------------------------------------- real sockets
@contextlib.asynccontextmanager
async def _clients(node: RouterNode, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    """A datagram client and a TCP client of *node*."""
    sd = str(tmp_path)
    async with (await flowlib.connect(udp(node), name="dg", state_dir=sd) as dg,
                await flowlib.connect(addr(node), name="tcp", state_dir=sd) as tc):
        yield dg, tc


def test_a_datagram_client_has_the_tcp_api(tmp_path: Path) -> None:
    """Listen, send, large messages (fragments in datagrams), both directions, with a TCP
    client on the same flow."""

    async def main() -> None:
        node = one_router()
        await node.start()
        try:
            async with _clients(node, tmp_path) as (dg, tc):
                assert dg.connected and dg.address == udp(node)
                assert dg.max_payload <= MAX_PAYLOAD
                flow = await tc.create()
                rx_dg = await dg.listen(flow, "data")
                rx_tc = await tc.listen(flow, "data")
                big = os.urandom(300_000)
                await tc.send(flow, b"to the datagram client")
                await tc.send(flow, big)
                assert (await get(rx_dg)).payload == b"to the datagram client"
                assert (await get(rx_dg)).payload == big
                await dg.send(flow, big[:100_000], band=33)
                await dg.send(flow, b"back")
                assert (await get(rx_tc)).payload == big[:100_000]
                assert (await get(rx_tc)).payload == b"back"
                assert dg.counters["dgram.received"] > 0 and dg.counters["dgram.lost"] == 0
                assert node.core.counters["appdgram.lost"] == 0
                # liveness: echoes go both ways and keep the link up
                assert node.appdgram is not None and len(node.appdgram.links) == 1
                assert node.status()["app_udp"] == {"address": udp(node)[6:], "links": 1}
            # closing leaves the flow politely; the router forgets the link
            await within(until(lambda: not node.appdgram.links))  # type: ignore[union-attr]
        finally:
            await node.stop()
    run(main())


def test_a_datagram_clients_frames_go_through_the_forwarding_engine(tmp_path: Path) -> None:
    """After its handshake, an application's datagrams are forwarded by the fast path in
    one pass each (as a TCP read is), not frame by frame through the core; in order."""
    async def main() -> None:
        node = one_router()
        await node.start()
        try:
            async with _clients(node, tmp_path) as (dg, tc):
                flow = await tc.create()
                rx_tc = await tc.listen(flow, "data")
                await dg.send(flow, b"warm")  # the flow's first frame may be the core's
                assert (await get(rx_tc)).payload == b"warm"
                fast = node.fast
                calls = fast.stats["calls"] if fast is not None else 0
                forwarded = node.core.counters["forwarded"]
                for i in range(50):
                    await dg.send(flow, i.to_bytes(2, "big"))
                for i in range(50):
                    assert (await get(rx_tc)).payload == i.to_bytes(2, "big")
                assert node.core.counters["forwarded"] - forwarded >= 50
                if fast is not None:
                    assert fast.stats["calls"] > calls  # the engine took them
        finally:
            await node.stop()
    run(main())






def test_datagram_links_fail_over_to_the_next_router(tmp_path: Path) -> None:
    """Two routers; a listener on udp:// addresses of both loses its router and carries on
    at the other: the same failover as over TCP."""

    async def main() -> None:
        async with core_and_edge(app_udp="127.0.0.1:0", liveness_interval=0.2,
                                 dead_after=0.8) as (core, edge):
            sd = str(tmp_path)
            events: list[flowlib.FailoverEvent] = []
            rx = await flowlib.connect([udp(edge), udp(core)], name="rx", state_dir=sd,
                                       liveness_interval=0.2, dead_after=0.8,
                                       on_failover=events.append)
            tx = await flowlib.connect(addr(core), name="tx", state_dir=sd)
            flow = await tx.create()
            lst = await rx.listen(flow, 32)
            await tx.send(flow, b"one")
            assert (await get(lst)).payload == b"one"
            await edge.stop()
            await within(until(lambda: rx.failovers == 1 and rx.connected))
            assert rx.address == udp(core) and events[0].new_address == udp(core)
            await tx.send(flow, b"two")
            assert (await get(lst)).payload == b"two"
            await rx.close()
            await tx.close()
    run(main())


def test_datagram_links_take_link_keys_and_seal_when_asked(tmp_path: Path) -> None:
    """With link keys a datagram link is taken only sealed: encryption asked for by the
    application (or by the router, link_encrypt); one that neither end seals is refused as
    udp-unsealed, as the routers' own UDP links are."""

    async def main() -> None:
        sd = str(tmp_path)
        for router_asks in (False, True):
            node = one_router(link_keys={"app": KEY}, link_auth_endpoints=True,
                              link_encrypt=router_asks)
            await node.start()
            try:
                with pytest.raises(flowlib.ConnectError, match="authenticate"):
                    await flowlib.connect(udp(node), name="anon", state_dir=sd, timeout=2)
                if not router_asks:
                    with pytest.raises(flowlib.ConnectError, match="encryption"):
                        await flowlib.connect(udp(node), name="plain", state_dir=sd,
                                              link_key=("app", KEY), timeout=2)
                    assert node.core.counters["refused.udp-unsealed"] == 1
                async with await flowlib.connect(udp(node), name="alice", state_dir=sd,
                                                 link_key=("app", KEY),
                                                 encrypt=not router_asks) as alice:
                    assert alice.encrypted
                    # the router lists alice's datagram link as sealed (once our AUTH is in)
                    await within(until(
                        lambda n=node: len(n.status()["link_auth"]["sealed_links"]) == 1))
                    flow = await alice.create()
                    lst = await alice.listen(flow, 32)
                    await arrives_from_tcp(node, flow, lst, b"x" * 200_000, name="bob",
                                           state_dir=sd, link_key=("app", KEY))
                    await alice.send(flow, b"from alice")
                assert node.core.counters["auth.ok"] >= 2
                assert not [k for k in node.core.counters
                            if k.startswith("appdgram.refused")]
            finally:
                await node.stop()
    run(main())


def test_the_app_listener_refuses_routers_and_garbage(tmp_path: Path) -> None:
    """Only applications link on app_udp; a datagram that is not whole frames is dropped
    alone (the link beside it carries on); garbage from a new address costs no state."""

    async def main() -> None:
        node = one_router()
        await node.start()
        try:
            assert node.appdgram is not None
            host, port = node.appdgram.address
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.connect((host, port))
            sock.send(b"\x00" * 64)  # garbage: no link for it
            body = C.Hello(77, C.Role.ROUTER, "sneaky", 4096, 0x10).encode()
            hello = pack_header(LINK_LOCAL_FLOW.key, len(body), 0) + body
            sock.send(struct.pack("!2sBBI", b"Fd", 1, 0, 1) + hello)
            await within(until(lambda: refused(node) >= 1))
            await within(until(lambda: not node.appdgram.links  # type: ignore[union-attr]
                                and node.core.counters["appdgram.no-hello"] == 0
                                and not any(lk.role is C.Role.ROUTER
                                            for lk in node.core.links.values())))
            sock.close()
            async with await flowlib.connect(udp(node), name="app",
                                             state_dir=str(tmp_path)) as app:
                flow = await app.create()
                lst = await app.listen(flow, 32)
                other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                other.sendto(struct.pack("!2sBBI", b"Fd", 1, 0, 9) + b"\x01" * 30,
                             (host, port))
                other.close()
                await arrives_from_tcp(node, flow, lst, b"still here", name="tx",
                                       state_dir=str(tmp_path))
            assert refused(node) >= 2
        finally:
            await node.stop()
    run(main())
