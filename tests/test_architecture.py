"""The architecture holds: import contracts (lint-imports) and small modules.

README's Development section draws the layers; these tests keep the tree honest about them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: the top-level folders holding the source (each import package lives in one of them)
FOLDERS = ("flowrouter", "flowlib", "apps", "directory", "location_service")
#: every import package `pip install .` puts into site-packages: each with the project's prefix
INSTALLED = {"flowrouter", "flowlib", "flowchat", "flowvideo", "flowtrace", "flowdir", "flowls",
             "flownet"}
# "About 600 lines": a little slack so that one docstring does not force a split.
MAX_LINES = 650
#: the folders whose modules the line limit covers: the source, and the benchmarks and
#: examples users read and run
SIZED = (*FOLDERS, "benchmarks", "examples")


def test_import_contracts_hold() -> None:
    """Every contract in pyproject.toml (layers, no I/O below net, flowlib speaks only wire)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command;"
         " sys.exit(lint_imports_command())", "--no-cache"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("folder", SIZED)
def test_no_module_is_a_lump(folder: str) -> None:
    too_big = []
    for path in sorted((REPO / folder).rglob("*.py")):
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > MAX_LINES:
            too_big.append(f"{path.relative_to(REPO)}: {lines} lines")
    assert not too_big, "split these by concern: " + "; ".join(too_big)


def test_each_package_says_what_it_holds() -> None:
    """Every package's ``__init__`` opens with a docstring a reader can start from."""
    silent = []
    for folder in FOLDERS:
        for init in sorted((REPO / folder).rglob("__init__.py")):
            text = init.read_text(encoding="utf-8").lstrip()
            if not text.startswith(('"""', 'r"""')):
                silent.append(str(init.relative_to(REPO)))
    assert not silent, "packages without a docstring: " + ", ".join(silent)


def test_every_installed_import_package_has_the_project_prefix() -> None:
    """Item 7 of issue 25: no generic top-level name (``apps``, ``directory``) is installed.
    What setuptools finds with pyproject's ``packages.find`` settings is exactly INSTALLED."""
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]
    top = {pkg.split(".")[0] for where in find["where"]
           for pkg in find_packages(str(REPO / where), include=find["include"])}
    assert top == INSTALLED
    assert not (REPO / "apps" / "__init__.py").exists()  # apps/ is a folder, not a package
