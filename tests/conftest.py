"""Shared fixtures: every test keeps flow-creator state in its own directory."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every LocalIdAllocator in the test's own directory (never the user's state)."""
    state = tmp_path / "state"
    monkeypatch.setenv("FLOWNET_STATE_DIR", str(state))
    return state
