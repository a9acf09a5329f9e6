"""Fuzzing the operator surfaces of a live loopback router (issue 26: "malformed control
input gets an error reply"): whatever line reaches the control port, and whatever request
reaches the HTTP monitor, is answered (one JSON object with ``ok`` / one HTTP response) and
leaves no traceback or error in the log; the router serves on after it.

The router runs in a thread of its own (its own event loop), so hypothesis drives it from
blocking sockets, a few hundred cases per surface. Two routers: one without a control token
(any command runs; ``drain`` is left out so the router stays up) and one with a token (every
changing command needs a signature the fuzzer cannot make).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrouter.monitor import MonitorServer, start_monitor
from flowrouter.net.config import NodeConfig
from flowrouter.net.control import COMMANDS, CONTROL_LINE_LIMIT
from flowrouter.net.observe import router_source
from flowrouter.net.runtime import RouterNode

TOKEN = "a-control-token-0123"


class Running:
    """Routers and their monitor in a thread's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.open: RouterNode = self.call(self._node("open", None))
        self.guarded: RouterNode = self.call(self._node("guarded", f"hex:{TOKEN.encode().hex()}"))
        mon = self.call(start_monitor(router_source(self.open), "127.0.0.1:0",
                                      check=self.open.gate))
        assert isinstance(mon, MonitorServer)
        self.monitor = mon

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    @staticmethod
    async def _node(name: str, token: str | None) -> RouterNode:
        node = RouterNode(NodeConfig(name, listen="127.0.0.1:0", control="127.0.0.1:0",
                                     control_token=token))
        await node.start()
        return node

    def stop(self) -> None:
        self.call(self.monitor.stop())
        for node in (self.open, self.guarded):
            self.call(node.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def routers() -> Iterator[Running]:
    r = Running()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(autouse=True)
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with caplog.at_level(logging.INFO):
        yield
    bad = [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, bad


def _control(address: tuple[str, int], line: bytes) -> dict[str, Any]:
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(line + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            assert chunk, f"no answer to {line[:200]!r}"
            buf += chunk
    reply = json.loads(buf)
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
    return reply


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
ARG_NAMES = ["peer", "up", "bandwidth", "delay", "loss", "down", "grace", "sort", "limit",
             "timeout", "auth", "name", "boot", "cmd"]


@st.composite
def control_lines(draw: st.DrawFn, commands: list[str]) -> bytes:
    kind = draw(st.integers(0, 2))
    if kind == 0:  # bytes, not necessarily JSON or UTF-8
        return draw(st.binary(max_size=300)).replace(b"\n", b" ")
    if kind == 1:  # JSON that may not be an object
        return json.dumps(draw(JSON)).encode()
    req: dict[str, Any] = {"cmd": draw(st.sampled_from(commands) | st.text(max_size=8) | JSON)}
    for name in draw(st.lists(st.sampled_from(ARG_NAMES) | st.text(max_size=6), max_size=5)):
        req[name] = draw(JSON)
    return json.dumps(req).encode()


FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(line=control_lines([c for c in COMMANDS if c != "drain"]))
def test_every_control_line_is_answered_by_a_router_without_a_token(
        routers: Running, line: bytes) -> None:
    _control(routers.open.control_address, line[:CONTROL_LINE_LIMIT - 1])


@FUZZ
@given(line=control_lines(list(COMMANDS)))
def test_every_control_line_is_answered_by_a_router_with_a_token(
        routers: Running, line: bytes) -> None:
    reply = _control(routers.guarded.control_address, line[:CONTROL_LINE_LIMIT - 1])
    try:
        req = json.loads(line)
    except ValueError:
        req = None
    if isinstance(req, dict) and req.get("cmd") in ("link", "emulate", "reload", "drain"):
        assert reply["ok"] is False  # unsigned: refused


PATHS = st.sampled_from(["/", "/dashboard", "/dashboard.js", "/dashboard.css", "/api/overlay",
                         "/status", "/metrics", "/livez", "/readyz", "/healthz", "/x"])


@st.composite
def http_requests(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):  # anything at all
        return draw(st.binary(max_size=400)) + b"\r\n\r\n"
    method = draw(st.sampled_from(["GET", "HEAD", "POST", "get", "OPTIONS"]) | st.text(
        st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=6))
    query = draw(st.text(max_size=40).map(lambda t: t.replace(" ", "+")))
    target = draw(PATHS) + ("?" + query if query else "")
    head = f"{method} {target} HTTP/1.{draw(st.integers(0, 1))}\r\n"
    for _ in range(draw(st.integers(0, 3))):
        head += f"{draw(st.text(max_size=10))}: {draw(st.text(max_size=20))}\r\n"
    return head.encode("utf-8", "surrogatepass").replace(b"\r\n\r\n", b"\r\n") + b"\r\n"


@FUZZ
@given(request=http_requests())
def test_every_http_request_is_answered(routers: Running, request: bytes) -> None:
    with socket.create_connection(routers.monitor.address, timeout=10) as s:
        s.sendall(request)
        buf = b""
        while chunk := s.recv(1 << 20):
            buf += chunk
    assert buf.startswith(b"HTTP/1.1 "), (request[:200], buf[:200])
    code = int(buf[9:12])
    assert code != 500, (request[:200], buf[:300])


def test_the_routers_serve_on_after_the_fuzzing(routers: Running) -> None:
    for node in (routers.open, routers.guarded):
        assert _control(node.control_address, b'{"cmd": "ping"}')["ok"] is True
