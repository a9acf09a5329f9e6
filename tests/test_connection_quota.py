"""The per-host application quota counts proven applications only.

Attack: 256 idle connections (the default ``connections_per_host``) from a router's host,
opened while the router's link is down, kept that accepted router out after any link cut:
the quota was counted when a connection arrived, before its HELLO proved anything. Now a
connection counts against its host once its HELLO is accepted and it is an application;
proven routers never count (connections still in their handshake are the shell's to bound:
per-port caps, the handshake time-out, the descriptor budget). Core on virtual time, and a
live pair of loopback routers.
"""

from __future__ import annotations

import asyncio

from flowrouter.core.quotas import QuotaLimits
from flowrouter.core.router import Close, Router, RouterParams, Send
from flowrouter.core.tables import LinkState
from flowrouter.wire import control as C
from flowrouter.wire.header import parse_header

from .rawep import RawEndpoint, core_and_edge, run, until, within

HOST = "10.0.0.9"


def _router(per_host: int) -> Router:
    return Router(RouterParams(name="core", node_id=1, core_lsids=frozenset({0x10}),
                               quota=QuotaLimits(connections_per_host=per_host),
                               accept_routers=frozenset({("edge", HOST)})))


def _hello(r: Router, lid: int, role: C.Role, name: str) -> list:
    body = C.Hello(lid, role, name, 65536).encode()
    return r.receive(lid, C.hello_header(len(body), C.FEATURES), body, 1.0)


def _errors(actions: list) -> list[str]:
    out = []
    for a in actions:
        if isinstance(a, Send) and parse_header(bytes(a.header)).band == 0:
            msg = C.decode(bytes(a.payload))
            if isinstance(msg, C.Error):
                out.append(msg.text)
    return out


def test_connections_in_their_handshake_do_not_count_against_the_host() -> None:
    r = _router(per_host=4)
    for lid in range(1, 257):  # idle: no HELLO
        assert not _errors(r.open_link(lid, 0.0, address=f"{HOST}:{40000 + lid}"))
    r.open_link(300, 0.5, address=f"{HOST}:50000")
    out = _hello(r, 300, C.Role.ROUTER, "edge")
    assert not _errors(out)
    assert r.links[300].state is LinkState.UP and r.links[300].role is C.Role.ROUTER
    assert r.counters["refused.connections-per-host"] == 0


def test_proven_applications_count_and_routers_never_do() -> None:
    r = _router(per_host=4)
    for lid in range(1, 5):
        r.open_link(lid, 0.0, address=f"{HOST}:{40000 + lid}")
        assert not _errors(_hello(r, lid, C.Role.ENDPOINT, f"app{lid}"))
    r.open_link(5, 0.0, address=f"{HOST}:40005")
    out = _hello(r, 5, C.Role.ENDPOINT, "app5")
    assert any("too many connections from 10.0.0.9" in e for e in _errors(out))
    assert any(isinstance(a, Close) and a.link == 5 for a in out)
    assert r.counters["refused.connections-per-host"] == 1
    # the host's applications are at their quota; its router still comes up
    r.open_link(6, 0.0, address=f"{HOST}:40006")
    assert not _errors(_hello(r, 6, C.Role.ROUTER, "edge"))
    assert r.links[6].state is LinkState.UP
    # an application that leaves frees its place
    r.close_link(1, 2.0)
    r.open_link(7, 2.0, address=f"{HOST}:40007")
    assert not _errors(_hello(r, 7, C.Role.ENDPOINT, "app7"))
    assert r.status()["quota"]["connections_per_host"] == {HOST: 4}


def test_the_descriptor_budget_refuses_applications_not_routers() -> None:
    r = _router(per_host=100)
    r.trust.set_application_budget("descriptor budget: 960 of 1024 in use")
    r.open_link(1, 0.0, address=f"{HOST}:40001")
    out = _hello(r, 1, C.Role.ENDPOINT, "app")
    assert any("descriptor budget" in e for e in _errors(out))
    assert r.counters["refused.descriptors"] == 1
    r.open_link(2, 0.0, address=f"{HOST}:40002")
    assert not _errors(_hello(r, 2, C.Role.ROUTER, "edge"))
    r.trust.set_application_budget(None)
    r.open_link(3, 0.0, address=f"{HOST}:40003")
    assert not _errors(_hello(r, 3, C.Role.ENDPOINT, "app"))


def test_idle_connections_from_a_routers_host_do_not_keep_it_out_after_a_cut() -> None:
    async def main() -> None:
        async with core_and_edge(reconnect_min=0.05, reconnect_max=0.2) as (core, edge):
            await within(core.wait_peers_up(1))
            host, port = core.tcp_address
            idle: list[asyncio.StreamWriter] = []
            try:
                for _ in range(256):  # the default connections_per_host, all idle
                    _r, w = await within(asyncio.open_connection(host, port))
                    idle.append(w)
                # an application from the same host is still welcome (256 are unproven)
                app = await RawEndpoint.connect(core, "app")
                await app.close()
                # cut the link: the edge re-dials, from the same host as the idle ones
                for lid, lk in list(edge.core.links.items()):
                    if lk.role is C.Role.ROUTER:
                        edge.links[lid].close("cable cut")
                await within(until(lambda: core.core.counters["links.down"] >= 2))
                await within(core.wait_peers_up(1))
                assert edge.links_up() == 1
                assert core.core.counters["refused.connections-per-host"] == 0
            finally:
                for w in idle:
                    w.close()

    run(within(main(), 60))
