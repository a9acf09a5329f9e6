"""Soft state that repairs itself, in the sans-I/O core: link liveness,
refresh digests, hold times, PRUNE and NOT_ON_TREE; and the timer wheel that drives them."""

from __future__ import annotations

import pytest

from flowrouter.core.router import Router, RouterParams
from flowrouter.core.timers import TimerWheel
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_MEMBERSHIP
from flowrouter.wire.header import pack_header

try:  # tests/ as a package or as a plain directory on sys.path
    from .corenet import LINK_KEY, LSID, SOFT, CoreNet, bits, chain, flow
except ImportError:
    from corenet import LINK_KEY, LSID, SOFT, CoreNet, bits, chain, flow

F = flow(LSID)


def lose(kind: type, src: str | None = None):
    """A ``net.lossy`` filter losing every control message of *kind* (sent by *src*)."""
    return lambda name, link, frame: isinstance(frame.msg, kind) and src in (None, name)


# =========================================================================== timer wheel
def test_timer_wheel_pops_only_what_is_due_in_bucket_order():
    w = TimerWheel(0.25)
    w.schedule("c", 2.0)
    w.schedule("a", 0.1)
    w.schedule("b", 0.2)
    assert w.pop_due(0.2) == []  # its bucket [0, 0.25) has not ended yet
    assert w.pop_due(0.3) == ["a", "b"]
    assert len(w) == 1 and w.next_due() == pytest.approx(2.25)
    assert w.pop_due(10.0) == ["c"] and len(w) == 0 and w.next_due() is None


def test_timer_wheel_files_past_deadlines_in_the_next_pop():
    w = TimerWheel(1.0)
    assert w.pop_due(5.0) == []
    w.schedule("late", 1.0)  # already past: comes out at the next pop, not lost
    assert w.pop_due(5.0) == []  # the current bucket has not ended
    assert w.pop_due(6.0) == ["late"]
    with pytest.raises(ValueError):
        TimerWheel(0)


def test_params_are_checked():
    with pytest.raises(ValueError, match="dead_after"):
        RouterParams("x", 1, liveness_interval=2.0, dead_after=1.0)
    with pytest.raises(ValueError, match="hold_factor"):
        RouterParams("x", 1, hold_factor=1.0)
    assert RouterParams("x", 1, refresh_interval=4.0, hold_factor=3.5).hold == 14.0


# =========================================================================== liveness
def test_echoes_measure_rtt_and_a_hung_router_is_a_failed_link():
    net = chain(3, **SOFT)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32, BAND_FAULT])
    net.run(until=2.0, step=0.25)
    st = net.routers["r2"].status(net.now)
    assert all(lk["rtt_ms"] is not None for lk in st["links"])
    assert all(lk["silent_s"] < 1.0 for lk in st["links"])
    net.frozen.add("r2")  # SIGSTOP: no ticks, nothing read, nothing sent
    net.run(until=4.5, step=0.25)
    dead = [(n, why) for n, _, why in net.closes if "silent" in why]
    assert sorted(n for n, _ in dead) == ["r1", "r3"], net.closes
    assert "dead after 1.5s" in dead[0][1]
    assert net.routers["r3"].counters["liveness.dead"] == 1
    faults = [f for f in e3.faults(F) if f.kind is C.FaultKind.LINK_DOWN]
    assert faults and "silent" in faults[0].detail  # told on band 17


def test_endpoints_that_never_echo_are_not_cut_off_but_those_that_do_are():
    net = chain(2, **SOFT)
    old = net.endpoint("old", "r2", silent=True)  # an older client: no ECHO replies
    new = net.endpoint("new", "r2")
    net.run(until=2.0, step=0.25)
    assert net.routers["r2"].links[new.link_id].speaks_liveness
    new.silent = True  # hangs after having spoken the protocol
    net.run(until=5.0, step=0.25)
    r2 = net.routers["r2"]
    assert old.link_id in r2.links and new.link_id not in r2.links


# =========================================================================== refresh digests
def test_refreshing_members_keep_the_tree_with_one_digest_per_link_and_interval():
    net = chain(3, **SOFT)
    e3 = net.endpoint("e3", "r3")
    flows = [flow(LSID, i) for i in range(1, 121)]
    for f in flows:
        e3.join(f, [33])
    net.clear_wires()
    net.run(until=10.0, step=0.1)
    assert all(net.has_state(f) == ["r1", "r2", "r3"] for f in flows)
    digests = net.control_sent("r3", "r2", C.Refresh)
    assert 9 <= len(digests) <= 11  # one round a second, 120 flows in one chunk each
    assert all(len(d.entries) == 120 for d in digests)
    for name in ("r1", "r2", "r3"):
        assert net.routers[name].counters["gc.links-collected"] == 0
    assert not net.control_sent("r3", "r2", C.Join)  # nothing per flow once joined


def test_digest_chunks_are_spread_over_the_interval():
    net = chain(2, **SOFT, max_payload=1400)  # 41 entries per chunk
    e2 = net.endpoint("e2", "r2")
    for i in range(1, 401):
        e2.join(flow(LSID, i), [33])
    per_tick = []
    t = net.now
    while t < 6.0:
        t = round(t + 0.05, 9)
        before = len(net.control_sent("r2", "r1", C.Refresh))
        net.tick(t)
        per_tick.append(len(net.control_sent("r2", "r1", C.Refresh)) - before)
    assert sum(per_tick) >= 40  # 10 chunks a round, several rounds
    assert max(per_tick) <= 3  # never the whole round at once
    assert len(net.routers["r1"].flows) == 400


def test_a_silent_endpoint_is_collected_after_the_hold_time_and_its_branch_pruned():
    net = chain(3, **SOFT)
    e1 = net.endpoint("e1", "r1")  # a live member on the core keeps the core's entry
    e3 = net.endpoint("e3", "r3", silent=True)  # never refreshes, never leaves
    e1.join(F, [32])
    e3.join(F, [33])
    net.run(until=2.0, step=0.25)
    assert net.has_state(F) == ["r1", "r2", "r3"]
    net.run(until=5.0, step=0.25)
    assert net.has_state(F) == ["r1"]
    assert net.entry("r1", F).down == {e1.link_id: bits(32)}
    r3 = net.routers["r3"]
    assert r3.counters["gc.links-collected"] == 1 and r3.counters["gc.entries-collected"] == 1
    assert e3.link_id in r3.links  # the link stays, only the flow left it
    net.run(until=12.0, step=0.25)
    assert net.has_state(F) == ["r1"]


def test_an_endpoint_that_stops_refreshing_is_collected_and_told():
    net = chain(3, **SOFT)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [33])
    net.run(until=4.0, step=0.25)
    e3.refreshing = False  # still answers echoes, sends no more digests (nor a LEAVE)
    e3.wanted.clear()  # ... and would not join again when told
    net.run(until=5.5, step=0.25)
    assert net.has_state(F) == ["r1", "r2", "r3"]  # within the hold time
    net.run(until=9.0, step=0.25)
    assert net.has_state(F) == []
    assert [m.keys for m in e3.msgs(C.Prune)] == [(F.key,)]  # PRUNE: "you lost this"


def test_a_lost_mask_is_repaired_by_the_next_digest():
    net = chain(3, **SOFT)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32])
    net.run(until=1.0, step=0.25)
    net.lossy = lose(C.Mask)  # every MASK is lost, on every link
    e3.set_mask(F, [32, 40])
    assert net.entry("r3", F).agg == bits(32, 40)
    assert net.entry("r1", F).down == {net.link("r1", "r2"): bits(32)}  # not told
    net.run(until=4.0, step=0.25)
    assert net.entry("r1", F).down == {net.link("r1", "r2"): bits(32, 40)}
    assert net.routers["r1"].counters["refresh.masks-repaired"] >= 1
    e1 = net.endpoint("e1", "r1")
    e1.send(F, 40, b"widened")
    assert e3.payloads(F) == [b"widened"]


def test_a_lost_leave_is_repaired_within_two_intervals():
    net = chain(3, **SOFT)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32])
    net.run(until=1.0, step=0.25)
    net.lossy = lose(C.Leave, "r3")  # r3's LEAVE toward r2 is lost
    e3.leave(F)
    assert net.has_state(F) == ["r1", "r2"]  # a branch that nobody wants
    net.run(until=3.5, step=0.25)  # two refresh intervals and a bit
    assert net.has_state(F) == []
    assert net.routers["r2"].counters["refresh.links-removed"] == 1


def test_a_join_that_overtakes_the_digest_round_begun_before_it_is_kept():
    """A JOIN sent after a digest round's snapshot may reach the upstream before the round's
    first chunk (a router's output queue serves flows round robin; the simulator serves a
    small control frame ahead of a long one): the round cannot list the flow, and the
    upstream must not take the missing entry for a lost LEAVE. Before the fix this removed
    the live (flow, link) pair (the lost deliveries of the 10^5-flow backbone run)."""
    net = chain(3, **SOFT)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32])
    net.run(until=3.0, step=0.25)  # a few complete rounds r2 -> r1
    held: list = []
    r2_to_r1 = net.link("r2", "r1")

    def hold_round(name, link, frame):  # r2's next digest chunk to r1 is held back
        if (name == "r2" and link == r2_to_r1 and isinstance(frame.msg, C.Refresh)
                and not held):
            held.append(frame)
            return True
        return False
    net.lossy = hold_round
    while not held:
        net.tick(round(net.now + 0.25, 9))
    net.lossy = None
    G = flow(LSID, 2)
    e3.join(G, [33])  # after the round's snapshot: its JOIN reaches r1 first
    assert net.link("r1", "r2") in net.entry("r1", G).down
    net.tick(round(net.now + 0.1, 9))
    net.inject("r2", "r1", held[0].header.pack(), held[0].payload)  # the chunk, late
    r1 = net.routers["r1"]
    assert r1.counters["refresh.rounds-received"] >= 3
    assert net.link("r1", "r2") in net.entry("r1", G).down
    assert r1.counters["refresh.links-removed"] == 0
    e1 = net.endpoint("e1", "r1")
    e1.send(G, 33, b"kept")
    assert e3.payloads(G) == [b"kept"]


def test_a_lost_join_ack_is_repaired_by_the_join_retry():
    net = chain(3, **SOFT, join_timeout=4.0)
    dropped = []

    def lossy(name, link, frame):  # the first JOIN_ACK r2 sends r3 is lost
        if name == "r2" and isinstance(frame.msg, C.JoinAck) and not dropped:
            dropped.append(frame)
            return True
        return False
    net.lossy = lossy
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32])
    assert e3.acks(F) == []
    net.run(until=2.0, step=0.25)
    assert [a.status for a in e3.acks(F)] == [C.JoinStatus.OK]
    assert net.routers["r3"].counters["join.resent"] >= 1 and net.entry("r3", F).joined


def test_state_a_router_lost_is_rebuilt_from_not_on_tree():
    net = chain(3, **SOFT)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32])
    net.run(until=1.0, step=0.25)
    r2 = net.routers["r2"]
    entry = r2.flows.pop(F.key)  # r2 forgets the flow (a restart, a lost state)
    for lid in (entry.upstream, *entry.down):
        r2.links[lid].dependent.discard(F.key)
    net.run(until=3.0, step=0.25)
    # r3's digest listed F: r2 said NOT_ON_TREE, r3 grafted again; r1 heard r2's refresh
    assert net.routers["r3"].counters["refresh.regrafts"] >= 1
    assert net.has_state(F) == ["r1", "r2", "r3"]
    e1 = net.endpoint("e1", "r1")
    e1.send(F, 32, b"back")
    assert e3.payloads(F) == [b"back"]


def test_traffic_from_upstream_for_an_unknown_flow_is_answered_not_on_tree():
    net = chain(2, **{**SOFT, "refresh_interval": 100.0})  # no digest repairs meanwhile
    e2 = net.endpoint("e2", "r2")
    e2.join(F, [32])
    e2.wanted.clear()  # it has gone, and so has r2's state (a LEAVE r1 never heard of)
    r2 = net.routers["r2"]
    entry = r2.flows.pop(F.key)
    for lid in (entry.upstream, *entry.down):
        r2.links[lid].dependent.discard(F.key)
    e1 = net.endpoint("e1", "r1")
    e1.send(F, 32, b"to nobody")
    assert F.key in net.routers["r1"].flows  # r1 still thinks r2 is downstream
    net.tick(net.now + 0.5)
    assert net.control_sent("r2", "r1", C.NotOnTree)
    assert F.key not in net.routers["r1"].flows  # no attached-but-starved branch


def test_a_pruned_router_grafts_again():
    net = chain(3, **SOFT)
    e3 = net.endpoint("e3", "r3")
    e3.join(F, [32])
    net.run(until=1.0, step=0.25)
    net.lossy = lose(C.Refresh, "r3")  # r3's digests to r2 are all lost for a while
    net.run(until=5.0, step=0.25)
    r2 = net.routers["r2"]
    assert r2.counters["gc.links-collected"] >= 1  # held out, collected, PRUNE sent
    assert net.control_sent("r2", "r3", C.Prune)
    assert net.routers["r3"].counters["refresh.regrafts"] >= 1
    net.lossy = None
    net.run(until=8.0, step=0.25)
    assert net.has_state(F) == ["r1", "r2", "r3"]
    e1 = net.endpoint("e1", "r1")
    e1.send(F, 32, b"grafted")
    assert e3.payloads(F) == [b"grafted"]


def test_a_tick_does_not_walk_the_flow_table(monkeypatch):
    from flowrouter.core import state as core_state

    class NoWalk(dict):  # once armed, any walk of the table fails the test
        armed = False

        def _walk(self, how):
            if self.armed:
                raise AssertionError("the tick walked the flow table")
            return getattr(super(), how)()

        def __iter__(self):
            return self._walk("__iter__")

        def items(self):
            return self._walk("items")

        def values(self):
            return self._walk("values")

    # every part holds the one flow route table of the router's shared state: watch it
    build_state = core_state.RouterState.__init__

    def watched(self, *args, **kw):
        build_state(self, *args, **kw)
        self.flows = NoWalk()

    monkeypatch.setattr(core_state.RouterState, "__init__", watched)
    r = Router(RouterParams("r", 1, core_lsids=frozenset({LSID}), refresh_interval=1.0,
                            liveness_interval=0.5, dead_after=1.5))
    assert isinstance(r.flows, NoWalk)
    net = CoreNet()
    net.routers["r"] = r
    e = net.endpoint("e", "r")
    for i in range(1, 901):  # (within the default join-rate burst of one application)
        e.join(flow(LSID, i), [32], pump=False)
    net.pump()
    assert len(r.flows) == 900
    r.flows.armed = True
    net.run(until=20.0, step=0.1)  # echoes, digest receipt, hold sweeps: no table walk
    assert len(r.flows) == 900


def test_a_mass_expiry_is_spread_over_ticks(monkeypatch):
    from flowrouter.core import softstate

    monkeypatch.setattr(softstate, "EXPIRE_PER_TICK", 100)
    net = CoreNet(**SOFT)
    r = net.router("r", core_lsids=frozenset({LSID}))
    e = net.endpoint("e", "r", silent=True)  # never refreshes
    for i in range(1, 501):
        e.join(flow(LSID, i), [32], pump=False)
    net.pump()
    per_tick = []
    while r.flows and net.now < 20.0:
        before = len(r.flows)
        net.tick(round(net.now + 0.25, 9))
        per_tick.append(before - len(r.flows))
    assert not r.flows and r.counters["gc.links-collected"] == 500
    assert max(per_tick) == 100 and sum(1 for n in per_tick if n) >= 5


# =========================================================================== older peers
def test_a_peer_that_does_not_announce_soft_state_is_sent_none_of_it():
    """A node from before soft state drops a link on the first message of a type it does not
    know, so a peer whose HELLO announces no features gets no ECHO, digest, PRUNE or
    NOT_ON_TREE; it is never declared dead for its silence, its link stays up, and what it
    holds lasts the hold time (liveness falls back to the hold time)."""
    net = CoreNet(**SOFT)
    trusted = frozenset({("old-r", "old-r"), ("new-r", "new-r")})
    net.router("r1", core_lsids=frozenset({LSID}), accept_routers=trusted)
    old_app = net.endpoint("old", "r1", silent=True, features=0)
    new_app = net.endpoint("new", "r1", silent=True)
    old_r = net.endpoint("old-r", "r1", role=C.Role.ROUTER, silent=True, features=0)
    new_r = net.endpoint("new-r", "r1", role=C.Role.ROUTER, silent=True)
    old_app.join(F, [33])
    net.run(until=2.0, step=0.25)
    r1 = net.routers["r1"]
    assert new_app.msgs(C.Echo) and new_r.msgs(C.Echo) and new_r.msgs(C.Refresh)
    net.run(until=8.0, step=0.25)  # beyond dead_after (1.5 s) and the hold time (3 s)
    for peer in (old_app, old_r):
        assert peer.link_id in r1.links, peer
        assert not [fr.msg for fr in peer.frames if isinstance(fr.msg, (
            C.Echo, C.EchoReply, C.Refresh, C.Prune, C.NotOnTree))], peer
    assert old_r.msgs(C.LsRoutes)  # what it has always understood it still gets
    assert new_r.link_id not in r1.links  # the silent new router was declared dead
    assert r1.counters["liveness.dead"] == 1
    assert r1.counters["liveness.peer-without-soft-state"] == 2
    assert F.key not in r1.flows and r1.counters["gc.links-collected"] == 1  # hold time
    assert r1.counters["refresh.notices-withheld"] >= 1  # the PRUNE it would not understand


def test_an_unknown_control_type_is_a_counted_drop_not_a_link_drop():
    """A newer peer's message type (link-local, on a flow's band, or before its HELLO) is
    counted and ignored; the link stays up and keeps working."""
    net = chain(2, **SOFT)
    e1, e2 = net.endpoint("e1", "r1"), net.endpoint("e2", "r2")
    e2.join(F, [33])
    raw = bytes([C.CONTROL_VERSION, 0xEE]) + b"from a newer peer"
    e1.send_raw(pack_header(LINK_KEY, len(raw), BAND_MEMBERSHIP), raw)
    e1.send_raw(pack_header(F.key, len(raw), BAND_MEMBERSHIP), raw)
    early = net.endpoint("early", "r1", hello=False)
    early.send_raw(pack_header(LINK_KEY, len(raw), BAND_MEMBERSHIP), raw)
    early.hello()
    r1 = net.routers["r1"]
    assert r1.counters["control.unknown-type"] == 3 and r1.counters["malformed"] == 0
    assert not net.closes and not e1.msgs(C.Error) and not early.msgs(C.Error)
    assert {e1.link_id, early.link_id} <= set(r1.links)
    e1.send(F, 33, b"still up")
    assert e2.payloads(F) == [b"still up"]
