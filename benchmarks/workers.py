#!/usr/bin/env python3
"""Benchmark worker processes: ``python3 benchmarks/workers.py ROLE '{json params}'``.

Started by the benchmark scripts, one role per process; never needed by hand. Each prints
JSON lines on stdout (``{"event": "ready", ...}``, ``{"event": "result", ...}``, or
``{"event": "error", "error": ...}``). Senders wait for a ``go`` line on stdin before they
send, and for ``exit`` (or end of input) before they disconnect, so the parent controls the
measurement window. Every role has a hard time limit (``max_time``) and exits by itself.

Roles:

* ``flow-recv``   flowlib receivers (one or many clients, each one listener) counting messages
* ``flow-send``   a flowlib sender: advertise, then ``send`` as fast as the link takes it
* ``raw-recv``    a plain asyncio TCP receiver that splits 24-byte-header frames and counts them
* ``raw-send``    a plain asyncio TCP sender of pre-built frames
* ``nats-recv`` / ``nats-send``   the same with the nats-py client
* ``flow-pong`` / ``flow-ping``   flowlib ping-pong on two bands of one flow (latency)
* ``raw-pong`` / ``raw-ping``     the same over one plain TCP connection

What every role shares (the conversation with the parent on stdin/stdout, tallies, CPU and
scheduling times, round-trip timing) is worker_harness.py. Imports the standard library,
``worker_harness``, and inside the roles flowlib (from the code snapshot the parent made)
or nats-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

# the frozen copy of the code the parent benchmark made (see common.snapshot_code), else the
# checkout this file is in
_CODE = os.environ.get("FLOWNET_BENCH_CODE") or str(Path(__file__).resolve().parent.parent)
if _CODE not in sys.path:
    sys.path.insert(0, _CODE)

from worker_harness import (  # noqa: E402
    Tally,
    cpu,
    drain_transport,
    emit,
    merge,
    read_line,
    ready_for_go,
    report_sent,
    sched,
    sched_since,
    timed_rounds,
    until_idle,
    watch_idle,
)

HEADER_SIZE = 24


def nodelay(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def raw_frame(size: int, fill: bytes) -> bytes:
    """A frame of *size* bytes of *fill* behind the same 24-byte header a flow frame has
    (flow key, size, band 32, TTL 32): what the raw-TCP baselines send."""
    return (bytes(16) + size.to_bytes(4, "big") + bytes([32, 0, 0, 32])) + fill * size


# ---------------------------------------------------------------------------- flowlib
async def flow_recv(p: dict[str, Any]) -> None:
    import flowlib

    flow = flowlib.FlowID.parse(p["flow"])
    clients = []
    tallies: list[Tally] = []
    listeners = []
    for i, spec in enumerate(p["clients"]):
        c = await flowlib.connect(spec["router"], name=f"recv{i}", timeout=10)
        clients.append(c)
        listeners.append(await c.listen(flow, spec["bands"], size=p.get("queue", 1 << 16),
                                        timeout=15))
        tallies.append(Tally())
    emit("ready", clients=len(clients))
    cpu0 = cpu()
    sch0 = sched()

    async def consume(lst: Any, t: Tally) -> None:
        get_nowait = lst.get_nowait
        while True:
            msg = await lst.get()
            now = time.monotonic()
            if not t.count:
                t.first = now
            n, nb = 1, len(msg.payload)
            for _ in range(lst.qsize()):
                nb += len(get_nowait().payload)
                n += 1
            t.count += n
            t.nbytes += nb
            t.last = now

    tasks = [asyncio.ensure_future(consume(lst, t)) for lst, t in zip(listeners, tallies)]
    why = await watch_idle(tallies, p["idle"], p["first_timeout"], p["max_time"])
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    cpu_s = cpu() - cpu0
    result = merge(tallies)
    result.update(stop=why, cpu_s=cpu_s, sched=sched_since(sch0),
                  queue_dropped=sum(lst.dropped for lst in listeners),
                  per_client=[t.as_dict() for t in tallies])
    emit("result", **result)
    for c in clients:
        with contextlib.suppress(Exception):
            await c.close(timeout=2)


async def flow_send(p: dict[str, Any]) -> None:
    import flowlib

    flow = flowlib.FlowID.parse(p["flow"])
    client = await flowlib.connect(p["router"], name="sender", timeout=10)
    if p.get("advertise", True):
        await client.advertise(flow, timeout=15)
    if not await ready_for_go(p):
        return
    payload = b"\xa5" * p["payload"]
    bands = p.get("bands", [32])
    nb = len(bands)
    duration = p["duration"]
    max_count = p["max_count"]
    send = client.send
    cpu0 = cpu()
    sch0 = sched()
    t0 = time.monotonic()
    end = t0 + duration
    i = 0
    while i < max_count:
        await send(flow, payload, band=bands[i % nb])
        i += 1
        if not i & 63 and time.monotonic() >= end:
            break
    t1 = time.monotonic()
    # the router has read everything we sent
    await client.flush(timeout=30)
    await report_sent(p, i, i * len(payload), t0, t1, cpu0, sch0)
    with contextlib.suppress(Exception):
        await client.close(timeout=2)


async def flow_pong(p: dict[str, Any]) -> None:
    import flowlib

    flow = flowlib.FlowID.parse(p["flow"])
    client = await flowlib.connect(p["router"], name="pong", timeout=10)
    lst = await client.listen(flow, str(p["in_band"]), timeout=15)
    emit("ready")
    out_band = p["out_band"]
    send = client.send

    async def serve() -> None:
        while True:
            msg = await lst.get()
            await send(flow, msg.payload, band=out_band)

    task = asyncio.ensure_future(serve())
    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
        async with asyncio.timeout(p["max_time"]):
            await read_line()  # until the parent says anything or closes our input
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    with contextlib.suppress(Exception):
        await client.close(timeout=2)


async def flow_ping(p: dict[str, Any]) -> None:
    import flowlib

    flow = flowlib.FlowID.parse(p["flow"])
    client = await flowlib.connect(p["router"], name="ping", timeout=10)
    lst = await client.listen(flow, str(p["in_band"]), timeout=15)
    if not await ready_for_go(p):
        return
    payload = b"\x5a" * p["payload"]
    out_band = p["out_band"]
    send, get = client.send, lst.get

    async def rounds(n: int, out: list[int] | None) -> None:
        clock = time.perf_counter_ns
        for _ in range(n):
            t0 = clock()
            await send(flow, payload, band=out_band)
            await get()
            if out is not None:
                out.append(clock() - t0)

    if not await timed_rounds(rounds, p, "ping-pong"):
        return
    with contextlib.suppress(Exception):
        await client.close(timeout=2)


# ---------------------------------------------------------------------------- raw TCP
class _FrameCounter(asyncio.Protocol):
    """Splits a stream of 24-byte-header frames and counts them (no per-frame objects)."""

    def __init__(self, tally: Tally, done: asyncio.Future[None]) -> None:
        self.t = tally
        self.remaining = 0  # payload bytes of the current frame still to come
        self.partial = b""  # an incomplete header
        self.total = 0
        self.done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        nodelay(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        t = self.t
        now = time.monotonic()
        if not t.count and not self.total:
            t.first = now
        t.last = now
        n = len(data)
        self.total += n
        pos = 0
        count = 0
        if self.remaining:
            take = self.remaining if self.remaining < n else n
            self.remaining -= take
            pos = take
            if not self.remaining:
                count += 1
        while pos < n:
            if self.partial:
                need = HEADER_SIZE - len(self.partial)
                self.partial += data[pos:pos + need]
                pos += need
                if len(self.partial) < HEADER_SIZE:
                    break
                size = int.from_bytes(self.partial[16:20], "big")
                self.partial = b""
            elif n - pos < HEADER_SIZE:
                self.partial = data[pos:]
                break
            else:
                size = int.from_bytes(data[pos + 16:pos + 20], "big")
                pos += HEADER_SIZE
            avail = n - pos
            if avail >= size:
                pos += size
                count += 1
            else:
                self.remaining = size - avail
                break
        t.count += count
        t.nbytes = self.total - HEADER_SIZE * t.count  # payload bytes of whole frames

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def raw_recv(p: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    tally = Tally()
    done: asyncio.Future[None] = loop.create_future()
    server = await loop.create_server(lambda: _FrameCounter(tally, done), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    emit("ready", port=port)
    run = await until_idle(p, tally)
    emit("result", **run, queue_dropped=0, per_client=[], **tally.as_dict())
    server.close()


class _Sender(asyncio.Protocol):
    def __init__(self) -> None:
        self.paused = False
        self.resumed: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        nodelay(transport.get_extra_info("socket"))

    def pause_writing(self) -> None:
        self.paused = True
        self.resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self.paused = False
        if self.resumed is not None and not self.resumed.done():
            self.resumed.set_result(None)


async def raw_send(p: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_connection(_Sender, "127.0.0.1", p["port"])
    if not await ready_for_go(p):
        return
    size = p["payload"]
    frame = raw_frame(size, b"\xa5")
    duration, max_count = p["duration"], p["max_count"]
    write = transport.write
    cpu0 = cpu()
    sch0 = sched()
    t0 = time.monotonic()
    end = t0 + duration
    i = 0
    while i < max_count:
        write(frame)
        i += 1
        if proto.paused:
            assert proto.resumed is not None
            await proto.resumed
        if not i & 63 and time.monotonic() >= end:
            break
    t1 = time.monotonic()
    await drain_transport(transport, 10.0)
    await report_sent(p, i, i * size, t0, t1, cpu0, sch0)
    transport.close()


class _Echo(asyncio.Protocol):
    """raw-pong: sends every complete frame straight back."""

    def __init__(self) -> None:
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        nodelay(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        while len(buf) - pos >= HEADER_SIZE:
            end = pos + HEADER_SIZE + int.from_bytes(buf[pos + 16:pos + 20], "big")
            if end > len(buf):
                break
            pos = end
        if pos:
            self.transport.write(buf[:pos])
        self.buf = buf[pos:]


async def raw_pong(p: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Echo, "127.0.0.1", 0)
    emit("ready", port=server.sockets[0].getsockname()[1])
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(p["max_time"]):
            await read_line()
    server.close()


class _Pinger(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        nodelay(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if len(buf) >= HEADER_SIZE and \
                len(buf) >= HEADER_SIZE + int.from_bytes(buf[16:20], "big"):
            end = HEADER_SIZE + int.from_bytes(buf[16:20], "big")
            self.buf = buf[end:]
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)
        else:
            self.buf = buf


async def raw_ping(p: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_connection(_Pinger, "127.0.0.1", p["port"])
    if not await ready_for_go(p):
        return
    frame = raw_frame(p["payload"], b"\x5a")

    async def rounds(n: int, out: list[int] | None) -> None:
        clock = time.perf_counter_ns
        for _ in range(n):
            t0 = clock()
            proto.waiter = loop.create_future()
            transport.write(frame)
            await proto.waiter
            if out is not None:
                out.append(clock() - t0)

    await timed_rounds(rounds, p, "raw ping-pong")
    transport.close()


# ---------------------------------------------------------------------------- NATS
async def nats_recv(p: dict[str, Any]) -> None:
    import nats

    errors: list[str] = []
    slow = [0]

    async def on_error(exc: Exception) -> None:
        if type(exc).__name__ == "SlowConsumerError":
            slow[0] += 1  # one per message the client's pending queue had to drop
        elif len(errors) < 5:
            errors.append(f"{type(exc).__name__}: {exc}")

    nc = await nats.connect(p["url"], connect_timeout=5, error_cb=on_error,
                            max_reconnect_attempts=0)
    tally = Tally()

    async def on_msg(msg: Any) -> None:
        now = time.monotonic()
        if not tally.count:
            tally.first = now
        tally.count += 1
        tally.nbytes += len(msg.data)
        tally.last = now

    sub = await nc.subscribe(p["subject"], cb=on_msg, pending_msgs_limit=1 << 20,
                             pending_bytes_limit=1 << 30)
    await nc.flush()
    emit("ready")
    run = await until_idle(p, tally)
    emit("result", **run, queue_dropped=slow[0], per_client=[], errors=errors,
         **tally.as_dict())
    await sub.unsubscribe()
    with contextlib.suppress(Exception):
        await nc.close()


async def nats_send(p: dict[str, Any]) -> None:
    import nats

    nc = await nats.connect(p["url"], connect_timeout=5, max_reconnect_attempts=0)
    if not await ready_for_go(p):
        return
    payload = b"\xa5" * p["payload"]
    subject = p["subject"]
    duration, max_count = p["duration"], p["max_count"]
    publish = nc.publish
    cpu0 = cpu()
    sch0 = sched()
    t0 = time.monotonic()
    end = t0 + duration
    i = 0
    while i < max_count:
        await publish(subject, payload)
        i += 1
        if not i & 63:
            if time.monotonic() >= end:
                break
            if not i & 1023:
                await asyncio.sleep(0)  # let the flusher task write
    t1 = time.monotonic()
    await nc.flush(timeout=30)
    await report_sent(p, i, i * len(payload), t0, t1, cpu0, sch0)
    with contextlib.suppress(Exception):
        await nc.close()


ROLES = {
    "flow-recv": flow_recv, "flow-send": flow_send, "flow-pong": flow_pong,
    "flow-ping": flow_ping, "raw-recv": raw_recv, "raw-send": raw_send,
    "raw-pong": raw_pong, "raw-ping": raw_ping, "nats-recv": nats_recv,
    "nats-send": nats_send,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ROLES:
        print(f"usage: workers.py ROLE 'JSON'; roles: {', '.join(sorted(ROLES))}",
              file=sys.stderr)
        return 2
    params = json.loads(argv[1])
    hard_limit = float(params.get("max_time", 60)) + 30.0

    async def run() -> None:
        async with asyncio.timeout(hard_limit):
            await ROLES[argv[0]](params)

    try:
        asyncio.run(run())
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which shows the log
        emit("error", error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    # a worker must never outlive a crashed parent for long
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
