"""The JSON-line control port under hostile or mistaken input: a clear error, no traceback."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

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
