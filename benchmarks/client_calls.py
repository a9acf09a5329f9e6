#!/usr/bin/env python3
"""Python function calls per received data frame in a flowlib client.

What the client's receive path costs the interpreter, counted rather than timed (a count
needs no quiet machine): one router runs in a background thread (as in
``benchmarks/pycalls.py``); a :func:`flowlib.connect` client listens on a flow in the main
thread; a raw sender (its own thread, blocking sockets) sends data frames to the flow.
``sys.setprofile`` in the client's thread counts Python calls while the client takes the
frames with ``Listener.get``; the same count over an idle window of the same length (timers
only) is subtracted.

Two shapes of traffic:

* ``lockstep``: the sender sends one frame and waits until the client has it, so each read
  holds one frame (the worst case for per-read work);
* ``burst``: the sender sends all frames at once, so reads hold many frames (the per-frame
  work alone);
* ``bare``: no sockets and no loop: a :class:`flowlib.protocol.ClientProtocol` past its
  handshake is fed one pre-built data frame per ``receive_data``, and its messages are taken
  (by a sink when the protocol takes one, else as events), so only the sans-I/O core counts.

``lockstep`` and ``burst`` use only public API (``flowlib.connect``, ``listen``, the
listener's ``get``), so the same script measures both sides of a change (``bare`` needs a
flowlib that has ``flowlib.protocol``)::

    PYTHONPATH=/path/to/old python3 benchmarks/client_calls.py
    PYTHONPATH=. python3 benchmarks/client_calls.py
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
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pycalls import LSID, Counter, RawEndpoint, start_routers, stop_routers  # noqa: E402

BAND = 32


def measure_bare(frames: int, payload: int) -> dict[str, Any]:
    """The sans-I/O core alone: one data frame per ``receive_data``."""
    import inspect
    from collections import Counter as Counts

    from flowlib.flowtable import FlowTable
    from flowlib.fragment import Reassembler
    from flowlib.handshake import Handshake
    from flowlib.protocol import ClientProtocol
    from flowrouter.wire import control as C
    from flowrouter.wire.flowid import FlowID
    from flowrouter.wire.header import pack_header

    got: list[Any] = []
    extra: dict[str, Any] = {}
    if "sink" in inspect.signature(ClientProtocol).parameters:
        extra["sink"] = got.extend
    hs = Handshake(name="counted", node_id=5, max_payload=1 << 16, credentials=b"")
    proto = ClientProtocol(hs, FlowTable("counted"), Reassembler(), now=0.0,
                           liveness_interval=1.0, dead_after=10.0, refresh_interval=30.0,
                           counters=Counts(), **extra)
    body = C.Hello(99, C.Role.ROUTER, "r1", 1 << 16, 0x0A000001).encode()
    proto.receive_data(C.hello_header(len(body), 0) + body, 0.0)
    proto.events()
    proto.next_deadline()  # as the shell does after the handshake
    proto.data_to_send()
    flow = FlowID(0xC11E, LSID, 1)
    proto.flows.entry(flow).add_listener(1, 1 << BAND)
    frame = pack_header(flow.key, payload, BAND) + b"x" * payload
    counter = Counter()
    receive, take = proto.receive_data, proto.events
    sys.setprofile(counter)
    try:
        counter.on = True
        for i in range(frames):
            if receive(frame, i * 1e-3) is not False:  # as the shell: events only if any
                take()
        counter.on = False
    finally:
        sys.setprofile(None)
    assert len(got) + proto.counters["received"] >= frames
    return {"mode": "bare", "frames": frames, "payload": payload,
            "py_calls_per_frame": round(counter.calls / frames, 2),
            "c_calls_per_frame": round(counter.c_calls / frames, 2), "idle_py_calls": 0}


def measure(mode: str, frames: int, payload: int) -> dict[str, Any]:
    if mode == "bare":
        return measure_bare(frames, payload)
    import flowlib
    from flowrouter.wire.flowid import FlowID
    from flowrouter.wire.header import pack_header

    loop, nodes, _router_counter, thread = start_routers(1)
    counter = Counter()
    flow = FlowID(0xC11E, LSID, 1)
    frame = pack_header(flow.key, payload, BAND) + b"x" * payload
    acks_r, acks_w = socket.socketpair()  # the client says "got one" without Python calls

    async def client_side() -> dict[str, Any]:
        client = await flowlib.connect("%s:%d" % nodes[0].tcp_address, name="counted")
        try:
            lst = await client.listen(flow, BAND, size=frames + 1000)
            sender = RawEndpoint(nodes[0].tcp_address, "sender")
            sender.join(flow.key, 0, flags=sender.C.JOIN_FLAG_ADVERTISE)

            def send(n: int, lockstep: bool) -> None:
                for _ in range(n):
                    sender.sock.sendall(frame)
                    if lockstep:
                        acks_r.recv(1)

            async def run(n: int) -> None:
                lockstep = mode == "lockstep"
                t = threading.Thread(target=send, args=(n, lockstep), daemon=True)
                t.start()
                for _ in range(n):
                    await lst.get()
                    if lockstep:
                        acks_w.send(b"x")
                t.join()

            await run(200)  # warm up
            await asyncio.sleep(0.2)
            c0 = counter.window()
            t0 = time.perf_counter()
            counter.on = True
            await run(frames)
            c1 = counter.window()
            busy = time.perf_counter() - t0
            await asyncio.sleep(busy)  # the same length idle: timers, echoes
            c2 = counter.window()
            counter.on = False
            sender.sock.close()
            calls = (c1[0] - c0[0]) - (c2[0] - c1[0])
            c_calls = (c1[1] - c0[1]) - (c2[1] - c1[1])
            return {"mode": mode, "frames": frames, "payload": payload,
                    "py_calls_per_frame": round(calls / frames, 2),
                    "c_calls_per_frame": round(c_calls / frames, 2),
                    "idle_py_calls": c2[0] - c1[0]}
        finally:
            await client.close()

    try:
        sys.setprofile(counter)
        try:
            return asyncio.run(client_side())
        finally:
            sys.setprofile(None)
    finally:
        acks_r.close()
        acks_w.close()
        stop_routers(loop, nodes, thread)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", nargs="+", choices=["lockstep", "burst", "bare"],
                   default=["lockstep", "burst", "bare"], help="traffic shapes to count")
    p.add_argument("--frames", type=int, default=2000, help="frames counted per shape")
    p.add_argument("--payload", type=int, default=64, help="payload bytes per frame")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    args = p.parse_args()
    rows = [measure(m, args.frames, args.payload) for m in args.mode]
    for row in rows:
        print(json.dumps(row) if args.json else
              f"{row['mode']}: {row['py_calls_per_frame']} Python calls per received frame "
              f"({row['c_calls_per_frame']} C calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
