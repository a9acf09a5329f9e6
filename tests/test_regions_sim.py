"""``flowrouter sim TOPOLOGY --flows N --aggregate on|off --json``: many end flows through a
backbone region, side by side with aggregation off (flowrouter.testbed.sim.flowmix)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flownet.cli import main as flowrouter_main
from flowrouter.core.aggregates import Catalogue
from flowrouter.testbed.sim.flowmix import busiest_core_link, member_count
from flowrouter.testbed.sim.generate import backbone
from flowrouter.testbed.topology import dump, load
from flowrouter.testbed.topology.regions import roles

ROOT = Path(__file__).resolve().parent.parent


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert flowrouter_main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("bb") / "bb.toml"
    dump(backbone(cores=16, edges=8, group_size=4, max_extra=1, seed=2), path)
    return str(path)


def test_core_tables_shrink_and_every_member_still_gets_exactly_its_bands(
        capsys: pytest.CaptureFixture[str], small: str) -> None:
    on = run(capsys, "sim", small, "--flows", "400", "--aggregate", "on")
    off = run(capsys, "sim", small, "--flows", "400", "--aggregate", "off")
    assert on["delivery_exact"] is True and off["delivery_exact"] is True
    assert on["deliveries"]["expected"] == off["deliveries"]["expected"] > 400
    assert set(on["routers"]) == set(off["routers"])
    cores = [n for n, r in on["routers"].items() if r["role"] == "core"]
    assert len(cores) == 16
    assert sum(r["role"] == "edge" for r in on["routers"].values()) == 8
    catalogue = len(Catalogue(8, 4, 1).all_aggregates())
    assert on["regions"]["backbone"]["aggregates"] == catalogue
    for name in cores:  # aggregates only, whatever the number of end flows
        assert on["routers"][name]["peak_entries"] <= catalogue
    busiest_off = max(off["routers"][n]["peak_entries"] for n in cores)
    busiest_on = max(on["routers"][n]["peak_entries"] for n in cores)
    assert busiest_on * 5 < busiest_off
    # waste is reported and bounded: at most max_extra edges per copy
    assert 0 <= on["wasted_deliveries"] <= 1 * on["region_copies"]
    assert off["wasted_deliveries"] == 0
    for s in (on, off):
        assert s["joins"]["ok"] == s["joins"]["total"]
        assert s["control_frames_per_second"] > 0
        assert s["recovery"]["link"] == on["recovery"]["link"]
        assert s["recovery"]["seconds"] < 1.0  # trees re-graft; no stale NOT_ON_TREE cuts them
        assert s["exit_recovery"]["link"] == on["exit_recovery"]["link"] == "ls0-e00"
        # the exit's outside link fails: another edge becomes the exit (learned), and the
        # flows of its LSID are whole again within a probe round or two; without
        # aggregation e00's new way to the LS runs through its own subtree, which turns
        # around (Membership.on_join)
        assert s["exit_recovery"]["flows_probed"] > 0
        assert s["exit_recovery"]["seconds"] <= 0.3, s["exit_recovery"]
    ex = on["exit_recovery"]
    assert ex["exit_moves"] == 8  # every edge moved that LSID's exit, once
    # about 8 region messages per flow of the LSID (its BINDs from the new exit mostly;
    # the window's periodic digests and offers included): no storm
    assert 0 < ex["messages_sent"] < 10 * ex["flows_probed"], ex
    assert off["exit_recovery"]["exit_moves"] == 0


def test_the_shipped_backbone_runs_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    topo = str(ROOT / "topologies" / "backbone-200.toml")
    s = run(capsys, "sim", topo, "--flows", "60", "--aggregate", "on", "--no-failure")
    assert s["delivery_exact"] is True
    kinds = [r["role"] for r in s["routers"].values()]
    assert kinds.count("core") == 200 and kinds.count("edge") == 30
    assert s["recovery"] is None


def test_membership_is_mostly_small_with_a_few_large_flows() -> None:
    import random

    rng = random.Random(5)
    sizes = [member_count(rng, 60) for _ in range(5000)]
    assert sum(n <= 3 for n in sizes) > 0.8 * len(sizes)
    assert max(sizes) >= 21


def test_the_failed_link_is_a_core_link_and_the_same_with_aggregation_off() -> None:
    topo = load(ROOT / "topologies" / "backbone-200.toml")
    role = roles(topo)
    name = busiest_core_link(topo, role)
    assert name is not None
    lk = topo.link(name)
    assert role[lk.a] == role[lk.b] == "core"


def test_router_traces_of_both_runs_are_valid_flowtrace_input(tmp_path: Path) -> None:
    """The simulator writes each router's trace (flowrouter.core.traces schema, what
    `flowtrace analyze` reads); the run id says aggregate on or off, so the Spark job can
    compare table sizes side by side."""
    from flowrouter.core.tracereader import TraceError, read_traces
    from flowrouter.testbed.sim.flowmix import run_flows

    topo = backbone(cores=10, edges=6, group_size=3, seed=4)
    peaks: dict[str, int] = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        out.mkdir()
        run_flows(topo, 150, aggregate=mode == "on", failure=False, router_traces=str(out))
        records = list(read_traces(out))
        assert records and not [r for r in records if isinstance(r, TraceError)]
        assert {r["run"] for r in records if isinstance(r, dict)} == {
            f"{topo.name}:aggregate-{mode}:0"}
        peaks[mode] = max(int(r["entries"]) for r in records
                          if isinstance(r, dict) and r["kind"] == "snapshot"
                          and r["router"].startswith("c"))
    assert peaks["on"] < peaks["off"]
