"""``flowrouter up --web``: the dashboard of a whole overlay launched on this machine.

The launcher asks every router for its status (control port) when the page polls, and this
module turns the answers into the dashboard's overlay document
(:mod:`flowrouter.net.dashboard`): the topology's routers and links with their states (a link
cut by the fault schedule is "cut", one down for any other reason "down"), frame counts for
the page's rates, the fault events applied so far, and the shared flow's tree with its band
masks. It sees the launcher only as an :class:`OverlayRun` (what it reads of a run), so the
launcher may import this module and not the other way round. Testbed layer: imports the net
layer, the topology model and the standalone monitor.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from flowrouter.monitor import Monitored, MonitorServer, start_monitor
from flowrouter.net.control import query_control
from flowrouter.net.dashboard import dashboard_pages, flow_trees
from flowrouter.testbed.topology import Topology


class OverlayRun(Protocol):
    """What the dashboard reads of a launched overlay (:class:`~flowrouter.testbed.launcher.
    Launcher` is one)."""

    @property
    def topo(self) -> Topology: ...
    @property
    def scenario(self) -> str | None: ...
    @property
    def control(self) -> dict[str, str]:
        """Router name -> its control address."""
    @property
    def cut(self) -> dict[str, str]:
        """Topology link name -> why the fault schedule cut it, for the links cut now."""
    @property
    def t0(self) -> float:
        """When the run started (monotonic clock); 0 until it has."""
    @property
    def events(self) -> list[tuple[float, str]]:
        """The fault events applied so far: (seconds after t0, what)."""


def _side(st: dict[str, Any] | None, peer: str) -> dict[str, Any] | None:
    """The up router link toward *peer* in a status document, if there is one."""
    if st is None:
        return None
    return next((lk for lk in st["links"] if lk["role"] == "router" and lk["peer"] == peer
                 and lk["state"] == "up"), None)


async def overlay_document(launcher: OverlayRun) -> dict[str, Any]:
    statuses: dict[str, dict[str, Any]] = {}
    for name, ctl in launcher.control.items():
        try:
            statuses[name] = (await query_control(ctl, timeout=1.0))["status"]
        except (ConnectionError, OSError):
            pass
    topo = launcher.topo
    routers = [{"name": r.name, "up": r.name in statuses,
                "flows": statuses.get(r.name, {}).get("flow_count", 0)} for r in topo.routers]
    links = []
    for lk in topo.links:
        a, b = _side(statuses.get(lk.a), lk.b), _side(statuses.get(lk.b), lk.a)
        if lk.name in launcher.cut:
            state, detail = "cut", launcher.cut[lk.name]
        elif a is not None and b is not None:
            state, detail = "up", f"{lk.transport}"
        else:
            state, detail = "down", "no link between the routers"
        links.append({"name": lk.name, "a": lk.a, "b": lk.b, "state": state, "detail": detail,
                      "frames": (a["tx"] if a else 0) + (b["tx"] if b else 0)})
    t0 = launcher.t0 or time.monotonic()
    events = [{"t": round(t, 3), "what": what} for t, what in launcher.events]
    return {"name": f"overlay {topo.name}" + (f" ({launcher.scenario})"
                                                if launcher.scenario else ""),
            "t": round(time.monotonic() - t0, 3), "routers": routers, "links": links,
            "events": events, "flows": flow_trees(statuses)}


async def start_web(launcher: OverlayRun, address: str) -> MonitorServer | None:
    """Serve the overlay's dashboard (``/``), ``/api/overlay`` and the usual /healthz,
    /status and /metrics of the launcher itself."""
    def status() -> dict[str, Any]:
        return {"topology": launcher.topo.name, "scenario": launcher.scenario,
                "routers": {name: ctl for name, ctl in launcher.control.items()},
                "events": [{"t": t, "what": w} for t, w in launcher.events]}

    source = Monitored(kind="overlay", name=launcher.topo.name, status=status,
                       pages=dashboard_pages(lambda: overlay_document(launcher)))
    return await start_monitor(source, address)


__all__ = ["OverlayRun", "overlay_document", "start_web"]
