"""Man pages and shell completion for every flownet console script, generated from the
commands' own argument parsers, so they never drift from ``--help``.

    python3 docs/cli_reference.py --out DIR

writes, for each console script of pyproject.toml (``flowrouter``, ``flowcat``, ...),
``DIR/man/man1/NAME.1`` (argparse-manpage), ``DIR/completion/bash/NAME`` and
``DIR/completion/zsh/_NAME`` (shtab). ``--out ~/.local/share`` puts the man pages where
``man`` looks; source the bash file or put it in ``~/.local/share/bash-completion/
completions/``. Every console-script module has a ``build_parser()`` beside its ``main``;
the test suite (tests/test_cli_reference.py) generates all of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _checkout_on_path() -> None:
    for folder in ("location_service", "directory", "apps", "."):
        if str(ROOT / folder) not in sys.path:
            sys.path.insert(0, str(ROOT / folder))


def console_scripts() -> dict[str, str]:
    """name -> "module:function", as pyproject.toml declares them."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(data["project"]["scripts"])


def parser_of(target: str) -> argparse.ArgumentParser:
    """The parser of a console script ``module:main``: the module's ``build_parser()``."""
    module = importlib.import_module(target.split(":")[0])
    parser: argparse.ArgumentParser = module.build_parser()
    return parser


def man_page(name: str, parser: argparse.ArgumentParser, version: str) -> str:
    from argparse_manpage.manpage import Manpage

    page: Any = Manpage(parser)
    page.source = f"flownet {version}"
    page.manual = "flownet manual"
    page.description = (parser.description or "").split("\n")[0].rstrip(".")
    # a text line that starts with ' would be read as a request: escape it (\&)
    return "\n".join("\\&" + line if line.startswith("'") else line
                     for line in str(page).split("\n"))


def completion(parser: argparse.ArgumentParser, shell: str) -> str:
    import shtab

    text: str = shtab.complete(parser, shell=shell)
    return text


def generate(out: Path) -> list[Path]:
    """Write every page and completion file under *out*; returns the files written."""
    _checkout_on_path()
    from flowrouter import __version__

    written = []
    for name, target in console_scripts().items():
        parser = parser_of(target)
        parser.prog = name
        files = {out / "man" / "man1" / f"{name}.1": man_page(name, parser, __version__),
                 out / "completion" / "bash" / name: completion(parser, "bash"),
                 out / "completion" / "zsh" / f"_{name}": completion(parser, "zsh")}
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="where man/ and completion/ go")
    args = p.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
