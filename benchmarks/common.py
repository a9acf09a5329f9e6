"""Shared helpers for the benchmark scripts: processes, routers, NATS, output.

Every benchmark runs the pieces it measures in **separate processes** (one router per
process, sender and receiver in their own), so no single event loop does all the work. The
orchestrating script is an asyncio program that starts children with pipes, talks to them in
JSON lines, and always stops them (by their own process handles) when it is done, even on
errors and time-outs.

Workers (``benchmarks/workers.py``) print one JSON object per line on stdout: an ``event``
field names what happened (``ready``, ``result``, ``error``).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import datetime as _dt
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
#: the packages every benchmark process imports (see snapshot_code)
PACKAGES = ("flowrouter", "flowlib")
CODE_ENV = "FLOWNET_BENCH_CODE"


def snapshot_code() -> Path:
    """One frozen copy of flowrouter/ and flowlib/ for the whole run, shared by every process.

    The working tree may change while a benchmark runs (other people edit it); routers
    started before an edit and clients started after it would then speak different
    versions. So the first benchmark process copies the packages to a temporary directory,
    and it and all its children (through ``FLOWNET_BENCH_CODE`` and ``PYTHONPATH``) import
    that copy. The copy is removed when the process that made it exits.
    """
    existing = os.environ.get(CODE_ENV)
    if existing and Path(existing, "flowrouter").is_dir():
        return Path(existing)
    snap = Path(tempfile.mkdtemp(prefix="flownet-bench-code-"))
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, snap / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    os.environ[CODE_ENV] = str(snap)
    atexit.register(shutil.rmtree, snap, True)
    return snap


CODE_DIR = snapshot_code()
if str(CODE_DIR) not in sys.path:
    sys.path.insert(0, str(CODE_DIR))


def code_info() -> dict[str, Any]:
    """Which code was measured: the checkout's commit and whether it had local changes."""
    info: dict[str, Any] = {"snapshot_of": str(REPO)}
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, text=True,
                                        capture_output=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", *PACKAGES], cwd=REPO,
                                text=True, capture_output=True, timeout=10).stdout
        info["uncommitted_changes"] = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info

LSID = 0x10
HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- small helpers
def free_port() -> int:
    """A TCP port on loopback that was free a moment ago, below the kernel's ephemeral
    range (flowrouter.testbed.ports says why)."""
    from flowrouter.testbed.ports import free_port as below_ephemeral

    return below_ephemeral(HOST)


def child_env(code: Path | None = None) -> dict[str, str]:
    """Environment for children: the frozen copy of the code (or *code*, another checkout
    to compare with) first on the import path."""
    env = dict(os.environ)
    code = CODE_DIR if code is None else code
    env[CODE_ENV] = str(code)
    env["PYTHONPATH"] = str(code) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def proc_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds a process has used so far (Linux /proc), 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_sched(pid: int | str = "self") -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of a process's main thread,
    from /proc/PID/schedstat; (0, 0) if unavailable. Waiting time is CPU contention."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            run_ns, wait_ns, _ = f.read().split()
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def cpu_pressure_total() -> float | None:
    """Seconds during which some runnable task waited for a CPU (Linux PSI), or None."""
    try:
        with open("/proc/pressure/cpu") as f:
            for line in f:
                if line.startswith("some"):
                    return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        pass
    return None


def new_flow_text(local: int) -> str:
    """A fresh FlowID in text form (random creator per call site, LSID of the bench core)."""
    return f"{secrets.randbits(63) | 1:016x}:{LSID:08x}:{local:08x}"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return {
        "nproc": os.cpu_count(), "cpu": model, "memory": mem,
        "python": platform.python_version(), "platform": platform.platform(),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "loadavg": load_average(),
        "code": code_info(),
    }


def load_average() -> list[float]:
    """1/5/15-minute load: other work on the machine skews every number here."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def write_json(obj: Any, out: str | None) -> None:
    """The JSON result: to *out* if given (the table still goes to stderr), else to stdout."""
    text = json.dumps(obj, indent=2, sort_keys=False)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    else:
        print(text)


def add_output_options(p: argparse.ArgumentParser) -> None:
    """``--keep-logs`` and ``--out``, the same in every benchmark that starts processes."""
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    p.add_argument("--out", help="write the JSON here instead of stdout")


def run_benchmark(args: argparse.Namespace,
                  main_async: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
                  show: Callable[[dict[str, Any]], None],
                  **defaults: tuple[Any, Any]) -> int:
    """A benchmark script's ``main`` after parsing: each option named in *defaults* that was
    left unset (None) gets its ``(quick, full)`` value by ``--quick``; then the run, its
    human summary (*show*, on stderr) and the JSON (:func:`write_json` to ``--out``)."""
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    result = asyncio.run(main_async(args))
    show(result)
    write_json(result, args.out)
    return 0


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A plain text table. columns: (key, heading, format spec such as '>10.1f')."""
    heads = [head for _key, head, _spec in columns]
    cells: list[list[str]] = []
    for row in rows:
        line = []
        for key, _head, spec in columns:
            v = row.get(key)
            if v is None or isinstance(v, float) and v != v:
                line.append("-")
            else:
                try:
                    line.append(format(v, spec.lstrip("<>")))
                except (TypeError, ValueError):
                    line.append(str(v))
        cells.append(line)
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    aligns = ["<" if spec.startswith("<") else ">" for _, _, spec in columns]
    out = ["  ".join(format(h, f"{a}{w}") for h, a, w in zip(heads, aligns, widths))]
    out.append("  ".join("-" * w for w in widths))
    for c in cells:
        out.append("  ".join(format(x, f"{a}{w}") for x, a, w in zip(c, aligns, widths)))
    return "\n".join(out)


def say(*args: Any) -> None:
    """Progress and tables go to stderr so stdout stays pure JSON."""
    print(*args, file=sys.stderr, flush=True)


def human_bytes(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


# ---------------------------------------------------------------------------- child processes
class Child:
    """A child process speaking JSON lines on stdout; stderr goes to a log file."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(cls, name: str, argv: list[str], log_dir: Path,
                    stdin: bool = False, code: Path | None = None) -> Child:
        log_path = log_dir / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115,ASYNC230 - a local file, closed below
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=subprocess.PIPE, stderr=log,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                env=child_env(code), cwd=str(CODE_DIR if code is None else code),
                limit=1 << 20)
        finally:
            log.close()
        return cls(name, proc, log_path)

    def log_tail(self, n: int = 15) -> str:
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        return ""

    async def expect(self, event: str, timeout: float) -> dict[str, Any]:
        """The next JSON line with ``event``; raises with the child's log on error/EOF."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no '{event}' within {timeout:.0f}s\n"
                                   f"{self.log_tail()}")
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), left)
            except TimeoutError:
                continue
            if not line:
                await asyncio.sleep(0.05)
                raise RuntimeError(f"{self.name} exited (rc={self.proc.returncode}) before "
                                   f"'{event}'\n{self.log_tail()}")
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("event") == "error":
                raise RuntimeError(f"{self.name}: {msg.get('error')}\n{self.log_tail()}")
            if msg.get("event") == event:
                return msg

    def tell(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")

    async def stop(self, timeout: float = 3.0) -> None:
        proc = self.proc
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if proc.stdin is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()

    async def wait(self, timeout: float) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self.stop()
            raise TimeoutError(f"{self.name} did not exit within {timeout:.0f}s") from None


def worker_argv(role: str, **params: Any) -> list[str]:
    return [sys.executable, str(BENCH_DIR / "workers.py"), role, json.dumps(params)]


async def start_worker(role: str, name: str, log_dir: Path, stdin: bool = False,
                       **params: Any) -> Child:
    return await Child.start(name, worker_argv(role, **params), log_dir, stdin=stdin)


@contextlib.asynccontextmanager
async def children() -> AsyncIterator[list[Child]]:
    """A list to put children in; every one is stopped on the way out."""
    kids: list[Child] = []
    try:
        yield kids
    finally:
        await asyncio.gather(*(k.stop() for k in kids), return_exceptions=True)


@contextlib.asynccontextmanager
async def log_directory(keep: bool = False) -> AsyncIterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="flownet-bench-"))
    try:
        yield d
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------- router chains
async def control_query(address: str, cmd: str = "status", timeout: float = 5.0
                        ) -> dict[str, Any]:
    from flowrouter.net.runtime import query_control

    return await query_control(address, cmd, timeout)


class ProcessGroup:
    """Child processes started and stopped together. ``async with`` runs :meth:`_start`
    (stopping whatever did start when it fails) and stops them all after."""

    procs: list[Child]

    async def __aenter__(self) -> Self:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.procs), return_exceptions=True)


class RouterChain(ProcessGroup):
    """Routers r1 - r2 - ... - rN, each its own ``flowrouter run`` process; rN is the core of
    LSID 0x10. ``listen[i]``/``control[i]`` are the addresses of r(i+1). With *code*, the
    routers run that checkout's code (a before/after comparison in one run)."""

    def __init__(self, n: int, log_dir: Path, extra_args: Sequence[str] = (),
                 code: Path | None = None) -> None:
        self.n = n
        self.code = code
        self.log_dir = log_dir
        self.extra_args = list(extra_args)
        self.procs: list[Child] = []
        self.listen: list[str] = []
        self.control: list[str] = []

    async def _start(self) -> None:
        n = self.n
        self.listen = [f"{HOST}:{free_port()}" for _ in range(n)]
        self.control = [f"{HOST}:{free_port()}" for _ in range(n)]
        for i in range(n - 1, -1, -1):  # the core first, then each router dials the next
            argv = [sys.executable, "-m", "flowrouter.tools.cli", "--log-level", "warning", "run",
                    "--name", f"r{i + 1}", "--listen", self.listen[i],
                    "--control", self.control[i], *self.extra_args]
            if i == n - 1:
                argv += ["--core-lsid", hex(LSID)]
            else:
                argv += ["--peer", f"r{i + 2}={self.listen[i + 1]}"]
            if i > 0:  # r(i) dials this one: accept it as a router (no link keys here)
                argv += ["--accept-router", f"r{i}@{HOST}"]
            self.procs.insert(0, await Child.start(f"router-r{i + 1}", argv, self.log_dir,
                                                   code=self.code))
        deadline = time.monotonic() + 20.0
        for i in range(n):
            await self._wait_up(i, deadline)

    async def _wait_up(self, i: int, deadline: float) -> None:
        """Until r(i+1) answers on its control address and knows the way to the core."""
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.procs[i].proc.returncode is not None:
                raise RuntimeError(f"router r{i + 1} exited:\n{self.procs[i].log_tail()}")
            try:
                st = (await control_query(self.control[i], timeout=1.0))["status"]
                routes = {r["lsid"]: r for r in st["ls_routes"]}
                row = routes.get(hex(LSID))
                if row and (row["core"] or row["link"] is not None):
                    self._check_engine(i, st)
                    return
                last = f"no route to LSID {LSID:#x} yet"
            except (ConnectionError, OSError, ValueError) as exc:
                last = str(exc)
            await asyncio.sleep(0.05)
        raise TimeoutError(f"router r{i + 1} not ready: {last}\n{self.procs[i].log_tail()}")

    def _check_engine(self, i: int, st: dict[str, Any]) -> None:
        """Refuse a router that lost its fast path by accident (the compiled engine not
        built in the measured checkout): its rows would measure the Python core, 25-100x
        slower, under the fast path's name. ``--no-native`` (FLOWNET_NATIVE=0) asks for
        that on purpose. A one-line error (SystemExit), as for a bad option."""
        from flowrouter.core.fastpath import fast_path_off

        fast = st.get("fast_path") or {}
        if fast.get("engine") is None and not fast_path_off():
            raise SystemExit(f"{Path(sys.argv[0]).name}: router r{i + 1} forwards without a "
                             f"fast path: {fast.get('why', 'no fast path in its status')} (build "
                             "the compiled engine in the measured checkout, or pass --no-native "
                             "to measure the Python core)")

    async def counters(self) -> list[dict[str, int]]:
        out = []
        for addr in self.control:
            st = (await control_query(addr))["status"]
            out.append(dict(st["counters"]))
        return out

    def cpu(self) -> list[float]:
        return [proc_cpu_seconds(p.pid) for p in self.procs]

    def sched(self) -> list[tuple[float, float]]:
        return [proc_sched(p.pid) for p in self.procs]


def counter_delta(before: list[dict[str, int]], after: list[dict[str, int]],
                  prefix: str = "drop.") -> dict[str, int]:
    """Summed increase of counters starting with *prefix*, over all routers."""
    total: dict[str, int] = {}
    for b, a in zip(before, after):
        for k, v in a.items():
            if k.startswith(prefix):
                d = v - b.get(k, 0)
                if d:
                    total[k] = total.get(k, 0) + d
    return total


# ---------------------------------------------------------------------------- NATS
def nats_unavailable() -> str | None:
    """Why the NATS comparison cannot run here, or None if it can."""
    if shutil.which("nats-server") is None:
        return ("nats-server is not installed (apt-get install -y nats-server); "
                "skipping the NATS comparison")
    try:
        import nats  # noqa: F401
    except ImportError:
        return ("the nats-py client is not installed (pip install nats-py); "
                "skipping the NATS comparison")
    return None


class NatsCluster(ProcessGroup):
    """Three nats-server processes clustered on loopback (full mesh of routes)."""

    def __init__(self, log_dir: Path, n: int = 3) -> None:
        self.n = n
        self.log_dir = log_dir
        self.procs: list[Child] = []
        self.client_ports: list[int] = []

    @property
    def urls(self) -> list[str]:
        return [f"nats://{HOST}:{p}" for p in self.client_ports]

    async def _start(self) -> None:
        exe = shutil.which("nats-server")
        assert exe is not None
        self.client_ports = [free_port() for _ in range(self.n)]
        cluster_ports = [free_port() for _ in range(self.n)]
        for i in range(self.n):
            routes = ",".join(f"nats://{HOST}:{cluster_ports[j]}" for j in range(self.n)
                              if j != i)
            argv = [exe, "-a", HOST, "-p", str(self.client_ports[i]), "-n", f"n{i + 1}",
                    "--cluster_name", "bench", "-cluster", f"nats://{HOST}:{cluster_ports[i]}",
                    "-routes", routes]
            self.procs.append(await Child.start(f"nats-n{i + 1}", argv, self.log_dir))
        deadline = time.monotonic() + 20.0
        for port in self.client_ports:
            while True:
                try:
                    _r, w = await asyncio.open_connection(HOST, port)
                    w.close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"nats-server on port {port} did not come up:\n"
                                           + "\n".join(p.log_tail(5) for p in self.procs)
                                           ) from None
                    await asyncio.sleep(0.05)
        await self._wait_routed(deadline)

    async def _wait_routed(self, deadline: float) -> None:
        """Until a message published on node 1 reaches a subscriber on the last node."""
        import nats

        sub_nc = await nats.connect(self.urls[-1], connect_timeout=2)
        pub_nc = await nats.connect(self.urls[0], connect_timeout=2)
        try:
            subject = f"probe.{secrets.token_hex(4)}"
            sub = await sub_nc.subscribe(subject)
            await sub_nc.flush()
            while True:
                await pub_nc.publish(subject, b"probe")
                await pub_nc.flush()
                try:
                    await sub.next_msg(timeout=0.2)
                    return
                except Exception:  # nats.errors.TimeoutError
                    if time.monotonic() > deadline:
                        raise TimeoutError("the NATS cluster did not route between nodes") \
                            from None
        finally:
            await pub_nc.close()
            await sub_nc.close()

    def cpu(self) -> list[float]:
        return [proc_cpu_seconds(p.pid) for p in self.procs]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
