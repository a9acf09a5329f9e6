"""The deployment guide (topologies/deploy/) works as written.

* its example configs pass ``flowrouter check-config`` without a warning;
* its systemd steps run, in a sandbox (the root paths moved under a temporary directory;
  the user, owner and systemctl steps recorded, since the tests do not run as a system's
  administrator), and leave what the unit needs: the user it runs as, a config and a key
  that user can read (the key readable by nobody else), the unit installed;
* the unit those steps install passes ``systemd-analyze verify`` (installed by .ci/install),
  has ``LimitNOFILE``, and writes only paths systemd creates for it;
* the Grafana dashboard queries only metrics a live router's /metrics has.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import stat
import subprocess
import urllib.request
from pathlib import Path

import pytest

from flowrouter.tools.cli import main

from .consolescripts import install_shims, script_env
from .logready import LoggedProcess
from .ports import free_port_block

DEPLOY = Path(__file__).resolve().parent.parent / "topologies" / "deploy"
GUIDE = (DEPLOY / "README.md").read_text()
ROOT_BLOCK = re.compile(r"<!-- runnable: root[^>]*-->\n```sh\n(?P<body>.*?)```", re.S)


@pytest.mark.parametrize("name", sorted(p.name for p in DEPLOY.glob("*.toml")))
def test_example_site_config_passes_check_config(tmp_path: Path, name: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(DEPLOY / name, tmp_path / name)
    # the configs name a key file next to them, made as the guide says
    assert main(["keygen", "link", "--id", "site-2026", "--out", str(tmp_path / "site.key")]) == 0
    capsys.readouterr()
    assert main(["check-config", str(tmp_path / name)]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert "OK: router" in out
    assert "ignored" not in err and "warning" not in err.lower(), err


def _unit(text: str) -> dict[str, list[str]]:
    """The unit's settings, key -> values (a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _verify(unit_text: str, flowrouter: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of the unit, its flowrouter path pointed at *flowrouter*
    (verify checks that the command exists)."""
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze is missing: .ci/install installs it (package systemd)"
    rendered = tmp_path / "verify" / "flowrouter.service"
    rendered.parent.mkdir(exist_ok=True)
    rendered.write_text(unit_text.replace("/opt/flownet/bin/flowrouter", str(flowrouter)))
    return subprocess.run([exe, "verify", "--man=no", str(rendered)], capture_output=True,
                          text=True, timeout=60)


#: the administrator's commands, recorded instead of run (bash functions ahead of the steps)
SANDBOX_PRELUDE = r'''
set -euo pipefail
record() { printf '%s\n' "$*" >> "$CALLS"; }
useradd() { record useradd "$@"; }
chown() { record chown "$@"; }
systemctl() { record systemctl "$@"; }
python3() {  # python3 -m venv DIR: a venv whose bin/ has the console scripts and a pip
    record python3 "$@"
    local dir="${@: -1}"
    mkdir -p "$dir/bin"
    cp "$SHIMS"/* "$dir/bin/"
    printf '#!/bin/sh\necho "pip $*" >> "%s"\n' "$CALLS" > "$dir/bin/pip"
    chmod +x "$dir/bin/pip"
}
install() {  # the owner and group are recorded, the rest done
    local args=() owner="" group="" target=""
    while [ $# -gt 0 ]; do
        case "$1" in
            -o) owner="$2"; shift 2 ;;
            -g) group="$2"; shift 2 ;;
            *) args+=("$1"); target="$1"; shift ;;
        esac
    done
    record install "$owner:$group" "$target"
    command install "${args[@]}"
}
'''


def test_the_guides_systemd_steps_leave_what_the_unit_needs(tmp_path: Path) -> None:
    (block,) = [m.group("body") for m in ROOT_BLOCK.finditer(GUIDE)]
    root = tmp_path / "root"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    work = tmp_path / "deploy"  # the guide's folder, where the steps are run
    shutil.copytree(DEPLOY, work)
    shims = install_shims(tmp_path / "shims")
    calls = tmp_path / "calls"
    calls.touch()
    script = (block.replace("sudo ", "").replace("/opt/flownet", f"{root}/opt/flownet")
              .replace("/etc/", f"{root}/etc/"))
    proc = subprocess.run(["bash", "-c", SANDBOX_PRELUDE + script], cwd=work,
                          env=script_env(shims, CALLS=str(calls), SHIMS=str(shims),
                                         FLOWNET_STATE_DIR=str(tmp_path / "state")),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and "ignored" not in proc.stderr, proc.stderr
    assert "OK: router van-1" in proc.stdout
    log = calls.read_text().splitlines()

    installed = root / "etc" / "systemd" / "system" / "flowrouter.service"
    unit = _unit(installed.read_text())
    user, group = unit["User"][0], unit["Group"][0]
    # the user the unit runs as is created, with its own group
    (useradd,) = [c for c in log if c.startswith("useradd ")]
    assert useradd.split()[-1] == user and "--system" in useradd and group == user
    assert "--user-group" in useradd
    # flownet is installed where the unit runs it from
    exec_start = unit["ExecStart"][0].split()
    venv_bin = Path(exec_start[0]).parent
    assert (root / venv_bin.relative_to("/") / "flowrouter").is_file()
    assert any(c.startswith("pip install") for c in log)
    # the config the unit names exists, readable by the service's group, written by root only
    config = exec_start[exec_start.index("--config") + 1]
    assert unit["ExecStartPre"][0].endswith(f"check-config {config}")
    cfg_path = root / Path(config).relative_to("/")
    assert f"install root:{group} {cfg_path.parent}" in log
    assert f"install root:{group} {cfg_path}" in log
    assert stat.S_IMODE(cfg_path.parent.stat().st_mode) == 0o750
    assert stat.S_IMODE(cfg_path.stat().st_mode) == 0o640
    # the key the config names belongs to the service user and nobody else reads it
    key = cfg_path.parent / "site.key"
    assert f"chown {user}:{group} {key}" in log
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert "file:site.key" in cfg_path.read_text()
    # the unit is enabled and started
    assert "systemctl daemon-reload" in log and "systemctl enable --now flowrouter" in log

    # what the unit may write exists: systemd makes StateDirectory / LogsDirectory for it
    made = {f"/var/lib/{d}" for d in unit.get("StateDirectory", [])} | {
        f"/var/log/{d}" for d in unit.get("LogsDirectory", [])}
    for paths in unit.get("ReadWritePaths", []):
        for path in paths.split():
            assert path.lstrip("-") in made, f"ReadWritePaths {path}: nothing creates it"
    state = [e.split("=", 1)[1] for e in unit.get("Environment", [])
             if e.startswith("FLOWNET_STATE_DIR=")]
    assert state and state[0] in made
    assert int(unit["LimitNOFILE"][0]) >= 4096
    assert unit["RestartPreventExitStatus"] == ["2"]
    assert unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # docs/operations.md: reload

    checked = _verify(installed.read_text(), shims / "flowrouter", tmp_path)
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked.stderr


def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above would see a mistake: an unknown key is a complaint."""
    broken = (DEPLOY / "flowrouter.service").read_text().replace("LimitNOFILE", "LimitNOFILES")
    checked = _verify(broken, install_shims(tmp_path / "shims") / "flowrouter", tmp_path)
    assert "LimitNOFILES" in checked.stderr


def test_grafana_dashboard_queries_only_metrics_a_live_router_has(tmp_path: Path) -> None:
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    wanted = {m for e in exprs for m in re.findall(r"\bflownet_[a-z_]+\b", e)}
    assert len(exprs) >= 10 and len(wanted) >= 10
    # a router with a configured peer (down), so every family has something to show
    port = free_port_block(2)
    env = script_env(install_shims(tmp_path / "bin"), FLOWNET_STATE_DIR=str(tmp_path / "s"))
    router = LoggedProcess(
        ["flowrouter", "-v", "run", "--name", "r1", "--listen", f"127.0.0.1:{port}",
         "--http", f"127.0.0.1:{port + 1}", "--peer", "r2=127.0.0.1:9"], env, tmp_path,
        tmp_path / "r.log")
    try:
        if not router.wait_ready():  # the log says it listens, HTTP included
            pytest.fail(router.text())
        with urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        router.proc.send_signal(signal.SIGINT)
        router.proc.wait(30)
    have = set(re.findall(r"^# TYPE (\S+)", text, re.M)) | set(
        re.findall(r"^(flownet_[a-z_]+)[{ ]", text, re.M))
    assert wanted <= have, f"not in /metrics: {sorted(wanted - have)}"
    assert re.search(r'^flownet_router_peer_up\{.*peer="r2"', text, re.M)
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
