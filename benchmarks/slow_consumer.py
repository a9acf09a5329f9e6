"""A stuck receiver must not slow the others (issue 15): fan-out rate with and without one.

One router on loopback; a sender writes N messages of SIZE bytes at full rate to a flow with
three reading receivers. Each round runs it twice, alternating the order: once with only the
three, once with a fourth receiver that joined and never reads its socket. It reports the
rate each healthy receiver got (messages / seconds until all three had every message), the
ratio, the stuck receiver's counted losses, and whether the sender was ever paused (credit).
The best round of each configuration is compared (machine noise hits both alike).

    python3 benchmarks/slow_consumer.py                # 20,000 x 1 KiB, 5 rounds
    python3 benchmarks/slow_consumer.py --quick        # 5,000 x 1 KiB, 2 rounds
    python3 benchmarks/slow_consumer.py --slow-consumer-bytes 131072 --link-credit 262144
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine_info  # noqa: E402
from flowrouter.net.config import NodeConfig  # noqa: E402
from flowrouter.net.control import query_control  # noqa: E402
from flowrouter.net.runtime import RouterNode  # noqa: E402
from flowrouter.wire import control as C  # noqa: E402
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID  # noqa: E402
from flowrouter.wire.header import FrameDecoder, pack_header  # noqa: E402

LSID = 0x10
BAND = 40


async def _endpoint(address: tuple[str, int], name: str, flow: FlowID | None,
                    rcvbuf: int = 0
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, socket.socket]:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, address)
    reader, writer = await asyncio.open_connection(sock=sock)
    hello = C.Hello(7, C.Role.ENDPOINT, name, 65536).encode()
    writer.write(pack_header(LINK_LOCAL_FLOW.key, len(hello), 0) + hello)
    if flow is not None:
        join = C.Join(1, 1 << BAND).encode()
        writer.write(pack_header(flow.key, len(join), 0) + join)
    await writer.drain()
    return reader, writer, sock


async def _count(reader: asyncio.StreamReader, n: int) -> None:
    dec = FrameDecoder(1 << 20)
    got = 0
    while got < n:
        data = await reader.read(1 << 20)
        if not data:
            raise ConnectionError("receiver closed")
        got += sum(1 for h, _ in dec.feed(data) if h[20] == BAND)


class _InProcess:
    """The router in this process (its event loop also runs the endpoints)."""

    def __init__(self, limits: dict[str, Any]) -> None:
        self.node = RouterNode(NodeConfig("bench", listen="127.0.0.1:0",
                                          core_lsids=frozenset({LSID}), default_lsid=LSID,
                                          slow_consumer_grace=600.0, **limits))

    async def start(self) -> tuple[str, int]:
        await self.node.start()
        return self.node.tcp_address

    async def members(self, flow: FlowID) -> int:
        return len(getattr(self.node.core.flows.get(flow.key), "down", ()))

    async def counters(self) -> tuple[dict[str, int], int]:
        """The router's counters, and frames dropped at outputs other than the stuck one."""
        node = self.node
        healthy = sum(lk.out.stats()["slow_consumer_dropped"] for lid, lk in node.links.items()
                      if lk.out is not None
                      and getattr(node.core.links.get(lid), "peer_name", "") != "stuck")
        return dict(node.core.counters), healthy

    async def stop(self) -> None:
        await self.node.stop()


class _OwnProcess:
    """The router as its own process (``flowrouter run``), as deployed: its CPU is not shared
    with the endpoints' event loop. Counters come from its control interface."""

    def __init__(self, limits: dict[str, Any]) -> None:
        self.limits = limits
        self.proc: asyncio.subprocess.Process | None = None
        self.control = ""
        self.tmp = tempfile.TemporaryDirectory(prefix="slowcons-")

    async def start(self) -> tuple[str, int]:
        port, ctl = _free_port(), _free_port()
        self.control = f"127.0.0.1:{ctl}"
        conf = Path(self.tmp.name) / "router.toml"
        extra = "".join(f"{k} = {v!r}\n" for k, v in self.limits.items())
        conf.write_text(f'[router]\nname = "bench"\nlisten = "127.0.0.1:{port}"\n'
                        f'control = "{self.control}"\nhttp = "off"\ncore_lsids = [{LSID}]\n'
                        f"default_lsid = {LSID}\nslow_consumer_grace = 600.0\n{extra}")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flowrouter.tools.cli", "--log-level", "error", "run",
            "--config", str(conf), cwd=str(ROOT))
        deadline = time.monotonic() + 20
        while True:
            try:
                await query_control(self.control, "ping", timeout=1.0)
                return ("127.0.0.1", port)
            except ConnectionError:
                if time.monotonic() > deadline or self.proc.returncode is not None:
                    raise RuntimeError("the router process did not come up") from None
                await asyncio.sleep(0.1)

    async def _status(self) -> dict[str, Any]:
        st: dict[str, Any] = (await query_control(self.control, timeout=10.0))["status"]
        return st

    async def members(self, flow: FlowID) -> int:
        st = await self._status()
        return sum(1 for row in st["links"] if row.get("flows", 0) >= 1
                   and str(row.get("peer", "")).startswith(("rx", "stuck")))

    async def counters(self) -> tuple[dict[str, int], int]:
        st = await self._status()
        healthy = sum(int(row.get("output", {}).get("slow_consumer_dropped", 0))
                      for row in st["links"] if row.get("peer") != "stuck")
        return st["counters"], healthy

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self.tmp.cleanup()


def _free_port() -> int:
    from flowrouter.testbed.ports import free_port

    return free_port()


async def one_run(n: int, size: int, stuck: bool, flow_no: int, own_process: bool = False,
                  **limits: Any) -> dict[str, float]:
    router = _OwnProcess(limits) if own_process else _InProcess(limits)
    address = await router.start()
    try:
        flow = FlowID(0x5C, LSID, flow_no)
        rx = [await _endpoint(address, f"rx{i}", flow) for i in range(3)]
        stuck_ep = await _endpoint(address, "stuck", flow, rcvbuf=4096) if stuck else None
        want = 4 if stuck else 3
        deadline = time.monotonic() + 10
        while await router.members(flow) < want:
            assert time.monotonic() < deadline, "receivers did not join"
            await asyncio.sleep(0.01)
        if own_process:
            await asyncio.sleep(0.2)  # the joins are answered before the status shows them
        _, tx, _ = await _endpoint(address, "tx", None)
        blob = pack_header(flow.key, size, BAND) + b"m" * size
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def send() -> None:
            for i in range(n):
                tx.write(blob)
                if i % 64 == 63:
                    await tx.drain()
            await tx.drain()

        try:
            await asyncio.wait_for(asyncio.gather(send(), *(_count(r, n) for r, _, _ in rx)),
                                   20)
            complete = 1
        except TimeoutError:  # a healthy receiver lost messages (its own limit tripped)
            complete = 0
        elapsed = loop.time() - t0
        counters, healthy_dropped = await router.counters()
        out = {"healthy_dropped": healthy_dropped, "seconds": elapsed,
               "rate": n / elapsed if complete else 0.0,
               "complete": complete,
               "dropped_slow": counters.get("drop.slow-consumer", 0),
               "credit_paused": counters.get("credit.paused", 0),
               "not_draining": counters.get("credit.not-draining", 0)}
        for _, w, _ in [*rx, *([stuck_ep] if stuck_ep else [])]:
            w.close()
        tx.close()
        return out
    finally:
        await router.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--router-process", action="store_true",
                   help="run the router as its own process (flowrouter run), not in the "
                   "endpoints' event loop")
    p.add_argument("--slow-consumer-bytes", type=int, help="router limit (default: config's)")
    p.add_argument("--link-credit", type=int, help="router limit (default: config's)")
    p.add_argument("--max-link-buffer", type=int, help="router limit (default: config's)")
    p.add_argument("--slow-consumer-idle", type=float,
                   help="router limit, seconds (default: config's)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.rounds = 5_000, 2
    runs: dict[str, list[dict[str, float]]] = {"alone": [], "stuck": []}
    k = 0
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for stuck in order:
            k += 1
            limits = {k2: v for k2, v in (("slow_consumer_bytes", args.slow_consumer_bytes),
                                          ("link_credit", args.link_credit),
                                          ("max_link_buffer", args.max_link_buffer),
                                          ("slow_consumer_idle", args.slow_consumer_idle))
                      if v is not None}
            res = asyncio.run(one_run(args.messages, args.size, stuck, k,
                                      args.router_process, **limits))
            runs["stuck" if stuck else "alone"].append(res)
    best = {key: max(v, key=lambda x: x["rate"]) for key, v in runs.items()}
    ratio = best["stuck"]["rate"] / best["alone"]["rate"] if best["alone"]["rate"] else 0.0
    print(f"{args.messages} x {args.size} B to 3 reading receivers, best of {args.rounds}:")
    print(f"  without a stuck receiver: {best['alone']['rate']:8.0f} msg/s each")
    print(f"  with a stuck fourth:      {best['stuck']['rate']:8.0f} msg/s each "
          f"({ratio:.0%}); its losses counted: "
          f"{[int(x['dropped_slow']) for x in runs['stuck']]}; sender paused: "
          f"{[int(x['credit_paused']) for x in runs['stuck']]}")
    print("  every round (msg/s; 0 = a healthy receiver lost messages): alone",
          [round(x["rate"]) for x in runs["alone"]],
          "stuck", [round(x["rate"]) for x in runs["stuck"]])
    med = {k: statistics.median(x["rate"] for x in v) for k, v in runs.items()}
    print(f"  medians: alone {med['alone']:.0f}, with a stuck fourth {med['stuck']:.0f} msg/s "
          f"({med['stuck'] / med['alone']:.0%})")
    lost = [int(x["healthy_dropped"]) for x in runs["alone"] + runs["stuck"]]
    print("  frames dropped at healthy receivers' outputs, per round:", lost)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "machine": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                             time.gmtime()),
            "command": " ".join(sys.argv), "messages": args.messages, "size": args.size,
            "runs": runs, "ratio_best": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
