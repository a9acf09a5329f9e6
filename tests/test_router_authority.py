"""Authority on the in-band control bands: what only routers may say, only routers say.

Bands 17 (faults), 18 (overflow notices) and 19 (membership notices) originate at routers
(flowrouter.wire.bands.ROUTER_ONLY_BANDS). An application that sends a frame on one of them
(a fake member, a fake fault) is refused by its router: the frame reaches no one, and the
drop is counted (``drop.app-control``, in the status and /metrics). The application bands
next to them (heartbeats 16, repair 20, ordering 21) pass as before. Simulator (the same core
as the daemon), the fast-path engines, and a live loopback router with a raw endpoint.
"""

from __future__ import annotations

import pytest

from flowrouter.core.fastpath_py import STOP_SLOW
from flowrouter.core.fastpath_py import Engine as TwinEngine
from flowrouter.monitor import render_metrics
from flowrouter.net.observe import router_source
from flowrouter.testbed.sim.network import SimNetwork
from flowrouter.wire.appmembers import (
    MemberChange,
    MemberEvent,
    MemberNotice,
    NoticeKind,
    decode_notice,
)
from flowrouter.wire.bands import (
    BAND_APP_MEMBERSHIP,
    BAND_FAULT,
    BAND_HEARTBEAT,
    BAND_ORDER,
    BAND_OVERFLOW,
    BAND_REPAIR,
    BandMask,
)
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import pack_header

from .fastpath_support import native_module
from .rawep import RawEndpoint, core_and_edge, run, within

FLOW = FlowID(0xABCD, 0x10, 7)
CONTROL = (BAND_FAULT, BAND_OVERFLOW, BAND_APP_MEMBERSHIP)
APP_CONTROL = (BAND_HEARTBEAT, BAND_REPAIR, BAND_ORDER)


def _forged_notice(router: int) -> bytes:
    """A membership snapshot claiming an authenticated member "alice", never expiring."""
    return MemberNotice(NoticeKind.SNAPSHOT, router, 1, 0, 0,
                        (MemberChange(MemberEvent.JOIN, 0xBAD, 1 << 32, "alice"),)).encode()


def _two_routers() -> SimNetwork:
    net = SimNetwork(seed=3)
    net.add_router("a", core_lsids=[0x10], member_notices=1.0)
    net.add_router("b", routes={0x10: "a"}, member_notices=1.0)
    net.add_link("a", "b")
    return net


def test_an_application_cannot_speak_on_the_router_bands() -> None:
    net = _two_routers()
    watcher = net.add_endpoint("watcher", "a")
    attacker = net.add_endpoint("attacker", "b")
    net.run_until(1.0)
    watcher.join(FLOW, BandMask([32, *CONTROL, *APP_CONTROL]))
    attacker.join(FLOW, 32)
    net.run_until(3.0)
    # the routers' own notices arrive (the attacker's join, from router b)
    legit = [decode_notice(d.payload) for d in watcher.received(FLOW, BAND_APP_MEMBERSHIP)]
    assert any(n.router == net.routers["b"].p.node_id for n in legit)
    before = {band: len(watcher.received(FLOW, band)) for band in CONTROL}
    forged = _forged_notice(net.routers["a"].p.node_id)
    for band in CONTROL:
        attacker.send(FLOW, band, forged)
    for band in APP_CONTROL:
        attacker.send(FLOW, band, b"app control " + bytes([band]))
    attacker.send(FLOW, 32, b"data")
    net.run_until(3.5)
    for band in CONTROL:
        got = watcher.payloads(FLOW, band)[before[band]:]
        assert forged not in got, band
    # the applications' own control bands and data still pass
    for band in APP_CONTROL:
        assert watcher.payloads(FLOW, band) == [b"app control " + bytes([band])]
    assert watcher.payloads(FLOW, 32) == [b"data"]
    # refused at the attacker's own router: counted there, never forwarded up the tree
    assert net.routers["b"].counters["drop.app-control"] == 3
    assert net.routers["a"].counters["drop.app-control"] == 0
    assert net.routers["b"].status()["counters"]["drop.app-control"] == 3


def test_an_application_on_the_core_router_is_refused_too() -> None:
    net = SimNetwork(seed=4)
    net.add_router("a", core_lsids=[0x10], member_notices=1.0)
    watcher = net.add_endpoint("watcher", "a")
    attacker = net.add_endpoint("attacker", "a")
    net.run_until(1.0)
    watcher.join(FLOW, BandMask(CONTROL))
    attacker.join(FLOW, BandMask([32]))
    net.run_until(3.0)
    forged = _forged_notice(net.routers["a"].p.node_id)
    for _ in range(50):  # a flood: not one reaches the watcher
        attacker.send(FLOW, BAND_APP_MEMBERSHIP, forged)
    net.run_until(5.0)
    assert forged not in watcher.payloads(FLOW, BAND_APP_MEMBERSHIP)
    assert net.routers["a"].counters["drop.app-control"] == 50


def _engines() -> list[object]:
    out: list[object] = [TwinEngine()]
    mod = native_module()
    if mod is not None:
        out.append(mod.Engine())
    return out


@pytest.mark.parametrize("engine", _engines(), ids=lambda e: "native" if e.native else "twin")
def test_the_fast_path_hands_application_control_frames_to_the_core(engine: object) -> None:
    e = engine
    e.set_link(1, False, 65536, (0, 0, 0, 0))  # an application
    e.set_link(2, True, 65536, (0, 0, 0, 0))   # a router (upstream)
    e.set_link(3, False, 65536, (0, 0, 0, 0))  # another application
    all_bands = (1 << 128) - 1
    e.set_flow(FLOW.key, 2, [(1, all_bands), (3, all_bands)], all_bands)
    for band in (*CONTROL, *APP_CONTROL, 32):
        frame = pack_header(FLOW.key, 4, band, 0, 0, 32) + b"abcd"
        pos, stop, outs, _c = e.forward(1, frame, 0, 1 << 62, 1 << 62, 65536)
        if band in CONTROL:
            assert (pos, stop, outs) == (0, STOP_SLOW, []), band
        else:
            assert pos == len(frame) and {lk for lk, _o, _n in outs} == {2, 3}, band
        # from the router side, the same bands are forwarded as before
        pos, stop, outs, _c = e.forward(2, frame, 0, 1 << 62, 1 << 62, 65536)
        assert pos == len(frame) and {lk for lk, _o, _n in outs} == {1, 3}, band


def test_live_router_drops_a_raw_clients_membership_notice() -> None:
    async def main() -> None:
        async with core_and_edge() as (core, edge):
            watcher = await RawEndpoint.connect(core, "watcher")
            attacker = await RawEndpoint.connect(edge, "attacker")
            try:
                await watcher.join(FLOW, 1 << BAND_APP_MEMBERSHIP | 1 << 32)
                await attacker.join(FLOW, 1 << 32)
                forged = _forged_notice(core.core.p.node_id)
                for _ in range(5):
                    attacker.send(FLOW, forged, band=BAND_APP_MEMBERSHIP)
                attacker.send(FLOW, b"after", band=32)
                while True:  # data after the forged notices: they were never forwarded
                    hdr, payload = await watcher.next_frame()
                    assert payload != forged
                    if hdr.band == 32:
                        assert payload == b"after"
                        break
                assert edge.core.counters["drop.app-control"] == 5
                assert edge.status()["counters"]["drop.app-control"] == 5
                metrics = render_metrics(router_source(edge)).decode()
                assert 'flownet_router_drops_total{reason="app-control"} 5.0' in metrics
            finally:
                await attacker.close()
                await watcher.close()

    run(within(main(), 30))
