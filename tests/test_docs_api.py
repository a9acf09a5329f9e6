"""The flowlib API reference (docs/api/) builds from the docstrings with warnings as errors,
and covers what a library user reaches for first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .checkout import ROOT


def test_api_reference_builds_without_warnings(tmp_path: Path) -> None:
    out = tmp_path / "html"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                           "html", "-d", str(tmp_path / "doctrees"), str(ROOT / "docs" / "api"),
                           str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    client = (out / "client.html").read_text()
    for name in ("flowlib.connect", "FlowClient.listen", "FlowClient.send",
                 "FlowClient.watch_members", "ClientOptions"):
        assert name in client, name
    assert "JoinRefused" in (out / "errors.html").read_text()
    assert "flow_connect" in (out / "sync.html").read_text()
