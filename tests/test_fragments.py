"""Large messages: fragmented by flowlib senders, reassembled by flowlib receivers, over real
routers on loopback (seed 000 ch. 5.1), plus the reassembler's bounds and the wire format as
a raw endpoint sees it.

Every test runs its own loop under a hard ``wait_for`` bound and synchronises on received
messages and notices, never on sleeps.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import struct
import tracemalloc
from typing import TypeVar

import pytest

import flowlib
from flowlib import FaultKind, MessageTooLarge
from flowlib.fragment import (
    ESCAPE_PREFIX,
    FRAGMENT_COST,
    FRAGMENT_HEADER_SIZE,
    KIND_FRAGMENT,
    MAGIC,
    PARTIAL_COST,
    FragmentDropped,
    Reassembler,
    fragment_header,
    iter_fragments,
)
from flowrouter.net.runtime import RouterNode
from flowrouter.wire.bands import BAND_OVERFLOW

from .rawep import RawEndpoint, addr, chain, get, run

T = TypeVar("T")
LSID = 0x10






def drops(*nodes: RouterNode) -> dict[str, int]:
    """Drops that would lose fragments on their way (not e.g. ``drop.no-receivers`` at a core
    with no other member, which is the tree working as designed)."""
    out: dict[str, int] = {}
    for node in nodes:
        for k, v in node.core.counters.items():
            if k in ("drop.link-congested", "drop.too-big-for-link", "drop.ttl") and v:
                out[f"{node.config.name}:{k}"] = v
    return out


# ================================================================== end to end
def test_ten_megabytes_across_three_routers() -> None:
    """A 10 MB message from r3's side reaches receivers behind one, two and three routers
    intact, and the routers dropped nothing."""
    async def main() -> None:
        async with chain(3) as (r1, r2, r3):
            async with (await flowlib.connect(addr(r1), name="rx1") as rx1,
                        await flowlib.connect(addr(r2), name="rx2") as rx2,
                        await flowlib.connect(addr(r3), name="tx") as tx):
                flow = await tx.create()
                l1 = await rx1.listen(flow, [40])
                l2 = await rx2.listen(flow, [40, BAND_OVERFLOW])
                big = os.urandom(10 * 1024 * 1024)
                assert len(big) > tx.max_payload  # so it must be fragmented
                await tx.send(flow, b"before", band=40)
                await tx.send(flow, big, band=40)
                await tx.send(flow, b"after", band=40)
                for lst in (l1, l2):
                    got = [await get(lst, 20) for _ in range(3)]
                    assert [m.payload for m in (got[0], got[2])] == [b"before", b"after"]
                    m = got[1]
                    assert m.band == 40 and len(m.payload) == len(big)
                    assert hashlib.sha256(m.payload).digest() == hashlib.sha256(big).digest()
                    assert isinstance(m.payload, bytes)
                # r3 -> r2 -> r1: two router hops between the sender's router and rx1
                assert m.ttl == 32 - 2
                count = -(-len(big) // (tx.max_payload - FRAGMENT_HEADER_SIZE))
                assert rx1.counters["fragments.received"] == count
                assert rx1.counters["fragments.messages"] == 1
                assert tx.counters["fragments.sent-messages"] == 1
                assert rx1.reassembler.used == 0 and not rx1.reassembler.partials
                assert drops(r1, r2, r3) == {}
                assert l2.empty()  # no overflow notice
    run(main())


def test_interleaved_senders_and_plain_messages() -> None:
    """Three senders on three routers send large messages at the same time (fragments
    interleave on every link) mixed with plain ones; every message arrives whole."""
    async def main() -> None:
        async with chain(3, max_payload=8192) as (r1, r2, r3):
            async with await flowlib.connect(addr(r1), name="rx") as rx:
                txs = [await flowlib.connect(addr(r), name=f"tx{i}")
                       for i, r in enumerate((r1, r2, r3))]
                try:
                    flow = await rx.create()
                    lst = await rx.listen(flow, "data", size=10_000)
                    sent: dict[bytes, int] = {}

                    async def sender(i: int, tx: flowlib.FlowClient) -> None:
                        for j in range(3):
                            body = bytes([i, j]) + os.urandom(300_000 + 7919 * i + j)
                            sent[hashlib.sha256(body).digest()] = 33 + i
                            await tx.send(flow, body, band=33 + i)
                            small = f"plain {i}.{j}".encode()
                            sent[hashlib.sha256(small).digest()] = 33 + i
                            tx.send_nowait(flow, small, band=33 + i)

                    await asyncio.gather(*(sender(i, tx) for i, tx in enumerate(txs)))
                    for _ in range(len(sent)):
                        m = await get(lst, 20)
                        digest = hashlib.sha256(m.payload).digest()
                        assert sent.pop(digest) == m.band
                    assert not sent
                    assert rx.counters["fragments.messages"] == 9
                    assert rx.reassembler.peak >= 2  # messages of several senders were in flight
                    assert drops(r1, r2, r3) == {}
                finally:
                    for tx in txs:
                        await tx.close()
    run(main())


def test_wire_format_seen_by_a_raw_endpoint() -> None:
    """Plain messages stay unprefixed, a payload that starts with the magic is escaped, and
    fragments carry the documented 37-byte header."""
    async def main() -> None:
        async with chain(1, max_payload=4096) as (r1,):
            raw = await RawEndpoint.connect(r1, "raw")
            async with (await flowlib.connect(addr(r1), name="tx") as tx,
                        await flowlib.connect(addr(r1), name="rx") as rx):
                flow = await tx.create()
                assert (await raw.join(flow, 1 << 32)).status.name == "OK"
                lst = await rx.listen(flow, [32])
                tx.send_nowait(flow, b"plain")
                tricky = MAGIC + b"\x01 looks like a fragment but is not"
                tx.send_nowait(flow, tricky)
                body = bytes(range(256)) * 40  # 10240 bytes > 4096: three fragments
                tx.send_nowait(flow, body)
                frames = await raw.data(5)
                payloads = [p for _, p in frames]
                assert payloads[0] == b"plain"
                assert payloads[1] == ESCAPE_PREFIX + tricky
                st = struct.Struct("!4sBQIIIIQ")
                headers = [st.unpack_from(p) for p in payloads[2:]]
                assert [h[0] for h in headers] == [MAGIC] * 3
                assert [h[1] for h in headers] == [KIND_FRAGMENT] * 3
                assert len({h[2] for h in headers}) == 1  # one origin
                assert len({h[3] for h in headers}) == 1  # one message id
                assert [h[4] for h in headers] == [0, 1, 2]  # index
                assert {h[5] for h in headers} == {3}  # count
                assert {h[6] for h in headers} == {4096 - 37}  # fragment size
                assert {h[7] for h in headers} == {len(body)}  # total length
                assert b"".join(p[37:] for p in payloads[2:]) == body
                # and a flowlib receiver sees exactly what was sent
                assert [(await get(lst)).payload for _ in range(3)] == [b"plain", tricky, body]
                # a forced single fragment, and a refused fragmentation
                tx.send_nowait(flow, b"tiny", fragment=True)
                assert (await get(lst)).payload == b"tiny"
                (_, p), = await raw.data(1)
                assert p.startswith(MAGIC + bytes([KIND_FRAGMENT])) and p.endswith(b"tiny")
                with pytest.raises(MessageTooLarge) as info:
                    tx.send_nowait(flow, body, fragment=False)
                assert info.value.what == "max_payload" and info.value.limit == 4096
            await raw.close()
    run(main())


def test_max_message_size_at_sender_and_receiver() -> None:
    async def main() -> None:
        async with chain(2, max_payload=4096) as (r1, r2):
            async with (await flowlib.connect(addr(r2), name="tx",
                                              max_message_size=100_000) as tx,
                        await flowlib.connect(addr(r1), name="rx",
                                              max_message_size=50_000) as rx):
                flow = await tx.create()
                with pytest.raises(MessageTooLarge) as info:
                    await tx.send(flow, bytes(100_001))
                err = info.value
                assert (err.size, err.limit, err.what) == (100_001, 100_000, "max_message_size")
                assert "max_message_size" in str(err)
                with pytest.raises(MessageTooLarge):
                    tx.send_nowait(flow, bytes(100_001))
                data = await rx.listen(flow, [32])
                notes = await rx.listen(flow, "overflow")
                await tx.send(flow, bytes(80_000))  # allowed to send, too big to receive
                await tx.send(flow, b"small after")
                assert (await get(data)).payload == b"small after"
                note = await get(notes)
                assert note.is_overflow
                fault = note.fault()
                assert fault.kind is FaultKind.OVERFLOW and fault.origin == "rx"
                assert fault.extra["reason"] == "too-large"
                assert fault.extra["bytes"] == "80000" and fault.extra["flow"] == str(flow)
                assert notes.empty()  # one notice, not one per fragment
                assert rx.counters["fragments.too-large"] == 1
                assert rx.reassembler.used == 0
    run(main())


def test_incomplete_message_times_out_with_a_notice() -> None:
    """A sender that stops half-way: the partial message is dropped after the reassembly
    time-out, counted and reported; memory is released; a later complete copy arrives."""
    async def main() -> None:
        async with chain(1) as (r1,):
            raw = await RawEndpoint.connect(r1, "raw")
            async with await flowlib.connect(addr(r1), name="rx",
                                             reassembly_timeout=0.2) as rx:
                flow = await rx.create()
                data = await rx.listen(flow, [32])
                notes = await rx.listen(flow, [BAND_OVERFLOW])
                body = os.urandom(5000)
                frags = list(iter_fragments(memoryview(body), 0xABC, 7, 1000))
                for fh, chunk in frags[:3]:
                    raw.send(flow, fh + bytes(chunk))
                note = await get(notes, 5)
                fault = note.fault()
                assert fault.extra["reason"] == "reassembly-timeout"
                assert fault.extra["fragments"] == "3/5"
                assert fault.extra["sender"] == f"{0xABC:016x}" and fault.extra["message"] == "7"
                assert rx.counters["fragments.reassembly-timeout"] == 1
                assert rx.reassembler.used == 0 and data.empty()
                # the whole message again (same id, out of order): reassembled
                for fh, chunk in reversed(frags):
                    raw.send(flow, fh + bytes(chunk))
                assert (await get(data)).payload == body
            await raw.close()
    run(main())


def test_reassembly_memory_is_bounded() -> None:
    """Memory is charged as data arrives: a message whose next fragment would take the
    reassembly memory over the limit is dropped there (counted, reported, released), and
    the rest of it is ignored quietly."""
    async def main() -> None:
        async with chain(1) as (r1,):
            raw = await RawEndpoint.connect(r1, "raw")
            async with await flowlib.connect(addr(r1), name="rx",
                                             max_reassembly_bytes=150_000) as rx:
                flow = await rx.create()
                data = await rx.listen(flow, [32, BAND_OVERFLOW])
                a = list(iter_fragments(memoryview(os.urandom(100_000)), 1, 1, 30_000))
                b_body = os.urandom(100_000)
                b = list(iter_fragments(memoryview(b_body), 2, 1, 30_000))
                for fh, chunk in a[:3]:  # 90 000 bytes held
                    raw.send(flow, fh + bytes(chunk))
                for fh, chunk in b[:2]:  # 60 000 more would pass 150 000: dropped there
                    raw.send(flow, fh + bytes(chunk))
                note = await get(data)
                assert note.is_overflow and note.fault().extra["reason"] == "memory"
                assert rx.counters["fragments.memory"] == 1
                assert rx.reassembler.drops["memory"] == 1
                held = rx.reassembler.used
                assert 90_000 < held < 150_000 and len(rx.reassembler) == 1
                # the rest of the dropped message is ignored quietly
                for fh, chunk in b[2:]:
                    raw.send(flow, fh + bytes(chunk))
                raw.send(flow, b"marker")
                assert (await get(data)).payload == b"marker"
                assert rx.counters["fragments.memory"] == 1 and rx.reassembler.used == held
            await raw.close()
    run(main())


def test_sync_facade_sends_large_messages() -> None:
    from .test_flowlib_facades import RouterThread  # routers on their own loop thread

    with RouterThread() as (r0, r1):
        with flowlib.flow_connect([addr(r1)], name="sync-rx") as rx, \
                flowlib.flow_connect([addr(r0)], name="sync-tx") as tx:
            flow = tx.flow_create()
            q = rx.flow_addlistener(flow, [32])
            body = os.urandom(tx.client.max_payload * 3 + 5)
            tx.flow_send(flow, body)
            msg = rx.flow_get_blocked(q, timeout=10)
            assert msg is not None and msg.payload == body


# ================================================================== the reassembler alone
def _frags(body: bytes, size: int, origin: int = 9, msg_id: int = 1) -> list[bytes]:
    return [fh + bytes(chunk) for fh, chunk in iter_fragments(memoryview(body), origin, msg_id,
                                                                size)]


def _held(*chunks: int, ahead: int = 0) -> int:
    """What a message holding *chunks* bytes in order and *ahead* fragments out of order is
    charged (the in-order buffer as allocated)."""
    buf = bytearray()
    for n in chunks:
        buf += bytes(n)
    return PARTIAL_COST + buf.__sizeof__() + FRAGMENT_COST * ahead


def test_reassembler_orders_dedupes_and_forgets() -> None:
    r = Reassembler(max_message_size=10_000, max_bytes=20_000, timeout=5.0)
    body = os.urandom(2500)
    frags = _frags(body, 1000)
    assert len(frags) == 3
    assert r.feed(b"k" * 16, 40, frags[2], 0.0) is None
    assert r.feed(b"k" * 16, 40, frags[2], 0.1) is None  # duplicate
    assert r.used == _held(ahead=1) + 500  # the fragment past the gap, held alone
    assert r.feed(b"k" * 16, 40, frags[0], 0.2) is None
    assert r.used == _held(1000, ahead=1) + 500
    assert r.feed(b"k" * 16, 40, frags[1], 0.3) == body
    assert r.used == 0 and not r.partials
    # a late copy of the finished message (a resend after failover) is ignored
    for f in frags:
        assert r.feed(b"k" * 16, 40, f, 0.4) is None
    assert not r.partials
    # the same id on another band or flow is another message
    assert r.feed(b"j" * 16, 40, frags[0], 0.5) is None and len(r) == 1


def test_reassembler_rejects_bad_fragments() -> None:
    r = Reassembler(max_message_size=10_000, max_bytes=20_000, timeout=5.0)
    key = b"k" * 16
    good = _frags(os.urandom(2500), 1000)
    with pytest.raises(FragmentDropped, match="shorter"):
        r.feed(key, 40, good[0][:20], 0)
    bad_count = fragment_header(9, 1, 0, 2, 1000, 2500) + bytes(1000)
    with pytest.raises(FragmentDropped) as info:
        r.feed(key, 40, bad_count, 0)
    assert info.value.reason == "bad-fragment"
    bad_index = fragment_header(9, 1, 3, 3, 1000, 2500) + bytes(1000)
    with pytest.raises(FragmentDropped):
        r.feed(key, 40, bad_index, 0)
    short = good[0][:-1]
    with pytest.raises(FragmentDropped, match="carries 999 bytes"):
        r.feed(key, 40, short, 0)
    r.feed(key, 40, good[0], 0)
    other_size = fragment_header(9, 1, 1, 5, 500, 2500) + bytes(500)
    with pytest.raises(FragmentDropped, match="disagrees"):
        r.feed(key, 40, other_size, 0)
    assert len(r) == 1  # the good partial survived the bad fragments
    assert r.drops["bad-fragment"] == 5
    # limits: a claim over max_message_size, or one the memory could not hold even alone
    # (10 000 bytes in 1-byte fragments), is refused at its first fragment
    with pytest.raises(FragmentDropped) as info:
        r.feed(key, 40, _frags(bytes(10_001), 5000, msg_id=2)[0], 0)
    assert info.value.reason == "too-large"
    with pytest.raises(FragmentDropped) as info:
        r.feed(key, 40, _frags(bytes(10_000), 1, msg_id=5)[7], 0)
    assert info.value.reason == "too-large" and "could need" in info.value.detail
    assert r.used == _held(1000) and r.drops["too-large"] == 2
    r.feed(key, 40, _frags(bytes(10_000), 5000, msg_id=3)[0], 0)
    r.feed(key, 40, _frags(bytes(10_000), 5000, msg_id=6)[0], 0)
    before = r.used
    assert before == _held(1000) + 2 * _held(5000)
    # a message whose next fragment would take the memory over the limit is dropped there
    # and released; its later fragments are ignored quietly
    big = _frags(bytes(9000), 1000, msg_id=4)
    taken = 0
    with pytest.raises(FragmentDropped) as info:
        for f in big:
            r.feed(key, 40, f, 0)
            taken += 1
    assert info.value.reason == "memory" and 3 <= taken < len(big) and r.used == before
    assert all(r.feed(key, 40, f, 0) is None for f in big) and r.used == before
    # expiry by inactivity: the timer restarts at every fragment
    r.feed(key, 40, good[1], 4.0)
    expired = r.expire(6.0)
    assert [(e.msg_id, e.received, e.count) for e in expired] == [(3, 1, 2), (6, 1, 2)]
    assert r.used == _held(1000, 1000)
    assert [e.msg_id for e in r.expire(9.0)] == [1] and r.used == 0
    assert r.drops["reassembly-timeout"] == 3 and r.drops["memory"] == 1


def test_claims_of_huge_messages_cost_nothing_until_data_arrives() -> None:
    """Issue 26: two 38-byte first fragments, each claiming a 64 MiB message in 1-byte
    fragments, cost every listening client 256 MiB (a buffer of the claimed total and a
    per-fragment table sized from the claimed count, at the first fragment). Now such a
    claim is refused at once and nothing is allocated; a claim that fits is charged only
    for what arrived."""
    r = Reassembler()  # the defaults: 64 MiB messages, 128 MiB of reassembly memory
    total = 64 * 1024 * 1024
    tracemalloc.start()
    try:
        for origin in (1, 2):
            frame = fragment_header(origin, 1, 0, total, 1, total) + b"x"
            assert len(frame) == 38
            with pytest.raises(FragmentDropped) as info:
                r.feed(b"k" * 16, 40, frame, 0.0)
            assert info.value.reason == "too-large"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert r.used == 0 and not r.partials and r.drops["too-large"] == 2
    # a claim that fits (64 MiB in 64 KiB fragments) holds only its first fragment
    fsize = 64 * 1024
    first = fragment_header(3, 1, 0, total // fsize, fsize, total) + bytes(fsize)
    assert r.feed(b"k" * 16, 40, first, 0.0) is None
    assert r.used < 2 * fsize and r.peak_used == r.used


def test_reassembly_accounting_covers_what_is_allocated() -> None:
    """Many small incomplete messages (the bookkeeping, not the data, is the cost): what
    the reassembler charges covers what Python allocated for them, so the limit holds."""
    r = Reassembler(max_bytes=1 << 30)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for i in range(2000):
            r.feed(i.to_bytes(16, "big"), 40, fragment_header(i, i, 1, 3, 10, 30)
                   + bytes(10), 0.0)
            r.feed(i.to_bytes(16, "big"), 40, fragment_header(i, i, 0, 3, 10, 30)
                   + bytes(10), 0.0)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(r) == 2000
    assert r.used >= held - base, (r.used, held - base)
    small = Reassembler(max_bytes=100 * PARTIAL_COST)
    with pytest.raises(FragmentDropped) as info:
        for i in range(1000):
            small.feed(b"k" * 16, 40, fragment_header(1, i, 0, 2, 10, 20) + bytes(10), 0.0)
    assert info.value.reason == "memory" and small.used <= small.max_bytes
    assert len(small) < 100
