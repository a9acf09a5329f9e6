"""Operating a running router: reload its configuration, drain it before maintenance.

**Reload** (``kill -HUP``, ``flowrouter ctl reload``): the node's configuration source is
read again and the new configuration is applied while the router runs. Peers (a removed
one's link is closed and no longer dialled, an added one is dialled at once, a changed one
both), ``accept_routers`` (a router accepted without keys that the list no longer holds is
cut off), link keys (new links handshake with them; sealed links keep their
session until cycled), the control token, quotas and flow-table limits, flow control's limits
(queues and outputs made from now on), the re-dial back-off and time-out, soft-state timing,
membership notices, the emulation defaults and ``[limits]`` connections per port,
``control_idle`` and ``descriptor_reserve`` change live. A file that does not load (bad
TOML, a bad value, an unreadable key file) or changes what only a restart applies
(:data:`flowrouter.net.reload.RESTART_ONLY`: addresses, name, core LSIDs, ...) leaves the
running configuration as it is; the reply and the log say why. The log lists what changed,
one line per setting (:func:`flowrouter.net.reload.changes`).

**Drain** (``flowrouter ctl drain [timeout=S]``, ``kill -USR2``): the router stops accepting
connections (its listeners close; readiness turns 503), tells every application on it to
move (an ERROR "router R is draining", which flowlib answers by failing over to the next
router of its list), keeps its router links so traffic flows until they have moved, and
finishes when no application is left or after the time-out (the stragglers are closed);
the process then exits (``flowrouter run`` and ``flowls run``).

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire` and :mod:`flowrouter.net` below
the node (config, reload, re-dial, flow control, command authentication); sees the node
only as :class:`Operated`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from flowrouter.core.quotas import QuotaLimits, host_of
from flowrouter.core.tables import LinkState
from flowrouter.net.commandauth import CommandGuard, is_loopback
from flowrouter.net.config import ConfigError, Emulation, NodeConfig
from flowrouter.net.reload import changes, peer_changes, restart_needed
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_MEMBERSHIP
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import pack_header

if TYPE_CHECKING:
    from flowrouter.core.router import Router
    from flowrouter.net.backpressure import Backpressure
    from flowrouter.net.config import PeerConfig
    from flowrouter.net.connlimits import ConnectionGate
    from flowrouter.net.nodeapi import Link
    from flowrouter.net.redial import DialSchedule


class Operated(Protocol):
    """What reload and drain ask of a node (:class:`flowrouter.net.node.RouterNode`)."""

    config: NodeConfig
    core: Router
    flow: Backpressure
    dials: DialSchedule
    gate: ConnectionGate
    guard: CommandGuard | None
    links: dict[int, Link]

    def set_emulation(self, peer: str, emu: Emulation | None) -> None: ...
    def drop_peers(self, peers: list[PeerConfig], reason: str) -> None: ...
    def dial(self, peer: PeerConfig) -> None: ...
    def close_links(self, link_ids: list[int], reason: str) -> None: ...
    def begin_drain(self) -> None: ...
    async def wait_changed(self) -> None: ...

log = logging.getLogger("flowrouter.net.runtime")

#: RouterParams fields a reload copies into the running core (the others are identity,
#: tables built at start, or not configurable)
LIVE_PARAMS = ("default_lsid", "epoch_length", "liveness_interval", "dead_after",
               "refresh_interval", "hold_factor", "max_refresh_rate", "join_timeout",
               "max_flows", "max_flows_per_endpoint", "keyring", "auth_key_id",
               "auth_encrypt", "auth_endpoints", "auth_rekey_records", "quota",
               "accept_routers", "endpoint_modifiers", "member_notice_interval",
               "member_refresh")
#: seconds a drain waits for applications to leave, unless told otherwise
DRAIN_TIMEOUT = 30.0
#: the ERROR code of "this router is going away: move" (the text says it too)
DRAINING = 4


class ReloadError(ConfigError):
    """The new configuration cannot be applied; the running one stays (the text says why)."""


def config_emulation(cfg: NodeConfig) -> dict[str, Emulation]:
    """The emulation a configuration sets per peer name ([[emulate]], then [[peer]])."""
    out = {name: emu for name, emu in cfg.emulation.items()}
    for peer in cfg.peers:
        if peer.name and peer.emulation.active:
            out.setdefault(peer.name, peer.emulation)
    return out


class Operations:
    """Reload and drain for one node (it owns one: ``node.ops``)."""

    def __init__(self, node: Operated) -> None:
        self.node = node
        #: reads the configuration again (the file and the command line): None when the
        #: process has none (a router built in code); set by whoever runs the node
        self.source: Callable[[], NodeConfig] | None = None
        self.drain_task: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()  #: set when a drain finished

    # reload -----------------------------------------------------------------------------------
    def reload(self, new: NodeConfig | None = None) -> list[str]:
        """Apply *new* (default: read the source again); returns what changed. Raises
        ConfigError (ReloadError) and changes nothing when it cannot be applied."""
        node = self.node
        if new is None:
            if self.source is None:
                raise ReloadError(f"router {node.config.name} was not started from a config "
                                  "file: nothing to reload")
            new = self.source()
        old = node.config
        need = restart_needed(old, new)
        if need:
            raise ReloadError("only a restart can change " + ", ".join(need)
                              + "; the running configuration stays")
        params = new.params()  # key files are read (and checked) now
        guard = node.guard
        secrets = None
        if guard is not None:
            secrets = new.control_secrets()
            CommandGuard.check_bind(guard.bind_host, secrets)
        diff = changes(old, new)
        node.config = new
        for name in LIVE_PARAMS:
            setattr(node.core.p, name, getattr(params, name))
        node.core.trust.accepted_routers = params.accept_routers
        node.core.trust.quotas.limits = params.quota or QuotaLimits()
        node.flow.control.limits = new.flow_limits()
        node.gate.limits = new.limits  # connections per port, control idle, the reserve
        node.dials.reconfigure(new.reconnect_min, new.reconnect_max)
        if guard is not None and secrets is not None:
            guard.secrets = dict(secrets)
            guard.loopback = is_loopback(guard.bind_host) and not new.control_token
        was, now = config_emulation(old), config_emulation(new)
        for name in sorted(set(was) | set(now)):
            if was.get(name) != now.get(name):
                node.set_emulation(name, now.get(name))
        removed, added = peer_changes(old.peers, new.peers)
        node.drop_peers(removed, "removed from the configuration by a reload")
        for peer in added:
            node.dial(peer)
        untrusted = self.no_longer_accepted()
        if untrusted:
            node.close_links(untrusted, "no longer an accepted router (reload)")
            diff.append(f"closed {len(untrusted)} router link(s) no longer accepted")
        return diff

    def no_longer_accepted(self) -> list[int]:
        """Router links this router accepted without link keys whose (name, host) the
        accept list no longer holds: an operator who removes a router expects it cut off."""
        core = self.node.core
        accepted = core.trust.accepted_routers
        out = []
        for lid, lk in core.links.items():
            if (lk.role is not C.Role.ROUTER or lk.expected_peer is not None
                    or (lk.auth is not None and lk.auth.authenticated)):
                continue
            host = host_of(lk.address)
            if (lk.peer_name, host) not in accepted and ("*", host) not in accepted:
                out.append(lid)
        return out

    def reload_logged(self) -> dict[str, Any]:
        """Reload and log the outcome (SIGHUP and the control command): a reply."""
        name = self.node.config.name
        try:
            diff = self.reload()
        except (ConfigError, ValueError, OSError) as exc:
            log.error("router %s: reload failed, the running configuration stays: %s",
                      name, exc)
            return {"ok": False, "error": f"reload failed, the running configuration stays: "
                    f"{exc}"}
        if diff:
            log.info("router %s: configuration reloaded: %d change(s)", name, len(diff))
            for line in diff:
                log.info("router %s: reload: %s", name, line)
        else:
            log.info("router %s: configuration reloaded: nothing changed", name)
        return {"ok": True, "changes": diff}

    # drain ------------------------------------------------------------------------------------
    def applications(self) -> list[int]:
        """Links of applications that are up."""
        return [lid for lid, lk in self.node.core.links.items()
                if lk.role is C.Role.ENDPOINT and lk.state is LinkState.UP]

    def drain(self, timeout: float | None = None) -> dict[str, Any]:
        """Start draining (once; a second call reports the first); returns a reply."""
        node = self.node
        timeout = DRAIN_TIMEOUT if timeout is None else float(timeout)
        if not timeout >= 0:
            raise ValueError("the drain time-out must be >= 0 seconds")
        apps = self.applications()
        if self.drain_task is not None:
            return {"ok": True, "draining": True, "applications": len(apps),
                    "detail": "already draining"}
        name = node.config.name
        node.begin_drain()
        text = (f"router {name} is draining (maintenance): move to another router")
        err = C.Error(DRAINING, text).encode()
        header = pack_header(LINK_LOCAL_FLOW.key, len(err), BAND_MEMBERSHIP)
        for lid in apps:
            link = node.links.get(lid)
            if link is not None:
                link.send(header, err)
        log.warning("router %s: draining: no new connections; %d application(s) told to "
                    "move; stopping when they have gone or in %gs", name, len(apps), timeout)
        self.drain_task = asyncio.ensure_future(self._finish(timeout))
        return {"ok": True, "draining": True, "applications": len(apps), "timeout": timeout}

    async def _finish(self, timeout: float) -> None:
        node = self.node
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.applications() and loop.time() < deadline:
            try:
                await asyncio.wait_for(node.wait_changed(), deadline - loop.time())
            except TimeoutError:
                break
        left = self.applications()
        if left:
            log.warning("router %s: drain time-out: closing %d application(s) still here",
                        node.config.name, len(left))
            node.close_links(left, "drained")
        else:
            log.info("router %s: drained: every application has gone", node.config.name)
        self._drained.set()

    async def wait_drained(self) -> None:
        """Return once a drain has finished (never, while none was started)."""
        await self._drained.wait()


__all__ = ["DRAIN_TIMEOUT", "LIVE_PARAMS", "Operations", "ReloadError", "config_emulation"]
