"""What a configuration reload changes, and what it cannot change live. Pure functions.

``kill -HUP`` (or ``flowrouter ctl reload``) reads the router's configuration again; the
node (:meth:`flowrouter.net.node.RouterNode.reload`) applies the new one while it runs.
This module compares the running and the new :class:`~flowrouter.net.config.NodeConfig`:

* :func:`restart_needed` names the settings a running router cannot take over (its name and
  addresses, the LSIDs it is a core for and static routes, its largest payload, tracing,
  measured locality): a reload that changes any of them is refused as a whole and the
  running configuration stays, with a reply and a log line naming them;
* :func:`changes` says, one line per setting, what a reload changes (the log shows it).
  Secrets never appear: link keys are named by id, a control token only as "changed".

May import :mod:`flowrouter.net.config` only.
"""

from __future__ import annotations

from typing import Any

from flowrouter.net.config import NodeConfig, PeerConfig

#: settings only a restart applies (sockets, identity, tables built at start)
RESTART_ONLY = ("name", "node_id", "listen", "extra_listen", "router_listen", "app_listen",
                "udp", "control", "http", "core_lsids", "routes", "default_route",
                "max_payload", "read_buffer", "write_threads", "tick_interval",
                "udp_socket_buffer", "udp_bundle", "trace_dir", "trace_sample",
                "trace_rotate_bytes", "locality_mapping", "gc_ping_after", "gc_delete_after")
#: settings compared by what they are, never shown
_SECRET = ("control_token",)
#: not settings (where relative files are found)
_IGNORED = ("config_dir",)


def _fields() -> tuple[str, ...]:
    return tuple(NodeConfig.__slots__)  # type: ignore[attr-defined]


#: ``[limits]`` keys built into objects at start (the HTTP server's request time-out, the
#: soft state's work budget, the core's control budget per tick, the descriptor count): the
#: others (connections per port, control idle time-out, the descriptor reserve) are read
#: live from the connection gate
LIMITS_RESTART_ONLY = ("http_idle", "work_per_tick", "work_backlog", "control_per_tick",
                       "descriptors")


def restart_needed(old: NodeConfig, new: NodeConfig) -> list[str]:
    """The settings that differ and only a restart would apply."""
    out = [f for f in RESTART_ONLY if getattr(old, f) != getattr(new, f)]
    out += [f"[limits] {f}" for f in LIMITS_RESTART_ONLY
            if getattr(old.limits, f) != getattr(new.limits, f)]
    return out


def _peer_text(peer: PeerConfig) -> str:
    extra = []
    if peer.transport != "tcp":
        extra.append(peer.transport)
    if peer.emulation.active:
        extra.append(peer.emulation.describe())
    return f"{peer.name or 'peer'} at {peer.address}" + (f" ({', '.join(extra)})"
                                                          if extra else "")


def peer_changes(old: list[PeerConfig], new: list[PeerConfig]
                 ) -> tuple[list[PeerConfig], list[PeerConfig]]:
    """(peers to stop dialling, peers to start dialling): a peer whose entry changed in any
    way is both (its link is closed and dialled again with the new entry)."""
    removed = [p for p in old if p not in new]
    added = [p for p in new if p not in old]
    return removed, added


def _short(value: Any) -> str:
    if isinstance(value, frozenset | set):
        value = sorted(value)
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def changes(old: NodeConfig, new: NodeConfig) -> list[str]:
    """One line per setting the reload changes (empty: nothing changed)."""
    lines: list[str] = []
    for name in _fields():
        if name in _IGNORED or name == "peers":
            continue
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        if name in _SECRET:
            what = "set" if b and not a else "removed" if a and not b else "changed"
            lines.append(f"{name}: {what}")
        elif name == "link_keys":
            gone, came = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            kept = sorted(k for k in set(a) & set(b) if a[k] != b[k])
            parts = ([f"added {', '.join(came)}"] if came else []) + (
                [f"removed {', '.join(gone)}"] if gone else []) + (
                [f"replaced {', '.join(kept)}"] if kept else [])
            lines.append(f"link keys: {'; '.join(parts)}")
        elif name == "limits":
            da, db = a.as_dict(), b.as_dict()
            lines += [f"[limits] {k}: {da[k]} -> {db[k]}" for k in da if da[k] != db[k]]
        elif name == "emulation":
            for peer in sorted(set(a) | set(b)):
                if a.get(peer) != b.get(peer):
                    lines.append(f"emulation toward {peer}: "
                                 f"{a[peer].describe() if peer in a else 'none'} -> "
                                 f"{b[peer].describe() if peer in b else 'none'}")
        else:
            lines.append(f"{name}: {_short(a)} -> {_short(b)}")
    removed, added = peer_changes(old.peers, new.peers)
    lines += [f"peer removed: {_peer_text(p)}" for p in removed]
    lines += [f"peer added: {_peer_text(p)}" for p in added]
    return lines


__all__ = ["LIMITS_RESTART_ONLY", "RESTART_ONLY", "changes", "peer_changes",
           "restart_needed"]
