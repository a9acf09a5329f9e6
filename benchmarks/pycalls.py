#!/usr/bin/env python3
"""Python function calls per frame per hop: how much interpreter work one forwarded frame costs.

Throughput benchmarks measure the whole machine; this one counts what a restructuring can
change without a quiet machine: the Python-level calls a router makes for each frame it
forwards. Routers ``r1 - ... - rN`` (rN the core) run in one background thread on their own
event loop (uvloop when installed, as real routers do); a raw receiver joined on rN and a raw
sender advertised on r1 talk to them over loopback TCP from the main thread. The sender sends
one frame, waits until the receiver has it, then sends the next, so every router reads
exactly one frame per read (the worst case for per-read overhead). ``sys.setprofile`` in the
routers' thread counts Python calls (and calls into C functions, apart) over the sends; the
same count over an idle window of the same length (timers only) is subtracted.

Run it against any checkout with that checkout first on the path, e.g. before and after::

    PYTHONPATH=/path/to/old python3 benchmarks/pycalls.py --hops 1 3
    PYTHONPATH=. python3 benchmarks/pycalls.py --hops 1 3

It uses only the routers' public API (``NodeConfig``, ``RouterNode``, the wire codecs), so the
same script measures both sides of a change. ``--python`` turns the compiled fast path off
(``FLOWNET_NATIVE=0``) to count the Python twin instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

LSID = 0x10
BAND = 32


def recv_frame(sock: socket.socket, buf: bytearray) -> tuple[bytes, bytes]:
    """The next whole frame (header, payload) from a blocking socket."""
    while True:
        if len(buf) >= 24:
            size = int.from_bytes(buf[16:20], "big")
            if len(buf) >= 24 + size:
                hdr, payload = bytes(buf[:24]), bytes(buf[24:24 + size])
                del buf[:24 + size]
                return hdr, payload
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("router closed the link")
        buf += chunk


class RawEndpoint:
    """A blocking raw endpoint: HELLO, one JOIN (or ADVERTISE), frames."""

    def __init__(self, address: tuple[str, int], name: str) -> None:
        from flowrouter.wire import control as C

        self.C = C
        self.sock = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        body = C.Hello(7, C.Role.ENDPOINT, name, 65536).encode()
        self.sock.sendall(C.hello_header(len(body), 0) + body)  # no soft state: no echoes
        self.until(lambda h, p: isinstance(self.decode(h, p), C.Hello))

    def decode(self, hdr: bytes, payload: bytes) -> Any:
        return self.C.decode(payload) if hdr[20] == 0 else None

    def until(self, match: Callable[[bytes, bytes], bool]) -> tuple[bytes, bytes]:
        while True:
            hdr, payload = recv_frame(self.sock, self.buf)
            if match(hdr, payload):
                return hdr, payload

    def join(self, key: bytes, mask: int, flags: int = 0) -> None:
        from flowrouter.wire.header import pack_header

        body = self.C.Join(1, mask, flags).encode()
        self.sock.sendall(pack_header(key, len(body), 0) + body)
        ack = self.until(lambda h, p: isinstance(self.decode(h, p), self.C.JoinAck))
        msg = self.decode(*ack)
        if msg.status != self.C.JoinStatus.OK:
            raise RuntimeError(f"join refused: {msg}")


class Counter:
    """sys.setprofile hook for one thread: Python calls and C calls while on."""

    def __init__(self) -> None:
        self.calls = 0
        self.c_calls = 0
        self.on = False

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.on:
            if event == "call":
                self.calls += 1
            elif event == "c_call":
                self.c_calls += 1

    def window(self) -> tuple[int, int]:
        return self.calls, self.c_calls


def start_routers(hops: int) -> tuple[asyncio.AbstractEventLoop, list[Any], Counter,
                                      threading.Thread]:
    from flowrouter.net.config import NodeConfig, PeerConfig
    from flowrouter.net.runtime import RouterNode

    try:
        import uvloop
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    counter = Counter()
    nodes: list[Any] = []
    ready = threading.Event()

    async def build() -> None:
        prev = None
        for i in range(hops, 0, -1):
            peers = [PeerConfig("%s:%d" % prev.tcp_address, prev.config.name)] if prev else []
            cfg = NodeConfig(f"r{i}", listen="127.0.0.1:0", http="off", peers=peers,
                             core_lsids=frozenset({LSID}) if i == hops else frozenset(),
                             default_lsid=LSID, accept_routers=["*@127.0.0.1"])
            node = RouterNode(cfg)
            await node.start()
            nodes.insert(0, node)
            prev = node
        for node in nodes:
            await asyncio.wait_for(node.wait_routes(LSID), 20)

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(build())
        sys.setprofile(counter)
        ready.set()
        loop.run_forever()
        sys.setprofile(None)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    if not ready.wait(60):
        raise RuntimeError("routers did not start")
    return loop, nodes, counter, thread


def stop_routers(loop: asyncio.AbstractEventLoop, nodes: list[Any],
                 thread: threading.Thread) -> None:
    """Stop what :func:`start_routers` started: the routers, their loop, its thread."""
    async def stop() -> None:
        for node in nodes:
            await node.stop()
    asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def measure(hops: int, frames: int, payload: int) -> dict[str, Any]:
    from flowrouter.wire.flowid import FlowID
    from flowrouter.wire.header import pack_header

    loop, nodes, counter, thread = start_routers(hops)
    try:
        flow = FlowID(0xBE7C, LSID, 1)
        receiver = RawEndpoint(nodes[-1].tcp_address, "receiver")
        receiver.join(flow.key, 1 << BAND)
        sender = RawEndpoint(nodes[0].tcp_address, "sender")
        sender.join(flow.key, 0, flags=sender.C.JOIN_FLAG_ADVERTISE)
        frame = pack_header(flow.key, payload, BAND) + b"x" * payload
        for _ in range(200):  # warm up: caches, the fast path's mirror, the read buffers
            sender.sock.sendall(frame)
            receiver.until(lambda h, p: h[20] == BAND)
        time.sleep(0.2)
        counter.on = True
        t0 = time.perf_counter()
        c0 = counter.window()
        for _ in range(frames):
            sender.sock.sendall(frame)
            receiver.until(lambda h, p: h[20] == BAND)
        c1 = counter.window()
        busy = time.perf_counter() - t0
        time.sleep(busy)  # the same length idle: timers, echoes
        c2 = counter.window()
        counter.on = False
        calls = (c1[0] - c0[0]) - (c2[0] - c1[0])
        c_calls = (c1[1] - c0[1]) - (c2[1] - c1[1])
        from flowrouter.core.fastpath import engine_choice

        return {"hops": hops, "frames": frames, "payload": payload,
                "engine": engine_choice()[1],
                "py_calls_per_frame_per_hop": round(calls / frames / hops, 2),
                "c_calls_per_frame_per_hop": round(c_calls / frames / hops, 2),
                "idle_py_calls": c2[0] - c1[0]}
    finally:
        stop_routers(loop, nodes, thread)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hops", type=int, nargs="+", default=[1, 3], help="chain lengths")
    p.add_argument("--frames", type=int, default=2000, help="frames counted per chain")
    p.add_argument("--payload", type=int, default=64, help="payload bytes per frame")
    p.add_argument("--python", action="store_true",
                   help="count the Python twin (FLOWNET_NATIVE=0) instead of the compiled path")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    args = p.parse_args()
    if args.python:
        os.environ["FLOWNET_NATIVE"] = "0"
    rows = [measure(h, args.frames, args.payload) for h in args.hops]
    for row in rows:
        print(json.dumps(row) if args.json else
              f"{row['hops']} hop(s), {row['engine']}: {row['py_calls_per_frame_per_hop']} "
              f"Python calls per frame per hop ({row['c_calls_per_frame_per_hop']} C calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
