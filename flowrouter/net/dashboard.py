"""The web dashboard: one static page (``dashboard.html``, package data) that polls
``api/overlay`` and draws the overlay graph, events and a flow's tree, plus the functions that
build that overlay document from router status documents.

Names in the document come from routers' HELLOs and configuration, so the page treats them as
text only (``dashboard.js``: textContent, never innerHTML), and the monitor serves every page
under a Content-Security-Policy that allows no inline script (``flowrouter.monitor``).

``flowrouter up --web`` serves the whole overlay (the launcher asks every router); a router's
own HTTP endpoint serves its own view (itself and its neighbours). The document:

``{"name", "t", "routers": [{"name", "up", "flows"}], "links": [{"name", "a", "b", "state"
("up" | "down" | "cut"), "frames" (total both ways, the page derives rates), "detail"}],
"events": [{"t", "what"}], "flows": [{"flow", "edges": [{"from", "to", "mask"}],
"aggregate": {router: mask}}]}``

Net layer: imports the standalone monitor and the standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from flowrouter.monitor import Handler, Page
from flowrouter.net import flowviews

if TYPE_CHECKING:
    from flowrouter.net.runtime import RouterNode

MAX_FLOWS_SHOWN = 50  #: flow trees offered in the page's selector


def page_html() -> bytes:
    return _asset("dashboard.html")


def _asset(name: str) -> bytes:
    return resources.files("flowrouter.net").joinpath(name).read_bytes()


def dashboard_pages(snapshot: Callable[[], Any]) -> dict[str, Handler]:
    """The HTTP pages of a dashboard whose data *snapshot* returns (a dict, or an awaitable
    of one): ``/`` (the page) and ``/api/overlay`` (the document)."""
    def html(_query: str) -> Page:
        return 200, "text/html; charset=utf-8", page_html()

    def script(_query: str) -> Page:
        return 200, "text/javascript; charset=utf-8", _asset("dashboard.js")

    def style(_query: str) -> Page:
        return 200, "text/css; charset=utf-8", _asset("dashboard.css")

    async def overlay(_query: str) -> Page:
        doc = snapshot()
        if not isinstance(doc, dict):
            doc = await doc
        return 200, "application/json", json.dumps(doc).encode()

    return {"/": html, "/dashboard": html, "/dashboard.js": script, "/dashboard.css": style,
            "/api/overlay": overlay}


def flow_trees(statuses: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each flow's multicast tree across the routers whose *statuses* we have: an edge from
    a router to every downstream neighbour (router or application) with its band mask."""
    trees: dict[str, dict[str, Any]] = {}
    for router, st in statuses.items():
        peer_of = {str(lk["id"]): lk["peer"] or f"link {lk['id']}" for lk in st["links"]}
        for row in st["flows"][:10 * MAX_FLOWS_SHOWN]:
            tree = trees.setdefault(row["flow"], {"flow": row["flow"], "edges": [],
                                                  "aggregate": {}})
            tree["aggregate"][router] = row["aggregate"]
            for link, mask in row["downstream"].items():
                tree["edges"].append({"from": router, "to": peer_of.get(link, f"link {link}"),
                                      "mask": mask})
    return sorted(trees.values(), key=lambda t: -len(t["edges"]))[:MAX_FLOWS_SHOWN]


def router_overlay(node: RouterNode) -> dict[str, Any]:
    """A router's own view: itself, its neighbours (linked or configured) and its links."""
    # flow_trees looks at the first rows only: render no more (flowviews)
    st = node.status(flowviews.pick_flows(node, None, 10 * MAX_FLOWS_SHOWN))
    me = node.config.name
    routers = {me: {"name": me, "up": True, "flows": st["flow_count"]}}
    links = []
    for lk in st["links"]:
        if lk["role"] != "router" or not lk["peer"]:
            continue
        routers.setdefault(lk["peer"], {"name": lk["peer"], "up": lk["state"] == "up",
                                        "flows": 0})
        links.append({"name": f"{me}-{lk['peer']}", "a": me, "b": lk["peer"],
                      "state": "up" if lk["state"] == "up" else "down",
                      "frames": lk["rx"] + lk["tx"], "detail": lk["address"]})
    linked = {lk["b"] for lk in links}
    for peer in node.config.peers:
        name = peer.name or peer.address
        if name in linked:
            continue
        routers.setdefault(name, {"name": name, "up": False, "flows": 0})
        err = node.peer_errors.get(peer.address)
        blocked = bool(peer.name and peer.name in node.blocked_peers)
        links.append({"name": f"{me}-{name}", "a": me, "b": name,
                      "state": "cut" if blocked else "down", "frames": 0,
                      "detail": err[1] if err else "not connected yet"})
    events = [{"t": a.get("t", 0), "what": f"{a.get('kind')}: {a.get('detail')}"}
              for a in st.get("alerts", [])]
    return {"name": f"router {me}", "t": round(node.now() - node.core.started, 3),
            "routers": list(routers.values()), "links": links, "events": events,
            "flows": flow_trees({me: st})}


__all__ = ["dashboard_pages", "flow_trees", "page_html", "router_overlay"]
