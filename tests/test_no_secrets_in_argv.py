"""No console script takes a secret as an option's value (issue 26): keys, tokens,
passwords and capabilities are named by a file or an environment variable, never written on
the command line, where every local user sees them in ``ps``.

The test walks every option of every subcommand of every console script listed in
``pyproject.toml`` (the parser each script builds, caught as it starts parsing), so a tool or
an option added later is held to the rule too.
"""

from __future__ import annotations

import argparse
import importlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "scripts"]
#: an option that may carry a secret, by its name
SECRET = re.compile(r"key|token|secret|passw|psk|credential|capabilit|cookie", re.I)
#: how its value must be spelt instead: a file, a path, or an environment variable
INDIRECT = re.compile(r"FILE|PATH|DIR|VAR", re.I)


class _Caught(BaseException):  # past the tools' own error handling
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _root_parser(target: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    module, _, func = target.partition(":")
    main = getattr(importlib.import_module(module), func)

    def catch(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        raise _Caught(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    with pytest.raises(_Caught) as caught:
        main(["--help"])
    return caught.value.parser


def _options(parser: argparse.ArgumentParser, path: str
             ) -> list[tuple[str, argparse.Action]]:
    out: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                out += _options(sub, f"{path} {name}")
        elif action.option_strings:
            out.append((path, action))
    return out


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_no_option_of_any_tool_takes_a_secret_itself(script: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    options = _options(_root_parser(SCRIPTS[script], monkeypatch), script)
    assert options, f"{script}: no options found"
    bad = []
    for where, action in options:
        if action.nargs == 0 or not any(SECRET.search(s) for s in action.option_strings):
            continue  # a flag, or not about a secret
        metavar = action.metavar if isinstance(action.metavar, str) else ""
        if not INDIRECT.search(metavar):
            bad.append(f"{where} {'/'.join(action.option_strings)} {metavar or action.dest}")
    assert not bad, f"options taking a secret as their value: {bad}"


LITERAL = "hex:" + "5a" * 32


@pytest.mark.parametrize("argv", [
    ["flowcat", "listen", "--router", "127.0.0.1:9", "--link-key", f"k:{LITERAL}", "1-10-1"],
    ["flowls", "run", "--link-key", f"k:{LITERAL}"],
    ["flowrouter", "ctl", "--control", "127.0.0.1:9", "--link-key", f"k:{LITERAL}", "ping"],
])
def test_a_key_written_on_the_command_line_is_refused_without_echoing_it(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    module, _, func = SCRIPTS[argv[0]].partition(":")
    main = getattr(importlib.import_module(module), func)
    try:
        code = main(argv[1:])
    except SystemExit as exc:
        code = exc.code
    assert code not in (0, None)
    out = capsys.readouterr()
    assert "5a5a5a5a" not in out.out + out.err
