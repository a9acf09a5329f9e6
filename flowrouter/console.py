"""One behaviour for every flownet console script: errors, exit codes, signals, logging.

Every command (``flowrouter``, ``flowls``, ``flowcat``, ``flowdir``, ``flowchat``,
``flowtrace``) is started through :func:`run` so that all of them:

* report an error as one line, ``PROG: what is wrong`` (naming the file, key or flag), never a
  traceback (``FLOWNET_TRACEBACK=1`` shows one for an unexpected error);
* exit 2 for usage and configuration errors, 1 for runtime ones (a peer that does not answer,
  a port in use), 130 after Ctrl-C (quietly, once the command has shut down), and 141 without a
  word when the reader of their output goes away (``| head``);
* accept ``--version`` (:class:`ArgumentParser`), and ``--log-level``, ``--log-file`` and
  ``--log-format text|json`` (:func:`add_logging_options`, :func:`setup_logging`), with the node
  name on every log line.

This module imports only the standard library (and the package's version string), so the
wire-only layers (flowlib, directory) and the applications may all use it; an import-linter
contract in pyproject.toml keeps it that way.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from flowrouter import __version__

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141

LOG_LEVELS = ("debug", "info", "warning", "error")


class UsageError(Exception):
    """A mistake in how the command was called or configured (exit code 2)."""

    exit_code = EXIT_USAGE


class RuntimeFailure(Exception):
    """The command was right but the world was not (exit code 1): a port in use, no answer."""

    exit_code = EXIT_RUNTIME


class ArgumentParser(argparse.ArgumentParser):
    """argparse with ``--version`` and a one-line usage error (``PROG: argument --x: ...``).

    Subcommand parsers inherit the class, so every level behaves the same.
    """

    usage_exit_code = EXIT_USAGE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The command itself, not its subcommands (whose progs are "prog sub"): a subcommand
        # may have a --version of its own (flowcat issue-policy --version N).
        if " " not in self.prog and "--version" not in self._option_string_actions:
            self.add_argument("--version", action="version",
                              version=f"%(prog)s (flownet) {__version__}")

    def error(self, message: str) -> NoReturn:
        top = self.prog.split()[0]
        self.exit(self.usage_exit_code,
                  f"{self.prog}: {message} (see {self.prog} --help)\n".replace(
                      f"{top}: {top}", top))


# ---------------------------------------------------------------------------- logging
class _NodeFilter(logging.Filter):
    """Puts the process's node name on every record (``record.node``)."""

    def __init__(self) -> None:
        super().__init__()
        self.node = "-"

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "node"):
            record.node = self.node
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (Unix seconds), level, node, logger, msg (+ exc)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname.lower(),
                               "node": getattr(record, "node", "-"), "logger": record.name,
                               "msg": record.getMessage()}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(node)s %(name)s: %(message)s"

_node_filter = _NodeFilter()
_our_handlers: list[logging.Handler] = []


def add_logging_options(parser: argparse.ArgumentParser, default_level: str | None = "info",
                        verbose: bool = True, again: bool = False) -> None:
    """The same logging flags on every command (``-v`` is a shortcut for info, ``-vv`` debug).

    *again*: the flags repeated on a subcommand (``flowrouter run --log-level debug``), with
    no defaults of their own so they do not undo the same flags given before it.
    """
    g = parser.add_argument_group("logging")
    kw: dict[str, Any] = {"default": argparse.SUPPRESS} if again else {}
    g.add_argument("--log-level", choices=LOG_LEVELS, **(kw or {"default": default_level}),
                   help=f"least severe messages logged (default {default_level or 'warning'})")
    g.add_argument("--log-file", metavar="FILE", **kw,
                   help="append log lines to FILE instead of stderr")
    g.add_argument("--log-format", choices=("text", "json"), **(kw or {"default": "text"}),
                   help="text lines, or one JSON object per line (default text)")
    if verbose:
        g.add_argument("-v", "--verbose", action="count", **(kw or {"default": 0}),
                       help="log more: -v info, -vv debug")


def set_node(name: str) -> None:
    """Name this process in every following log line (e.g. the router's name)."""
    _node_filter.node = name


def setup_logging(args: argparse.Namespace | None = None, *, node: str | None = None,
                  level: str | None = None, log_file: str | None = None,
                  fmt: str | None = None, default_level: str = "warning") -> None:
    """Install the one log format on the root logger (replacing what we installed before).

    Values come from *args* (the flags of :func:`add_logging_options`) unless given here.
    """
    verbose = int(getattr(args, "verbose", 0) or 0)
    level = level or getattr(args, "log_level", None) or (
        "debug" if verbose > 1 else "info" if verbose else default_level)
    if verbose > 1:
        level = "debug"
    elif verbose and level in ("warning", "error"):
        level = "info"
    log_file = log_file or getattr(args, "log_file", None)
    fmt = fmt or getattr(args, "log_format", None) or "text"
    if node:
        set_node(node)
    root = logging.getLogger()
    for h in _our_handlers:
        root.removeHandler(h)
        h.close()
    _our_handlers.clear()
    if log_file:
        try:
            handler: logging.Handler = logging.FileHandler(log_file, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--log-file {log_file}: {exc.strerror}") from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_node_filter)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        formatter = logging.Formatter(TEXT_FORMAT)
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root.addHandler(handler)
    _our_handlers.append(handler)
    root.setLevel(getattr(logging, level.upper()))


def reopen_log_files() -> int:
    """Reopen the ``--log-file`` this process writes (after logrotate moved it away: new
    lines go to a new file at the same path); returns how many were reopened."""
    n = 0
    for handler in _our_handlers:
        if isinstance(handler, logging.FileHandler):
            stream = open(handler.baseFilename, "a", encoding="utf-8")  # noqa: SIM115
            old = handler.setStream(stream)
            if old is not None:
                old.close()
            n += 1
    return n


# ---------------------------------------------------------------------------- running
def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush is
    quiet too (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def exit_code_for(exc: BaseException) -> int:
    """The exit code of an exception that ended a command (see the module docstring)."""
    code = getattr(exc, "exit_code", None)
    if isinstance(code, int):
        return code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_RUNTIME


def run(prog: str, main: Callable[[Any], int | None],
        argv: Sequence[str] | None = None, *,
        usage_errors: tuple[type[BaseException], ...] = (),
        runtime_errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run *main(argv)* the way every flownet command runs; returns the exit code.

    *usage_errors* are the command's own exception types that mean "wrong input" (exit 2),
    *runtime_errors* those that mean "failed while running" (exit 1); either is printed as
    one line. Anything else unexpected is one line too, unless ``FLOWNET_TRACEBACK=1``.
    """
    try:
        code = main(argv)
        sys.stdout.flush()
        return int(code or 0)
    except SystemExit:  # argparse (--help, --version, usage errors): already said its piece
        raise
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    except usage_errors as exc:
        _print_error(prog, exc)
        return EXIT_USAGE
    except runtime_errors as exc:
        _print_error(prog, exc)
        return EXIT_RUNTIME
    except (UsageError, RuntimeFailure) as exc:
        _print_error(prog, exc)
        return exc.exit_code
    except (OSError, TimeoutError, ConnectionError) as exc:
        _print_error(prog, exc)
        return EXIT_RUNTIME
    except Exception as exc:
        code = getattr(exc, "exit_code", None)
        if isinstance(code, int):  # a documented refusal (flowlib's errors): one line
            _print_error(prog, exc)
            return code
        if os.environ.get("FLOWNET_TRACEBACK") == "1":
            raise
        print(f"{prog}: internal error: {type(exc).__name__}: {_one_line(exc)} "
              "(FLOWNET_TRACEBACK=1 shows where)", file=sys.stderr)
        return EXIT_RUNTIME


def _print_error(prog: str, exc: BaseException) -> None:
    try:
        print(f"{prog}: {_one_line(exc)}", file=sys.stderr)
    except (BrokenPipeError, ValueError):
        pass


def entry(prog: str, main: Callable[[Any], int | None], **kwargs: Any
          ) -> Callable[[], NoReturn]:
    """A console-script target (pyproject ``[project.scripts]``) running *main* via :func:`run`.
    """
    def _entry() -> NoReturn:
        code = run(prog, main, None, **kwargs)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
        except (OSError, ValueError):
            pass
        sys.exit(code)

    _entry.__doc__ = f"Console script {prog}."
    return _entry


__all__ = ["ArgumentParser", "JsonFormatter", "RuntimeFailure", "UsageError",
           "add_logging_options", "entry", "exit_code_for", "run", "set_node",
           "setup_logging", "__version__"]
