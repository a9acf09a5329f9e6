"""What a user sees when a command is refused, interrupted or cut off (issue 28).

Every documented refusal is one line and the exit code the README gives (2 usage or
configuration, 1 runtime), Ctrl-C is 130 without a traceback, and a reader that goes away
(``| head``) ends a command silently with 141. The commands run as a user runs them: the
console scripts on PATH (tests/consolescripts.py), in processes of their own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowrouter import console

from .consolescripts import install_shims, script_env
from .ports import free_port_block


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    bin_dir = install_shims(tmp_path_factory.mktemp("bin"))
    return script_env(bin_dir, FLOWNET_STATE_DIR=str(tmp_path_factory.mktemp("state")))


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 60
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    assert "CancelledError" not in err and "Exception ignored" not in err, err


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


class _Procs:
    """Background commands of one test, stopped (SIGINT, then SIGKILL) at its end."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd, self.procs = env, cwd, []  # type: ignore[var-annotated]

    def start(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with (self.cwd / log).open("wb") as fh:
            p = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdout=fh,
                                 stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def procs(env: dict[str, str], tmp_path: Path) -> Iterator[_Procs]:
    ps = _Procs(env, tmp_path)
    try:
        yield ps
    finally:
        ps.stop()


def _router(procs: _Procs, port: int, *extra: str) -> str:
    procs.start(["flowrouter", "run", "--name", "r1", "--listen", f"127.0.0.1:{port}",
                 "--core-lsid", "0x10", "--http", "off", *extra], "router.log")
    _wait_port(port)
    return f"127.0.0.1:{port}"


# ---------------------------------------------------------------- configuration refusals
@pytest.mark.parametrize("command", [["check-config"], ["run", "--config"]])
def test_a_config_file_that_is_not_utf8_is_a_one_line_usage_error(
        env: dict[str, str], tmp_path: Path, command: list[str]) -> None:
    cfg = tmp_path / "r1.toml"
    cfg.write_bytes(b'[router]\nname = "r\xe9"\nlisten = "127.0.0.1:0"\n')
    proc = _run(["flowrouter", *command, str(cfg)], env, tmp_path)
    assert proc.returncode == console.EXIT_USAGE, proc.stderr
    assert proc.stderr.strip() == (f"flowrouter: {cfg}: not UTF-8 text "
                                   "(invalid continuation byte at byte 18)")


def test_keys_the_router_ignores_are_warned_about_by_name(env: dict[str, str],
                                                           tmp_path: Path) -> None:
    """[gc] ping_after / delete_after are accepted (old configs still start) but change
    nothing: check-config (and the router's log) say so, naming the key and what to use."""
    cfg = tmp_path / "r1.toml"
    cfg.write_text('[router]\nname = "r1"\n[gc]\nping_after = 3\ndelete_after = 6\n')
    proc = _run(["flowrouter", "check-config", str(cfg)], env, tmp_path)
    assert proc.returncode == 0 and "OK: router r1" in proc.stdout
    assert "[gc] ping_after is ignored" in proc.stderr
    assert "[gc] delete_after is ignored" in proc.stderr
    assert "liveness_interval" in proc.stderr
    cfg.write_text('[router]\nname = "r1"\n[gc]\nliveness_interval = 1.0\n')
    proc = _run(["flowrouter", "check-config", str(cfg)], env, tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""


def test_an_error_that_knows_its_exit_code_is_one_line() -> None:
    """flowlib's errors carry ``exit_code``: the console wrapper prints them as one line."""
    import flowlib

    def refused(argv: object) -> int:
        raise flowlib.JoinRefused(flowlib.JoinStatus.CAPABILITY, "capability missing")

    assert console.run("prog", refused) == console.EXIT_RUNTIME


def test_flowchat_server_refused_by_a_policy_says_so_in_one_line(
        env: dict[str, str], tmp_path: Path, procs: _Procs) -> None:
    port = free_port_block(1)
    router = _router(procs, port)
    out = _run(["flowrouter", "keygen", "creator", "--out", "creator.key"], env, tmp_path)
    creator = out.stdout.split()[-1]
    flow = f"{creator}:10:43"
    assert _run(["flowcat", "issue-policy", "--creator-key", "creator.key", "-o",
                 "room.policy", flow], env, tmp_path).returncode == 0
    proc = _run(["flowchat", "server", "--site", "metropol", "--sites", "metropol,kingdom",
                 "--router", router, "--flow", flow, "--policy", "room.policy"], env,
                tmp_path)
    assert proc.returncode == console.EXIT_RUNTIME, proc.stderr
    _no_traceback(proc.stderr)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("flowchat: join") and "refused" in last, proc.stderr


# ---------------------------------------------------------------- stopping and Ctrl-C
def test_stopping_a_router_with_open_http_connections_is_quiet(
        env: dict[str, str], tmp_path: Path) -> None:
    port = free_port_block(2)
    log = tmp_path / "router.log"
    with log.open("wb") as fh:
        router = subprocess.Popen(
            ["flowrouter", "run", "--name", "r1", "--listen", f"127.0.0.1:{port}",
             "--http", f"127.0.0.1:{port + 1}"], env=env, cwd=tmp_path, stdout=fh,
            stderr=subprocess.STDOUT)
    try:
        _wait_port(port + 1)
        idle = [socket.create_connection(("127.0.0.1", port + 1)) for _ in range(20)]
        half = socket.create_connection(("127.0.0.1", port + 1))
        half.sendall(b"GET /status HTTP/1.1\r\n")  # a request head that never ends
        time.sleep(0.5)
        router.send_signal(signal.SIGINT)
        assert router.wait(30) == console.EXIT_INTERRUPTED
    finally:
        if router.poll() is None:
            router.kill()
        for s in [*idle, half]:
            s.close()
    text = log.read_text()
    _no_traceback(text)
    assert "router r1 stopped" in text


def _flowtrace_interrupted(env: dict[str, str], tmp_path: Path, after: str) -> tuple[int, str]:
    traces = tmp_path / "traces"
    sim = _run(["flowrouter", "sim", str(Path(__file__).resolve().parent.parent / "topologies"
                                         / "two-site.toml"), "--duration", "30",
                "--router-traces", str(traces)], env, tmp_path, timeout=120)
    assert sim.returncode == 0, sim.stderr
    proc = subprocess.Popen(["flowtrace", "analyze", str(traces), "--out",
                             str(tmp_path / "report"), "--progress", "--engine", "spark"],
                            env=env, cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:  # the progress lines, until the moment to press Ctrl-C
            seen.append(line)
            if after in line:
                break
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        rest = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, "".join(seen) + rest


@pytest.mark.parametrize("after", ["starting Spark", "stage 1/10"])
def test_ctrl_c_during_flowtrace_analyze_exits_130_without_tracebacks(
        env: dict[str, str], tmp_path: Path, after: str) -> None:
    """While the JVM starts (held until it is up, then stopped: no JVM left behind) and while
    the job runs (py4j reports every interrupted gateway call with a traceback)."""
    pytest.importorskip("pyspark")
    code, err = _flowtrace_interrupted(env, tmp_path, after)
    assert code == console.EXIT_INTERRUPTED, err
    _no_traceback(err)
    assert "ERROR:" not in err and "py4j" not in err, err
    assert err.rstrip().endswith("flowtrace: interrupted")


# ---------------------------------------------------------------- readers that go away
def _into_head(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 180
               ) -> tuple[int, str]:
    """``argv | head -1``: read one line, close the pipe, wait for the command."""
    err_path = cwd / f"{argv[0]}-{argv[1]}.err"
    with err_path.open("w") as err:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                stderr=err)
        assert proc.stdout is not None
        try:
            first = proc.stdout.readline()
            assert first, "the command printed nothing"
            proc.stdout.close()
            code = proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return code, err_path.read_text()


def test_py4j_logger_records_stay_off_the_terminal(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """What made the Ctrl-C test above fail once: py4j reports the gateway call a Ctrl-C cut
    short on its own logger (``py4j.clientserver``), whose records reach the root's handlers
    without passing the root logger's filters. After ``quiet_py4j`` they stay off stderr;
    other loggers still print."""
    import logging

    from flowtrace.session import quiet_py4j

    monkeypatch.delenv("FLOWNET_TRACEBACK", raising=False)
    root = logging.getLogger()
    handler = logging.StreamHandler()  # stderr, as basicConfig would give
    root.addHandler(handler)
    py4j = logging.getLogger("py4j")
    monkeypatch.setattr(py4j, "level", py4j.level)
    monkeypatch.setattr(py4j, "propagate", py4j.propagate)
    try:
        quiet_py4j()
        logging.getLogger("py4j.clientserver").error("Exception while shutting down")
        logging.getLogger("flowtrace.test").error("still shown")
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    assert "shutting down" not in err
    assert "still shown" in err


def test_flowchat_experiment_into_head(env: dict[str, str], tmp_path: Path) -> None:
    code, err = _into_head(["flowchat", "experiment", "--only", "A1,A2,L1,L2", "--duration",
                            "30", "--no-plots", "--out", str(tmp_path / "out")], env, tmp_path)
    assert (code, err) == (console.EXIT_PIPE, "")


def test_flowvideo_demo_into_head(env: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    code, err = _into_head(["flowvideo", "demo", "--duration", "6"], env, tmp_path)
    assert code == console.EXIT_PIPE, err
    _no_traceback(err)
    assert "Broken pipe" not in err and "error" not in err, err


def test_flowvideo_watch_into_head(env: dict[str, str], tmp_path: Path,
                                   procs: _Procs) -> None:
    pytest.importorskip("PIL")
    router = _router(procs, free_port_block(1))
    code, err = _into_head(["flowvideo", "watch", "--router", router, "--flow",
                            "3b7a33c72ae2f997:10:41", "--resolution", "160x120"], env,
                           tmp_path, timeout=30)
    assert code == console.EXIT_PIPE, err
    _no_traceback(err)
    assert "Broken pipe" not in err, err


def test_flowchat_bot_into_head(env: dict[str, str], tmp_path: Path, procs: _Procs) -> None:
    port = free_port_block(2)
    router = _router(procs, port)
    procs.start(["flowchat", "server", "--site", "metropol", "--sites", "metropol",
                 "--router", router, "--room", "ops", "--listen",
                 f"127.0.0.1:{port + 1}"], "server.log")
    _wait_port(port + 1)
    code, err = _into_head(["flowchat", "bot", "--server", f"127.0.0.1:{port + 1}",
                            "--rate", "20", "--duration", "2"], env, tmp_path, timeout=60)
    assert code == console.EXIT_PIPE, err
    _no_traceback(err)
    assert "Broken pipe" not in err, err



# ---------------------------------------------------------------- Ctrl-C anywhere
_CTRL_C = {
    "flowcat listen": ["flowcat", "listen", "--router", "{router}", "3b7a33c72ae2f997:10:41"],
    "flowdir serve": ["flowdir", "--router", "{router}", "serve"],
    "flowchat server": ["flowchat", "server", "--site", "a", "--sites", "a", "--router",
                        "{router}", "--room", "ops", "--no-directory"],
    "flowchat experiment": ["flowchat", "experiment", "--no-plots", "--out", "out"],
    "flowvideo watch": ["flowvideo", "watch", "--router", "{router}", "--flow",
                        "3b7a33c72ae2f997:10:41", "--resolution", "160x120"],
    "flowls run": ["flowls", "run", "--name", "ls9", "--lsid", "0x20", "--listen",
                   "127.0.0.1:0"],
    "flowrouter sim": ["flowrouter", "sim", "topologies/linear-20.toml", "--duration",
                       "100000"],
}


#: what a command prints once it runs (the others are given a few seconds)
_READY = {"flowchat server": "clients connect to"}


@pytest.mark.parametrize("name", sorted(_CTRL_C))
def test_ctrl_c_exits_130_without_a_traceback(env: dict[str, str], tmp_path: Path,
                                              procs: _Procs, name: str) -> None:
    if name.startswith("flowvideo"):
        pytest.importorskip("PIL")
    router = _router(procs, free_port_block(1))
    argv = [a.replace("{router}", router) for a in _CTRL_C[name]]
    err_path, out_path = tmp_path / "cmd.stderr", tmp_path / "cmd.stdout"
    with err_path.open("w") as err, out_path.open("w") as out:
        proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=out,
                                stderr=err, start_new_session=True)
    try:
        # running: connected, joined, simulating (no event to await from outside: a bounded
        # poll for the line a command prints once it runs, else a few seconds)
        ready = _READY.get(name)
        deadline = time.monotonic() + (60 if ready else 4)
        while time.monotonic() < deadline and proc.poll() is None:
            if ready and ready in out_path.read_text():
                break
            time.sleep(0.1)
        assert proc.poll() is None, err_path.read_text()
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err_path.read_text()
    assert code == console.EXIT_INTERRUPTED, text
    _no_traceback(text)
