"""JSON text of a large document made a slice at a time, the event loop let run in between.

A router's status document with every flow row of a large table is large (about 250 bytes
a flow: 250 MB at 10^6 flows), and ``json.dumps`` of it held the router's loop for seconds.
:func:`dumps` gives the same text as ``json.dumps(value, indent=indent, default=str)``,
byte for byte, but encodes the items of any long list SLICE at a time and lets the loop run
after each slice. Only lists are sliced, inside objects whose keys are all strings (a status
document's shape); anything else is encoded by ``json.dumps`` whole. Imports the standard
library only.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

#: list items encoded between two turns of the loop
SLICE = 1024


def _plain(value: Any, indent: int | None) -> str:
    return json.dumps(value, indent=indent, default=str)


async def dumps(value: Any, indent: int | None = None, depth: int = 0) -> str:
    """``json.dumps(value, indent=indent, default=str)``, long lists a slice at a time."""
    if isinstance(value, list) and len(value) > SLICE:
        if indent is None:
            parts = []
            for at in range(0, len(value), SLICE):
                parts.append(", ".join([await dumps(v, None, depth + 1)
                                        for v in value[at:at + SLICE]]))
                await asyncio.sleep(0)
            return "[" + ", ".join(parts) + "]"
        pad = "\n" + " " * (indent * (depth + 1))
        parts = []
        for at in range(0, len(value), SLICE):
            parts.append(("," + pad).join([await dumps(v, indent, depth + 1)
                                           for v in value[at:at + SLICE]]))
            await asyncio.sleep(0)
        return "[" + pad + ("," + pad).join(parts) + "\n" + " " * (indent * depth) + "]"
    if isinstance(value, dict) and value and all(type(k) is str for k in value):
        if not _holds_long_list(value):
            return _nested(_plain(value, indent), indent, depth)
        if indent is None:
            items = [f"{json.dumps(k)}: {await dumps(v, None, depth + 1)}"
                     for k, v in value.items()]
            return "{" + ", ".join(items) + "}"
        pad = "\n" + " " * (indent * (depth + 1))
        items = [f"{json.dumps(k)}: {await dumps(v, indent, depth + 1)}"
                 for k, v in value.items()]
        return "{" + pad + ("," + pad).join(items) + "\n" + " " * (indent * depth) + "}"
    return _nested(_plain(value, indent), indent, depth)


def _holds_long_list(value: Any) -> bool:
    """Whether a list longer than SLICE is anywhere inside *value* (where slicing pays)."""
    if isinstance(value, list):
        return len(value) > SLICE or any(_holds_long_list(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_long_list(v) for v in value.values())
    return False


def _nested(text: str, indent: int | None, depth: int) -> str:
    """*text* (encoded at depth 0) as it reads *depth* levels in: with an indent, each of
    its line breaks takes the depth's padding (JSON strings hold no raw line breaks)."""
    if indent is None or depth == 0 or "\n" not in text:
        return text
    return text.replace("\n", "\n" + " " * (indent * depth))


__all__ = ["SLICE", "dumps"]
