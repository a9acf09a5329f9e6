"""Membership visible to applications: routers' band-19 notices and flowlib's member view.

Simulator (deterministic): every band-19 listener learns who joined and left, with masks;
notices are batched per interval (a burst of joins is one notice per router, not one per
join); a late listener learns the existing members from snapshots; a router's notice limit
is honoured and reported. Real loopback routers: flowlib's ``watch_members`` sees another
client join and leave, with its name when its link is authenticated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import flowlib
from flowlib.members import MemberView
from flowrouter.net.config import NodeConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.testbed.sim.network import SimNetwork
from flowrouter.wire.appmembers import (
    MemberChange,
    MemberEvent,
    MemberNotice,
    NoticeKind,
    decode_notice,
)
from flowrouter.wire.bands import BAND_APP_MEMBERSHIP, BandMask, mask_of
from flowrouter.wire.flowid import FlowID

from .rawep import addr, core_and_edge, run, within

FLOW = FlowID(0xABCD, 0x10, 7)
B19 = BAND_APP_MEMBERSHIP


def _net(interval: float = 1.0, refresh: float = 30.0) -> SimNetwork:
    net = SimNetwork(seed=1)
    net.add_router("a", core_lsids=[0x10], member_notices=interval, member_refresh=refresh)
    net.add_router("b", routes={0x10: "a"}, member_notices=interval, member_refresh=refresh)
    net.add_router("c", routes={0x10: "b"}, member_notices=interval, member_refresh=refresh)
    net.add_link("a", "b")
    net.add_link("b", "c")
    return net


def _view(ep: object) -> tuple[MemberView, list[MemberNotice]]:
    view = MemberView()
    notices = [decode_notice(d.payload) for d in ep.received(FLOW, B19)]  # type: ignore[attr-defined]
    for i, n in enumerate(notices):
        view.apply(n, float(i))
    return view, notices


def test_notice_round_trip_and_hostile_input() -> None:
    n = MemberNotice(NoticeKind.DELTA, 5, 9, 30, 2,
                     (MemberChange(MemberEvent.JOIN, 77, 1 << 32 | 1 << 19, "alice"),
                      MemberChange(MemberEvent.LEAVE, 78, 0, "")))
    assert decode_notice(n.encode()) == n
    raw = n.encode()
    for bad in (raw[:10], raw[:-1], raw + b"x", b"XYZ" + raw[3:],
                raw[:4] + bytes([9]) + raw[5:]):
        with pytest.raises(ValueError):
            decode_notice(bad)


def test_listeners_see_joins_and_leaves_with_masks() -> None:
    net = _net()
    w1 = net.add_endpoint("w1", "c")
    w2 = net.add_endpoint("w2", "a")
    m1 = net.add_endpoint("m1", "b")
    m2 = net.add_endpoint("m2", "c")
    net.run_until(1.0)
    w1.join(FLOW, BandMask([32, B19]))
    w2.join(FLOW, B19)
    net.run_until(3.0)
    m1.join(FLOW, 32)
    m2.join(FLOW, "32-33")
    net.run_until(6.0)
    for w in (w1, w2):
        view, _ = _view(w)
        got = {m.node_id: m.mask.bits for m in view.members.values()}
        assert got[m1.node_id] == mask_of(32) and got[m2.node_id] == mask_of("32-33"), got
        assert got[w1.node_id] == mask_of([32, B19]) and got[w2.node_id] == mask_of(B19)
    m2.leave(FLOW)
    net.run_until(9.0)
    for w in (w1, w2):
        view, _ = _view(w)
        assert m2.node_id not in view.members and m1.node_id in view.members
    # members that do not listen on band 19 get no notices
    assert m1.received(FLOW, B19) == []
    # unauthenticated links: no names
    assert all(not m.name for m in _view(w1)[0].members.values())


def test_a_burst_of_joins_is_one_notice_per_router() -> None:
    net = _net(interval=1.0)
    w = net.add_endpoint("w", "a")
    members = [net.add_endpoint(f"m{i}", "c") for i in range(40)]
    net.run_until(1.0)
    w.join(FLOW, B19)
    net.run_until(3.0)
    before = len(w.received(FLOW, B19))
    for m in members:
        m.join(FLOW, 32)
    net.run_until(6.0)
    new = [decode_notice(d.payload) for d in w.received(FLOW, B19)[before:]]
    from_c = [n for n in new if n.router == net.routers["c"].p.node_id]
    assert len(from_c) == 1, [(n.kind, len(n.changes)) for n in new]
    assert len(from_c[0].changes) == 40
    view, _ = _view(w)
    assert {m.node_id for m in members} <= set(view.members)


def test_late_listener_learns_existing_members_from_snapshots() -> None:
    net = _net(interval=1.0, refresh=10.0)
    m1 = net.add_endpoint("m1", "b")
    m2 = net.add_endpoint("m2", "c")
    late = net.add_endpoint("late", "a")
    net.run_until(1.0)
    m1.join(FLOW, 32)
    m2.join(FLOW, 32)
    net.run_until(20.0)
    late.join(FLOW, B19)
    net.run_until(22.0)
    view, notices = _view(late)
    assert notices and notices[0].kind is NoticeKind.SNAPSHOT  # its own router at once
    net.run_until(35.0)  # within one refresh, the other routers' snapshots
    view, _ = _view(late)
    assert {m1.node_id, m2.node_id, late.node_id} <= set(view.members)


def test_large_batches_split_and_the_tick_budget_defers() -> None:
    net = SimNetwork(seed=1)
    net.add_router("a", core_lsids=[0x10], member_notices=1.0)
    p = net.routers["a"].p
    p.member_notice_max = 5
    w = net.add_endpoint("w", "a")
    members = [net.add_endpoint(f"m{i}", "a") for i in range(12)]
    net.run_until(1.0)
    w.join(FLOW, B19)
    net.run_until(3.0)
    for m in members:
        m.join(FLOW, 32)
    net.run_until(4.5)
    notices = [decode_notice(d.payload) for d in w.received(FLOW, B19)]
    assert [len(n.changes) for n in notices[1:]] == [5, 5, 2], notices  # one batch, 3 parts
    view = MemberView()
    for i, n in enumerate(notices):
        view.apply(n, float(i))
    assert {m.node_id for m in members} | {w.node_id} == set(view.members)
    # a tick budget of one notice: the rest of the batch waits, and the notice says so
    p.member_notices_per_tick = 1
    for m in members:
        m.leave(FLOW)
    net.run_until(5.5)
    last = decode_notice(w.received(FLOW, B19)[-1].payload)
    assert len(last.changes) == 5 and last.omitted == 7
    assert net.routers["a"].counters["appmembers.deferred"] >= 1
    net.run_until(8.5)
    for i, n in enumerate(decode_notice(d.payload) for d in w.received(FLOW, B19)[4:]):
        view.apply(n, 10.0 + i)
    assert set(view.members) == {w.node_id}


def test_view_expires_a_silent_router() -> None:
    v = MemberView()
    v.apply(MemberNotice(NoticeKind.SNAPSHOT, 1, 1, 10, 0,
                         (MemberChange(MemberEvent.JOIN, 5, 1 << 32),)), 0.0)
    assert 5 in v.members and v.expire(25.0) == []
    changes = v.expire(31.0)
    assert [(c.kind, c.member.node_id, c.expired) for c in changes] == [("leave", 5, True)]
    assert v.members == {}


# ---------------------------------------------------------------------- real routers
KEY = "hex:" + "42" * 32


def test_flowlib_watch_members_on_real_routers(tmp_path: Path) -> None:
    """Two loopback routers: a watcher on the edge sees a client on the core join (with its
    mask) and leave, batched by the routers, through flowlib's public API."""

    async def main() -> None:
        async with core_and_edge(member_notice_interval=0.2) as (core, edge):
            sd = str(tmp_path)
            watcher = await flowlib.connect([addr(edge)], name="watcher", state_dir=sd)
            flow = await watcher.create()
            watch = await watcher.watch_members(flow)
            me = await within(watch.wait_for(lambda v: len(v) == 1))
            assert list(me.values())[0].mask.bits == mask_of(B19)
            other = await flowlib.connect([addr(core)], name="other", state_dir=sd)
            lst = await other.listen(flow, "32-33")
            view = await within(watch.wait_for(lambda v: len(v) == 2))
            joined = [m for m in view.values() if m.mask.bits == mask_of("32-33")]
            assert len(joined) == 1 and joined[0].router == core.core.p.node_id
            await other.unlisten(lst)
            await within(watch.wait_for(lambda v: len(v) == 1))
            assert core.core.counters["appmembers.notices"] >= 2
            await watch.close()
            await other.close()
            await watcher.close()
    run(main())


def test_member_names_only_on_authenticated_links(tmp_path: Path) -> None:
    async def main() -> None:
        node = RouterNode(NodeConfig("gate", listen="127.0.0.1:0", default_lsid=0x10,
                                     core_lsids=frozenset({0x10}), link_keys={"app": KEY},
                                     member_notice_interval=0.2))
        await node.start()
        try:
            sd = str(tmp_path)
            w = await flowlib.connect([addr(node)], name="w", state_dir=sd)
            flow = await w.create()
            watch = await w.watch_members(flow)
            alice = await flowlib.connect([addr(node)], name="alice", state_dir=sd,
                                          link_key=("app", KEY))
            await alice.listen(flow, 32)
            bob = await flowlib.connect([addr(node)], name="bob", state_dir=sd)
            await bob.listen(flow, 32)
            await within(watch.wait_for(lambda v: len(v) == 3))
            assert watch.names() == ["alice"]  # bob and w are unauthenticated: no names
            for c in (alice, bob, w):
                await c.close()
        finally:
            await node.stop()
    run(main())


class _CountingFlows(dict):  # type: ignore[type-arg]
    """The flow table, counting the lookups a part makes in it."""

    gets = 0

    def get(self, key, default=None):  # type: ignore[no-untyped-def]
        self.gets += 1
        return super().get(key, default)


def _many_members(n: int, upstream: int | None) -> tuple[Any, Any, _CountingFlows]:
    from flowrouter.core.appmembers import AppMembership
    from flowrouter.core.params import RouterParams
    from flowrouter.core.state import RouterState
    from flowrouter.core.tables import FlowEntry, Link, LinkState
    from flowrouter.wire import control as C

    state = RouterState(RouterParams("r", 1, member_notice_interval=1.0, member_refresh=30.0))
    state.flows = flows = _CountingFlows()
    for lid, role in ((1, C.Role.ROUTER), (2, C.Role.ENDPOINT)):
        state.links[lid] = Link(lid, "sim", f"p{lid}", (0, 0, 0, 0), role=role,
                                state=LinkState.UP, peer_node_id=100 + lid)
    members = AppMembership(state, 0.0)
    for i in range(n):
        key = FlowID(0xABCD, 0x10, i).key
        entry = flows[key] = FlowEntry(upstream, True, 0.0)
        entry.set_down(2, 1 << 32, 0.0)
        members.member_changed(key, state.links[2], MemberEvent.JOIN, 1 << 32)
    return state, members, flows


def test_an_interval_looks_at_a_bounded_number_of_flows(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """10^4 flows with local members: an interval's notices go up the tree 100 at a time
    (the tick budget) and the rest wait in order, without the interval walking (and sorting)
    every waiting flow again; at a core where nobody listens, the periodic snapshots are
    bookkeeping only, an interval's worth at a time, until every flow had its turn."""
    from flowrouter.core import appmembers

    state, members, flows = _many_members(10_000, upstream=1)
    sent = members.notices(1.0)
    assert len(sent) == 100 and {s.link for s in sent} == {1}
    assert state.counters["appmembers.deferred"] == 9_900
    flows.gets = 0
    assert len(members.notices(2.0)) == 100
    assert flows.gets <= 100 and state.counters["appmembers.deferred"] == 9_900 + 9_800
    seen = {decode_notice(s.payload).changes[0].member for s in sent}
    assert seen == {102}  # the application's own joins, told upstream

    monkeypatch.setattr(appmembers, "KEYS_PER_INTERVAL", 1_000)
    state, members, flows = _many_members(10_000, upstream=None)  # a core: no one listens
    assert members.notices(1.0) == [] and flows.gets == 1_000
    for t in range(2, 11):
        members.notices(float(t))
    assert flows.gets == 10_000 and "appmembers.deferred" in state.counters
    flows.gets = 0
    assert members.notices(11.0) == [] and flows.gets == 0  # nothing owed until the refresh
    for t in range(31, 41):  # the snapshots fall due at 31: an interval's worth at a time
        flows.gets = 0
        assert members.notices(float(t)) == [] and flows.gets == 1_000, t
    flows.gets = 0
    assert members.notices(41.0) == [] and flows.gets == 0
