"""Where the checkout's import packages live, for the processes tests start.

The import packages sit in four folders: ``flowrouter`` and ``flowlib`` at the top,
``flowchat``, ``flowvideo``, ``flowtrace`` and ``flownet`` in ``apps/``, ``flowdir`` in
``directory/`` and ``flowls`` in ``location_service/``. pytest puts the same folders on its
own path (``pythonpath`` in pyproject.toml); a test that starts a Python process passes
:data:`PYTHONPATH` on, so the child imports this checkout, never an installed copy.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the folders holding the checkout's import packages, in import order
SOURCE_DIRS = (ROOT, ROOT / "apps", ROOT / "directory", ROOT / "location_service")
#: a PYTHONPATH value that imports this checkout
PYTHONPATH = os.pathsep.join(str(d) for d in SOURCE_DIRS)


def with_checkout(path: str | None) -> str:
    """*path* (a PYTHONPATH value, maybe empty) with the checkout's folders in front."""
    return PYTHONPATH + (os.pathsep + path if path else "")
