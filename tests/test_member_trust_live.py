"""Issue 26 end to end: what an application sends on band 19 never reaches another's member
view, over real routers and flowlib's ``watch_members``.

An attacker on the flow (an application) sends membership notices in
the routers' own format: a fake member under an authenticated name, an empty snapshot that
would make a real member vanish, and a flood of fake members. Routers drop band-19 frames
from applications and flowlib believes notices only from its router, so the watcher's view
holds exactly the real members throughout.
"""

from __future__ import annotations

from pathlib import Path

import flowlib
from flowrouter.wire.appmembers import MemberChange, MemberEvent, MemberNotice, NoticeKind
from flowrouter.wire.bands import BAND_APP_MEMBERSHIP, mask_of

from .rawep import RawEndpoint, addr, core_and_edge, run, within

KEY = "hex:" + "42" * 32


def forged(router: int, kind: NoticeKind, *members: tuple[int, str]) -> bytes:
    return MemberNotice(kind, router, 9999, 0, 0, tuple(
        MemberChange(MemberEvent.JOIN, nid, mask_of(32), name) for nid, name in members)
    ).encode()


def test_no_application_can_forge_or_erase_members(tmp_path: Path) -> None:
    async def main() -> None:
        async with core_and_edge(member_notice_interval=0.1, link_keys={"app": KEY}) \
                as (core, edge):
            sd = str(tmp_path)
            watcher = await flowlib.connect([addr(edge)], name="watcher", state_dir=sd)
            flow = await watcher.create()
            watch = await watcher.watch_members(flow)
            alice = await flowlib.connect([addr(core)], name="alice", state_dir=sd,
                                          link_key=("app", KEY))
            await alice.listen(flow, 32)
            view = await within(watch.wait_for(lambda v: len(v) == 2))
            assert watch.names() == ["alice"]
            real = set(view)
            # the attacker: an application on the core, speaking the wire format by hand
            mallory = await RawEndpoint.connect(core, "mallory")
            await mallory.join(flow, mask_of(32))
            cid, eid = core.core.p.node_id, edge.core.p.node_id
            for rid in (cid, eid, 12345):
                mallory.send(flow, forged(rid, NoticeKind.DELTA, (0xBAD, "alice")),
                             band=BAND_APP_MEMBERSHIP)  # a fake "alice"
                mallory.send(flow, forged(rid, NoticeKind.SNAPSHOT),
                             band=BAND_APP_MEMBERSHIP)  # alice erased
                mallory.send(flow, forged(rid, NoticeKind.SNAPSHOT,
                                          *((0x1000 + i, "") for i in range(500))),
                             band=BAND_APP_MEMBERSHIP)  # a flood
            # a real change after them, on the same path: once the view shows it, the
            # forged notices (sent before) had their chance
            bob = await flowlib.connect([addr(core)], name="bob", state_dir=sd)
            await bob.listen(flow, 33)
            view = await within(watch.wait_for(lambda v: len(v) == 4))  # + mallory, bob
            assert real <= set(view) and 0xBAD not in view
            assert not [nid for nid in view if 0x1000 <= nid < 0x1000 + 500]
            assert watch.names() == ["alice"]  # mallory is a member, by node id only
            assert core.core.counters["drop.app-control"] == 9
            await mallory.close()
            for c in (bob, alice):
                await c.close()
            await watch.close()
            await watcher.close()
    run(main())
