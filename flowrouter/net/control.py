"""The control interface of a router node: JSON lines on TCP, server side and client side.

``{"cmd": "status"}`` returns the link table, flow table, LS routes and counters
(``flowrouter status`` prints them); ``ping``, ``link`` (administrative down/up) and
``emulate`` (bandwidth, delay, loss) act on a running node. :func:`query_control` is the
client every tool uses. Bad requests get a one-line error reply, never a dropped server.

May import :mod:`flowrouter.net.config` and :mod:`flowrouter.wire`; the node is only a type.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from flowrouter.net.config import ConfigError, Emulation, parse_address

if TYPE_CHECKING:
    from flowrouter.net.node import RouterNode


def command(node: RouterNode, cmd: Any, req: Any) -> dict[str, Any]:
    """The reply to one control request (raises ConfigError, KeyError, TypeError or
    ValueError for a malformed one)."""
    if cmd == "status":
        return {"ok": True, "status": node.status()}
    if cmd == "ping":
        return {"ok": True, "name": node.config.name}
    if cmd == "emulate":
        emu = Emulation.from_mapping({k: v for k, v in req.items() if k != "cmd"},
                                     "emulate")
        node.set_emulation(str(req["peer"]), emu)
        return {"ok": True, "emulation": emu.describe()}
    if cmd == "link":
        up = req["up"]
        if not isinstance(up, bool):
            raise ValueError('"up" must be true or false')
        return {"ok": True, "closed": node.set_link(str(req["peer"]), up)}
    return {"ok": False, "error": "unknown or malformed command; send one JSON line: "
            '{"cmd": "status"}, {"cmd": "ping"}, {"cmd": "link", "peer": NAME, '
            '"up": BOOL} or {"cmd": "emulate", "peer": NAME, "bandwidth": BPS, '
            '"delay": S, "loss": P, "down": BOOL}'}

async def serve_client(node: RouterNode, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
    """Answer one control connection, a JSON line per request, until it closes."""
    try:
        while line := await reader.readline():
            try:
                req = json.loads(line)
                cmd = req.get("cmd") if isinstance(req, dict) else None
            except ValueError:
                cmd, req = None, None
            try:
                reply = command(node, cmd, req)
            except (ConfigError, KeyError, TypeError, ValueError) as exc:
                reply = {"ok": False, "error": f"bad {cmd} command: {exc}"}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def query_control(address: str, cmd: str = "status", timeout: float = 5.0,
                        **args: Any) -> dict[str, Any]:
    """Ask a running router's control interface; raises ConnectionError with a clear text."""
    host, port = parse_address(address, "control address")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (TimeoutError, OSError) as exc:
        raise ConnectionError(f"no router control interface answers at {address}: "
                              f"{exc}") from None
    try:
        writer.write(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
    if not line:
        raise ConnectionError(f"router at {address} closed the control connection")
    reply: dict[str, Any] = json.loads(line)
    if not reply.get("ok"):
        raise ConnectionError(f"router at {address}: {reply.get('error')}")
    return reply
