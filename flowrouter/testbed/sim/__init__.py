"""Deterministic network simulator: the real sans-I/O router over virtual links.

Quick start::

    from flowrouter.testbed import topology
    from flowrouter.testbed.sim import SimNetwork

    topo = topology.load("topologies/seed003-testbed.toml")
    net = SimNetwork.from_topology(topo, seed=1, scenario="A1")
    ep = net.endpoints["metropol-client"]
    ep.join("5111:10:1", 32)
    net.run_until(5.0)
    ep.send("5111:10:1", 32, b"hello")
    net.run_until(6.0)

Modules: :mod:`.engine` (event queue), :mod:`.context` (what links and endpoints need of the
network), :mod:`.links` (link model), :mod:`.endpoint` (simulated endpoint), :mod:`.network`
(wiring), :mod:`.workload` (default workload, :func:`run_topology` and the ``flowrouter sim``
command, :func:`cli_main`), :mod:`.generate` (synthetic topologies for scale runs),
:mod:`.bench` (``python -m flowrouter.testbed.sim.bench``).
"""

from __future__ import annotations

from flowrouter.testbed.sim.endpoint import Delivery, FaultNotice, JoinResult, SimEndpoint
from flowrouter.testbed.sim.engine import EventQueue
from flowrouter.testbed.sim.links import Direction, SimLink
from flowrouter.testbed.sim.network import RouterNode, SimNetwork, SimulationError, TraceRecord
from flowrouter.testbed.sim.workload import SharedFlowWorkload, cli_main, default_flow
from flowrouter.testbed.sim.workload import run as run_topology

__all__ = ["Delivery", "Direction", "EventQueue", "FaultNotice", "JoinResult", "RouterNode",
           "SharedFlowWorkload", "SimEndpoint", "SimLink", "SimNetwork", "SimulationError",
           "TraceRecord", "cli_main", "default_flow", "run_topology"]
