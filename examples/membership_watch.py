"""Watch who is on a flow: the routers report their applications' joins, mask changes and
leaves on band 19, and ``watch_members`` folds them into a view.

    python3 examples/membership_watch.py --router 127.0.0.1:7001

prints ``join alice``, then a ``leave alice`` line, and exits 0.
"""

from __future__ import annotations

import asyncio

from _common import routers

import flowlib


async def main(addresses: list[str]) -> None:
    async with await flowlib.connect(addresses, name="watcher") as watcher:
        flow = await watcher.create()
        watch = await watcher.watch_members(flow)
        alice = await flowlib.connect(addresses, name="alice")
        await alice.listen(flow, "32-33")
        seen: list[str] = []
        async for change in watch:                   # MemberUpdate(kind, member, ...)
            if change.member.node_id != alice.node_id:
                continue                             # (the watcher is a member too)
            # names are reported where routers authenticate links (link keys); here the
            # 64-bit node id of alice's HELLO is what identifies her
            print(f"{change.kind} alice ({change.member.node_id:016x}) mask {change.member.mask}")
            seen.append(change.kind)
            if change.kind == "join":
                await alice.close()                  # a polite leave
            elif change.kind == "leave":
                break
        await watch.close()
        assert seen[0] == "join" and seen[-1] == "leave"


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(routers(__doc__)), 30))
