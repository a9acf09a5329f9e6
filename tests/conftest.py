"""Shared fixtures: every test keeps flow-creator state in its own directory; the flowtrace
tests share one SparkSession (``spark``, session-scoped: local[2] bound to 127.0.0.1, no UI, 2
shuffle partitions, no code generation and no adaptive execution: the data is tiny, so
compiling and re-planning cost more than they save)."""

from __future__ import annotations

import os
import shutil
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


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark", reason="the Spark job needs pyspark (pip install pyspark)")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("the Spark job needs a Java runtime (17+)")

    from flowtrace.session import build_session

    # the job's own session builder (loopback, no UI, quiet start), with test settings
    session = build_session("local[2]", app_name="flowtrace-tests", driver_memory="1g",
                            shuffle_partitions=2, conf=[
                                ("spark.default.parallelism", "2"),
                                ("spark.sql.adaptive.enabled", "false"),
                                ("spark.sql.codegen.wholeStage", "false"),
                                ("spark.sql.codegen.factoryMode", "NO_CODEGEN")])
    yield session
    session.stop()
