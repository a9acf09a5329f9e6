"""Quota refusals are told to the flow on band 17 (issue 15: "floods are refused, counted and
alerted on band 17"), on real sockets (127.0.0.1): r1 (where the flooder connects) - r2 (the
core, where the member listens).

The member hears which router refused and which limit held, never who was refused; the refused
application gets its JoinAck(LIMIT); a flood of joins to made-up flows is told to at most
``[quota] flow_notices`` flows per limit and alert interval, the rest only counted.
"""

from __future__ import annotations

from flowrouter.net.runtime import RouterNode
from flowrouter.tools.cli import format_status
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT
from flowrouter.wire.flowid import FlowID

from .rawep import RawEndpoint, chain, run

LSID = 0x10
DATA = 1 << 40


async def _fault(ep: RawEndpoint) -> C.Fault:
    """The next fault notice that reaches *ep* (other frames skipped)."""
    while True:
        hdr, payload = await ep.next_frame()
        if hdr.band == BAND_FAULT:
            msg = C.decode(payload)
            assert isinstance(msg, C.Fault)
            return msg


async def _member(core: RouterNode, flow: FlowID) -> RawEndpoint:
    rx = await RawEndpoint.connect(core, "member")
    assert (await rx.join(flow, DATA | 1 << BAND_FAULT)).status is C.JoinStatus.OK
    return rx


def test_join_rate_refusal_reaches_the_flows_members_on_band_17() -> None:
    async def main() -> None:
        # joins barely refill: the burst is all a principal (here: host 127.0.0.1) gets
        async with chain(2, quota={"joins_per_second": 0.001, "join_burst": 3}) as (r1, r2):
            flow = FlowID(0xF1, LSID, 1)
            rx = await _member(r2, flow)
            flooder = await RawEndpoint.connect(r1, "flooder")
            statuses = [(await flooder.join(flow, DATA, req=i + 1)).status for i in range(5)]
            assert statuses == [C.JoinStatus.OK] * 3 + [C.JoinStatus.LIMIT] * 2
            fault = await _fault(rx)
            assert fault.kind is C.FaultKind.LIMIT and fault.origin == "r1"
            assert fault.extra == {"limit": "join-rate"}
            assert "joins faster than" in fault.detail
            assert "127.0.0.1" not in fault.detail  # the refused principal stays private
            assert r1.core.counters["refused.join-rate"] == 2
            # the second refusal, same flow, same interval: counted, not told again
            assert r1.core.counters["alerts.join-rate"] == 2
            assert len([a for a in r1.status()["alerts"] if a["kind"] == "join-rate"]) == 1
            text = format_status(r1.status())
            assert "ALERTS" in text and "join-rate" in text and "host:127.0.0.1" in text
            assert "QUOTA" in text and "flow notices" in text
            for ep in (rx, flooder):
                await ep.close()
    run(main())


def test_flow_quota_refusal_travels_to_the_core_and_a_flood_is_told_to_few_flows() -> None:
    async def main() -> None:
        async with chain(2, quota={"flows": 1, "flow_notices": 2}) as (r1, r2):
            flow = FlowID(0xF2, LSID, 1)
            rx = await _member(r2, flow)
            flooder = await RawEndpoint.connect(r1, "flooder")
            own = FlowID(0xF2, LSID, 99)
            assert (await flooder.join(own, DATA, req=1)).status is C.JoinStatus.OK
            # the member's flow is not on r1's tree: the notice goes toward its core
            ack = await flooder.join(flow, DATA, req=2)
            assert ack.status is C.JoinStatus.LIMIT and "1 flows" in ack.reason
            fault = await _fault(rx)
            assert fault.extra == {"limit": "principal-flows"} and fault.origin == "r1"
            assert "127.0.0.1" not in fault.detail
            # a flood of joins to made-up flows: 1 more notice fits the budget, then silence
            for i in range(10):
                ack = await flooder.join(FlowID(0xBAD, LSID, i + 1), DATA, req=10 + i)
                assert ack.status is C.JoinStatus.LIMIT
            c = r1.core.counters
            assert c["refused.principal-flows"] == 11 and c["alerts.principal-flows"] == 11
            assert c["alerts.unannounced"] == 9
            alerts = [a for a in r1.status()["alerts"] if a["kind"] == "principal-flows"]
            assert len(alerts) == 2
            assert r1.status()["quota"]["limits"]["flow_notices"] == 2
            for ep in (rx, flooder):
                await ep.close()
    run(main())


def test_quota_keys_are_type_and_range_checked() -> None:
    import pytest

    from flowrouter.net.config import ConfigError
    from flowrouter.net.configfile import config_from_dict

    cfg = config_from_dict({"router": {"name": "r1"}, "quota": {"flow_notices": 0}})
    assert cfg.quota.flow_notices == 0
    for bad, match in (({"flows": "many"}, r"\[quota\] flows must be an integer"),
                       ({"flow_notices": -1}, r"\[quota\] flow_notices must be within 0"),
                       ({"joins_per_second": 0}, r"\[quota\] joins_per_second must be within"),
                       ({"burst": 3}, r"unknown key\(s\) burst in \[quota\]")):
        with pytest.raises(ConfigError, match=match):
            config_from_dict({"router": {"name": "r1"}, "quota": bad})
