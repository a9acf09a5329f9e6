"""Every console script behaves the same on bad input: one line, the right exit code, no
traceback (flowrouter.console). The scripts are run as real processes, found from
pyproject.toml's [project.scripts], so a new script is covered without editing this file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from .checkout import PYTHONPATH
from .ports import free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS: dict[str, str] = tomllib.loads(
    (ROOT / "pyproject.toml").read_text())["project"]["scripts"]
#: flowdir documented EX_USAGE (64) for bad usage before the common behaviour existed
USAGE = {"flowdir": 64}


def command(script: str, *args: str) -> list[str]:
    """The argv the installed console script would run (the project is not pip-installed)."""
    module, func = SCRIPTS[script].split(":")
    boot = (f"import sys; sys.argv[0] = {script!r}; from {module} import {func}; "
            f"sys.exit({func}())")
    return [sys.executable, "-c", boot, *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": PYTHONPATH, "FLOWNET_TRACEBACK": "0"}


def run(script: str, *args: str, timeout: float = 60, **kw: object
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(script, *args), capture_output=True, text=True,
                          timeout=timeout, env=env(), cwd=ROOT, **kw)  # type: ignore[call-overload]


def assert_one_line(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(err.splitlines()) == 1, f"not one line: {proc.stderr!r}"
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv.getsockname()[1]
    srv.close()


@pytest.fixture
def busy_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def chatty_control() -> Iterator[int]:
    """A fake router control port answering status with a long flow table (for `| head`)."""
    flows = [{"flow": f"{i:016x}:00000010:00000001", "upstream": 0, "aggregate": "32",
              "downstream": {}, "joined": True} for i in range(5000)]
    status = {"name": "fake", "node_id": 1, "epoch": 0, "flow_count": len(flows),
              "listen": None, "links": [], "ls_routes": [], "flows": flows,
              "counters": {f"c{i}": i for i in range(5000)}}
    reply = json.dumps({"ok": True, "status": status}).encode() + b"\n"
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_script_has_version_and_one_line_usage_errors(script: str) -> None:
    proc = run(script, "--version")
    assert proc.returncode == 0 and "flownet" in proc.stdout, proc
    proc = run(script, "--no-such-flag")
    assert_one_line(proc, USAGE.get(script, 2), script, "--help")


CONFIG_CASES = [
    ('max_payload = "big"', "max_payload"),
    ("link_credit = -5", "link_credit"),
    ('listen = "10.77.1.2:7000,10.77.2.1:7000"', "listen"),
    ("epoch = 1", "unknown key"),
    ("reconnect_min = 9.0\nreconnect_max = 1.0", "reconnect_min"),
    ('control = "r1@127.0.0.1:7101"', "control"),
]


@pytest.mark.parametrize(("line", "names"), CONFIG_CASES)
def test_check_config_names_the_bad_key(tmp_path: Path, line: str, names: str) -> None:
    path = write(tmp_path, "r.toml", f'[router]\nname = "r1"\n{line}\n')
    err = assert_one_line(run("flowrouter", "check-config", path), 2, names)
    assert path in err


def test_check_config_accepts_several_listen_addresses(tmp_path: Path) -> None:
    path = write(tmp_path, "r.toml", '[router]\nname = "r1"\nlisten = ["127.0.0.1:7000", '
                 '"127.0.0.2:7000"]\nrouter_listen = "127.0.0.1:7100"\n')
    proc = run("flowrouter", "check-config", path)
    assert proc.returncode == 0, proc.stderr
    assert "127.0.0.2:7000" in proc.stdout


def test_table_of_bad_inputs(tmp_path: Path, silent_port: int, busy_port: int) -> None:
    """The failures new users met, each one line with its exit code."""
    cases: list[tuple[str, list[str], int, list[str]]] = [
        ("flowrouter", ["status", "--control", f"127.0.0.1:{silent_port}", "--timeout", "0.5"],
         1, ["did not answer"]),
        ("flowrouter", ["status", "--control", "127.0.0.1:notaport"], 2, ["port"]),
        ("flowrouter", ["run", "--name", "r1", "--peer", "r2@127.0.0.1:7002"], 2,
         ["--peer", "NAME=HOST:PORT"]),
        # (a daemon logs at INFO on stderr; --log-level error leaves just the error)
        ("flowrouter", ["--log-level", "error", "run", "--name", "r1", "--listen",
                        f"127.0.0.1:{busy_port}"], 1,
         ["r1", "in use"]),
        ("flowrouter", ["check-config", str(tmp_path / "missing.toml")], 2, ["missing.toml"]),
        ("flowrouter", ["run"], 2, ["--name"]),
        ("flowrouter", ["up", str(tmp_path / "nope.toml")], 2, ["nope.toml"]),
        ("flowls", ["--log-level", "error", "run", "--name", "m", "--lsid", "0x10", "--listen",
                    f"127.0.0.1:{busy_port}"], 1, ["m", "in use"]),
        ("flowls", ["flows", "--control", "127.0.0.1:1", "--creator", "xyz"], 2,
         ["--creator", "xyz", "hexadecimal"]),
        ("flowls", ["lookup", "0x10", "--control", "127.0.0.1:1"], 1, ["127.0.0.1:1"]),
        ("flowcat", ["create", "--router", "127.0.0.1:1"], 1, ["127.0.0.1:1"]),
        ("flowcat", ["create", "--lsid", "big"], 2, ["--lsid", "big"]),
        ("flowdir", ["lookup", "x", "--router", "127.0.0.1:1"], 2, ["127.0.0.1:1"]),
        ("flowtrace", ["validate", str(tmp_path / "none*.jsonl")], 2, []),
    ]
    failures = []
    for script, args, code, words in cases:
        proc = run(script, *args)
        try:
            assert_one_line(proc, code, *words)
        except AssertionError as exc:
            failures.append(f"{script} {' '.join(args)}: {exc}")
    assert not failures, "\n".join(failures)


def test_broken_pipe_is_silent(chatty_control: int) -> None:
    import shlex

    cmd = shlex.join(command("flowrouter", "status", "--control",
                             f"127.0.0.1:{chatty_control}"))
    proc = subprocess.run(["sh", "-c", f"{cmd} | head -1"], capture_output=True, text=True,
                          env=env(), cwd=ROOT, timeout=60)
    assert proc.stdout.startswith("router fake"), proc
    assert proc.stderr == "", proc.stderr


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_in_sim_exits_130_quietly() -> None:
    proc = subprocess.Popen(command("flowrouter", "sim", "topologies/two-site.toml",
                                    "--duration", "100000"),
                            env=env(), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Interrupt once it is past its imports and busy simulating (a long run: minutes of CPU).
    while proc.poll() is None and _cpu_seconds(proc.pid) < 1.5:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err[-2000:])
    assert err == "" and out == "", err[-2000:]


@pytest.mark.parametrize("when", ["start-up", "running"])
def test_ctrl_c_in_up_stops_the_routers_quietly(tmp_path: Path, when: str) -> None:
    base = free_port() // 10 * 10
    proc = subprocess.Popen(command("flowrouter", "up", "topologies/two-site.toml",
                                    "--workdir", str(tmp_path), "--base-port", str(base),
                                    "--duration", "60"),
                            env=env(), cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    if when == "running":
        lines = []
        while not any("up:" in x for x in lines) and len(lines) < 50:  # past start-up
            lines.append(proc.stdout.readline())
        assert "up:" in lines[-1], lines
    else:  # once the first router has written its config, before the overlay is up
        for _ in range(600):
            if list(tmp_path.glob("*.toml")):
                break
            time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "Unknown child" not in err, err
    assert err.strip() == "", err
    import re

    seconds = re.search(r"topology two-site, scenario -, ([0-9.]+) s", out)
    assert seconds is not None, out
    assert float(seconds.group(1)) < 60, "the summary says how long it really ran"
    if when == "running":  # router logs are kept at INFO in the workdir
        assert any("running" in p.read_text() for p in tmp_path.glob("*.log"))
