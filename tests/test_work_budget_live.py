"""A live router stays responsive while one application floods it: a 10^6-entry digest, or
200,000 JOINs at once.

The attacks once stalled a router's event loop for 3.4-6.3 s (the digest) and 0.44 s per
read (the joins, each answered). The router runs in its own process
(:mod:`tests.loopprobe`) and measures the CPU time its event-loop thread spends between two
wake-ups of a 5 ms timer: with the work budget no stretch of it may exceed 100 ms, whatever
the load on the machine (CPU time does not stretch under load as wall time does). The
application here sends the whole digest as fast as the socket takes it, from this process.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import pack_header

ENTRIES = 1_000_000
PER_CHUNK = 1024


def _digest() -> bytes:
    count = -(-ENTRIES // PER_CHUNK)
    mask = (1 << 32).to_bytes(16, "big")
    prefix = FlowID(0xBAD, 0x10, 0).key[:12]
    out = bytearray()
    for i in range(count):
        n = min(PER_CHUNK, ENTRIES - i * PER_CHUNK)
        entries = b"".join(prefix + (i * PER_CHUNK + j).to_bytes(4, "big") + mask + b"\0"
                           for j in range(n))
        # the chunk's fields, then its entry count and entries (built as bytes: fast)
        head = C.Refresh(1, i, count, 30_000, ()).encode()[:-2]
        body = head + n.to_bytes(2, "big") + entries
        out += pack_header(LINK_LOCAL_FLOW.key, len(body), 0) + body
    return bytes(out)


def _joins(n: int) -> bytes:
    out = bytearray()
    for i in range(n):
        body = C.Join(i + 1, 1 << 32).encode()
        out += pack_header(FlowID(0xF10D, 0x10, i).key, len(body), 0) + body
    return bytes(out)


def _flood(data: bytes) -> dict:  # type: ignore[type-arg]
    """Send *data* to a router in its own process as one application; its probe report."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.loopprobe", "8"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        hello = C.Hello(7, C.Role.ENDPOINT, "attacker", 65536).encode()
        sock.sendall(C.hello_header(len(hello), C.FEATURES) + hello)

        def drain() -> None:  # read the router's answers, so its output never blocks
            try:
                while sock.recv(1 << 20):
                    pass
            except OSError:
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        def send() -> None:  # a flood the router may not read to its end: pushed back
            try:
                sock.sendall(data)
            except OSError:
                pass

        threading.Thread(target=send, daemon=True).start()
        report: dict = json.loads(proc.stdout.readline())  # type: ignore[type-arg]
        sock.close()
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait(30)
    return report


def test_a_digest_of_a_million_foreign_flows_does_not_stall_the_loop() -> None:
    data = _digest()
    assert isinstance(C.decode(data[24:24 + int.from_bytes(data[16:20], "big")]), C.Refresh)
    report = _flood(data)
    assert report["max_cpu"] < 0.1, report["max_cpu"]
    counters = report["counters"]
    assert counters["refresh.chunks-received"] == -(-ENTRIES // PER_CHUNK)
    assert counters["work.budget-tripped"] > 0  # the budget held the flood back


def test_a_join_flood_does_not_stall_the_loop() -> None:
    report = _flood(_joins(200_000))
    assert report["max_cpu"] < 0.1, report["max_cpu"]
    counters = report["counters"]
    assert counters["work.budget-tripped"] > 0  # the control budget held the flood back
    assert counters["control.join"] >= 1024  # and the application was still heard
