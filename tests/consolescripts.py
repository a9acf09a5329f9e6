"""The console scripts of pyproject.toml as commands on a PATH, for tests that run what a
user types (README blocks, pipes into ``head``, Ctrl-C).

The checkout is not installed: each shim runs its entry point with this interpreter, the way
the wrapper pip writes does (``sys.exit(main())``), importing the checkout through the
PYTHONPATH the caller passes.
"""

from __future__ import annotations

import os
import shlex
import sys
import tomllib
from pathlib import Path

from .checkout import PYTHONPATH, ROOT

#: name -> "module:function", as [project.scripts] declares them
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "scripts"]


def install_shims(bin_dir: Path) -> Path:
    """Write one executable per console script into *bin_dir*; returns *bin_dir*."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, target in SCRIPTS.items():
        module, func = target.split(":")
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "
                        f"'import sys; sys.argv[0] = \"{name}\"; from {module} import {func}; "
                        f"sys.exit({func}())' \"$@\"\n")
        path.chmod(0o755)
    return bin_dir


def script_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell with the shims first on PATH."""
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": PYTHONPATH, **extra}
