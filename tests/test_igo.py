"""The IGO ordering layer (flowchat.igo) as a pure state machine: deterministic, virtual
time, the in-memory multicast network of flowchat.loopnet (no routers).

Covers seed 003's mechanisms one by one (FIFO + repair, Lamport order, heartbeat detection,
S1/S2/S3, delay vs hasten, leader mode, reconciliation without gaps), the additions
(stability tracking, long-term reconciliation, display-rate limit, dropping a lagging
destination). Malformed frames and the property tests over random interleavings, loss and
partitions are in test_igo_faults.py."""

from __future__ import annotations

import itertools

import pytest

from flowchat import checks
from flowchat.igo import (
    BAND_HEARTBEAT,
    BAND_REPAIR,
    Heartbeat,
    IGOConfig,
    MembershipChange,
    Nack,
    Send,
    SiteOrdering,
    decode,
    encode_heartbeat,
    encode_nack,
    room_tag,
)
from flowchat.loopnet import LoopNet

try:  # tests/ as a package or as a plain directory on sys.path
    from .igonet import ABC, assert_complete, chatter, sent_counts
except ImportError:
    from igonet import ABC, assert_complete, chatter, sent_counts


# ============================================================================ configuration
def test_config_defaults_are_the_seeds_and_validated() -> None:
    cfg = IGOConfig(sites=("b", "a"))
    assert cfg.sites == ("a", "b")  # canonical order: indices agree everywhere
    assert (cfg.heartbeat_interval, cfg.missed_heartbeats, cfg.disconnect_interval) == \
        (2.0, 3, 15.0)
    assert cfg.detect_after == 6.0
    with pytest.raises(ValueError):
        IGOConfig(sites=("a",), mode="ring")
    with pytest.raises(ValueError):
        IGOConfig(sites=("a", "b"), mode="leader")  # no leader
    with pytest.raises(ValueError):
        IGOConfig(sites=("a", "b"), data_band=20)
    with pytest.raises(ValueError):
        IGOConfig(sites=("a", "b"), disconnect_interval=3.0)
    assert IGOConfig(sites=("a",), mode="delay").mode == "all-to-all"


# ============================================================================ FIFO and repair
def test_fifo_with_loss_is_repaired_and_everything_delivered_in_one_order() -> None:
    net = LoopNet(IGOConfig(sites=ABC), seed=2, delay=0.02, jitter=0.03, loss=0.15)
    chatter(net, ABC, stop=30)
    net.run_until(45)
    assert_complete(net)
    orders = [net.order(s) for s in ABC]
    assert orders[0] == orders[1] == orders[2]
    total = sum(o.counters["repair.sent"] for o in net.sites.values())
    assert total > 0
    assert sum(o.counters["sent.nack"] for o in net.sites.values()) > 0


def test_gap_at_one_site_is_repaired_point_to_point_on_its_inbox_band() -> None:
    cfg = IGOConfig(sites=ABC)
    a, b, c = (SiteOrdering(cfg, s, 0.0, incarnation=i + 1) for i, s in enumerate(ABC))
    frames = [x for x in a.submit(b"one", 1.0) + a.submit(b"two", 1.1) + a.submit(b"3", 1.2)
              if isinstance(x, Send)]
    # b gets all three, c loses the second
    for f in frames:
        b.on_message(f.band, f.payload, 1.3)
    c.on_message(frames[0].band, frames[0].payload, 1.3)
    c.on_message(frames[2].band, frames[2].payload, 1.3)
    assert c.streams[0].contiguous == 1 and 3 in c.streams[0].pending
    nacks = [x for x in c.tick(1.4) if isinstance(x, Send) and x.kind == "nack"]
    assert len(nacks) == 1 and nacks[0].band == BAND_REPAIR
    kind, tx, n = decode(nacks[0].payload, room_tag(cfg), 3)
    assert (n.target, n.stream, n.ranges) == (0, 0, ((2, 2),))  # names the origin
    # the origin answers after coalescing, on c's inbox band only
    assert not [x for x in a.on_message(BAND_REPAIR, nacks[0].payload, 1.5)
                if isinstance(x, Send)]
    repairs = [x for x in a.tick(1.6) if isinstance(x, Send) and x.kind.startswith("repair")]
    assert [(r.band, r.kind) for r in repairs] == [(cfg.inbox_band("c"), "repair")]
    assert cfg.inbox_band("c") in c.bands() and cfg.inbox_band("c") not in b.bands()
    c.on_message(repairs[0].band, repairs[0].payload, 1.7)
    assert c.streams[0].contiguous == 3


def test_the_same_message_missed_by_two_sites_is_resent_once_multicast() -> None:
    cfg = IGOConfig(sites=("a", "b", "c", "d"))
    a = SiteOrdering(cfg, "a", 0.0, incarnation=1)
    a.submit(b"x", 1.0)
    a.submit(b"y", 1.1)
    for req in (1, 2):  # b and c ask for seq 1
        nk = encode_nack(room_tag(cfg), req, Nack(0, 0, 0, ((1, 1),), inc=1))
        a.on_message(BAND_REPAIR, nk, 1.2)
    out = [x for x in a.tick(1.3) if isinstance(x, Send) and x.kind.startswith("repair")]
    assert [(x.band, x.kind) for x in out] == [(cfg.data_band, "repair-multicast")]


def test_a_destination_too_far_behind_is_dropped_not_served() -> None:
    cfg = IGOConfig(sites=("a", "b"), max_lag=10)
    a = SiteOrdering(cfg, "a", 0.0, incarnation=1)
    for i in range(30):
        a.submit(b"m%d" % i, 1.0 + i * 0.01)
    nk = encode_nack(room_tag(cfg), 1, Nack(0, 0, 0, ((1, 30),), inc=1))
    out = a.on_message(BAND_REPAIR, nk, 2.0) + a.tick(2.1)
    kinds = [x.kind for x in out if isinstance(x, Send)]
    assert "gone" in kinds
    assert kinds.count("repair") == 10  # only the last max_lag messages are served
    # the requester skips below the floor and goes on
    b = SiteOrdering(cfg, "b", 0.0, incarnation=2)
    hb = encode_heartbeat(room_tag(cfg), 0, Heartbeat(1, 31, 30, 3, 0, 0, (30, 0)))
    # first contact at b's start-up resumes at 30: nothing to ask now; the last max_lag
    # messages are history, fetched in the background (low priority) and shown late
    out = b.on_message(BAND_HEARTBEAT, hb, 2.0)
    assert not [x for x in out if isinstance(x, Send) and x.kind == "nack"]
    assert b.streams[0].contiguous == 30 and b.counters["skipped.history"] == 30
    assert b.counters["history.wanted"] == 10
    low = [x for x in b.tick(2.1) if isinstance(x, Send) and x.kind == "nack-low"]
    assert low and decode(low[0].payload, room_tag(cfg), 2)[2].ranges[0][0] == 21


# ============================================================================ Lamport order
def test_lamport_order_is_global_and_latency_follows_the_message_rate() -> None:
    net = LoopNet(IGOConfig(sites=("a", "b", "c", "d")), seed=4, delay=0.05, jitter=0.1)
    chatter(net, net.sites, stop=40)
    net.run_until(50)
    assert_complete(net)
    ref = net.order("a")
    for s in net.sites:
        assert net.order(s) == ref
        keys = [(d.lamport, "abcd".index(d.origin)) for d in net.log[s]]
        assert keys == sorted(keys)
        assert not any(d.late for d in net.log[s])
    lat = [d.latency for d in net.log["b"] if d.send_time > 5]
    assert 0.1 < sum(lat) / len(lat) < 1.0  # ~ the mean inter-message gap (seed: ~0.5 s)


def test_a_reply_is_never_delivered_before_its_question() -> None:
    # c hears a's question late (slow a->c path) but b's reply fast
    slow = {("a", "c"): 2.0}
    net = LoopNet(IGOConfig(sites=ABC), delay_fn=lambda s, d, t: slow.get((s, d), 0.01))
    net.at(1.0, net.submit, "a", b"question")

    def reply() -> None:
        assert [d.payload for d in net.log["b"]] == [b"question"]
        net.submit("b", b"answer")

    net.at(1.5, reply)
    net.run_until(10)
    assert [d.payload for d in net.log["c"]] == [b"question", b"answer"]


# ============================================================================ detection, states
def test_disconnect_detected_after_three_missed_heartbeats_and_long_term_after_15_s() -> None:
    net = LoopNet(IGOConfig(sites=("a", "b")), delay=0.01, tick=0.05)
    net.run_until(10.0)
    net.partition(["a"], ["b"])
    net.run_until(40.0)
    a = net.sites["a"]
    last = a.peers[1].last_heard
    ev = [(e.time, e.old, e.new) for e in net.states("a") if e.peer == "b"]
    assert [x[1:] for x in ev] == [("unknown", "S1"), ("S1", "S2"), ("S2", "S3")]
    assert ev[1][0] - last == pytest.approx(6.0, abs=0.06)
    assert ev[2][0] - last == pytest.approx(15.0, abs=0.06)
    overall = [(e.old, e.new) for e in net.states("a") if e.peer is None]
    assert overall == [("S1", "S2"), ("S2", "S3")]
    assert a.members == ("a",)


def test_short_disconnect_goes_s1_s2_s1_with_reconciliation() -> None:
    net = LoopNet(IGOConfig(sites=("a", "b")), delay=0.01)
    chatter(net, ["a", "b"], stop=40)
    net.at(10, net.partition, ["a"], ["b"])
    net.at(20, net.heal)
    net.run_until(50)
    ev = [(e.old, e.new) for e in net.states("a") if e.peer == "b"]
    assert ev == [("unknown", "S1"), ("S1", "S2"), ("S2", "S1")]
    assert net.sites["a"].counters["reconcile.done"] == 1
    assert_complete(net)  # no gaps in per-site sequence numbers


# ============================================================================ delay vs hasten
def _partition_run(mode: str) -> LoopNet:
    net = LoopNet(IGOConfig(sites=ABC, mode=mode), seed=5, delay=0.02, jitter=0.02)
    chatter(net, ABC, stop=50)
    net.at(10, net.partition, ["a", "b"], ["c"])
    net.at(20, net.heal)
    net.run_until(60)
    return net


def test_delay_delivery_holds_messages_and_keeps_one_global_order() -> None:
    net = _partition_run("all-to-all")
    assert_complete(net)
    assert net.order("a") == net.order("b") == net.order("c")
    for s in ABC:
        assert not any(d.late for d in net.log[s])
        # nothing sent during the outage was shown before the network healed
        during = [d for d in net.log[s] if 10.5 < d.send_time < 19]
        assert during and min(d.delivery_time for d in during) >= 20


def test_hasten_delivery_keeps_chatting_and_flags_reconciled_messages_late() -> None:
    net = _partition_run("hasten")
    assert_complete(net)
    log_a = net.log["a"]
    # a and b chat again right after detection (~6 s), long before the heal
    ab = [d for d in log_a if d.origin in ("a", "b") and 11 < d.send_time < 19]
    assert ab and max(d.delivery_time for d in ab) < 20
    # c's messages from the outage come after the heal, flagged late
    c_out = [d for d in log_a if d.origin == "c" and 11 < d.send_time < 19]
    assert c_out and all(d.late and d.delivery_time >= 20 for d in c_out)
    assert checks.order_violations(net.log, ABC) == []
    for x, y in itertools.combinations(ABC, 2):
        assert checks.agreement_violations(net.log[x], net.log[y]) == []


# ============================================================================ leader mode
def test_leader_mode_orders_by_the_leader_and_a_cut_site_keeps_intra_site_chat() -> None:
    sites = ("a", "b", "c", "hub")
    net = LoopNet(IGOConfig(sites=sites, mode="leader", leader="hub"), seed=6, delay=0.02)
    chatter(net, ABC, stop=50)

    def cut() -> None:  # c loses the leader only (seed L1)
        net.cut = {frozenset(("c", "hub"))}

    net.at(10, cut)
    net.at(20, net.heal)
    net.run_until(60)
    logs = {s: net.log[s] for s in ABC}
    assert checks.order_violations(logs, sites, leader=True) == []
    assert net.order("a") == net.order("b")  # connected to the leader: the same order
    c_log = net.log["c"]
    local = [d for d in c_log if d.local]
    assert local and all(d.origin == "c" for d in local)
    assert all(d.latency < 6.5 for d in local)  # delivered at once, or at detection
    # c does not get what a and b said while it was cut off (seed 6.3.3) ...
    sent = sent_counts(net)
    assert checks.gaps(c_log, "a", sent["a"])
    # ... but a and b get all of c's messages, the reconciled ones flagged late
    for s in ("a", "b"):
        assert checks.gaps(net.log[s], "c", sent["c"]) == []
        assert any(d.late and d.origin == "c" for d in net.log[s])
    assert [e.members for e in net.events["c"] if isinstance(e, MembershipChange)][-2:] == \
        [("c",), ("a", "b", "c", "hub")]


def test_leader_latency_is_a_round_trip_not_the_message_gap() -> None:
    sites = ("a", "b", "hub")
    net = LoopNet(IGOConfig(sites=sites, mode="leader", leader="hub"), delay=0.02)
    chatter(net, ("a", "b"), stop=20, mean_gap=2.0)
    net.run_until(25)
    lat = [d.latency for d in net.log["a"]]
    assert lat and max(lat) < 0.1


# ============================================================================ reconciliation
@pytest.mark.parametrize("mode", ["all-to-all", "hasten"])
def test_reconciliation_after_short_disconnect_leaves_no_gaps(mode: str) -> None:
    net = LoopNet(IGOConfig(sites=("a", "b", "c", "d"), mode=mode), seed=8, delay=0.03,
                  loss=0.05)
    chatter(net, net.sites, stop=70)
    for t in (10, 40):
        net.at(t, net.partition, ["a", "b"], ["c", "d"])
        net.at(t + 10, net.heal)
    net.run_until(85)
    assert_complete(net)
    assert all(o.counters["skipped.long-term"] == 0 for o in net.sites.values())


def test_long_term_disconnect_skips_without_reconciliation_then_fetches_at_low_rate() -> None:
    for lt in (False, True):
        net = LoopNet(IGOConfig(sites=("a", "b"), long_term_reconcile=lt,
                                long_term_rate=5.0), delay=0.01)
        chatter(net, ["a", "b"], stop=60)
        net.at(10, net.partition, ["a"], ["b"])
        net.at(35, net.heal)
        net.run_until(80 if lt else 60)
        sent = sent_counts(net)
        missing = checks.gaps(net.log["a"], "b", sent["b"])
        if not lt:
            assert missing and net.sites["a"].counters["skipped.long-term"] == len(missing)
        else:
            assert missing == []
            fetched = [d for d in net.log["a"] if d.origin == "b" and 10 < d.send_time < 35]
            assert fetched and all(d.late for d in fetched if d.delivery_time > 36)
            assert net.sites["a"].counters["sent.nack-low"] > 0


def _lose_first_low_answers(net: LoopNet, to: str, count: int) -> list[int]:
    """Lose the first *count* low-priority answers (history, long-term fetches) to *to*."""
    lost: list[int] = []

    def drop(src: str, dst: str, send: Send) -> bool:
        if dst == to and send.kind == "repair-low" and len(lost) < count:
            lost.append(decode(send.payload, room_tag(net.cfg), len(net.cfg.sites))[2].seq)
            return True
        return False

    net.drop = drop
    return lost


def test_a_lost_long_term_answer_is_asked_again() -> None:
    """Long-term reconciliation: the answers to the first low-priority requests are lost.
    Nothing newer asks for those numbers again, so they stayed gaps for good; now each
    request is retried on its own timer (only the numbers still missing) and every
    message b sent during the partition reaches a once."""
    net = LoopNet(IGOConfig(sites=("a", "b"), long_term_reconcile=True, long_term_rate=5.0),
                  delay=0.01)
    chatter(net, ["a", "b"], stop=60)
    net.at(10, net.partition, ["a"], ["b"])
    net.at(35, net.heal)
    lost = _lose_first_low_answers(net, "a", 6)
    net.run_until(120)
    assert len(lost) == 6
    sent = sent_counts(net)
    assert checks.gaps(net.log["a"], "b", sent["b"]) == []
    ids = [(d.origin, d.seq) for d in net.log["a"]]
    assert len(ids) == len(set(ids))
    counters = net.sites["a"].counters
    assert counters["history.retry"] >= 1 and not counters["history.given-up"]


def test_a_restarted_site_asks_again_for_history_whose_answer_was_lost() -> None:
    """A restarted site (display marks kept) fetches what it missed while down in the
    background; the first answers are lost. It asks again, paced, and shows every
    message once, the history flagged late."""
    cfg = IGOConfig(sites=ABC, mode="hasten", long_term_rate=5.0)
    net = LoopNet(cfg, delay=0.01)
    chatter(net, ABC, stop=60)
    net.run_until(20)
    old = net.sites["b"]
    marks = old.display_marks()
    shown = {(d.origin, d.seq) for d in net.log["b"]}
    net.partition(["a", "c"], ["b"])  # b is down from 20 s to 30 s
    net.run_until(30)
    new = SiteOrdering(cfg, "b", net.now, incarnation=old.inc + 10_000, shown=marks)
    net.sites["b"] = new
    net.heal()
    lost = _lose_first_low_answers(net, "b", 4)
    net.run_until(120)
    assert len(lost) == 4 and new.counters["history.wanted"] > 10
    after = [d for d in net.log["b"] if d.delivery_time >= 30 and d.origin != "b"]
    ids = [(d.origin, d.seq) for d in after]
    assert len(ids) == len(set(ids)) and not set(ids) & shown
    for o in ("a", "c"):
        said = {q for s, t, q in net.send_log if s == o}
        seen = {q for x, q in shown | set(ids) if x == o}
        assert said - seen == set(), o
    history = [d for d in after if d.send_time < 30]
    assert history and all(d.late for d in history)
    assert new.counters["history.retry"] >= 1


def test_display_rate_limit_spreads_a_reconciliation_burst() -> None:
    net = LoopNet(IGOConfig(sites=("a", "b"), mode="all-to-all", display_rate=5.0,
                            display_burst=1), delay=0.01)
    chatter(net, ["a", "b"], stop=30, mean_gap=0.2)
    net.at(5, net.partition, ["a"], ["b"])
    net.at(12, net.heal)
    net.run_until(90)
    times = sorted(d.delivery_time for d in net.log["a"])
    assert_complete(net)
    for i in range(len(times) - 6):
        assert times[i + 5] - times[i] >= 5 / 5.0 - 1e-6  # never more than 5/s


def test_stability_tracking_gives_connected_sites_the_same_sequence_without_transitivity(
) -> None:
    results = {}
    for stab in (False, True):
        net = LoopNet(IGOConfig(sites=ABC, mode="hasten", stability=stab), seed=3,
                      delay=0.02, jitter=0.02)
        chatter(net, ABC, stop=55, seed=5)
        net.at(10, setattr, net, "cut", {frozenset("ac")})  # a-c only: b sees both
        net.at(40, net.heal)
        net.run_until(70)
        results[stab] = checks.agreement_violations(net.log["a"], net.log["b"],
                                                    in_order_only=False)
        if stab:
            assert_complete(net, ["a", "b"])
    assert results[False], "without stability tracking a and b should disagree here"
    assert results[True] == []
