"""Publish and subscribe: one client creates a flow and sends on two bands; another listens
to one of them and gets only that band's messages (the routers filter the other away).

    python3 examples/publish_subscribe.py --router 127.0.0.1:7001

prints ``band 33: hello`` (never band 34) and exits 0.
"""

from __future__ import annotations

import asyncio

from _common import routers

import flowlib


async def main(addresses: list[str]) -> None:
    async with await flowlib.connect(addresses, name="publisher") as pub, \
               await flowlib.connect(addresses, name="subscriber") as sub:
        flow = await pub.create()                    # a new FlowID from the router's LSID
        listener = await sub.listen(flow, "33")      # returns once the join is acknowledged
        await pub.send(flow, b"not for you", band=34)
        await pub.send(flow, b"hello", band=33)
        msg = await asyncio.wait_for(listener.get(), 10)
        print(f"band {msg.band}: {msg.payload.decode()}")
        assert msg.band == 33 and listener.empty()  # band 34 was filtered away upstream


if __name__ == "__main__":
    asyncio.run(main(routers(__doc__)))
