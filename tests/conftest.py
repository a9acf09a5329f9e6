"""Shared fixtures: every test keeps flow-creator state in its own directory."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from .checkout import with_checkout

# Every process a test starts (routers, flowdir serve, the console scripts as python -m)
# imports this checkout, like the tests themselves.
os.environ["PYTHONPATH"] = with_checkout(os.environ.get("PYTHONPATH"))

# A suite started as a background job of a non-interactive shell (`.ci/run &`, nohup) gets
# SIGINT ignored, and every process it starts inherits that: the tests that press Ctrl-C on
# a console script would then see it run on. Python's own handler again: a handled signal
# is reset to the default in a child at exec, so the children get the default too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every LocalIdAllocator in the test's own directory (never the user's state)."""
    state = tmp_path / "state"
    monkeypatch.setenv("FLOWNET_STATE_DIR", str(state))
    return state
