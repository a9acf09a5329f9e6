"""Messages larger than a frame: flowlib fragments them on the sender's side and
reassembles them on the receiver's, on the message's own band.

    python3 examples/large_message.py --router 127.0.0.1:7001

prints ``received 3000000 bytes intact`` and exits 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

from _common import routers

import flowlib


async def main(addresses: list[str]) -> None:
    async with await flowlib.connect(addresses, name="sender") as tx, \
               await flowlib.connect(addresses, name="receiver") as rx:
        flow = await tx.create()
        listener = await rx.listen(flow, "data")
        blob = os.urandom(3_000_000)                 # about 46 frames of 64 KiB
        await tx.send(flow, blob, band=40)
        msg = await asyncio.wait_for(listener.get(), 30)
        same = hashlib.sha256(msg.payload).digest() == hashlib.sha256(blob).digest()
        print(f"received {len(msg.payload)} bytes {'intact' if same else 'DAMAGED'}")
        assert same


if __name__ == "__main__":
    asyncio.run(main(routers(__doc__)))
