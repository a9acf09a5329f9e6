"""Where the shipped topology files are: ``topologies/`` of a source checkout, else a
``topologies/`` directory in the working directory or one of its parents (an installed
package has no checkout next to it, so ``flowchat experiment`` run from a copy of the
repository, or from any directory holding ``topologies/``, finds its default topology).
Testbed layer: imports only the standard library."""

from __future__ import annotations

from pathlib import Path

#: the checkout's topologies (present when running from source)
CHECKOUT = Path(__file__).resolve().parents[2] / "topologies"


def candidates(name: str) -> list[Path]:
    cwd = Path.cwd()
    return [CHECKOUT / name, *(base / "topologies" / name for base in (cwd, *cwd.parents))]


def find_topology(name: str) -> Path:
    """The first existing ``topologies/NAME``; if none exists, the checkout path (loading it
    then fails with a message naming it)."""
    for path in candidates(name):
        if path.is_file():
            return path
    return CHECKOUT / name


__all__ = ["CHECKOUT", "candidates", "find_topology"]
