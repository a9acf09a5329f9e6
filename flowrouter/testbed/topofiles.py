"""Where the shipped topology files are, and how a topology named on a command line is found.

The topology files of ``topologies/`` ship inside the package as package data
(``flowrouter/testbed/topologies``: in a source checkout a link to ``topologies/``, in an
installed copy the files themselves), so ``flowchat experiment``, ``flowrouter up`` and
``flowrouter sim`` find them after a plain ``pip install .``, from any directory.
Testbed layer: imports only the standard library.
"""

from __future__ import annotations

from pathlib import Path

#: the topologies shipped with the package (in a checkout: the checkout's ``topologies/``)
SHIPPED = Path(__file__).resolve().parent / "topologies"


def candidates(name: str) -> list[Path]:
    """Where ``topologies/NAME`` is looked for: the shipped copy, then a ``topologies/``
    folder in the working directory or one of its parents."""
    cwd = Path.cwd()
    return [SHIPPED / name, *(base / "topologies" / name for base in (cwd, *cwd.parents))]


def find_topology(name: str) -> Path:
    """The first existing ``topologies/NAME``. If there is none (an installation without
    its package data), ``topologies/NAME`` relative to the working directory, so that the
    error a load then gives names what the user can create, never a path inside the
    installed package."""
    for path in candidates(name):
        if path.is_file():
            return path
    return Path("topologies") / name


def resolve(path: str | Path) -> Path:
    """A topology file as given on a command line: *path* itself when it exists; else, for
    ``NAME.toml`` or ``topologies/NAME.toml`` (the README's form, run outside a checkout),
    the shipped file of that name; else *path* unchanged (its load names it)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    parts = p.parts
    if len(parts) == 1 or (len(parts) == 2 and parts[0] == "topologies"):
        shipped = SHIPPED / parts[-1]
        if shipped.is_file():
            return shipped
    return p


def shipped_names() -> list[str]:
    """The file names of the shipped topologies (``two-site.toml``, ...)."""
    return sorted(p.name for p in SHIPPED.glob("*.toml")) if SHIPPED.is_dir() else []


__all__ = ["SHIPPED", "candidates", "find_topology", "resolve", "shipped_names"]
