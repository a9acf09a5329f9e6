"""``flowrouter up --netns``: the overlay across Linux network namespaces joined by veth links.

Holds the namespace plan (which router lives in which namespace, the addresses), the ``ip``
commands that build and remove it, a loopback forwarder into a namespace, and
:class:`NetnsLauncher`, the launcher subclass that uses them. May import flowrouter.testbed
and flowrouter.net (and below).

Why this shape: a topology rehearsed on one loopback never crosses a real interface, so
bind-vs-dial mistakes stay hidden. Here each site (or each router, when the topology has no
sites) gets its own namespace ``fn-<pid>-<n>``; the namespace's *site address* 10.77.0.<n>/32
sits on its loopback device, and every pair of sites joined by at least one topology link
gets one veth pair with a /30 (10.77.<k>.1/.2) and host routes to the other site's address
(with that site address as source, so ``accept_routers`` sees the dialler's bind address).
Routers bind the site address (the topology's ports), their control port binds the
namespace's own 127.0.0.1, and this launcher reaches control ports and router application
ports through forwarders: a listener on the root namespace's 127.0.0.1 whose connections are
opened *inside* the namespace (a socket created after ``setns``), so endpoints' connections
come from inside the site. Nothing is ever sent to an address outside the namespaces this
run creates. Link faults keep using the routers' control emulation (several topology links
may share one site-pair veth, so ``ip link set down`` would cut more than the fault says).
Everything (processes, namespaces, and with them the veths) is removed on exit, error and
Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Any

from flowrouter.testbed.launcher import Launcher
from flowrouter.testbed.topology import Topology

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"
MAX_NAMESPACES = 250  #: one /24 of site addresses (10.77.0.1-250)
CONTROL_PORT_BASE = 29000  #: control ports on each namespace's own loopback


class NetnsError(RuntimeError):
    """Namespaces cannot be used here, or building them failed (one-line message)."""


def unavailable() -> str | None:
    """Why ``--netns`` cannot run here, in one line; None when it can."""
    if os.geteuid() != 0:
        return "--netns needs root (it creates network namespaces and veth links)"
    if shutil.which("ip") is None:
        return "--netns needs the 'ip' command (iproute2)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"--netns: 'ip netns' is unavailable: {probe.stderr.strip() or probe.returncode}"
    return None


@dataclass(slots=True)
class NetnsPlan:
    """Which namespace each router lives in, the namespaces' addresses and their veth links."""

    prefix: str
    #: router -> namespace name
    ns_of: dict[str, str] = field(default_factory=dict)
    #: namespace -> site address (10.77.0.n)
    address: dict[str, str] = field(default_factory=dict)
    #: (ns_a, ns_b, veth_a, veth_b, addr_a, addr_b), one per pair of linked namespaces
    veths: list[tuple[str, str, str, str, str, str]] = field(default_factory=list)

    @classmethod
    def for_topology(cls, topo: Topology, prefix: str) -> NetnsPlan:
        plan = cls(prefix)
        groups: dict[str, str] = {}  # site or router name -> namespace
        for r in topo.routers:
            key = f"site:{r.site}" if r.site else f"router:{r.name}"
            if key not in groups:
                if len(groups) >= MAX_NAMESPACES:
                    raise NetnsError(f"--netns supports at most {MAX_NAMESPACES} namespaces")
                ns = f"{prefix}-{len(groups) + 1}"
                groups[key] = ns
                plan.address[ns] = f"10.77.0.{len(groups)}"
            plan.ns_of[r.name] = groups[key]
        pairs: list[tuple[str, str]] = []
        for lk in topo.links:
            a, b = plan.ns_of[lk.a], plan.ns_of[lk.b]
            if a != b and (a, b) not in pairs and (b, a) not in pairs:
                pairs.append((a, b))
        if len(pairs) > 250:
            raise NetnsError("--netns supports at most 250 linked site pairs")
        for k, (a, b) in enumerate(pairs, start=1):
            plan.veths.append((a, b, f"fnv{k}a", f"fnv{k}b", f"10.77.{k}.1", f"10.77.{k}.2"))
        return plan

    def commands(self) -> list[list[str]]:
        """The ``ip`` commands that build the plan, in order."""
        cmds: list[list[str]] = []
        for ns, addr in self.address.items():
            cmds += [["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"],
                     ["ip", "-n", ns, "addr", "add", f"{addr}/32", "dev", "lo"]]
        for ns_a, ns_b, va, vb, aa, ab in self.veths:
            cmds += [["ip", "link", "add", va, "netns", ns_a, "type", "veth",
                      "peer", "name", vb, "netns", ns_b],
                     ["ip", "-n", ns_a, "addr", "add", f"{aa}/30", "dev", va],
                     ["ip", "-n", ns_b, "addr", "add", f"{ab}/30", "dev", vb],
                     ["ip", "-n", ns_a, "link", "set", va, "up"],
                     ["ip", "-n", ns_b, "link", "set", vb, "up"],
                     ["ip", "-n", ns_a, "route", "add", f"{self.address[ns_b]}/32", "via", ab,
                      "src", self.address[ns_a]],
                     ["ip", "-n", ns_b, "route", "add", f"{self.address[ns_a]}/32", "via", aa,
                      "src", self.address[ns_b]]]
        return cmds

    def create(self) -> None:
        """Build every namespace and veth; on any failure remove what was built and raise."""
        try:
            for cmd in self.commands():
                res = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if res.returncode != 0:
                    raise NetnsError(f"{' '.join(cmd)}: {res.stderr.strip()}")
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Delete this run's namespaces (their veths go with them); safe to call twice."""
        for ns in self.address:
            if os.path.exists(os.path.join(NETNS_DIR, ns)):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def remaining_namespaces(prefix: str) -> list[str]:
    """Namespaces whose names start with *prefix* (a run's leftovers, if any)."""
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    names = [line.split()[0] for line in res.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix + "-")]


def listening_addresses(ns: str) -> set[tuple[str, int]]:
    """The TCP addresses listening inside namespace *ns* (from its /proc/net/tcp)."""
    res = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/tcp"],
                         capture_output=True, text=True, check=False)
    found: set[tuple[str, int]] = set()
    for line in res.stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) > 3 and parts[3] == "0A":  # LISTEN
            hexaddr, hexport = parts[1].split(":")
            addr = socket.inet_ntoa(int(hexaddr, 16).to_bytes(4, "little"))
            found.add((addr, int(hexport, 16)))
    return found


_libc: Any = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def socket_in(ns: str) -> socket.socket:
    """A non-blocking TCP socket that lives in namespace *ns* (made there, used from here).

    A socket belongs to the namespace it was created in; this thread enters *ns* only for
    the ``socket()`` call and returns at once, so nothing else runs inside it."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)
    sock.setblocking(False)
    return sock


class Forwarder:
    """Listens on the root namespace's 127.0.0.1 and relays each connection to *target*
    inside namespace *ns*."""

    def __init__(self, ns: str, target: tuple[str, int]) -> None:
        self.ns = ns
        self.target = target
        self.server: asyncio.Server | None = None
        self.address = ""
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"
        return self.address

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        sock = socket_in(self.ns)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self.target)
            r2, w2 = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            writer.close()
            return
        try:
            await asyncio.gather(self._pipe(reader, w2), self._pipe(r2, writer))
        except asyncio.CancelledError:
            pass  # stopped (asyncio 3.11 logs a traceback for a handler ending cancelled)
        finally:
            for w in (writer, w2):
                w.close()
            if task is not None:
                self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class NetnsLauncher(Launcher):
    """A :class:`Launcher` whose routers run in per-site network namespaces."""

    def __init__(self, topo: Topology, **kwargs: Any) -> None:
        super().__init__(topo, **kwargs)
        self.prefix = f"fn-{os.getpid()}"
        self.plan = NetnsPlan.for_topology(topo, self.prefix)
        self.control_bind: dict[str, str] = {}
        self.app_forward: dict[str, str] = {}
        self.forwarders: list[Forwarder] = []
        #: router -> (namespace, addresses listening there that match its listen port)
        self.bound: dict[str, tuple[str, list[tuple[str, int]]]] = {}

    def _address(self, router: str) -> tuple[str, int]:
        _, port = super()._address(router)
        return self.plan.address[self.plan.ns_of[router]], port

    def _control_bind(self, name: str) -> str:
        return self.control_bind[name]

    def _router_command(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.plan.ns_of[name], *argv]

    def _repick_control(self, name: str) -> bool:
        return False  # a fixed port inside the router's own namespace: nothing takes it

    def endpoint_address(self, router: str) -> str:
        return self.app_forward[router]

    async def _prepare(self) -> None:
        await asyncio.to_thread(self.plan.create)
        for i, r in enumerate(self.topo.routers):
            ns = self.plan.ns_of[r.name]
            self.listen[r.name] = self._address(r.name)
            self.control_bind[r.name] = f"127.0.0.1:{CONTROL_PORT_BASE + i}"
            ctl = Forwarder(ns, ("127.0.0.1", CONTROL_PORT_BASE + i))
            app = Forwarder(ns, self.listen[r.name])
            self.forwarders += [ctl, app]
            self.control[r.name] = await ctl.start()
            self.app_forward[r.name] = await app.start()
        if self.view:
            for ns, addr in self.plan.address.items():
                names = [r for r, n in self.plan.ns_of.items() if n == ns]
                print(f"namespace {ns}: {addr} ({', '.join(names)})", flush=True)

    async def start_routers(self) -> None:
        await super().start_routers()
        for r in self.topo.routers:
            ns = self.plan.ns_of[r.name]
            port = self.listen[r.name][1]
            found = await asyncio.to_thread(listening_addresses, ns)
            self.bound[r.name] = (ns, sorted(a for a in found if a[1] == port))

    async def close(self) -> None:
        """Stop the routers, then the forwarders, then remove the namespaces (and with them
        the veths), whatever state a failed start left them in."""
        try:
            await super().close()
        finally:
            for fwd in self.forwarders:
                await fwd.stop()
            await asyncio.to_thread(self.plan.remove)

    def cleanup(self) -> None:
        """Last-resort removal (e.g. from atexit): kill routers, delete namespaces."""
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        self.plan.remove()
