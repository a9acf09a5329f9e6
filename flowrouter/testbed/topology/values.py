"""ValueChecker: the typed value checks of the topology parser (tables, keys, names, numbers
with units, integers, LSIDs, modifiers, router parameters), each failing with a
:class:`~flowrouter.testbed.topology.model.TopologyError` that names the file and line.

Units: bandwidth in bits per second (``"56k"``, ``"10M"``), times in seconds (``"50ms"``,
``"200us"``). May import the model and the locator.
"""

from __future__ import annotations

import math
import re
from typing import Any

from flowrouter.core.tables import Modifiers
from flowrouter.testbed.topology.locator import Locator
from flowrouter.testbed.topology.model import MAX_LSID, NAME_RE, ROUTER_PARAMS, TopologyError

_UNITS_TIME = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
_UNITS_BW = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_BW_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmg]?)\s*(?:bit/s|bps|b/s)?\s*$",
                    re.IGNORECASE)
_TIME_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(us|ms|s|min)\s*$",
                      re.IGNORECASE)


def type_name(v: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a float"}.get(type(v), type(v).__name__)


def known_names(names: Any) -> str:
    names = sorted(names)
    if not names:
        return "none"
    if len(names) > 8:
        return ", ".join(names[:8]) + f", ... ({len(names)} in all)"
    return ", ".join(names)


class ValueChecker:
    """Checks one value of a topology document; every failure is a TopologyError that
    names the file and line."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self._loc: Locator | None = None

    # errors ---------------------------------------------------------------------------------

    def fail(self, path: tuple[Any, ...], message: str) -> TopologyError:
        if self._loc is None:
            self._loc = Locator(self.text)
        return TopologyError(message, self.source, self._loc.line_of(path))

    @staticmethod
    def where(path: tuple[Any, ...]) -> str:
        out = ""
        for p in path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out

    def table(self, value: Any, path: tuple[Any, ...], what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"{what} must be a table, got {type_name(value)}")
        return value

    def keys(self, tbl: dict[str, Any], path: tuple[Any, ...], allowed: tuple[str, ...],
             what: str, required: tuple[str, ...] = ()) -> None:
        for k in tbl:
            if k not in allowed:
                raise self.fail(path + (k,), f"unknown key {k!r} in {what} (allowed: "
                                             f"{', '.join(allowed)})")
        for k in required:
            if k not in tbl:
                raise self.fail(path, f"{what} is missing the required key {k!r}")

    def name(self, value: Any, path: tuple[Any, ...], what: str) -> str:
        if not isinstance(value, str) or not NAME_RE.match(value):
            raise self.fail(path, f"{what} must be a name of letters, digits, '_', '-' or "
                                  f"'.', got {value!r}")
        return value

    def text_(self, value: Any, path: tuple[Any, ...], what: str) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"{what} must be a string, got {type_name(value)}")
        return value

    def number(self, value: Any, path: tuple[Any, ...], what: str, *, lo: float = 0.0,
               hi: float | None = None, lo_open: bool = False, time: bool = False,
               bandwidth: bool = False) -> float:
        if isinstance(value, str) and (time or bandwidth):
            m = (_TIME_RE if time else _BW_RE).match(value)
            if not m:
                hint = "'50ms', '2s'" if time else "'56k', '10M', '1.5G'"
                raise self.fail(path, f"{what}: cannot read {value!r} (use a number or e.g. "
                                      f"{hint})")
            num = float(m.group(1)) * (_UNITS_TIME[m.group(2).lower()] if time
                                       else _UNITS_BW[m.group(2).lower()])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            num = float(value)
        else:
            raise self.fail(path, f"{what} must be a number, got {type_name(value)} {value!r}")
        if math.isnan(num) or math.isinf(num):
            raise self.fail(path, f"{what} must be finite, got {value!r}")
        if num < lo or (lo_open and num == lo):
            bound = f"greater than {lo:g}" if lo_open else f"at least {lo:g}"
            if lo == 0 and not lo_open:
                bound = "non-negative"
            raise self.fail(path, f"{what} must be {bound}, got {value!r}")
        if hi is not None and num > hi:
            raise self.fail(path, f"{what} must be between {lo:g} and {hi:g}, got {value!r}")
        return num

    def integer(self, value: Any, path: tuple[Any, ...], what: str, lo: int = 0,
                hi: int | None = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(path, f"{what} must be an integer, got {type_name(value)} {value!r}")
        if value < lo or (hi is not None and value > hi):
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise self.fail(path, f"{what} must be {rng}, got {value}")
        return value

    def lsid(self, value: Any, path: tuple[Any, ...], what: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(path, f"{what} must be an integer LSID (e.g. 0x10), got "
                                  f"{type_name(value)} {value!r}")
        if not 1 <= value <= MAX_LSID:
            raise self.fail(path, f"{what} {value:#x} is not a usable LSID (1..0xffffffff; "
                                  "0 is reserved for link-local traffic)")
        return value

    def modifiers(self, value: Any, path: tuple[Any, ...], what: str,
                  base: Modifiers) -> Modifiers:
        tbl = self.table(value, path, f"{what} modifiers")
        self.keys(tbl, path, ("bandwidth", "delay", "geography"), f"{what} modifiers")
        vals = {"bandwidth": base.bandwidth, "delay": base.delay, "geography": base.geography}
        for k, v in tbl.items():
            vals[k] = self.integer(v, path + (k,), f"{what} modifier {k}", 0, 255)
        return Modifiers(**vals)

    def params(self, tbl: dict[str, Any], path: tuple[Any, ...], what: str
               ) -> tuple[tuple[str, float], ...]:
        out: list[tuple[str, float]] = []
        for k in ROUTER_PARAMS:
            if k in tbl:
                if k in ("ping_after", "delete_after", "max_payload", "max_flows"):
                    v: float = self.integer(tbl[k], path + (k,), f"{what} {k}", 1)
                else:
                    v = self.number(tbl[k], path + (k,), f"{what} {k}", lo_open=True,
                                    time=True)
                out.append((k, v))
        d = dict(out)
        if "ping_after" in d and "delete_after" in d and not d["delete_after"] > d["ping_after"]:
            raise self.fail(path + ("delete_after",), f"{what}: delete_after "
                            f"({d['delete_after']:g}) must be greater than ping_after "
                            f"({d['ping_after']:g})")
        return tuple(out)

    # the document ---------------------------------------------------------------------------
