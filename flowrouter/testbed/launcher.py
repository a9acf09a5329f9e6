"""The router half of ``flowrouter up TOPOLOGY``: a topology's routers as processes on this
machine, with its fault schedule.

One ``flowrouter run`` process per router, real sockets on loopback (the topology's ports),
each link dialled from one side with the link's emulation (bandwidth, delay, loss) applied in
both directions by the routers' own link layers. :class:`Launcher` writes the routers'
configs, starts and stops their processes, waits for the topology's links, applies faults,
prints the live view and serves the dashboard; it speaks to routers only through their control
ports. The applications that carry traffic over the overlay (the topology's endpoints as
flowlib clients) are driven from above, by ``flownet.traffic``, which calls this interface:
:meth:`~Launcher.start_routers`, :meth:`~Launcher.endpoint_address`,
:meth:`~Launcher.fault_events` / :meth:`~Launcher.fault_at`, :meth:`~Launcher.collect` and
:meth:`~Launcher.close`. The applications of flowchat and flowvideo use it the same way.

The fault schedule runs on the clock origin ``t0`` that the driver sets once every router
answers and every endpoint has joined: a symmetric outage cuts the link at both routers
(``link`` control command: closed like a real failure, not re-dialled until restored); a
one-direction outage silently drops what that router sends (``emulate down``);
bandwidth/delay/loss changes use ``emulate``. The live view prints each router's links and
traffic once a second.

May import flowrouter.net (its control client), flowrouter.testbed and below.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrouter.net.runtime import query_control
from flowrouter.testbed.ports import free_port
from flowrouter.testbed.topology import Fault, LinkSpec, Topology, regions
from flowrouter.testbed.webview import start_web

log = logging.getLogger("flowrouter.testbed.launcher")


@dataclass(slots=True)
class Delivery:
    t: float  #: seconds since the schedule's origin
    receiver: str
    sender: str
    seq: int


@dataclass(slots=True)
class LaunchReport:
    """What a run of an overlay saw: the driver fills ``sent`` and ``deliveries``, the
    launcher the faults, the routers' counters and the links that never came up."""


    topology: str
    scenario: str | None
    duration: float
    sent: dict[str, int] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    faults_applied: list[tuple[float, str]] = field(default_factory=list)
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    #: topology links (by name, with their transport and ends) never seen up during the run
    links_never_up: list[str] = field(default_factory=list)

    def delivered_between(self, receiver: str, sender: str, t0: float, t1: float) -> int:
        return sum(1 for d in self.deliveries
                   if d.receiver == receiver and d.sender == sender and t0 <= d.t < t1)


PR_SET_PDEATHSIG = 1  #: prctl(2): the signal a process gets when its parent dies


def lifeline(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that ties a child to its launcher: it gets SIGTERM when the launcher
    dies, however it dies (SIGKILL included), so no router outlives ``flowrouter up``.

    It runs in the child between fork and exec: ``prctl(PR_SET_PDEATHSIG)``, which outlives
    the exec (and the exec of ``ip netns exec``, which becomes the router: the router is
    still the launcher's child), then a check that the launcher did not die before the line
    was set (the child was then already handed to another parent). None where there is no
    such call (not Linux): there the launcher's own clean-up is all there is."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, called after
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _emulation_toml(link: LinkSpec) -> str:
    parts = []
    if link.bandwidth:
        parts.append(f"bandwidth = {link.bandwidth!r}")
    if link.delay:
        parts.append(f"delay = {link.delay!r}")
    if link.loss:
        parts.append(f"loss = {link.loss!r}")
    return "\n".join(parts)


class Launcher:
    """A topology's routers as local processes, their links, faults, live view and dashboard."""

    def __init__(self, topo: Topology, *, scenario: str | None = None,
                 duration: float | None = None, view: bool = True, workdir: str | None = None,
                 base_port: int | None = None, log_level: str = "warning",
                 emulate_delay: bool = True, web: str | None = None) -> None:
        self.topo = topo
        self.web = web  #: serve the dashboard here (flowrouter.testbed.webview)
        self.web_url: str | None = None
        #: links cut by the fault schedule now (name -> what), and every fault event so far
        self.cut: dict[str, str] = {}
        self.events: list[tuple[float, str]] = []
        self.scenario = scenario
        if scenario is not None:
            topo.scenario(scenario)  # KeyError with the known names
        self.duration = duration or (topo.scenario(scenario).duration if scenario else None) \
            or topo.duration or 30.0
        self.view = view
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="flownet-up-"))
        self.base_port = base_port
        self.log_level = log_level
        self.emulate_delay = emulate_delay
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.listen: dict[str, tuple[str, int]] = {}
        self.control: dict[str, str] = {}
        #: the fault schedule's origin (time.monotonic()), set by whoever drives the run
        self.t0 = 0.0
        udp_routers = {r for lk in topo.links if lk.transport == "udp" for r in (lk.a, lk.b)}
        self._udp = udp_routers
        #: topology links seen up at some point (names), and how long startup waits for them
        self.links_seen_up: set[str] = set()
        self.link_wait = 30.0

    # ------------------------------------------------------------------ configs
    def _address(self, router: str) -> tuple[str, int]:
        host, port = self.topo.listen_address(router)
        if self.base_port is not None:
            port = port - self.topo.defaults.router.base_port + self.base_port
        return host, port

    def router_config(self, name: str) -> str:
        """The TOML config of one router, derived from the topology."""
        topo = self.topo
        spec = topo.router(name)
        host, port = self.listen[name]
        params = topo.router_params(name)
        lines = ["[router]", f"name = {_toml_str(name)}",
                 f'listen = "{host}:{port}"', f'control = "{self._control_bind(name)}"']
        if name in self._udp:
            lines.append(f'udp = "{host}:{port}"')
        if spec.core_lsids:
            lines.append("core_lsids = [" + ", ".join(hex(x) for x in spec.core_lsids) + "]")
            lines.append(f"default_lsid = {hex(spec.core_lsids[0])}")
            if topo.direct_lsids(name):
                lines.append("direct_lsids = [" + ", ".join(
                    hex(x) for x in sorted(topo.direct_lsids(name))) + "]")
        elif topo.lsids():
            lines.append(f"default_lsid = {hex(topo.lsids()[0])}")
        for key in ("max_payload", "max_flows", "join_timeout"):
            if key in params:
                value = params[key] if key == "join_timeout" else int(params[key])
                lines.append(f"{key} = {value}")
        lines.append("reconnect_max = 1.0")
        dialled_by = [lk.other(name) for lk in topo.links_of(name) if lk.b == name]
        if dialled_by:  # the routers that dial this one (no link keys in the test-bed)
            lines.append("accept_routers = [" + ", ".join(
                _toml_str(f"{o}@{self.listen[o][0]}") for o in dialled_by) + "]")
        ep_mods = topo.defaults.endpoint.modifiers
        lines.append(f"endpoint_locality = {{ bandwidth = {ep_mods.bandwidth}, delay = "
                     f"{ep_mods.delay}, geography = {ep_mods.geography} }}")
        lines += ["", "[gc]"]  # (a topology's ping_after / delete_after: the simulator's only)
        if "epoch" in params:
            lines.append(f"epoch = {params['epoch']}")
        for link in topo.links_of(name):
            other = link.other(name)
            m = link.modifiers
            emu = _emulation_toml(self._emulated(link))
            if link.a == name:  # a dials b
                oh, op = self.listen[other]
                lines += ["", "[[peer]]", f"name = {_toml_str(other)}",
                          f'address = "{oh}:{op}"', f'transport = "{link.transport}"',
                          f"locality = {{ bandwidth = {m.bandwidth}, delay = {m.delay}, "
                          f"geography = {m.geography} }}"]
                if emu:
                    lines.append(emu)
            elif emu:
                lines += ["", "[[emulate]]", f"peer = {_toml_str(other)}", emu]
        lines += regions.config_lines(topo, name)  # an edge of a backbone region
        if spec.routes or spec.default_route:
            lines += ["", "[routes]"]
            lines += [f"{hex(lsid)} = {_toml_str(peer)}" for lsid, peer in spec.routes]
            if spec.default_route:
                lines.append(f"default = {_toml_str(spec.default_route)}")
        return "\n".join(lines) + "\n"

    def _emulated(self, link: LinkSpec) -> LinkSpec:
        if self.emulate_delay:
            return link
        from dataclasses import replace

        return replace(link, delay=0.0)

    # ------------------------------------------------------------------ processes
    # Hooks a multi-host launcher (flowrouter.testbed.netns) overrides: where a router binds
    # its control port, how its process is started, where this process reaches its
    # application port, and what closing removes.
    def _control_bind(self, name: str) -> str:
        return self.control[name]

    def _router_command(self, name: str, argv: list[str]) -> list[str]:
        return argv

    def endpoint_address(self, router: str) -> str:
        """Where an application in this process connects to *router* (HOST:PORT)."""
        host, port = self.listen[router]
        return f"{host}:{port}"

    async def _prepare(self) -> None:
        """Before any router starts: choose listen and control addresses."""
        for r in self.topo.routers:
            self.listen[r.name] = self._address(r.name)
            self.control[r.name] = f"127.0.0.1:{free_port('127.0.0.1')}"

    def _repick_control(self, name: str) -> bool:
        """Give router *name* a new control address: its own was taken by another process
        between the check and the router's bind (ports are checked free, not reserved:
        :mod:`flowrouter.testbed.ports`). False where the addresses are fixed."""
        self.control[name] = f"127.0.0.1:{free_port('127.0.0.1')}"
        return True

    def _control_taken(self, name: str) -> bool:
        """Whether router *name* exited because its control port was in use."""
        port = self.control[name].rsplit(":", 1)[1]
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace").lower()
        except OSError:
            return False
        return "in use" in text and f", {port})" in text

    async def _spawn(self, name: str, env: dict[str, str], tie: Any) -> None:
        cfg = self.workdir / f"{name}.toml"
        cfg.write_text(self.router_config(name), encoding="utf-8")
        with (self.workdir / f"{name}.log").open("wb") as logf:  # noqa: ASYNC230
            self.procs[name] = await asyncio.create_subprocess_exec(
                *self._router_command(name, [
                    sys.executable, "-m", "flowrouter.tools.cli", "--log-level",
                    self.log_level, "run", "--config", str(cfg)]),
                stdout=logf, stderr=logf, env=env,
                # Own session: a Ctrl-C at the terminal reaches only this launcher,
                # which then stops every router itself (cleanly, in order); and the
                # lifeline: when the launcher dies anyway, its routers go with it.
                start_new_session=True, preexec_fn=tie)

    async def start_routers(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self._prepare()
        env = dict(os.environ)
        tie = lifeline(os.getpid())
        for r in self.topo.routers:
            await self._spawn(r.name, env, tie)
        deadline = time.monotonic() + 30
        for name in list(self.control):
            retries = 3
            while True:
                proc = self.procs[name]
                if proc.returncode is not None:
                    if retries and self._control_taken(name) and self._repick_control(name):
                        retries -= 1
                        log.info("router %s: control port taken before it bound it; "
                                 "starting it again on %s", name, self.control[name])
                        await self._spawn(name, env, tie)
                        continue
                    raise RuntimeError(f"router {name} exited with code {proc.returncode}; see "
                                       f"{self.workdir / (name + '.log')}")
                try:
                    await query_control(self.control[name], "ping", timeout=1.0)
                    break
                except (ConnectionError, OSError):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"router {name} did not answer on "
                                           f"{self.control[name]}") from None
                    await asyncio.sleep(0.05)
        await self.wait_links(time.monotonic() + self.link_wait)

    @staticmethod
    def _describe(lk: LinkSpec) -> str:
        return f"{lk.name} ({lk.a}-{lk.b}, {lk.transport})"

    async def links_up(self) -> set[str]:
        """Names of the topology links that are up now (seen from their first router)."""
        up: set[str] = set()
        for r in self.topo.routers:
            try:
                st = (await query_control(self.control[r.name], timeout=1.0))["status"]
            except (ConnectionError, OSError):
                continue
            have: dict[tuple[str, str], int] = {}
            for lk in st["links"]:
                if lk["role"] == "router" and lk["state"] == "up":
                    k = (lk["peer"], lk["transport"])
                    have[k] = have.get(k, 0) + 1
            for spec in self.topo.links_of(r.name):
                k = (spec.other(r.name), spec.transport)
                if have.get(k, 0) > 0:
                    have[k] -= 1
                    up.add(spec.name)
        self.links_seen_up |= up
        return up

    async def wait_links(self, deadline: float) -> list[str]:
        """Wait until every topology link is up, saying once a second which are not yet;
        returns the ones still down at *deadline* (and says so)."""
        said = 0.0
        while True:
            up = await self.links_up()
            missing = [lk for lk in self.topo.links if lk.name not in up]
            if not missing:
                return []
            now = time.monotonic()
            if now > deadline:
                text = ", ".join(self._describe(lk) for lk in missing)
                log.warning("links not up after %.0fs (going on without them): %s",
                            self.link_wait, text)
                if self.view:
                    print(f"links not up after {self.link_wait:g}s (going on without them): "
                          f"{text}", flush=True)
                return [lk.name for lk in missing]
            if self.view and now - said >= 1.0:
                said = now
                print("waiting for link(s): " + ", ".join(self._describe(lk)
                                                          for lk in missing), flush=True)
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        """Stop every router (and whatever else the launcher set up); safe to call again."""
        await self.stop_routers()

    async def stop_routers(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for name, proc in self.procs.items():
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                log.warning("router %s did not stop on SIGTERM; killing it", name)
                proc.kill()
                await proc.wait()

    # ------------------------------------------------------------------ faults
    async def _cmd(self, router: str, cmd: str, **args: Any) -> None:
        try:
            await query_control(self.control[router], cmd, **args)
        except ConnectionError as exc:
            log.warning("fault command to %s failed: %s", router, exc)

    async def apply_fault(self, fault: Fault, down: bool, report: LaunchReport) -> None:
        for name in fault.links:
            link = self.topo.link(name)
            ends = [(link.a, link.b), (link.b, link.a)]
            if fault.direction is not None:
                ends = [e for e in ends if e[0] == fault.direction]
            if fault.kind == "set":
                for src, dst in ends:
                    if down:
                        emu = {"bandwidth": fault.bandwidth if fault.bandwidth is not None
                               else (link.bandwidth or None),
                               "delay": fault.delay if fault.delay is not None else link.delay,
                               "loss": fault.loss if fault.loss is not None else link.loss}
                    else:
                        emu = {"bandwidth": link.bandwidth or None, "delay": link.delay,
                               "loss": link.loss}
                    if not self.emulate_delay:
                        emu["delay"] = 0.0
                    await self._cmd(src, "emulate", peer=dst, **emu)
                what = "set " + ", ".join(f"{k}={v}" for k, v in (
                    ("bandwidth", fault.bandwidth), ("delay", fault.delay),
                    ("loss", fault.loss)) if v is not None) if down else "restored"
            elif fault.direction is not None:
                src, dst = ends[0]
                base = self._emulated(link)
                await self._cmd(src, "emulate", peer=dst, down=down,
                                bandwidth=base.bandwidth or None, delay=base.delay,
                                loss=base.loss)
                what = f"{'down' if down else 'up'} ({src} -> {dst} only)"
            else:
                await asyncio.gather(*(self._cmd(src, "link", peer=dst, up=not down)
                                       for src, dst in ends))
                what = "down" if down else "up"
            t = time.monotonic() - self.t0
            report.faults_applied.append((t, f"{name} {what}"))
            self.events.append((t, f"link {name} {what}"))
            if down and fault.kind != "set":
                self.cut[name] = what
            else:
                self.cut.pop(name, None)
            if self.view:
                print(f"[{t:7.2f}s] fault: link {name} {what}", flush=True)

    def fault_events(self) -> list[tuple[float, Fault, bool]]:
        """The fault schedule as (seconds after ``t0``, fault, down) in time order."""
        events: list[tuple[float, Fault, bool]] = []
        for fault in self.topo.faults_for(self.scenario):
            if fault.kind == "set":
                assert fault.at is not None
                events.append((fault.at, fault, True))
                if fault.until is not None:
                    events.append((fault.until, fault, False))
                continue
            for t_down, t_up in fault.outages(self.duration):
                events.append((t_down, fault, True))
                if math.isfinite(t_up):
                    events.append((t_up, fault, False))
        return sorted(events, key=lambda e: e[0])

    async def fault_at(self, t: float, fault: Fault, down: bool, report: LaunchReport) -> None:
        """Apply *fault* (or restore it) *t* seconds after ``t0``."""
        await asyncio.sleep(max(0.0, self.t0 + t - time.monotonic()))
        await self.apply_fault(fault, down, report)

    # ------------------------------------------------------------------ watching
    async def start_web(self) -> Any:
        """Serve the dashboard when asked to (``web``): returns its server (``stop()`` it
        when done) and sets ``web_url``; None when no dashboard was asked for or it could
        not start."""
        if not self.web:
            return None
        web = await start_web(self, self.web)
        if web is not None:
            self.web_url = web.url
            print(f"dashboard: {web.url}/", flush=True)
        return web

    async def watch_links(self) -> None:
        """Note which topology links come up during the run (for the summary)."""
        while len(self.links_seen_up) < len(self.topo.links):
            await asyncio.sleep(1.0)
            with contextlib.suppress(ConnectionError, OSError, KeyError):
                await self.links_up()

    async def collect(self, report: LaunchReport) -> None:
        """At the end of a run: every router's counters, and the links never seen up."""
        for name, ctl in self.control.items():
            with contextlib.suppress(ConnectionError, OSError, KeyError):
                report.counters[name] = (await query_control(ctl, timeout=2.0)
                                         )["status"]["counters"]
        with contextlib.suppress(ConnectionError, OSError, KeyError):
            await self.links_up()
        report.links_never_up = [self._describe(lk) for lk in self.topo.links
                                 if lk.name not in self.links_seen_up]

    async def show_view(self) -> None:
        """Print each router's links and traffic once a second (until cancelled)."""
        last: dict[str, int] = {}
        while True:
            await asyncio.sleep(1.0)
            t = time.monotonic() - self.t0
            rows = []
            for name, ctl in self.control.items():
                try:
                    st = (await query_control(ctl, timeout=1.0))["status"]
                except (ConnectionError, OSError):
                    rows.append(f"  {name:<12} not answering")
                    continue
                c = st["counters"]
                fwd = c.get("forwarded", 0)
                drops = sum(v for k, v in c.items() if k.startswith("drop."))
                links = " ".join(f"{lk['peer']}:{'up' if lk['state'] == 'up' else 'DOWN'}"
                                 for lk in st["links"] if lk["role"] == "router")
                rows.append(f"  {name:<12} fwd/s {fwd - last.get(name, fwd):>6}  "
                            f"drops {drops:>6}  flows {st['flow_count']:>4}  links {links}")
                last[name] = fwd
            print(f"[{t:7.2f}s] " + "-" * 60 + "\n" + "\n".join(rows), flush=True)


def summarize(report: LaunchReport) -> str:
    """The report in a few lines: per sender what arrived where, the faults, dead links."""
    lines = [f"topology {report.topology}, scenario {report.scenario or '-'}, "
             f"{report.duration:g} s"]
    receivers = sorted({d.receiver for d in report.deliveries} | set(report.sent))
    for sender, n in sorted(report.sent.items()):
        got = {r: sum(1 for d in report.deliveries if d.sender == sender and d.receiver == r)
               for r in receivers if r != sender}
        lines.append(f"  {sender:<14} sent {n:>5}; delivered: " + ", ".join(
            f"{r} {k}" for r, k in got.items()))
    for t, what in report.faults_applied:
        lines.append(f"  fault at {t:6.2f}s: {what}")
    for link in report.links_never_up:
        lines.append(f"  LINK NEVER CAME UP: {link}")
    return "\n".join(lines)
