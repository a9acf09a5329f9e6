"""The control interface of a router node: JSON lines on TCP, server side and client side.

``{"cmd": "status"}`` returns the link table, flow table, LS routes and counters
(``flowrouter status`` prints them); ``ping``, ``link`` (administrative down/up) and
``emulate`` (bandwidth, delay, loss) act on a running node; :data:`COMMANDS` is the list
(``flowrouter ctl -h`` shows it). :func:`query_control` is the client every tool uses. Bad
requests get a one-line error reply, never a dropped server. Status is served to anyone the
interface is bound for; commands that change the router pass the node's
:class:`~flowrouter.net.commandauth.CommandGuard` first (proof by token or link key), and
:func:`query_control` signs them when given a token or key. Connections pass the node's
:class:`~flowrouter.net.connlimits.ConnectionGate` (``[limits] control_connections``, the
descriptor budget) and are closed after ``control_idle`` seconds of silence, each with a
one-line error reply saying why.

May import :mod:`flowrouter.core`, :mod:`flowrouter.net.config`,
:mod:`flowrouter.net.connlimits`, :mod:`flowrouter.net.commandauth`,
:mod:`flowrouter.net.slicedjson` (replies encoded a slice at a time),
:mod:`flowrouter.net.flowviews` (its collector pause) and :mod:`flowrouter.wire`;
the node is seen only as :class:`Controlled`, the few things the interface asks of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from flowrouter.net import flowviews, slicedjson
from flowrouter.net.commandauth import CommandGuard, sign_command
from flowrouter.net.config import ConfigError, Emulation, parse_address
from flowrouter.net.connlimits import CONTROL, ConnectionGate
from flowrouter.wire.control import Role

log = logging.getLogger(__name__)

#: longest control request line accepted (a longer one is answered with an error, then closed)
CONTROL_LINE_LIMIT = 64 * 1024
#: longest reply a client accepts (a status with a large flow table is long)
CONTROL_REPLY_LIMIT = 256 * 1024 * 1024

#: every command the interface accepts: its arguments and what it does (the one list the
#: server's error replies and ``flowrouter ctl --help`` show). Those in
#: commandauth.READ_ONLY_COMMANDS are served to anyone; the others need proof.
COMMANDS: dict[str, tuple[str, str]] = {
    "status": ("[sort=FIELD] [limit=N]", "links, flows, LS routes, quotas, alerts and "
               "counters; lists sorted by FIELD (numbers largest first; -FIELD reverses) "
               "and cut to N rows (read-only)"),
    "ping": ("", "the router's name and run nonce, which a signed command covers (read-only)"),
    "link": ("peer=NAME up=true|false", "take the link to router NAME administratively "
             "down (closed, not re-dialled) or up again"),
    "emulate": ("peer=NAME [bandwidth=BPS] [delay=S] [loss=P] [down=true|false]",
                "emulate a slow, far, lossy or cut link toward router NAME (peer=NAME alone: off)"),
    "reload": ("", "read the configuration again and apply it live (as SIGHUP); the reply "
               "lists what changed, or why nothing did"),
    "drain": ("[grace=S]", "stop accepting, tell applications to move to another router, "
              "exit when they have gone or after S seconds (default 30; as SIGUSR2)"),
}

if TYPE_CHECKING:
    from flowrouter.core.router import Router
    from flowrouter.net.config import NodeConfig

log = logging.getLogger("flowrouter.net.runtime")


class Operable(Protocol):
    """Reload and drain, as the control interface asks for them
    (:class:`flowrouter.net.operate.Operations`)."""

    def reload_logged(self) -> dict[str, Any]: ...
    def drain(self, timeout: float | None = None) -> dict[str, Any]: ...


class Controlled(Protocol):
    """What the control interface asks of a router node
    (:class:`flowrouter.net.node.RouterNode`)."""

    @property
    def config(self) -> NodeConfig: ...
    @property
    def core(self) -> Router: ...
    @property
    def guard(self) -> CommandGuard | None:
        """Who may run commands that change the router (None: anyone it is bound for)."""
    @property
    def gate(self) -> ConnectionGate:
        """Connections per port and the descriptor budget."""
    @property
    def blocked_peers(self) -> frozenset[str]: ...
    @property
    def emulated_peers(self) -> frozenset[str]: ...

    @property
    def ops(self) -> Operable:
        """Reload and drain (flowrouter.net.operate)."""

    async def status_view_sliced(self, sort: str | None, limit: Any) -> dict[str, Any]: ...
    def set_emulation(self, peer: str, emu: Emulation | None) -> None: ...
    def set_link(self, peer: str, up: bool) -> int: ...


def peer_names(node: Controlled) -> list[str]:
    """Routers *node* knows by name: configured, emulated or currently linked."""
    names = {p.name for p in node.config.peers if p.name} | set(node.emulated_peers)
    names |= {name for name, _host in node.config.accepted_routers()}
    names |= {lk.peer_name for lk in node.core.links.values()
              if lk.peer_name and lk.role is Role.ROUTER}
    return sorted(names)


def knows_peer(node: Controlled, name: str) -> bool:
    return name in peer_names(node) or name in node.blocked_peers


def command(node: Controlled, cmd: Any, req: Any) -> dict[str, Any]:
    """The reply to one control request but ``status`` (:func:`answer`); raises
    ConfigError, KeyError, TypeError or ValueError for a malformed one."""
    if cmd == "ping":
        guard = node.guard
        return {"ok": True, "name": node.config.name,
                **({"boot": guard.boot} if guard is not None else {})}
    if cmd == "reload":
        return node.ops.reload_logged()
    if cmd == "drain":
        return node.ops.drain(req.get("grace", req.get("timeout")))
    if cmd in ("emulate", "link") and not knows_peer(node, str(req["peer"])):
        return {"ok": False, "error": f"{cmd}: router {node.config.name} has no peer named "
                f"{req['peer']!r} (known: {', '.join(peer_names(node)) or 'none'})"}
    if cmd == "emulate":
        emu = Emulation.from_mapping({k: v for k, v in req.items()
                                      if k not in ("cmd", "auth")}, "emulate")
        node.set_emulation(str(req["peer"]), emu)
        return {"ok": True, "emulation": emu.describe()}
    if cmd == "link":
        up = req["up"]
        if not isinstance(up, bool):
            raise ValueError('"up" must be true or false')
        return {"ok": True, "closed": node.set_link(str(req["peer"]), up)}
    return {"ok": False, "error": f"unknown or malformed command {cmd!r}; send one JSON line "
            '{"cmd": CMD, ARG: VALUE, ...}, CMD one of: '
            + "; ".join(f"{name} {args}".strip() for name, (args, _) in COMMANDS.items())}


async def answer(node: Controlled, cmd: Any, req: Any) -> dict[str, Any]:
    """The reply to one control request: :func:`command`'s, or a status document, made a
    slice of flow rows at a time (the loop forwards in between: every row of a large table
    is seconds of work) and, with ``sort`` or ``limit``, only of the rows shown (as
    ``/status?sort=``)."""
    if cmd == "status":
        return {"ok": True, "status": await node.status_view_sliced(req.get("sort"),
                                                                    req.get("limit"))}
    return command(node, cmd, req)


async def serve_client(node: Controlled, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
    """Answer one control connection, a JSON line per request, until it closes (or stays
    silent for ``[limits] control_idle`` seconds)."""
    gate, idle = node.gate, node.config.limits.control_idle
    refused = gate.admit(CONTROL, time.monotonic())
    if refused is not None:
        writer.write(json.dumps({"ok": False, "error": f"connection refused: {refused}"}
                                ).encode() + b"\n")
        writer.close()
        return
    try:
        while True:
            try:
                line = await asyncio.wait_for(reader.readline(), idle)
            except TimeoutError:
                gate.idle_closed(CONTROL, time.monotonic(), idle)
                writer.write(json.dumps({"ok": False, "error": f"idle for {idle:g}s: "
                                         "closing"}).encode() + b"\n")
                break
            except ValueError:  # longer than the stream limit: answer, then hang up
                log.warning("router %s: control line over %d bytes from %s; closing",
                            node.config.name, CONTROL_LINE_LIMIT,
                            writer.get_extra_info("peername"))
                writer.write(json.dumps({"ok": False, "error": "control line over "
                                         f"{CONTROL_LINE_LIMIT} bytes"}).encode() + b"\n")
                break
            if not line:
                break
            try:
                req = json.loads(line)
            except (ValueError, RecursionError) as exc:  # deep nesting: RecursionError
                req = exc
            if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                node.core.counters["control.malformed"] += 1
                why = ("nested too deeply" if isinstance(req, RecursionError)
                       else "not JSON" if isinstance(req, ValueError)
                       else "not an object" if not isinstance(req, dict)
                       else "its cmd is not a string")
                writer.write(json.dumps({"ok": False, "error": "malformed control request "
                                         f"({why}): send one JSON object per line"}
                                        ).encode() + b"\n")
                await writer.drain()
                continue
            cmd = req.get("cmd")
            refusal = (node.guard.authorise(req, time.time())
                       if node.guard is not None else None)
            with flowviews.collector_paused():  # a large status is a million rows
                try:
                    if refusal is not None:
                        node.core.counters["refused.command"] += 1
                        log.warning("router %s: control command %r refused: %s",
                                    node.config.name, cmd, refusal)
                        reply = {"ok": False, "error": refusal}
                    else:
                        reply = await answer(node, cmd, req)
                except (ConfigError, KeyError, TypeError, ValueError) as exc:
                    reply = {"ok": False, "error": f"bad {cmd} command: {exc}"}
                parts = await slicedjson.pieces(reply, consume=True)
                del reply
            for piece in parts:  # a large reply is never copied whole: piece by piece,
                writer.write(piece.encode())  # as the peer reads
                await writer.drain()
            writer.write(b"\n")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    except asyncio.CancelledError:
        pass  # the router stops with this connection open (asyncio 3.11 would log a
        # traceback for a handler that ends cancelled)
    finally:
        gate.release(CONTROL)
        writer.close()


async def query_control(address: str, cmd: str = "status", timeout: float = 5.0,
                        token: str | None = None, link_key: tuple[str, bytes] | None = None,
                        **args: Any) -> dict[str, Any]:
    """Ask a running router's control interface; raises ConnectionError with a clear text.

    A command is signed with the control *token* or a *link_key* ``(key id, secret)`` when
    one is given (flowrouter.net.commandauth), for the router that answers a ``ping`` first on
    the same connection (its name and run nonce); status queries need neither."""
    host, port = parse_address(address, "control address")
    request: dict[str, Any] = {"cmd": cmd, **args}
    secret = (("token", token.encode()) if token is not None else link_key)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            host, port, limit=CONTROL_REPLY_LIMIT), timeout)
    except (TimeoutError, OSError) as exc:
        raise ConnectionError(f"no router control interface answers at {address}: "
                              f"{exc}") from None
    try:
        if secret is not None:
            writer.write(b'{"cmd": "ping"}\n')
            pong = json.loads(await asyncio.wait_for(reader.readline(), timeout) or b"{}")
            if not isinstance(pong, dict) or not isinstance(pong.get("name"), str):
                raise ConnectionError(f"{address} did not answer a ping: not a router's "
                                      "control interface")
            request = sign_command(request, secret[0], secret[1], time.time(),
                                   router=pong["name"], boot=str(pong.get("boot", "")))
        writer.write(json.dumps(request).encode() + b"\n")
        line = await asyncio.wait_for(reader.readline(), timeout)
    except TimeoutError:
        raise ConnectionError(f"{address} accepted the control connection but did not "
                              f"answer within {timeout:g}s (is it a router's control "
                              "address?)") from None
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"control connection to {address} failed: {exc}") from None
    finally:
        writer.close()
    if not line:
        raise ConnectionError(f"router at {address} closed the control connection")
    try:
        reply: dict[str, Any] = json.loads(line)
    except ValueError:
        raise ConnectionError(f"{address} answered something that is not a router's "
                              "control reply") from None
    if not isinstance(reply, dict):
        raise ConnectionError(f"{address} answered something that is not a control reply")
    if not reply.get("ok"):
        raise ConnectionError(f"router at {address}: {reply.get('error')}")
    return reply
