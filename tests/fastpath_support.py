"""Test support for the fast path: the compiled engine, built for the test session if needed.

``.ci/run`` builds the extension in place, so the normal run imports it directly. In a
checkout where nobody built it, :func:`native_module` compiles it into a temporary directory
once per session (a few seconds) so the equivalence tests still hold the C code to the
Python twin; without a C compiler it returns None and those tests skip with the reason.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
_cache: list[ModuleType | None] = []
_why: list[str] = []


def compiler_present() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


def native_module() -> ModuleType | None:
    """The compiled ``flowrouter.core._fastpath`` (imported, or built now), or None."""
    if _cache:
        return _cache[0]
    mod: ModuleType | None = None
    try:
        from flowrouter.core import _fastpath  # type: ignore[attr-defined]
        mod = _fastpath
    except ImportError:
        if compiler_present():
            mod = _build()
        else:
            _why.append("no C compiler on this machine")
    _cache.append(mod)
    return mod


def why_not() -> str:
    return _why[0] if _why else "the compiled engine is not available"


def _build() -> ModuleType | None:
    out = Path(tempfile.mkdtemp(prefix="flownet-fastpath-build-"))
    proc = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_ext",
         "--build-lib", str(out / "lib"), "--build-temp", str(out / "tmp")],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    found = list((out / "lib").rglob("_fastpath*.so")) + list((out / "lib").rglob(
        "_fastpath*.pyd"))
    if proc.returncode != 0 or not found:
        _why.append(f"building the extension failed: {proc.stderr.strip()[-500:]}")
        return None
    spec = importlib.util.spec_from_file_location("flowrouter.core._fastpath", found[0])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # the router's engine_choice() imports it by name: the session's routers use it too
    sys.modules["flowrouter.core._fastpath"] = mod
    return mod


def use_engine(engine: str, monkeypatch: Any) -> None:
    """Run the test on *engine*: ``native`` (the compiled one; skipped where it cannot be
    had), or a ``FLOWNET_NATIVE`` value (``twin``, ``0``)."""
    import pytest

    if engine == "native":
        if native_module() is None:
            pytest.skip("the compiled engine is not available")
        monkeypatch.delenv("FLOWNET_NATIVE", raising=False)
    else:
        monkeypatch.setenv("FLOWNET_NATIVE", engine)
