"""A router's fault about an application's own link reaches the application (issue 26).

A tripped work budget is told to the application that tripped it as ``Fault(LIMIT)`` on the
fault band (17) of the link-local flow. No listener belongs to that flow, so flowlib once
counted it ``drop.no-listener`` and the application never learnt why its joins went
unanswered. Now flowlib logs it, counts it (``router_faults``, ``last_router_fault``), calls
``on_router_fault`` and hands it to every listener whose mask has the fault band; an
application cannot make one (only the router on the other end of the link speaks
link-local).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import flowlib
from flowrouter.net.node import NodeConfig, RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT
from flowrouter.wire.flowid import FlowID

from .rawep import addr, get, run, within


def test_a_tripped_work_budget_is_told_to_the_application(tmp_path: Path) -> None:
    async def main() -> None:
        node = RouterNode(NodeConfig("r", listen="127.0.0.1:0", core_lsids=frozenset({0x10}),
                                     default_lsid=0x10, limits={"control_per_tick": 4}))
        await node.start()
        try:
            heard: asyncio.Queue[C.Fault] = asyncio.Queue()
            client = await flowlib.connect([addr(node)], name="busy", state_dir=str(tmp_path),
                                           on_router_fault=heard.put_nowait)
            watched = await client.create()
            lst = await client.listen(watched, [32, BAND_FAULT])
            # forty joins at once: past four control messages a tick the router drops the
            # rest of the tick's and trips its work budget on this link
            joins = [asyncio.ensure_future(client.listen(FlowID(client.node_id, 0x10, 1000 + i),
                                                         32)) for i in range(40)]
            fault = await within(heard.get())
            assert fault.kind is C.FaultKind.LIMIT and fault.extra["limit"] == "work-budget"
            assert "control messages" in fault.detail
            assert client.router_faults >= 1 and client.last_router_fault == fault
            assert client.counters["faults.router"] >= 1
            assert client.counters["drop.no-listener"] == 0
            # the fault-band listener of an unrelated flow hears it as a message of its flow
            msg = await get(lst)
            assert msg.band == BAND_FAULT and msg.flow == watched
            assert msg.fault() == fault
            assert node.core.counters["work.budget-tripped"] >= 1
            for j in joins:
                j.cancel()
            await asyncio.gather(*joins, return_exceptions=True)
            await client.close()
        finally:
            await node.stop()
    run(main())
