"""Sphinx configuration of the flowlib API reference (docs/api/).

Built from the docstrings with autodoc, warnings as errors (tests/test_docs_api.py runs
``python3 -m sphinx -W --keep-going -b html docs/api OUT``). The checkout's packages are put
on the path here, so the reference always describes the code next to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for folder in ("location_service", "directory", "apps", "."):
    sys.path.insert(0, str(ROOT / folder))

from flowrouter import __version__  # noqa: E402

project = "flowlib"
author = "the flownet authors"
copyright = "the flownet authors"  # noqa: A001
version = release = __version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
# names the hints mention that live outside the documented modules
nitpicky = False
html_theme = "alabaster"
html_static_path: list[str] = []
exclude_patterns = ["_build"]
suppress_warnings = ["autodoc.import_object"]
