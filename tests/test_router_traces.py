"""The routers' trace records, from the simulator and from a real router, validate against
the schema and describe what happened (entries, links, GC, forwarding, drops, snapshots)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from flowrouter.core.traces import MemoryTrace, TraceError, read_traces
from flowrouter.net.config import NodeConfig
from flowrouter.net.configfile import load_config
from flowrouter.testbed.sim.workload import run
from flowrouter.testbed.topology import load

from .corenet import LSID, CoreNet, flow

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"


def test_core_traces_table_changes_gc_and_drops() -> None:
    traces: dict[str, MemoryTrace] = {}
    soft = dict(epoch_length=1.0, refresh_interval=1.0, hold_factor=2.0, liveness_interval=0.5,
                dead_after=1.5)
    net = CoreNet(**soft)
    from flowrouter.core.router import Router, RouterParams

    def router(name: str, **kw: object) -> Router:
        tr = traces[name] = MemoryTrace(name, sample_rate=1.0)
        r = Router(RouterParams(name=name, node_id=len(net.routers) + 1,
                                **soft, **kw), now=net.now, tracer=tr)  # type: ignore[arg-type]
        net.routers[name] = r
        return r
    router("r1", core_lsids=frozenset({LSID}))
    router("r2")
    net.connect("r1", "r2")
    f = flow(LSID, 9)
    a = net.endpoint("A", "r2", silent=True)
    a.join(f, [40])
    s = net.endpoint("S", "r1")
    s.send(f, 40, b"yes")
    s.send(f, 41, b"no")  # nobody wants 41: r1 drops it (no receivers)
    net.run(until=6.0, step=0.1)  # A never refreshes: collected after the hold time
    kinds = Counter(rec["kind"] for tr in traces.values() for rec in tr.records)
    for kind in ("link_up", "entry_add", "link_add", "fwd", "drop", "refresh", "prune",
                 "link_del", "entry_del", "snapshot"):
        assert kinds[kind] >= 1, kind
    r2 = traces["r2"].records
    assert any(r["kind"] == "link_del" and r["cause"] == "expired" for r in r2)
    assert any(r["kind"] == "entry_del" and r["cause"] == "expired" for r in r2)
    assert any(r["kind"] == "refresh" and r["dir"] == "sent" for r in r2)
    assert not any(r["kind"] == "gc_ping" for tr in traces.values() for r in tr.records)
    assert any(r["kind"] == "drop" and r["reason"] == "no-receivers"
               for r in traces["r1"].records)
    assert all(rec["flow"] == str(f) for tr in traces.values() for rec in tr.records
               if "flow" in rec)


def test_simulator_writes_router_traces(tmp_path: Path) -> None:
    topo = load(TOPOLOGIES / "two-site.toml")
    run(topo, duration=20, rate=2.0, router_traces=str(tmp_path), trace_sample=0.5)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["bos-1.trace.jsonl", "van-1.trace.jsonl", "van-2.trace.jsonl"]
    items = list(read_traces(str(tmp_path)))
    errors = [x for x in items if isinstance(x, TraceError)]
    assert not errors, errors[:3]
    kinds = Counter(x["kind"] for x in items)
    assert kinds["fwd"] > 10 and kinds["snapshot"] >= 3 and kinds["entry_add"] >= 3


def test_daemon_config_enables_tracing(tmp_path: Path) -> None:
    cfg_file = tmp_path / "r.toml"
    cfg_file.write_text(f'[router]\nname = "rt"\nlisten = "127.0.0.1:0"\n'
                        f'core_lsids = [0x10]\n[trace]\ndir = "{tmp_path / "tr"}"\n'
                        f'sample = 1.0\n')
    cfg = load_config(cfg_file)
    assert cfg.trace_dir and cfg.trace_sample == 1.0

    async def main() -> None:
        import flowlib
        from flowrouter.net.runtime import RouterNode
        node = RouterNode(NodeConfig(**{f: getattr(cfg, f) for f in NodeConfig.__slots__}))  # type: ignore[attr-defined]
        await node.start()
        try:
            addr = "%s:%d" % node.tcp_address
            rx = await flowlib.connect([addr], name="rx", state_dir=str(tmp_path / "s"))
            tx = await flowlib.connect([addr], name="tx", state_dir=str(tmp_path / "s"))
            f = await tx.create(0x10)
            lst = await rx.listen(f, [33])
            await tx.send(f, b"x", band=33)
            await asyncio.wait_for(lst.get(), 10)
            await rx.close()
            await tx.close()
        finally:
            await node.stop()
    asyncio.run(asyncio.wait_for(main(), 30))
    items = list(read_traces(str(tmp_path / "tr")))
    assert not [x for x in items if isinstance(x, TraceError)]
    kinds = {x["kind"] for x in items}
    assert {"link_up", "entry_add", "link_add", "fwd", "entry_del", "link_down"} <= kinds
    t = [x["t"] for x in items]
    import time
    assert abs(t[0] - time.time()) < 120  # wall-clock times
