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
``router_link_bytes_total``        counter  bytes per link (same labels)
``router_link_queued_bytes``       gauge    bytes waiting in a link's output queue
``router_link_dropped_total``      counter  frames a link's full output queue dropped
``router_flows``                   gauge    flow-table entries
``router_flows_max``               gauge    the configured flow-table limit
``router_flow_members``            gauge    downstream links per flow (``flow``; the 100
                                            flows with the most)
``router_flow_frames_total``       counter  data frames per flow this router took, and
``router_flow_bytes_total``        counter  their bytes (``flow``; the 100 with the most)
``router_events_total``            counter  the router's counters by ``event`` name
``router_drops_total``             counter  dropped frames by ``reason``
``router_alerts``                  gauge    alerts currently held (``/status`` has them)
=================================  =======  ===================================================
Every process also exports ``flownet_info`` and ``flownet_uptime_seconds``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from flowrouter.monitor import (
    METRICS_TYPE,
    Handler,
    Monitored,
    Page,
    render_metrics,
    status_document,
)
from flowrouter.net import flowviews, listviews, slicedjson

#: rows of each list an HTTP page gives when the query asks for no limit (a row of a flow
#: costs the router's loop about 11 us; ``?limit=N`` asks for more, up to listviews.MAX_LIMIT)
PAGE_ROWS = 1024
#: flows /metrics has a series for (the ones with the most members): one series per flow
#: of a million-flow table would swamp any Prometheus
FLOW_METRICS = 100

if TYPE_CHECKING:
    from flowrouter.net.runtime import RouterNode


def peer_rows(node: RouterNode, links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every configured peer with its state (:meth:`RouterNode.peer_rows`)."""
    return node.peer_rows(links)


def router_status(node: RouterNode) -> dict[str, Any]:
    return node.status()  # with "peers": every configured peer, up or down and why


def router_health(node: RouterNode) -> tuple[bool, str]:
    """Readiness (``/readyz``, ``/healthz``): the router listens where it is configured to,
    is not stopping or draining, and, when it has configured peers, at least one of them is
    up (a router cut off from the overlay takes applications it cannot serve)."""
    if node.stopping:
        return False, "stopping"
    if node.draining:
        return False, "draining: applications are asked to move to another router"
    if not node.listening:
        return False, "not listening"
    rows = peer_rows(node, node.core.status(flows=())["links"])  # no flow rows: probed often
    down = [p["peer"] or p["address"] for p in rows if not p["up"]]
    if rows and len(down) == len(rows):
        return False, f"no configured peer is up (down: {', '.join(down)})"
    return True, f"ok; configured peers down: {', '.join(down)}" if down else "ok"


def router_live(node: RouterNode) -> tuple[bool, str]:
    """Liveness (``/livez``): the process answers, its event loop turns (this page is
    served by it) and it has not stopped. Not tied to peers: restarting a router because
    its neighbours are away would not bring them back."""
    if node.stopped:
        return False, "stopped"
    return True, "alive"


def router_metrics(node: RouterNode, named: list[bytes] | None = None) -> Iterable[Metric]:
    """The router's metric families; *named*: the flows with a series of their own, as
    :func:`flowviews.metric_flows` picks them (picked here when not given)."""
    # rows only for the flows named: a scrape of a large table renders a handful
    st = node.status(flowviews.metric_flows(node, FLOW_METRICS) if named is None else named)
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
    nbytes = CounterMetricFamily("flownet_router_link_bytes", "bytes carried per link (as "
                                 "read from and written to its transport)",
                                 labels=["link", "peer", "role", "direction"])
    for lk in st["links"]:
        ids = [str(lk["id"]), lk["peer"] or "", lk["role"]]
        frames.add_metric([*ids, "rx"], lk["rx"])
        frames.add_metric([*ids, "tx"], lk["tx"])
        nbytes.add_metric([*ids, "rx"], lk.get("bytes_in", 0))
        nbytes.add_metric([*ids, "tx"], lk.get("bytes_out", 0))
        out = lk.get("output") or {}
        queued.add_metric(ids, out.get("queued_bytes", 0))
        dropped.add_metric(ids, out.get("dropped", 0))
    yield from (frames, nbytes, queued, dropped)
    yield GaugeMetricFamily("flownet_router_flows", "flow-table entries",
                            value=st["flow_count"])
    members = GaugeMetricFamily(
        "flownet_router_flow_members", f"downstream links that joined the flow (the "
        f"{FLOW_METRICS} flows with the most)", labels=["flow"])
    for row in listviews.view(st["flows"], "members", FLOW_METRICS):
        members.add_metric([row["flow"]], row["members"])
    yield members
    flow_frames = CounterMetricFamily(
        "flownet_router_flow_frames", f"data frames of the flow this router took (the "
        f"{FLOW_METRICS} flows with the most bytes)", labels=["flow"])
    flow_bytes = CounterMetricFamily(
        "flownet_router_flow_bytes", f"bytes of those frames, headers included (the "
        f"{FLOW_METRICS} flows with the most)", labels=["flow"])
    for row in listviews.view(st["flows"], "bytes", FLOW_METRICS):
        flow_frames.add_metric([row["flow"]], row["frames"])
        flow_bytes.add_metric([row["flow"]], row["bytes"])
    yield from (flow_frames, flow_bytes)
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


def list_page(node: RouterNode, source: Monitored, name: str | None) -> Handler:
    """A page that answers ``?sort=FIELD&limit=N`` (:mod:`flowrouter.net.listviews`): the
    whole status document (*name* None) or one of its lists, PAGE_ROWS rows of each list
    when the query gives no limit."""
    async def page(query: str) -> Page:
        sort, limit = listviews.from_query(query)
        if limit is None:  # as nats-server's /connz: a page of a large table, not all of it
            limit = str(PAGE_ROWS)  # as a query gives it
        with flowviews.collector_paused():  # ?limit= may ask for a million rows
            try:  # only the flow rows shown are rendered (flowviews), a slice at a time
                st = await node.status_view_sliced(sort, limit)
            except listviews.ViewError as exc:
                return 400, "application/json", (json.dumps({"error": str(exc)}).encode()
                                                 + b"\n")
            if name is None:
                doc = status_document(source, st)
            else:
                doc = {name: st[name], **({f"{name}_total": st[f"{name}_total"]}
                                          if f"{name}_total" in st else {})}
            parts = await slicedjson.pieces(doc, 1, consume=True)
        body = []  # the pieces written one after the other: never joined whole
        for part in parts:
            body.append(part.encode())
            await asyncio.sleep(0)
        return 200, "application/json", [*body, b"\n"]
    return page


def router_source(node: RouterNode, kind: str = "router") -> Monitored:
    """The monitoring view of *node* (``kind`` location-service for an LS member)."""
    from flowrouter.net.dashboard import dashboard_pages, router_overlay

    source = Monitored(kind=kind, name=node.config.name, status=lambda: router_status(node),
                       metrics=lambda: router_metrics(node),
                       health=lambda: router_health(node), live=lambda: router_live(node),
                       pages=dashboard_pages(lambda: router_overlay(node)))
    source.pages["/status"] = list_page(node, source, None)

    async def metrics_page(query: str) -> Page:
        # the flows named are picked a slice of the table at a time (the loop runs between)
        named = await flowviews.metric_flows_sliced(node, FLOW_METRICS)
        scrape = dataclasses.replace(source, metrics=lambda: router_metrics(node, named))
        return 200, METRICS_TYPE, render_metrics(scrape)
    source.pages["/metrics"] = metrics_page
    for name in ("links", "flows", "peers"):
        source.pages[f"/{name}"] = list_page(node, source, name)
    return source


__all__ = ["FLOW_METRICS", "PAGE_ROWS", "list_page", "peer_rows", "router_health",
           "router_live", "router_metrics", "router_source", "router_status"]
