"""`flowrouter up --netns` (issue 17): the two-site topology across real network namespaces
joined by veth links; delivery across namespaces, non-loopback binds, and no leftovers."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from flownet.traffic import Traffic
from flowrouter.testbed import netns
from flowrouter.testbed.topology import load, loads

ROOT = Path(__file__).resolve().parent.parent

needs_netns = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and the 'ip' command to create network namespaces")


def test_plan_one_namespace_per_site_and_per_unsited_router() -> None:
    topo = load(ROOT / "topologies" / "two-site.toml")
    plan = netns.NetnsPlan.for_topology(topo, "fn-1")
    assert plan.ns_of == {"van-1": "fn-1-1", "van-2": "fn-1-1", "bos-1": "fn-1-2"}
    assert plan.address == {"fn-1-1": "10.77.0.1", "fn-1-2": "10.77.0.2"}
    assert [v[:2] for v in plan.veths] == [("fn-1-1", "fn-1-2")]  # one veth per site pair
    bare = loads('name = "t"\n[[routers]]\nname = "a"\n[[routers]]\nname = "b"\n'
                 '[[routers]]\nname = "c"\n[[links]]\na = "a"\nb = "b"\n'
                 '[[links]]\na = "b"\nb = "c"\n')
    plan = netns.NetnsPlan.for_topology(bare, "fn-2")
    assert len(set(plan.ns_of.values())) == 3
    assert len(plan.veths) == 2
    for cmd in plan.commands():  # every address used is a 10.77 one, inside the namespaces
        assert not any(w.startswith(("127.", "192.", "172.")) for w in cmd)


def test_refuses_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns.unavailable() == ("--netns needs root (it creates network namespaces and "
                                   "veth links)")


@needs_netns
def test_two_site_across_namespaces(tmp_path: Path) -> None:
    topo = load(ROOT / "topologies" / "two-site.toml")
    launcher = netns.NetnsLauncher(topo, duration=3.0, view=False, workdir=str(tmp_path))
    prefix = launcher.prefix
    report = asyncio.run(asyncio.wait_for(Traffic(launcher, rate=5.0).run(), 60))
    # Every topology link came up across the veth/site addresses.
    assert report.links_never_up == []
    # Messages crossed namespaces both ways (vancouver <-> boston).
    assert report.delivered_between("carol", "alice", 0, 1e9) > 0
    assert report.delivered_between("alice", "carol", 0, 1e9) > 0
    assert report.delivered_between("bob", "carol", 0, 1e9) > 0
    # Each router listened on its site address (not loopback) inside its own namespace.
    for router, (ns, addrs) in launcher.bound.items():
        assert ns == launcher.plan.ns_of[router]
        assert addrs == [launcher.listen[router]], (router, addrs)
        assert not addrs[0][0].startswith("127.")
    assert launcher.bound["van-1"][0] != launcher.bound["bos-1"][0]
    assert netns.remaining_namespaces(prefix) == []


@needs_netns
def test_failed_start_removes_namespaces(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    topo = load(ROOT / "topologies" / "two-site.toml")
    launcher = netns.NetnsLauncher(topo, duration=3.0, view=False, workdir=str(tmp_path))
    seen: list[list[str]] = []

    def broken(name: str, argv: list[str]) -> list[str]:
        seen.append(netns.remaining_namespaces(launcher.prefix))
        return ["ip", "netns", "exec", launcher.plan.ns_of[name], "false"]

    monkeypatch.setattr(launcher, "_router_command", broken)
    with pytest.raises(RuntimeError, match="exited with code"):
        asyncio.run(asyncio.wait_for(Traffic(launcher).run(), 60))
    assert seen and len(seen[0]) == 2  # the namespaces existed while routers started
    assert netns.remaining_namespaces(launcher.prefix) == []


@needs_netns
def test_cli_up_netns(tmp_path: Path) -> None:
    async def go() -> Any:
        proc = await asyncio.create_subprocess_exec(
            "python3", "-m", "flownet.cli", "up", str(ROOT / "topologies" /
                                                                "two-site.toml"),
            "--netns", "--quiet", "--duration", "2", "--rate", "5", "--workdir",
            str(tmp_path), cwd=str(ROOT), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, out.decode(), err.decode(), proc.pid

    code, out, err, pid = asyncio.run(go())
    assert code == 0, err
    assert "carol" in out and "delivered" in out
    assert netns.remaining_namespaces(f"fn-{pid}") == []


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(int(pid))
    return found


@needs_netns
def test_cli_ctrl_c_removes_everything(tmp_path: Path) -> None:
    import signal

    async def go() -> tuple[int | None, str, int]:
        proc = await asyncio.create_subprocess_exec(
            "python3", "-m", "flownet.cli", "up",
            str(ROOT / "topologies" / "two-site.toml"), "--netns", "--duration", "60",
            "--rate", "5", "--workdir", str(tmp_path), cwd=str(ROOT),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        assert proc.stdout is not None
        while True:  # interrupt once the overlay runs (routers in both namespaces)
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, "up ended before the overlay came up"
            if line.startswith(b"overlay "):
                break
        assert len(netns.remaining_namespaces(f"fn-{proc.pid}")) == 2
        assert _processes_mentioning(str(tmp_path))  # the routers run
        proc.send_signal(signal.SIGINT)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, out.decode(), proc.pid

    code, out, pid = asyncio.run(go())
    assert code == 130, out
    assert netns.remaining_namespaces(f"fn-{pid}") == []
    assert _processes_mentioning(str(tmp_path)) == []
