"""The README is tested: its shell blocks marked ``<!-- runnable ... -->`` run against a
throwaway overlay started from the block marked ``runnable: daemons``. The commands run as
written, except that the README's ports (70xx, 71xx, 80xx) are moved to free ones."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from .checkout import PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
MARKED = re.compile(r"<!-- runnable(?P<daemons>: daemons)?(?: expect=\"(?P<expect>[^\"]*)\")?"
                    r"[^>]*-->\n```(?P<lang>sh|python)\n(?P<body>.*?)```", re.S)


def _blocks() -> tuple[str, list[tuple[str, str]]]:
    daemons, blocks = "", []
    for m in MARKED.finditer(README):
        if m.group("daemons"):
            daemons = m.group("body")
        else:
            body = m.group("body")
            if m.group("lang") == "python":
                body = f"{shlex.quote(sys.executable)} -c {shlex.quote(body)}\n"
            blocks.append((body, m.group("expect") or ""))
    return daemons, blocks


def _shims(bin_dir: Path) -> None:
    """Console scripts on PATH as pip would install them (the checkout is not installed)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, func = target.split(":")
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "
                        f"'import sys; sys.argv[0] = \"{name}\"; from {module} import {func}; "
                        f"sys.exit({func}())' \"$@\"\n")
        path.chmod(0o755)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_readme_has_runnable_blocks() -> None:
    daemons, blocks = _blocks()
    assert daemons.count("flowrouter run") == 3 and len(blocks) >= 2


def test_readme_shell_blocks_run_verbatim(tmp_path: Path) -> None:
    daemons, blocks = _blocks()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _shims(bin_dir)
    ports: dict[str, str] = {}

    def move_ports(text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            return "127.0.0.1:" + ports.setdefault(m.group(1), str(_free_port()))
        def sub_py(m: re.Match[str]) -> str:
            return '"127.0.0.1", ' + ports.setdefault(m.group(1), str(_free_port()))
        text = re.sub(r'"127\.0\.0\.1", ((?:70|71|80)\d\d)\b', sub_py, text)
        return re.sub(r"127\.0\.0\.1:((?:70|71|80)\d\d)\b", sub, text)

    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": PYTHONPATH,
           "FLOWNET_STATE_DIR": str(tmp_path / "state")}
    procs = []
    try:
        for line in move_ports(daemons.replace("\\\n", " ")).splitlines():
            if line.strip():
                argv = shlex.split(line)
                argv.insert(argv.index("run") + 1, "--http")
                argv.insert(argv.index("run") + 2, "off")
                with (tmp_path / f"r{len(procs)}.log").open("w") as log:
                    procs.append(subprocess.Popen(argv, env=env, cwd=tmp_path,
                                                  stdout=subprocess.DEVNULL, stderr=log))
        controls = [int(p) for k, p in ports.items() if k.startswith("71")]
        for port in controls:  # every router answers (processes start slowly on a busy box)
            for _ in range(600):
                if _answers(port):
                    break
                time.sleep(0.05)
            else:
                logs = "\n".join(p.read_text()[-600:] for p in tmp_path.glob("r*.log"))
                pytest.fail(f"a README router did not start: {port}\n{logs}")
        for body, expect in blocks:
            script = move_ports(body)
            out_f, err_f = tmp_path / "block.out", tmp_path / "block.err"
            with out_f.open("w") as out_w, err_f.open("w") as err_w:
                # files, not pipes: the block's background commands keep their output open
                proc = subprocess.Popen(["bash", "-c", script], env=env, cwd=tmp_path,
                                        stdout=out_w, stderr=err_w, start_new_session=True)
                try:
                    proc.wait(timeout=120)
                finally:  # background commands of the block (listeners, a member)
                    try:
                        os.killpg(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            out, err = out_f.read_text(), err_f.read_text()
            assert proc.returncode == 0, f"{body}\nstdout:\n{out}\nstderr:\n{err}"
            assert "Traceback" not in err, err
            assert expect in out, f"{body}\nexpected {expect!r} in:\n{out}\nstderr:\n{err}"
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_uvloop_demo_runs() -> None:
    """`flowrouter --uvloop demo` (the README's fast event loop) carries the demo's traffic."""
    pytest.importorskip("uvloop")
    proc = subprocess.run([sys.executable, "-m", "flownet.cli", "--uvloop", "demo"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH})
    assert proc.returncode == 0, proc.stderr
    assert "demo OK" in proc.stdout and proc.stderr == ""
