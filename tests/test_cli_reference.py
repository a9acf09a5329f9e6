"""Man pages and shell completion are generated from the argument parsers of every console
script (docs/cli_reference.py), and say what the parsers accept."""

from __future__ import annotations

import argparse
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

from .checkout import ROOT
from .consolescripts import SCRIPTS

GENERATOR = runpy.run_path(str(ROOT / "docs" / "cli_reference.py"))


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction)  # noqa: SLF001
            for name in a.choices]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cliref")
    written = GENERATOR["generate"](out)
    assert len(written) == 3 * len(SCRIPTS)
    return out


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_man_page_and_completion_for_every_console_script(out: Path, name: str) -> None:
    parser = GENERATOR["parser_of"](SCRIPTS[name])
    subs = _subcommands(parser)
    page = (out / "man" / "man1" / f"{name}.1").read_text()
    assert page.startswith(f'.TH {name.upper()} "1"')
    assert f"{name} \\- " in page  # NAME line with a description
    for sub in subs:
        assert sub.replace("-", "\\-") in page, f"{name} {sub} missing from the man page"
    if shutil.which("groff"):
        r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z",
                            str(out / "man" / "man1" / f"{name}.1")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stderr == "", r.stderr
    bash = out / "completion" / "bash" / name
    script = (f"source {bash}; COMP_WORDS=({name} ''); COMP_CWORD=1; "
              f"COMP_LINE='{name} '; COMP_POINT={len(name) + 1}; "
              f"_shtab_{name.replace('-', '_')}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    offered = set(r.stdout.split())
    assert set(subs) <= offered, f"{name}: completion offers {sorted(offered)}"
    assert (out / "completion" / "zsh" / f"_{name}").read_text().startswith("#compdef")
