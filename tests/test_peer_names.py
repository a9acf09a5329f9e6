"""A router we dial must be the router we meant (issue 26): a dialled peer whose HELLO name
differs from its configured name was only logged, and then shown on the dashboard and in
routes under the name it chose. It is now refused: the link is closed with the reason, the
refusal counted (``refused.peer-name``) and raised as an alert; a ``[[peer]]`` without a
name accepts any router that proves itself."""

from __future__ import annotations

import asyncio

from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode

from .rawep import addr, run, until

KEYS = {"site": "hex:" + "7e" * 32}


def test_a_dialled_router_answering_with_another_name_is_refused() -> None:
    async def main() -> None:
        for keys in ({}, KEYS):  # without keys, and with a router that holds the site key
            impostor = RouterNode(NodeConfig("r9", listen="127.0.0.1:0", link_keys=keys,
                                             accept_routers=["*@127.0.0.1"]))
            await impostor.start()
            r1 = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", link_keys=keys,
                                       reconnect_min=0.05, reconnect_max=0.2,
                                       peers=[PeerConfig(addr(impostor), "r2")]))
            await r1.start()
            try:
                await until(lambda node=r1: node.core.counters["refused.peer-name"] >= 1)
                assert r1.links_up() == 0
                assert not [lk for lk in r1.core.links.values() if lk.peer_name == "r9"]
                alerts = r1.status()["alerts"]
                assert any(a["kind"] == "peer-name" and "'r2'" in a["detail"]
                           and "'r9'" in a["detail"] for a in alerts)
            finally:
                await r1.stop()
                await impostor.stop()
    run(main())


def test_a_peer_entry_without_a_name_accepts_any_router() -> None:
    async def main() -> None:
        r2 = RouterNode(NodeConfig("r2", listen="127.0.0.1:0", link_keys=KEYS))
        await r2.start()
        r1 = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", link_keys=KEYS,
                                   peers=[PeerConfig(addr(r2))]))
        await r1.start()
        try:
            await asyncio.wait_for(r1.wait_peers_up(1), 10)
            assert r1.core.counters["refused.peer-name"] == 0
        finally:
            await r1.stop()
            await r2.stop()
    run(main())
