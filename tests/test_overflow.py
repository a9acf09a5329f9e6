"""Receive-queue overflow notices on band 18 (seed 002, 4.1.3): rate-limited by count (the
prototype's one per 2000 drops, configurable) and by a minimum interval, delivered to the
flow's listeners on the overflow band, carrying the flow, the listener and the count.

Real router on loopback; a "witness" listener with a big queue tells the test when every
message has reached the client (one TCP link keeps them in order), so nothing sleeps.
"""

from __future__ import annotations

from typing import TypeVar

import pytest

import flowlib
from flowlib import FaultKind, Message
from flowlib.notices import NoticeLimiter
from flowlib.queue import Listener
from flowrouter.wire.bands import BAND_OVERFLOW

from .rawep import addr, chain, get, run

T = TypeVar("T")






def drain(listener: Listener) -> list[Message]:
    return [listener.get_nowait() for _ in range(len(listener))]


async def flood(tx: flowlib.FlowClient, flow: flowlib.FlowID, witness: Listener, n: int,
                band: int = 32) -> None:
    """Send *n* messages and wait until the receiving client has all of them."""
    for i in range(n):
        await tx.send(flow, b"m%d" % i, band=band)
    for _ in range(n):
        await get(witness)


# ================================================================== count-based rate
@pytest.mark.parametrize("every,drops,expected", [
    (100, 1000, [1] + [100] * 9),  # notices at drops 1, 101, ..., 901
    (2000, 4001, [1, 2000, 2000]),  # the prototype's spacing: drops 1, 2001, 4001
])
def test_notices_at_the_configured_rate(every: int, drops: int, expected: list[int]) -> None:
    async def main() -> None:
        async with chain(1) as (r1,):
            async with (await flowlib.connect(addr(r1), name="rx", overflow_notice_every=every,
                                              overflow_notice_interval=0) as rx,
                        await flowlib.connect(addr(r1), name="tx") as tx):
                flow = await tx.create()
                small = await rx.listen(flow, [32], size=5, name="slow")
                notes = await rx.listen(flow, "overflow", size=100)
                witness = await rx.listen(flow, [32], size=drops + 10)
                await flood(tx, flow, witness, drops + 5)
                assert small.dropped == drops and len(small) == 5
                got = [m.fault() for m in drain(notes)]
                assert [int(f.extra["dropped"]) for f in got] == expected
                assert [int(f.extra["total"]) for f in got] == \
                    [sum(expected[:i + 1]) for i in range(len(expected))]
                f = got[0]
                assert f.kind is FaultKind.OVERFLOW and f.origin == "rx"
                assert f.extra["reason"] == "queue-full"
                assert f.extra["flow"] == str(flow) and f.extra["listener"] == "slow"
                assert f.extra["bands"] == "32" and f.extra["size"] == "5"
                assert f.extra["policy"] == "drop-oldest"
                assert "slow" in f.detail and str(flow) in f.detail
                assert rx.counters["notices.overflow"] == len(expected)
                assert witness.dropped == 0
    run(main())


def test_minimum_interval_between_notices() -> None:
    """Time gate: with every=1 and a long interval, a burst of drops gives one notice; the
    limiter's arithmetic is checked with an injected clock."""
    async def main() -> None:
        async with chain(1) as (r1,):
            async with (await flowlib.connect(addr(r1), name="rx", overflow_notice_every=1,
                                              overflow_notice_interval=60) as rx,
                        await flowlib.connect(addr(r1), name="tx") as tx):
                flow = await tx.create()
                small = await rx.listen(flow, [32], size=2, overflow="drop-newest")
                notes = await rx.listen(flow, [BAND_OVERFLOW])
                witness = await rx.listen(flow, [32], size=1000)
                await flood(tx, flow, witness, 102)
                assert small.dropped == 100
                [note] = drain(notes)
                assert note.fault().extra["dropped"] == "1"
                assert note.fault().extra["policy"] == "drop-newest"
                # drop-newest keeps the first two
                assert [m.payload for m in drain(small)] == [b"m0", b"m1"]
    run(main())

    lim = NoticeLimiter(every=10, interval=5.0)
    assert lim.hit(100.0) == 1  # the first drop: at once
    assert [lim.hit(100.0 + i * 0.1) for i in range(1, 20)] == [0] * 19  # too soon
    assert lim.pending == 19
    assert lim.hit(105.0) == 20  # interval passed and >= 10 pending
    assert [lim.hit(200.0 + i) for i in range(9)] == [0] * 9  # late, but only 9 pending
    assert lim.hit(209.0) == 10
    assert lim.sent == 3
    with pytest.raises(ValueError):
        NoticeLimiter(every=0)
    with pytest.raises(ValueError):
        NoticeLimiter(interval=-1)


# ================================================================== who gets notices
def test_notice_recipients_and_no_notice_storms() -> None:
    """Notices go to this flow's overflow listeners only (including the overflowing one if it
    listens to band 18); a notice that finds a full queue is dropped without a notice about
    it; other flows and other clients hear nothing; None disables notices."""
    async def main() -> None:
        async with chain(1) as (r1,):
            async with (await flowlib.connect(addr(r1), name="rx", overflow_notice_every=1,
                                              overflow_notice_interval=0) as rx,
                        await flowlib.connect(addr(r1), name="quiet",
                                              overflow_notice_every=None) as quiet,
                        await flowlib.connect(addr(r1), name="tx") as tx):
                flow, other = await tx.create(), await tx.create()
                both = await rx.listen(flow, [32, BAND_OVERFLOW], size=3, name="both")
                tiny_notes = await rx.listen(flow, [BAND_OVERFLOW], size=1, name="notes")
                elsewhere = await rx.listen(other, "overflow")
                peer_notes = await quiet.listen(flow, "overflow")
                q_small = await quiet.listen(flow, [32], size=1)
                witness = await rx.listen(flow, [32], size=100)
                q_witness = await quiet.listen(flow, [32], size=100)
                await flood(tx, flow, witness, 10)
                for _ in range(10):
                    await get(q_witness)
                # 'both' holds 3: data and notices about itself mixed (drop-oldest)
                assert both.dropped > 0
                kinds = {m.band for m in drain(both)}
                assert BAND_OVERFLOW in kinds
                # each of the 7 data messages that found 'both' full made one notice (every=1,
                # interval 0); a notice landing in a full queue pushed out one more message
                # but made no notice of its own; 'notes' (size 1) kept the newest notice
                n = rx.counters["notices.overflow"]
                assert n == 7 and both.dropped == 14
                assert tiny_notes.dropped == n - 1 and len(tiny_notes) == 1
                last = tiny_notes.get_nowait().fault()
                assert last.extra["listener"] == "both"
                assert elsewhere.empty() and peer_notes.empty()
                assert q_small.dropped == 9 and quiet.counters["notices.overflow"] == 0
    run(main())
