"""``flowrouter demo``: a three-router overlay on loopback carrying real traffic end to end.

Topology: ``r1 - r2 - r3``; r3 is the core (location service) for LSID 0x10. Receiver A on r1
listens to bands 32-33, receiver B on r2 to bands 33-34, the sender S sits on r3. Bands 32..35
are sent; the demo checks that each receiver got exactly its bands and shows where the
routers filtered (band 35 dies at the core; band 34 never crosses r2 -> r1).

Routers run in this process (flowrouter.net); the sender and receivers are flowlib clients.
"""

from __future__ import annotations

import asyncio
import time

import flowlib
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire.bands import BandMask

LSID = 0x10


async def run_demo(count: int = 5, quiet: bool = False) -> int:
    """Run the demo; 0 when every receiver got exactly its bands, else 1."""
    def say(text: str = "") -> None:
        if not quiet:
            print(text, flush=True)

    r3 = RouterNode(NodeConfig("r3", listen="127.0.0.1:0", core_lsids=frozenset({LSID}),
                               accept_routers=["r2@127.0.0.1"],
                               default_lsid=LSID, epoch=2.0))
    await r3.start()
    r2 = RouterNode(NodeConfig("r2", listen="127.0.0.1:0", epoch=2.0,
                               accept_routers=["r1@127.0.0.1"],
                               peers=[PeerConfig("%s:%d" % r3.tcp_address, "r3")]))
    await r2.start()
    r1 = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", epoch=2.0,
                               peers=[PeerConfig("%s:%d" % r2.tcp_address, "r2")]))
    await r1.start()
    nodes = [r1, r2, r3]
    try:
        await r1.wait_routes(LSID)
        say("overlay up: r1 (%s:%d) - r2 (%s:%d) - r3 (%s:%d, core of LSID 0x10)"
            % (*r1.tcp_address, *r2.tcp_address, *r3.tcp_address))
        a = await flowlib.connect(["%s:%d" % r1.tcp_address], name="receiver-A")
        b = await flowlib.connect(["%s:%d" % r2.tcp_address], name="receiver-B")
        s = await flowlib.connect(["%s:%d" % r3.tcp_address], name="sender-S")
        async with a, b, s:
            flow = await s.create()
            say(f"created flow {flow}")
            masks = {"A": BandMask.parse("32-33"), "B": BandMask.parse("33-34")}
            listeners = {"A": await a.listen(flow, masks["A"], size=1000),
                         "B": await b.listen(flow, masks["B"], size=1000)}
            say("A on r1 listens to bands 32-33; B on r2 listens to bands 33-34")
            await s.advertise(flow)
            t0 = time.perf_counter()
            bands = [32, 33, 34, 35]
            for i in range(count):
                for band in bands:
                    await s.send(flow, f"message {i} on band {band}".encode(), band=band)
            got: dict[str, list[int]] = {}
            ok = True
            for who, listener in listeners.items():
                want = sum(count for band in bands if band in masks[who])
                msgs = []
                try:
                    for _ in range(want):
                        msgs.append(await asyncio.wait_for(listener.get(), 5.0))
                except TimeoutError:
                    ok = False
                got[who] = [m.band for m in msgs]
                if len(listener) or any(m.band not in masks[who] for m in msgs):
                    ok = False
            elapsed = time.perf_counter() - t0
            say(f"sent {count * len(bands)} messages on bands 32-35 in {elapsed * 1000:.1f} ms")
            for who in listeners:
                per_band = {band: got[who].count(band) for band in bands}
                say(f"  {who} received {len(got[who])}: " + ", ".join(
                    f"band {band} x{n}" for band, n in per_band.items() if n))
            say("where the routers filtered:")
            for node in nodes:
                c = node.core.counters
                say(f"  {node.config.name}: forwarded {c['forwarded']}, dropped because no "
                    f"receiver wants the band {c['drop.no-receivers'] + c['drop.band-filtered']}")
            link_r2_r1 = next(lk for lk in r2.core.links.values() if lk.peer_name == "r1")
            say(f"  r2 -> r1 carried {link_r2_r1.tx} data frames: only bands 32-33, which A wants")
            say("demo OK: every receiver got exactly its bands" if ok
                else "demo FAILED: a receiver missed messages or got bands it did not ask for")
            return 0 if ok else 1
    finally:
        for node in reversed(nodes):
            await node.stop()
