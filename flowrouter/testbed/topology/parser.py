"""Parsing and validating a topology document into the model: :func:`loads` / :func:`load`.

Syntax errors take their line from :mod:`tomllib`; semantic errors find the offending key with
the :class:`~flowrouter.testbed.topology.locator.Locator`. May import the model, values and
faults modules.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from flowrouter.core.tables import Modifiers
from flowrouter.testbed.topofiles import resolve
from flowrouter.testbed.topology import regions
from flowrouter.testbed.topology.faults import ScheduleParser
from flowrouter.testbed.topology.model import (
    ROUTER_PARAMS,
    TRANSPORTS,
    Defaults,
    EndpointDefaults,
    EndpointSpec,
    LinkDefaults,
    LinkSpec,
    LocationService,
    RouterDefaults,
    RouterSpec,
    Site,
    Topology,
    TopologyError,
)
from flowrouter.testbed.topology.values import known_names, type_name


class Parser(ScheduleParser):
    """The whole document: defaults, sites, routers, endpoints, links, location services,
    faults; cross-checks of routes and ports."""

    def parse(self) -> Topology:
        try:
            doc = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            msg = str(exc)
            m = re.search(r"\(at line (\d+), column \d+\)", msg)
            line = int(m.group(1)) if m else None
            if m is None and "end of document" in msg:
                line = self.text.count("\n") + 1
            msg = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", msg)
            raise TopologyError(f"TOML syntax error: {msg}", self.source, line) from None
        top_keys = ("name", "description", "duration", "defaults", "sites", "routers",
                    "endpoints", "links", "location_services", "faults", "scenarios", "regions")
        self.keys(doc, (), top_keys, "the topology")
        name = self.name(doc.get("name", Path(self.source).stem if self.source[:1] != "<"
                                 else "topology"), ("name",), "topology name")
        description = self.text_(doc.get("description", ""), ("description",), "description")
        duration = None
        if "duration" in doc:
            duration = self.number(doc["duration"], ("duration",), "duration", lo_open=True,
                                   time=True)
        defaults = self.defaults(doc.get("defaults", {}))
        sites = self.sites(doc.get("sites", []))
        site_names = {s.name for s in sites}
        routers = self.routers(doc.get("routers", []), site_names, defaults)
        rnames = [r.name for r in routers]
        links = self.links(doc.get("links", []), rnames, defaults)
        endpoints = self.endpoints(doc.get("endpoints", []), rnames, defaults)
        routers, lss = self.location_services(doc.get("location_services", []), routers)
        self.check_routes(routers, links)
        self.check_members(doc.get("location_services", []), lss, links)
        link_ends = {lk.name: (lk.a, lk.b) for lk in links}
        faults = self.faults(doc.get("faults", []), ("faults",), link_ends)
        scenarios = self.scenarios(doc.get("scenarios", {}), link_ends)
        self.check_ports(routers, defaults)
        regs = regions.parse(self, doc.get("regions", []), rnames)
        topo = Topology(name=name, description=description, defaults=defaults,
                        sites=sites, routers=routers, endpoints=endpoints, links=links,
                        location_services=lss, faults=faults, scenarios=scenarios,
                        duration=duration, regions=regs, source=self.source)
        regions.check(topo)
        return topo

    def array(self, value: Any, path: tuple[Any, ...], what: str) -> list[dict[str, Any]]:
        if not isinstance(value, list):
            raise self.fail(path, f"{what} must be an array of tables ([[{path[-1]}]]), got "
                                  f"{type_name(value)}")
        for i, item in enumerate(value):
            self.table(item, path + (i,), f"{what} #{i + 1}")
        return value

    def defaults(self, value: Any) -> Defaults:
        p = ("defaults",)
        tbl = self.table(value, p, "[defaults]")
        self.keys(tbl, p, ("link", "endpoint", "router"), "[defaults]")
        lk_t = self.table(tbl.get("link", {}), p + ("link",), "[defaults.link]")
        self.keys(lk_t, p + ("link",), ("transport", "bandwidth", "delay", "loss", "modifiers",
                                        "queue_limit"), "[defaults.link]")
        base = LinkDefaults()
        link = self.link_values(lk_t, p + ("link",), "[defaults.link]", base.transport,
                                base.bandwidth, base.delay, base.loss, base.modifiers,
                                base.queue_limit)
        link_d = LinkDefaults(*link)
        ep_t = self.table(tbl.get("endpoint", {}), p + ("endpoint",), "[defaults.endpoint]")
        self.keys(ep_t, p + ("endpoint",), ("bandwidth", "delay", "modifiers"),
                  "[defaults.endpoint]")
        eb = EndpointDefaults()
        ep_d = EndpointDefaults(*self.endpoint_values(ep_t, p + ("endpoint",),
                                                      "[defaults.endpoint]", eb.bandwidth,
                                                      eb.delay, eb.modifiers))
        r_t = self.table(tbl.get("router", {}), p + ("router",), "[defaults.router]")
        self.keys(r_t, p + ("router",), ("host", "base_port", *ROUTER_PARAMS),
                  "[defaults.router]")
        rb = RouterDefaults()
        host = self.text_(r_t.get("host", rb.host), p + ("router", "host"), "host")
        port = self.integer(r_t.get("base_port", rb.base_port), p + ("router", "base_port"),
                            "base_port", 1, 65535)
        params = self.params(r_t, p + ("router",), "[defaults.router]")
        return Defaults(link_d, ep_d, RouterDefaults(host, port, params))

    def rate_delay(self, tbl: dict[str, Any], path: tuple[Any, ...], what: str,
                   bandwidth: float, delay: float) -> tuple[float, float]:
        """A link's or endpoint's ``bandwidth`` and ``delay`` from *tbl*, else the defaults."""
        if "bandwidth" in tbl:
            bandwidth = self.number(tbl["bandwidth"], path + ("bandwidth",),
                                    f"{what} bandwidth (bits/s)", bandwidth=True)
        if "delay" in tbl:
            delay = self.number(tbl["delay"], path + ("delay",), f"{what} delay (seconds)",
                                time=True)
        return bandwidth, delay

    def link_values(self, tbl: dict[str, Any], path: tuple[Any, ...], what: str,
                    transport: str, bandwidth: float, delay: float, loss: float,
                    mods: Modifiers, queue_limit: int
                    ) -> tuple[str, float, float, float, Modifiers, int]:
        if "transport" in tbl:
            transport = tbl["transport"]
            if transport not in TRANSPORTS:
                raise self.fail(path + ("transport",), f"{what}: transport must be one of "
                                f"{', '.join(TRANSPORTS)}, got {transport!r}")
        bandwidth, delay = self.rate_delay(tbl, path, what, bandwidth, delay)
        if "loss" in tbl:
            loss = self.number(tbl["loss"], path + ("loss",), f"{what} loss probability",
                               hi=1.0)
        if "modifiers" in tbl:
            mods = self.modifiers(tbl["modifiers"], path + ("modifiers",), what, mods)
        if "queue_limit" in tbl:
            queue_limit = self.integer(tbl["queue_limit"], path + ("queue_limit",),
                                       f"{what} queue_limit (bytes)", 0)
        return transport, bandwidth, delay, loss, mods, queue_limit

    def endpoint_values(self, tbl: dict[str, Any], path: tuple[Any, ...], what: str,
                        bandwidth: float, delay: float, mods: Modifiers
                        ) -> tuple[float, float, Modifiers]:
        bandwidth, delay = self.rate_delay(tbl, path, what, bandwidth, delay)
        if "modifiers" in tbl:
            mods = self.modifiers(tbl["modifiers"], path + ("modifiers",), what, mods)
        return bandwidth, delay, mods

    def sites(self, value: Any) -> tuple[Site, ...]:
        out: list[Site] = []
        seen: set[str] = set()
        for i, tbl in enumerate(self.array(value, ("sites",), "sites")):
            p = ("sites", i)
            self.keys(tbl, p, ("name", "description"), f"site #{i + 1}", ("name",))
            name = self.name(tbl["name"], p + ("name",), "site name")
            if name in seen:
                raise self.fail(p + ("name",), f"duplicate site name {name!r}")
            seen.add(name)
            out.append(Site(name, self.text_(tbl.get("description", ""),
                                             p + ("description",), "description")))
        return tuple(out)

    def routers(self, value: Any, sites: set[str], defaults: Defaults
                ) -> tuple[RouterSpec, ...]:
        out: list[RouterSpec] = []
        seen: set[str] = set()
        allowed = ("name", "site", "core_lsids", "port_offset", "host", "routes",
                   "default_route", *ROUTER_PARAMS)
        for i, tbl in enumerate(self.array(value, ("routers",), "routers")):
            p = ("routers", i)
            self.keys(tbl, p, allowed, f"router #{i + 1}", ("name",))
            name = self.name(tbl["name"], p + ("name",), "router name")
            what = f"router {name!r}"
            if name in seen:
                raise self.fail(p + ("name",), f"duplicate router name {name!r}")
            seen.add(name)
            site = None
            if "site" in tbl:
                site = self.name(tbl["site"], p + ("site",), f"{what} site")
                if site not in sites:
                    raise self.fail(p + ("site",), f"{what}: unknown site {site!r} (known: "
                                                   f"{known_names(sites)})")
            lsids = tbl.get("core_lsids", [])
            if not isinstance(lsids, list):
                raise self.fail(p + ("core_lsids",), f"{what}: core_lsids must be an array "
                                                     "of LSIDs, e.g. [0x10]")
            cores = tuple(sorted({self.lsid(v, p + ("core_lsids", j), f"{what} core LSID")
                                  for j, v in enumerate(lsids)}))
            port = None
            if "port_offset" in tbl:
                port = self.integer(tbl["port_offset"], p + ("port_offset",),
                                    f"{what} port_offset", 0, 65535)
            host = None
            if "host" in tbl:
                host = self.text_(tbl["host"], p + ("host",), f"{what} host")
            routes: list[tuple[int, str]] = []
            rv = tbl.get("routes", [])
            if not isinstance(rv, list):
                raise self.fail(p + ("routes",), f"{what}: routes must be an array of "
                                                 "{lsid = 0x10, via = \"router\"}")
            for j, r in enumerate(rv):
                rp = p + ("routes", j)
                rt = self.table(r, rp, f"{what} route #{j + 1}")
                self.keys(rt, rp, ("lsid", "via"), f"{what} route #{j + 1}", ("lsid", "via"))
                lsid = self.lsid(rt["lsid"], rp + ("lsid",), f"{what} route LSID")
                if any(lsid == x for x, _ in routes):
                    raise self.fail(rp + ("lsid",), f"{what}: two static routes for LSID "
                                                    f"{lsid:#x}")
                routes.append((lsid, self.name(rt["via"], rp + ("via",), f"{what} route via")))
            default_route = None
            if "default_route" in tbl:
                default_route = self.name(tbl["default_route"], p + ("default_route",),
                                          f"{what} default_route")
            params = self.params(tbl, p, what)
            merged = dict(defaults.router.params) | dict(params)
            if ("ping_after" in merged and "delete_after" in merged
                    and not merged["delete_after"] > merged["ping_after"]):
                raise self.fail(p, f"{what}: delete_after must be greater than ping_after "
                                   "(after applying [defaults.router])")
            out.append(RouterSpec(name, site, cores, port, host, tuple(routes), default_route,
                                  params))
        return tuple(out)

    def endpoints(self, value: Any, routers: list[str], defaults: Defaults
                  ) -> tuple[EndpointSpec, ...]:
        out: list[EndpointSpec] = []
        seen = set(routers)
        d = defaults.endpoint
        for i, tbl in enumerate(self.array(value, ("endpoints",), "endpoints")):
            p = ("endpoints", i)
            self.keys(tbl, p, ("name", "router", "roles", "bandwidth", "delay", "modifiers"),
                      f"endpoint #{i + 1}", ("name", "router"))
            name = self.name(tbl["name"], p + ("name",), "endpoint name")
            what = f"endpoint {name!r}"
            if name in seen:
                kind = "router" if name in routers else "endpoint"
                raise self.fail(p + ("name",), f"duplicate name {name!r} (already used by a "
                                               f"{kind}; routers and endpoints share names)")
            seen.add(name)
            router = self.name(tbl["router"], p + ("router",), f"{what} router")
            if router not in routers:
                raise self.fail(p + ("router",), f"{what}: unknown router {router!r} (known: "
                                                 f"{known_names(routers)})")
            roles = tbl.get("roles", [])
            if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
                raise self.fail(p + ("roles",), f"{what}: roles must be an array of strings")
            bw, delay, mods = self.endpoint_values(tbl, p, what, d.bandwidth, d.delay,
                                                   d.modifiers)
            out.append(EndpointSpec(name, router, tuple(roles), bw, delay, mods))
        return tuple(out)

    def links(self, value: Any, routers: list[str], defaults: Defaults
              ) -> tuple[LinkSpec, ...]:
        out: list[LinkSpec] = []
        seen: set[str] = set()
        d = defaults.link
        rset = set(routers)
        allowed = ("name", "a", "b", "transport", "bandwidth", "delay", "loss", "modifiers",
                   "oneway", "queue_limit")
        for i, tbl in enumerate(self.array(value, ("links",), "links")):
            p = ("links", i)
            self.keys(tbl, p, allowed, f"link #{i + 1}", ("a", "b"))
            ends = []
            for end in ("a", "b"):
                r = self.name(tbl[end], p + (end,), f"link #{i + 1} end {end!r}")
                ends.append(r)
            a, b = ends
            name = tbl.get("name", f"{a}-{b}")
            name = self.name(name, p + ("name",) if "name" in tbl else p, "link name")
            what = f"link {name!r}"
            for end, r in (("a", a), ("b", b)):
                if r not in rset:
                    raise self.fail(p + (end,), f"{what}: unknown router {r!r} in {end!r} "
                                                f"(known: {known_names(routers)})")
            if a == b:
                raise self.fail(p + ("b",), f"{what} connects router {a!r} to itself")
            if name in seen:
                raise self.fail(p + ("name",) if "name" in tbl else p,
                                f"duplicate link name {name!r} (give parallel links "
                                "distinct names with name = \"...\")")
            seen.add(name)
            values = self.link_values(tbl, p, what, d.transport, d.bandwidth, d.delay,
                                      d.loss, d.modifiers, d.queue_limit)
            oneway = tbl.get("oneway", False)
            if not isinstance(oneway, bool):
                raise self.fail(p + ("oneway",), f"{what}: oneway must be true or false")
            transport, bw, delay, loss, mods, ql = values
            out.append(LinkSpec(name, a, b, transport, bw, delay, loss, mods, oneway, ql))
        return tuple(out)

    def location_services(self, value: Any, routers: tuple[RouterSpec, ...]
                          ) -> tuple[tuple[RouterSpec, ...], tuple[LocationService, ...]]:
        by_name = {r.name: r for r in routers}
        cores: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        direct: set[int] = set()
        for i, tbl in enumerate(self.array(value, ("location_services",),
                                           "location_services")):
            p = ("location_services", i)
            self.keys(tbl, p, ("lsid", "name", "cores", "direct"),
                      f"location service #{i + 1}", ("lsid", "cores"))
            lsid = self.lsid(tbl["lsid"], p + ("lsid",), "location service lsid")
            if lsid in names:
                raise self.fail(p + ("lsid",), f"LSID {lsid:#x} has two [[location_services]] "
                                               "entries")
            names[lsid] = self.text_(tbl.get("name", ""), p + ("name",), "name")
            if not isinstance(tbl.get("direct", False), bool):
                raise self.fail(p + ("direct",), f"location service {lsid:#x}: direct must "
                                                 "be true or false")
            if tbl.get("direct", False):
                direct.add(lsid)
            cl = tbl["cores"]
            if not isinstance(cl, list) or not cl:
                raise self.fail(p + ("cores",), f"location service {lsid:#x}: cores must be "
                                                "a non-empty array of router names")
            lst = cores.setdefault(lsid, [])
            for j, c in enumerate(cl):
                c = self.name(c, p + ("cores", j), "core router")
                if c not in by_name:
                    raise self.fail(p + ("cores", j), f"location service {lsid:#x}: unknown "
                                                      f"router {c!r} (known: "
                                                      f"{known_names(list(by_name))})")
                if c not in lst:
                    lst.append(c)
        for r in routers:  # routers' own core_lsids join the placement
            for lsid in r.core_lsids:
                lst = cores.setdefault(lsid, [])
                if r.name not in lst:
                    lst.append(r.name)
                names.setdefault(lsid, "")
        order = [r.name for r in routers]
        new_routers = tuple(
            RouterSpec(r.name, r.site, tuple(sorted(lsid for lsid, cs in cores.items()
                                                    if r.name in cs)),
                       r.port_offset, r.host, r.routes, r.default_route, r.params)
            for r in routers)
        lss = tuple(LocationService(lsid, tuple(sorted(cores[lsid], key=order.index)),
                                    names[lsid], lsid in direct) for lsid in sorted(cores))
        return new_routers, lss

    def check_routes(self, routers: tuple[RouterSpec, ...], links: tuple[LinkSpec, ...]
                     ) -> None:
        for i, r in enumerate(routers):
            nbrs = {lk.other(r.name) for lk in links if r.name in (lk.a, lk.b)}
            for j, (lsid, via) in enumerate(r.routes):
                if via not in nbrs:
                    raise self.fail(("routers", i, "routes", j, "via"),
                                    f"router {r.name!r}: static route for LSID {lsid:#x} via "
                                    f"{via!r}, which is not a neighbour (neighbours: "
                                    f"{known_names(nbrs)})")
            if r.default_route is not None and r.default_route not in nbrs:
                raise self.fail(("routers", i, "default_route"),
                                f"router {r.name!r}: default_route {r.default_route!r} is not "
                                f"a neighbour (neighbours: {known_names(nbrs)})")

    def check_members(self, tables: Any, lss: tuple[LocationService, ...],
                      links: tuple[LinkSpec, ...]) -> None:
        """A location service's members need not be a full mesh, but their own links must
        connect them all: they pass its flows' traffic to each other along a spanning tree
        of those links (flowrouter.core.lstree)."""
        for ls in lss:
            members = set(ls.cores)
            adj: dict[str, set[str]] = {m: set() for m in members}
            for lk in links:
                if lk.a in members and lk.b in members:
                    adj[lk.a].add(lk.b)
                    adj[lk.b].add(lk.a)
            seen, todo = {ls.cores[0]}, [ls.cores[0]]
            while todo:
                for n in adj[todo.pop()] - seen:
                    seen.add(n)
                    todo.append(n)
            if seen == members:
                continue
            index = next((i for i, t in enumerate(tables if isinstance(tables, list) else [])
                          if isinstance(t, dict) and t.get("lsid") in (ls.lsid, hex(ls.lsid))),
                         None)
            path: tuple[Any, ...] = ("location_services", index) if index is not None \
                else ("routers",)
            cut = [m for m in ls.cores if m not in seen]
            raise self.fail(path, f"location service {ls.lsid:#x}: members {', '.join(cut)} "
                                  f"have no path of member-to-member links to "
                                  f"{', '.join(m for m in ls.cores if m in seen)} (a location "
                                  "service's members must be connected by links among "
                                  "themselves; a full mesh is not needed)")

    def check_ports(self, routers: tuple[RouterSpec, ...], defaults: Defaults) -> None:
        used: dict[tuple[str, int], str] = {}
        for i, r in enumerate(routers):
            off = r.port_offset if r.port_offset is not None else i
            port = defaults.router.base_port + off
            if port > 65535:
                raise self.fail(("routers", i), f"router {r.name!r}: listen port {port} "
                                                "(base_port + port_offset) exceeds 65535")
            key = (r.host or defaults.router.host, port)
            if key in used:
                raise self.fail(("routers", i, "port_offset") if r.port_offset is not None
                                else ("routers", i),
                                f"router {r.name!r} would listen on port {port}, already "
                                f"used by router {used[key]!r}")
            used[key] = r.name


def loads(text: str, source: str = "<string>") -> Topology:
    """Parse and validate topology TOML *text*; *source* names it in error messages."""
    return Parser(text, source).parse()


def load(path: str | Path) -> Topology:
    """Read and validate a topology file (a shipped one by its name, too: see
    :func:`flowrouter.testbed.topofiles.resolve`)."""
    p = resolve(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"cannot read: {exc.strerror or exc}", str(p)) from None
    except UnicodeDecodeError as exc:
        raise TopologyError(f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                            str(p)) from None
    return loads(text, str(p))
