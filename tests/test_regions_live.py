"""Real routers (``flowrouter up``'s launcher, one process per router) with a backbone
region: the README demo traffic crosses it, and a core router's table stays flat while end
flows are added (flowrouter.core.regionedge over real links, with and without the compiled
fast path)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import flowlib
from flowrouter.core import regions as R
from flowrouter.net.runtime import query_control
from flowrouter.testbed.launcher import Launcher
from flowrouter.testbed.topology import load
from flowrouter.wire.flowid import FlowID

from .ports import free_port_block

ROOT = Path(__file__).resolve().parent.parent

CREATOR = 0x5EED


async def _core_entries(launcher: Launcher, router: str) -> int:
    return int((await query_control(launcher.control[router], timeout=2.0))
               ["status"]["flow_count"])


async def _region_ready(launcher: Launcher) -> None:
    """Every edge is on every aggregate it belongs to (the trees form once LS routes
    have spread, a moment after the links come up)."""
    for _ in range(200):
        ready = True
        for edge in ("e0", "e1", "e2", "e3"):
            st = (await query_control(launcher.control[edge], timeout=2.0))["status"]
            ready &= st["region"]["aggregates_joined"] == st["region"]["aggregates"]
        if ready:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the region's aggregates did not form")


async def _scenario(launcher: Launcher) -> tuple[list[tuple[int, bytes]], list[tuple[int,
                                                                                     bytes]],
                                                 list[int], int]:
    await launcher.start_routers()
    try:
        await _region_ready(launcher)
        addr = launcher.endpoint_address
        async with await flowlib.connect([addr("e1")], name="rx1") as rx1, \
                await flowlib.connect([addr("e2")], name="rx2") as rx2, \
                await flowlib.connect([addr("e3")], name="tx") as tx:
            # the README demo: two receivers with different masks, a sender that is no
            # member, bands 32..35; here across the region (core of LSID 0x10: edge e0)
            flow = FlowID(CREATOR, 0x10, 1)
            l1 = await rx1.listen(flow, "32-33")
            l2 = await rx2.listen(flow, "33-34")
            await asyncio.sleep(0.5)
            for band in (32, 33, 34, 35):
                await tx.send(flow, b"hello %d" % band, band=band)
            got1 = [await asyncio.wait_for(l1.get(), 5) for _ in range(2)]
            got2 = [await asyncio.wait_for(l2.get(), 5) for _ in range(2)]
            await asyncio.sleep(0.5)
            extra = l1.qsize() + l2.qsize() if hasattr(l1, "qsize") else 0
            # the core router's table while end flows are added
            sizes = []
            for batch in range(3):
                for i in range(batch * 15, batch * 15 + 15):
                    f = FlowID(CREATOR, 0x10 if i % 2 else 0x20, 100 + i)
                    await rx1.listen(f, "32")
                    await rx2.listen(f, "32")
                sizes.append(await _core_entries(launcher, "c1"))
            edge = await _core_entries(launcher, "e1")
            return ([(m.band, m.payload) for m in got1], [(m.band, m.payload) for m in got2],
                    sizes, edge + extra)
    finally:
        await launcher.close()


@pytest.mark.parametrize("native", ["", "twin", "0"])
def test_real_routers_carry_the_demo_through_a_region_with_a_flat_core_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str) -> None:
    monkeypatch.setenv("FLOWNET_NATIVE", native)
    topo = load(ROOT / "topologies" / "region-small.toml")  # the shipped one
    launcher = Launcher(topo, view=False, workdir=str(tmp_path),
                        base_port=free_port_block(len(topo.routers)))
    got1, got2, sizes, edge = asyncio.run(asyncio.wait_for(_scenario(launcher), 120))
    assert sorted(got1) == [(32, b"hello 32"), (33, b"hello 33")]
    assert sorted(got2) == [(33, b"hello 33"), (34, b"hello 34")]
    assert len(set(sizes)) == 1, sizes  # aggregates only: flat while 45 end flows came
    assert edge >= 46  # the edge holds the end flows
    config = (tmp_path / "e1.toml").read_text()
    assert "[region]" in config and "[region]" not in (tmp_path / "c1.toml").read_text()


def test_a_region_table_in_a_router_config_is_checked() -> None:
    from flowrouter.net.config import ConfigError
    from flowrouter.net.configfile import config_from_dict

    base = {"router": {"name": "e1"}}
    good = {**base, "region": {"name": "bb", "edges": ["e1", "e0"], "max_extra": 0,
                               "exits": {"0x10": "e0"}, "locality": {"geography": 3}}}
    params = config_from_dict(good).params().region
    assert params.edges == ("e0", "e1") and params.me == "e1" and params.index == 1
    assert params.exits == ((0x10, "e0"),) and params.modifiers.geography == 3
    for bad, why in (({"name": "bb"}, "needs edges"),
                     ({"name": "bb", "edges": ["e0"]}, "not an edge"),
                     ({"name": "bb", "edges": ["e1"], "group_size": 40}, "group_size"),
                     ({"name": "bb", "edges": ["e1"], "exits": {"x": "e1"}}, "LSID"),
                     ({"name": "bb", "edges": ["e1"], "colour": 1}, "unknown key")):
        with pytest.raises(ConfigError, match=why):
            config_from_dict({**base, "region": bad}).params()


def test_a_client_fails_over_from_one_edge_to_another_across_the_region(
        tmp_path: Path) -> None:
    """A receiver's edge router dies: flowlib moves it to another edge, which joins the
    flow through the region (its exit learns the new edge), and delivery goes on."""
    topo = load(ROOT / "topologies" / "region-small.toml")
    launcher = Launcher(topo, view=False, workdir=str(tmp_path),
                        base_port=free_port_block(len(topo.routers)))

    async def main() -> list[bytes]:
        await launcher.start_routers()
        try:
            await _region_ready(launcher)
            addr = launcher.endpoint_address
            async with await flowlib.connect([addr("e1"), addr("e2")], name="rx") as rx, \
                    await flowlib.connect([addr("e3")], name="tx") as tx:
                flow = FlowID(CREATOR, 0x10, 7)
                listener = await rx.listen(flow, "32")
                await tx.send(flow, b"before", band=32)
                got = [(await asyncio.wait_for(listener.get(), 5)).payload]
                launcher.procs["e1"].terminate()  # the receiver's edge goes away
                await launcher.procs["e1"].wait()
                for i in range(100):  # until the receiver is back, through e2
                    await tx.send(flow, b"after %d" % i, band=32)
                    try:
                        got.append((await asyncio.wait_for(listener.get(), 0.2)).payload)
                        break
                    except TimeoutError:
                        continue
                st = (await query_control(launcher.control["e2"], timeout=2.0))["status"]
                mine = [f for f in st["flows"] if f["flow"].endswith(":00000010:00000007")]
                assert mine and str(R.REGION_LINK) == str(mine[0]["upstream"])
                return got
        finally:
            await launcher.close()

    got = asyncio.run(asyncio.wait_for(main(), 120))
    assert got[0] == b"before" and got[-1].startswith(b"after"), got
