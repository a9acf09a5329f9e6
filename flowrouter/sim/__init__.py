"""Deterministic network simulator: the real sans-I/O router over virtual links.

Quick start::

    from flowrouter import topology
    from flowrouter.sim import SimNetwork

    topo = topology.load("topologies/seed003-testbed.toml")
    net = SimNetwork.from_topology(topo, seed=1, scenario="A1")
    ep = net.endpoints["metropol-client"]
    ep.join("5111:10:1", 32)
    net.run_until(5.0)
    ep.send("5111:10:1", 32, b"hello")
    net.run_until(6.0)

Modules: :mod:`.engine` (event queue), :mod:`.links` (link model), :mod:`.endpoint`
(simulated endpoint), :mod:`.network` (wiring), :mod:`.workload` (default workload,
:func:`run_topology` and the ``flowrouter sim`` command, :func:`cli_main`), :mod:`.generate`
(synthetic topologies for scale runs), :mod:`.bench` (``python -m flowrouter.sim.bench``).
"""

from __future__ import annotations

from .endpoint import Delivery, FaultNotice, JoinResult, SimEndpoint
from .engine import EventQueue
from .links import Direction, SimLink
from .network import RouterNode, SimNetwork, SimulationError, TraceRecord
from .workload import SharedFlowWorkload, cli_main, default_flow
from .workload import run as run_topology

__all__ = ["Delivery", "Direction", "EventQueue", "FaultNotice", "JoinResult", "RouterNode",
           "SharedFlowWorkload", "SimEndpoint", "SimLink", "SimNetwork", "SimulationError",
           "TraceRecord", "cli_main", "default_flow", "run_topology"]
