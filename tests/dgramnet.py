"""Shared by the datagram-link tests (test_dgram_links.py, test_dgram_onpath.py): a router
with an ``app_udp`` listener, its udp:// address, a frame sent from a TCP client, and the
count of datagrams the listener refused."""

from __future__ import annotations

from typing import Any

import flowlib
from flowrouter.net.config import NodeConfig
from flowrouter.net.runtime import RouterNode

from .rawep import addr, get

KEY = "hex:" + "5a" * 32


def udp(node: RouterNode) -> str:
    assert node.appdgram is not None
    return "udp://%s:%d" % node.appdgram.address


def one_router(**extra: Any) -> RouterNode:
    return RouterNode(NodeConfig("r", listen="127.0.0.1:0", app_udp="127.0.0.1:0",
                                 default_lsid=0x10, core_lsids=frozenset({0x10}), http=None,
                                 **extra))


async def arrives_from_tcp(node: RouterNode, flow: Any, lst: Any, payload: bytes,
                           **kw: Any) -> None:
    """A TCP client of *node* sends *payload* on *flow*; *lst* receives it."""
    async with await flowlib.connect(addr(node), **kw) as tx:
        await tx.send(flow, payload)
        assert (await get(lst)).payload == payload


def refused(node: RouterNode) -> int:
    """Datagrams the router's app_udp listener dropped (any reason)."""
    return sum(v for k, v in node.core.counters.items() if k.startswith("appdgram.refused"))
