"""Seed workloads: seed 000's message mix in the simulator; the storm and churn benchmarks.

Simulator checks are deterministic (virtual time). The two benchmark scripts run in their
quick mode as subprocesses with real routers on 127.0.0.1; only structure and sanity are
asserted (messages got through), never a time or a rate.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from flowrouter.testbed.sim import seedmix
from flowrouter.testbed.topology import load

from .checkout import with_checkout

REPO = Path(__file__).resolve().parent.parent


def test_size_mix_follows_table_6_1() -> None:
    rng = random.Random(7)
    draws = [seedmix.draw_size(rng) for _ in range(20000)]
    share = Counter(seedmix.size_class(n) for n in draws)
    assert abs(share["1"] / 20000 - 0.70) < 0.02
    assert abs(share["2-30"] / 20000 - 0.20) < 0.02
    assert abs(share["31-100"] / 20000 - 0.10) < 0.02
    assert min(draws) == 1 and max(draws) <= 100 and max(draws) > 90


@pytest.mark.parametrize("name", seedmix.SEED_TOPOLOGIES)
def test_both_systems_deliver_on_seed_topologies(name: str) -> None:
    topo = load(REPO / "topologies" / f"{name}.toml")
    for frag in (True, False):
        r = seedmix.run_one(topo, fragmenting=frag, t=1.0, interarrival=100.0,
                            duration=1500.0, seed=3)
        assert r["messages_complete"] > 0.5 * r["messages_sent"], r
        assert r["misdelivered"] == 0 and r["duplicates"] == 0, r
        assert r["router_errors"] == 0, r
        assert "drop.too-big-for-link" not in r["router_drops"], r
        assert r["classes"]["31-100"]["complete"] > 0, r


def test_fragmenting_pipelines_a_long_message_over_a_path() -> None:
    """One 100-fragment message across the linear array: fragments pipeline hop by hop, so
    it arrives far sooner than a whole message stored and forwarded at every hop."""
    topo = load(REPO / "topologies" / "linear-20.toml")
    delays = {}
    for frag in (True, False):
        net = seedmix.build(topo, t=1.0, buffer_fragments=500, max_fragments=100,
                            fragment=seedmix.FRAGMENT_BYTES, seed=1, tick=1.0)
        wl = seedmix.MailWorkload(net, interarrival=1e9, fragmenting=frag)
        wl.install()
        net.run_until(4.0)
        sender = net.endpoints["r05-ua"]
        # send directly: r05 -> core r01 -> r10 (toward the core and down the tree)
        flow = wl.mailbox["r10-ua"]
        n = 100
        for i in range(n if frag else 1):
            size = seedmix.FRAGMENT_BYTES if frag else n * seedmix.FRAGMENT_BYTES
            sender.send(flow, 32, seedmix.STAMP.pack(wl.index["r05-ua"], 1, i, n, net.now)
                        + bytes(size - seedmix.STAMP.size))
        net.run_until(4000.0)
        assert wl.done["31-100"] == 1, (frag, wl.done)
        delays[frag] = wl.delays["31-100"][0]
    assert delays[True] < 0.5 * delays[False], delays


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = with_checkout(env.get("PYTHONPATH"))
    return env


@pytest.mark.parametrize("script", ["storm", "churn"])
def test_benchmark_quick(script: str, tmp_path: Path) -> None:
    out = tmp_path / f"{script}.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / f"{script}.py"),
                           "--quick", "--out", str(out)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["benchmark"] == script and data["quick"] is True
    if script == "storm":
        assert [r["senders"] for r in data["runs"]] == [1, 4]
        for r in data["runs"]:
            assert r["sent"] > 0 and r["delivered"] > 0 and 0 < r["ratio"] <= 1.0
    else:
        r = data["run"]
        assert r["changes"] == 4 and r["sent"] > 0
        assert all(x > 0 for x in r["received_per_member"])
        assert r["gap_ms"]["median"] is not None
