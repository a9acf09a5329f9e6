"""What a report must say about how it was made: inputs, versions, configuration and date.

:func:`header` returns a plain dict (JSON-ready) that the analyze and study reports print at
their top. Imports only the standard library.
"""

from __future__ import annotations

import datetime
import platform
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from flowrouter.core import traces as TR


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    """Versions of flownet, the trace schema, Python and the libraries the job uses."""
    from . import schema

    out: dict[str, Any] = {
        "flownet": _version("flownet") or "source tree",
        "trace_schema_written": TR.SCHEMA_VERSION,
        "trace_schemas_read": list(schema.VERSIONS),
        "python": platform.python_version(),
    }
    for dist in ("pyspark", "numpy", "scipy", "matplotlib"):
        out[dist] = _version(dist)
    return out


def header(inputs: Sequence[str], config: Mapping[str, Any]) -> dict[str, Any]:
    return {"date": datetime.datetime.now(datetime.UTC).strftime(
                "%Y-%m-%d %H:%M:%S UTC"),
            "command": " ".join(["flowtrace", *sys.argv[1:]]) if sys.argv else "flowtrace",
            "inputs": list(inputs), "versions": versions(), "config": dict(config)}


def header_lines(h: Mapping[str, Any]) -> list[str]:
    """The header as bullet lines for a report."""
    v = h["versions"]
    return [f"date: {h['date']}", f"inputs: {', '.join(map(str, h['inputs'])) or '–'}",
            "versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val is not None),
            "config: " + ", ".join(f"{k}={val}" for k, val in h["config"].items())]
