"""The sans-I/O client protocol (flowlib.protocol) and its parts, on virtual time.

A fake router here is a few encoded frames; time is whatever the test passes as ``now``.
Liveness (echoes, dead-after), refresh digests, the reassembly sweep, the handshake's
refusals, the join/ack exchange and the failover's replay and reconnect schedule are
checked without sockets or sleeps. The live tests (test_failover, test_softstate_live)
prove the same behaviour end to end over real routers.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from flowlib.events import (
    HandshakeDone,
    JoinAnswered,
    LinkFailed,
    MessageDropped,
    MessageReceived,
    RejoinNeeded,
)
from flowlib.flowtable import FlowTable
from flowlib.fragment import Reassembler, iter_fragments
from flowlib.handshake import Handshake
from flowlib.liveness import Liveness
from flowlib.protocol import LINK_KEY, ClientProtocol
from flowlib.reconnect import Attempt, GiveUp, Pause, ReconnectPlan
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_GC, BAND_MEMBERSHIP
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import FrameDecoder, pack_header

FLOW = FlowID(7, 0x0A000001, 1)
OTHER = FlowID(7, 0x0A000001, 2)
LIVE = dict(liveness_interval=1.0, dead_after=3.0, refresh_interval=10.0)


def router_hello(features: int = C.FEATURES, max_payload: int = 4096) -> bytes:
    body = C.Hello(99, C.Role.ROUTER, "r1", max_payload, 0x0A000001).encode()
    return C.hello_header(len(body), features) + body


def control(key: bytes, msg: C.ControlMessage, band: int = BAND_MEMBERSHIP) -> bytes:
    body = msg.encode()
    return pack_header(key, len(body), band) + body


def data(flow: FlowID, payload: bytes, band: int = 32) -> bytes:
    return pack_header(flow.key, len(payload), band) + payload


def sent(proto: ClientProtocol) -> list[C.ControlMessage]:
    """The control messages the protocol wrote since the last call."""
    raw = b"".join(bytes(b) for b in proto.data_to_send())
    return [C.decode(p) for h, p in FrameDecoder(1 << 20).feed(raw) if h[20] < 16]


def events(proto: ClientProtocol) -> list[object]:
    out = []
    while (ev := proto.next_event()) is not None:
        out.append(ev)
    return out


def new_protocol(now: float = 0.0, flows: FlowTable | None = None, first_request: int = 1,
                 **kw: Any) -> ClientProtocol:
    hs = Handshake(name="app", node_id=5, max_payload=1 << 16, credentials=b"")
    opts = {**LIVE, **kw}
    return ClientProtocol(hs, flows or FlowTable("app"), Reassembler(timeout=2.0), now=now,
                          counters=Counter(), first_request=first_request, **opts)


def up_protocol(now: float = 0.0, features: int = C.FEATURES, **kw: Any) -> ClientProtocol:
    proto = new_protocol(now, **kw)
    assert isinstance(sent(proto)[0], C.Hello)  # our HELLO opens the link
    proto.receive_data(router_hello(features), now)
    assert [type(e) for e in events(proto)] == [HandshakeDone]
    return proto


# ============================================================================ handshake
def test_handshake_takes_the_routers_hello() -> None:
    proto = up_protocol()
    assert proto.up and proto.max_payload == 4096 and proto.hello is not None
    assert proto.hello.name == "r1" and proto.speaks_soft_state


def test_a_refusal_or_a_peer_that_is_no_router_fails_the_link() -> None:
    proto = new_protocol()
    proto.receive_data(control(LINK_KEY, C.Error(1, "go away")), 0.0)
    assert events(proto) == [LinkFailed("router refused us: go away")] and not proto.up
    proto = new_protocol()
    body = C.Hello(1, C.Role.ENDPOINT, "impostor", 4096).encode()
    proto.receive_data(C.hello_header(len(body)) + body, 0.0)
    (ev,) = events(proto)
    assert isinstance(ev, LinkFailed) and "not a flow router" in ev.reason


def test_flow_traffic_before_the_hello_is_a_protocol_error() -> None:
    proto = new_protocol()
    proto.receive_data(control(FLOW.key, C.JoinAck(1, C.JoinStatus.OK)), 0.0)
    (ev,) = events(proto)
    assert isinstance(ev, LinkFailed) and "before its HELLO" in ev.reason
    proto.receive_data(router_hello(), 0.1)  # nothing is read once the link failed
    assert events(proto) == [] and not proto.up


def test_malformed_bytes_fail_the_link() -> None:
    proto = up_protocol()
    proto.receive_data(b"\xff" * 24, 1.0)
    (ev,) = events(proto)
    assert isinstance(ev, LinkFailed) and "malformed" in ev.reason


# ============================================================================ liveness
def test_echoes_go_out_every_interval_and_router_echoes_are_answered() -> None:
    proto = up_protocol()
    assert proto.next_deadline() == pytest.approx(0.0, abs=1e-3)
    proto.handle_timer(0.0)
    (echo,) = sent(proto)
    assert isinstance(echo, C.Echo)
    assert proto.next_deadline() == pytest.approx(1.0, abs=1e-3)
    proto.handle_timer(0.5)  # early: nothing due
    assert sent(proto) == []
    proto.receive_data(control(LINK_KEY, C.Echo(7, 1234)), 0.6)
    assert sent(proto) == [C.EchoReply(7, 1234)]
    proto.receive_data(control(LINK_KEY, C.EchoReply(echo.seq, echo.stamp)), 0.05)
    assert proto.liveness.rtt == pytest.approx(0.05)


def test_a_silent_router_is_declared_dead_after_dead_after() -> None:
    proto = up_protocol()
    proto.receive_data(control(LINK_KEY, C.Echo(1, 0)), 0.0)  # it speaks liveness
    now = 0.0
    while True:  # the shell's loop: sleep until the deadline, then handle_timer
        deadline = proto.next_deadline()
        assert deadline is not None and deadline > now
        now = deadline
        proto.handle_timer(now)
        evs = events(proto)
        if evs:
            break
    (ev,) = evs
    assert isinstance(ev, LinkFailed) and "silent for 3.0s" in ev.reason
    assert now == pytest.approx(3.0, abs=1e-3) and proto.counters["liveness.dead"] == 1


def test_anything_read_keeps_the_router_alive() -> None:
    proto = up_protocol()
    proto.receive_data(control(LINK_KEY, C.Echo(1, 0)), 0.0)
    for t in range(1, 20):  # a frame every second, timers in between
        proto.handle_timer(t - 0.5)
        proto.receive_data(control(LINK_KEY, C.EchoReply(0, 0)), float(t))
    proto.handle_timer(21.5)
    assert events(proto) == [] and proto.up
    proto.handle_timer(22.1)  # 3.1 s after the last read
    assert isinstance(events(proto)[0], LinkFailed)


def test_a_router_from_before_soft_state_gets_no_echo_and_is_never_dead() -> None:
    proto = up_protocol(features=0)
    assert not proto.speaks_soft_state
    for t in (0.0, 5.0, 100.0):
        proto.handle_timer(t)
    assert sent(proto) == [] and events(proto) == [] and proto.up
    assert proto.next_deadline() is None


def test_liveness_part_alone() -> None:
    live = Liveness(1.0, 3.0, now=10.0)
    assert live.silent_for(20.0) is None  # never heard an echo: cannot judge
    live.on_echo(C.Echo(1, 0))
    assert live.silent_for(12.9) is None and live.silent_for(13.5) == pytest.approx(3.5)
    assert live.echo(10.0) is not None and live.echo(10.5) is None
    assert live.echo(11.0) is not None


# ============================================================================ joins and refresh
def test_join_ack_and_stale_acks() -> None:
    proto = up_protocol()
    fe = proto.flows.entry(FLOW)
    fe.add_listener(1, 1 << 32)
    req = proto.join(fe)
    (join,) = sent(proto)
    assert join == C.Join(req, 1 << 32, 0, b"")
    proto.receive_data(control(FLOW.key, C.JoinAck(req, C.JoinStatus.OK)), 1.0)
    assert events(proto) == [JoinAnswered(req, FLOW.key, C.JoinAck(req, C.JoinStatus.OK))]
    proto.receive_data(control(FLOW.key, C.JoinAck(req, C.JoinStatus.OK)), 1.0)
    assert events(proto) == [] and proto.counters["control.stale-ack"] == 1


def test_data_goes_to_flows_with_a_listener_on_its_band() -> None:
    proto = up_protocol()
    proto.flows.entry(FLOW).add_listener(1, 1 << 32)
    proto.receive_data(data(FLOW, b"hi") + data(FLOW, b"other band", 40)
                       + data(OTHER, b"nobody"), 1.0)
    (ev,) = events(proto)
    assert isinstance(ev, MessageReceived) and ev.message.payload == b"hi"
    assert proto.counters["drop.no-listener"] == 2


def test_a_sink_takes_each_reads_messages_at_once_in_order() -> None:
    batches: list[list[tuple[bytes, int, object]]] = []
    proto = up_protocol(sink=batches.append)
    sent(proto)
    proto.next_deadline()
    proto.flows.entry(FLOW).add_listener(1, (1 << 32) | (1 << 40))
    # data frames alone: one list for the sink, nothing left for the shell
    assert proto.receive_data(data(FLOW, b"a") + data(FLOW, b"b", 40)
                              + data(OTHER, b"nobody"), 1.0) is False
    assert [[(k, b, m.payload) for k, b, m in batch] for batch in batches] == \
        [[(FLOW.key, 32, b"a"), (FLOW.key, 40, b"b")]]
    assert events(proto) == [] and proto.counters["received"] == 2
    # a message behind an event in the same read follows it as an event (order is kept)
    batches.clear()
    fe = proto.flows.entry(FLOW)
    req = proto.join(fe)
    sent(proto)
    ack = C.JoinAck(req, C.JoinStatus.OK)
    assert proto.receive_data(data(FLOW, b"before") + control(FLOW.key, ack)
                              + data(FLOW, b"after"), 2.0) is True
    assert [[m.payload for _, _, m in batch] for batch in batches] == [[b"before"]]
    first, second = events(proto)
    assert first == JoinAnswered(req, FLOW.key, ack)
    assert isinstance(second, MessageReceived) and second.message.payload == b"after"


def test_gc_pings_are_answered_for_wanted_flows_only() -> None:
    proto = up_protocol()
    proto.flows.entry(FLOW).add_listener(1, 1 << 32)
    proto.receive_data(control(FLOW.key, C.Ping(3), BAND_GC)
                       + control(OTHER.key, C.Ping(3), BAND_GC), 1.0)
    assert sent(proto) == [C.Pong(3)]
    assert proto.counters["gc.pings-ignored"] == 1


def test_refresh_digest_lists_what_the_router_holds() -> None:
    proto = up_protocol()
    fe = proto.flows.entry(FLOW)
    fe.add_listener(1, 1 << 33)
    proto.join(fe)
    adv = proto.flows.entry(OTHER)
    adv.advertised = True
    proto.join(adv)
    sent(proto)
    now = 0.0
    digests: list[C.Refresh] = []
    while now < 12.0:
        deadline = proto.next_deadline()
        assert deadline is not None and deadline > now
        now = deadline
        proto.handle_timer(now)
        digests += [m for m in sent(proto) if isinstance(m, C.Refresh)]
    (digest,) = digests
    assert now >= 10.0 and digest.index == 0 and digest.count == 1
    assert set(digest.entries) == {(FLOW.key, 1 << 33, 0),
                                   (OTHER.key, 0, C.REFRESH_ADVERTISE)}


def test_not_on_tree_asks_for_a_rejoin_of_wanted_flows() -> None:
    proto = up_protocol()
    fe = proto.flows.entry(FLOW)
    fe.add_listener(1, 1 << 32)
    proto.join(fe)
    proto.receive_data(control(LINK_KEY, C.NotOnTree((FLOW.key, OTHER.key))), 1.0)
    assert events(proto) == [RejoinNeeded(FLOW.key)] and not fe.on_router


# ============================================================================ reassembly
def test_an_incomplete_message_is_dropped_by_the_sweep() -> None:
    proto = up_protocol(features=0)
    proto.flows.entry(FLOW).add_listener(1, 1 << 32)
    frags = list(iter_fragments(memoryview(b"x" * 300), 1, 2, 100))
    fh, chunk = frags[0]
    proto.receive_data(data(FLOW, bytes(fh) + bytes(chunk)), 0.0)
    assert events(proto) == []
    now = 0.0
    while not (evs := events(proto)):
        deadline = proto.next_deadline()
        assert deadline is not None and deadline > now
        now = deadline
        proto.handle_timer(now)
    (ev,) = evs
    assert isinstance(ev, MessageDropped) and ev.reason == "reassembly-timeout"
    assert ev.fragments == "1/3" and 2.0 <= now <= 2.6
    assert proto.next_deadline() is None  # nothing left to sweep


# ============================================================================ failover
def test_a_fresh_protocol_replays_the_flow_table() -> None:
    """After a loss the flow table outlives the link; the next router's protocol gets one
    JOIN per wanted flow with the union mask, the advertisement and the capability, and
    request IDs go on from the old link's."""
    old = up_protocol()
    flows = old.flows
    fe = flows.entry(FLOW, capability=b"token")
    fe.add_listener(1, 1 << 32)
    fe.add_listener(2, 1 << 40)
    adv = flows.entry(OTHER)
    adv.advertised, adv.adv_locality = True, (3, 2)
    for entry in flows:
        old.join(entry)
    flows.link_lost()
    assert not fe.on_router and not adv.on_router
    new = new_protocol(50.0, flows=flows, first_request=old.next_request)
    sent(new)
    new.receive_data(router_hello(), 50.0)
    assert isinstance(events(new)[0], HandshakeDone)
    reqs = [new.join(entry) for entry in flows.wanted()]
    assert reqs == [3, 4]
    assert sent(new) == [C.Join(3, (1 << 32) | (1 << 40), 0, b"token"),
                         C.Join(4, 0, C.JOIN_FLAG_ADVERTISE, b"")]
    assert fe.in_sync and adv.in_sync


def test_reconnect_plan_rounds_back_off_and_give_up() -> None:
    """Three routers, the second lost: rounds start after it, pauses double up to the
    maximum, and the client gives up once failover_timeout passed."""
    plan = ReconnectPlan(3, 1, started=100.0, timeout=5.0, connect_timeout=1.0,
                         reconnect_min=0.5, reconnect_max=1.0)
    now = 100.0
    steps = []
    while True:
        step = plan.next(now)
        steps.append(step)
        if isinstance(step, GiveUp):
            break
        now += 0.25 if isinstance(step, Attempt) else step.delay  # every attempt fails
    assert [s.index for s in steps[:3] if isinstance(s, Attempt)] == [2, 0, 1]
    pauses = [s.delay for s in steps if isinstance(s, Pause)]
    assert pauses[:3] == [0.5, 1.0, 1.0]
    assert now >= 105.0 and steps[-2] != GiveUp()
    assert all(s.timeout <= 1.0 for s in steps if isinstance(s, Attempt))


def test_reconnect_attempts_never_outlast_the_failover_timeout() -> None:
    plan = ReconnectPlan(1, 0, started=0.0, timeout=2.0, connect_timeout=5.0,
                         reconnect_min=0.05, reconnect_max=2.0)
    first = plan.next(0.0)
    assert first == Attempt(0, 2.0, 1)
    assert plan.next(1.5) == Pause(0.05, 1)
    assert plan.next(1.55) == Attempt(0, pytest.approx(0.45), 2)
    assert plan.next(2.0) == GiveUp()


def test_a_datagram_links_unanswered_join_goes_out_again() -> None:
    """On a datagram link a JOIN may be lost: one not answered within join_resend is sent
    again, the same request, until answered or forgotten; a TCP link never resends."""
    proto = up_protocol(join_resend=0.5)
    fe = proto.flows.entry(FLOW)
    fe.add_listener(1, 1 << 32)
    sent(proto)
    req = proto.join(fe)
    first = sent(proto)
    assert [type(m) for m in first] == [C.Join]
    assert proto.next_deadline() <= 0.5  # (refresh digests may be due first)
    proto.handle_timer(0.4)
    assert not [m for m in sent(proto) if isinstance(m, C.Join)]
    proto.handle_timer(0.5)
    again = [m for m in sent(proto) if isinstance(m, C.Join)]
    assert again == first and proto.counters["join.resent"] == 1
    proto.receive_data(control(FLOW.key, C.JoinAck(req, C.JoinStatus.OK)), 0.7)
    assert [type(e) for e in events(proto)] == [JoinAnswered]
    proto.handle_timer(1.5)
    assert not [m for m in sent(proto) if isinstance(m, C.Join)]
    # forgotten (the caller gave up): no more resends either
    req2 = proto.join(fe)
    sent(proto)
    proto.forget_request(req2)
    proto.handle_timer(5.0)
    assert not [m for m in sent(proto) if isinstance(m, C.Join)]
    tcp = up_protocol()
    tcp.flows.entry(FLOW).add_listener(1, 1 << 32)
    tcp.join(tcp.flows.entry(FLOW))
    sent(tcp)
    tcp.handle_timer(0.6)
    assert not [m for m in sent(tcp) if isinstance(m, C.Join)]
