"""flowlib.heartbeat: the payload codec, the sans-I/O peer tracker, detection over real
routers with an injected clock (deterministic), and a real-time smoke test that also shows
heartbeats riding out a router failover.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import pytest

import flowlib
from flowlib.heartbeat import (
    Beat,
    Heartbeat,
    MembershipChange,
    PeerState,
    PeerTracker,
    decode_beat,
    encode_beat,
)
from flowrouter.wire.bands import BAND_HEARTBEAT

from .rawep import addr, chain, run, until

T = TypeVar("T")
A, S, D, L = PeerState.ALIVE, PeerState.SUSPECTED, PeerState.DEAD, PeerState.LEFT





class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def moves(changes: list[MembershipChange]) -> list[tuple[str, PeerState | None, PeerState]]:
    return [(c.peer, c.old, c.new) for c in changes]


# ================================================================== codec
def test_beat_codec() -> None:
    beat = Beat("site-ä", 7, 2.0, 0xDEADBEEF, False, b"lamport=42")
    raw = encode_beat(beat)
    assert raw[:2] == b"HB" and raw[2] == 1 and raw[3] == 0
    assert int.from_bytes(raw[4:8], "big") == 0xDEADBEEF
    assert int.from_bytes(raw[8:12], "big") == 7
    assert int.from_bytes(raw[12:16], "big") == 2000
    assert raw[16] == len("site-ä".encode()) and raw.endswith(b"\x00\x0alamport=42")
    assert decode_beat(raw) == beat
    assert decode_beat(memoryview(encode_beat(Beat("x", 1, 0.25, 1, True)))).leaving
    for bad in (b"", b"XX" + raw[2:], raw[:2] + b"\x02" + raw[3:], raw[:-1], raw + b"!",
                encode_beat(Beat("x", 1, 0.25, 1))[:12] + b"\0\0\0\0" + b"\x01x\0\0"):
        with pytest.raises(ValueError):
            decode_beat(bad)
    with pytest.raises(ValueError):
        encode_beat(Beat("n" * 256, 0, 1.0, 1))


# ================================================================== the tracker alone
def test_tracker_state_machine() -> None:
    t = PeerTracker(missed=3)  # suspected after 1.5 periods, dead after 3
    assert moves(t.observe(Beat("a", 0, 2.0, 1), 0.0)) == [("a", None, A)]
    assert moves(t.observe(Beat("b", 0, 0.5, 2), 0.0)) == [("b", None, A)]
    assert t.next_deadline() == 0.75  # b, with its own shorter period
    assert moves(t.check(0.74)) == []
    assert moves(t.check(0.75)) == [("b", A, S)]
    assert moves(t.check(1.5)) == [("b", S, D)]
    assert moves(t.check(2.9)) == []
    assert moves(t.check(3.0)) == [("a", A, S)]
    assert moves(t.observe(Beat("a", 3, 2.0, 1), 3.5)) == [("a", S, A)]
    assert t.peers["a"].lost == 2 and t.peers["a"].beats == 2
    assert moves(t.check(9.49)) == [("a", A, S)]
    assert moves(t.check(9.5)) == [("a", S, D)]
    # back from the dead; a restart (new incarnation) is flagged
    [ch] = t.observe(Beat("b", 0, 0.5, 99), 10.0)
    assert (ch.old, ch.new, ch.restarted) == (D, A, True)
    assert ch.info is not None and ch.info.incarnation == 99
    [ch] = t.observe(Beat("b", 0, 0.5, 100), 10.1)
    assert (ch.old, ch.new, ch.restarted) == (A, A, True)
    # goodbye, and a late beat overtaken by it is ignored
    assert moves(t.observe(Beat("a", 9, 2.0, 1, leaving=True), 11.0)) == [("a", D, L)]
    assert moves(t.observe(Beat("a", 8, 2.0, 1), 11.1)) == []
    assert moves(t.check(100.0)) == [("b", A, D)]  # left peers are never declared dead
    # other signs of life (seed 003: any message counts)
    assert moves(t.saw("b", 100.0)) == [("b", D, A)]
    assert t.saw("nobody", 100.0) == [] and t.saw("a", 100.0) == []
    assert PeerTracker(missed=1).suspect_after == 1  # no separate suspected stage
    with pytest.raises(ValueError):
        PeerTracker(missed=3, suspect_after=4)


# ================================================================== over real routers
def test_detection_with_injected_clock() -> None:
    """Two members on different routers; the clocks are fake, so every transition happens
    exactly when the test moves time, and the routers only carry the beats."""
    async def main() -> None:
        async with chain(2) as (r1, r2):
            async with (await flowlib.connect(addr(r1), name="A") as ca,
                        await flowlib.connect(addr(r2), name="B") as cb):
                flow = await ca.create()
                clock_a, clock_b = FakeClock(), FakeClock()
                seen: list[MembershipChange] = []
                a = Heartbeat(ca, flow, clock=clock_a, data=lambda: b"clock=%d" % clock_a.t)
                b = Heartbeat(cb, flow, clock=clock_b, on_change=seen.append)
                assert (a.period, a.tracker.missed) == (2.0, 3)  # seed 003's defaults
                await b.start(run=False)
                changes = b.changes()
                await a.start(run=False)  # joins band 16 and sends beat 0
                assert (await b.wait_for("A", "alive", timeout=5)).data == b"clock=0"
                assert (await anext(changes)).new is A
                # b's own beat reached a
                b.beat()
                await a.wait_for("B", "alive", timeout=5)
                assert a.alive() == ["B"] and b.alive() == ["A"]
                # a goes quiet (no more ticks): b's clock alone decides
                for t, expected in ((2.9, []), (3.0, [("A", A, S)]), (5.9, []),
                                    (6.0, [("A", S, D)]), (60.0, [])):
                    clock_b.t = t
                    assert moves(b.tick()) == expected
                assert b.state("A") is D and b.alive() == []
                # a comes back: beat 1 at its time 61
                clock_a.t = 61.0
                a.tick()
                await b.wait_for("A", "alive", timeout=5)
                assert b.peers["A"].data == b"clock=61" and b.peers["A"].lost == 0
                assert [c.new for c in seen] == [A, S, D, A]
                assert [(await anext(changes)).new for _ in range(3)] == [S, D, A]
                # a stops politely: b learns it left, without waiting for silence
                await a.stop()
                await b.wait_for("A", "left", timeout=5)
                assert b.counters["bad"] == 0 and a.counters["sent"] == 3
                # junk on band 16 is counted and ignored
                await ca.send(flow, b"not a heartbeat", band=BAND_HEARTBEAT)
                await ca.send(flow, encode_beat(Beat("Z", 0, 1.0, 5)), band=BAND_HEARTBEAT)
                await b.wait_for("Z", "alive", timeout=5)
                assert b.counters["bad"] == 1
                await b.stop()
                # what was not read yet is delivered, then the iterator ends at stop()
                assert [(c.peer, c.new) async for c in changes] == [("A", L), ("Z", A)]
    run(main())


def test_real_time_smoke_and_failover() -> None:
    """Real clocks, period 0.1 s: members see each other; a member whose router is killed
    fails over and is never reported dead (the gap is far below a period); a member that
    goes silent is suspected then declared dead after 3 periods."""
    async def main() -> None:
        async with chain(3) as (r1, r2, r3):
            ca = await flowlib.connect(addr(r3), name="A")
            cb = await flowlib.connect([addr(r1), addr(r2)], name="B")
            cc = await flowlib.connect(addr(r2), name="C")
            flow = await ca.create()
            log: list[tuple[str, str, PeerState]] = []
            hbs = []
            for c in (ca, cb, cc):
                hb = Heartbeat(c, flow, period=0.1, missed=3,
                               on_change=lambda ch, me=c.name: log.append((me, ch.peer, ch.new)))
                await hb.start()
                hbs.append(hb)
            a, b, c = hbs
            for hb in hbs:
                for other in ("A", "B", "C"):
                    if other != hb.name:
                        await hb.wait_for(other, "alive", timeout=5)
            # B's router dies: B fails over to r2 and keeps beating
            beats = a.peers["B"].beats
            await r1.stop()
            await until(lambda: cb.failovers == 1)
            await until(lambda: a.peers["B"].beats >= beats + 5)
            assert ("A", "B", D) not in log and ("C", "B", D) not in log
            # C goes silent without a goodbye (its client stays connected)
            await c.stop(goodbye=False)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await a.wait_for("C", "suspected", timeout=5)
            await a.wait_for("C", "dead", timeout=5)
            took = loop.time() - t0
            assert 0.2 <= took < 2.0, took  # 3 periods after C's last beat
            assert b.state("C") in (S, D)
            await a.stop()
            await b.wait_for("A", "left", timeout=5)
            await b.stop()
            for client in (ca, cb, cc):
                await client.close()
    run(main())
