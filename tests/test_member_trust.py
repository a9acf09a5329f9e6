"""Issue 26, the client's side of band 19: membership notices are believed only from
routers, expire, and fill a bounded view.

Routers drop band-19 frames that applications send, so whatever reaches a client on band 19
came from routers; flowlib believes it only as a whole frame from its router's link whose
claimed origin is possible (tested here on the sans-I/O protocol, on virtual time). A view
holds at most ``max_members`` (the flood that grew one watcher's view to 48,644 fake
members), a notice's refresh is clamped (the refresh-0 notice that never expired), and
expiry runs on the clock the caller passes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import flowlib
from flowlib.events import MessageReceived
from flowlib.fragment import iter_fragments
from flowlib.members import (
    DEFAULT_MAX_MEMBERS,
    EXPIRE_AFTER,
    MAX_REFRESH,
    MemberView,
    clamp_refresh,
)
from flowlib.protocol import ClientProtocol
from flowrouter.wire.appmembers import MemberChange, MemberEvent, MemberNotice, NoticeKind
from flowrouter.wire.bands import BAND_APP_MEMBERSHIP, BAND_OVERFLOW
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import DEFAULT_TTL, pack_header

from .rawep import addr, core_and_edge, run, within
from .test_client_protocol import events, up_protocol

FLOW = FlowID(7, 0x0A000001, 1)
B19 = BAND_APP_MEMBERSHIP
MY_ROUTER = 99  # the node id of up_protocol()'s router
ME = 5  # up_protocol()'s own node id


def notice(router: int, *members: tuple[int, str], kind: NoticeKind = NoticeKind.SNAPSHOT,
           refresh: int = 30, event: MemberEvent = MemberEvent.JOIN) -> MemberNotice:
    return MemberNotice(kind, router, 1, refresh, 0,
                        tuple(MemberChange(event, nid, 1 << 32, name) for nid, name in members))


def frame(body: bytes, ttl: int) -> bytes:
    return pack_header(FLOW.key, len(body), B19, 0, 0, ttl) + body


def watching() -> ClientProtocol:
    proto = up_protocol()
    proto.flows.entry(FLOW).add_listener(1, 1 << B19)
    return proto


def delivered(proto: ClientProtocol, data: bytes) -> list[bytes]:
    proto.receive_data(data, 1.0)
    return [e.message.payload for e in events(proto) if isinstance(e, MessageReceived)]


# ---------------------------------------------------------------- who may speak on band 19
def test_notices_from_the_routers_are_believed() -> None:
    proto = watching()
    own = notice(MY_ROUTER, (7, "alice")).encode()
    remote = notice(1234, (8, "bob")).encode()
    # its own router's notice comes straight (full TTL); another router's one hop later
    assert delivered(proto, frame(own, DEFAULT_TTL) + frame(remote, DEFAULT_TTL - 2)) \
        == [own, remote]
    assert not [k for k in proto.counters if k.startswith("members.refused")]


def test_a_notice_in_fragments_is_never_believed() -> None:
    """Routers send a notice as one frame; a fragmented (or escaped) one on band 19 was
    made by an application, whatever it says."""
    proto = watching()
    body = notice(MY_ROUTER, (66, "alice")).encode()
    frames = b"".join(frame(fh + bytes(chunk), DEFAULT_TTL)
                      for fh, chunk in iter_fragments(memoryview(body), 1, 1, 40))
    escaped = frame(b"\xffFRG\x00" + body, DEFAULT_TTL)
    assert delivered(proto, frames + escaped) == []
    assert proto.counters["members.refused.fragment"] >= 3
    assert not proto.reassembler.partials  # nothing was even held


@pytest.mark.parametrize("router,ttl", [
    (0, DEFAULT_TTL - 1),  # no router at all
    (ME, DEFAULT_TTL - 1),  # this client is no router
    (MY_ROUTER, DEFAULT_TTL - 1),  # its own router's notices do not pass other routers
    (1234, DEFAULT_TTL),  # another router's cannot arrive with the TTL it was sent with
])
def test_a_notice_claiming_an_origin_it_cannot_have_is_refused(router: int, ttl: int) -> None:
    proto = watching()
    assert delivered(proto, frame(notice(router, (66, "alice")).encode(), ttl)) == []
    assert proto.counters["members.refused.origin"] == 1


def test_a_malformed_notice_is_refused_and_counted() -> None:
    proto = watching()
    assert delivered(proto, frame(b"FMN\x01garbage", DEFAULT_TTL)) == []
    assert proto.counters["members.refused.malformed"] == 1


# ---------------------------------------------------------------- expiry and bounds
@pytest.mark.parametrize("refresh", [0, 0xFFFF])
def test_a_notice_expires_whatever_refresh_it_claims(refresh: int) -> None:
    """The refresh-0 notice ("no snapshots follow") never expired; nor, for 54 hours, did
    one claiming 0xFFFF seconds. Both are held to MAX_REFRESH."""
    v = MemberView()
    v.apply(notice(1, (5, "ghost"), refresh=refresh), 100.0)
    assert clamp_refresh(refresh) == MAX_REFRESH
    due = v.next_deadline()
    assert due == 100.0 + EXPIRE_AFTER * MAX_REFRESH
    assert v.expire(due - 1) == [] and 5 in v.members
    (gone,) = v.expire(due)
    assert (gone.kind, gone.member.node_id, gone.expired) == ("leave", 5, True)
    assert v.members == {} and v.next_deadline() is None


def test_expiry_runs_on_the_clock_it_is_given() -> None:
    v = MemberView()
    v.apply(notice(1, (5, ""), refresh=2), 1e6)  # virtual time, far from the real clock
    v.apply(notice(2, (6, ""), refresh=10), 1e6 + 1)
    assert v.next_deadline() == 1e6 + 6
    assert [c.member.node_id for c in v.expire(1e6 + 6)] == [5]
    assert v.next_deadline() == 1e6 + 31
    v.apply(notice(2, (6, ""), refresh=10, kind=NoticeKind.DELTA), 1e6 + 20)
    assert v.next_deadline() == 1e6 + 50 and v.expire(1e6 + 31) == []


def test_a_flood_of_fake_members_fills_a_bounded_view() -> None:
    """The flood that grew one watcher's view to 48,644 members: 96 notices of 512
    members, each under another router id. The view keeps max_members, counts the rest,
    says it is incomplete, and each notice costs what it names, not the view's size."""
    v = MemberView(max_members=1000)
    start = time.perf_counter()
    changes = 0
    for r in range(96):
        changes += len(v.apply(notice(10_000 + r, *((r * 512 + i + 1, "") for i in range(512))),
                               float(r)))
    assert time.perf_counter() - start < 5.0
    assert len(v.members) == len(v) == 1000 == changes
    assert v.overflowed == 96 * 512 - 1000 and v.full and v.incomplete
    # a member that is already there can still change; room comes back as members leave
    v.apply(notice(10_000, *((i + 1, "") for i in range(10)), kind=NoticeKind.DELTA,
                   event=MemberEvent.LEAVE), 200.0)
    assert len(v) == 990
    v.apply(notice(10_000, (1, "back"), kind=NoticeKind.DELTA), 201.0)
    assert len(v) == 991 and v.members[1].name == "back"
    assert DEFAULT_MAX_MEMBERS >= 1000


def test_max_members_is_a_client_option() -> None:
    assert flowlib.ClientOptions(max_members=5).max_members == 5
    with pytest.raises(ValueError, match="max_members"):
        flowlib.ClientOptions(max_members=0)


def test_a_full_view_is_reported_to_the_application(tmp_path: Path) -> None:
    """Over real routers: a watcher whose view holds one member learns of the second
    member's refusal on the overflow band (and in its counters)."""

    async def main() -> None:
        async with core_and_edge(member_notice_interval=0.1) as (core, edge):
            sd = str(tmp_path)
            watcher = await flowlib.connect([addr(edge)], name="watcher", state_dir=sd,
                                            max_members=1)
            flow = await watcher.create()
            notes = await watcher.listen(flow, [BAND_OVERFLOW])
            watch = await watcher.watch_members(flow)
            await within(watch.wait_for(lambda v: len(v) == 1))
            other = await flowlib.connect([addr(core)], name="other", state_dir=sd)
            await other.listen(flow, 32)
            note = await within(notes.get())
            fault = note.fault()
            assert fault.extra["reason"] == "member-view-full"
            assert int(fault.extra["dropped"]) >= 1 and fault.extra["size"] == "1"
            assert watch.overflowed >= 1 and watch.incomplete
            assert watcher.counters["members.overflowed"] >= 1 and len(watch.members) == 1
            await watch.close()
            await other.close()
            await watcher.close()
    run(main())


# ---------------------------------------------------------------- the other router bands
def test_applications_cannot_send_on_the_routers_notice_bands() -> None:
    """Faults (17), overflow notices (18) and membership notices (19) originate only at
    routers; flowlib refuses to send there before anything is written."""
    from flowlib.checks import check_data_band

    for band in (17, 18, 19):
        with pytest.raises(ValueError, match="routers"):
            check_data_band(band)
    assert check_data_band(16) == 16 and check_data_band(20) == 20


def fault_frame(band: int, body: bytes) -> bytes:
    return pack_header(FLOW.key, len(body), band, 0, 0, DEFAULT_TTL - 1) + body


@pytest.mark.parametrize("band", [17, 18])
def test_only_whole_fault_messages_are_believed_on_the_fault_and_overflow_bands(
        band: int) -> None:
    """A fault or overflow notice changes what an application does (a viewer steps down on
    one): flowlib delivers only whole fault messages on these bands, never a fragment or
    an escaped payload (routers send neither) nor anything else."""
    from flowrouter.wire import control as C

    proto = up_protocol()
    proto.flows.entry(FLOW).add_listener(1, 1 << band)
    fault = C.Fault(C.FaultKind.LINK_DOWN, "r7", "link to r8 down", {}).encode()
    forged = C.Fault(C.FaultKind.OVERFLOW, "r7", "you overflowed", {}).encode()
    pieces = b"".join(fault_frame(band, fh + bytes(chunk))
                      for fh, chunk in iter_fragments(memoryview(forged), 1, 1, 20))
    proto.receive_data(fault_frame(band, fault) + pieces
                       + fault_frame(band, b"\xffFRG\x00" + forged)
                       + fault_frame(band, b"not a fault at all"), 1.0)
    got = [e.message.payload for e in events(proto) if isinstance(e, MessageReceived)]
    assert got == [fault]
    assert proto.counters["control.refused.fragment"] >= 3
    assert proto.counters["control.refused.malformed"] == 1


def test_heartbeats_cannot_grow_the_peer_table_or_outlive_silence() -> None:
    """A flood of beats under new names fills at most max_peers (the dead make room, live
    peers are never displaced); a beat announcing a period of 49 days is held to
    MAX_PERIOD, so its sender is still found dead when it goes silent."""
    from flowlib.heartbeat import MAX_PERIOD, Beat, PeerState, PeerTracker

    t = PeerTracker(missed=3, max_peers=100)
    for i in range(10_000):
        t.observe(Beat(f"fake-{i}", 0, 1.0, 1), 0.0)
    assert len(t.peers) == 100 and t.refused == 9_900
    t.check(10.0)  # all silent for 10 periods: dead
    t.observe(Beat("real", 0, 1.0, 2), 10.0)
    assert "real" in t.peers and len(t.peers) == 100
    slow = PeerTracker(missed=3)
    slow.observe(Beat("sloth", 0, 0xFFFFFFFF / 1000, 3), 0.0)
    assert slow.peers["sloth"].period == MAX_PERIOD
    (change,) = [c for c in slow.check(3 * MAX_PERIOD) if c.new is PeerState.DEAD]
    assert change.peer == "sloth"
