"""The load generators bulk.py starts, one per process (``bulk.py --worker ROLE 'JSON'``).

Blocking sockets speaking each system's protocol directly, with no client library between
the measurement and the router: pre-built frames written in 64 KiB batches by a publisher,
bytes counted by a subscriber, one message bounced back and forth for round trips. Roles
(:data:`WORKERS`): ``publisher``, ``subscriber``, ``echo``, ``pinger``, each for ``raw``
(straight TCP), ``flownet`` (HELLO, JOIN, data frames to a ``flowrouter run``) or ``nats``
(the text protocol to a nats-server). Each prints JSON lines on stdout (``ready``,
``listening``, ``result``) for the orchestrating script (bulk.py), which tells a publisher
``go`` on stdin.

The attach helpers (:func:`flownet_attach`, :func:`nats_attach`) are shared with
fanout_bulk.py's counting receivers. Imports the standard library, ``common`` (HOST, and
the code snapshot it puts on the path) and, inside the functions that speak flownet,
``flowrouter.wire`` from that snapshot.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
from typing import Any

from common import HOST

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


def nats_subscribed(addr: str, subject: bytes) -> socket.socket:
    """A NATS connection subscribed to *subject* (sid 1), once the server has answered a PING
    sent behind the SUB: the subscription is in place before anything is published."""
    sock = nats_attach(addr)
    sock.sendall(b"SUB %s 1\r\nPING\r\n" % subject)
    f = sock.makefile("rb")
    while f.readline().strip() != b"PONG":
        pass
    return sock


def _rtt_endpoint(p: dict[str, Any], name: str, hear: bytes,
                  answer: bytes) -> tuple[socket.socket, bytes, int]:
    """One end of a NATS or flownet round trip: its socket, the message it sends and the
    bytes of each message it receives. NATS: subscribed to *hear*, publishing on *answer*;
    flownet: joined on the data band to the one flow both ends send on."""
    size = p["size"]
    if p["system"] == "nats":
        sock = nats_subscribed(p["addr"], hear)
        out = b"PUB %s %d\r\n" % (answer, size) + bytes(size) + b"\r\n"
        return sock, out, len(b"MSG %s 1 %d\r\n" % (hear, size)) + size + 2
    key = bytes.fromhex(p["key"])
    sock = flownet_attach(p["addr"], name, key, 1 | 1 << DATA_BAND)
    out = _frame(key, DATA_BAND, bytes(size))
    return sock, out, len(out)


def _accept_one() -> socket.socket:
    """The raw-TCP peer's end: listen on a free port, tell the parent where (``listening``),
    take the one connection."""
    lsock = socket.socket()
    lsock.bind((HOST, 0))
    lsock.listen(1)
    print(json.dumps({"event": "listening", "addr": "%s:%d" % lsock.getsockname()}),
          flush=True)
    sock, _ = lsock.accept()
    lsock.close()
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
        sock = nats_subscribed(p["addr"], b"bulk")
        per_msg = len(b"MSG bulk 1 %d\r\n" % size) + size + 2
    elif p["system"] == "flownet":
        keys = flow_keys(bytes.fromhex(p["key"]), p.get("flows", 1))
        sock = flownet_attach(p["addr"], "bulk-sub", keys[0], 1 | 1 << DATA_BAND)
        join_many(sock, keys[1:], 1 | 1 << DATA_BAND)
        refresh_all(sock, keys, 1 | 1 << DATA_BAND)
        per_msg = HEADER_SIZE + size
    else:
        sock = _accept_one()
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
    if p["system"] in ("nats", "flownet"):
        sock, pong, need = _rtt_endpoint(p, "rtt-echo", b"ping", b"pong")
    else:
        sock = _accept_one()
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
    if p["system"] in ("nats", "flownet"):
        sock, ping, need = _rtt_endpoint(p, "rtt-ping", b"pong", b"ping")
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
