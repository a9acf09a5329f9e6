"""The simulated network: sans-I/O routers, endpoints and virtual links in virtual time.

Every router is the very :class:`flowrouter.core.router.Router` the daemon runs; the network feeds
it the events a runtime would (``open_link`` when a transport connects, ``receive`` per frame,
``close_link`` when a transport breaks, ``tick`` every ``tick_interval`` virtual seconds) and
carries out the actions it returns (``Send`` on a link, ``Close`` of a link).

Links behave like TCP connections: when a link goes down (a scheduled outage) the routers at
both ends get ``close_link`` and every frame queued or in flight is lost; when it comes back
they get a fresh ``open_link`` pair (new link ids) and say HELLO again. A link the router
itself closes (malformed frame, handshake time-out) is re-dialled after ``reconnect_delay``.

Determinism: one ``seed`` fixes every random choice (per-link loss draws, the order in which
links come up — which decides ties between equally short routes — and workload draws made
through :attr:`SimNetwork.rng`); events at the same virtual time run in the order they were
scheduled. Two runs with the same seed and inputs give identical traces.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from flowrouter.core.router import Router, RouterParams, Send
from flowrouter.core.tables import Modifiers
from flowrouter.testbed.sim.endpoint import SimEndpoint
from flowrouter.testbed.sim.engine import EventQueue
from flowrouter.testbed.sim.links import Direction, SimLink
from flowrouter.testbed.topology import Fault, Topology, node_id_for
from flowrouter.testbed.topology.regions import region_params
from flowrouter.wire.header import DEFAULT_MAX_PAYLOAD


class TraceRecord(NamedTuple):
    """One simulator event. ``event`` is one of: send, drop, deliver, down, up, dir-down,
    dir-up, set, close, error. ``node`` is the sending node (send/drop), the receiving
    endpoint (deliver) or the router concerned (close/error)."""

    time: float
    event: str
    link: str
    node: str
    band: int
    size: int
    detail: str


class SimulationError(RuntimeError):
    """A router raised while handling an event (strict mode)."""


class _SortedKeys(dict):  # type: ignore[type-arg]
    """A set stand-in (add/discard) that iterates in insertion order."""

    def add(self, key: bytes) -> None:
        self[key] = None

    def discard(self, key: bytes) -> None:
        self.pop(key, None)


class RouterNode:
    """Glue between one sans-I/O Router and the simulated links attached to it."""

    __slots__ = ("name", "router", "net", "q", "ports", "links", "_next_lid", "site")

    def __init__(self, net: SimNetwork, router: Router, site: str | None = None) -> None:
        self.name = router.p.name
        self.router = router
        self.net = net
        self.q = net.queue
        self.ports: dict[int, Direction] = {}  #: link id -> outgoing direction
        self.links: dict[int, SimLink] = {}
        self._next_lid = 1
        self.site = site

    @property
    def next_link_id(self) -> int:
        """The id the next :meth:`attach` gives: the network tells both ends of a link their
        ids before either end's router says HELLO."""
        return self._next_lid

    def attach(self, link: SimLink, out: Direction, peer: str) -> int:
        lid = self._next_lid
        self._next_lid += 1
        self.ports[lid] = out
        self.links[lid] = link
        net = self.net
        acts = self._call("open_link", self.router.open_link, lid, net.now,
                          transport=link.transport, address=f"sim:{link.name}",
                          modifiers=link.modifiers,
                          expected_peer=peer if link.kind == "router" else None)
        if acts:
            self.apply(acts)
        return lid

    def close(self, lid: int, reason: str) -> None:
        lk = self.router.links.get(lid)
        if lk is not None and len(lk.dependent) > 1:
            # Router.close_link walks this set; a set of bytes iterates in hash order, which
            # changes between processes (PYTHONHASHSEED). Sorted order keeps runs identical.
            lk.dependent = _SortedKeys.fromkeys(sorted(lk.dependent))  # type: ignore[assignment]
        acts = self._call("close_link", self.router.close_link, lid, self.net.now, reason)
        self.ports.pop(lid, None)
        self.links.pop(lid, None)
        if acts:
            self.apply(acts)

    def on_frame(self, lid: int, header: bytes, payload: bytes | memoryview) -> None:
        try:
            acts = self.router.receive(lid, header, payload, self.q.now)
        except Exception as exc:  # noqa: BLE001 - reported, see SimNetwork.strict
            self.net.router_error(self, "receive", exc)
            return
        if acts:
            self.apply(acts)

    def tick(self, now: float) -> None:
        if self.router.p.locality_mapping is not None:
            self._measure_throughput(now)
        try:
            acts = self.router.tick(now)
        except Exception as exc:  # noqa: BLE001
            self.net.router_error(self, "tick", exc)
            return
        if acts:
            self.apply(acts)

    def _measure_throughput(self, now: float) -> None:
        """Measured locality's throughput (flowrouter.core.measured.BusyRate: the send rate
        while backlogged, an estimate of capacity): a simulated wire that still has frames
        to serialise at a tick is backlogged, and sends at exactly its bandwidth."""
        for lid, out in self.ports.items():
            if out.bandwidth and out.busy_until > now:
                self.router.measure_throughput(lid, out.bandwidth, now)

    def _call(self, what: str, fn: Callable[..., list[Any]], *args: Any, **kw: Any
              ) -> list[Any]:
        try:
            return fn(*args, **kw)
        except Exception as exc:  # noqa: BLE001
            self.net.router_error(self, what, exc)
            return []

    def apply(self, actions: list[Any]) -> None:
        ports = self.ports
        for act in actions:
            if type(act) is Send:
                out = ports.get(act.link)
                if out is None:
                    self.net.counters["send-on-closed-link"] += 1
                    continue
                out.transmit(act.header, act.payload)
            else:  # Close
                self.net.router_closed(self, act.link, act.reason)


class SimNetwork:
    """A whole overlay in virtual time. See the module docs and ``topologies/README.md``."""

    def __init__(self, seed: int = 0, *, tick_interval: float = 0.1, trace: bool = False,
                 strict: bool = True, reconnect_delay: float = 1.0,
                 shuffle_links: bool = True,
                 router_factory: Callable[[RouterParams, float], Router] | None = None
                 ) -> None:
        if tick_interval <= 0:
            raise ValueError("tick_interval must be positive")
        self.seed = seed
        #: for workloads: every random choice of an experiment should come from here
        self.rng = random.Random(f"{seed}/workload")
        self.queue = EventQueue()
        self.tick_interval = tick_interval
        self.strict = strict
        self.reconnect_delay = reconnect_delay
        self.shuffle_links = shuffle_links
        #: builds each router from its params and start time (e.g. to attach a tracer)
        self.router_factory = router_factory or (lambda p, now: Router(p, now=now))
        self.routers: dict[str, Router] = {}
        self.nodes: dict[str, RouterNode] = {}
        self.endpoints: dict[str, SimEndpoint] = {}
        self.links: dict[str, SimLink] = {}
        self._nodes: dict[str, RouterNode | SimEndpoint] = {}
        self.trace: list[TraceRecord] | None = [] if trace else None
        self.errors: list[tuple[float, str, str, str]] = []  #: (time, router, event, error)
        self.counters: Counter[str] = Counter()
        self.ticks = 0  #: router tick calls
        self.tick_rounds = 0  #: tick events (each ticks every router)
        self.topology: Topology | None = None
        self.scenario: str | None = None
        self._started = False

    # ------------------------------------------------------------------ clock
    @property
    def now(self) -> float:
        return self.queue.now

    def schedule(self, t: float, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` at virtual time *t* (absolute seconds)."""
        self.queue.schedule(t, callback, *args)

    def after(self, delay: float, callback: Callable[..., Any], *args: Any) -> None:
        self.queue.schedule(self.now + delay, callback, *args)

    def run_until(self, t: float) -> None:
        """Advance virtual time to *t*, running every event due by then."""
        if not self._started:
            self._start()
        self.queue.run_until(t)

    def run_for(self, duration: float) -> None:
        self.run_until(self.now + duration)

    def _start(self) -> None:
        self._started = True
        self.queue.schedule(self.tick_interval, self._tick_all, 1)

    def _tick_all(self, k: int) -> None:
        now = self.queue.now
        for node in self.nodes.values():
            node.tick(now)
        self.ticks += len(self.nodes)
        self.tick_rounds += 1
        self.queue.schedule((k + 1) * self.tick_interval, self._tick_all, k + 1)

    # ------------------------------------------------------------------ building
    def add_router(self, name: str, *, core_lsids: Iterable[int] = (),
                   routes: dict[int, str] | None = None, default_route: str | None = None,
                   epoch: float = 5.0, ping_after: int = 3, delete_after: int = 6,
                   join_timeout: float = 5.0, max_payload: int = DEFAULT_MAX_PAYLOAD,
                   max_flows: int = 1_000_000, default_lsid: int = 0,
                   site: str | None = None, node_id: int | None = None,
                   member_notices: float = 0.0, member_refresh: float = 30.0,
                   **soft: Any) -> Router:
        """A router; *soft* sets its soft-state timing (``liveness_interval``,
        ``dead_after``, ``refresh_interval``, ``hold_factor``: see RouterParams);
        *member_notices* the interval of its band-19 membership notices (0: off)."""
        self._check_new_name(name)
        params = RouterParams(
            name=name, node_id=node_id if node_id is not None else node_id_for(name),
            max_payload=max_payload, core_lsids=frozenset(core_lsids),
            default_lsid=default_lsid, routes=dict(routes or {}), default_route=default_route,
            epoch_length=epoch, gc_ping_after=ping_after, gc_delete_after=delete_after,
            join_timeout=join_timeout, max_flows=max_flows,
            member_notice_interval=member_notices, member_refresh=member_refresh, **soft)
        router = self.router_factory(params, self.now)
        node = RouterNode(self, router, site)
        self.routers[name] = router
        self.nodes[name] = node
        self._nodes[name] = node
        return router

    def set_control_loss(self, p: float, links: Iterable[str] | None = None) -> None:
        """Lose each control frame (router bands, link-local) with probability *p* on every
        link (or the named ones), in both directions, whatever the transport."""
        if not 0 <= p <= 1:
            raise ValueError(f"control loss must be 0..1, got {p!r}")
        for name in (self.links if links is None else links):
            link = self.links[name]
            for d in (link.ab, link.ba):
                d.set_control_loss(p)

    def add_endpoint(self, name: str, router: str, *, delay: float = 0.0001,
                     bandwidth: float = 0.0, modifiers: Modifiers | None = None,
                     roles: Iterable[str] = (), repair: bool = False,
                     **options: Any) -> SimEndpoint:
        """Attach a new endpoint to *router* (its link connects at the current time)."""
        self._check_new_name(name)
        if router not in self.nodes:
            raise KeyError(f"unknown router {router!r}")
        ep = SimEndpoint(self, name, router, node_id_for(name), roles=tuple(roles),
                         repair=repair, **options)
        self.endpoints[name] = ep
        self._nodes[name] = ep
        link = SimLink(self, f"{name}@{router}", name, router, transport="tcp",
                       bandwidth=bandwidth, delay=delay, loss=0.0,
                       modifiers=modifiers or Modifiers(), oneway=False, queue_limit=0,
                       kind="endpoint")
        ep.link_name = link.name
        self.links[link.name] = link
        self.queue.schedule(self.now, self._connect, link)
        return ep

    def add_link(self, a: str, b: str, *, name: str | None = None, transport: str = "tcp",
                 bandwidth: float = 0.0, delay: float = 0.001, loss: float = 0.0,
                 modifiers: Modifiers | None = None, oneway: bool = False,
                 queue_limit: int = 0) -> SimLink:
        """Connect routers *a* and *b* (the transport comes up at the current time)."""
        for r in (a, b):
            if r not in self.nodes:
                raise KeyError(f"unknown router {r!r}")
        if a == b:
            raise ValueError(f"a link cannot connect router {a!r} to itself")
        name = name or f"{a}-{b}"
        if name in self.links:
            raise ValueError(f"duplicate link name {name!r}")
        link = SimLink(self, name, a, b, transport=transport, bandwidth=bandwidth,
                       delay=delay, loss=loss, modifiers=modifiers or Modifiers(),
                       oneway=oneway, queue_limit=queue_limit, kind="router")
        self.links[name] = link
        self.queue.schedule(self.now, self._connect, link)
        return link

    def _check_new_name(self, name: str) -> None:
        if name in self._nodes:
            raise ValueError(f"duplicate node name {name!r}")

    @classmethod
    def from_topology(cls, topo: Topology, *, seed: int = 0, scenario: str | None = None,
                      **options: Any) -> SimNetwork:
        """Build the network a topology file describes, with its (scenario's) faults.

        *options* go to the constructor (``tick_interval``, ``trace``, ``strict``, ...);
        ``endpoint_options`` (a dict) goes to every :class:`SimEndpoint`, e.g.
        ``{"repair": True, "retry_interval": 0.5}``; ``router_options`` (a dict) goes to
        every :meth:`add_router`, e.g. ``{"refresh_interval": 2.0}``; ``aggregate`` (default
        True) makes the edges of the topology's regions carry end flows in aggregates
        (False: the regions' routers are ordinary routers).
        """
        endpoint_options = options.pop("endpoint_options", {})
        router_options = options.pop("router_options", {})
        aggregate = options.pop("aggregate", True)
        net = cls(seed, **options)
        net.topology = topo
        net.scenario = scenario
        faults = topo.faults_for(scenario)  # KeyError for an unknown scenario, up front
        edges = region_params(topo) if aggregate else {}
        for r in topo.routers:
            params: dict[str, Any] = topo.router_params(r.name)
            for k in ("ping_after", "delete_after", "max_payload", "max_flows"):
                if k in params:
                    params[k] = int(params[k])
            if r.name in edges:
                params["region"] = edges[r.name]
            if topo.direct_lsids(r.name):
                params["direct_lsids"] = topo.direct_lsids(r.name)
            net.add_router(r.name, core_lsids=r.core_lsids, routes=dict(r.routes),
                           default_route=r.default_route, site=r.site,
                           **{**params, **router_options})
        order = list(topo.links)
        if net.shuffle_links:
            random.Random(f"{seed}/link-order").shuffle(order)
        for lk in order:
            net.add_link(lk.a, lk.b, name=lk.name, transport=lk.transport,
                         bandwidth=lk.bandwidth, delay=lk.delay, loss=lk.loss,
                         modifiers=lk.modifiers, oneway=lk.oneway, queue_limit=lk.queue_limit)
        for e in topo.endpoints:
            net.add_endpoint(e.name, e.router, delay=e.delay, bandwidth=e.bandwidth,
                             modifiers=e.modifiers, roles=e.roles, **endpoint_options)
        for f in faults:
            net.apply_fault(f)
        return net

    # ------------------------------------------------------------------ link state
    def _connect(self, link: SimLink) -> None:
        if link.connected or link.down:
            return
        link.connected = True
        link.connects += 1
        link.ab.reset()
        link.ba.reset()
        if self.trace is not None:
            self.record(self.now, "up", link.name, "", 0, 0, "")
        na, nb = self._nodes[link.a], self._nodes[link.b]
        # both ends get their link ids before either says HELLO
        link.lid_a = na.next_link_id if isinstance(na, RouterNode) else link.connects
        link.lid_b = nb.next_link_id if isinstance(nb, RouterNode) else link.connects
        link.ab.dst_lid = link.lid_b
        link.ba.dst_lid = link.lid_a
        for node, lid, out, peer in ((na, link.lid_a, link.ab, link.b),
                                     (nb, link.lid_b, link.ba, link.a)):
            if isinstance(node, RouterNode):
                node.attach(link, out, peer)
            else:
                node.attach(lid, out)

    def _disconnect(self, link: SimLink, reason: str, skip: str | None = None) -> None:
        if not link.connected:
            return
        link.connected = False
        link.ab.reset()
        link.ba.reset()
        link.ab.dst_lid = link.ba.dst_lid = None
        if self.trace is not None:
            self.record(self.now, "down", link.name, skip or "", 0, 0, reason)
        for name, lid in ((link.a, link.lid_a), (link.b, link.lid_b)):
            if name == skip or lid is None:
                continue
            self._nodes[name].close(lid, reason)
        link.lid_a = link.lid_b = None

    def router_closed(self, node: RouterNode, lid: int, reason: str) -> None:
        """A router's Close action, carried out by its :class:`RouterNode`: tear the
        transport down and re-dial later."""
        link = node.links.get(lid)
        node.ports.pop(lid, None)
        node.links.pop(lid, None)
        if link is None:
            return
        self.counters["links.closed-by-router"] += 1
        if self.trace is not None:
            self.record(self.now, "close", link.name, node.name, 0, 0, reason)
        self._disconnect(link, f"closed by {node.name}: {reason}", skip=node.name)
        self.queue.schedule(self.now + self.reconnect_delay, self._connect, link)

    def link_end(self, name: str) -> RouterNode | SimEndpoint:
        """The router (its glue) or endpoint named *name*, as a link end: what a link's
        direction delivers its frames to."""
        return self._nodes[name]

    def link(self, name: str) -> SimLink:
        try:
            return self.links[name]
        except KeyError:
            raise KeyError(f"unknown link {name!r}") from None

    def link_down(self, name: str, direction: str | None = None) -> None:
        """Start an outage now (outages nest: the link is up when none is active)."""
        link = self.link(name)
        if direction is not None:
            d = link.direction_from(direction)
            d.down += 1
            if d.down == 1:
                d.reset()  # frames in flight that way are lost
                if self.trace is not None:
                    self.record(self.now, "dir-down", name, direction, 0, 0, "")
            return
        link.down += 1
        if link.down == 1:
            self._disconnect(link, "scheduled outage")

    def link_up(self, name: str, direction: str | None = None) -> None:
        """End an outage started by :meth:`link_down`."""
        link = self.link(name)
        if direction is not None:
            d = link.direction_from(direction)
            if d.down:
                d.down -= 1
                d.refresh()
                if not d.down and self.trace is not None:
                    self.record(self.now, "dir-up", name, direction, 0, 0, "")
            return
        if link.down:
            link.down -= 1
            if not link.down:
                self._connect(link)

    def set_link(self, name: str, *, bandwidth: float | None = None,
                 delay: float | None = None, loss: float | None = None,
                 direction: str | None = None) -> None:
        """Change a link's bandwidth, delay or loss from now on (both directions unless one
        is named by its sending router)."""
        link = self.link(name)
        dirs = [link.direction_from(direction)] if direction else [link.ab, link.ba]
        for d in dirs:
            if bandwidth is not None:
                d.bandwidth = bandwidth
            if delay is not None:
                d.delay = delay
            if loss is not None:
                d.loss = loss
        if self.trace is not None:
            self.record(self.now, "set", name, direction or "", 0, 0,
                        f"bandwidth={bandwidth} delay={delay} loss={loss}")

    def reset_link(self, name: str, direction: str | None = None) -> None:
        """Return a link to its configured bandwidth, delay and loss."""
        bw, dl, ls = self.link(name).base
        self.set_link(name, bandwidth=bw, delay=dl, loss=ls, direction=direction)

    def apply_fault(self, fault: Fault) -> None:
        """Schedule a topology :class:`~flowrouter.testbed.topology.Fault` (times are absolute)."""
        for name in fault.links:
            self.link(name)
        kind = fault.kind
        if kind == "outage":
            assert fault.at is not None
            for name in fault.links:
                self.schedule(max(fault.at, self.now), self.link_down, name, fault.direction)
                if fault.until is not None:
                    self.schedule(max(fault.until, self.now), self.link_up, name,
                                  fault.direction)
        elif kind == "set":
            assert fault.at is not None
            for name in fault.links:
                self.schedule(max(fault.at, self.now), self._set_from_fault, name, fault)
                if fault.until is not None:
                    self.schedule(max(fault.until, self.now), self.reset_link, name,
                                  fault.direction)
        else:
            assert fault.start is not None
            self.schedule(max(fault.start, self.now), self._repeat_down, fault, fault.start)

    def _set_from_fault(self, name: str, f: Fault) -> None:
        self.set_link(name, bandwidth=f.bandwidth, delay=f.delay, loss=f.loss,
                      direction=f.direction)

    def _repeat_down(self, f: Fault, t: float) -> None:
        assert f.down is not None and f.up is not None
        end = f.until if f.until is not None else float("inf")
        if t >= end:
            return
        for name in f.links:
            self.link_down(name, f.direction)
        self.schedule(min(t + f.down, end), self._repeat_up, f, t)

    def _repeat_up(self, f: Fault, t: float) -> None:
        assert f.down is not None and f.up is not None
        for name in f.links:
            self.link_up(name, f.direction)
        nxt = t + f.down + f.up
        if f.until is None or nxt < f.until:
            self.schedule(nxt, self._repeat_down, f, nxt)

    # ------------------------------------------------------------------ errors and traces
    def router_error(self, node: RouterNode, what: str, exc: Exception) -> None:
        """A router raised while its :class:`RouterNode` fed it an event: count and record
        it, and in strict mode stop the run with :class:`SimulationError`."""
        text = f"{type(exc).__name__}: {exc}"
        self.errors.append((self.now, node.name, what, text))
        self.counters["router-errors"] += 1
        if self.trace is not None:
            self.record(self.now, "error", "", node.name, 0, 0, f"{what}: {text}")
        if self.strict:
            raise SimulationError(f"router {node.name} raised in {what} at t={self.now:.6f}: "
                                  f"{text}") from exc

    def record(self, t: float, event: str, link: str, node: str, band: int, size: int,
               detail: str) -> None:
        """Append one :class:`TraceRecord` (on a network built with ``trace=True`` only:
        callers test ``trace is not None`` first, which keeps an untraced run cheap); links
        and endpoints report their sends, drops and deliveries here."""
        assert self.trace is not None
        self.trace.append(TraceRecord(t, event, link, node, band, size, detail))

    def write_trace(self, path: str | Path) -> int:
        """Write the trace as JSON lines (one object per record); returns the count."""
        if self.trace is None:
            raise RuntimeError("this network was built with trace=False")
        with open(path, "w", encoding="utf-8") as fh:
            for rec in self.trace:
                fh.write(json.dumps(rec._asdict(), separators=(",", ":")) + "\n")
        return len(self.trace)

    # ------------------------------------------------------------------ inspection
    def router_counters(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.routers.values():
            total.update(r.counters)
        return total

    def link_drops(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for lk in self.links.values():
            total.update(lk.ab.drops)
            total.update(lk.ba.drops)
        return total

    def frames_delivered(self) -> int:
        return sum(lk.ab.delivered + lk.ba.delivered for lk in self.links.values())

    def path(self, flow_key: bytes, router: str) -> list[str]:
        """Routers from *router* up the flow's tree to its core (for tests and debugging)."""
        out = [router]
        seen = {router}
        while True:
            node = self.nodes[out[-1]]
            entry = node.router.flows.get(flow_key)
            if entry is None or entry.upstream is None:
                return out
            link = node.links.get(entry.upstream)
            if link is None:
                return out
            nxt = link.b if link.a == node.name else link.a
            if nxt in seen or nxt not in self.nodes:
                return out + [nxt]
            seen.add(nxt)
            out.append(nxt)

    def stats(self) -> dict[str, Any]:
        return {
            "time": self.now, "seed": self.seed, "scenario": self.scenario,
            "routers": len(self.routers), "endpoints": len(self.endpoints),
            "links": sum(1 for lk in self.links.values() if lk.kind == "router"),
            "events": self.queue.processed, "router_ticks": self.ticks,
            "tick_rounds": self.tick_rounds,
            "frames_delivered": self.frames_delivered(),
            "link_drops": dict(sorted(self.link_drops().items())),
            "router_counters": dict(sorted(self.router_counters().items())),
            "errors": len(self.errors),
        }

