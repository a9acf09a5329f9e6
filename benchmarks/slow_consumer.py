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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine_info  # noqa: E402
from flowrouter.net.config import NodeConfig  # noqa: E402
from flowrouter.net.runtime import RouterNode  # noqa: E402
from flowrouter.wire import control as C  # noqa: E402
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID  # noqa: E402
from flowrouter.wire.header import FrameDecoder, pack_header  # noqa: E402

LSID = 0x10
BAND = 40


async def _endpoint(node: RouterNode, name: str, flow: FlowID | None, rcvbuf: int = 0
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, socket.socket]:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, node.tcp_address)
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


async def one_run(n: int, size: int, stuck: bool, flow_no: int, **limits: int
                  ) -> dict[str, float]:
    node = RouterNode(NodeConfig("bench", listen="127.0.0.1:0", core_lsids=frozenset({LSID}),
                                 default_lsid=LSID, slow_consumer_grace=600.0,
                                 **limits))  # type: ignore[arg-type]
    await node.start()
    try:
        flow = FlowID(0x5C, LSID, flow_no)
        rx = [await _endpoint(node, f"rx{i}", flow) for i in range(3)]
        stuck_ep = await _endpoint(node, "stuck", flow, rcvbuf=4096) if stuck else None
        want = 4 if stuck else 3
        deadline = time.monotonic() + 10
        while len(getattr(node.core.flows.get(flow.key), "down", ())) < want:
            assert time.monotonic() < deadline, "receivers did not join"
            await asyncio.sleep(0.01)
        _, tx, _ = await _endpoint(node, "tx", None)
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
        counters = node.core.counters
        # frames dropped at the healthy receivers' outputs
        healthy_dropped = sum(
            lk.out.slow.dropped for lid, lk in node._links.items()
            if lk.out is not None and getattr(node.core.links.get(lid), "peer_name", "")
            != "stuck")
        out = {"healthy_dropped": healthy_dropped, "seconds": elapsed,
               "rate": n / elapsed if complete else 0.0,
               "complete": complete,
               "dropped_slow": counters["drop.slow-consumer"],
               "credit_paused": counters["credit.paused"],
               "not_draining": counters["credit.not-draining"]}
        for _, w, _ in [*rx, *([stuck_ep] if stuck_ep else [])]:
            w.close()
        tx.close()
        return out
    finally:
        await node.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true")
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
            res = asyncio.run(one_run(args.messages, args.size, stuck, k, **limits))
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
