"""IGO configuration: every knob of the protocol, validated (imports only the standard
library and flowrouter.wire)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from flowrouter.wire.bands import (
    DATA_BAND_FIRST,
    NUM_BANDS,
)

from .wire import MAX_SITES

MODES = ("all-to-all", "hasten", "leader")


_MODE_ALIASES = {"delay": "all-to-all", "all-to-all-delay": "all-to-all",
                 "all-to-all-hasten": "hasten", "leader-based": "leader"}


@dataclass(frozen=True)
class IGOConfig:
    """Every knob of the protocol; defaults are seed 003's values where it has one."""

    sites: tuple[str, ...] = ()  #: the sites of the room (sorted on construction)
    room: str = "chat"
    mode: str = "all-to-all"  #: all-to-all (delay-delivery) | hasten | leader
    leader: str | None = None  #: leader mode: the sequencing site (one of ``sites``)
    heartbeat_interval: float = 2.0  #: seed: every 2 s
    missed_heartbeats: int = 3  #: seed: silent for 3 intervals = disconnected
    disconnect_interval: float = 15.0  #: seed: short-term disconnects last up to 15 s
    data_band: int = 32
    inbox_band_base: int = 64  #: site i's point-to-point band is inbox_band_base + i
    nack_delay: float = 0.05  #: wait this long after a message arrives beyond a gap
    hint_delay: float = 1.0  #: ... after a heartbeat / acknowledgement reveals a gap (data
    #: may still be queued behind: routers let administration bands overtake data)
    nack_retry: float = 2.0  #: ask again (another holder) after this long without progress
    repair_coalesce: float = 0.05  #: collect requests this long before answering
    repair_rate: float = 100.0  #: repairs sent per second at most
    repair_bytes: float = 16384.0  #: ... and repair bytes per second at most (a burst of
    #: one second): repair is paced below what a link carries, whatever the requests
    repair_dedup: float = 1.0  #: a message resent to a site is not resent to it again
    #: within this many seconds (a retry racing the answer in flight)
    history_size: int = 20000  #: messages kept per origin for repairs
    max_lag: int = 2000  #: a requester further behind than this is dropped from our duty
    dependency_timeout: float = 15.0  #: a missing causal dependency is skipped after this
    stability: bool = False  #: deliver only messages every ordering-set site acknowledged
    #: all-to-all modes: the ordering set is an agreed, numbered view (views.py); False (and
    #: with stability tracking) each site's failure detector alone decides it, as before
    agreed_views: bool = True
    ack_interval: float = 0.25  #: stability: acknowledgement heartbeats at most this often
    long_term_reconcile: bool = False  #: fetch what an S3 reconnect skipped, at a low rate
    long_term_rate: float = 2.0  #: messages per second for long-term reconciliation
    display_rate: float | None = None  #: deliveries per second at most (None: no limit)
    display_burst: int = 10
    leader_reconcile_cut_site: bool = False  #: seed: a site cut off from the leader is not
    #: sent what the others said meanwhile; True repairs its order stream (late messages)
    stall_timeout: float | None = None  #: a peer heard but with a message known and missing
    #: this long (or, following a leader, an order number) counts as disconnected (S2);
    #: None: detect_after + 2 s (8 s with the seed's heartbeats), so a stall is
    #: declared no sooner than silence would be
    send_window: int | None = 32768  #: own bytes in flight (not yet acknowledged by every
    #: connected peer) at most; beyond it messages wait in the outbox and the site is
    #: congested (None: no flow control)
    outbox_limit: int = 64  #: messages waiting while congested; more are refused
    startup_fetch: int = 20  #: at start-up, a peer's messages missing at first contact
    #: are fetched at once (lost on the way) only if at most this many and this site has no
    #: display marks of a previous run; otherwise they are history, fetched in the
    #: background at long_term_rate and shown flagged late (live traffic first)
    keep_ready_for: float = 60.0  #: leader mode: unordered data kept this long (seconds)

    def __post_init__(self) -> None:
        sites = tuple(sorted(dict.fromkeys(self.sites)))
        if not sites:
            raise ValueError("an IGO room needs at least one site")
        if len(sites) > MAX_SITES:
            raise ValueError(f"at most {MAX_SITES} sites, got {len(sites)}")
        for s in sites:
            if not isinstance(s, str) or not s or len(s.encode()) > 64:
                raise ValueError(f"bad site name {s!r}")
        object.__setattr__(self, "sites", sites)
        mode = _MODE_ALIASES.get(self.mode, self.mode)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        object.__setattr__(self, "mode", mode)
        if mode == "leader":
            if self.leader not in sites:
                raise ValueError(f"leader mode needs a leader among the sites ({', '.join(sites)})"
                                 f", got {self.leader!r}")
        elif self.leader is not None and self.leader not in sites:
            raise ValueError(f"leader {self.leader!r} is not one of the sites")
        if not DATA_BAND_FIRST <= self.data_band < NUM_BANDS:
            raise ValueError("data_band must be an application band (32..127)")
        last = self.inbox_band_base + len(sites) - 1
        if not self.inbox_band_base >= DATA_BAND_FIRST or last >= NUM_BANDS:
            raise ValueError(f"inbox bands {self.inbox_band_base}..{last} must lie in 32..127")
        if self.inbox_band_base <= self.data_band <= last:
            raise ValueError("the data band must not be one of the inbox bands")
        for name in ("heartbeat_interval", "disconnect_interval", "nack_retry", "repair_rate",
                     "long_term_rate", "ack_interval", "dependency_timeout", "keep_ready_for",
                     "repair_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("nack_delay", "hint_delay", "repair_coalesce"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.missed_heartbeats < 1 or self.history_size < 1 or self.max_lag < 1:
            raise ValueError("missed_heartbeats, history_size and max_lag must be >= 1")
        if self.send_window is not None and self.send_window < 1:
            raise ValueError("send_window must be positive or None")
        if self.outbox_limit < 0 or self.startup_fetch < 0:
            raise ValueError("outbox_limit and startup_fetch must be >= 0")
        if self.stall_timeout is not None and not self.stall_timeout > 0:
            raise ValueError("stall_timeout must be positive or None")
        if self.display_rate is not None and not self.display_rate > 0:
            raise ValueError("display_rate must be positive or None")
        if self.disconnect_interval < self.detect_after:
            raise ValueError("disconnect_interval must be at least missed_heartbeats x "
                             "heartbeat_interval")

    @property
    def detect_after(self) -> float:
        """Silence after which a site counts as disconnected (seed: 3 x 2 s)."""
        return self.missed_heartbeats * self.heartbeat_interval

    @property
    def stall_after(self) -> float:
        """A message known and missing this long, a heard peer counts as disconnected."""
        return self.stall_timeout if self.stall_timeout is not None else self.detect_after + 2.0

    def index(self, site: str) -> int:
        try:
            return self.sites.index(site)
        except ValueError:
            raise KeyError(f"unknown site {site!r} (sites: {', '.join(self.sites)})") from None

    def inbox_band(self, site: str | int) -> int:
        i = site if isinstance(site, int) else self.index(site)
        return self.inbox_band_base + i

    def with_(self, **changes: Any) -> IGOConfig:
        return replace(self, **changes)


def room_tag(cfg: IGOConfig) -> int:
    text = f"{cfg.room}|{','.join(cfg.sites)}|{cfg.leader or ''}"
    return zlib.crc32(text.encode())


def default_config(sites: Sequence[str], **kwargs: Any) -> IGOConfig:
    """Shorthand: ``default_config(["a", "b"], mode="hasten")``."""
    return IGOConfig(sites=tuple(sites), **kwargs)

