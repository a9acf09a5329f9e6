"""Topology files: sites, routers, endpoints, links, LS placement and fault schedules.

One TOML format (documented with examples in ``topologies/README.md``) serves the launcher,
the simulator (:mod:`flowrouter.testbed.sim`) and the tests. :func:`load` / :func:`loads` parse and
validate a file into the frozen dataclasses below; :meth:`Topology.to_toml` writes one back,
so ``loads(t.to_toml()) == t`` for every valid topology ``t``.

Every problem raises :class:`TopologyError`, whose message names the file, the line and what
is wrong, e.g. ``ring.toml:41: link 'r03-r04': unknown router 'r4' in 'b' (known: r01, ...)``.
Syntax errors take their line from :mod:`tomllib`; semantic errors find the offending key or
table in the text with a small scanner (:class:`_Locator`).

Units: bandwidth in bits per second (``0`` = unlimited; strings such as ``"56k"``, ``"10M"``
are accepted), delays and times in seconds (``"50ms"``, ``"200us"`` accepted), loss as a
probability 0..1. Locality modifiers are the per-link costs the router subtracts from a
message's locality budget (see :mod:`flowrouter.core.router`).
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from bisect import bisect_right
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from flowrouter.core.tables import Modifiers

__all__ = [
    "TopologyError", "Site", "RouterSpec", "EndpointSpec", "LinkSpec", "LocationService",
    "Fault", "Scenario", "LinkDefaults", "EndpointDefaults", "RouterDefaults", "Defaults",
    "Topology", "load", "loads", "dump", "dumps", "node_id_for",
]

TRANSPORTS = ("tcp", "udp")
ROUTER_PARAMS = ("epoch", "ping_after", "delete_after", "join_timeout", "max_payload",
                 "max_flows")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_MAX_LSID = 0xFFFFFFFF


class TopologyError(ValueError):
    """A topology file is unreadable or inconsistent; ``str()`` is ``file:line: what``."""

    def __init__(self, message: str, source: str = "<string>", line: int | None = None
                 ) -> None:
        self.message = message
        self.source = source
        self.line = line
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


def node_id_for(name: str) -> int:
    """A stable 64-bit node ID derived from a router or endpoint name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") or 1


# ============================================================================ data model


@dataclass(frozen=True)
class Site:
    name: str
    description: str = ""


@dataclass(frozen=True)
class LinkDefaults:
    transport: str = "tcp"
    bandwidth: float = 0.0  #: bits/s, 0 = unlimited
    delay: float = 0.001  #: one-way propagation, seconds
    loss: float = 0.0
    modifiers: Modifiers = Modifiers()
    queue_limit: int = 0  #: bytes waiting per direction before frames drop; 0 = unlimited


@dataclass(frozen=True)
class EndpointDefaults:
    bandwidth: float = 0.0
    delay: float = 0.0001
    modifiers: Modifiers = Modifiers()


@dataclass(frozen=True)
class RouterDefaults:
    host: str = "127.0.0.1"
    base_port: int = 7400
    #: router parameters (keys of ROUTER_PARAMS) applied to every router
    params: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Defaults:
    link: LinkDefaults = LinkDefaults()
    endpoint: EndpointDefaults = EndpointDefaults()
    router: RouterDefaults = RouterDefaults()


@dataclass(frozen=True)
class RouterSpec:
    name: str
    site: str | None = None
    #: LSIDs this router is a core for (merged with ``[[location_services]]``), sorted
    core_lsids: tuple[int, ...] = ()
    #: listen port = defaults.router.base_port + port_offset; None = the router's index
    port_offset: int | None = None
    host: str | None = None
    #: static LS routes: (lsid, neighbour router name)
    routes: tuple[tuple[int, str], ...] = ()
    default_route: str | None = None
    #: per-router overrides of ROUTER_PARAMS
    params: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    router: str
    roles: tuple[str, ...] = ()
    bandwidth: float = 0.0
    delay: float = 0.0001
    modifiers: Modifiers = Modifiers()


@dataclass(frozen=True)
class LinkSpec:
    name: str
    a: str
    b: str
    transport: str = "tcp"
    bandwidth: float = 0.0
    delay: float = 0.001
    loss: float = 0.0
    modifiers: Modifiers = Modifiers()
    #: True: application data only travels a -> b (control still goes both ways)
    oneway: bool = False
    queue_limit: int = 0

    def other(self, router: str) -> str:
        return self.b if router == self.a else self.a


@dataclass(frozen=True)
class LocationService:
    lsid: int
    cores: tuple[str, ...]
    name: str = ""


@dataclass(frozen=True)
class Fault:
    """One schedule entry. Three kinds, told apart by their keys:

    * outage: ``at`` [``until``] — the link(s) go down at ``at`` and up at ``until``;
    * repeat: ``down``, ``up``, ``start`` [``until``] — down for ``down`` s, up for ``up`` s,
      the first outage at ``start``, no outage at or after ``until``;
    * set: ``at`` [``until``] plus any of ``bandwidth``/``delay``/``loss`` — the link(s) use
      those values from ``at`` and return to their configured values at ``until``.

    ``direction`` (a router at one end) limits the fault to frames that router sends: an
    asymmetric outage loses frames silently and the routers are not told (a half-dead path
    that no transport has noticed yet); a symmetric outage closes the links at both ends.
    """

    links: tuple[str, ...]
    at: float | None = None
    until: float | None = None
    down: float | None = None
    up: float | None = None
    start: float | None = None
    direction: str | None = None
    bandwidth: float | None = None
    delay: float | None = None
    loss: float | None = None

    @property
    def kind(self) -> str:
        if self.down is not None:
            return "repeat"
        if self.bandwidth is not None or self.delay is not None or self.loss is not None:
            return "set"
        return "outage"

    def outages(self, horizon: float) -> list[tuple[float, float]]:
        """The (down, up) intervals of an outage or repeat fault that start before horizon."""
        if self.kind == "outage":
            assert self.at is not None
            return [(self.at, self.until if self.until is not None else math.inf)]
        if self.kind != "repeat":
            return []
        assert self.start is not None and self.down is not None and self.up is not None
        out = []
        end = self.until if self.until is not None else math.inf
        t = self.start
        while t < min(end, horizon):
            out.append((t, min(t + self.down, end)))
            t += self.down + self.up
        return out


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    faults: tuple[Fault, ...] = ()
    duration: float | None = None  #: suggested run length, seconds


@dataclass(frozen=True)
class Topology:
    name: str
    description: str = ""
    defaults: Defaults = Defaults()
    sites: tuple[Site, ...] = ()
    routers: tuple[RouterSpec, ...] = ()
    endpoints: tuple[EndpointSpec, ...] = ()
    links: tuple[LinkSpec, ...] = ()
    location_services: tuple[LocationService, ...] = ()
    faults: tuple[Fault, ...] = ()  #: applied in every scenario (and with none)
    scenarios: tuple[Scenario, ...] = ()
    duration: float | None = None
    source: str = field(default="<string>", compare=False)

    # lookups ----------------------------------------------------------------------------
    def router(self, name: str) -> RouterSpec:
        for r in self.routers:
            if r.name == name:
                return r
        raise KeyError(f"no router {name!r} in topology {self.name!r}")

    def endpoint(self, name: str) -> EndpointSpec:
        for e in self.endpoints:
            if e.name == name:
                return e
        raise KeyError(f"no endpoint {name!r} in topology {self.name!r}")

    def link(self, name: str) -> LinkSpec:
        for lk in self.links:
            if lk.name == name:
                return lk
        raise KeyError(f"no link {name!r} in topology {self.name!r}")

    def scenario(self, name: str) -> Scenario:
        for s in self.scenarios:
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.scenarios) or "none"
        raise KeyError(f"no scenario {name!r} in topology {self.name!r} (known: {known})")

    def links_of(self, router: str) -> list[LinkSpec]:
        return [lk for lk in self.links if router in (lk.a, lk.b)]

    def neighbours(self, router: str) -> list[str]:
        return [lk.other(router) for lk in self.links_of(router)]

    def endpoints_of(self, router: str) -> list[EndpointSpec]:
        return [e for e in self.endpoints if e.router == router]

    def faults_for(self, scenario: str | None = None) -> tuple[Fault, ...]:
        """The base faults plus those of *scenario* (None: base faults only)."""
        if scenario is None:
            return self.faults
        return self.faults + self.scenario(scenario).faults

    def router_params(self, router: str) -> dict[str, float]:
        """ROUTER_PARAMS for *router*: defaults.router overlaid with the router's own."""
        out = dict(self.defaults.router.params)
        out.update(dict(self.router(router).params))
        return out

    def listen_address(self, router: str) -> tuple[str, int]:
        """(host, port) a launcher should make *router* listen on."""
        for i, r in enumerate(self.routers):
            if r.name == router:
                off = r.port_offset if r.port_offset is not None else i
                return (r.host or self.defaults.router.host,
                        self.defaults.router.base_port + off)
        raise KeyError(f"no router {router!r} in topology {self.name!r}")

    def lsids(self) -> list[int]:
        return sorted({ls.lsid for ls in self.location_services})

    # writing -------------------------------------------------------------------------------
    def to_toml(self) -> str:
        return _dump(self)

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml(), encoding="utf-8")


# ============================================================================ locating lines


class _Locator:
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


# ============================================================================ parsing


_UNITS_TIME = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
_UNITS_BW = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_BW_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmg]?)\s*(?:bit/s|bps|b/s)?\s*$",
                    re.IGNORECASE)
_TIME_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(us|ms|s|min)\s*$",
                      re.IGNORECASE)


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self._loc: _Locator | None = None

    # errors ---------------------------------------------------------------------------------
    def fail(self, path: tuple[Any, ...], message: str) -> TopologyError:
        if self._loc is None:
            self._loc = _Locator(self.text)
        return TopologyError(message, self.source, self._loc.line_of(path))

    @staticmethod
    def where(path: tuple[Any, ...]) -> str:
        out = ""
        for p in path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out

    def table(self, value: Any, path: tuple[Any, ...], what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"{what} must be a table, got {_tname(value)}")
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
        if not isinstance(value, str) or not _NAME_RE.match(value):
            raise self.fail(path, f"{what} must be a name of letters, digits, '_', '-' or "
                                  f"'.', got {value!r}")
        return value

    def text_(self, value: Any, path: tuple[Any, ...], what: str) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"{what} must be a string, got {_tname(value)}")
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
            raise self.fail(path, f"{what} must be a number, got {_tname(value)} {value!r}")
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
            raise self.fail(path, f"{what} must be an integer, got {_tname(value)} {value!r}")
        if value < lo or (hi is not None and value > hi):
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise self.fail(path, f"{what} must be {rng}, got {value}")
        return value

    def lsid(self, value: Any, path: tuple[Any, ...], what: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(path, f"{what} must be an integer LSID (e.g. 0x10), got "
                                  f"{_tname(value)} {value!r}")
        if not 1 <= value <= _MAX_LSID:
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
    def parse(self) -> Topology:
        try:
            doc = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            msg = str(exc)
            m = re.search(r"\(at line (\d+), column \d+\)", msg)
            line = int(m.group(1)) if m else None
            if m is None and "end of document" in msg:
                line = self.text.count("\n") + 1
            msg = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", msg)
            raise TopologyError(f"TOML syntax error: {msg}", self.source, line) from None
        top_keys = ("name", "description", "duration", "defaults", "sites", "routers",
                    "endpoints", "links", "location_services", "faults", "scenarios")
        self.keys(doc, (), top_keys, "the topology")
        name = self.name(doc.get("name", Path(self.source).stem if self.source[:1] != "<"
                                 else "topology"), ("name",), "topology name")
        description = self.text_(doc.get("description", ""), ("description",), "description")
        duration = None
        if "duration" in doc:
            duration = self.number(doc["duration"], ("duration",), "duration", lo_open=True,
                                   time=True)
        defaults = self.defaults(doc.get("defaults", {}))
        sites = self.sites(doc.get("sites", []))
        site_names = {s.name for s in sites}
        routers = self.routers(doc.get("routers", []), site_names, defaults)
        rnames = [r.name for r in routers]
        links = self.links(doc.get("links", []), rnames, defaults)
        endpoints = self.endpoints(doc.get("endpoints", []), rnames, defaults)
        routers, lss = self.location_services(doc.get("location_services", []), routers)
        self.check_routes(routers, links)
        link_ends = {lk.name: (lk.a, lk.b) for lk in links}
        faults = self.faults(doc.get("faults", []), ("faults",), link_ends)
        scenarios = self.scenarios(doc.get("scenarios", {}), link_ends)
        self.check_ports(routers, defaults)
        return Topology(name=name, description=description, defaults=defaults,
                        sites=sites, routers=routers, endpoints=endpoints, links=links,
                        location_services=lss, faults=faults, scenarios=scenarios,
                        duration=duration, source=self.source)

    def array(self, value: Any, path: tuple[Any, ...], what: str) -> list[dict[str, Any]]:
        if not isinstance(value, list):
            raise self.fail(path, f"{what} must be an array of tables ([[{path[-1]}]]), got "
                                  f"{_tname(value)}")
        for i, item in enumerate(value):
            self.table(item, path + (i,), f"{what} #{i + 1}")
        return value

    def defaults(self, value: Any) -> Defaults:
        p = ("defaults",)
        tbl = self.table(value, p, "[defaults]")
        self.keys(tbl, p, ("link", "endpoint", "router"), "[defaults]")
        lk_t = self.table(tbl.get("link", {}), p + ("link",), "[defaults.link]")
        self.keys(lk_t, p + ("link",), ("transport", "bandwidth", "delay", "loss", "modifiers",
                                        "queue_limit"), "[defaults.link]")
        base = LinkDefaults()
        link = self.link_values(lk_t, p + ("link",), "[defaults.link]", base.transport,
                                base.bandwidth, base.delay, base.loss, base.modifiers,
                                base.queue_limit)
        link_d = LinkDefaults(*link)
        ep_t = self.table(tbl.get("endpoint", {}), p + ("endpoint",), "[defaults.endpoint]")
        self.keys(ep_t, p + ("endpoint",), ("bandwidth", "delay", "modifiers"),
                  "[defaults.endpoint]")
        eb = EndpointDefaults()
        ep_d = EndpointDefaults(*self.endpoint_values(ep_t, p + ("endpoint",),
                                                      "[defaults.endpoint]", eb.bandwidth,
                                                      eb.delay, eb.modifiers))
        r_t = self.table(tbl.get("router", {}), p + ("router",), "[defaults.router]")
        self.keys(r_t, p + ("router",), ("host", "base_port", *ROUTER_PARAMS),
                  "[defaults.router]")
        rb = RouterDefaults()
        host = self.text_(r_t.get("host", rb.host), p + ("router", "host"), "host")
        port = self.integer(r_t.get("base_port", rb.base_port), p + ("router", "base_port"),
                            "base_port", 1, 65535)
        params = self.params(r_t, p + ("router",), "[defaults.router]")
        return Defaults(link_d, ep_d, RouterDefaults(host, port, params))

    def link_values(self, tbl: dict[str, Any], path: tuple[Any, ...], what: str,
                    transport: str, bandwidth: float, delay: float, loss: float,
                    mods: Modifiers, queue_limit: int
                    ) -> tuple[str, float, float, float, Modifiers, int]:
        if "transport" in tbl:
            transport = tbl["transport"]
            if transport not in TRANSPORTS:
                raise self.fail(path + ("transport",), f"{what}: transport must be one of "
                                f"{', '.join(TRANSPORTS)}, got {transport!r}")
        if "bandwidth" in tbl:
            bandwidth = self.number(tbl["bandwidth"], path + ("bandwidth",),
                                    f"{what} bandwidth (bits/s)", bandwidth=True)
        if "delay" in tbl:
            delay = self.number(tbl["delay"], path + ("delay",), f"{what} delay (seconds)",
                                time=True)
        if "loss" in tbl:
            loss = self.number(tbl["loss"], path + ("loss",), f"{what} loss probability",
                               hi=1.0)
        if "modifiers" in tbl:
            mods = self.modifiers(tbl["modifiers"], path + ("modifiers",), what, mods)
        if "queue_limit" in tbl:
            queue_limit = self.integer(tbl["queue_limit"], path + ("queue_limit",),
                                       f"{what} queue_limit (bytes)", 0)
        return transport, bandwidth, delay, loss, mods, queue_limit

    def endpoint_values(self, tbl: dict[str, Any], path: tuple[Any, ...], what: str,
                        bandwidth: float, delay: float, mods: Modifiers
                        ) -> tuple[float, float, Modifiers]:
        if "bandwidth" in tbl:
            bandwidth = self.number(tbl["bandwidth"], path + ("bandwidth",),
                                    f"{what} bandwidth (bits/s)", bandwidth=True)
        if "delay" in tbl:
            delay = self.number(tbl["delay"], path + ("delay",), f"{what} delay (seconds)",
                                time=True)
        if "modifiers" in tbl:
            mods = self.modifiers(tbl["modifiers"], path + ("modifiers",), what, mods)
        return bandwidth, delay, mods

    def sites(self, value: Any) -> tuple[Site, ...]:
        out: list[Site] = []
        seen: set[str] = set()
        for i, tbl in enumerate(self.array(value, ("sites",), "sites")):
            p = ("sites", i)
            self.keys(tbl, p, ("name", "description"), f"site #{i + 1}", ("name",))
            name = self.name(tbl["name"], p + ("name",), "site name")
            if name in seen:
                raise self.fail(p + ("name",), f"duplicate site name {name!r}")
            seen.add(name)
            out.append(Site(name, self.text_(tbl.get("description", ""),
                                             p + ("description",), "description")))
        return tuple(out)

    def routers(self, value: Any, sites: set[str], defaults: Defaults
                ) -> tuple[RouterSpec, ...]:
        out: list[RouterSpec] = []
        seen: set[str] = set()
        allowed = ("name", "site", "core_lsids", "port_offset", "host", "routes",
                   "default_route", *ROUTER_PARAMS)
        for i, tbl in enumerate(self.array(value, ("routers",), "routers")):
            p = ("routers", i)
            self.keys(tbl, p, allowed, f"router #{i + 1}", ("name",))
            name = self.name(tbl["name"], p + ("name",), "router name")
            what = f"router {name!r}"
            if name in seen:
                raise self.fail(p + ("name",), f"duplicate router name {name!r}")
            seen.add(name)
            site = None
            if "site" in tbl:
                site = self.name(tbl["site"], p + ("site",), f"{what} site")
                if site not in sites:
                    raise self.fail(p + ("site",), f"{what}: unknown site {site!r} (known: "
                                                   f"{_known(sites)})")
            lsids = tbl.get("core_lsids", [])
            if not isinstance(lsids, list):
                raise self.fail(p + ("core_lsids",), f"{what}: core_lsids must be an array "
                                                     "of LSIDs, e.g. [0x10]")
            cores = tuple(sorted({self.lsid(v, p + ("core_lsids", j), f"{what} core LSID")
                                  for j, v in enumerate(lsids)}))
            port = None
            if "port_offset" in tbl:
                port = self.integer(tbl["port_offset"], p + ("port_offset",),
                                    f"{what} port_offset", 0, 65535)
            host = None
            if "host" in tbl:
                host = self.text_(tbl["host"], p + ("host",), f"{what} host")
            routes: list[tuple[int, str]] = []
            rv = tbl.get("routes", [])
            if not isinstance(rv, list):
                raise self.fail(p + ("routes",), f"{what}: routes must be an array of "
                                                 "{lsid = 0x10, via = \"router\"}")
            for j, r in enumerate(rv):
                rp = p + ("routes", j)
                rt = self.table(r, rp, f"{what} route #{j + 1}")
                self.keys(rt, rp, ("lsid", "via"), f"{what} route #{j + 1}", ("lsid", "via"))
                lsid = self.lsid(rt["lsid"], rp + ("lsid",), f"{what} route LSID")
                if any(lsid == x for x, _ in routes):
                    raise self.fail(rp + ("lsid",), f"{what}: two static routes for LSID "
                                                    f"{lsid:#x}")
                routes.append((lsid, self.name(rt["via"], rp + ("via",), f"{what} route via")))
            default_route = None
            if "default_route" in tbl:
                default_route = self.name(tbl["default_route"], p + ("default_route",),
                                          f"{what} default_route")
            params = self.params(tbl, p, what)
            merged = dict(defaults.router.params) | dict(params)
            if ("ping_after" in merged and "delete_after" in merged
                    and not merged["delete_after"] > merged["ping_after"]):
                raise self.fail(p, f"{what}: delete_after must be greater than ping_after "
                                   "(after applying [defaults.router])")
            out.append(RouterSpec(name, site, cores, port, host, tuple(routes), default_route,
                                  params))
        return tuple(out)

    def endpoints(self, value: Any, routers: list[str], defaults: Defaults
                  ) -> tuple[EndpointSpec, ...]:
        out: list[EndpointSpec] = []
        seen = set(routers)
        d = defaults.endpoint
        for i, tbl in enumerate(self.array(value, ("endpoints",), "endpoints")):
            p = ("endpoints", i)
            self.keys(tbl, p, ("name", "router", "roles", "bandwidth", "delay", "modifiers"),
                      f"endpoint #{i + 1}", ("name", "router"))
            name = self.name(tbl["name"], p + ("name",), "endpoint name")
            what = f"endpoint {name!r}"
            if name in seen:
                kind = "router" if name in routers else "endpoint"
                raise self.fail(p + ("name",), f"duplicate name {name!r} (already used by a "
                                               f"{kind}; routers and endpoints share names)")
            seen.add(name)
            router = self.name(tbl["router"], p + ("router",), f"{what} router")
            if router not in routers:
                raise self.fail(p + ("router",), f"{what}: unknown router {router!r} (known: "
                                                 f"{_known(routers)})")
            roles = tbl.get("roles", [])
            if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
                raise self.fail(p + ("roles",), f"{what}: roles must be an array of strings")
            bw, delay, mods = self.endpoint_values(tbl, p, what, d.bandwidth, d.delay,
                                                   d.modifiers)
            out.append(EndpointSpec(name, router, tuple(roles), bw, delay, mods))
        return tuple(out)

    def links(self, value: Any, routers: list[str], defaults: Defaults
              ) -> tuple[LinkSpec, ...]:
        out: list[LinkSpec] = []
        seen: set[str] = set()
        d = defaults.link
        rset = set(routers)
        allowed = ("name", "a", "b", "transport", "bandwidth", "delay", "loss", "modifiers",
                   "oneway", "queue_limit")
        for i, tbl in enumerate(self.array(value, ("links",), "links")):
            p = ("links", i)
            self.keys(tbl, p, allowed, f"link #{i + 1}", ("a", "b"))
            ends = []
            for end in ("a", "b"):
                r = self.name(tbl[end], p + (end,), f"link #{i + 1} end {end!r}")
                ends.append(r)
            a, b = ends
            name = tbl.get("name", f"{a}-{b}")
            name = self.name(name, p + ("name",) if "name" in tbl else p, "link name")
            what = f"link {name!r}"
            for end, r in (("a", a), ("b", b)):
                if r not in rset:
                    raise self.fail(p + (end,), f"{what}: unknown router {r!r} in {end!r} "
                                                f"(known: {_known(routers)})")
            if a == b:
                raise self.fail(p + ("b",), f"{what} connects router {a!r} to itself")
            if name in seen:
                raise self.fail(p + ("name",) if "name" in tbl else p,
                                f"duplicate link name {name!r} (give parallel links "
                                "distinct names with name = \"...\")")
            seen.add(name)
            values = self.link_values(tbl, p, what, d.transport, d.bandwidth, d.delay,
                                      d.loss, d.modifiers, d.queue_limit)
            oneway = tbl.get("oneway", False)
            if not isinstance(oneway, bool):
                raise self.fail(p + ("oneway",), f"{what}: oneway must be true or false")
            transport, bw, delay, loss, mods, ql = values
            out.append(LinkSpec(name, a, b, transport, bw, delay, loss, mods, oneway, ql))
        return tuple(out)

    def location_services(self, value: Any, routers: tuple[RouterSpec, ...]
                          ) -> tuple[tuple[RouterSpec, ...], tuple[LocationService, ...]]:
        by_name = {r.name: r for r in routers}
        cores: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        for i, tbl in enumerate(self.array(value, ("location_services",),
                                           "location_services")):
            p = ("location_services", i)
            self.keys(tbl, p, ("lsid", "name", "cores"), f"location service #{i + 1}",
                      ("lsid", "cores"))
            lsid = self.lsid(tbl["lsid"], p + ("lsid",), "location service lsid")
            if lsid in names:
                raise self.fail(p + ("lsid",), f"LSID {lsid:#x} has two [[location_services]] "
                                               "entries")
            names[lsid] = self.text_(tbl.get("name", ""), p + ("name",), "name")
            cl = tbl["cores"]
            if not isinstance(cl, list) or not cl:
                raise self.fail(p + ("cores",), f"location service {lsid:#x}: cores must be "
                                                "a non-empty array of router names")
            lst = cores.setdefault(lsid, [])
            for j, c in enumerate(cl):
                c = self.name(c, p + ("cores", j), "core router")
                if c not in by_name:
                    raise self.fail(p + ("cores", j), f"location service {lsid:#x}: unknown "
                                                      f"router {c!r} (known: "
                                                      f"{_known(list(by_name))})")
                if c not in lst:
                    lst.append(c)
        for r in routers:  # routers' own core_lsids join the placement
            for lsid in r.core_lsids:
                lst = cores.setdefault(lsid, [])
                if r.name not in lst:
                    lst.append(r.name)
                names.setdefault(lsid, "")
        order = [r.name for r in routers]
        new_routers = tuple(
            RouterSpec(r.name, r.site, tuple(sorted(lsid for lsid, cs in cores.items()
                                                    if r.name in cs)),
                       r.port_offset, r.host, r.routes, r.default_route, r.params)
            for r in routers)
        lss = tuple(LocationService(lsid, tuple(sorted(cores[lsid], key=order.index)),
                                    names[lsid]) for lsid in sorted(cores))
        return new_routers, lss

    def check_routes(self, routers: tuple[RouterSpec, ...], links: tuple[LinkSpec, ...]
                     ) -> None:
        for i, r in enumerate(routers):
            nbrs = {lk.other(r.name) for lk in links if r.name in (lk.a, lk.b)}
            for j, (lsid, via) in enumerate(r.routes):
                if via not in nbrs:
                    raise self.fail(("routers", i, "routes", j, "via"),
                                    f"router {r.name!r}: static route for LSID {lsid:#x} via "
                                    f"{via!r}, which is not a neighbour (neighbours: "
                                    f"{_known(nbrs)})")
            if r.default_route is not None and r.default_route not in nbrs:
                raise self.fail(("routers", i, "default_route"),
                                f"router {r.name!r}: default_route {r.default_route!r} is not "
                                f"a neighbour (neighbours: {_known(nbrs)})")

    def check_ports(self, routers: tuple[RouterSpec, ...], defaults: Defaults) -> None:
        used: dict[tuple[str, int], str] = {}
        for i, r in enumerate(routers):
            off = r.port_offset if r.port_offset is not None else i
            port = defaults.router.base_port + off
            if port > 65535:
                raise self.fail(("routers", i), f"router {r.name!r}: listen port {port} "
                                                "(base_port + port_offset) exceeds 65535")
            key = (r.host or defaults.router.host, port)
            if key in used:
                raise self.fail(("routers", i, "port_offset") if r.port_offset is not None
                                else ("routers", i),
                                f"router {r.name!r} would listen on port {port}, already "
                                f"used by router {used[key]!r}")
            used[key] = r.name

    def faults(self, value: Any, path: tuple[Any, ...], link_ends: dict[str, tuple[str, str]],
               where: str = "") -> tuple[Fault, ...]:
        if not isinstance(value, list):
            raise self.fail(path, f"{where}faults must be an array of tables")
        out = []
        for i, item in enumerate(value):
            out.append(self.fault(item, path + (i,), f"{where}fault #{i + 1}", link_ends))
        return tuple(out)

    def fault(self, item: Any, p: tuple[Any, ...], what: str,
              link_ends: dict[str, tuple[str, str]]) -> Fault:
        tbl = self.table(item, p, what)
        self.keys(tbl, p, ("link", "links", "at", "until", "down", "up", "start", "direction",
                           "bandwidth", "delay", "loss"), what)
        if ("link" in tbl) == ("links" in tbl):
            raise self.fail(p, f"{what} needs exactly one of 'link' or 'links'")
        if "link" in tbl:
            names = [tbl["link"]]
            lp = [p + ("link",)]
        else:
            if not isinstance(tbl["links"], list) or not tbl["links"]:
                raise self.fail(p + ("links",), f"{what}: links must be a non-empty array of "
                                                "link names")
            names = tbl["links"]
            lp = [p + ("links", j) for j in range(len(names))]
        for n, np_ in zip(names, lp):
            if not isinstance(n, str) or n not in link_ends:
                raise self.fail(np_, f"{what}: unknown link {n!r} (known: "
                                     f"{_known(list(link_ends))})")
        if len(set(names)) != len(names):
            raise self.fail(p, f"{what} names a link twice")

        def t(key: str, lo_open: bool = False) -> float | None:
            if key not in tbl:
                return None
            return self.number(tbl[key], p + (key,), f"{what} {key}", lo_open=lo_open,
                               time=True)

        at, until, down, up, start = t("at"), t("until"), t("down", True), t("up", True), \
            t("start")
        direction = None
        if "direction" in tbl:
            direction = tbl["direction"]
            for n in names:
                if direction not in link_ends[n]:
                    raise self.fail(p + ("direction",), f"{what}: direction {direction!r} is "
                                    f"not an end of link {n!r} ({' - '.join(link_ends[n])}); "
                                    "name the router whose outgoing frames are affected")
        setting = [k for k in ("bandwidth", "delay", "loss") if k in tbl]
        bw = dl = ls = None
        if "bandwidth" in tbl:
            bw = self.number(tbl["bandwidth"], p + ("bandwidth",), f"{what} bandwidth",
                             bandwidth=True)
        if "delay" in tbl:
            dl = self.number(tbl["delay"], p + ("delay",), f"{what} delay", time=True)
        if "loss" in tbl:
            ls = self.number(tbl["loss"], p + ("loss",), f"{what} loss probability", hi=1.0)
        repeating = [k for k in ("down", "up", "start") if k in tbl]
        if repeating:
            if "at" in tbl:
                raise self.fail(p + ("at",), f"{what}: 'at' is for one-off faults; a "
                                             "repeating fault uses start, down, up [, until]")
            missing = [k for k in ("down", "up", "start") if k not in tbl]
            if missing:
                raise self.fail(p, f"{what}: a repeating fault needs down, up and start "
                                   f"(missing {', '.join(missing)})")
            if setting:
                raise self.fail(p + (setting[0],), f"{what}: a repeating fault is an outage; "
                                f"'{setting[0]}' belongs in a one-off fault with at/until")
            assert start is not None
            if until is not None and until <= start:
                raise self.fail(p + ("until",), f"{what}: schedule times out of order: until "
                                                f"({until:g}) must be after start "
                                                f"({start:g})")
        else:
            if at is None:
                raise self.fail(p, f"{what} needs 'at' (a one-off fault) or start/down/up (a "
                                   "repeating outage)")
            if until is not None and until <= at:
                raise self.fail(p + ("until",), f"{what}: schedule times out of order: until "
                                                f"({until:g}) must be after at ({at:g})")
        return Fault(tuple(names), at, until, down, up, start, direction, bw, dl, ls)

    def scenarios(self, value: Any, link_ends: dict[str, tuple[str, str]]
                  ) -> tuple[Scenario, ...]:
        tbl = self.table(value, ("scenarios",), "[scenarios]")
        out = []
        for name, sc in tbl.items():
            p = ("scenarios", name)
            self.name(name, p, "scenario name")
            st = self.table(sc, p, f"scenario {name!r}")
            self.keys(st, p, ("description", "faults", "duration"), f"scenario {name!r}")
            desc = self.text_(st.get("description", ""), p + ("description",), "description")
            dur = None
            if "duration" in st:
                dur = self.number(st["duration"], p + ("duration",), f"scenario {name!r} "
                                  "duration", lo_open=True, time=True)
            faults = self.faults(st.get("faults", []), p + ("faults",), link_ends,
                                 f"scenario {name!r} ")
            out.append(Scenario(name, desc, faults, dur))
        return tuple(out)


def _tname(v: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a float"}.get(type(v), type(v).__name__)


def _known(names: Any) -> str:
    names = sorted(names)
    if not names:
        return "none"
    if len(names) > 8:
        return ", ".join(names[:8]) + f", ... ({len(names)} in all)"
    return ", ".join(names)


def loads(text: str, source: str = "<string>") -> Topology:
    """Parse and validate topology TOML *text*; *source* names it in error messages."""
    return _Parser(text, source).parse()


def load(path: str | Path) -> Topology:
    """Read and validate a topology file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"cannot read: {exc.strerror or exc}", str(p)) from None
    except UnicodeDecodeError as exc:
        raise TopologyError(f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                            str(p)) from None
    return loads(text, str(p))


def dumps(topo: Topology) -> str:
    return _dump(topo)


def dump(topo: Topology, path: str | Path) -> None:
    topo.dump(path)


# ============================================================================ writing


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _tstr(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _tkey(k: str) -> str:
    return k if _BARE_KEY.match(k) else _tstr(k)


def _tval(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v)) if v == 0 or abs(v) >= 1 else repr(v)
        return repr(v)
    if isinstance(v, str):
        return _tstr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_tval(x) for x in v) + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{_tkey(k)} = {_tval(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _hex(v: int) -> str:
    return f"{v:#x}"


def _mods(m: Modifiers, base: Modifiers | None = None) -> dict[str, int]:
    return {f.name: getattr(m, f.name) for f in fields(m)
            if base is None or getattr(m, f.name) != getattr(base, f.name)}


def _fault_dict(f: Fault) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if len(f.links) == 1:
        d["link"] = f.links[0]
    else:
        d["links"] = list(f.links)
    for k in ("at", "start", "down", "up", "until", "direction", "bandwidth", "delay",
              "loss"):
        v = getattr(f, k)
        if v is not None:
            d[k] = v
    return d


def _dump(t: Topology) -> str:
    L: list[str] = [f"# flownet topology {t.name!r} (written by flowrouter.testbed.topology)", ""]
    L.append(f"name = {_tstr(t.name)}")
    if t.description:
        L.append(f"description = {_tstr(t.description)}")
    if t.duration is not None:
        L.append(f"duration = {_tval(t.duration)}")
    d = t.defaults
    L += ["", "[defaults.link]"]
    L.append(f"transport = {_tstr(d.link.transport)}")
    L.append(f"bandwidth = {_tval(d.link.bandwidth)}")
    L.append(f"delay = {_tval(d.link.delay)}")
    L.append(f"loss = {_tval(d.link.loss)}")
    L.append(f"modifiers = {_tval(_mods(d.link.modifiers))}")
    L.append(f"queue_limit = {d.link.queue_limit}")
    L += ["", "[defaults.endpoint]"]
    L.append(f"bandwidth = {_tval(d.endpoint.bandwidth)}")
    L.append(f"delay = {_tval(d.endpoint.delay)}")
    L.append(f"modifiers = {_tval(_mods(d.endpoint.modifiers))}")
    L += ["", "[defaults.router]"]
    L.append(f"host = {_tstr(d.router.host)}")
    L.append(f"base_port = {d.router.base_port}")
    for k, v in d.router.params:
        L.append(f"{k} = {_tval(v)}")
    for s in t.sites:
        L += ["", "[[sites]]", f"name = {_tstr(s.name)}"]
        if s.description:
            L.append(f"description = {_tstr(s.description)}")
    for r in t.routers:
        L += ["", "[[routers]]", f"name = {_tstr(r.name)}"]
        if r.site is not None:
            L.append(f"site = {_tstr(r.site)}")
        if r.core_lsids:
            L.append("core_lsids = [" + ", ".join(_hex(x) for x in r.core_lsids) + "]")
        if r.port_offset is not None:
            L.append(f"port_offset = {r.port_offset}")
        if r.host is not None:
            L.append(f"host = {_tstr(r.host)}")
        if r.routes:
            L.append("routes = [" + ", ".join(
                f"{{ lsid = {_hex(lsid)}, via = {_tstr(via)} }}" for lsid, via in r.routes)
                + "]")
        if r.default_route is not None:
            L.append(f"default_route = {_tstr(r.default_route)}")
        for k, v in r.params:
            L.append(f"{k} = {_tval(v)}")
    ed = d.endpoint
    for e in t.endpoints:
        L += ["", "[[endpoints]]", f"name = {_tstr(e.name)}", f"router = {_tstr(e.router)}"]
        if e.roles:
            L.append(f"roles = {_tval(list(e.roles))}")
        if e.bandwidth != ed.bandwidth:
            L.append(f"bandwidth = {_tval(e.bandwidth)}")
        if e.delay != ed.delay:
            L.append(f"delay = {_tval(e.delay)}")
        m = _mods(e.modifiers, ed.modifiers)
        if m:
            L.append(f"modifiers = {_tval(m)}")
    ld = d.link
    for lk in t.links:
        L += ["", "[[links]]"]
        if lk.name != f"{lk.a}-{lk.b}":
            L.append(f"name = {_tstr(lk.name)}")
        L.append(f"a = {_tstr(lk.a)}")
        L.append(f"b = {_tstr(lk.b)}")
        for k in ("transport", "bandwidth", "delay", "loss", "queue_limit"):
            v = getattr(lk, k)
            if v != getattr(ld, k):
                L.append(f"{k} = {_tval(v)}")
        m = _mods(lk.modifiers, ld.modifiers)
        if m:
            L.append(f"modifiers = {_tval(m)}")
        if lk.oneway:
            L.append("oneway = true")
    for ls in t.location_services:
        L += ["", "[[location_services]]", f"lsid = {_hex(ls.lsid)}"]
        if ls.name:
            L.append(f"name = {_tstr(ls.name)}")
        L.append(f"cores = {_tval(list(ls.cores))}")
    for f in t.faults:
        L += ["", "[[faults]]"]
        for k, v in _fault_dict(f).items():
            L.append(f"{k} = {_tval(v)}")
    for sc in t.scenarios:
        L += ["", f"[scenarios.{_tkey(sc.name)}]"]
        if sc.description:
            L.append(f"description = {_tstr(sc.description)}")
        if sc.duration is not None:
            L.append(f"duration = {_tval(sc.duration)}")
        L.append("faults = [")
        for f in sc.faults:
            L.append(f"  {_tval(_fault_dict(f))},")
        L.append("]")
    return "\n".join(L) + "\n"
