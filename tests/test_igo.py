"""The IGO ordering layer (flowchat.igo) as a pure state machine: deterministic, virtual
time, the in-memory multicast network of flowchat.loopnet (no routers).

Covers seed 003's mechanisms one by one (FIFO + repair, Lamport order, heartbeat detection,
S1/S2/S3, delay vs hasten, leader mode, reconciliation without gaps), the additions
(stability tracking, long-term reconciliation, display-rate limit, dropping a lagging
destination), robustness against malformed frames, and property tests over random
interleavings, loss and partitions."""

from __future__ import annotations

import itertools
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowchat import checks
from flowchat.igo import (
    BAND_HEARTBEAT,
    BAND_ORDER,
    BAND_REPAIR,
    DataMsg,
    Deliver,
    Heartbeat,
    IGOConfig,
    MembershipChange,
    Nack,
    PeerState,
    ProtocolError,
    Send,
    SiteOrdering,
    StateChange,
    decode,
    encode_data,
    encode_heartbeat,
    encode_nack,
    room_tag,
)
from flowchat.loopnet import LoopNet

ABC = ("a", "b", "c")


def chatter(net: LoopNet, senders, start: float = 1.0, stop: float = 1e9, seed: int = 7,
            mean_gap: float = 0.5) -> None:
    """Each sender submits with gaps uniform in [0, 2*mean_gap] from *start* until *stop*."""
    rng = random.Random(seed)

    def bot(s: str) -> None:
        if net.now >= stop:
            return
        net.submit(s)
        net.at(net.now + rng.uniform(0, 2 * mean_gap), bot, s)

    for s in senders:
        net.at(start + rng.uniform(0, mean_gap), bot, s)


def sent_counts(net: LoopNet) -> dict[str, int]:
    return {s: o.seq for s, o in net.sites.items()}


def assert_complete(net: LoopNet, sites=None) -> None:
    """Every site delivered every message of every origin exactly once."""
    sent = sent_counts(net)
    for s in sites or net.sites:
        for o, n in sent.items():
            assert checks.gaps(net.log[s], o, n) == [], f"{s} misses messages of {o}"
    assert checks.fifo_violations(net.log) == []


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


# ============================================================================ robustness
def test_malformed_input_is_counted_never_fatal() -> None:
    cfg = IGOConfig(sites=ABC, mode="leader", leader="c")
    a = SiteOrdering(cfg, "a", 0.0, incarnation=1)
    tag = room_tag(cfg)
    good = encode_data(tag, 1, DataMsg(1, 9, 1, 0, 0.5, 0, ((0, 3, 1), (2, 4, 1)), b"hi"))
    a.tick(0.5)  # initial membership and first heartbeat
    cases = {
        "short": b"IG",
        "magic": b"XX" + good[2:],
        "version": good[:2] + b"\x07" + good[3:],
        "kind": good[:3] + b"\x63" + good[4:],
        "index": good[:8] + b"\x09" + good[9:],
        "truncated": good[:15],
        "deps": encode_data(tag, 1, DataMsg(1, 9, 1, 0, 0.5, 0, ((7, 1, 1),), b"x")),
        "incarnation": encode_data(tag, 1, DataMsg(1, 0, 1, 0, 0.5, 0, (), b"x")),
        "seq": encode_data(tag, 1, DataMsg(1, 9, 0, 0, 0.5, 0, (), b"x")),
        "range": encode_nack(tag, 1, Nack(0, 1, 0, ((5, 2),))),
        "length": encode_heartbeat(tag, 1, Heartbeat(9, 0, 0, 0, 0, 0, (0, 0, 0))) + b"!",
        "acks": encode_heartbeat(tag, 1, Heartbeat(9, 0, 0, 0, 0, 0, (0,))),
        "time": encode_data(tag, 1, DataMsg(1, 9, 1, 0, float("nan"), 0, (), b"x")),
    }
    for reason, payload in cases.items():
        assert a.on_message(cfg.data_band if reason not in ("range", "length", "acks")
                            else (BAND_REPAIR if reason == "range" else BAND_HEARTBEAT),
                            payload, 1.0) == []
        assert a.counters[f"malformed.{reason}"] == 1, reason
    # the wire format before incarnations named streams (version 1) is refused, counted apart
    assert a.on_message(cfg.data_band, good[:2] + b"\x01" + good[3:], 1.0) == []
    assert a.counters["refused.old-version"] == 1 and a.status()["counters"][
        "refused.old-version"] == 1
    a.on_message(BAND_HEARTBEAT, good, 1.0)  # data on the heartbeat band
    assert a.counters["malformed.band"] == 1
    a.on_message(BAND_ORDER, _order_from(tag, 1), 1.0)  # ORDER from a non-leader
    assert a.counters["malformed.order-not-leader"] == 1
    other = encode_data(room_tag(IGOConfig(sites=ABC, room="elsewhere")), 1,
                        DataMsg(1, 9, 1, 0, 0.5, 0, (), b"x"))
    a.on_message(cfg.data_band, other, 1.0)
    assert a.counters["foreign"] == 1
    a.on_message(BAND_HEARTBEAT, b"HB\x01\x00" + bytes(20), 1.0)  # a flowlib heartbeat
    assert a.counters["foreign.flowlib-heartbeat"] == 1
    rng = random.Random(1)
    for _ in range(500):  # random garbage, and random corruptions of a good frame
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        a.on_message(rng.choice([16, 20, 21, 32, 64]), junk, 1.0)
        bad = bytearray(good)
        bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        a.on_message(cfg.data_band, bytes(bad), 1.0)
    # still works (corruptions that stay well-formed are accepted as what they say: the
    # flow's transport is what protects integrity)
    out = a.submit(b"still here", 2.0) + a.tick(3.0)
    assert any(isinstance(x, Send) and x.kind == "data" for x in out)
    assert sum(v for k, v in a.counters.items() if k.startswith("malformed.")) > 500


def _order_from(tag: int, tx: int) -> bytes:
    from flowchat.igo import Order, encode_order
    return encode_order(tag, tx, Order(1, 0, 1, ((0, 1, 1, 0),)))


def test_decode_rejects_what_encode_never_makes() -> None:
    tag = 5
    with pytest.raises(ProtocolError):
        decode(b"IG\x01\x03" + struct.pack("!I", tag) + b"\x00" + b"\x00\x00\x00\x00", tag, 3)
    m = DataMsg(2, 7, 3, 44, 1.25, 1, ((0, 5, 1), (1, 6, 2), (1, 9, 3)), b"payload")
    assert decode(encode_data(tag, 2, m), tag, 3) == (1, 2, m)


def test_a_restarted_peer_is_resynchronised() -> None:
    cfg = IGOConfig(sites=("a", "b"))
    net = LoopNet(cfg, delay=0.01)
    chatter(net, ["a", "b"], stop=40)
    net.run_until(20)
    # b restarts (a later run: a larger incarnation)
    net.sites["b"] = SiteOrdering(cfg, "b", net.now, incarnation=1777)
    net.run_until(45)
    assert net.sites["a"].counters["peer.restarted"] == 1
    assert net.sites["a"].peer_state("b") is PeerState.S1
    later = [d for d in net.log["a"] if d.origin == "b" and d.send_time > 22]
    assert later and not checks.fifo_violations({"a": net.log["a"][-len(later):]})


# ============================================================================ properties
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), loss=st.sampled_from([0.0, 0.05, 0.2]),
       jitter=st.sampled_from([0.0, 0.05, 0.3]), mode=st.sampled_from(["all-to-all", "hasten"]),
       n=st.integers(2, 4))
def test_property_global_order_while_connected(seed, loss, jitter, mode, n) -> None:
    # "Connected" must hold for the whole run: at 20% loss three heartbeats in a row go missing
    # now and then, a peer is (rightly) suspected, and IGO then delivers what waits as late.
    # Ten missed heartbeats make a false suspicion practically impossible here; so must the
    # stall detector's time-out (a repair lost three times in a row at 20% loss blocks a
    # stream for 20 s now and then, which it rightly reports as a disconnect).
    sites = tuple("abcd"[:n])
    cfg = IGOConfig(sites=sites, mode=mode, missed_heartbeats=10, disconnect_interval=60.0,
                    stall_timeout=60.0)
    net = LoopNet(cfg, seed=seed, delay=0.01, jitter=jitter, loss=loss)
    chatter(net, sites, stop=12, seed=seed, mean_gap=0.3)
    net.run_until(70)
    assert_complete(net)
    assert not any(c.new == "S2" for s in sites for c in net.states(s))  # the premise held
    ref = net.order(sites[0])
    for s in sites:
        assert net.order(s) == ref
        assert not any(d.late for d in net.log[s])
    assert checks.causal_violations(net.log, net.delivered_at_send) == []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["all-to-all", "hasten", "leader"]),
       down=st.sampled_from([4.0, 10.0, 25.0]), split=st.integers(1, 3),
       loss=st.sampled_from([0.0, 0.05]))
def test_property_partitions_keep_the_ordering_properties(seed, mode, down, split,
                                                          loss) -> None:
    chatters = ("a", "b", "c", "d")
    sites = chatters + (("hub",) if mode == "leader" else ())
    cfg = IGOConfig(sites=sites, mode=mode, leader="hub" if mode == "leader" else None)
    net = LoopNet(cfg, seed=seed, delay=0.02, jitter=0.05, loss=loss)
    chatter(net, chatters, stop=60, seed=seed, mean_gap=0.4)
    left = list(chatters[:split]) + (["hub"] if mode == "leader" else [])
    right = list(chatters[split:])
    net.at(8, net.partition, left, right)
    net.at(8 + down, net.heal)
    net.run_until(75)
    logs = {s: net.log[s] for s in chatters}
    assert checks.fifo_violations(logs) == []
    assert checks.order_violations(logs, sites, leader=mode == "leader") == []
    # causal order, always
    assert checks.causal_violations(logs, net.delivered_at_send) == []
    # the same order at every site of a partition (and, while connected, everywhere)
    for x, y in itertools.combinations(chatters, 2):
        assert checks.agreement_violations(logs[x], logs[y], names=(x, y)) == []
    sent = sent_counts(net)
    if down < 15.0 and mode != "leader":
        assert_complete(net, chatters)  # short-term: reconciled, no gaps
        if mode == "all-to-all":
            ref = net.order("a")
            assert all(net.order(s) == ref for s in chatters)  # delay-delivery: global
    # within a side nothing is ever lost
    for side in (chatters[:split], chatters[split:]):
        for x in side:
            for o in side:
                if mode == "leader" and x not in left:
                    continue  # cut off from the leader: intra-site only
                assert checks.gaps(logs[x], o, sent[o]) == [], (x, o)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_random_interleavings_converge(data) -> None:
    """Frames delivered in any order, duplicated or dropped (then repaired): every site
    ends with the same complete sequence."""
    cfg = IGOConfig(sites=ABC)
    sites = {s: SiteOrdering(cfg, s, 0.0, incarnation=i + 1) for i, s in enumerate(ABC)}
    logs = {s: [] for s in ABC}
    inflight: list[tuple[str, Send]] = []
    now = 0.0

    def apply(s: str, acts) -> None:
        for x in acts:
            if isinstance(x, Send):
                inflight.append((s, x))
            elif isinstance(x, Deliver):
                logs[s].append(x.delivery)

    for s in ABC:
        apply(s, sites[s].tick(now))
    while inflight:  # the first heartbeats arrive: every site knows where the others start
        src, f = inflight.pop(0)
        for dst in ABC:
            if dst != src and f.band in sites[dst].bands():
                apply(dst, sites[dst].on_message(f.band, f.payload, now))
    steps = data.draw(st.integers(20, 120))
    for _ in range(steps):
        now += data.draw(st.sampled_from([0.0, 0.01, 0.3]))
        op = data.draw(st.sampled_from(["submit", "deliver", "deliver", "drop", "dup", "tick"]))
        if op == "submit":
            s = data.draw(st.sampled_from(ABC))
            apply(s, sites[s].submit(b"m", now))
        elif op == "tick":
            for s in ABC:
                apply(s, sites[s].tick(now))
        elif inflight:
            i = data.draw(st.integers(0, len(inflight) - 1))
            src, f = inflight[i] if op == "dup" else inflight.pop(i)
            if op != "drop":
                for dst in ABC:
                    if dst != src and f.band in sites[dst].bands():
                        apply(dst, sites[dst].on_message(f.band, f.payload, now))
    # then a quiet, lossless network until everything settles
    for _ in range(300):
        now += 0.1
        while inflight:
            src, f = inflight.pop(0)
            for dst in ABC:
                if dst != src and f.band in sites[dst].bands():
                    apply(dst, sites[dst].on_message(f.band, f.payload, now))
        for s in ABC:
            apply(s, sites[s].tick(now))
    seqs = {s: [(d.origin, d.seq) for d in logs[s]] for s in ABC}
    for s in ABC:
        for o in ABC:
            assert sorted(q for (x, q) in seqs[s] if x == o) == \
                list(range(1, sites[o].seq + 1)), (s, o)
    assert seqs["a"] == seqs["b"] == seqs["c"]


def test_membership_and_state_events_are_reported() -> None:
    net = LoopNet(IGOConfig(sites=ABC), delay=0.01)
    net.run_until(1.0)
    assert [e.members for e in net.events["a"] if isinstance(e, MembershipChange)][-1] == ABC
    net.partition(["a"], ["b", "c"])
    net.run_until(30)
    kinds = {(e.peer, e.new) for e in net.events["a"] if isinstance(e, StateChange)}
    assert {("b", "S2"), ("c", "S2"), ("b", "S3"), (None, "S3")} <= kinds
    assert net.sites["a"].status()["members"] == ["a"]


def test_a_first_message_lost_at_start_up_is_repaired_and_ordered() -> None:
    """Regression (hypothesis found it): every site starts together, c's first message is
    lost on the way to b. b must fetch it rather than skip it as history, and must not
    order anything past c before it has heard c at all."""
    sites = ("a", "b", "c")
    net = LoopNet(IGOConfig(sites=sites, mode="all-to-all"), seed=4029, delay=0.01,
                  jitter=0.0, loss=0.05)
    chatter(net, sites, stop=12, seed=4029, mean_gap=0.3)
    net.run_until(70)
    assert_complete(net)
    assert net.sites["b"].counters["first-contact.fetch"] >= 1
    assert net.sites["b"].counters["skipped.long-term"] == 0
    ref = net.order("a")
    assert net.order("b") == ref and net.order("c") == ref


def test_peer_states_follow_the_transition_table() -> None:
    """Seed 003 Figure 10 as a table: silence detected (S1 -> S2), long silence (S2 -> S3),
    reconciled (S2 -> S1), contact after a long-term disconnect (S3 -> S1); events a state
    does not take leave it unchanged."""
    from flowchat.igo.peerevents import TRANSITIONS, PeerEvent

    S = PeerState
    assert TRANSITIONS[(S.S1, PeerEvent.SILENT)] is S.S2
    assert TRANSITIONS[(S.S2, PeerEvent.LONG_SILENCE)] is S.S3
    assert TRANSITIONS[(S.S2, PeerEvent.RECONCILED)] is S.S1
    assert TRANSITIONS[(S.S3, PeerEvent.CONTACT)] is S.S1
    assert TRANSITIONS[(S.UNKNOWN, PeerEvent.SILENT)] is S.S3
    assert (S.S3, PeerEvent.SILENT) not in TRANSITIONS
    assert (S.S1, PeerEvent.RECONCILED) not in TRANSITIONS
    # driven through a site: a peer that falls silent goes S1 -> S2 -> S3 on the timers
    cfg = IGOConfig(sites=("a", "b"), mode="hasten", heartbeat_interval=1.0,
                    missed_heartbeats=2, disconnect_interval=5.0)
    a = SiteOrdering(cfg, "a", 0.0, incarnation=1)
    b = SiteOrdering(cfg, "b", 0.0, incarnation=2)
    for act in b.tick(0.0):
        if isinstance(act, Send):
            a.on_message(act.band, act.payload, 0.0)
    assert a.peer_state("b") is S.S1
    changes = [x for t in (1.0, 2.0, 3.0, 6.0, 8.0) for x in a.tick(t)
               if isinstance(x, StateChange) and x.peer == "b"]
    assert [(c.old, c.new) for c in changes] == [("S1", "S2"), ("S2", "S3")]


def test_repair_is_paced_by_bytes_and_deduplicated() -> None:
    """A repeated request for messages already on their way is not answered twice, and the
    answers leave at no more than ``repair_bytes`` a second, whatever was asked."""
    cfg = IGOConfig(sites=("a", "b"), repair_bytes=8000.0, repair_dedup=1.0)
    a = SiteOrdering(cfg, "a", 0.0, incarnation=1)
    for i in range(20):
        a.submit(b"x" * 2000, 1.0 + i * 0.01)
    nk = encode_nack(room_tag(cfg), 1, Nack(0, 0, 0, ((1, 20),), inc=1))
    sent: list[float] = []
    t = 2.0
    a.on_message(BAND_REPAIR, nk, t)
    while t < 9.0:
        t = round(t + 0.1, 3)
        if abs(t - 2.5) < 1e-9:  # the same request again while the answers trickle out
            a.on_message(BAND_REPAIR, nk, t)
        sent += [t for x in a.tick(t) if isinstance(x, Send) and x.kind == "repair"]
    assert len(sent) == 20  # each message once
    assert a.counters["repair.deduplicated"] > 0 and a.counters["repair.paced"] > 0
    for start in (3.0, 4.0, 5.0):  # after the first second's burst: ~4 x 2 KB a second
        assert sum(1 for x in sent if start <= x < start + 1.0) <= 5


def test_a_backlog_that_drains_is_not_a_stall() -> None:
    """The order stream after a merge: a hundred numbers known at once and worked through
    at ten a second. The oldest waits longer than the time-out, but the stream advances
    and its backlog shrinks: no stall. The same numbers with the stream stopped (a
    flapping link's down window) or advancing slower than new numbers come are one."""
    from flowchat.igo.stall import StallWatch

    def run(rate: float, arrivals: float) -> float | None:
        w = StallWatch(8.0)
        known, done = 0.0, 0.0
        for k in range(300):
            now = k * 0.1
            known += 100 if k == 10 else arrivals * 0.1
            if now > 1.0:
                done = min(known, done + rate * 0.1)
            if w.backlog_stalled("order", int(known), int(done), now):
                return now
        return None

    assert run(rate=10.0, arrivals=2.0) is None  # drains: ~12 s to clear, never stalled
    stopped = run(rate=0.0, arrivals=2.0)  # stopped: 8 s after the first number was known
    assert stopped is not None and 8.0 <= stopped <= 9.0
    assert run(rate=1.5, arrivals=2.0) is not None  # advancing, but the backlog grows


def test_acknowledgements_that_advance_are_not_a_stall() -> None:
    """Our messages on a slow path to the leader: each waits longer than the time-out for
    its acknowledgement, but the acknowledgements advance with every heartbeat (2 s): not
    a stall; acknowledgements that stop for half the time-out are one."""
    from flowchat.igo.stall import StallWatch

    w = StallWatch(8.0)
    for k in range(200):  # acked every 2 s, each message acknowledged 9 s after it was sent
        now = k * 0.1
        held = int(now // 2.0) * 4
        assert not w.acks_stalled("own", now - 9.0, held, now)
    w = StallWatch(8.0)
    fired = [k * 0.1 for k in range(200) if w.acks_stalled("own", 0.0, 5, k * 0.1)]
    assert fired and fired[0] == pytest.approx(8.0)


def test_a_holder_is_asked_only_for_what_it_holds_and_the_rest_of_the_origin() -> None:
    """c lacks a#2..#6; its request to a goes unanswered (a flapping link's down window),
    so the retry turns to b, which acknowledges a only up to #3. b is asked for #2..#3
    alone (it answers nothing beyond its acknowledgement) and #4..#6 are asked of a in the
    same moment. Before, b was asked for all five, answered #2..#3, and that answer was
    progress that put off asking a for the rest for a whole retry time-out (3 s): on the
    seed testbed's flapping links the leader lost an up window so and declared metropol
    stalled, its messages shown 17 s late."""
    cfg = IGOConfig(sites=ABC, mode="hasten", agreed_views=False)
    tag = room_tag(cfg)
    c = SiteOrdering(cfg, "c", 0.0, incarnation=3)
    out: list = []

    def hb(tx: int, high: int, acks: tuple[int, ...], now: float) -> None:
        frame = encode_heartbeat(tag, tx, Heartbeat(tx + 1, 10, high, 0, 0, 0, acks, (0, 0),
                                                    (1, 1, 1), (1, 2, 3)))
        out.extend(c.on_message(BAND_HEARTBEAT, frame, now))

    def data(seq: int, now: float) -> None:
        frame = encode_data(tag, 0, DataMsg(0, 1, seq, seq, now, 0, (), b"a#%d" % seq))
        out.extend(c.on_message(cfg.data_band, frame, now))

    hb(0, 0, (0, 0, 0), 0.0)
    hb(1, 0, (0, 0, 0), 0.0)
    data(1, 0.1)
    data(7, 0.2)  # #2..#6 missing
    asked: list[tuple[float, int, tuple]] = []
    t = 0.2
    while t < 4.5:
        t = round(t + 0.1, 2)
        if abs(t % 1.0) < 1e-9:
            hb(0, 7, (7, 0, 0), t)
            hb(1, 0, (3, 0, 0), t)  # b holds a's #1..#3
        for x in c.tick(t) + out:
            if isinstance(x, Send) and x.band == BAND_REPAIR:
                n = decode(x.payload, tag, 3)[2]
                asked.append((t, n.target, n.ranges))
        out.clear()
    to_b = [(at, r) for at, tgt, r in asked if tgt == 1]
    assert to_b and all(hi <= 3 for _, r in to_b for _, hi in r), asked
    first_b = to_b[0][0]
    rest = [r for at, tgt, r in asked if tgt == 0 and first_b <= at <= first_b + 0.2]
    assert rest and rest[0][0] == (4, 6), asked
