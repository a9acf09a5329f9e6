"""Request and reply over flows: a service listens on a well-known request flow; each
requester listens on a reply flow of its own and names it in its request; the service
answers there. Nothing but flows: the service never learns where the requester is.

    python3 examples/request_reply.py --router 127.0.0.1:7001

prints ``reply: HELLO`` and exits 0.
"""

from __future__ import annotations

import asyncio
import json

from _common import routers

import flowlib


async def serve(client: flowlib.FlowClient, requests: flowlib.Listener) -> None:
    """Answer every request with its text in capitals, on the reply flow it names."""
    async for msg in requests:
        request = json.loads(msg.payload)
        await client.send(request["reply_to"], request["text"].upper().encode())


async def main(addresses: list[str]) -> None:
    async with await flowlib.connect(addresses, name="service") as service, \
               await flowlib.connect(addresses, name="requester") as requester:
        request_flow = await service.create()
        server = asyncio.ensure_future(serve(service, await service.listen(request_flow)))
        reply_flow = await requester.create()
        replies = await requester.listen(reply_flow)
        await requester.send(request_flow, json.dumps(
            {"reply_to": str(reply_flow), "text": "hello"}).encode())
        msg = await asyncio.wait_for(replies.get(), 10)
        print(f"reply: {msg.payload.decode()}")
        server.cancel()


if __name__ == "__main__":
    asyncio.run(main(routers(__doc__)))
