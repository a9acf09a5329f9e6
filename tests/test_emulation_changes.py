"""Changing or removing a link's emulation keeps every frame it holds (issue 28): switching
off a 1 s delay used to deliver 0 of 40 messages, switching off a 56 kbit/s limit 8 of 40.
Real routers on loopback, a flowlib sender on r1 and a receiver on r2 (the core)."""

from __future__ import annotations

import asyncio

import pytest

import flowlib
from flowrouter.net.config import Emulation
from flowrouter.net.runtime import RouterNode

from .rawep import addr, chain, get


def _drops(counters: dict[str, int]) -> int:
    return sum(v for k, v in counters.items() if k.startswith("drop."))


def _queued(node: RouterNode) -> int:
    return sum(row.get("output", {}).get("queued_frames", 0)
               for row in node.status()["links"] if row["peer"] == "r2")


@pytest.mark.parametrize("emu", [Emulation(delay=1.0), Emulation(bandwidth=56_000)],
                         ids=["delay-1s", "rate-56kbit"])
def test_removing_emulation_keeps_the_frames_it_holds(emu: Emulation) -> None:
    async def main() -> None:
        async with chain(2) as (r1, r2):
            tx = await flowlib.connect([addr(r1)], name="tx")
            rx = await flowlib.connect([addr(r2)], name="rx")
            flow = await tx.create()
            listener = await rx.listen(flow, "data", size=1000)
            await tx.send(flow, b"warm-up")
            assert bytes((await get(listener)).payload) == b"warm-up"  # the tree is there
            r1.set_emulation("r2", emu)
            for i in range(40):
                await tx.send(flow, b"%02d" % i + bytes(1000))
            # r1 holds most of them now (waiting out the delay, or the rate)
            for _ in range(500):  # no event for "r1 read them": a bounded poll
                if _queued(r1) >= 30:
                    break
                await asyncio.sleep(0.002)
            assert _queued(r1) >= 30
            before = _drops(r1.core.counters) + _drops(r2.core.counters)
            r1.set_emulation("r2", None)
            got = []
            try:
                while len(got) < 40:
                    got.append(int(bytes((await get(listener, 5.0)).payload)[:2]))
            except TimeoutError:
                pass
            counted = _drops(r1.core.counters) + _drops(r2.core.counters) - before
            assert len(got) + counted == 40, (len(got), counted)
            assert got == sorted(got)  # in order
            assert len(got) == 40  # and in fact nothing was dropped
            await tx.close()
            await rx.close()

    asyncio.run(asyncio.wait_for(main(), 60))
