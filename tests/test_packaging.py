"""What a plain ``pip install .`` puts in site-packages works without the checkout (issue 28).

The package is built into a wheel from a copy of the checkout and unpacked into a folder
that stands in for site-packages; commands then run from an unrelated directory with only
that folder on the path: the shipped topologies are found (``flowchat experiment``,
``flowrouter sim topologies/two-site.toml``), errors name what the user typed and never a
path inside the installed package, and the package data a library user and an operator
expect is there (``py.typed``, the dashboard, the deployment guide's files).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .checkout import ROOT

_SKIP = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.so",
                               ".*_cache", ".hypothesis", "out", "spark-warehouse")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's contents, unpacked (what pip would put in site-packages)."""
    work = tmp_path_factory.mktemp("pkg")
    src = work / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_SKIP)
    wheels = work / "wheels"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--quiet", "-w", str(wheels), str(src)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = wheels.glob("flownet-*.whl")
    out = work / "site-packages"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out)
    return out


def _run(site: Path, cwd: Path, script: str, *args: str
         ) -> subprocess.CompletedProcess[str]:
    """Console script *script* ("module:function") as pip's wrapper runs it, with only the
    unpacked package (and the interpreter's own site-packages, for the dependencies)."""
    module, func = script.split(":")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    env["FLOWNET_STATE_DIR"] = str(cwd / "state")
    code = (f"import sys; from {module} import {func}; "
            f"assert sys.modules['{module}'].__file__.startswith({str(site)!r}); "
            f"sys.exit({func}())")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_wheel_carries_the_package_data(site: Path) -> None:
    shipped = site / "flowrouter" / "testbed" / "topologies"
    # every file of the checkout's topologies/ (a new one, or a new folder, included)
    checkout = ROOT / "topologies"
    want = {p.relative_to(checkout) for p in checkout.rglob("*") if p.is_file()}
    assert want == {p.relative_to(shipped) for p in shipped.rglob("*") if p.is_file()}
    assert {"two-site.toml", "seed003-testbed.toml"} <= {str(p) for p in want}
    assert (shipped / "README.md").is_file()
    deploy = shipped / "deploy"
    assert (deploy / "flowrouter.service").is_file() and (deploy / "README.md").is_file()
    assert (deploy / "grafana-dashboard.json").is_file()
    assert (site / "flowlib" / "py.typed").is_file()
    assert (site / "flowrouter" / "net" / "dashboard.html").is_file()


def test_flowchat_experiment_runs_outside_a_checkout(site: Path, tmp_path: Path) -> None:
    proc = _run(site, tmp_path, "flowchat.cli:main", "experiment", "--only", "A1",
                "--duration", "20", "--no-plots", "--out", "results")
    assert proc.returncode == 0, proc.stderr
    assert "checks ok" in proc.stdout
    assert (tmp_path / "results" / "summary.md").is_file()


def test_readme_topology_paths_work_outside_a_checkout(site: Path, tmp_path: Path) -> None:
    proc = _run(site, tmp_path, "flownet.cli:main", "sim", "topologies/two-site.toml",
                "--list-scenarios")
    assert proc.returncode == 0, proc.stderr
    assert "wan-flap" in proc.stdout


def test_a_missing_topology_is_named_as_typed(site: Path, tmp_path: Path) -> None:
    proc = _run(site, tmp_path, "flownet.cli:main", "sim", "topologies/nope.toml")
    assert proc.returncode == 2, proc.stderr
    assert "topologies/nope.toml" in proc.stderr and str(site) not in proc.stderr
    proc = _run(site, tmp_path, "flowchat.cli:main", "experiment", "--only", "A1",
                "--duration", "20", "--no-plots", "--topology", "mine.toml")
    assert proc.returncode != 0 and "mine.toml" in proc.stderr
    assert str(site) not in proc.stderr and "Traceback" not in proc.stderr
