"""RouterNode: one router daemon: the sans-I/O core plus its sockets, timers and re-dials.

It owns the link table of transports, dials its configured peers (re-dialling with
exponential back-off: :mod:`flowrouter.net.dialer`), runs the clock (``Router.tick``),
carries out the core's actions, applies link emulation and administrative link state,
enforces progress (slow consumers, stalled frames; the decisions are its flow control's,
:mod:`flowrouter.net.backpressure`), and serves the control interface
(:mod:`flowrouter.net.control`, commands checked by :mod:`flowrouter.net.commandauth`).

Its links (:mod:`flowrouter.net.tcp` for TCP, :mod:`flowrouter.net.udp`) and their outputs
see it only as the node interface, :class:`flowrouter.net.nodeapi.Node`: it implements that
protocol, and each read of any link is one :class:`~flowrouter.net.nodeapi.ReadBatch`.

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire` and the rest of
:mod:`flowrouter.net` (it is the top of the package but for ``runtime`` and monitoring).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterable
from typing import Any

from flowrouter.core.fastpath import FastPath, engine_choice, fast_path_off
from flowrouter.core.router import Action, Close, Router, Secure, Send
from flowrouter.core.tables import LinkState
from flowrouter.core.traces import NULL_TRACER, TraceWriter
from flowrouter.net import flowviews
from flowrouter.net.appdgram import AppDatagrams
from flowrouter.net.backpressure import Backpressure
from flowrouter.net.commandauth import CommandGuard
from flowrouter.net.config import Emulation, NodeConfig, PeerConfig, parse_address
from flowrouter.net.connlimits import ConnectionGate, descriptors_open, raise_descriptor_limit
from flowrouter.net.control import CONTROL_LINE_LIMIT
from flowrouter.net.control import serve_client as serve_control_client
from flowrouter.net.dialer import Dialer
from flowrouter.net.linksecurity import link_auth_status, sealed_stream
from flowrouter.net.nodeapi import Link, ReadBatch
from flowrouter.net.operate import Operations
from flowrouter.net.redial import peer_rows
from flowrouter.net.tcp import TcpLink, reap_stalled_frames
from flowrouter.net.udp import UdpLink, UdpLinks
from flowrouter.net.writepool import default_threads
from flowrouter.wire.control import Role

log = logging.getLogger("flowrouter.net.runtime")


class RouterNode:
    """One router process: the core plus its sockets. ``await start()``, ``await stop()``.

    Implements the node interface (:class:`flowrouter.net.nodeapi.Node`) its links and
    outputs use. *loop*: the event loop whose clock it reads before ``start()`` (which
    takes the running loop); tests that drive outputs by hand give one.
    """

    def __init__(self, config: NodeConfig,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.config = config
        self.core = Router(config.params())
        #: the forwarding fast path (flowrouter.core.fastpath), or None: every frame goes
        #: through the core; ``fast_path_info`` says which and why (log and status)
        self.fast: FastPath | None = None
        self.fast_path_info = ""
        self._attach_fast_path()
        #: every link by id (TCP and UDP)
        self.links: dict[int, Link] = {}
        self._next_link = 1
        self._server: asyncio.base_events.Server | None = None
        self._control: asyncio.base_events.Server | None = None
        #: the UDP socket and its links (flowrouter.net.udp), if configured and started
        self.udp: UdpLinks | None = None
        #: the datagram socket for applications (flowrouter.net.appdgram), if configured
        self.appdgram: AppDatagrams | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self._stopping = False
        self._stopped = False
        self._draining = False
        self._loop = loop
        #: dials configured peers and re-dials them with back-off (flowrouter.net.dialer)
        self.dialer = Dialer(self, self._spawn, lambda: self.udp)
        #: when to dial each configured peer again (the dialer's schedule; reload changes it)
        self.dials = self.dialer.schedule
        #: configured peer address -> (Unix time, why its link is not up): for /status
        self.peer_errors = self.dialer.errors
        #: peers administratively down: their links are closed and not re-dialled
        self._blocked = self.dialer.blocked
        self._tracer: TraceWriter | None = None
        #: the read in progress; ``begin_read`` starts one (a bound method of the batch:
        #: one call per read on the hot path)
        threads = config.write_threads
        self.reads = ReadBatch(self, default_threads() if threads == "auto" else int(threads))
        self.begin_read = self.reads.begin
        #: flow control: credit, held inputs, backlogged outputs
        self.flow = Backpressure(self)
        #: emulation per peer name (from config and the control interface)
        self._emulation: dict[str, Emulation] = {
            name: emu for name, emu in config.emulation.items()}
        for peer in config.peers:
            if peer.name and peer.emulation.active:
                self._emulation.setdefault(peer.name, peer.emulation)
        #: who may run control commands (flowrouter.net.commandauth); set when serving
        self.guard: CommandGuard | None = None
        self._more_servers: list[asyncio.base_events.Server] = []
        self._only: dict[int, Role | None] = {}  #: id(server) -> the role it accepts
        #: connections per port and the descriptor budget (flowrouter.net.connlimits)
        self.gate = self._new_gate()
        #: reload and drain (flowrouter.net.operate)
        self.ops = Operations(self)

    def _new_gate(self) -> ConnectionGate:
        return ConnectionGate(self.config.limits, self.core.counters, raise_descriptor_limit(),
                              descriptors_open(), self.core.trust.set_application_budget,
                              self._connection_refused)

    def _connection_refused(self, kind: str, why: str) -> None:
        """A connection was refused at once (a port's cap, the descriptor budget): an
        alert (counted, logged, listed)."""
        if self._loop is not None:
            self.execute(self.core.alert(kind, f"connection refused: {why}", self.now()))

    def _attach_fast_path(self) -> None:
        engine, self.fast_path_info = engine_choice()
        self.fast = (FastPath(self.core, engine(), self.fast_path_info)
                     if engine is not None else None)

    # lifecycle --------------------------------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the router has not started"
        return self._loop

    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        cfg = self.config
        tracer: Any = NULL_TRACER
        if cfg.trace_dir:
            # Wall-clock times in the records, so traces of several routers line up.
            tracer = self._tracer = TraceWriter(
                cfg.trace_dir + "/", cfg.name, sample_rate=cfg.trace_sample,
                rotate_bytes=cfg.trace_rotate_bytes, t_offset=time.time() - loop.time())
            log.info("router %s writes traces to %s (sampling %.3g of forwarding)", cfg.name,
                     tracer.path, cfg.trace_sample)
        self.core = Router(cfg.params(), loop.time(), tracer=tracer)
        self.core.wall_offset = time.time() - loop.time()  # capability expiry is Unix time
        self.flow = Backpressure(self)  # counting into the new core's counters
        self.gate = self._new_gate()
        self._attach_fast_path()
        # an engine that failed to import, unlike one turned off, is worth a warning: every
        # frame then takes the Python core
        quiet = self.fast is not None or fast_path_off()
        log.log(logging.INFO if quiet else logging.WARNING, "router %s forwards with: %s",
                cfg.name, self.fast_path_info)
        if cfg.listen:
            host, port = parse_address(cfg.listen, "listen")
            self._server = await loop.create_server(lambda: TcpLink(self, None), host, port,
                                                    reuse_address=True)
            log.info("router %s listening for TCP links on %s", cfg.name, self.tcp_address)
        for addrs, only in ((cfg.extra_listen, None), (cfg.router_listen, Role.ROUTER),
                            (cfg.app_listen, Role.ENDPOINT)):
            for addr in addrs:
                host, port = parse_address(addr, "listen")
                srv = await loop.create_server(functools.partial(TcpLink, self, None, only),
                                               host, port, reuse_address=True)
                self._more_servers.append(srv)
                self._only[id(srv)] = only
                log.info("router %s listening for %s on %s", cfg.name,
                         f"{only.name.lower()}s" if only else "TCP links", addr)
        if cfg.udp:
            self.udp = UdpLinks.bind(self, cfg.udp)
            self.udp.start()
        if cfg.app_udp:
            self.appdgram = await AppDatagrams.open(self, cfg.app_udp)
        if cfg.control:
            host, port = parse_address(cfg.control, "control")
            secrets = cfg.control_secrets()
            CommandGuard.check_bind(host, secrets)  # no open command port off loopback
            self.guard = CommandGuard(host, secrets, router=cfg.name,
                                      always=bool(cfg.control_token))
            self._control = await asyncio.start_server(
                functools.partial(serve_control_client, self), host, port,
                limit=CONTROL_LINE_LIMIT)
            log.info("router %s control interface on %s:%d", cfg.name, *self.control_address)
        for peer in cfg.peers:
            self.dialer.start(peer)
        self._spawn(self._ticker())

    async def stop(self) -> None:
        self._stopping = self.dialer.stopping = True
        if self.ops.drain_task is not None:
            self.ops.drain_task.cancel()
        self.flow.stop()
        for task in list(self._tasks):
            task.cancel()
        for server in (self._server, self._control, *self._more_servers):
            if server is not None:
                server.close()
        for link in list(self.links.values()):
            link.close("router stopping")
        if self.udp is not None:
            self.udp.stop()
        if self.appdgram is not None:
            self.appdgram.close()
        if self._tracer is not None:
            self._tracer.close()
        self.reads.writes.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in (self._server, self._control, *self._more_servers):
            if server is not None:
                await server.wait_closed()
        self._stopped = True
        log.info("router %s stopped", self.config.name)

    async def __aenter__(self) -> RouterNode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def tcp_address(self) -> tuple[str, int]:
        assert self._server is not None, "this router has no TCP listener"
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    @property
    def udp_address(self) -> tuple[str, int]:
        assert self.udp is not None, "this router has no UDP socket"
        return self.udp.address

    @property
    def udp_io_info(self) -> str:
        """Which datagram I/O the UDP socket uses, and why ("" without UDP)."""
        return self.udp.io_info if self.udp is not None else ""

    @property
    def control_address(self) -> tuple[str, int]:
        assert self._control is not None, "this router has no control interface"
        host, port = self._control.sockets[0].getsockname()[:2]
        return host, port

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # links (the node interface, flowrouter.net.nodeapi.Node) -------------------------------
    def register(self, link: Link) -> int:
        link_id = self._next_link
        self._next_link += 1
        self.links[link_id] = link
        self.flow.opened(link_id, link)
        return link_id

    def unregister(self, link_id: int) -> None:
        self.links.pop(link_id, None)
        self.flow.forget(link_id)
        self.link_state_changed()

    def _apply_emulation(self) -> None:
        """Give every up link the emulation configured for its peer (by name)."""
        for lid, lk in self.core.links.items():
            if lk.state is not LinkState.UP:
                continue
            link = self.links.get(lid)
            if link is None or link.out is None:
                continue
            emu = self._emulation.get(lk.peer_name)
            if link.out.emu is not (emu if emu is not None and emu.active else None):
                link.out.emulate(emu)
                if emu is not None:
                    log.info("router %s: %s emulates %s", self.config.name, lk.describe(),
                             emu.describe())

    def link_state_changed(self) -> None:
        if self._emulation:
            self._apply_emulation()
        if self._blocked:
            self._close_blocked()
        self.reads.generation = self.core.generation
        self._changed.set()
        self._changed = asyncio.Event()

    def execute(self, actions: list[Action]) -> None:
        """Carry out the core's actions (the forwarding hot path ends here)."""
        links = self.links
        for action in actions:
            link = links.get(action.link)
            if link is None:
                continue
            if type(action) is Send:
                link.send(action.header, action.payload)
            elif type(action) is Secure:
                if isinstance(link, TcpLink):
                    if link.out is not None:
                        link.out.flush()  # what the read gave it so far leaves unsealed
                    # new keys every so many records and seconds (forward secrecy)
                    link.codec.start_sealed(sealed_stream(action.cipher, self.now,
                                                          self.config, self.core.counters))
            elif type(action) is Close:
                link.close(action.reason)
                if isinstance(link, UdpLink):
                    self.unregister(action.link)
                    if link.peer is not None:  # a configured UDP peer: dial it again
                        self.redial(link.peer)

    def redial(self, peer: PeerConfig, why: str | None = None) -> None:
        """The dial of *peer* failed or its link went down: dial again after the back-off
        (:class:`~flowrouter.net.dialer.Dialer`)."""
        self.dialer.redial(peer, why)

    def dial(self, peer: PeerConfig) -> None:
        """Start dialling *peer* (a peer a reload added)."""
        self.dialer.dial(peer)

    def drop_peers(self, peers: list[PeerConfig], reason: str) -> None:
        """Stop dialling *peers* and close their links (a reload removed them)."""
        gone = [p.address for p in peers]
        self.close_links([lid for lid, link in self.links.items()
                          if isinstance(link, TcpLink | UdpLink) and link.peer in peers],
                         reason)
        for address in gone:
            self.dialer.forget(address)

    def close_links(self, link_ids: list[int], reason: str) -> None:
        """Close these links now, as a failure would (their flows are repaired)."""
        now = self.now()
        for lid in link_ids:
            link = self.links.get(lid)
            self.execute(self.core.close_link(lid, now, reason))
            if link is not None:
                link.close(reason)
                if isinstance(link, UdpLink):
                    self.unregister(lid)
        if link_ids:
            self.link_state_changed()

    def begin_drain(self) -> None:
        """Stop accepting connections (the listeners close; links stay) and say so in
        readiness (flowrouter.net.operate drains)."""
        self._draining = True
        for server in (self._server, *self._more_servers):
            if server is not None:
                server.close()
        self.link_state_changed()

    def reached(self, peer: PeerConfig) -> None:
        """The link to configured *peer* is up (its handshake done, not just connected):
        the back-off may start over once it stays up."""
        self.dialer.reached(peer)

    # administration (fault schedules) ---------------------------------------------------------
    def set_emulation(self, peer: str, emu: Emulation | None) -> None:
        """Change the emulation of links toward *peer* now (None: a plain link again)."""
        if emu is None or not emu.active:
            self._emulation.pop(peer, None)
        else:
            self._emulation[peer] = emu
        for lid, lk in self.core.links.items():
            link = self.links.get(lid)
            if lk.peer_name == peer and link is not None and link.out is not None:
                link.out.emulate(self._emulation.get(peer))
        log.info("router %s: links to %s now: %s", self.config.name, peer,
                 emu.describe() if emu else "no emulation")

    def set_link(self, peer: str, up: bool) -> int:
        """Administratively cut (or restore) every link to router *peer*; returns links cut.

        A cut link is closed as a real failure would be (faults, re-grafting, LS re-routing);
        while the peer is blocked it is neither re-dialled nor accepted.
        """
        if up:
            log.info("router %s: link to %s administratively up", self.config.name, peer)
            self.dialer.unblock(peer)  # the dial waiting out its back-off goes now
            return 0
        self._blocked.add(peer)
        log.info("router %s: link to %s administratively down", self.config.name, peer)
        return self._close_blocked()

    def _close_blocked(self) -> int:
        n = 0
        now = self.now()
        for lid, lk in list(self.core.links.items()):
            if lk.peer_name in self._blocked and lk.state is LinkState.UP:
                link = self.links.get(lid)
                self.execute(self.core.close_link(lid, now, "administratively down"))
                if link is not None:
                    link.close("administratively down")
                n += 1
        if n:
            self.link_state_changed()
        return n

    # time ---------------------------------------------------------------------------------------
    async def _ticker(self) -> None:
        interval = self.config.tick_interval
        while True:
            await asyncio.sleep(interval)
            now = self.now()
            self.execute(self.core.tick(now))
            self._check_progress(now)
            if self.core.p.locality_mapping is not None:
                self._measure_throughput(now)
            if self.udp is not None:
                self.udp.reap_idle(now)
            if self.appdgram is not None:
                self.appdgram.reap_idle(now)

    def _measure_throughput(self, now: float) -> None:
        """Feed each link's send rate while backlogged (flowrouter.core.measured.BusyRate:
        an estimate of its capacity) to measured locality."""
        for lid, link in list(self.links.items()):
            bps = link.out.rate.sample(now) if link.out is not None else None
            if bps is not None:
                self.core.measure_throughput(lid, bps, now)

    def _check_progress(self, now: float) -> None:
        """Frames that stopped arriving close their link (outputs that stopped moving are
        flow control's, on its own deadline)."""
        reap_stalled_frames(self, now)

    def close_slow_consumer(self, link_id: int, reason: str) -> None:
        """Close the link of an output flow control evicts (it stayed over its bound for the
        grace time), and tell its flows (a fault notice on band 17) and the log."""
        core, now, cfg = self.core, self.now(), self.config
        lk = core.links.get(link_id)
        link = self.links.get(link_id)
        if lk is None:
            return
        detail = f"{lk.describe()} is a slow consumer: {reason}; closing it"
        log.warning("router %s: %s", cfg.name, detail)
        core.counters["links.slow-consumer"] += 1
        keys = sorted(lk.dependent)
        actions = core.close_link(link_id, now, "slow consumer")
        for key in keys:
            actions += core.alert("slow-consumer-closed", detail, now, key)
        if link is not None and link.out is not None:
            link.out.close()
        self.execute(actions)
        if link is not None:
            link.abort("slow consumer")
        self.link_state_changed()

    # waiting helpers (tests, launcher) -----------------------------------------------------------
    def links_up(self, role: Role | None = Role.ROUTER) -> int:
        return sum(1 for lk in self.core.links.values()
                   if lk.state is LinkState.UP and (role is None or lk.role is role))

    async def wait_peers_up(self, count: int, timeout: float = 10.0,
                            role: Role | None = Role.ROUTER) -> None:
        """Wait until *count* links of *role* are up (routers by default)."""
        async def _wait() -> None:
            while self.links_up(role) < count:
                await self._changed.wait()
        try:
            await asyncio.wait_for(_wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"router {self.config.name}: {self.links_up(role)} of {count} "
                               f"links up after {timeout}s") from None

    async def wait_changed(self) -> None:
        """Wait for the next change of the links (one up, down or refused), to look again at
        something that has no event of its own (counters, sibling routes)."""
        await self._changed.wait()

    async def wait_routes(self, lsid: int, timeout: float = 10.0) -> None:
        """Wait until this router knows a way to the core of *lsid*."""
        async def _wait() -> None:
            while lsid not in self.core.p.core_lsids and self.core.routing.link_for(lsid) is None:
                await self._changed.wait()
        try:
            await asyncio.wait_for(_wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"router {self.config.name}: no route to LSID {lsid:#x} "
                               f"after {timeout}s") from None

    # control interface ----------------------------------------------------------------------
    def listeners(self) -> list[dict[str, Any]]:
        """Every TCP listener: its bound address and who it accepts (routers, apps, any)."""
        rows = []
        for srv in (self._server, *self._more_servers):
            if srv is None:
                continue
            for sock in srv.sockets:
                host, port = sock.getsockname()[:2]
                only = self._only.get(id(srv))
                rows.append({"address": f"{host}:{port}",
                             "accepts": {None: "any", Role.ROUTER: "routers",
                                         Role.ENDPOINT: "applications"}[only]})
        return rows

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def stopped(self) -> bool:
        """It stopped (its listeners closed, its links gone)."""
        return self._stopped

    @property
    def draining(self) -> bool:
        """It is draining: accepting nothing new, its applications asked to move."""
        return self._draining

    @property
    def listening(self) -> bool:
        """Every listener it was configured with is bound and serving."""
        servers = [self._server] if self.config.listen else []
        servers += self._more_servers
        return all(srv is not None and srv.is_serving() for srv in servers) and (
            not self.config.udp or self.udp is not None)

    @property
    def blocked_peers(self) -> frozenset[str]:
        """Peers administratively down (``link`` control command)."""
        return frozenset(self._blocked)

    @property
    def emulated_peers(self) -> frozenset[str]:
        return frozenset(self._emulation)

    def status_view(self, sort: str | None, limit: Any) -> dict[str, Any]:
        """The status document as ``sort`` and ``limit`` show it (the control command's and
        the HTTP pages' arguments), rendering only the flow rows shown."""
        return flowviews.status_view(self, sort, limit)

    async def status_view_sliced(self, sort: str | None, limit: Any) -> dict[str, Any]:
        """:meth:`status_view` with its flow rows rendered a slice at a time, forwarding
        going on in between (what the control port and the HTTP pages answer with)."""
        return await flowviews.status_view_sliced(self, sort, limit)

    def status(self, flows: Iterable[bytes] | None = None) -> dict[str, Any]:
        """The status document; *flows*: the keys whose rows it gives (None: every flow's,
        which costs about 11 us a flow of the loop's time: a view picks its rows first,
        :func:`flowrouter.net.flowviews.status_view`)."""
        keys = None if flows is None else list(flows)
        st = self.core.status(self.now(), ())
        for row in st["links"]:
            link = self.links.get(row["id"])
            if link is not None:
                row["bytes_in"], row["bytes_out"] = link.bytes_in, link.bytes_out
                if link.out is not None:
                    row["output"] = link.out.stats()
        st["flows"] = self.flow_rows(keys)
        st["fast_path"] = (self.fast.status() if self.fast is not None
                           else {"engine": None, "why": self.fast_path_info})
        st["event_loop"] = type(self._loop).__module__.split(".")[0]  # uvloop or asyncio
        st["writes"] = self.reads.writes.status()  # helper threads for large fan-outs
        st["listen"] = "%s:%d" % self.tcp_address if self._server else None
        st["udp"] = "%s:%d" % self.udp_address if self.udp is not None else None
        udp_io = self.udp.status() if self.udp is not None else None
        if udp_io is not None:
            st["udp_io"] = udp_io
        if self.appdgram is not None:  # applications' datagram links (net/appdgram)
            st["app_udp"] = self.appdgram.status()
        st["listeners"] = self.listeners()
        st["peers"] = self.peer_rows(st["links"])
        st["link_auth"] = link_auth_status(self.config, self.links)
        st["connections"] = self.gate.status()
        return st

    def flow_rows(self, keys: list[bytes] | None = None) -> list[dict[str, Any]]:
        """The flow table's status rows for *keys* (None: every flow's): the core's, with
        what the shell knows of each (:data:`flowviews.SHELL_FIELDS`)."""
        rows = self.core.flow_rows(keys)
        values = flowviews.shell_values(self, self.now()).items()
        for row, key in zip(rows, self.core.flows if keys is None else keys, strict=True):
            for name, value in values:
                row[name] = value(key)
        return rows

    def peer_rows(self, links: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every configured peer: up or down, why, and how its re-dialling goes."""
        return peer_rows(self.config.peers, links, self.peer_errors, self._blocked,
                         self.dials)
