"""The multi-host guide's example configs are valid (check-config passes on each)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flowrouter.tools.cli import main

DEPLOY = Path(__file__).resolve().parent.parent / "topologies" / "deploy"


@pytest.mark.parametrize("name", sorted(p.name for p in DEPLOY.glob("*.toml")))
def test_example_site_config_passes_check_config(tmp_path: Path, name: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(DEPLOY / name, tmp_path / name)
    # the configs name a key file next to them, made as the guide says
    assert main(["keygen", "link", "--id", "site-2026", "--out", str(tmp_path / "site.key")]) == 0
    assert main(["check-config", str(tmp_path / name)]) == 0, capsys.readouterr().err
    assert "OK: router" in capsys.readouterr().out


def test_the_guide_has_a_systemd_unit_that_checks_the_config() -> None:
    unit = (DEPLOY / "flowrouter.service").read_text()
    assert "ExecStartPre=/usr/local/bin/flowrouter check-config" in unit
    assert "RestartPreventExitStatus=2" in unit
