"""JSON text of a large document made a slice at a time, the event loop let run in between.

A router's status document with every flow row of a large table is large (about 250 bytes
a flow: 250 MB at 10^6 flows), and ``json.dumps`` of it held the router's loop for seconds.
:func:`pieces` gives the text of ``json.dumps(value, indent=indent, default=str)``, byte
for byte, in pieces to write one after the other, encoding the items of any long list SLICE
at a time and letting the loop run after each slice. Only lists
are sliced, at the top or inside objects whose keys are all strings (a status document's
shape); anything else, a long list's items among them, is encoded by ``json.dumps`` whole.
Imports the standard library only.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

#: list items encoded between two turns of the loop
SLICE = 1024


def _plain(value: Any, indent: int | None) -> str:
    return json.dumps(value, indent=indent, default=str)


async def pieces(value: Any, indent: int | None = None, consume: bool = False) -> list[str]:
    """The text of ``json.dumps(value, indent=indent, default=str)`` in pieces (a long
    list's slices each one), made a slice at a time: written one by one, the text of a
    large document is never copied whole (joining 250 MB of it held the loop a second).
    With *consume*, each slice of a long list is dropped (its items replaced by None) once
    encoded, so that its items are freed a slice at a time too (a million status rows
    freed at once held the loop 0.15 s): for a document made only to be sent."""
    out: list[str] = []
    await _encode(value, indent, 0, out, consume)
    return out


async def _encode(value: Any, indent: int | None, depth: int, out: list[str],
                  consume: bool = False) -> None:
    """Append *value*'s text at *depth* to *out*: a long list a slice at a time, an object
    with string keys that holds one member by member, anything else whole."""
    inner = "" if indent is None else "\n" + " " * (indent * (depth + 1))
    close = "" if indent is None else "\n" + " " * (indent * depth)
    sep = ", " if indent is None else "," + inner
    if isinstance(value, list) and len(value) > SLICE:
        out.append("[" + inner)
        for at in range(0, len(value), SLICE):
            if at:
                out.append(sep)
            part = value[at:at + SLICE]
            out.append(sep.join([_nested(_plain(v, indent), indent, depth + 1) for v in part]))
            if consume:
                value[at:at + SLICE] = [None] * len(part)
                del part
            await asyncio.sleep(0)
        out.append(close + "]")
    elif (isinstance(value, dict) and value and all(type(k) is str for k in value)
          and _holds_long_list(value)):
        out.append("{" + inner)
        for i, (k, v) in enumerate(value.items()):
            out.append((sep if i else "") + json.dumps(k) + ": ")
            await _encode(v, indent, depth + 1, out, consume)
        out.append(close + "}")
    else:
        out.append(_nested(_plain(value, indent), indent, depth))


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


__all__ = ["SLICE", "pieces"]
