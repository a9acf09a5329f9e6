"""Writing a topology back as TOML: :func:`dumps` / :func:`dump`, so that
``loads(dumps(t)) == t`` for every valid topology ``t``.

May import the model.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from flowrouter.core.tables import Modifiers
from flowrouter.testbed.topology.model import Fault, Topology

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
    for rg in t.regions:
        L += ["", "[[regions]]", f"name = {_tstr(rg.name)}",
              f"routers = {_tval(list(rg.routers))}", f"lsid_base = {_hex(rg.lsid_base)}",
              f"group_size = {rg.group_size}", f"max_extra = {rg.max_extra}"]
        if rg.modifiers != Modifiers():
            L.append(f"modifiers = {_tval(_mods(rg.modifiers))}")
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


def dumps(topo: Topology) -> str:
    """*topo* as canonical TOML: ``loads(dumps(t)) == t`` for every valid topology ``t``."""
    return _dump(topo)


def dump(topo: Topology, path: str | Path) -> None:
    """Write :func:`dumps` of *topo* to *path*."""
    Path(path).write_text(_dump(topo), encoding="utf-8")
