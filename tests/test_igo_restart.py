"""A site restarting in the middle of a conversation (flowchat.igo): streams are
``(origin, incarnation)``, never the origin alone.

A restarted site starts its sequence numbers (and Lamport clock) again, so its new run
reuses the numbers of its old one. Dependencies, acknowledgements, repairs and ORDER entries
name the incarnation too, so no number of one run is ever taken for the other's: an old
run's dependency time-out skips nothing of the new run, a dependency on the new run is not
met by the old run's numbers, and every message of both runs is delivered exactly once.
Deterministic: the in-memory LoopNet and frame-level driving of one state machine with the
clock passed in."""

from __future__ import annotations

import random

import pytest

from flowchat import checks
from flowchat.igo import (
    BAND_HEARTBEAT,
    BAND_REPAIR,
    DataMsg,
    Deliver,
    Heartbeat,
    IGOConfig,
    Nack,
    PeerState,
    Send,
    SiteOrdering,
    decode,
    encode_data,
    encode_heartbeat,
    room_tag,
)
from flowchat.igo.core import new_incarnation
from flowchat.loopnet import LoopNet

MsgId = tuple[str, int, int]  #: (origin, incarnation, seq)


def _ids(log) -> list[MsgId]:
    return [(d.origin, d.incarnation, d.seq) for d in log]


def _fifo_per_run(log) -> list[str]:
    """Each (origin, incarnation) stream delivered in sequence order, each message once."""
    out = []
    seen: set[MsgId] = set()
    last: dict[tuple[str, int], int] = {}
    for d in log:
        k = (d.origin, d.incarnation, d.seq)
        if k in seen:
            out.append(f"{k} delivered twice")
        seen.add(k)
        run = (d.origin, d.incarnation)
        if not d.late and d.seq <= last.get(run, 0):
            out.append(f"{k} after #{last[run]}")
        last[run] = max(last.get(run, 0), d.seq)
    return out


@pytest.mark.parametrize(("mode", "leader"), [("all-to-all", None), ("hasten", None),
                                              ("leader", "a"), ("leader", "b")])
def test_a_peer_restarting_mid_conversation_loses_and_repeats_nothing(mode: str,
                                                                      leader: str | None
                                                                      ) -> None:
    """b restarts at t=20 while a, b and c chat (its new run reuses numbers 1, 2, ... of
    the old one, with frames of the old run still in flight). a and c deliver every message
    of both runs of b exactly once, in FIFO order per run, in the same order as each other
    and never before a cause; the restarted b delivers everything a and c say afterwards;
    nothing is skipped or declared lost. In leader mode with b the leader, its new run
    numbers the order from 1 again: a and c follow it from 1, passing over what they
    delivered already."""
    cfg = IGOConfig(sites=("a", "b", "c"), mode=mode, leader=leader)
    net = LoopNet(cfg, seed=3, delay=0.05, jitter=0.05)
    rng = random.Random(1)
    past: dict[MsgId, set[MsgId]] = {}  #: message -> what its sender had delivered then
    runs: dict[str, list[SiteOrdering]] = {s: [net.sites[s]] for s in cfg.sites}
    logs: dict[str, list] = {"a": net.log["a"], "c": net.log["c"]}

    def say(s: str) -> None:
        site = net.sites[s]
        past[(s, site.inc, site.seq + 1)] = set(_ids(net.log[s]))
        net.submit(s)

    def bot(s: str) -> None:
        if net.now < 40:
            say(s)
            net.at(net.now + rng.uniform(0.2, 1.0), bot, s)

    def restart() -> None:
        old = net.sites["b"]
        assert old.seq > 10  # the new run's numbers overlap the old run's
        net.sites["b"] = SiteOrdering(cfg, "b", net.now, incarnation=old.inc + 10_000)
        runs["b"].append(net.sites["b"])
        net.log["b"] = logs["b-new"] = []

    for s in cfg.sites:
        net.at(1 + rng.uniform(0, 0.5), bot, s)
    net.at(20.0, restart)
    net.run_until(70)

    old_b, new_b = runs["b"]
    sent = {("a", runs["a"][0].inc): runs["a"][0].seq, ("c", runs["c"][0].inc): runs["c"][0].seq,
            ("b", old_b.inc): old_b.seq, ("b", new_b.inc): new_b.seq}
    assert new_b.seq > 10
    everything = {(o, inc, s) for (o, inc), n in sent.items() for s in range(1, n + 1)}
    for name in ("a", "c"):
        site = net.sites[name]
        assert sorted(_ids(logs[name])) == sorted(everything), name  # each exactly once
        assert _fifo_per_run(logs[name]) == []
        assert site.counters["peer.restarted"] == 1
        assert site.counters["incarnation.retired"] == 1
        assert not any(k.startswith(("skipped.", "dependency.lost")) for k in site.counters), \
            site.counters
        assert not site.undelivered and not site.retired[1][0].pending
        if leader == "b":
            assert site.counters["leader.restarted"] == 1
    # the restarted b: everything a and c said after it restarted, once each, in order
    after = {(s, runs[s][0].inc, q) for (s, t, q) in net.send_log if s != "b" and t > 20.0}
    got = _ids(logs["b-new"])
    assert after and after <= set(got) and len(got) == len(set(got))
    assert _fifo_per_run(logs["b-new"]) == []
    # one order: a and c agree on the messages delivered in order, and on the order of
    # the late ones among themselves (the new run's first messages, sent before b heard
    # anybody, carry small Lamport times: they come late, flagged, everywhere alike);
    # the restarted b agrees with them on what it shares
    in_order = {n: [m for m, d in zip(_ids(logs[n]), logs[n]) if not (d.late or d.local)]
                for n in ("a", "c", "b-new")}
    assert in_order["a"] == in_order["c"]
    late = {n: [m for m, d in zip(_ids(logs[n]), logs[n]) if d.late] for n in ("a", "c")}
    assert late["a"] == late["c"]
    assert all(m[:2] == ("b", new_b.inc) for m in late["a"]), late["a"]
    # (on what was said after it restarted: the history it fetched at start-up a leader b
    # orders again, after its own first messages, while a and c showed it long ago)
    since = after | {m for m in everything if m[:2] == ("b", new_b.inc)}
    shared = set(in_order["a"]) & set(in_order["b-new"]) & since
    assert [m for m in in_order["a"] if m in shared] == \
        [m for m in in_order["b-new"] if m in shared]
    # causal order, always; at the restarted b, history (what a and c said before b
    # restarted, fetched in the background, shown flagged late) comes after the live
    # messages that answer it, but in causal order among itself
    history = {m for m, d in zip(_ids(logs["b-new"]), logs["b-new"])
               if d.late and m[0] != "b" and m not in after}
    assert all(d.late for m, d in zip(_ids(logs["b-new"]), logs["b-new"]) if m in history)
    for name, log in (("a", logs["a"]), ("c", logs["c"]), ("b", logs["b-new"])):
        pos = {m: i for i, m in enumerate(_ids(log))}
        for m, causes in past.items():
            for cause in causes:
                if name == "b" and cause in history and m not in history:
                    continue
                if m in pos and cause in pos:
                    assert pos[cause] < pos[m], f"{name}: {m} before its cause {cause}"
    assert checks.fifo_violations({"a": logs["a"]}) == []  # incarnation-aware helper


# ----------------------------------------------------------------- frame level: one observer
SITES = ("a", "b", "c", "d")
A, B, C, D = range(4)
OLD_B, NEW_B = 2_000, 3_000
INC = {A: 1_000, C: 4_000}


class Observer:
    """Site d, driven frame by frame with the clock passed in; records its deliveries."""

    def __init__(self, cfg: IGOConfig) -> None:
        self.cfg = cfg
        self.tag = room_tag(cfg)
        self.d = SiteOrdering(cfg, "d", 0.0, incarnation=5_000)
        self.out: list = []
        self.sends: list[Send] = []

    def _take(self, actions) -> None:
        self.out += [a.delivery for a in actions if isinstance(a, Deliver)]
        self.sends += [a for a in actions if isinstance(a, Send)]

    def hb(self, tx: int, inc: int, lamport: int, high: int, now: float) -> None:
        frame = encode_heartbeat(self.tag, tx, Heartbeat(inc, lamport, high, 0, 0, 0,
                                                         (0, 0, 0, 0)))
        self._take(self.d.on_message(BAND_HEARTBEAT, frame, now))

    def data(self, tx: int, origin: int, inc: int, seq: int, lamport: int, now: float,
             deps=(), flags: int = 0) -> None:
        frame = encode_data(self.tag, tx, DataMsg(origin, inc, seq, lamport, now, flags,
                                                  tuple(deps), b"%d/%d#%d" % (origin, inc,
                                                                              seq)))
        self._take(self.d.on_message(self.cfg.data_band, frame, now))

    def tick(self, now: float) -> None:
        self._take(self.d.tick(now))

    def got(self, origin: str, inc: int) -> list[int]:
        return [x.seq for x in self.out if x.origin == origin and x.incarnation == inc]


def test_an_old_runs_dependency_time_out_skips_nothing_of_the_new_run() -> None:
    """d holds b's old run up to #3 (#4 and #5 never reach it), then b restarts and its new
    run's #1, #3..#6 arrive (#2 is late). a's reply a#1 depends on old-run b#5. When that
    dependency times out only the old run's #4..#5 are given up (declared lost, counted);
    the new run's #2, with the same number as an old message, arrives afterwards and is
    delivered: every new-run message once, in order. (Before incarnations named streams
    the time-out skipped new-run #2..#5 and the late #2 was dropped as 'after skip'.)"""
    cfg = IGOConfig(sites=SITES, mode="hasten", dependency_timeout=3.0,
                    agreed_views=False)  # the fake peers below do not answer view records
    ob = Observer(cfg)
    ob.hb(A, INC[A], 10, 0, 0.0)
    ob.hb(B, OLD_B, 1, 0, 0.0)
    ob.hb(C, INC[C], 10, 0, 0.0)
    for s in (1, 2, 3):
        ob.data(B, B, OLD_B, s, s, 0.1 * s)
    assert ob.got("b", OLD_B) == [1, 2, 3]
    ob.hb(B, OLD_B, 6, 5, 0.5)  # old b said #4 and #5 too: d never gets them
    # b restarts: its new run numbers from 1 again
    for s in (1, 3, 4, 5, 6):
        ob.data(B, B, NEW_B, s, 6 + s, 1.0 + 0.01 * s)
    assert ob.d.counters["peer.restarted"] == 1
    assert ob.d.peer_state("b") is PeerState.S1
    # a had delivered old-run b#5 when it replied; then b falls silent (its #2 is held up)
    # and leaves d's ordering set (S2), so only a#1's dependency holds a#1 back
    ob.data(A, A, INC[A], 1, 20, 1.2, deps=[(B, OLD_B, 5)])
    t = 1.2
    while t < 12.0:
        t = round(t + 0.25, 2)
        ob.hb(A, INC[A], 21, 1, t)
        ob.hb(C, INC[C], 21, 0, t)
        ob.tick(t)
    assert ob.d.peer_state("b") is PeerState.S2
    assert "a" in [x.origin for x in ob.out], "a#1 goes once its dependency timed out"
    # old-run #4 and #5 were given up (lost with the old run), nothing of the new run
    lost = ob.d.counters["skipped.restart-lost"] + ob.d.counters["skipped.dependency"]
    assert lost == 2 and ob.d.streams[B].skipped == []
    # new-run b#2 was not skipped: it arrives (late) and is delivered, then #3..#6
    assert ob.got("b", NEW_B) == [1]
    ob.data(B, B, NEW_B, 2, 8, t)
    ob.tick(t + 0.1)
    assert ob.got("b", NEW_B) == [1, 2, 3, 4, 5, 6]
    assert ob.got("b", OLD_B) == [1, 2, 3]
    assert ob.d.counters["data.after-skip"] == 0
    assert _fifo_per_run(ob.out) == []


def test_a_dependency_on_the_new_run_is_not_met_by_the_old_runs_numbers() -> None:
    """d delivered old-run b#1..#5. c (which already heard b's new run) replies with c#1
    depending on new-run b#2. d must not take its old b#5 for it: c#1 waits until new-run
    b#1 and b#2 are delivered, and is shown after them."""
    cfg = IGOConfig(sites=SITES, mode="hasten", dependency_timeout=30.0)
    ob = Observer(cfg)
    for tx, inc in ((A, INC[A]), (B, OLD_B), (C, INC[C])):
        ob.hb(tx, inc, 10, 0, 0.0)
    for s in range(1, 6):
        ob.data(B, B, OLD_B, s, s, 0.1 * s)
    assert ob.got("b", OLD_B) == [1, 2, 3, 4, 5]
    ob.hb(B, OLD_B, 31, 5, 0.9)  # the old run's clock passed 30: Lamport order lets c#1 go
    ob.data(C, C, INC[C], 1, 30, 1.0, deps=[(B, NEW_B, 2)])
    for t in (1.25, 1.5, 2.0):
        ob.hb(A, INC[A], 31, 0, t)
        ob.tick(t)
    assert ob.got("c", INC[C]) == [], "c#1 waits for the new run, not the old run's #2"
    # relayed copies of the new run (b itself not heard yet) name a run d does not track
    ob.data(C, B, NEW_B, 1, 20, 2.1)
    assert ob.d.counters["data.unknown-incarnation"] == 1
    ob.data(B, B, NEW_B, 1, 20, 2.2)  # b's new run itself
    ob.data(B, B, NEW_B, 2, 21, 2.3)
    ob.hb(A, INC[A], 31, 0, 2.5)
    ob.hb(B, NEW_B, 31, 2, 2.5)
    ob.tick(2.5)
    order = [(x.origin, x.incarnation, x.seq) for x in ob.out]
    assert ("c", INC[C], 1) in order
    assert order.index(("b", NEW_B, 2)) < order.index(("c", INC[C], 1))
    assert ob.d.counters["dependency.lost"] == 0


def test_a_stale_frame_of_an_earlier_run_restarts_nothing() -> None:
    """After b's new run is known, a delayed frame of its old run (a heartbeat, or data the
    old run sent just before it stopped) does not 'restart' b back to the old run: the
    heartbeat is counted and ignored, the data goes to the retired old stream, in order."""
    cfg = IGOConfig(sites=SITES, mode="hasten")
    ob = Observer(cfg)
    for tx, inc in ((A, INC[A]), (B, OLD_B), (C, INC[C])):
        ob.hb(tx, inc, 1, 0, 0.0)
    ob.data(B, B, OLD_B, 1, 1, 0.1)
    ob.data(B, B, NEW_B, 1, 5, 0.5)  # restart
    ob.hb(B, OLD_B, 3, 2, 0.6)  # delayed heartbeat of the old run
    assert ob.d.counters["stale-incarnation"] == 1
    ob.data(B, B, OLD_B, 2, 2, 0.7)  # delayed data of the old run
    assert ob.d.counters["data.earlier-run"] == 1
    assert ob.d.streams[B].inc == NEW_B and ob.d.counters["peer.restarted"] == 1
    for t in (1.0, 1.5, 2.0):
        ob.hb(A, INC[A], 9, 0, t)
        ob.hb(B, NEW_B, 9, 1, t)
        ob.hb(C, INC[C], 9, 0, t)
        ob.tick(t)
    assert ob.got("b", OLD_B) == [1, 2] and ob.got("b", NEW_B) == [1]


def test_what_the_old_run_lacks_is_asked_of_holders_then_declared_lost() -> None:
    """d got old-run b#1 and #3 (not #2) when b restarted. The gap in the retired stream
    is asked of the other sites, never of b (whose new run keeps nothing of the old one),
    naming the old incarnation; nobody answers, so after dependency_timeout #2 is declared
    lost (skipped.restart-lost) and #3 is delivered."""
    cfg = IGOConfig(sites=SITES, mode="hasten", dependency_timeout=4.0)
    ob = Observer(cfg)
    for tx, inc in ((A, INC[A]), (B, OLD_B), (C, INC[C])):
        ob.hb(tx, inc, 1, 0, 0.0)
    ob.data(B, B, OLD_B, 1, 1, 0.1)
    ob.data(B, B, OLD_B, 3, 3, 0.2)
    ob.data(B, B, NEW_B, 1, 5, 0.3)  # restart before the repair of #2
    t = 0.3
    while t < 5.0:
        t = round(t + 0.25, 2)
        for tx, inc in ((A, INC[A]), (B, NEW_B), (C, INC[C])):
            ob.hb(tx, inc, 9, 1 if tx == B else 0, t)
        ob.tick(t)
    nacks = [decode(s.payload, ob.tag, 4)[2] for s in ob.sends if s.band == BAND_REPAIR]
    old = [n for n in nacks if isinstance(n, Nack) and n.stream == B and n.inc == OLD_B]
    assert old and all(n.target != B for n in old) and {n.target for n in old} <= {A, C}
    assert ob.d.counters["skipped.restart-lost"] == 1
    assert ob.got("b", OLD_B) == [1, 3] and ob.got("b", NEW_B) == [1]
    assert ob.d.status()["retired"]["b"][0]["missing"] == 0


def test_a_restarted_origin_answers_a_repair_of_its_earlier_run_with_gone() -> None:
    """A NACK naming a run of ours that we no longer are (we restarted) gets GONE past the
    numbers asked: the requester declares them lost instead of receiving our new run's
    messages that happen to have the same numbers."""
    cfg = IGOConfig(sites=("a", "b"))
    b = SiteOrdering(cfg, "b", 0.0, incarnation=NEW_B)
    for i in range(3):
        b.submit(b"new %d" % i, 1.0 + i)
    nk = Nack(1, 1, 0, ((1, 2),), OLD_B)
    from flowchat.igo import encode_nack
    out = b.on_message(BAND_REPAIR, encode_nack(room_tag(cfg), 0, nk), 5.0) + b.tick(5.2)
    sends = [x for x in out if isinstance(x, Send)]
    assert not [x for x in sends if x.kind.startswith("repair")]
    gone = [decode(x.payload, room_tag(cfg), 2)[2] for x in sends if x.kind == "gone"]
    assert [(g.stream, g.inc, g.low) for g in gone] == [(1, OLD_B, 3)]


def test_incarnations_grow_with_start_time() -> None:
    assert new_incarnation(1000.0, 0xFFFF) < new_incarnation(1000.001, 0)
    assert new_incarnation(5.0, 7) != new_incarnation(5.0, 8)
    with pytest.raises(ValueError):
        SiteOrdering(IGOConfig(sites=("a",)), "a", 0.0, incarnation=0)


@pytest.mark.parametrize("keep_sent", [True, False])
def test_a_restarted_site_shows_its_own_last_unshown_messages_once(keep_sent: bool) -> None:
    """b sends two messages and stops at once, before it has shown them itself (in hasten
    mode its own messages wait for the others' clocks too); they reached a and c. With
    its display marks and its sent mark the new run fetches them from a peer and shows them
    once, flagged late, and shows nothing of its own again that it showed before. Without
    the sent mark (an older marks file) they are never shown at b: the gap this fixes."""
    cfg = IGOConfig(sites=("a", "b", "c"), mode="hasten")
    net = LoopNet(cfg, seed=2, delay=0.05)
    for k in range(20):
        net.at(1.0 + k, net.submit, "a")
        net.at(1.5 + k, net.submit, "c")
    for t in (3.2, 4.2):
        net.at(t, net.submit, "b")
    state: dict[str, object] = {}

    def crash() -> None:
        net.submit("b")
        net.submit("b")  # the last two: sent, not shown here yet
        old = net.sites["b"]
        shown_own = {d.seq for d in net.log["b"] if d.origin == "b"}
        assert shown_own == {1, 2} and old.seq == 4
        state.update(old=old, shown=list(net.log["b"]))
        net.sites["b"] = SiteOrdering(cfg, "b", net.now, incarnation=old.inc + 10_000,
                                      shown=old.display_marks(),
                                      sent=old.sent_mark() if keep_sent else None)
        net.log["b"] = []

    net.at(8.0, crash)
    net.run_until(60.0)
    old = state["old"]
    assert isinstance(old, SiteOrdering)
    for s in ("a", "c"):  # the two reached the others
        assert {("b", 3), ("b", 4)} <= {(d.origin, d.seq) for d in net.log[s]}, s
    own_old = [d for d in net.log["b"] if d.origin == "b" and d.incarnation == old.inc]
    if keep_sent:
        assert [(d.seq, d.late) for d in own_old] == [(3, True), (4, True)]
        assert net.sites["b"].counters["history.own-tail"] == 2
    else:
        assert own_old == []
    again = {(d.origin, d.incarnation, d.seq) for d in net.log["b"]} & {
        (d.origin, d.incarnation, d.seq) for d in state["shown"]}  # type: ignore[attr-defined]
    assert not again


def test_the_marks_file_keeps_the_sent_mark(tmp_path) -> None:
    """The sent mark is saved with the display marks; a file without it (written before)
    still loads its marks, and has no sent mark."""
    from flowchat.marks import load_marks, load_sent, save_marks

    path = tmp_path / "m.json"
    save_marks(path, [("a", 7, 12), ("b", 9, 30)], (9, 33))
    assert load_marks(path) == [("a", 7, 12), ("b", 9, 30)] and load_sent(path) == (9, 33)
    save_marks(path, [("a", 7, 12)])
    assert load_marks(path) == [("a", 7, 12)] and load_sent(path) is None
    path.write_text('{"version": 1, "marks": [], "sent": [1, -2]}')
    assert load_sent(path) is None
