"""Router daemon configuration: the checked model, NodeConfig, and what is derived from it.

:class:`NodeConfig` holds every setting of one router, each type- and range-checked when
it is built (by the TOML reader, :mod:`flowrouter.net.configfile`, where the file format is
documented key by key; by CLI flags; by tests), and derives what the parts of the router
read from it: the core's :class:`~flowrouter.core.router.RouterParams`, flow control's
limits, the accepted routers, the secrets that sign control commands, the link keyring.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrouter.core.flowcontrol import FlowLimits
from flowrouter.core.measured import LocalityMapping
from flowrouter.core.quotas import QuotaLimits
from flowrouter.core.regions import RegionParams
from flowrouter.core.router import RouterParams
from flowrouter.core.tables import Modifiers
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
    direct_lsids: frozenset[int] = frozenset()
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
    #: fed by the same input drains, before it holds none of that input's credit (then the
    #: fastest output sets the input's pace, the others may lag by up to
    #: slow_consumer_bytes before they lose frames; flowrouter.core.flowcontrol). 20 ms:
    #: receivers that are only a moment behind (sharing a core) are not taken for slow
    #: consumers; 0: at once
    slow_consumer_idle: float = 0.02
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
    #: receive and send buffer asked of the kernel for the UDP sockets (0: its default;
    #: Linux caps it at net.core.rmem_max / wmem_max unless the router has CAP_NET_ADMIN; a
    #: cap is logged and in status): what arrives while the router waits for a CPU must
    #: fit, or the kernel drops it (counted, drop.udp-rcvbuf)
    udp_socket_buffer: int = 32 << 20
    #: bytes of frames a UDP datagram to a peer announcing bundles carries at most ("auto":
    #: 65507 to loopback addresses, 1472 otherwise, 1452 over IPv6; 0: one frame per datagram)
    udp_bundle: int | str = "auto"
    #: the largest a TCP link's read buffer grows while reads fill it (it starts at 64 KiB
    #: and shrinks back when reads stay small; a frame larger than this still fits): larger
    #: reads mean fewer system calls, wake-ups and passes per message (1 MiB instead of
    #: 256 KiB cut a router's CPU per 64 KiB message by a quarter; BENCHMARKS.md)
    read_buffer: int = 1 << 20
    #: helper threads that share a read's socket writes with the loop's thread when they
    #: are many and large (a fan-out; flowrouter.net.writepool): "auto" is one fewer than
    #: the usable cores, at most 3; 0: the loop's thread writes everything
    write_threads: int | str = "auto"
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
                direct_lsids=frozenset(self.direct_lsids),
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
