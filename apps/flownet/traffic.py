"""``flowrouter up``'s applications: a topology's endpoints as flowlib clients carrying traffic
over the routers a :class:`~flowrouter.testbed.launcher.Launcher` runs.

:class:`Traffic` starts the launcher's routers, connects one flowlib client per endpoint of
the topology (through :meth:`Launcher.endpoint_address`, so the namespaced launcher's
forwarders are used too), joins them all to one shared flow and has each send at ``rate``
messages per second; every delivery is recorded (time, receiver, sender, sequence number).
The fault schedule's clock (the launcher's ``t0``) starts once every endpoint has joined; the
launcher applies the faults, prints the live view and serves the dashboard. The run ends
after the launcher's duration or when :attr:`Traffic.stop` is set (Ctrl-C), and always
closes the clients and then the launcher.

May import flowlib and flowrouter (the testbed's launcher, the wire format).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import flowlib
from flowrouter.testbed.launcher import Delivery, Launcher, LaunchReport
from flowrouter.testbed.topology import Topology
from flowrouter.wire.bands import DEFAULT_DATA_BAND
from flowrouter.wire.flowid import FlowID

log = logging.getLogger("flownet.traffic")

FLOW_LOCAL_ID = 0x5111  #: the shared flow's local id (creator: a hash of the topology name)


def shared_flow(topo: Topology) -> FlowID:
    """The flow every endpoint of *topo* joins: its creator is the topology's name (its first
    eight bytes), its LSID the topology's first."""
    creator = int.from_bytes(topo.name.encode()[:8].ljust(8, b"\0"), "big") or 1
    lsids = topo.lsids()
    return FlowID(creator, lsids[0] if lsids else 0x10, FLOW_LOCAL_ID)


class Traffic:
    """The endpoints of a launcher's topology sending to and receiving from one shared flow."""

    def __init__(self, launcher: Launcher, *, rate: float = 1.0, size: int = 200) -> None:
        self.launcher = launcher
        self.rate = rate  #: messages per second per endpoint (0: none)
        self.size = size  #: bytes per message
        #: set (e.g. on Ctrl-C) to end the run early
        self.stop = asyncio.Event()

    async def run(self) -> LaunchReport:
        """Routers up, endpoints joined, traffic and faults for the duration; the report."""
        la = self.launcher
        report = LaunchReport(la.topo.name, la.scenario, la.duration)
        clients: dict[str, Any] = {}
        tasks: list[asyncio.Task[Any]] = []
        started = time.monotonic()
        closers: list[Callable[[], Awaitable[Any]]] = []
        try:
            if not await self._unless_stopped(la.start_routers()):
                return report
            web = await la.start_web()
            if web is not None:
                closers.append(web.stop)
            flow = shared_flow(la.topo)
            listeners = {}
            for ep in la.topo.endpoints:
                client = await flowlib.connect([la.endpoint_address(ep.router)], name=ep.name,
                                               state_dir=str(la.workdir / "state"))
                clients[ep.name] = client
                listeners[ep.name] = await client.listen(flow, [DEFAULT_DATA_BAND],
                                                         size=100_000)
                await client.advertise(flow)
            if la.view:
                print(f"overlay {la.topo.name!r} up: {len(la.procs)} routers, "
                      f"{len(clients)} endpoints on flow {flow}; logs and configs in "
                      f"{la.workdir}", flush=True)
            la.t0 = time.monotonic()
            for name, lst in listeners.items():
                tasks.append(asyncio.ensure_future(self._receive(name, lst, report)))
            for name, client in clients.items():
                tasks.append(asyncio.ensure_future(self._send(name, client, flow, report)))
            for t, fault, down in la.fault_events():
                tasks.append(asyncio.ensure_future(la.fault_at(t, fault, down, report)))
            if la.view:
                tasks.append(asyncio.ensure_future(la.show_view()))
            tasks.append(asyncio.ensure_future(la.watch_links()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(),
                                       max(0.0, la.t0 + la.duration - time.monotonic()))
        finally:
            # The run's true length: Ctrl-C or a failed start ends it early.
            report.duration = round(time.monotonic() - (la.t0 or started), 3)
            for close in closers:
                await close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await la.collect(report)
            for client in clients.values():
                with contextlib.suppress(Exception):
                    await client.close(timeout=2.0)
            await la.close()
        return report

    async def _unless_stopped(self, coro: Any) -> bool:
        """Run *coro* unless the stop event comes first (Ctrl-C during start-up)."""
        work = asyncio.ensure_future(coro)
        stopped = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if work.done():
            work.result()
            return True
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return False

    async def _send(self, name: str, client: Any, flow: FlowID, report: LaunchReport) -> None:
        if self.rate <= 0:
            return
        period = 1.0 / self.rate
        seq = 0
        pad = b"." * max(0, self.size - 40)
        t0 = self.launcher.t0
        while True:
            await asyncio.sleep(max(0.0, t0 + seq * period - time.monotonic()))
            payload = f"{name}|{seq}|".encode() + pad
            try:
                client.send_nowait(flow, payload, band=DEFAULT_DATA_BAND)
                report.sent[name] = report.sent.get(name, 0) + 1
            except Exception as exc:  # a gap in the overlay: count it, keep the schedule
                log.debug("%s could not send: %s", name, exc)
            seq += 1

    async def _receive(self, name: str, listener: Any, report: LaunchReport) -> None:
        async for msg in listener:
            sender, seq, _ = msg.payload.split(b"|", 2)
            report.deliveries.append(Delivery(time.monotonic() - self.launcher.t0, name,
                                              sender.decode(), int(seq)))
