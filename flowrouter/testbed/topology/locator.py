"""Locator: finds the line where a key path (``("links", 3, "b")``) appears in TOML text,
so that semantic errors name a line as syntax errors do.

A small scanner over the text (tomllib keeps no positions). May import only the standard
library.
"""

from __future__ import annotations

import tomllib
from bisect import bisect_right
from typing import Any


class Locator:
    """Maps key paths (``("links", 3, "b")``) to the line where they appear in TOML text.

    A small scanner for valid TOML (tomllib has already checked the syntax): table headers,
    arrays of tables, dotted keys, inline tables and arrays. Paths use ints for array
    positions, exactly like the parsed document, so a validator that knows where it is in
    the data can find the line.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines: dict[tuple[Any, ...], int] = {}
        self._nl = [i for i, c in enumerate(text) if c == "\n"]
        self._aot: dict[tuple[Any, ...], int] = {}
        try:
            self._scan()
        except (IndexError, ValueError):  # pragma: no cover - best effort on odd input
            pass

    def line_of(self, path: tuple[Any, ...] | list[Any]) -> int | None:
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return None

    # scanning -----------------------------------------------------------------------------
    def _line(self, pos: int) -> int:
        return bisect_right(self._nl, pos - 1) + 1

    def _record(self, path: tuple[Any, ...], pos: int) -> None:
        self.lines.setdefault(path, self._line(pos))

    def _skip_ws(self, i: int, newlines: bool = False) -> int:
        t = self.text
        n = len(t)
        while i < n:
            c = t[i]
            if c in " \t\r" or (newlines and c == "\n"):
                i += 1
            elif c == "#" and newlines:
                while i < n and t[i] != "\n":
                    i += 1
            else:
                break
        return i

    def _scan(self) -> None:
        t = self.text
        n = len(t)
        i = 0
        table: tuple[Any, ...] = ()
        while i < n:
            i = self._skip_ws(i, newlines=True)
            if i >= n:
                break
            if t[i] == "[":
                aot = t.startswith("[[", i)
                j = i + (2 if aot else 1)
                keys, j = self._key(j)
                j = self._skip_ws(j)
                j += 2 if aot else 1
                table = self._resolve(keys, aot)
                self._record(table, i)
                i = j
                continue
            keys, j = self._key(i)
            path = table + tuple(keys)
            self._record(path, i)
            j = self._skip_ws(j)
            j += 1  # '='
            j = self._skip_ws(j)
            i = self._value(j, path)

    def _resolve(self, keys: list[str], aot: bool) -> tuple[Any, ...]:
        res: tuple[Any, ...] = ()
        for k in keys[:-1]:
            res += (k,)
            if res in self._aot:
                res += (self._aot[res] - 1,)
        res += (keys[-1],)
        if aot:
            idx = self._aot.get(res, 0)
            self._aot[res] = idx + 1
            res += (idx,)
        return res

    def _key(self, i: int) -> tuple[list[str], int]:
        t = self.text
        keys = []
        while True:
            i = self._skip_ws(i)
            if t[i] in "\"'":
                s, i = self._string(i)
                keys.append(s)
            else:
                j = i
                while j < len(t) and (t[j].isalnum() or t[j] in "_-"):
                    j += 1
                keys.append(t[i:j])
                i = j
            i = self._skip_ws(i)
            if i < len(t) and t[i] == ".":
                i += 1
                continue
            return keys, i

    def _string(self, i: int) -> tuple[str, int]:
        t = self.text
        q = t[i]
        if t.startswith(q * 3, i):
            end = t.index(q * 3, i + 3)
            while t.startswith(q, end + 3):  # up to two quotes may close the string
                end += 1
            return t[i + 3:end], end + 3
        j = i + 1
        while t[j] != q:
            if q == '"' and t[j] == "\\":
                j += 1
            j += 1
        raw = t[i + 1:j]
        if q == '"':
            try:
                raw = tomllib.loads(f"k = {t[i:j + 1]}")["k"]
            except tomllib.TOMLDecodeError:
                pass
        return raw, j + 1

    def _value(self, i: int, path: tuple[Any, ...]) -> int:
        t = self.text
        c = t[i]
        if c in "\"'":
            return self._string(i)[1]
        if c == "[":
            i += 1
            idx = 0
            while True:
                i = self._skip_ws(i, newlines=True)
                if t[i] == "]":
                    return i + 1
                self._record(path + (idx,), i)
                i = self._value(i, path + (idx,))
                idx += 1
                i = self._skip_ws(i, newlines=True)
                if t[i] == ",":
                    i += 1
        if c == "{":
            i += 1
            while True:
                i = self._skip_ws(i)
                if t[i] == "}":
                    return i + 1
                keys, j = self._key(i)
                sub = path + tuple(keys)
                self._record(sub, i)
                j = self._skip_ws(j) + 1
                j = self._skip_ws(j)
                i = self._value(j, sub)
                i = self._skip_ws(i)
                if t[i] == ",":
                    i += 1
        j = i
        while j < len(t) and t[j] not in ",]}\n#":
            j += 1
        return j
