"""Bulk message rate through routers linked by UDP, with UDP endpoints (issue 16, batched I/O).

The UDP twin of bulk.py: a chain of 1 or 3 ``flowrouter run`` processes whose router links
are UDP (``--peer NAME=HOST:PORT/udp``); the publisher and the subscriber speak the wire
protocol over UDP to the first and the last router (HELLO, JOIN, then frames). Routers
bundle frames into datagrams between themselves (``[router] udp_bundle``, ``--udp-bundle``
here; 0: a frame per datagram, as before bundles). The endpoints announce bundles too, as a
TCP load generator writes 64 KiB at a time (``--endpoint-bundle``, bytes; 0: they announce
nothing and speak a frame per datagram). The publisher sends one pre-built frame in batches
of 64 frames per system call on a connected UDP socket, as fast as it can (``--rate 0``) or
paced to ``--rate`` messages per second (bursts every millisecond); the subscriber only
counts frames of the data band, taking 64 datagrams at a time. Both use the routers' own
batched datagram I/O (``recvmmsg``/``sendmmsg`` when built: flowrouter.net.udpio), so
neither end is a per-datagram Python loop.

UDP does not push back: what a router cannot take in time is dropped by the kernel (its
socket buffer overflows). So each row gives the rate delivered over the measuring window
(``--warmup`` seconds after the first datagram, ``--duration`` seconds long), the loss over
the whole run (1 - received / sent), the routers' counted drops (``drop.udp-rcvbuf``: what
the kernel dropped for a full receive buffer), the machine's UDP counters over the run
(/proc/net/snmp: datagrams in and out, receive and send buffer errors; other tenants' too),
and the CPU seconds of each router per million messages *delivered* (user + system, /proc,
over the publisher's whole run), and its split: on loopback the kernel delivers a datagram
into the receiver's socket in the *sender's* context, so a router's system time includes
its receivers' share of the kernel work.

    python3 benchmarks/udp_bulk.py --sizes 16 256 1024 8192 --hops 1 3 --duration 3 \\
        --out benchmarks/results/udp_bulk.json

To measure other code (e.g. the version before a change), point ``FLOWNET_BENCH_CODE`` at a
directory holding its ``flowrouter`` and ``flowlib`` (benchmarks/common.py).
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
    CLK_TCK,
    HOST,
    LSID,
    Child,
    RouterChain,
    code_info,
    free_port,
    log_directory,
    machine_info,
    say,
    table,
    write_json,
)

DATA_BAND = 32
HEADER_SIZE = 24
#: the largest payload a datagram carries (IPv4: 65507 bytes of UDP payload, less a header)
MAX_SIZE = 65507 - HEADER_SIZE
#: the endpoints' socket buffers: the counter must not be where datagrams are lost
ENDPOINT_BUFFER = 64 << 20


def _frame(key: bytes, band: int, payload: bytes, ttl: int = 32) -> bytes:
    return key + struct.pack("!IBBBB", len(payload), band, 0, 0, ttl) + payload


def udp_attach(addr: str, name: str, key: bytes, mask: int,
               features: int = 0) -> socket.socket:
    """A UDP socket connected to a router's UDP address, attached as an application that
    joined *key* with *mask* (HELLO and JOIN repeated until answered: datagrams get lost).
    *features*: what the HELLO announces (FEATURE_DGRAM_BUNDLE: send us bundles)."""
    from flowrouter.net.udpio import set_buffers
    from flowrouter.wire import control as C

    host, port = addr.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    set_buffers(sock, ENDPOINT_BUFFER)  # beyond rmem_max where allowed, as the routers
    sock.bind((HOST, 0))
    sock.connect((host, int(port)))
    sock.settimeout(0.5)
    node_id = int.from_bytes(os.urandom(7), "big") | 1
    body = C.Hello(node_id, C.Role.ENDPOINT, name, MAX_SIZE).encode()
    hello = C.hello_header(len(body), features) + body
    join = _frame(key, 0, C.Join(1, mask).encode())
    deadline = time.monotonic() + 20.0
    step, out = "hello", hello
    while time.monotonic() < deadline:
        sock.send(out)
        try:
            while True:
                data = sock.recv(65536)
                pos = 0
                while pos + HEADER_SIZE <= len(data):  # each frame (the router may bundle)
                    end = pos + HEADER_SIZE + int.from_bytes(data[pos + 16:pos + 20], "big")
                    msg = (C.decode(data[pos + HEADER_SIZE:end]) if data[pos + 20] == 0
                           else None)
                    if step == "hello" and isinstance(msg, C.Hello):
                        step, out = "join", join
                        sock.send(out)
                    elif (step == "join" and isinstance(msg, C.JoinAck)
                          and data[pos:pos + 16] == key):
                        if msg.status is not C.JoinStatus.OK:
                            raise ConnectionError(f"join refused: {msg.status.name}")
                        sock.settimeout(None)
                        return sock
                    elif isinstance(msg, C.Error):
                        raise ConnectionError(f"router refused us: {msg.text}")
                    pos = end
        except TimeoutError:
            continue
    raise TimeoutError(f"{name}: no answer from the router at {addr}")


def _datagram_io(sock: socket.socket) -> Any:
    """The routers' own batched datagram I/O (recvmmsg / sendmmsg when built) on *sock*:
    the load generator and the counter then cost a system call per 64 datagrams, not per
    datagram, as the routers do."""
    from flowrouter.net.udpio import io_choice

    cls, _why = io_choice()
    return cls(sock, 64)


def _features(bundle: int) -> int:
    from flowrouter.wire import control as C

    return C.FEATURE_DGRAM_BUNDLE if bundle else 0


def worker_publisher(p: dict[str, Any]) -> None:
    key = bytes.fromhex(p["key"])
    bundle = p["bundle"]
    sock = udp_attach(p["addr"], "udp-pub", key, 1, _features(bundle))  # membership only
    one = _frame(key, DATA_BAND, bytes(p["size"]))
    rate = p["rate"]
    print(json.dumps({"event": "ready"}), flush=True)
    sys.stdin.readline()  # go
    sock.setblocking(False)  # the router's answers are never read: nothing may block
    io = _datagram_io(sock)
    dest = io.dest(sock.getpeername())
    end = time.monotonic() + p["seconds"]
    sent = refused = 0
    # one send call per burst: 64 frames at a time, bundled as the routers bundle
    per_call = min(max(1, rate // 1000), 64) if rate else 64
    calls = -(-max(1, rate // 1000) // 64) if rate else 1
    frames = [per_call] * calls
    if rate and rate // 1000 % 64:
        frames[-1] = rate // 1000 % 64
    burst = [(dest, [one * m], bundle) for m in frames]
    per = max(1, bundle // len(one)) if bundle else 1  # frames per datagram
    datagrams = sum(-(-m // per) for m in frames)
    offered = sum(frames)
    tick = time.monotonic()
    while tick < end:
        ok, congested, failed, _err = io.send(burst)
        if ok == datagrams:
            sent += offered
        else:  # which datagrams were refused is not known: count their share of frames
            sent += round(offered * ok / datagrams)
            refused += offered - round(offered * ok / datagrams)
        if rate:  # bursts every millisecond
            tick += 0.001
            pause = tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        else:
            tick = time.monotonic()
    print(json.dumps({"event": "result", "sent": sent, "refused": refused}), flush=True)
    sock.close()


def worker_subscriber(p: dict[str, Any]) -> None:
    import select

    key = bytes.fromhex(p["key"])
    sock = udp_attach(p["addr"], "udp-sub", key, 1 | 1 << DATA_BAND, _features(p["bundle"]))
    print(json.dumps({"event": "ready"}), flush=True)
    warmup, duration = p["warmup"], p["duration"]
    total = win = 0
    first = w_start = w_end = None
    sock.setblocking(False)
    io = _datagram_io(sock)
    wait = 30.0
    while select.select([sock], [], [], wait)[0]:
        try:
            blob, grams, _drops = io.recv()
        except OSError:
            break
        now = time.monotonic()
        got = pos = 0
        for _addr, n, _frames in grams:  # count the data band's frames
            end = pos + n
            while pos + HEADER_SIZE <= end:
                if blob[pos + 20] == DATA_BAND:
                    got += 1
                pos += HEADER_SIZE + int.from_bytes(blob[pos + 16:pos + 20], "big")
            pos = end
        if not got:
            continue
        total += got
        if first is None:
            first = now
            w_start, w_end = first + warmup, first + warmup + duration
            wait = p["idle"]
        if w_start <= now < w_end:  # type: ignore[operator]
            win += got
    print(json.dumps({"event": "result", "msgs": total, "msg_rate": win / duration}),
          flush=True)


class UdpChain(RouterChain):
    """Routers r1 - ... - rN linked by UDP (rN the core of LSID 0x10); ``udp[i]`` is the UDP
    address of r(i+1). Ready when each router knows the way to the core."""

    async def _start(self) -> None:
        n = self.n
        self.listen = [f"{HOST}:{free_port()}" for _ in range(n)]
        self.control = [f"{HOST}:{free_port()}" for _ in range(n)]
        self.udp = [f"{HOST}:{_free_udp_port()}" for _ in range(n)]
        for i in range(n - 1, -1, -1):
            argv = [sys.executable, "-m", "flowrouter.tools.cli", "--log-level", "warning",
                    "run", "--name", f"r{i + 1}", "--listen", self.listen[i],
                    "--udp", self.udp[i], "--control", self.control[i], *self.extra_args]
            if i == n - 1:
                argv += ["--core-lsid", hex(LSID)]
            else:
                argv += ["--peer", f"r{i + 2}={self.udp[i + 1]}/udp"]
            if i > 0:
                argv += ["--accept-router", f"r{i}@{HOST}"]
            self.procs.insert(0, await Child.start(f"router-r{i + 1}", argv, self.log_dir))
        deadline = time.monotonic() + 20.0
        for i in range(n):
            await self._wait_up(i, deadline)


def _user_sys(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far (/proc), zeros if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode()
    except OSError:
        return 0.0, 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def _udp_snmp() -> dict[str, int]:
    """The machine's UDP counters (/proc/net/snmp): datagrams in and out, buffer errors."""
    try:
        with open("/proc/net/snmp") as f:
            lines = [ln.split() for ln in f if ln.startswith("Udp:")]
    except OSError:
        return {}
    if len(lines) < 2:
        return {}
    row = dict(zip(lines[0][1:], map(int, lines[1][1:])))
    return {k: row[k] for k in ("InDatagrams", "OutDatagrams", "RcvbufErrors",
                                "SndbufErrors", "InErrors") if k in row}


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _argv(role: str, **params: Any) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", role, json.dumps(params)]


async def _one_rate(chain: UdpChain, size: int, rate: int, args: argparse.Namespace,
                    log_dir: Path, endpoint_bundle: int) -> dict[str, Any]:
    key = os.urandom(8).hex() + f"{LSID:08x}" + os.urandom(4).hex()
    seconds = args.warmup + args.duration + 1.0
    sub = await Child.start("sub-udp", _argv(
        "subscriber", addr=chain.udp[-1], key=key, warmup=args.warmup,
        duration=args.duration, idle=1.0, bundle=endpoint_bundle), log_dir)
    try:
        await sub.expect("ready", 30)
        pub = await Child.start("pub-udp", _argv(
            "publisher", addr=chain.udp[0], size=size, key=key, seconds=seconds,
            rate=rate, bundle=endpoint_bundle), log_dir, stdin=True)
        try:
            await pub.expect("ready", 30)
            await asyncio.sleep(0.2)  # the publisher's JOIN reaching the core
            c0 = await chain.counters()
            snmp0 = _udp_snmp()
            cpu0 = [_user_sys(p.pid) for p in chain.procs]
            pub.tell("go")
            await pub.proc.stdin.drain()  # type: ignore[union-attr]
            if args.profile:
                await _profile(chain, size, args)
            sent = await pub.expect("result", seconds + 30)
            got = await sub.expect("result", 30)
            cpu1 = [_user_sys(p.pid) for p in chain.procs]
            snmp1 = _udp_snmp()
            c1 = await chain.counters()
        finally:
            await pub.stop()
    finally:
        await sub.stop()
    msgs = max(got["msgs"], 1)
    user = [(b[0] - a[0]) / msgs * 1e6 for a, b in zip(cpu0, cpu1)]
    system = [(b[1] - a[1]) / msgs * 1e6 for a, b in zip(cpu0, cpu1)]
    cpu = [u + s for u, s in zip(user, system)]
    loss = 1.0 - got["msgs"] / sent["sent"] if sent["sent"] else 0.0
    drops = {k: [c.get(k, 0) - b.get(k, 0) for b, c in zip(c0, c1)]
             for k in ("drop.link-congested", "drop.udp-error", "drop.udp-rcvbuf")}
    snmp = {k: snmp1[k] - snmp0[k] for k in snmp0 if k in snmp1}
    row = {"hops": chain.n, "size": size, "rate_offered": rate or None,
           "msg_rate": got["msg_rate"], "mb_s": got["msg_rate"] * size / 1e6,
           "sent_msgs": sent["sent"], "recv_msgs": got["msgs"], "loss": loss,
           "router_drops": drops, "udp_snmp": snmp, "cpu_s_per_M": cpu, "cpu_s_per_M_max": max(cpu),
           "user_s_per_M": user, "sys_s_per_M": system}
    say(f"  udp hops={chain.n} {size:>6} B @{rate or 'max'}, bundle {endpoint_bundle}: "
        f"{got['msg_rate']:>10,.0f} msg/s delivered, "
        f"loss {loss:6.1%}, cpu s/M msgs (user+sys) "
        f"{['%.2f+%.2f' % us for us in zip(user, system)]}, router drops {drops}, "
        f"snmp {snmp}")
    return row


async def _profile(chain: UdpChain, size: int, args: argparse.Namespace) -> None:
    """Sample every router with py-spy for the measuring window; save the collapsed stacks
    and a self-time summary (benchmarks/profile_hotpath.py) in ``--profile``."""
    from profile_hotpath import summarize_collapsed

    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    await asyncio.sleep(args.warmup)
    out_dir = Path(args.profile)  # made by main()
    spies = []
    for i, proc in enumerate(chain.procs):
        out = out_dir / f"{args.label}-{chain.n}hop-{size}B-r{i + 1}.collapsed.txt"
        spies.append((await asyncio.create_subprocess_exec(
            spy, "record", "-p", str(proc.pid), "-d", str(max(1, round(args.duration - 1))),
            "-r", "250", "-f", "raw", "-o", str(out), stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL), out))
    for spy_proc, out in spies:
        await spy_proc.wait()
        if out.exists():
            summary = summarize_collapsed(out.read_text(), 12)
            lines = [f"total samples {summary['samples']} (+{summary['waiting_samples']} "
                     "waiting in epoll)", "self:"]
            lines += [f"{r['share']:6.1%}  {r['function']}" for r in summary["self"]]
            lines += ["inclusive:"]
            lines += [f"{r['share']:6.1%}  {r['function']}" for r in summary["inclusive"]]
            out.with_name(out.name.replace(".collapsed", "")).write_text("\n".join(lines) + "\n")
            say(f"  profile: {out}")


#: --modes: the routers' udp_bundle and the endpoints' bundle size (None: the options')
MODES = {"bundled": (None, None), "single": (0, 0)}


def _router_args(log_dir: Path, mode: str, args: argparse.Namespace) -> list[str]:
    """``--config FILE`` with the [router] keys this mode and the options ask for."""
    keys = []
    if args.udp_buffer is not None:
        keys.append(f"udp_socket_buffer = {args.udp_buffer}")
    bundle = MODES[mode][0] if MODES[mode][0] is not None else args.udp_bundle
    if bundle is not None:
        keys.append(f"udp_bundle = {bundle}")
    if not keys:
        return []
    conf = log_dir / f"udp-router-{mode}.toml"
    conf.write_text("[router]\nname = \"r\"\n" + "\n".join(keys) + "\n")
    return ["--config", str(conf)]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    async with log_directory(args.keep_logs) as log_dir:
        for hops in args.hops:
            async with contextlib.AsyncExitStack() as stack:
                chains = {mode: await stack.enter_async_context(
                    UdpChain(hops, log_dir, _router_args(log_dir, mode, args)))
                    for mode in args.modes}
                for size in args.sizes:  # the modes take turns, size by size and rate by rate
                    for rate in args.rate:
                        for mode, chain in chains.items():
                            ep = MODES[mode][1]
                            row = await _one_rate(chain, size, rate, args, log_dir,
                                                  args.endpoint_bundle if ep is None else ep)
                            rows.append({"mode": mode, **row})
    return {"benchmark": "udp_bulk", "machine": machine_info(), "code": code_info(),
            "native": os.environ.get("FLOWNET_NATIVE", ""), "rate": args.rate,
            "udp_buffer": args.udp_buffer, "udp_bundle": args.udp_bundle,
            "endpoint_bundle": args.endpoint_bundle, "modes": args.modes,
            "gso": os.environ.get("FLOWNET_UDP_GSO", ""),
            "warmup": args.warmup, "duration": args.duration, "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1024, 8192])
    ap.add_argument("--hops", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--rate", type=int, nargs="+", default=[0],
                    help="messages per second offered, one run each (0: as fast as the publisher "
                         "can)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 KB, 1 hop, 20,000 msg/s, half a second")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=["bundled"],
                    help="bundled: routers and endpoints bundle (as the options say); single: "
                         "a frame per datagram everywhere (udp_bundle 0), the way before "
                         "bundles; several modes take turns on their own chains")
    ap.add_argument("--udp-bundle", type=int, metavar="BYTES",
                    help="the routers' [router] udp_bundle (default: theirs, auto; 0: a frame "
                         "per datagram)")
    ap.add_argument("--endpoint-bundle", type=int, metavar="BYTES", default=65507,
                    help="the endpoints announce bundles and the publisher packs frames into "
                         "datagrams of up to this many bytes (0: a frame per datagram)")
    ap.add_argument("--udp-buffer", type=int, metavar="BYTES",
                    help="the routers' [router] udp_socket_buffer (default: theirs)")
    ap.add_argument("--profile", metavar="DIR",
                    help="also sample every router with py-spy during the window (saved here)")
    ap.add_argument("--label", default="udp", help="file name prefix of the profiles")
    ap.add_argument("--worker", nargs=2, metavar=("ROLE", "PARAMS"), help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.sizes, args.hops, args.rate = [1024], [1], [20000]
        args.warmup, args.duration = 0.2, 0.5
    if args.worker:
        role, params = args.worker
        {"publisher": worker_publisher,
         "subscriber": worker_subscriber}[role](json.loads(params))
        return 0
    for size in args.sizes:
        if not 0 <= size <= MAX_SIZE:
            raise SystemExit(f"--sizes: {size} does not fit a datagram (at most {MAX_SIZE})")
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(main_async(args))
    print(table(result["rows"], [("mode", "mode", ""), ("hops", "hops", "d"),
                                 ("size", "size", "d"),
                                 ("rate_offered", "offered", ""),
                                 ("msg_rate", "msg/s", ",.0f"), ("loss", "loss", ".1%"),
                                 ("cpu_s_per_M_max", "cpu s/M (max router)", ".2f")]))
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
