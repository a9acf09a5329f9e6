"""Heartbeats between peers of a flow: each beats on band 16; a peer that stops beating is
suspected, then declared dead; one that stops politely is reported as having left.

    python3 examples/heartbeat.py --router 127.0.0.1:7001

prints ``site-b alive`` and then ``site-b left`` and exits 0.
"""

from __future__ import annotations

import asyncio

from _common import routers

import flowlib


async def main(addresses: list[str]) -> None:
    async with await flowlib.connect(addresses, name="site-a") as a, \
               await flowlib.connect(addresses, name="site-b") as b:
        flow = await a.create()
        async with flowlib.Heartbeat(a, flow, period=0.2, missed=3, name="site-a") as hb_a:
            hb_b = flowlib.Heartbeat(b, flow, period=0.2, missed=3, name="site-b")
            await hb_b.start()
            async for change in hb_a.changes():      # MembershipChange(peer, old, new, ...)
                print(f"{change.peer} {change.new}")
                if change.new == "alive":
                    await hb_b.stop()                # says goodbye: "left", not "dead"
                elif change.new in ("left", "dead"):
                    break


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(routers(__doc__)), 30))
