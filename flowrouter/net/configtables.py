"""The router config's value checks and its self-contained tables: ``[quota]``, ``[gc]``,
``[measured_locality]``, ``[link_auth]``, ``[trace]``, ``[limits]`` and ``[region]``.

Each ``*_table`` function takes the parsed TOML document and returns the
:class:`~flowrouter.net.config.NodeConfig` keyword arguments that table sets, after checking
every key's type and range (a :class:`ConfigError` names the table and the key). The key
reference for all tables is :mod:`flowrouter.net.configfile`'s docstring; this module only
parses. May import :mod:`flowrouter.wire` and the standard library.
"""

from __future__ import annotations

from typing import Any

from flowrouter.wire.address import AddressError as ConfigError
from flowrouter.wire.address import parse_address
from flowrouter.wire.linkrecords import SEQ_MASK

#: [quota] keys, each with its type and range (QuotaLimits checks how they relate)
QUOTA_RANGES: dict[str, tuple[type, float, float]] = {
    "flows": (int, 1, 1 << 40), "joins_per_second": (float, 0.001, 1e9),
    "join_burst": (int, 1, 1 << 40), "connections_per_host": (int, 1, 1 << 32),
    "flow_notices": (int, 0, 1 << 20), "policies": (int, 1, 1 << 20)}
QUOTA_KEYS = set(QUOTA_RANGES)
GC_KEYS = {"epoch", "ping_after", "delete_after", "liveness_interval", "dead_after",
           "refresh_interval", "hold_factor", "max_refresh_rate"}
LINK_AUTH_KEYS = {"key_id", "encrypt", "require_endpoints", "keys", "rekey_records",
                  "rekey_seconds", "allow_unsealed_udp"}
#: shortest rekey interval accepted: shorter buys nothing and burns key generations
MIN_REKEY_SECONDS = 0.01
TRACE_KEYS = {"dir", "sample", "rotate_bytes"}
#: [limits] keys (flowrouter.net.connlimits.ServerLimits), each with its type and range
LIMITS_RANGES: dict[str, tuple[type, float, float]] = {
    "work_per_tick": (int, 1, 1 << 30), "work_backlog": (int, 0, 1 << 30),
    "control_per_tick": (int, 1, 1 << 30),
    "listen_connections": (int, 1, 1 << 24), "control_connections": (int, 1, 1 << 20),
    "http_connections": (int, 1, 1 << 20), "control_idle": (float, 0.01, 86400.0),
    "http_idle": (float, 0.01, 3600.0), "descriptor_reserve": (int, 0, 1 << 20),
    "descriptors": (int, 0, 1 << 30)}
REGION_KEYS = {"name", "edges", "group_size", "max_extra", "lsid_base", "exits", "locality",
               "routers"}
#: keys still accepted (old configs keep starting) that change nothing, each with what to use
#: instead: loading a file that sets one logs a warning naming it (check-config shows it too)
IGNORED_KEYS: dict[tuple[str, str], str] = {
    ("gc", "ping_after"): "the seed's per-flow pings are gone: every link carries a liveness "
                          "echo each liveness_interval, which keeps NAT mappings alive",
    ("gc", "delete_after"): "state nobody refreshes goes after hold_factor x "
                            "refresh_interval, a peer silent for dead_after is a failed link",
}


def ignored_keys(data: dict[str, Any]) -> list[str]:
    """One warning per key of *data* that is accepted but ignored (:data:`IGNORED_KEYS`)."""
    out = []
    for (table, key), instead in IGNORED_KEYS.items():
        section = data.get(table)
        if isinstance(section, dict) and key in section:
            out.append(f"[{table}] {key} is ignored ({instead}); remove it")
    return out


def check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)} in {where}; allowed: "
                          f"{', '.join(sorted(allowed))}")


def parse_lsid(value: Any, where: str) -> int:
    try:
        out = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {value!r} is not an LSID (use e.g. 16 or 0x10)") from None
    if not 0 < out < 1 << 32:
        raise ConfigError(f"{where}: LSID {value!r} must be 1..0xffffffff")
    return out


def number(value: Any, where: str, kind: type, lo: float, hi: float) -> Any:
    """*value* as an int (or float) within lo..hi, else a ConfigError naming *where*."""
    ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{where} must be {what}, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{where} must be within {lo:{'d' if kind is int else 'g'}}.."
                          f"{hi:{'d' if kind is int else 'g'}}, got {value!r}")
    return kind(value)


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    return value


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def address(value: Any, where: str) -> str | None:
    """An address string; "" disables the listener."""
    out = text(value, where)
    if out:
        parse_address(out, where)
    return out or None


def listen(value: Any, where: str) -> Any:
    """One address or a list of them (a router on several interfaces)."""
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{where} must not be an empty list (use \"\" for no listener)")
        return [address(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return address(value, where)


def limit(kind: type, lo: float, hi: float) -> Any:
    return lambda v, where: number(v, where, kind, lo, hi)


def _table(data: dict[str, Any], name: str, allowed: set[str] | None) -> dict[str, Any]:
    table = data.get(name) or {}
    if not isinstance(table, dict):
        raise ConfigError(f"[{name}] must be a table")
    if allowed is not None:
        check_keys(table, allowed, f"[{name}]")
    return dict(table)


def quota_table(data: dict[str, Any]) -> dict[str, Any]:
    """``[quota]``: limits per principal (checked by QuotaLimits when NodeConfig is built)."""
    quota = _table(data, "quota", QUOTA_KEYS)
    checked = {key: number(value, f"[quota] {key}", *QUOTA_RANGES[key])
               for key, value in quota.items()}
    return {"quota": checked} if checked else {}


def measured_locality_table(data: dict[str, Any]) -> dict[str, Any]:
    """``[measured_locality]``: present (even empty) turns measured modifiers on."""
    if "measured_locality" not in data:
        return {}
    return {"locality_mapping": _table(data, "measured_locality", None)}


def gc_table(data: dict[str, Any]) -> dict[str, Any]:
    """``[gc]``: soft-state timers and the (ignored) seed GC thresholds."""
    gc = _table(data, "gc", GC_KEYS)
    kw: dict[str, Any] = {}
    if "epoch" in gc:
        kw["epoch"] = number(gc["epoch"], "[gc] epoch", float, 0.001, 86400.0)
    if "ping_after" in gc:
        kw["gc_ping_after"] = number(gc["ping_after"], "[gc] ping_after", int, 1, 10_000)
    if "delete_after" in gc:
        kw["gc_delete_after"] = number(gc["delete_after"], "[gc] delete_after", int, 1,
                                       10_000)
    for key, top in (("liveness_interval", 3600.0), ("dead_after", 86400.0),
                     ("refresh_interval", 86400.0), ("hold_factor", 1000.0),
                     ("max_refresh_rate", 1e9)):
        if key in gc:
            kw[key] = number(gc[key], f"[gc] {key}", float, 0.001, top)
    return kw


def link_auth_table(data: dict[str, Any]) -> dict[str, Any]:
    """``[link_auth]``: the key ring, the key this router proves itself with, encryption."""
    auth = _table(data, "link_auth", LINK_AUTH_KEYS)
    if not auth:
        return {}
    keys = auth.get("keys") or {}
    if not isinstance(keys, dict) or not keys:
        raise ConfigError("[link_auth] needs at least one key in [link_auth.keys]")
    kw: dict[str, Any] = {"link_keys": {str(k): str(v) for k, v in keys.items()}}
    if "key_id" in auth:
        if auth["key_id"] not in keys:
            raise ConfigError(f"[link_auth] key_id {auth['key_id']!r} is not one of "
                              f"[link_auth.keys] {sorted(keys)}")
        kw["link_key_id"] = str(auth["key_id"])
    kw["link_encrypt"] = flag(auth.get("encrypt", False), "[link_auth] encrypt")
    kw["link_auth_endpoints"] = flag(auth.get("require_endpoints", False),
                                     "[link_auth] require_endpoints")
    kw["link_unsealed_udp"] = flag(auth.get("allow_unsealed_udp", False),
                                   "[link_auth] allow_unsealed_udp")
    if "rekey_records" in auth:
        kw["link_rekey_records"] = number(auth["rekey_records"], "[link_auth] rekey_records",
                                          int, 1, SEQ_MASK)
    if "rekey_seconds" in auth:
        kw["link_rekey_seconds"] = number(auth["rekey_seconds"], "[link_auth] rekey_seconds",
                                          float, MIN_REKEY_SECONDS, 365 * 86400.0)
    return kw


def trace_table(data: dict[str, Any]) -> dict[str, Any]:
    """``[trace]``: where trace records go, how many, when files rotate."""
    trace = _table(data, "trace", TRACE_KEYS)
    kw: dict[str, Any] = {}
    if "dir" in trace:
        kw["trace_dir"] = text(trace["dir"], "[trace] dir")
    if "sample" in trace:
        sample = trace["sample"]
        if not isinstance(sample, (int, float)) or not 0 <= sample <= 1:
            raise ConfigError(f"[trace] sample must be a fraction 0..1, got {sample!r}")
        kw["trace_sample"] = float(sample)
    if "rotate_bytes" in trace:
        kw["trace_rotate_bytes"] = number(trace["rotate_bytes"], "[trace] rotate_bytes", int,
                                          4096, 1 << 40)
    return kw


def limits_table(data: dict[str, Any]) -> dict[str, Any]:
    """``[limits]``: connections per port, idle time-outs, descriptors, the work budget
    (checked again, as a whole, by ServerLimits)."""
    table = data.get("limits")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError("[limits] must be a table")
    check_keys(table, set(LIMITS_RANGES), "[limits]")
    return {"limits": {key: number(value, f"[limits] {key}", *LIMITS_RANGES[key])
                       for key, value in table.items()}}


def region_table(data: dict[str, Any]) -> dict[str, Any]:
    """``[region]``: this router is an edge of a backbone region (flowrouter.core.regions);
    checked here, turned into the core's RegionParams by NodeConfig."""
    if "region" not in data:
        return {}
    region = _table(data, "region", REGION_KEYS)
    for key in ("name", "edges"):
        if key not in region:
            raise ConfigError(f"[region] needs {key}")
    edges = region["edges"]
    if not isinstance(edges, list) or not edges:
        raise ConfigError("[region] edges must be a non-empty list of router names")
    out: dict[str, Any] = {"name": text(region["name"], "[region] name"),
                           "edges": tuple(sorted(text(e, "[region] edges") for e in edges))}
    routers = region.get("routers", [])
    if not isinstance(routers, list):
        raise ConfigError("[region] routers must be a list of router names")
    out["routers"] = tuple(sorted(text(r, "[region] routers") for r in routers))
    for key, lo, hi in (("group_size", 1, 16), ("max_extra", 0, 16)):
        if key in region:
            out[key] = number(region[key], f"[region] {key}", int, lo, hi)
    if "lsid_base" in region:
        out["lsid_base"] = parse_lsid(region["lsid_base"], "[region] lsid_base")
    exits = region.get("exits") or {}
    if not isinstance(exits, dict):
        raise ConfigError('[region] exits must be a table: {"0x10" = "edge name"}')
    out["exits"] = tuple(sorted((parse_lsid(k, f"[region] exits {k}"),
                                 text(v, f"[region] exits {k}")) for k, v in exits.items()))
    if "locality" in region:
        out["locality"] = dict(_table(region, "locality", {"bandwidth", "delay",
                                                           "geography"}))
    return {"region": out}
