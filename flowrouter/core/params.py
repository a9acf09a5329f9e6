"""RouterParams: everything the router core needs to know about itself.

The daemon's TOML (:mod:`flowrouter.net.config`) and the simulator fill it in. May import
:mod:`flowrouter.wire` and :mod:`flowrouter.core.tables`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowrouter.core.tables import Modifiers
from flowrouter.wire import control as C
from flowrouter.wire.header import DEFAULT_MAX_PAYLOAD
from flowrouter.wire.linkrecords import DEFAULT_REKEY_RECORDS


@dataclass(slots=True)
class RouterParams:
    """Everything the core needs to know about itself (the daemon's TOML fills it in)."""

    name: str
    node_id: int
    max_payload: int = DEFAULT_MAX_PAYLOAD
    #: LSIDs for which this router is the core of the shared trees
    core_lsids: frozenset[int] = frozenset()
    #: of those, LSIDs whose members are a full mesh that never relays: each member sends
    #: what enters it straight to every other member, and a broken member link is not
    #: routed around (the members' spanning tree, flowrouter.core.lstree, is not used)
    direct_lsids: frozenset[int] = frozenset()
    #: LSID suggested to endpoints for new flows (0: the first core LSID known)
    default_lsid: int = 0
    #: static LS routes: LSID -> name of the neighbouring router toward it
    routes: dict[int, str] = field(default_factory=dict)
    #: neighbour used for LSIDs with no other route
    default_route: str | None = None
    epoch_length: float = 5.0  #: seconds per epoch (trace snapshots; "active" entries)
    #: the seed's T1/T2 of the per-(flow, link) ping GC; refresh digests replaced it
    #: (flowrouter.core.softstate). Still validated, so old configs keep loading; unused.
    gc_ping_after: int = 3
    gc_delete_after: int = 6
    #: soft state (flowrouter.core.softstate): an ECHO per link every liveness_interval; a
    #: peer silent for dead_after is a failed link; a digest round toward each upstream
    #: neighbour every refresh_interval; state not refreshed for hold_factor x
    #: refresh_interval is collected
    liveness_interval: float = C.DEFAULT_LIVENESS_INTERVAL
    dead_after: float = C.DEFAULT_DEAD_AFTER
    refresh_interval: float = C.DEFAULT_REFRESH_INTERVAL
    hold_factor: float = C.DEFAULT_HOLD_FACTOR
    #: digest entries a second toward one neighbour at most (larger tables: longer rounds)
    max_refresh_rate: float = C.MAX_REFRESH_RATE
    #: the work budget (flowrouter.core.workbudget): digest entries processed per tick by
    #: all links together (the rest wait, served fairly at the next ticks), and entries an
    #: application link may have waiting before its further digests are dropped
    work_per_tick: int = 20_000
    work_backlog: int = 65_536
    #: control messages (joins, leaves, masks, digests, echoes, ...) one application link
    #: may have handled per tick; more are dropped, counted (the join quota's burst and
    #: rate are far below: only a flood reaches it)
    control_per_tick: int = 1024
    join_timeout: float = 5.0  #: seconds an upstream join may stay unanswered
    max_flows: int = 1_000_000  #: flow-table limit; joins past it are refused
    max_flows_per_endpoint: int = 4096  #: flows one application link may hold state for
    alert_interval: float = 5.0  #: at most one alert per (limit, flow) in this many seconds
    max_ls_routes: int = 4096  #: LSIDs this router keeps routes for
    #: link authentication (flowrouter.wire.linkauth.KeyRing); None: links are not authenticated.
    #: With a key ring, every ROUTER link must prove it holds a key; applications must too
    #: when ``auth_endpoints`` (and may, by sending credentials, anyway).
    keyring: Any = None
    auth_key_id: str | None = None
    auth_encrypt: bool = False  #: ask for encrypted links (TCP; on if either side asks)
    auth_endpoints: bool = False
    #: accept authenticated UDP links (never sealed: only the handshake is proven); without
    #: it a router with a key ring refuses every UDP link that would be authenticated
    auth_udp_unsealed: bool = False
    #: records a sealed link sends under one key before it moves to the next (rekeying by
    #: time is the daemon's: flowrouter.net.linksecurity)
    auth_rekey_records: int = DEFAULT_REKEY_RECORDS
    handshake_timeout: float = 10.0
    #: limits per principal (flowrouter.core.quotas.QuotaLimits; None: the defaults)
    quota: Any = None
    #: (name, source host) pairs accepted as routers without link keys (core.trust)
    accept_routers: frozenset[tuple[str, str]] = frozenset()
    #: locality costs of links to applications (accepted links from routers adopt the
    #: costs the dialling router announces)
    endpoint_modifiers: Modifiers = field(default_factory=Modifiers)
    #: application membership on band 19 (flowrouter.core.appmembers): seconds between a
    #: flow's notices (0: no notices), seconds between snapshots of local members (0: only
    #: when a local application starts listening), changes per notice, notices per tick.
    #: Off in the bare core (tests and the simulator turn it on); the daemon's config turns
    #: it on by default (flowrouter.net.config).
    member_notice_interval: float = 0.0
    member_refresh: float = 30.0
    member_notice_max: int = 100
    member_notices_per_tick: int = 100
    #: measured locality (flowrouter.core.measured.LocalityMapping): router links' delay and
    #: bandwidth modifiers follow measured RTT and throughput; None: modifiers as configured
    locality_mapping: Any = None
    #: a backbone region this router is an edge of (flowrouter.core.regions.RegionParams):
    #: end flows cross the region inside aggregate flows; None: an ordinary router
    region: Any = None

    def __post_init__(self) -> None:
        if not self.gc_delete_after > self.gc_ping_after >= 1:
            raise ValueError("GC thresholds need 1 <= gc_ping_after (T1) < gc_delete_after (T2)")
        if (self.member_notice_interval < 0 or self.member_refresh < 0
                or not 1 <= self.member_notice_max <= 512 or self.member_notices_per_tick < 1):
            raise ValueError("membership notices need interval >= 0, refresh >= 0, "
                             "1 <= changes per notice <= 512, notices per tick >= 1")
        if self.work_per_tick < 1 or self.work_backlog < 0 or self.control_per_tick < 1:
            raise ValueError("work_per_tick and control_per_tick must be at least 1 and "
                             "work_backlog >= 0")
        if self.epoch_length <= 0:
            raise ValueError("epoch_length must be positive")
        if not self.liveness_interval > 0 or not self.refresh_interval > 0:
            raise ValueError("liveness_interval and refresh_interval must be positive")
        if not self.dead_after > self.liveness_interval:
            raise ValueError("dead_after must be longer than liveness_interval")
        if not self.hold_factor > 1:
            raise ValueError("hold_factor must be above 1 (a hold shorter than the refresh "
                             "interval would expire live state)")

    @property
    def hold(self) -> float:
        """Seconds refreshed state is held without a new refresh."""
        return self.hold_factor * self.refresh_interval
