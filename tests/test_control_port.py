"""The JSON-line control port under hostile or mistaken input: a clear error, no traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from flowrouter.net.commandauth import sign_command
from flowrouter.net.config import NodeConfig
from flowrouter.net.runtime import CONTROL_LINE_LIMIT, RouterNode, query_control

from .rawep import run, within


def test_oversized_control_line_is_answered_and_logged_without_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        async with RouterNode(NodeConfig("r1", listen=None, control="127.0.0.1:0")) as node:
            host, port = node.control_address
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"x" * 200_000 + b"\n")
            reply = json.loads(await within(reader.readline()))
            assert reply["ok"] is False and str(CONTROL_LINE_LIMIT) in reply["error"]
            try:  # then it hangs up (a reset: our unread bytes were still in its buffer)
                assert await within(reader.read()) == b""
            except ConnectionResetError:
                pass
            writer.close()
            # and keeps serving others
            assert (await query_control("%s:%d" % (host, port), "ping"))["name"] == "r1"

    with caplog.at_level(logging.INFO):
        run(go())
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert any("control line over" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cmd", [{"cmd": "link", "peer": "nobody", "up": False},
                                 {"cmd": "emulate", "peer": "nobody", "delay": 0.1}])
def test_commands_for_an_unknown_peer_are_refused(cmd: dict[str, object]) -> None:
    async def go() -> None:
        async with RouterNode(NodeConfig("r1", listen=None, control="127.0.0.1:0")) as node:
            with pytest.raises(ConnectionError, match="no peer named 'nobody'"):
                await query_control("%s:%d" % node.control_address, **cmd)  # type: ignore

    run(go())


@pytest.mark.parametrize("line", [b"[" * 100_000 + b"]" * 100_000, b'{"cmd": ' * 5000,
                                  b"not json", b"[1, 2]", b'"status"', b'{"cmd": ["link"]}',
                                  b'{"cmd": 7}', b'{"peer": "r2"}'])
def test_malformed_control_input_gets_a_one_line_error_and_is_counted(
        line: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Deeply nested JSON used to raise RecursionError in the server: no answer, and a
    traceback in the log; so did a command name that is a list (unhashable, in the command
    guard). Every line that is not a JSON object naming its command is answered and
    counted."""
    async def go() -> None:
        async with RouterNode(NodeConfig("r1", listen=None, control="127.0.0.1:0")) as node:
            host, port = node.control_address
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(line[:CONTROL_LINE_LIMIT - 1] + b"\n")
            reply = json.loads(await within(reader.readline()))
            assert reply["ok"] is False and "malformed control request" in reply["error"]
            assert node.core.counters["control.malformed"] == 1
            writer.write(b'{"cmd": "ping"}\n')  # the connection goes on
            assert json.loads(await within(reader.readline()))["name"] == "r1"
            writer.close()

    with caplog.at_level(logging.INFO):
        run(go())
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


TOKEN = "a-control-token-0123"


async def _signed_line(address: tuple[str, int], request: dict[str, object]) -> bytes:
    """What a client sends to command the router at *address*: it asks its name and run
    nonce (ping), then signs for them (what an eavesdropper records)."""
    pong = await query_control("%s:%d" % address, "ping")
    signed = sign_command(request, "token", TOKEN.encode(), time.time(), router=pong["name"],
                          boot=pong["boot"])
    return json.dumps(signed).encode() + b"\n"


async def _send(address: tuple[str, int], line: bytes) -> dict[str, object]:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(line)
    reply = json.loads(await within(reader.readline()))
    writer.close()
    assert isinstance(reply, dict)
    return reply


def test_a_recorded_command_is_refused_by_another_router_and_after_a_restart() -> None:
    """r1 and r2 share a control token. A command recorded on its way to r1 is refused by r2
    (it names its router) and by r1 after a restart (it names the run), within its time
    window."""
    def cfg(name: str) -> NodeConfig:
        return NodeConfig(name, listen=None, control="127.0.0.1:0", control_token=TOKEN,
                          accept_routers=["x@127.0.0.1"])

    async def go() -> None:
        cmd = {"cmd": "link", "peer": "x", "up": False}
        async with RouterNode(cfg("r1")) as r1, RouterNode(cfg("r2")) as r2:
            line = await _signed_line(r1.control_address, cmd)
            reply = await _send(r2.control_address, line)
            assert reply["ok"] is False and "signed for router 'r1'" in str(reply["error"])
            assert "x" not in r2.blocked_peers
            assert (await _send(r1.control_address, line))["ok"] is True
            assert "x" in r1.blocked_peers
        async with RouterNode(cfg("r1")) as again:
            reply = await _send(again.control_address, line)
            assert reply["ok"] is False and "earlier run" in str(reply["error"])
            assert "x" not in again.blocked_peers
            assert again.core.counters["refused.command"] == 1
            # a client that signs afresh is served
            assert (await _send(again.control_address,
                                await _signed_line(again.control_address, cmd)))["ok"] is True
            await query_control("%s:%d" % again.control_address, "link", token=TOKEN,
                                peer="x", up=True)
            assert "x" not in again.blocked_peers

    run(go())


@pytest.mark.parametrize("line", [b'{"cmd": "status", "peer": null, "sort": [null]}',
                                  b'{"cmd": "status", "sort": {"a": 1}}',
                                  b'{"cmd": "status", "limit": Infinity}',
                                  b'{"cmd": "status", "sort": 7, "limit": -Infinity}'])
def test_a_status_view_of_the_wrong_type_is_answered_with_the_reason(
        line: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """A sort that is not a field name, or a limit that is no whole number (JSON's Infinity
    included), got no answer and a traceback (found by the operator fuzz test)."""
    async def go() -> None:
        async with RouterNode(NodeConfig("r1", listen=None, control="127.0.0.1:0")) as node:
            reply = await _send(node.control_address, line + b"\n")
            assert reply["ok"] is False
            assert "sort" in str(reply["error"]) or "limit" in str(reply["error"]), reply
            pong = await _send(node.control_address, b'{"cmd": "ping"}\n')
            assert pong["name"] == "r1"  # it serves on

    with caplog.at_level(logging.INFO):
        run(go())
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
