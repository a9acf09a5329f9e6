"""Every program in examples/ runs against a real local router and does what its docstring
says (exit 0, the line it promises)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .checkout import ROOT
from .consolescripts import install_shims, script_env
from .ports import free_port_block
from .test_user_path import _wait_port

EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))


def test_there_are_examples_of_each_style() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"publish_subscribe", "request_reply", "membership_watch", "heartbeat",
            "sync_client", "large_message"} <= names


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("router")
    env = script_env(install_shims(tmp / "bin"), FLOWNET_STATE_DIR=str(tmp / "state"))
    port = free_port_block(1)
    with (tmp / "router.log").open("wb") as log:
        proc = subprocess.Popen(["flowrouter", "run", "--name", "r1", "--listen",
                                 f"127.0.0.1:{port}", "--core-lsid", "0x10", "--http", "off"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_port(port)
        yield f"127.0.0.1:{port}", env
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(example: Path, router: tuple[str, dict[str, str]]) -> None:
    address, env = router
    doc = example.read_text().split('"""')[1]
    promised = re.search(r"prints ``(.+?)``", doc)
    assert promised, f"{example.name}: its docstring says what it prints"
    proc = subprocess.run([sys.executable, str(example), "--router", address], env=env,
                          capture_output=True, text=True, timeout=90, cwd=example.parent)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert promised.group(1) in proc.stdout, proc.stdout
    assert proc.stderr == ""
