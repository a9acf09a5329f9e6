"""Reading a router's TOML configuration file into a checked NodeConfig (the file format).

Example (every key optional except ``router.name``)::

    [router]
    name = "r1"
    listen = "127.0.0.1:7001"     # TCP for routers and endpoints; "" disables; or a list
    router_listen = ["10.0.0.1:7001"]  # only routers may connect here (optional)
    app_listen = ["127.0.0.1:7002"]    # only applications may connect here (optional)
    udp = "127.0.0.1:7001"        # UDP links (optional)
    app_udp = "127.0.0.1:7011"    # datagram links for applications (flowlib udp://...)
    control = "127.0.0.1:7101"    # status/control interface (optional)
    http = "127.0.0.1:8001"       # /healthz /status /metrics; default "auto": 127.0.0.1 on
                                  # the listen port + 1000; "off": none
    core_lsids = [0x10]           # this router is the core for these LSIDs
    direct_lsids = []             # of those, ones whose members are a full mesh that never
                                  #   relays (a broken member link is not routed around)
    default_lsid = 0x10           # suggested to endpoints for new flows
    max_payload = 65536
    max_link_buffer = 16777216    # bytes queued per link before frames are dropped (counted)
    read_buffer = 1048576         # the largest a TCP link's read buffer grows (64 KiB at first)
    write_threads = "auto"        # threads besides the loop's that write a large fan-out
                                  #   (auto: cores - 1, at most 3; 0: none)
    slow_consumer_bytes = 8388608 # data one output may queue; past it its frames are dropped
    slow_consumer_grace = 10.0    # seconds over that limit before the link is closed
    slow_consumer_stall = 0.5     # seconds without progress before an output holds no credit
    slow_consumer_idle = 0.02     # ... or this long, while a sibling fed by the same input drains
    frame_timeout = 30.0          # seconds a started frame may take to arrive in full
    reconnect_min = 0.1           # re-dial back-off: from this, doubling ...
    reconnect_max = 5.0           # ... up to this (starts over once a link stayed up)
    dial_timeout = 4.0            # seconds a dial may wait for the peer to answer
    member_notice_interval = 1.0  # band-19 membership notices: at most one per flow per this
    member_refresh = 30.0         #   many seconds; snapshots of local members this often
    control_token = "file:/etc/flownet/control.token"  # commands need proof (see below;
                                  #   `flowrouter ctl --token-file` signs them)
    # routers this one accepts links from without link keys, besides its peers: "name@host"
    # ("*@host": any router name from that host, for hosts you control)
    accept_routers = ["r3@10.0.0.3"]

    [measured_locality]           # present: router links' delay/bandwidth modifiers follow
    delay_unit = 0.005            #   measured RTT (liveness echo); seconds one way per unit
    hysteresis = 0.25             #   units past a unit's range before it moves; also alpha,
    hold = 5.0                    #   min_samples, delay_min/max, bandwidth_ref/step/max

    [quota]                       # per principal: proven name, or source host if anonymous
    flows = 4096                  # flows held over all of its connections
    joins_per_second = 500.0      # sustained joins (token bucket) ...
    join_burst = 1000             # ... and the burst allowed
    connections_per_host = 256    # application connections from one host at once
    flow_notices = 16             # refused joins of different flows told to their members
                                  #   (Fault LIMIT, band 17) per limit and 5 s; 0: none
    policies = 256                # flows (or creators) one principal may install policies for

    [gc]                          # soft state: liveness, refresh digests, hold times
    liveness_interval = 1.0       # an ECHO on every link this often
    dead_after = 3.0              # a peer silent this long is a failed link
    refresh_interval = 10.0       # a refresh digest round toward each upstream this often
    hold_factor = 3.5             # state not refreshed for hold_factor x refresh_interval goes
    max_refresh_rate = 20000      # digest entries/s per link at most (huge tables: longer rounds)
    epoch = 5.0                   # seconds per epoch (trace snapshots)
    # ping_after, delete_after: the seed's per-flow ping GC; accepted, ignored, warned about

    [limits]                      # what one client can make the router hold or do
    listen_connections = 4096     # connections at once per TCP listen port (proven routers
                                  #   not counted)
    control_connections = 64      # ... on the control port, and on the HTTP monitor
    http_connections = 64
    control_idle = 60.0           # a silent control connection is closed after this long
    http_idle = 10.0              # an HTTP request must arrive within this
    descriptor_reserve = 64       # descriptors kept for routers, dialling and fail-over
    descriptors = 0               # descriptors to use (0: RLIMIT_NOFILE, soft raised to hard)
    work_per_tick = 20000         # digest entries processed per tick over all links
    work_backlog = 65536          # digest entries one application may have waiting
    control_per_tick = 1024       # control messages one application may have handled a tick

    [[peer]]                      # routers this one dials (and keeps re-dialling)
    name = "r2"
    address = "127.0.0.1:7002"
    transport = "tcp"             # or "udp"
    locality = { delay = 1, geography = 3 }

    [routes]                      # static LS routes (normally learned automatically)
    0x20 = "r2"
    default = "r2"

    [region]                      # this router is an edge of a backbone region: end flows
    name = "backbone"             #   cross it inside aggregate flows (README, "Backbone
    edges = ["e00", "e01"]        #   regions"); every edge of the region, this one included
    group_size = 5                # edges per aggregate group; max_extra = 1: edges without
    exits = { "0x10" = "e00" }    #   members one copy may reach; optional: LSID -> its exit
                                  #   edge, fixed by hand (else learned from LS routes)
    routers = ["c00", "e00", "e01"]  # the region's routers: its own flows come only from them

    [trace]                       # trace records for `flowtrace analyze` (optional)
    dir = "/var/log/flownet"      # <dir>/<router>.trace.jsonl, rotated
    sample = 0.01                 # fraction of forwarding decisions recorded
    rotate_bytes = 67108864

    [link_auth]                   # authenticated (and optionally encrypted) links
    key_id = "site-2026"          # the key this router proves itself with
    encrypt = false               # seal TCP links with ChaCha20-Poly1305 after the handshake
    require_endpoints = false     # applications must authenticate too
    rekey_records = 16777216      # an encrypted link moves to a new key after this many
    rekey_seconds = 300.0         #   records it sent, and after this many seconds (the
                                  #   first that comes; both directions, each on its own)
    allow_unsealed_udp = false    # UDP links are never sealed: with keys, a UDP [[peer]] is a
                                  #   config error and authenticated UDP links are refused,
                                  #   unless this accepts them (proven at the handshake only)
    [link_auth.keys]              # key id -> "hex:..." | "base64:..." | "file:PATH"
    site-2026 = "hex:00112233..."

    [[emulate]]                   # link emulation toward a peer (by name), any direction
    peer = "r2"
    bandwidth = 56000             # bits/s
    delay = 0.05                  # seconds, one way
    loss = 0.01                   # probability a frame is lost

Every value is type- and range-checked; every error names the file and the key that is wrong.

May import :mod:`flowrouter.net.config` and :mod:`flowrouter.net.configtables`.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any

from flowrouter.core.tables import Modifiers
from flowrouter.net.config import ConfigError, Emulation, NodeConfig, PeerConfig
from flowrouter.net.configtables import (
    address,
    check_keys,
    flag,
    gc_table,
    ignored_keys,
    limit,
    limits_table,
    link_auth_table,
    listen,
    measured_locality_table,
    parse_lsid,
    quota_table,
    region_table,
    text,
    trace_table,
)

log = logging.getLogger("flowrouter.net.config")


#: [router] keys that map 1:1 onto NodeConfig fields, each with its type and range check
_ROUTER_CHECKS: dict[str, Any] = {
    "name": text, "listen": listen, "router_listen": listen, "app_listen": listen,
    "udp": address, "app_udp": address, "control": address,
    "http": lambda v, where: v if v in ("auto", "off") else address(v, where),
    "node_id": limit(int, 1, (1 << 64) - 1),
    "max_payload": limit(int, 1, 0xFFFFFFFF),
    "max_link_buffer": limit(int, 1024, 1 << 40),
    "link_credit": limit(int, 1024, 1 << 40),
    "max_flows_per_endpoint": limit(int, 1, 1 << 32),
    "join_timeout": limit(float, 0.001, 3600.0),
    "max_flows": limit(int, 1, 1 << 40),
    "tick_interval": limit(float, 0.001, 60.0),
    "reconnect_min": limit(float, 0.001, 3600.0),
    "reconnect_max": limit(float, 0.001, 86400.0),
    "dial_timeout": limit(float, 0.001, 3600.0),
    "udp_idle_timeout": limit(float, 0.01, 86400.0),
    "udp_socket_buffer": limit(int, 0, 1 << 30),
    "udp_bundle": lambda v, where: v if v == "auto" else limit(int, 0, 65507)(v, where),
    "read_buffer": limit(int, 64 * 1024, 1 << 30),
    "write_threads": lambda v, where: v if v == "auto" else limit(int, 0, 64)(v, where),
    "slow_consumer_bytes": limit(int, 1024, 1 << 40),
    "slow_consumer_grace": limit(float, 0.001, 86400.0),
    "slow_consumer_stall": limit(float, 0.001, 86400.0),
    "slow_consumer_idle": limit(float, 0.0, 86400.0),
    "frame_timeout": limit(float, 0.001, 86400.0),
    "control_token": lambda v, where: text(v, where) or None,
    "control_link_keys": flag,
    "member_notice_interval": limit(float, 0.001, 3600.0),
    "member_refresh": limit(float, 0.001, 86400.0),
}


_ROUTER_KEYS = set(_ROUTER_CHECKS) | {"core_lsids", "direct_lsids", "default_lsid",
                                      "endpoint_locality",
                                      "accept_routers"}
_PEER_KEYS = {"name", "address", "transport", "locality", "bandwidth", "delay", "loss"}


def _as_list(value: Any) -> list[str]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def config_from_dict(data: dict[str, Any], config_dir: str | None = None) -> NodeConfig:
    """A checked NodeConfig from a parsed TOML document; relative key files are looked up
    in *config_dir* (the config file's directory)."""
    check_keys(data, {"router", "gc", "peer", "routes", "emulate", "trace", "link_auth",
                       "quota", "measured_locality", "limits",
                       "region"}, "the top level")
    router = dict(data.get("router") or {})
    check_keys(router, _ROUTER_KEYS, "[router]")
    if "name" not in router:
        raise ConfigError("[router] needs a name")
    kw: dict[str, Any] = {"config_dir": config_dir}
    for key, check in _ROUTER_CHECKS.items():
        if key in router:
            kw[key] = check(router[key], f"[router] {key}")
    if isinstance(kw.get("listen"), list):  # the first address, then the others
        kw["listen"], kw["extra_listen"] = kw["listen"][0], kw["listen"][1:]
    for key in ("router_listen", "app_listen"):
        if key in kw:
            kw[key] = [a for a in _as_list(kw[key]) if a]
    if "accept_routers" in router:
        if not isinstance(router["accept_routers"], list):
            raise ConfigError('[router] accept_routers must be a list of "name@host"')
        kw["accept_routers"] = [str(e) for e in router["accept_routers"]]
    for section in (quota_table, measured_locality_table, gc_table, link_auth_table,
                    trace_table, limits_table, region_table):
        kw.update(section(data))
    kw["core_lsids"] = frozenset(parse_lsid(v, "[router] core_lsids")
                                 for v in router.get("core_lsids", []))
    kw["direct_lsids"] = frozenset(parse_lsid(v, "[router] direct_lsids")
                                   for v in router.get("direct_lsids", []))
    if not kw["direct_lsids"] <= kw["core_lsids"]:
        raise ConfigError("[router] direct_lsids must be among core_lsids")
    if "default_lsid" in router:
        kw["default_lsid"] = parse_lsid(router["default_lsid"], "[router] default_lsid")
    try:
        kw["endpoint_modifiers"] = Modifiers.from_mapping(router.get("endpoint_locality"))
    except ValueError as exc:
        raise ConfigError(f"[router] endpoint_locality: {exc}") from None
    peers = []
    for i, peer in enumerate(data.get("peer") or []):
        where = f"[[peer]] #{i + 1}"
        if not isinstance(peer, dict):
            raise ConfigError(f"{where} must be a table")
        check_keys(peer, _PEER_KEYS, where)
        if "address" not in peer:
            raise ConfigError(f"{where} needs an address")
        text(peer["address"], f"{where} address")
        if "name" in peer:
            text(peer["name"], f"{where} name")
        if "transport" in peer:
            text(peer["transport"], f"{where} transport")
        try:
            mods = Modifiers.from_mapping(peer.get("locality"))
            emu = Emulation.from_mapping({k: peer[k] for k in ("bandwidth", "delay", "loss")
                                          if k in peer}, where)
            peers.append(PeerConfig(address=str(peer["address"]), name=peer.get("name"),
                                    transport=peer.get("transport", "tcp"), modifiers=mods,
                                    emulation=emu))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    kw["peers"] = peers
    emulation = {}
    for i, table in enumerate(data.get("emulate") or []):
        where = f"[[emulate]] #{i + 1}"
        if not isinstance(table, dict) or "peer" not in table:
            raise ConfigError(f"{where} needs a peer (the neighbour's router name)")
        emulation[str(table["peer"])] = Emulation.from_mapping(table, where)
    kw["emulation"] = emulation
    routes = dict(data.get("routes") or {})
    if "default" in routes:
        kw["default_route"] = str(routes.pop("default"))
    kw["routes"] = {parse_lsid(k, f"[routes] {k}"): str(v) for k, v in routes.items()}
    try:
        return NodeConfig(**kw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def load_config(path: str | Path) -> NodeConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                          ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for why in ignored_keys(data):  # accepted, so old configs still start, but never silently
        log.warning("%s: %s", path, why)
    try:
        cfg = config_from_dict(data, str(path.parent))
        cfg.params()  # key files are read (and their permissions checked) now
        return cfg
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
