"""Shared fixtures: every test keeps flow-creator state in its own directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .checkout import with_checkout

# Every process a test starts (routers, flowdir serve, the console scripts as python -m)
# imports this checkout, like the tests themselves.
os.environ["PYTHONPATH"] = with_checkout(os.environ.get("PYTHONPATH"))


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every LocalIdAllocator in the test's own directory (never the user's state)."""
    state = tmp_path / "state"
    monkeypatch.setenv("FLOWNET_STATE_DIR", str(state))
    return state
