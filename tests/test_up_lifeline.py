"""``flowrouter up``'s routers die with it, whatever kills it (issue 28): SIGKILL used to leave
them running (in their namespaces with ``--netns``, where ``ip netns del`` did not stop
them either). The launcher's children carry ``PR_SET_PDEATHSIG``
(:func:`flowrouter.testbed.launcher.lifeline`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowrouter.testbed import netns
from flowrouter.testbed.launcher import lifeline

from .ports import free_port_block

ROOT = Path(__file__).resolve().parent.parent

needs_netns = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and the 'ip' command to create network namespaces")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def _children(pid: int) -> list[int]:
    """The processes whose parent is *pid* (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def _is_router(pid: int) -> bool:
    """Whether process *pid* runs a router (``flowrouter.tools.cli ... run``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"flowrouter.tools.cli" in argv and b"run" in argv


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _routers_then_kill(argv: list[str], count: int, workdir: Path) -> list[int]:
    """Start ``flowrouter up``, wait for its *count* routers to answer, SIGKILL it; returns
    the routers' pids."""
    up = subprocess.Popen([sys.executable, "-m", "flownet.cli", "up", *argv, "--workdir",
                           str(workdir), "--duration", "120", "--quiet"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # no event crosses processes: a bounded poll
            logs = list(workdir.glob("*.log"))
            running = [p for p in logs if b"running" in p.read_bytes()]
            if len(running) >= count:
                break
            assert up.poll() is None, f"flowrouter up exited with {up.returncode}"
            assert time.monotonic() < deadline, "the routers did not start"
            time.sleep(0.1)
        # its routers only: the launcher also runs short helpers (in --netns mode
        # `ip netns exec NS cat /proc/net/tcp` to see what listens), which are its children
        # for a moment too
        routers = [p for p in _children(up.pid) if _is_router(p)]
        assert len(routers) == count
        up.send_signal(signal.SIGKILL)
        up.wait(10)
        return routers
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def _gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@linux
def test_routers_die_when_up_is_killed(tmp_path: Path) -> None:
    routers = _routers_then_kill([str(ROOT / "topologies" / "two-site.toml"),
                                  "--base-port", str(free_port_block(3))], 3, tmp_path)
    left = _gone(routers)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


@linux
@needs_netns
def test_netns_routers_die_when_up_is_killed(tmp_path: Path) -> None:
    before = set(netns.remaining_namespaces("fn"))
    routers = _routers_then_kill([str(ROOT / "topologies" / "two-site.toml"), "--netns"], 3,
                                 tmp_path)
    left = _gone(routers)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    for ns in set(netns.remaining_namespaces("fn")) - before:  # its leftovers: our job now
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    assert left == []


@linux
def test_lifeline_kills_a_child_whose_parent_died_before_it_was_armed() -> None:
    """The race: the launcher dies between fork and prctl; the child notices its new parent
    and goes at once instead of running for ever."""
    arm = lifeline(os.getpid() + 10**6)  # "the launcher" is not our parent
    assert arm is not None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             preexec_fn=arm)
    assert child.wait(10) == -signal.SIGKILL
