"""Bulk message rate through routers, next to raw TCP and nats-server, in one run.

What it measures (issue 16): the routers' own forwarding rate, not a client library's. The
publisher writes **pre-built frames in 64 KiB batches** on a blocking socket as fast as the
socket takes them; the subscriber only **counts bytes** (messages = bytes / frame size).
Each system gets the same two processes:

* **raw TCP** — publisher connects straight to the subscriber: the loopback ceiling;
* **flownet** — both endpoints speak the wire protocol directly (HELLO, JOIN, wait for the
  JOIN_ACK, then data frames) to a chain of 1 or 3 ``flowrouter run`` processes; the
  publisher sits on the first router, the subscriber on the last (the core);
* **NATS** — the text protocol (CONNECT, SUB / PUB) to one nats-server, or to a chain of
  three joined by leaf-node connections (a cluster's routes never forward more than one hop,
  leaf nodes do), publisher on the first, subscriber on the last.

The rate is taken at the subscriber over a window that starts ``--warmup`` seconds after its
first byte and lasts ``--duration`` seconds, while the publisher is still sending. CPU per
message: CPU seconds (user + system, /proc) of each router or nats-server process over the
publisher's whole run, divided by the messages the subscriber received in that run, quoted
per million messages. Nothing is lost in a flownet chain (TCP pushes back); a NATS server
may cut a slow subscriber off, which the row's ``note`` says.

Round trip (``--rtt``): blocking-socket ping-pong of one 64-byte message between two
endpoints, through nothing (raw TCP echo), one router, one nats-server; ``--rtt-passes``
passes (5) in which the three take turns, reported as the median of each one's pass medians.

    python3 benchmarks/bulk.py --sizes 16 256 1024 16384 65536 --hops 1 3 --duration 3 \\
        --out benchmarks/results/bulk.json

``client``-driven throughput (flowlib and nats-py on both ends) stays in throughput.py: that
measures the client libraries as much as the routers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST,
    LSID,
    Child,
    RouterChain,
    free_port,
    load_average,
    log_directory,
    machine_info,
    proc_cpu_seconds,
    say,
    table,
    write_json,
)

BATCH = 64 * 1024
DATA_BAND = 32
HEADER_SIZE = 24


# ---------------------------------------------------------------------------- wire helpers
def _frame(key: bytes, band: int, payload: bytes, ttl: int = 32) -> bytes:
    return key + struct.pack("!IBBBB", len(payload), band, 0, 0, ttl) + payload


def _read_frame(sock: socket.socket, buf: bytearray) -> tuple[bytes, bytes]:
    """One whole frame from a blocking socket (handshake only)."""
    while True:
        if len(buf) >= HEADER_SIZE:
            size = int.from_bytes(buf[16:20], "big")
            if len(buf) >= HEADER_SIZE + size:
                hdr, body = bytes(buf[:HEADER_SIZE]), bytes(buf[HEADER_SIZE:HEADER_SIZE + size])
                del buf[:HEADER_SIZE + size]
                return hdr, body
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("router closed the link during the handshake")
        buf += chunk


def flownet_attach(addr: str, name: str, key: bytes, mask: int | None) -> socket.socket:
    """Connect to a router as an application, join *key* with *mask* (None: do not join),
    wait for the ack."""
    from flowrouter.wire import control as C
    from flowrouter.wire.flowid import LINK_LOCAL_FLOW

    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    node_id = int.from_bytes(os.urandom(7), "big") | 1
    hello = C.Hello(node_id, C.Role.ENDPOINT, name, 64 * 1024).encode()
    sock.sendall(_frame(LINK_LOCAL_FLOW.key, 0, hello))
    buf = bytearray()
    while True:
        hdr, body = _read_frame(sock, buf)
        msg = C.decode(body)
        if isinstance(msg, C.Hello):
            break
        if isinstance(msg, C.Error):
            raise ConnectionError(f"router refused us: {msg.text}")
    if mask is None:
        return sock
    sock.sendall(_frame(key, 0, C.Join(1, mask).encode()))
    while True:
        hdr, body = _read_frame(sock, buf)
        if hdr[:16] != key or hdr[20] != 0:
            continue
        msg = C.decode(body)
        if isinstance(msg, C.JoinAck):
            if msg.status is not C.JoinStatus.OK:
                raise ConnectionError(f"join refused: {msg.status.name} {msg.reason}")
            return sock


def flow_keys(key: bytes, n: int) -> list[bytes]:
    """*key*, then n - 1 more keys of the same creator and LSID (``--flows``)."""
    base = int.from_bytes(key[12:], "big")
    return [key] + [key[:12] + ((base + i) & 0xFFFFFFFF).to_bytes(4, "big")
                    for i in range(1, n)]


def join_many(sock: socket.socket, keys: list[bytes], mask: int) -> None:
    """Join every key of *keys* on an attached socket: JOINs pipelined in rounds of 1,000,
    each round's acks awaited and a router tick let by (the router's join quota is raised
    for this; it handles at most 1,024 control messages of one application per tick and
    drops the rest)."""
    from flowrouter.wire import control as C

    buf = bytearray()
    for at in range(0, len(keys), 1000):
        if at:
            time.sleep(0.3)  # past the router's tick (0.25 s)
        part = keys[at:at + 1000]
        sock.sendall(b"".join(_frame(k, 0, C.Join(1, mask).encode()) for k in part))
        left = len(part)
        while left:
            hdr, body = _read_frame(sock, buf)
            if hdr[20] != 0:
                continue
            msg = C.decode(body)
            if isinstance(msg, C.JoinAck):
                if msg.status is not C.JoinStatus.OK:
                    raise ConnectionError(f"join refused: {msg.status.name} {msg.reason}")
                left -= 1


def refresh_all(sock: socket.socket, keys: list[bytes], mask: int) -> None:
    """One complete refresh digest round of *keys*, as flowlib sends every refresh interval.

    A subscriber that never refreshes loses its flows to the router's hold time (35 s by
    default) from the moment its link has been up that long: with 10^5 flows the joins
    alone take about that, and the router would spend the measured window expiring them (and
    dropping their frames) instead of forwarding. A complete round resets the hold time of
    every flow and of the link's own sweep, which covers any run shorter than it. Sent in
    steps of 16 chunks a tick (the router works through 20,000 digest entries a tick and
    drops what would queue past 65,536 of one application), the last step let by too."""
    from flowrouter.wire import control as C
    from flowrouter.wire.flowid import LINK_LOCAL_FLOW

    per = C.refresh_capacity(64 * 1024)
    count = max(1, -(-len(keys) // per))
    period = C.refresh_period(len(keys), C.DEFAULT_REFRESH_INTERVAL)
    hold_ms = int(period * C.DEFAULT_HOLD_FACTOR * 1000)
    for at in range(0, count, 16):
        sock.sendall(b"".join(_frame(LINK_LOCAL_FLOW.key, 0, C.Refresh(
            1, i, count, hold_ms, tuple((k, mask, 0) for k in keys[i * per:(i + 1) * per])
        ).encode()) for i in range(at, min(count, at + 16))))
        time.sleep(0.3)  # past the router's tick (0.25 s)


def _answer_in_background(sock: socket.socket, kind: str, lock: Any) -> None:
    """Read and discard what a router or server sends a publisher, answering what must be
    answered (NATS PING); keeps its socket buffer from filling. The answer is written under
    *lock*, which the publisher holds while it writes a batch: a PONG written in the middle
    of a batch would cut a PUB in two (nats-server pings a client two seconds after it
    connects, and closes it on the parse error)."""
    import threading

    def run() -> None:
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                if kind == "nats" and b"PING\r\n" in data:
                    with lock:
                        sock.sendall(b"PONG\r\n")
        except OSError:
            return

    threading.Thread(target=run, daemon=True).start()


def nats_attach(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = sock.makefile("rb")
    f.readline()  # INFO
    sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"echo":false}\r\nPING\r\n')
    while f.readline().strip() != b"PONG":
        pass
    return sock


# ---------------------------------------------------------------------------- workers
def worker_publisher(p: dict[str, Any]) -> None:
    import threading

    size = p["size"]
    payload = bytes(size)
    lock = threading.Lock()
    if p["system"] == "nats":
        sock = nats_attach(p["addr"])
        one = b"PUB bulk %d\r\n" % size + payload + b"\r\n"
        _answer_in_background(sock, "nats", lock)
    elif p["system"] == "flownet":
        key = bytes.fromhex(p["key"])
        # a member on the membership band only; a stranger only says HELLO, and its frames
        # travel toward the location service until they meet the tree
        sock = flownet_attach(p["addr"], "bulk-pub", key, 1 if p.get("join", True) else None)
        # with --flows N: one frame per flow, cycling over all N
        one = b"".join(_frame(k, DATA_BAND, payload) for k in flow_keys(key, p.get("flows", 1)))
        _answer_in_background(sock, "flownet", lock)
    else:
        host, port = p["addr"].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        one = _frame(bytes(16), DATA_BAND, payload)
    batch = one * max(1, BATCH // len(one))
    frame_len = len(one) // p.get("flows", 1) if p["system"] == "flownet" else len(one)
    chunk = max(1, BATCH // frame_len) * frame_len  # whole frames per write
    print(json.dumps({"event": "ready"}), flush=True)
    sys.stdin.readline()  # go
    end = time.monotonic() + p["seconds"]
    # a server that stops reading (nats-server stalls a publisher whose subscribers are
    # slow) ends the run with a note, not a benchmark that hangs
    sock.settimeout(10.0)
    sent = 0
    view = memoryview(batch)
    at = 0
    try:
        while time.monotonic() < end:
            piece = view[at:at + chunk]
            with lock:
                sock.sendall(piece)
            sent += len(piece)
            at = (at + len(piece)) % len(batch)
    except OSError as exc:
        print(json.dumps({"event": "result", "sent": sent, "error": str(exc)}), flush=True)
        return
    print(json.dumps({"event": "result", "sent": sent}), flush=True)
    sock.close()


def worker_subscriber(p: dict[str, Any]) -> None:
    size = p["size"]
    if p["system"] == "nats":
        sock = nats_attach(p["addr"])
        sock.sendall(b"SUB bulk 1\r\nPING\r\n")
        f = sock.makefile("rb")
        while f.readline().strip() != b"PONG":
            pass
        per_msg = len(b"MSG bulk 1 %d\r\n" % size) + size + 2
    elif p["system"] == "flownet":
        keys = flow_keys(bytes.fromhex(p["key"]), p.get("flows", 1))
        sock = flownet_attach(p["addr"], "bulk-sub", keys[0], 1 | 1 << DATA_BAND)
        join_many(sock, keys[1:], 1 | 1 << DATA_BAND)
        refresh_all(sock, keys, 1 | 1 << DATA_BAND)
        per_msg = HEADER_SIZE + size
    else:
        lsock = socket.socket()
        lsock.bind((HOST, 0))
        lsock.listen(1)
        print(json.dumps({"event": "listening", "addr": "%s:%d" % lsock.getsockname()}),
              flush=True)
        sock, _ = lsock.accept()
        per_msg = HEADER_SIZE + size
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    print(json.dumps({"event": "ready"}), flush=True)
    warmup, duration = p["warmup"], p["duration"]
    buf = bytearray(1 << 20)
    total = 0
    first = None
    w_start = w_end = None
    win_bytes = 0
    sock.settimeout(30.0)  # the publisher may take a while to start on a busy machine
    try:
        while True:
            n = sock.recv_into(buf)
            if not n:
                break
            now = time.monotonic()
            total += n
            if first is None:
                first = now
                w_start, w_end = first + warmup, first + warmup + duration
                sock.settimeout(p["idle"])  # then: the publisher stopped when idle this long
            if w_start <= now < w_end:  # type: ignore[operator]
                win_bytes += n
    except (TimeoutError, OSError):
        pass
    print(json.dumps({"event": "result", "bytes": total, "window_bytes": win_bytes,
                      "window": duration, "per_msg": per_msg,
                      "msgs": total // per_msg,
                      "msg_rate": win_bytes / per_msg / duration if first else 0.0}),
          flush=True)


def worker_echo(p: dict[str, Any]) -> None:
    """Ping-pong peer: send back every message it gets (RTT mode)."""
    size = p["size"]
    system = p["system"]
    if system == "nats":
        sock = nats_attach(p["addr"])
        sock.sendall(b"SUB ping 1\r\nPING\r\n")
        f = sock.makefile("rb")
        while f.readline().strip() != b"PONG":
            pass
        pong = b"PUB pong %d\r\n" % size + bytes(size) + b"\r\n"
        need = len(b"MSG ping 1 %d\r\n" % size) + size + 2
    elif system == "flownet":
        key = bytes.fromhex(p["key"])
        sock = flownet_attach(p["addr"], "rtt-echo", key, 1 | 1 << DATA_BAND)
        pong = _frame(key, DATA_BAND, bytes(size))
        need = len(pong)
    else:
        lsock = socket.socket()
        lsock.bind((HOST, 0))
        lsock.listen(1)
        print(json.dumps({"event": "listening", "addr": "%s:%d" % lsock.getsockname()}),
              flush=True)
        sock, _ = lsock.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pong = _frame(bytes(16), DATA_BAND, bytes(size))
        need = len(pong)
    print(json.dumps({"event": "ready"}), flush=True)
    _ping_pong_loop(sock, pong, need, None)


def _ping_pong_loop(sock: socket.socket, out: bytes, need: int, times: list[float] | None,
                    rounds: int = 1 << 62) -> None:
    """Receive *need* bytes, send *out*; with *times*, send first and time each round."""
    buf = bytearray(65536)
    have = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        if times is not None:
            sock.sendall(out)
        while have < need:
            n = sock.recv_into(memoryview(buf)[have:])
            if not n:
                return
            have += n
        have -= need
        if have:
            buf[:have] = buf[need:need + have]
        if times is not None:
            times.append(time.perf_counter() - t0)
        else:
            sock.sendall(out)


def worker_pinger(p: dict[str, Any]) -> None:
    size = p["size"]
    system = p["system"]
    if system == "nats":
        sock = nats_attach(p["addr"])
        sock.sendall(b"SUB pong 1\r\nPING\r\n")
        f = sock.makefile("rb")
        while f.readline().strip() != b"PONG":
            pass
        ping = b"PUB ping %d\r\n" % size + bytes(size) + b"\r\n"
        need = len(b"MSG pong 1 %d\r\n" % size) + size + 2
    elif system == "flownet":
        key = bytes.fromhex(p["key"])
        sock = flownet_attach(p["addr"], "rtt-ping", key, 1 | 1 << DATA_BAND)
        ping = _frame(key, DATA_BAND, bytes(size))
        need = len(ping)
    else:
        host, port = p["addr"].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ping = _frame(bytes(16), DATA_BAND, bytes(size))
        need = len(ping)
    times: list[float] = []
    _ping_pong_loop(sock, ping, need, times, p["warm"])
    times.clear()
    _ping_pong_loop(sock, ping, need, times, p["rounds"])
    times.sort()
    print(json.dumps({"event": "result", "median_us": times[len(times) // 2] * 1e6,
                      "p99_us": times[int(len(times) * 0.99)] * 1e6, "rounds": len(times)}),
          flush=True)
    sock.close()


WORKERS = {"publisher": worker_publisher, "subscriber": worker_subscriber,
           "echo": worker_echo, "pinger": worker_pinger}


# ---------------------------------------------------------------------------- NATS chain
class NatsChain:
    """1 nats-server, or N joined in a line by leaf-node links (n1 -> n2 -> ... -> nN)."""

    def __init__(self, n: int, log_dir: Path) -> None:
        self.n = n
        self.log_dir = log_dir
        self.procs: list[Child] = []
        self.ports: list[int] = []

    async def __aenter__(self) -> NatsChain:
        exe = shutil.which("nats-server")
        if exe is None:
            raise RuntimeError("nats-server is not installed")
        self.ports = [free_port() for _ in range(self.n)]
        leaf = [free_port() for _ in range(self.n)]
        for i in range(self.n - 1, -1, -1):
            conf = [f"listen: {HOST}:{self.ports[i]}", f'server_name: "n{i + 1}"',
                    "leafnodes {"]
            if i > 0:
                conf.append(f"  listen: {HOST}:{leaf[i]}")
            if i < self.n - 1:
                conf.append(f'  remotes: [{{url: "nats-leaf://{HOST}:{leaf[i + 1]}"}}]')
            conf.append("}")
            path = self.log_dir / f"nats-n{i + 1}.conf"
            path.write_text("\n".join(conf) + "\n")
            self.procs.insert(0, await Child.start(f"nats-n{i + 1}", [exe, "-c", str(path)],
                                                   self.log_dir))
        deadline = time.monotonic() + 20
        for port in self.ports:
            while True:
                try:
                    _r, w = await asyncio.open_connection(HOST, port)
                    w.close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError("nats-server did not come up") from None
                    await asyncio.sleep(0.05)
        await asyncio.sleep(0.5 if self.n > 1 else 0)  # leaf connections
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(p.stop() for p in self.procs), return_exceptions=True)

    @property
    def first(self) -> str:
        return f"{HOST}:{self.ports[0]}"

    @property
    def last(self) -> str:
        return f"{HOST}:{self.ports[-1]}"

    def cpu(self) -> list[float]:
        return [proc_cpu_seconds(p.pid) for p in self.procs]


# ---------------------------------------------------------------------------- orchestration
def _argv(role: str, **params: Any) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", role, json.dumps(params)]


async def _profile(args: argparse.Namespace, label: str, hops: int, size: int,
                   pids: list[int]) -> list[tuple[Any, Path]]:
    """Start ``py-spy record`` on each router over the measured window (``--profile``)."""
    spy = shutil.which("py-spy")
    if not args.profile or spy is None or not pids:
        return []
    out_dir = Path(args.profile)  # made by main() before the run
    await asyncio.sleep(args.warmup)
    spies = []
    for i, pid in enumerate(pids):
        out = out_dir / f"{label}-{hops}h-{size}B-r{i + 1}.collapsed.txt"
        proc = await asyncio.create_subprocess_exec(
            spy, "record", "-p", str(pid), "-d", str(max(1, round(args.duration))), "-r",
            "200", "-f", "raw", "--nonblocking", "-o", str(out),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        spies.append((proc, out))
    return spies


async def _profile_summary(spies: list[tuple[Any, Path]]) -> None:
    """Wait for the py-spy runs; print each router's top functions by self time."""
    from profile_hotpath import summarize_collapsed

    for proc, out in spies:
        await proc.wait()
        if not out.exists():
            continue
        summary = summarize_collapsed(out.read_text(), 6)
        out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
        say(f"    {out.name}: {summary['samples']} busy samples; self: " + "; ".join(
            f"{r['share']:.0%} {r['function']}" for r in summary["self"]))


async def _one_rate(system: str, hops: int, size: int, args: argparse.Namespace,
                    log_dir: Path, pub_addr: str, sub_addr: str, cpu_of: Any,
                    key: str = "", label: str = "", join: bool = True,
                    pids: list[int] | None = None, flows: int = 1) -> dict[str, Any]:
    """One rate row; *label* names it in the tables (default: *system*); *pids*: the
    routers to profile with ``--profile``."""
    label = label or system
    seconds = args.warmup + args.duration + 1.0
    sub = await Child.start(f"sub-{system}", _argv(
        "subscriber", system=system, addr=sub_addr, size=size, key=key,
        warmup=args.warmup, duration=args.duration, idle=1.0, flows=flows), log_dir,
        stdin=True)
    try:
        if system == "raw":
            pub_addr = (await sub.expect("listening", 10))["addr"]
        pub = await Child.start(f"pub-{system}", _argv(
            "publisher", system=system, addr=pub_addr, size=size, key=key, seconds=seconds,
            join=join, flows=flows),
            log_dir, stdin=True)
        try:
            if system != "raw":
                await sub.expect("ready", 20 + flows / 500)
            await pub.expect("ready", 20)
            if system == "nats" and hops > 1:
                await asyncio.sleep(0.5)  # subscription interest crossing the leaf links
            cpu0 = cpu_of()
            pub.tell("go")
            await pub.proc.stdin.drain()  # type: ignore[union-attr]
            spies = await _profile(args, label, hops, size, pids or [])
            sent = await pub.expect("result", seconds + 30)
            await _profile_summary(spies)
            got = await sub.expect("result", 30)
            cpu1 = cpu_of()
        finally:
            await pub.stop()
    finally:
        await sub.stop()
    msgs = max(got["msgs"], 1)
    cpu = [(b - a) / msgs * 1e6 for a, b in zip(cpu0, cpu1)]
    row = {"system": label, "hops": hops, "size": size, "msg_rate": got["msg_rate"],
           "mb_s": got["msg_rate"] * size / 1e6,
           "sent_msgs": sent["sent"] // got["per_msg"], "recv_msgs": got["msgs"],
           "cpu_s_per_M": cpu, "cpu_s_per_M_max": max(cpu) if cpu else None}
    if sent.get("error"):
        row["note"] = f"publisher: {sent['error']}"
    elif system == "nats" and got["msgs"] < sent["sent"] // got["per_msg"] * 0.99:
        row["note"] = "subscriber got less than was published"
    say(f"  {label:8s} hops={hops} {size:>6} B: {got['msg_rate']:>12,.0f} msg/s  "
        f"cpu/M msgs {['%.2f' % c for c in cpu]}")
    return row


#: lets one host hold many connections and flows and join them fast (``--flows``, and
#: fanout_bulk.py's 1,000 receivers): each router's ``--name`` overrides the name
ROUTER_CONFIG = """[router]
name = "bench"
max_flows_per_endpoint = 2000000

[quota]
flows = 2000000
connections_per_host = 5000
joins_per_second = 10000000.0
join_burst = 10000000
"""


def router_config(log_dir: Path) -> list[str]:
    """``flowrouter run`` arguments for ROUTER_CONFIG (written into *log_dir*)."""
    conf = log_dir / "bench-router.toml"
    conf.write_text(ROUTER_CONFIG)
    return ["--config", str(conf)]


def flownet_sides(args: argparse.Namespace) -> list[tuple[str, Path | None, bool, int]]:
    """(label, code or None for this checkout, sender joins, flows) of each flownet row
    kind: ``flownet`` / ``flownet-stranger`` (a sender that is not a member), with
    ``--base`` the same from that checkout, labelled ``base`` / ``base-stranger``, and with
    ``--flows`` one kind per flow count (``... xN``: the sender cycles over N flows)."""
    codes: list[tuple[str, Path | None]] = [("flownet", None)]
    if args.base:
        codes.insert(0, ("base", Path(args.base).resolve()))
    return [(name + ("" if sender == "member" else f"-{sender}")
             + ("" if not args.flows else f" x{flows}"), code, sender == "member", flows)
            for name, code in codes for sender in args.senders
            for flows in (args.flows or [1])]


async def run_rates(args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    """Per chain length, every system's chain is started first, then each payload size is
    measured on each in turn (so load from elsewhere on the machine hits them alike)."""
    rows: list[dict[str, Any]] = []
    for size in args.sizes:
        rows.append(await _one_rate("raw", 0, size, args, log_dir, "", "", lambda: []))
    extra = router_config(log_dir) if args.flows else []
    for hops in args.hops:
        async with contextlib.AsyncExitStack() as stack:
            chains = []
            for label, code, join, flows in flownet_sides(args):
                chain = await stack.enter_async_context(RouterChain(hops, log_dir, extra,
                                                                    code=code))
                chains.append((label, chain, join, flows))
            nats = None if args.no_nats else await stack.enter_async_context(
                NatsChain(hops, log_dir))
            for size in args.sizes:
                for label, chain, join, flows in chains:
                    key = os.urandom(8).hex() + f"{LSID:08x}" + os.urandom(4).hex()
                    rows.append(await _one_rate("flownet", hops, size, args, log_dir,
                                                chain.listen[0], chain.listen[-1], chain.cpu,
                                                key, label, join,
                                                [p.pid for p in chain.procs], flows))
                if nats is not None:
                    rows.append(await _one_rate("nats", hops, size, args, log_dir, nats.first,
                                                nats.last, nats.cpu))
    return rows


async def _one_rtt(system: str, args: argparse.Namespace, log_dir: Path, addr: str,
                   key: str = "") -> dict[str, Any]:
    echo = await Child.start(f"echo-{system}", _argv("echo", system=system, addr=addr,
                                                     size=args.rtt_size, key=key), log_dir)
    try:
        if system == "raw":
            addr = (await echo.expect("listening", 10))["addr"]
        else:
            await echo.expect("ready", 20)
        if system == "nats":
            await asyncio.sleep(0.2)
        ping = await Child.start(f"ping-{system}", _argv(
            "pinger", system=system, addr=addr, size=args.rtt_size, key=key,
            warm=500, rounds=args.rtt_rounds), log_dir)
        try:
            res = await ping.expect("result", 120)
        finally:
            await ping.stop()
    finally:
        await echo.stop()
    say(f"  rtt {system:8s}: median {res['median_us']:.1f} us, p99 {res['p99_us']:.1f} us")
    return {"system": system, **res}


async def run_rtt(args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    """``--rtt-passes`` passes, the systems taking turns in each (round trips on a shared
    machine drift by tens of microseconds from one minute to the next); per system the
    median of its passes' medians, and every pass's."""
    key = os.urandom(8).hex() + f"{LSID:08x}" + os.urandom(4).hex()
    passes: dict[str, list[dict[str, Any]]] = {"raw": [], "flownet": [], "nats": []}
    async with contextlib.AsyncExitStack() as stack:
        chain = await stack.enter_async_context(RouterChain(1, log_dir))
        nats = None if args.no_nats else await stack.enter_async_context(NatsChain(1, log_dir))
        for _ in range(args.rtt_passes):
            passes["raw"].append(await _one_rtt("raw", args, log_dir, ""))
            passes["flownet"].append(await _one_rtt("flownet", args, log_dir,
                                                    chain.listen[0], key))
            if nats is not None:
                passes["nats"].append(await _one_rtt("nats", args, log_dir, nats.first))
    rows = []
    for system, runs in passes.items():
        if runs:
            med = sorted(r["median_us"] for r in runs)
            p99 = sorted(r["p99_us"] for r in runs)
            rows.append({"system": system, "median_us": med[len(med) // 2],
                         "p99_us": p99[len(p99) // 2], "rounds": sum(r["rounds"] for r in runs),
                         "pass_medians_us": [round(r["median_us"], 1) for r in runs]})
    return rows


def print_tables(result: dict[str, Any]) -> None:
    rows = result["rates"]
    by = {(r["system"], r["hops"], r["size"]): r for r in rows}
    kinds = sorted({(r["hops"], r["system"]) for r in rows if r["hops"]},
                   key=lambda hk: (hk[0], hk[1] == "nats", hk[1]))
    out = []
    for size in sorted({r["size"] for r in rows}):
        line: dict[str, Any] = {"size": size}
        raw = by.get(("raw", 0, size))
        line["raw"] = raw["msg_rate"] if raw else None
        for hops, system in kinds:
            r = by.get((system, hops, size))
            line[f"{system}{hops}"] = r["msg_rate"] if r else None
            line[f"{system}{hops}cpu"] = r["cpu_s_per_M_max"] if r else None
        out.append(line)
    cols = [("size", "payload", ">8"), ("raw", "raw TCP", ">12,.0f")]
    for hops, system in kinds:
        cols.append((f"{system}{hops}", f"{system} {hops}h", ">12,.0f"))
    for hops, system in kinds:
        cols.append((f"{system}{hops}cpu", f"cpu/M {system} {hops}h", ">10.2f"))
    say(table(out, cols))
    say(f"load average at the start {result['machine'].get('loadavg')}, at the end "
        f"{result.get('loadavg_end')}")
    for r in result.get("rtt", []):
        say(f"rtt {r['system']}: median {r['median_us']:.1f} us p99 {r['p99_us']:.1f} us "
            f"(pass medians {r.get('pass_medians_us')})")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    async with log_directory(args.keep_logs) as log_dir:
        say(f"logs in {log_dir}")
        result: dict[str, Any] = {"machine": machine_info(), "command": " ".join(sys.argv),
                                  "rates": [], "rtt": []}
        if not args.rtt_only:
            result["rates"] = await run_rates(args, log_dir)
        if args.rtt or args.rtt_only:
            result["rtt"] = await run_rtt(args, log_dir)
        result["loadavg_end"] = load_average()
        return result


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1024, 16384, 65536])
    ap.add_argument("--hops", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--no-nats", action="store_true")
    ap.add_argument("--senders", nargs="+", choices=["member", "stranger"],
                    default=["member"],
                    help="flownet publishers: members (joined on the membership band) "
                         "and/or strangers (HELLO only, not members: their frames travel "
                         "toward the location service until they meet the tree)")
    ap.add_argument("--flows", type=int, nargs="+",
                    help="flownet rows with the subscriber joined to N flows and the "
                         "publisher cycling over them, one row kind per N (the routers get "
                         "a config that lets one application hold that many)")
    ap.add_argument("--base", metavar="CHECKOUT",
                    help="also run the flownet rows with routers from this checkout "
                         "(labelled base), taking turns with this one's in the same run")
    ap.add_argument("--no-native", action="store_true",
                    help="routers forward in Python only (FLOWNET_NATIVE=0)")
    ap.add_argument("--no-uvloop", action="store_true",
                    help="routers run on asyncio's own event loop (FLOWNET_UVLOOP=0), not "
                         "uvloop, their default")
    ap.add_argument("--rtt", action="store_true", help="also measure ping-pong round trips")
    ap.add_argument("--rtt-only", action="store_true")
    ap.add_argument("--rtt-size", type=int, default=64)
    ap.add_argument("--rtt-rounds", type=int, default=5000)
    ap.add_argument("--rtt-passes", type=int, default=5,
                    help="round-trip passes, the systems taking turns (median of medians)")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--profile", metavar="DIR",
                    help="sample each router with py-spy over each flownet row's window; "
                         "collapsed stacks and a summary per router go to DIR")
    ap.add_argument("--out", help="write the JSON result here")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        WORKERS[argv[1]](json.loads(argv[2]))
        return 0
    args = build_parser().parse_args(argv)
    if args.no_native:
        os.environ["FLOWNET_NATIVE"] = "0"
    if args.no_uvloop:
        os.environ["FLOWNET_UVLOOP"] = "0"
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(main_async(args))
    print_tables(result)
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
