"""What a change of the location-service members' tree costs at 10^4 flows (issue 30), in
the simulator: 8 members on a ring with one chord, every flow joined at two members, and
the tree's root dies, so the whole tree reshapes and every flow's masks change on several
member links. The members tell each other those changes in REFRESH_UPDATE chunks (a
thousand flows a frame), not one MASK per flow and link; the receivers reconcile them
within their per-tick work budget; and the masks end as a fresh start would have them."""

from __future__ import annotations

import time

from flowrouter.testbed.sim import SimNetwork
from flowrouter.wire.flowid import FlowID

LSID = 0x10
MEMBERS = [f"m{i}" for i in range(8)]
SOFT = dict(refresh_interval=2.0, hold_factor=3.5, liveness_interval=0.5, dead_after=2.0,
            join_timeout=4.0, work_per_tick=4000)


def member_frames(net: SimNetwork) -> int:
    """Frames sent so far on member-to-member links (both directions)."""
    return sum(d.frames for lk in net.links.values()
               if lk.a in MEMBERS and lk.b in MEMBERS for d in (lk.ab, lk.ba))


def test_a_tree_change_at_ten_thousand_flows_is_told_in_chunks_within_the_budget() -> None:
    n_flows = 10_000
    net = SimNetwork(seed=4)
    for name in MEMBERS:
        net.add_router(name, core_lsids=[LSID], **SOFT)
        net.add_endpoint(f"x{name[1:]}", name, refresh_interval=2.0, join_timeout=2.0)
    for a, b in zip(MEMBERS, MEMBERS[1:] + MEMBERS[:1]):
        net.add_link(a, b, delay=0.001)
    net.add_link("m0", "m4", delay=0.001)
    net.run_until(2.0)
    for i in range(n_flows):
        for k in (i % 8, (i + 3) % 8):
            if k:  # m0 is the one that dies: no members of its own
                net.endpoints[f"x{k}"].join(FlowID(0xC0FFEE, LSID, i), [32])
    net.run_until(8.0)
    survivors = MEMBERS[1:]
    assert all(len(net.routers[m].flows) >= n_flows for m in survivors)
    before = member_frames(net)
    counters0 = net.router_counters()
    cpu = time.process_time()
    for name, link in list(net.links.items()):
        if "m0" in (link.a, link.b):
            net.link_down(name)
    net.run_for(2.0)
    cpu = time.process_time() - cpu
    counters = net.router_counters() - counters0
    frames = member_frames(net) - before
    print(f"\nroot of 8 members died at {n_flows:,} flows: {frames:,} frames on member links "
          f"in 2 s ({frames / n_flows:.3f} per flow), {counters['ls.mask-batches']} "
          f"mask chunks, {counters['work.deferred']:,} entries waited for a later tick; "
          f"{cpu:.1f} s CPU simulating those 2 s")
    assert counters["ls.tree-changes"] >= len(survivors)
    # one MASK per flow and changed link would be several per flow (13 measured)
    # (digest rounds and liveness echoes included)
    assert frames < n_flows / 10
    assert counters["ls.mask-batches"] > 0
    # the chunks were reconciled within the work budget: some waited for a later tick
    assert counters["work.deferred"] > 0
    # and the masks end as the new tree has them: every flow's traffic reaches its members
    assert all(r.counters["work.deferred"] == r.counters["work.served"]
                   for r in net.routers.values())
    sender = net.endpoints["x1"]
    for i in range(0, n_flows, 997):
        sender.send(FlowID(0xC0FFEE, LSID, i), 32, b"%d" % i)
    net.run_for(0.5)
    for i in range(0, n_flows, 997):
        flow = FlowID(0xC0FFEE, LSID, i)
        for k in (i % 8, (i + 3) % 8):
            if k and k != 1:
                got = [d.payload for d in net.endpoints[f"x{k}"].received(flow)]
                assert got == [b"%d" % i], (i, k, got)
