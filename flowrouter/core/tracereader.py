"""Reading router traces back: files, directories, globs and rotated sets, oldest first;
each line a validated record or a :class:`TraceError` the caller counts.

May import :mod:`flowrouter.core.traceschema` and the standard library.
"""

from __future__ import annotations

import glob as _glob
import gzip
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrouter.core.traceschema import validate


@dataclass(frozen=True, slots=True)
class TraceError:
    """A line that is not a valid record: ``kind`` is ``corrupt`` (not a JSON object) or
    ``invalid`` (a JSON object that breaks the schema)."""

    path: str
    line: int
    kind: str
    reason: str
    text: str


def _rotation_key(path: str) -> tuple[str, int, str]:
    """Sort key putting a rotated set oldest first: base.3, base.2, base.1, base."""
    name = path[:-3] if path.endswith(".gz") else path
    m = re.fullmatch(r"(.*)\.(\d+)\.jsonl", name)
    if m:
        return (m.group(1), -int(m.group(2)), path)
    base = name[:-6] if name.endswith(".jsonl") else name
    return (base, 0, path)


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                 ) -> list[str]:
    """Files named by *paths*: files as given, directories searched recursively for
    ``*.jsonl`` / ``*.jsonl.gz``, glob patterns expanded. Raises FileNotFoundError for a
    path that names nothing."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            found = [str(f) for f in Path(p).rglob("*")
                     if f.is_file() and f.name.endswith((".jsonl", ".jsonl.gz"))]
            out += sorted(found, key=_rotation_key)
        elif os.path.exists(p):
            out.append(p)
        else:
            matches = _glob.glob(p, recursive=True)
            if not matches:
                raise FileNotFoundError(f"no trace file or directory matches {p!r}")
            files: list[str] = []
            for m in matches:
                files += expand_paths(m) if os.path.isdir(m) else [m]
            out += sorted(files, key=_rotation_key)
    return out


def read_traces(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                ) -> Iterator[dict[str, Any] | TraceError]:
    """Yield each record (a dict) or a :class:`TraceError`, file by file, line by line.

    Accepts files, directories, globs (see :func:`expand_paths`); ``.gz`` files are
    decompressed. Blank lines are skipped; invalid UTF-8 is replaced (as Spark does). Errors
    are never raised for bad lines: the caller counts them.
    """
    for path in expand_paths(paths):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as fh:  # type: ignore[operator]
            for n, raw in enumerate(fh, 1):
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError as exc:
                    yield TraceError(path, n, "corrupt", f"not JSON ({exc.msg})", text)
                    continue
                except (ValueError, RecursionError) as exc:  # e.g. absurdly deep nesting
                    yield TraceError(path, n, "corrupt", f"not JSON ({type(exc).__name__})",
                                     text)
                    continue
                if not isinstance(rec, dict):
                    yield TraceError(path, n, "corrupt", "not a JSON object", text)
                    continue
                problem = validate(rec)
                if problem is None:
                    yield rec
                else:
                    yield TraceError(path, n, "invalid", problem, text)
