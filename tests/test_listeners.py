"""Several listen addresses: a router may listen on many addresses, some only for routers
and some only for applications (a site-facing interface and a local one)."""

from __future__ import annotations

import asyncio

import flowlib
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode

from .rawep import run, within


def _by_kind(node: RouterNode) -> dict[str, str]:
    return {row["accepts"]: row["address"] for row in node.listeners()}


def test_router_and_application_listeners_accept_only_their_kind(tmp_path: object) -> None:
    async def go() -> None:
        hub = RouterNode(NodeConfig("hub", listen=None, router_listen=["127.0.0.1:0"],
                                    app_listen=["127.0.0.1:0"], core_lsids=frozenset({0x10}),
                                    default_lsid=0x10,
                                    accept_routers=["edge@127.0.0.1", "stray@127.0.0.1"]))
        await hub.start()
        try:
            kinds = _by_kind(hub)
            assert set(kinds) == {"routers", "applications"}
            # A router on the router listener: up.
            edge = RouterNode(NodeConfig("edge", listen=None, default_lsid=0x10, peers=[
                PeerConfig(kinds["routers"], name="hub")]))
            await edge.start()
            await hub.wait_peers_up(1)
            # An application on the application listener: served.
            app = await within(flowlib.connect([kinds["applications"]], name="app"))
            assert app.connected
            await app.close()
            # An application on the router listener: refused after its hello.
            bad = await within(flowlib.connect([kinds["routers"]], name="wrong-door"))
            for _ in range(500):  # the router hangs up right after the handshake
                if not bad.connected:
                    break
                await asyncio.sleep(0.01)
            assert not bad.connected
            await bad.close()
            # A router on the application listener: its link never comes up.
            stray = RouterNode(NodeConfig("stray", listen=None, reconnect_min=5.0,
                                          reconnect_max=5.0,
                                          peers=[PeerConfig(kinds["applications"], name="hub")]))
            await stray.start()
            await asyncio.sleep(0.3)  # a refusal is an absence; give it a few round trips
            assert stray.links_up() == 0
            assert hub.links_up() == 1
            await stray.stop()
            await edge.stop()
        finally:
            await hub.stop()

    run(go())
