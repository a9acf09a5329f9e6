"""The two-router examples a new user copies (issue 28): the README's location-service block
and ``flowrouter run --help``'s. Both used to fail: the second router dialled the first,
which refused it (no link keys, not listed), and it re-dialled ten times a second. They are
run here as written, with only their ports moved (so parallel runs do not collide): the
link comes up, nothing is refused, and ``flowls lookup`` finds the LSID."""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from flowrouter.net.runtime import query_control
from flowrouter.tools.cli import RUN_EPILOG

from .ports import free_port_block

ROOT = Path(__file__).resolve().parent.parent


def _commands(text: str, first: str) -> list[list[str]]:
    """The command lines starting with *first* in *text* (continuation lines joined; a
    trailing ``&``, which puts a server in the background in a README block, left off)."""
    text = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(line.strip().split("#")[0].rstrip().removesuffix("&"))
            for line in text.splitlines() if line.strip().startswith(first + " ")]


def _moved(argv: list[str], ports: dict[int, int]) -> list[str]:
    out = []
    for word in argv:
        for old, new in ports.items():
            word = word.replace(f":{old}", f":{new}")
        out.append(word)
    return out


def _python(argv: list[str]) -> list[str]:
    """The console script as this checkout's module (flowrouter = flownet.cli)."""
    module = {"flowrouter": "flownet.cli", "flowls": "flowls.service"}[argv[0]]
    return [sys.executable, "-c", f"import sys; from {module} import main; "
            "sys.argv[0] = %r; sys.exit(main())" % argv[0], *argv[1:]]


def _run_pair(lines: list[list[str]], control: str, peer: str, tmp: Path,
              then: list[str] | None = None) -> dict[str, int]:
    """Start *lines*, wait for *control*'s router to have its link to *peer* up, run *then*
    (a command of the same block; it must succeed) and return that router's counters."""
    procs = []
    try:
        for i, argv in enumerate(lines):
            log = (tmp / f"{i}.log").open("wb")
            procs.append(subprocess.Popen(_python([*argv, "--http", "off"]), stdout=log,
                                          stderr=log))
        deadline = time.monotonic() + 30
        echoes = None  # the router's liveness echoes when the link was first seen up
        while True:  # another process's links have no event here: a bounded poll
            try:
                st = asyncio.run(query_control(control))["status"]
                sent = st["counters"].get("liveness.echoes", 0)
                if echoes is None and any(r["peer"] == peer and r["state"] == "up"
                                          for r in st["links"]):
                    echoes = sent
                # up, and two liveness rounds later (a refusal or a re-dial storm shows by
                # then in links.down / refused.*): not a fixed time
                if echoes is not None and sent >= echoes + 2:
                    if then is not None:
                        done = subprocess.run(_python(then), capture_output=True, text=True,
                                              check=False, timeout=30)
                        assert done.returncode == 0, done.stderr
                    return dict(asyncio.run(query_control(control))["status"]["counters"])
            except ConnectionError:
                pass
            for p in procs:
                assert p.poll() is None, (tmp / "0.log").read_text() + (
                    tmp / "1.log").read_text()
            assert time.monotonic() < deadline, "the link never came up:\n" + "\n".join(
                (tmp / f"{i}.log").read_text()[-2000:] for i in range(len(procs)))
            time.sleep(0.1)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


def test_readme_location_service_block(tmp_path: Path) -> None:
    section = (ROOT / "README.md").read_text().split("## Location services", 1)[1]
    section = section.split("\n## ", 1)[0]
    # the section's shell block that starts the members (it has others: a simulator run)
    block = next(b.split("```", 1)[0] for b in section.split("```sh")[1:]
                 if "flowls run" in b.split("```", 1)[0])
    lines = _commands(block, "flowls")
    runs = [argv for argv in lines if argv[1] == "run"]
    assert [argv[argv.index("--name") + 1] for argv in runs] == ["ls1", "ls2"]
    base = free_port_block(4)
    ports = {7501: base, 7502: base + 1, 7601: base + 2}
    runs = [_moved(argv, ports) for argv in runs]
    flows = _moved(next(a for a in lines if a[1] == "flows"), ports)
    counters = _run_pair(runs, f"127.0.0.1:{base + 2}", "ls2", tmp_path, flows)
    assert counters.get("refused.router-claim", 0) == 0
    assert counters.get("links.down", 0) == 0  # one link, up once, not a storm


def test_run_help_example(tmp_path: Path) -> None:
    lines = [argv for argv in _commands(RUN_EPILOG, "flowrouter") if "--name" in argv]
    assert [argv[argv.index("--name") + 1] for argv in lines] == ["r1", "r2"]
    base = free_port_block(4)
    ports = {7001: base, 7002: base + 1, 7101: base + 2}
    lines = [_moved(argv, ports) for argv in lines]
    counters = _run_pair(lines, f"127.0.0.1:{base + 2}", "r2", tmp_path)
    assert counters.get("refused.router-claim", 0) == 0
    assert counters.get("links.down", 0) == 0
