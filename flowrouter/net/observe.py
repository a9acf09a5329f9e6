"""What a running router shows to monitoring: its /status document (links, configured peers
that are down with their last error, flows, counters, alerts), its health and its Prometheus
metrics. Read at request time from :class:`~flowrouter.net.runtime.RouterNode`; nothing here
runs on the forwarding path. Net layer: may import flowrouter.core, wire and the standalone
:mod:`flowrouter.monitor`.

Metric names (all prefixed ``flownet_``; the README's "Monitoring" section lists them too):

=================================  =======  ===================================================
``router_links``                   gauge    links by ``role`` (router, endpoint) and ``state``
``router_peer_up``                 gauge    1 per configured peer whose link is up, else 0
                                            (labels ``peer``, ``address``)
``router_link_frames_total``       counter  frames per link (``link``, ``peer``, ``role``,
                                            ``direction`` rx/tx)
``router_link_queued_bytes``       gauge    bytes waiting in a link's output queue
``router_link_dropped_total``      counter  frames a link's full output queue dropped
``router_flows``                   gauge    flow-table entries
``router_flows_max``               gauge    the configured flow-table limit
``router_events_total``            counter  the router's counters by ``event`` name
``router_drops_total``             counter  dropped frames by ``reason``
``router_alerts``                  gauge    alerts currently held (``/status`` has them)
=================================  =======  ===================================================
Every process also exports ``flownet_info`` and ``flownet_uptime_seconds``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from flowrouter.monitor import Monitored

if TYPE_CHECKING:
    from flowrouter.net.runtime import RouterNode


def peer_rows(node: RouterNode, links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every configured peer with its state: up (and on which link) or down and why."""
    rows = []
    for peer in node.config.peers:
        link = next((lk for lk in links if lk["role"] == "router" and lk["state"] == "up"
                     and peer.name and lk["peer"] == peer.name), None)
        row: dict[str, Any] = {"peer": peer.name, "address": peer.address,
                               "transport": peer.transport, "up": link is not None,
                               "link": link["id"] if link else None}
        if link is None:
            err = node.peer_errors.get(peer.address)
            row["last_error"] = err[1] if err else "not connected yet"
            row["since"] = round(err[0], 3) if err else None
            row["blocked"] = bool(peer.name and peer.name in node.blocked_peers)
        rows.append(row)
    return rows


def router_status(node: RouterNode) -> dict[str, Any]:
    st = node.status()
    st["peers"] = peer_rows(node, st["links"])
    return st


def router_health(node: RouterNode) -> tuple[bool, str]:
    if node.stopping:
        return False, "stopping"
    down = [p["peer"] or p["address"] for p in peer_rows(node, node.core.status()["links"])
            if not p["up"]]
    return True, f"ok; configured peers down: {', '.join(down)}" if down else "ok"


def router_metrics(node: RouterNode) -> Iterable[Metric]:
    st = node.status()
    links = GaugeMetricFamily("flownet_router_links", "links by role and state",
                              labels=["role", "state"])
    count: dict[tuple[str, str], int] = {}
    for lk in st["links"]:
        count[(lk["role"], lk["state"])] = count.get((lk["role"], lk["state"]), 0) + 1
    for (role, state), n in sorted(count.items()):
        links.add_metric([role, state], n)
    yield links
    peers = GaugeMetricFamily("flownet_router_peer_up", "1 if the configured peer's link is up",
                              labels=["peer", "address"])
    for row in peer_rows(node, st["links"]):
        peers.add_metric([row["peer"] or "", row["address"]], 1 if row["up"] else 0)
    yield peers
    frames = CounterMetricFamily("flownet_router_link_frames", "frames carried per link",
                                 labels=["link", "peer", "role", "direction"])
    queued = GaugeMetricFamily("flownet_router_link_queued_bytes",
                               "bytes waiting in the link's output queue",
                               labels=["link", "peer", "role"])
    dropped = CounterMetricFamily("flownet_router_link_dropped",
                                  "frames dropped by the link's full output queue",
                                  labels=["link", "peer", "role"])
    for lk in st["links"]:
        ids = [str(lk["id"]), lk["peer"] or "", lk["role"]]
        frames.add_metric([*ids, "rx"], lk["rx"])
        frames.add_metric([*ids, "tx"], lk["tx"])
        out = lk.get("output") or {}
        queued.add_metric(ids, out.get("queued_bytes", 0))
        dropped.add_metric(ids, out.get("dropped", 0))
    yield from (frames, queued, dropped)
    yield GaugeMetricFamily("flownet_router_flows", "flow-table entries",
                            value=st["flow_count"])
    yield GaugeMetricFamily("flownet_router_flows_max", "the flow-table limit (max_flows)",
                            value=node.config.max_flows)
    events = CounterMetricFamily("flownet_router_events", "router counters by event",
                                 labels=["event"])
    drops = CounterMetricFamily("flownet_router_drops", "dropped frames by reason",
                                labels=["reason"])
    for name, value in st["counters"].items():
        if name.startswith("drop."):
            drops.add_metric([name[5:]], value)
        else:
            events.add_metric([name], value)
    yield from (events, drops)
    yield GaugeMetricFamily("flownet_router_alerts", "alerts held (see /status)",
                            value=len(st.get("alerts", ())))


def router_source(node: RouterNode, kind: str = "router") -> Monitored:
    """The monitoring view of *node* (``kind`` location-service for an LS member)."""
    from flowrouter.net.dashboard import dashboard_pages, router_overlay

    return Monitored(kind=kind, name=node.config.name, status=lambda: router_status(node),
                     metrics=lambda: router_metrics(node), health=lambda: router_health(node),
                     pages=dashboard_pages(lambda: router_overlay(node)))


__all__ = ["peer_rows", "router_health", "router_metrics", "router_source", "router_status"]
