"""What the simulator tests share: the repository's topologies (``topo(name)``), the one flow
they use (``FLOW``), joining every endpoint to it, a periodic sender that names itself in each
payload, and the receive times at an endpoint by sender.
"""

from __future__ import annotations

from pathlib import Path

from flowrouter.testbed.sim import SimNetwork
from flowrouter.testbed.topology import load
from flowrouter.wire.flowid import FlowID

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"
FLOW = FlowID(0x5111, 0x10, 1)


def topo(name: str):  # noqa: ANN201
    return load(TOPOLOGIES / f"{name}.toml")


def join_all(net: SimNetwork, flow: FlowID = FLOW, band: int = 32) -> None:
    for ep in net.endpoints.values():
        ep.join(flow, band)


def senders_of(ep, flow: FlowID = FLOW) -> dict[str, list[float]]:  # noqa: ANN001
    """Receive times at *ep*, by the sender named at the start of each payload."""
    out: dict[str, list[float]] = {}
    for d in ep.received(flow):
        out.setdefault(d.payload.split(b"|")[0].decode(), []).append(d.time)
    return out


def periodic_sender(net: SimNetwork, name: str, every: float, start: float, stop: float,
                    flow: FlowID = FLOW) -> None:
    ep = net.endpoints[name]

    def fire(k: int) -> None:
        ep.send(flow, 32, f"{name}|{k}|{net.now:.6f}".encode())
        if net.now + every < stop:
            net.after(every, fire, k + 1)

    net.schedule(start, fire, 0)
