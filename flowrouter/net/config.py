"""Router daemon configuration: a TOML file (or CLI flags) turned into a checked NodeConfig.

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
    default_lsid = 0x10           # suggested to endpoints for new flows
    max_payload = 65536
    max_link_buffer = 16777216    # bytes queued per link before frames are dropped (counted)
    read_buffer = 1048576         # the largest a TCP link's read buffer grows (64 KiB at first)
    slow_consumer_bytes = 8388608 # data one output may queue; past it its frames are dropped
    slow_consumer_grace = 10.0    # seconds over that limit before the link is closed
    slow_consumer_stall = 0.5     # seconds without progress before an output holds no credit
    slow_consumer_idle = 0.0      # ... or this long, while a sibling fed by the same input drains
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
    exits = { "0x10" = "e00" }    #   members one copy may reach; LSID -> the edge toward it
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

Trust: on an overlay without ``[link_auth]`` keys a link may be a router only if this router
dialled it, or its HELLO name and source host match a ``[[peer]]`` (name and address host) or
an ``accept_routers`` entry; any other HELLO claiming ROUTER is refused. The control interface
serves status to anyone it is bound for; commands that change the router need a proof signed
with ``control_token`` (a link key only with ``control_link_keys``: :mod:`~flowrouter.net.
commandauth`) when a token is set or the interface is off loopback (refused without a secret).
"""

from __future__ import annotations

import hashlib
import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrouter.core.flowcontrol import FlowLimits
from flowrouter.core.measured import LocalityMapping
from flowrouter.core.quotas import QuotaLimits
from flowrouter.core.regions import RegionParams
from flowrouter.core.router import RouterParams
from flowrouter.core.tables import Modifiers
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
from flowrouter.net.connlimits import ServerLimits

# A bad config value and a bad address are one kind of operator error: one class, two names.
from flowrouter.wire.address import AddressError as ConfigError
from flowrouter.wire.address import parse_address
from flowrouter.wire.header import DEFAULT_MAX_PAYLOAD
from flowrouter.wire.linkrecords import DEFAULT_REKEY_INTERVAL, DEFAULT_REKEY_RECORDS, SEQ_MASK

log = logging.getLogger(__name__)

def node_id_for(name: str) -> int:
    """A stable 64-bit node ID derived from the router's name (used when none is configured)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") or 1


@dataclass(slots=True)
class Emulation:
    """What a link toward one peer should look like: slow, far, lossy, or cut."""

    bandwidth: float | None = None  #: bits per second (None: unlimited)
    delay: float = 0.0  #: one-way seconds added to every frame
    loss: float = 0.0  #: probability that a frame is silently lost (counted)
    down: bool = False  #: drop everything sent this way (an asymmetric cut)

    def __post_init__(self) -> None:
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ConfigError(f"emulated bandwidth must be positive, got {self.bandwidth}")
        if self.delay < 0:
            raise ConfigError(f"emulated delay must be >= 0, got {self.delay}")
        if not 0.0 <= self.loss <= 1.0:
            raise ConfigError(f"emulated loss must be within 0..1, got {self.loss}")

    @property
    def active(self) -> bool:
        return bool(self.bandwidth or self.delay or self.loss or self.down)

    def describe(self) -> str:
        parts = []
        if self.down:
            parts.append("down")
        if self.bandwidth:
            parts.append(f"{self.bandwidth / 1000:g} kbit/s")
        if self.delay:
            parts.append(f"{self.delay * 1000:g} ms delay")
        if self.loss:
            parts.append(f"{self.loss:.1%} loss")
        return ", ".join(parts) or "no emulation"

    @classmethod
    def from_mapping(cls, data: dict[str, Any], where: str) -> Emulation:
        unknown = set(data) - {"bandwidth", "delay", "loss", "down", "peer"}
        if unknown:
            raise ConfigError(f"{where}: unknown emulation key(s) {sorted(unknown)}; allowed: "
                              "bandwidth, delay, loss, down")
        try:
            bw = data.get("bandwidth")
            return cls(bandwidth=float(bw) if bw is not None else None,
                       delay=float(data.get("delay", 0.0)), loss=float(data.get("loss", 0.0)),
                       down=bool(data.get("down", False)))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None


@dataclass(slots=True)
class PeerConfig:
    address: str
    name: str | None = None
    transport: str = "tcp"
    modifiers: Modifiers = field(default_factory=Modifiers)
    emulation: Emulation = field(default_factory=Emulation)

    def __post_init__(self) -> None:
        parse_address(self.address, "peer address")
        if self.transport not in ("tcp", "udp"):
            raise ConfigError(f"peer {self.address}: transport must be tcp or udp, "
                              f"not {self.transport!r}")


@dataclass(slots=True)
class NodeConfig:
    name: str
    listen: str | None = "127.0.0.1:7000"
    #: more addresses for routers and applications alike (``listen`` given as a list)
    extra_listen: list[str] = field(default_factory=list)
    #: addresses that accept only routers / only applications (e.g. a site-facing interface
    #: for other routers and a loopback one for local applications)
    router_listen: list[str] = field(default_factory=list)
    app_listen: list[str] = field(default_factory=list)
    udp: str | None = None
    #: the UDP address applications reach this router on (flowlib's udp:// addresses)
    app_udp: str | None = None
    control: str | None = None
    #: HTTP monitoring (/healthz, /status, /metrics): HOST:PORT, "auto" (127.0.0.1, the listen
    #: port + 1000; see http_address) or None (off)
    http: str | None = "auto"
    node_id: int | None = None
    core_lsids: frozenset[int] = frozenset()
    default_lsid: int = 0
    routes: dict[int, str] = field(default_factory=dict)
    default_route: str | None = None
    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_link_buffer: int = 16 * 1024 * 1024
    #: bytes one input link may have waiting in output queues before we stop reading it
    link_credit: int = 1024 * 1024
    #: flows one application link may hold state for (the seed's advertisement flood)
    max_flows_per_endpoint: int = 4096
    #: data bytes one output link may queue before its frames are dropped as a slow consumer,
    #: and the seconds it may stay over that before it is closed
    slow_consumer_bytes: int = 8 * 1024 * 1024
    slow_consumer_grace: float = 10.0
    #: seconds an output may hold frames without sending any before it holds no credit
    #: (at once, or after slow_consumer_idle, if a sibling fed by the same input drains
    #: meanwhile: flowrouter.core.flowcontrol)
    slow_consumer_stall: float = 0.5
    #: seconds an output whose transport pushed back must have sent nothing, while a sibling
    #: fed by the same input drains, before it holds none of that input's credit (0: at
    #: once: the fastest output sets the input's pace, the others may lag by up to
    #: slow_consumer_bytes before they lose frames; flowrouter.core.flowcontrol)
    slow_consumer_idle: float = 0.0
    #: seconds a frame that has started may take to arrive in full (slow senders are reaped)
    frame_timeout: float = 30.0
    #: secret for control commands (text, or "file:PATH"); None: commands need proof only
    #: off loopback, see flowrouter.net.commandauth
    control_token: str | None = None
    #: link keys sign commands too (off: a link key is shared with a peer, not the operator's)
    control_link_keys: bool = False
    #: routers accepted without link keys besides the peers: "name@host" entries
    accept_routers: list[str] = field(default_factory=list)
    #: limits per principal (flowrouter.core.quotas); a mapping of its fields is accepted
    quota: QuotaLimits = field(default_factory=QuotaLimits)
    #: connections per port, idle time-outs, descriptors, the work budget ([limits],
    #: flowrouter.net.connlimits); a mapping of its fields is accepted
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: measured locality (flowrouter.core.measured): None keeps the configured modifiers;
    #: a mapping of LocalityMapping's fields (possibly empty: the defaults) turns it on
    locality_mapping: LocalityMapping | None = None
    #: [region]: checked values of the backbone region this router is an edge of
    region: dict[str, Any] | None = None
    epoch: float = 5.0
    gc_ping_after: int = 3
    gc_delete_after: int = 6
    liveness_interval: float = 1.0
    dead_after: float = 3.0
    refresh_interval: float = 10.0
    hold_factor: float = 3.5
    max_refresh_rate: float = 20_000.0
    join_timeout: float = 5.0
    max_flows: int = 1_000_000
    tick_interval: float = 0.25
    reconnect_min: float = 0.1
    reconnect_max: float = 5.0
    #: seconds a dial of a peer may wait for the connection (the kernel's SYN repeats at
    #: 1 and 3 s fall inside it); then the attempt counts as failed and the back-off runs
    dial_timeout: float = 4.0
    udp_idle_timeout: float = 30.0
    #: receive and send buffer asked of the kernel for the UDP socket (0: its default;
    #: Linux caps it at net.core.rmem_max / wmem_max): what arrives while the router waits
    #: for a CPU must fit, or the kernel drops it
    udp_socket_buffer: int = 4 << 20
    #: the largest a TCP link's read buffer grows while reads fill it (it starts at 64 KiB
    #: and shrinks back when reads stay small; a frame larger than this still fits): larger
    #: reads mean fewer system calls, wake-ups and passes per message (1 MiB instead of
    #: 256 KiB cut a router's CPU per 64 KiB message by a quarter; BENCHMARKS.md)
    read_buffer: int = 1 << 20
    endpoint_modifiers: Modifiers = field(default_factory=Modifiers)
    #: application membership notices on band 19 (flowrouter.core.appmembers): seconds
    #: between a flow's notices (0: off) and between snapshots of local members
    member_notice_interval: float = 1.0
    member_refresh: float = 30.0
    peers: list[PeerConfig] = field(default_factory=list)
    emulation: dict[str, Emulation] = field(default_factory=dict)  #: peer name -> emulation
    #: link authentication: key id -> secret spec (see flowrouter.wire.linkauth); empty: none
    link_keys: dict[str, str] = field(default_factory=dict)
    link_key_id: str | None = None
    link_encrypt: bool = False
    link_auth_endpoints: bool = False
    #: accept authenticated UDP links although nothing after their handshake is sealed
    link_unsealed_udp: bool = False
    #: sealed links move to a new key after this many records, and this many seconds
    link_rekey_records: int = DEFAULT_REKEY_RECORDS
    link_rekey_seconds: float = DEFAULT_REKEY_INTERVAL
    config_dir: str | None = None  #: where relative key files are looked up
    trace_dir: str | None = None  #: write trace records here (None: no tracing)
    trace_sample: float = 0.01
    trace_rotate_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError("router name must be a non-empty string")
        for what, addr in (("listen", self.listen), ("udp", self.udp),
                           ("app_udp", self.app_udp),
                           ("control", self.control),
                           ("http", None if self.http in ("auto", "off") else self.http),
                           *(("listen", a) for a in self.extra_listen),
                           *(("router_listen", a) for a in self.router_listen),
                           *(("app_listen", a) for a in self.app_listen)):
            if addr:
                parse_address(addr, what)
        if not 0 < self.max_payload <= 0xFFFFFFFF:
            raise ConfigError(f"max_payload must be 1..{0xFFFFFFFF}, got {self.max_payload}")
        for key in ("max_link_buffer", "link_credit", "max_flows_per_endpoint", "max_flows"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        for key in ("epoch", "join_timeout", "tick_interval", "reconnect_min",
                    "reconnect_max", "dial_timeout", "udp_idle_timeout"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key} must be a positive number of seconds, got "
                                  f"{getattr(self, key)}")
        if self.reconnect_min > self.reconnect_max:
            raise ConfigError(f"reconnect_min ({self.reconnect_min}) must not exceed "
                              f"reconnect_max ({self.reconnect_max})")
        if not 0.0 <= self.trace_sample <= 1.0:
            raise ConfigError(f"trace_sample must be a fraction 0..1, got {self.trace_sample}")
        for lsid in self.core_lsids:
            if not 0 < lsid < 1 << 32:
                raise ConfigError(f"core LSID {lsid:#x} must be 1..0xffffffff (0 is reserved)")
        if isinstance(self.locality_mapping, dict):
            try:
                self.locality_mapping = LocalityMapping.from_mapping(self.locality_mapping)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"[measured_locality]: {exc}") from None
        if isinstance(self.quota, dict):
            try:
                self.quota = QuotaLimits(**self.quota)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"[quota]: {exc}") from None
        if isinstance(self.limits, dict):
            try:
                self.limits = ServerLimits(**self.limits)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"[limits]: {exc}") from None
        for entry in self.accept_routers:
            name, sep, host = str(entry).partition("@")
            if not sep or not name or not host:
                raise ConfigError(f"accept_routers entry {entry!r} must look like name@host, "
                                  "e.g. r2@10.0.0.2")
        if min(self.slow_consumer_bytes, self.slow_consumer_grace,
               self.slow_consumer_stall) <= 0:
            raise ConfigError("slow_consumer_bytes, slow_consumer_grace and slow_consumer_stall "
                              "must be positive")
        if self.frame_timeout <= 0:
            raise ConfigError("frame_timeout must be positive")
        if self.link_keys and not self.link_unsealed_udp:
            for peer in self.peers:
                if peer.transport == "udp":
                    raise ConfigError(
                        f"[[peer]] {peer.name or peer.address}: transport \"udp\" with "
                        "[link_auth] keys: UDP links are not sealed (after the handshake "
                        "their frames are neither authenticated nor encrypted, so anyone on "
                        "the path can forge or read them); use transport \"tcp\", or set "
                        "[link_auth] allow_unsealed_udp = true to accept that")
        if not 0 < self.link_rekey_records <= SEQ_MASK or not self.link_rekey_seconds > 0:
            raise ConfigError(f"link rekey_records must be 1..{SEQ_MASK} and rekey_seconds "
                              "positive")
        self.params()  # validates the GC thresholds

    def flow_limits(self) -> FlowLimits:
        """The keys flow control reads, as its own limits object (which also derives the
        output queue's bound and what its drops are counted as)."""
        return FlowLimits(link_credit=self.link_credit, max_link_buffer=self.max_link_buffer,
                          slow_consumer_bytes=self.slow_consumer_bytes,
                          slow_consumer_grace=self.slow_consumer_grace,
                          slow_consumer_stall=self.slow_consumer_stall,
                          slow_consumer_idle=self.slow_consumer_idle)

    def accepted_routers(self) -> frozenset[tuple[str, str]]:
        """(name, host) pairs that may be routers without link keys: accept_routers plus the
        TCP peers (by name and the host of their address)."""
        out = {tuple(str(e).split("@", 1)) for e in self.accept_routers}
        for peer in self.peers:
            if peer.name:
                out.add((peer.name, parse_address(peer.address, "peer address")[0]))
        return frozenset(out)  # type: ignore[arg-type]

    def control_secrets(self) -> dict[str, bytes]:
        """Secrets that sign commands: the token (id "token"); link keys if control_link_keys."""
        out: dict[str, bytes] = {}
        if self.control_token:
            tok = self.control_token
            if tok.startswith("file:"):
                path = Path(tok[5:]).expanduser()
                if self.config_dir and not path.is_absolute():
                    path = Path(self.config_dir) / path
                try:
                    tok = path.read_text(encoding="utf-8").strip()
                except (OSError, UnicodeDecodeError) as exc:
                    why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                    raise ConfigError(f"control_token file {path}: {why}") from None
            if len(tok) < 12:
                raise ConfigError("control_token must be at least 12 characters")
            out["token"] = tok.encode()
        ring = self.keyring() if self.control_link_keys else None
        if ring is not None:
            for kid in self.link_keys:
                secret = ring.get(kid)
                if secret is not None:
                    out[kid] = secret
        return out

    def http_address(self) -> str | None:
        """Where HTTP monitoring listens: the configured address, or for "auto" loopback on
        the TCP listen port + 1000 (7000 -> 8000). "auto" gives none when the listen port is
        0, unset, or in the kernel's ephemeral range (32768 and up): such a port was picked
        at random (tests, benchmarks), and port + 1000 could be one picked for another
        process."""
        if self.http in (None, "", "off"):
            return None
        if self.http != "auto":
            return self.http
        if not self.listen:
            return None
        port = parse_address(self.listen)[1]
        return f"127.0.0.1:{port + 1000}" if 0 < port + 1000 < 32768 else None

    def keyring(self) -> Any:
        if not self.link_keys:
            return None
        from flowrouter.wire.linkauth import KeyRing

        try:
            return KeyRing.from_config(self.link_keys, self.link_key_id or
                                       next(iter(self.link_keys)), base_dir=self.config_dir)
        except ValueError as exc:
            raise ConfigError(f"[link_auth]: {exc}") from None

    def _region_params(self) -> RegionParams | None:
        if self.region is None:
            return None
        kw = dict(self.region)
        mods = Modifiers.from_mapping(kw.pop("locality", None))
        return RegionParams(me=self.name, modifiers=mods, **kw)

    def params(self) -> RouterParams:
        try:
            return RouterParams(
                keyring=self.keyring(), auth_key_id=self.link_key_id,
                auth_encrypt=self.link_encrypt, auth_endpoints=self.link_auth_endpoints,
                auth_udp_unsealed=self.link_unsealed_udp,
                auth_rekey_records=self.link_rekey_records,
                name=self.name, node_id=self.node_id or node_id_for(self.name),
                max_payload=self.max_payload, core_lsids=frozenset(self.core_lsids),
                default_lsid=self.default_lsid, routes=dict(self.routes),
                default_route=self.default_route, epoch_length=self.epoch,
                gc_ping_after=self.gc_ping_after, gc_delete_after=self.gc_delete_after,
                liveness_interval=self.liveness_interval, dead_after=self.dead_after,
                refresh_interval=self.refresh_interval, hold_factor=self.hold_factor,
                max_refresh_rate=self.max_refresh_rate,
                work_per_tick=self.limits.work_per_tick,
                work_backlog=self.limits.work_backlog,
                control_per_tick=self.limits.control_per_tick,
                join_timeout=self.join_timeout, max_flows=self.max_flows,
                max_flows_per_endpoint=self.max_flows_per_endpoint,
                quota=self.quota, accept_routers=self.accepted_routers(),
                locality_mapping=self.locality_mapping,
                endpoint_modifiers=self.endpoint_modifiers,
                member_notice_interval=self.member_notice_interval,
                member_refresh=self.member_refresh, region=self._region_params())
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


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
    "read_buffer": limit(int, 64 * 1024, 1 << 30),
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


_ROUTER_KEYS = set(_ROUTER_CHECKS) | {"core_lsids", "default_lsid", "endpoint_locality",
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
