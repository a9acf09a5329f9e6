"""``flowrouter ctl``: send one control command to a running router, signed when asked.

Commands that change a router need proof when its control interface is not on loopback or
when it has a ``control_token`` (:mod:`flowrouter.net.commandauth`). This tool signs them with
the token or a link key, read from a file or the environment only: a secret on the command
line would sit in the shell history and in every ``ps`` listing, so there is no option for
one. The secret never crosses the network (the request carries an HMAC, a time and a nonce).
Imports :mod:`flowrouter.net` (control client, command list), :mod:`flowrouter.wire` and
:mod:`flowrouter.console`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from flowrouter import console
from flowrouter.net.commandauth import READ_ONLY_COMMANDS
from flowrouter.net.control import COMMANDS
from flowrouter.wire.linksecrets import parse_secret

#: the shortest control token a router accepts (NodeConfig.control_secrets)
MIN_TOKEN = 12


def _epilog() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["commands the control interface accepts (* needs proof unless the interface is "
             "on", "loopback and no control_token is set):"]
    for name, (args, what) in COMMANDS.items():
        mark = " " if name in READ_ONLY_COMMANDS else "*"
        if args:
            lines.append(f"  {mark}{name:<{width}}  {args}")
            lines.append(f"   {'':<{width}}  {what}")
        else:
            lines.append(f"  {mark}{name:<{width}}  {what}")
    lines += ["", "values: true/false, numbers, anything else is text.", "", "examples:",
              "  flowrouter ctl --control 127.0.0.1:7101 ping",
              "  flowrouter ctl --control 10.0.0.1:7101 --token-file /etc/flownet/control.token "
              "link peer=r2 up=false",
              "  flowrouter ctl --control 10.0.0.1:7101 --token-env FLOWNET_CONTROL_TOKEN "
              "emulate peer=r2 delay=0.05 loss=0.01",
              "  flowrouter ctl --control 10.0.0.1:7101 --link-key site-2026:/etc/flownet/"
              "site.key link peer=r2 up=true",
              "  flowrouter ctl --control 127.0.0.1:7101 reload",
              "  flowrouter ctl --control 127.0.0.1:7101 drain grace=60",
              "", "Secrets come from files or the environment only, never from the command "
              "line.", "Exit status: 0 done, 1 refused or no router answers, 2 usage error."]
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    ctl = sub.add_parser(
        "ctl", help="send a control command to a running router (signed with a token or key)",
        description="Send one command to a running router's control interface (its --control "
                    "address) and print the reply as JSON. Commands that change the router "
                    "are signed with the control token or a link key when one is given.",
        epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ctl.add_argument("--control", required=True, metavar="HOST:PORT",
                     help="the router's control address")
    proof = ctl.add_mutually_exclusive_group()
    proof.add_argument("--token-file", metavar="FILE",
                       help="sign with the control token in FILE (the router's control_token)")
    proof.add_argument("--token-env", metavar="VAR",
                       help="sign with the control token in environment variable VAR")
    proof.add_argument("--link-key", metavar="ID:FILE",
                       help="sign with link key ID of the router's [link_auth.keys], read "
                            "from FILE (as the router reads key files; mode 0600)")
    ctl.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                     help="give up when the router does not answer within this (default 5)")
    ctl.add_argument("cmd", metavar="CMD", help="the command (see below)")
    ctl.add_argument("args", nargs="*", metavar="KEY=VALUE", help="the command's arguments")


def _value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _arguments(pairs: list[str], cmd: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise console.UsageError(f"argument {pair!r} must look like KEY=VALUE "
                                     "(e.g. peer=r2)")
        if cmd == "drain" and key == "timeout":
            key = "grace"  # drain timeout=S: the drain's own time-out (not the reply's)
        if key in ("cmd", "auth", "address", "timeout", "token", "link_key"):
            raise console.UsageError(f"{key!r} is not a command argument")
        out[key] = _value(value)
    return out


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            token = Path(args.token_file).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise console.UsageError(f"--token-file {args.token_file}: {exc.strerror}"
                                     ) from None
        except UnicodeDecodeError:
            raise console.UsageError(f"--token-file {args.token_file}: not UTF-8 text"
                                     ) from None
        where = f"--token-file {args.token_file}"
    elif args.token_env:
        token = os.environ.get(args.token_env, "").strip()
        if not token:
            raise console.UsageError(f"--token-env: environment variable {args.token_env} "
                                     "is not set or empty")
        where = f"--token-env {args.token_env}"
    else:
        return None
    if len(token) < MIN_TOKEN:
        raise console.UsageError(f"{where}: a control token has at least {MIN_TOKEN} "
                                 "characters")
    return token


def _link_key(spec: str | None) -> tuple[str, bytes] | None:
    if spec is None:
        return None
    key_id, sep, path = spec.partition(":")
    if not sep or not key_id or not path:
        raise console.UsageError(f"--link-key {spec!r} must look like ID:FILE "
                                 "(e.g. site-2026:/etc/flownet/site.key)")
    if path.startswith("file:"):
        path = path[5:]
    elif path.split(":", 1)[0].lower() in ("hex", "base64", "b64"):
        raise console.UsageError("--link-key takes ID:FILE; put the key in a file (mode 0600), "
                                 "never on the command line")
    try:
        return key_id, parse_secret(f"file:{path}")
    except ValueError as exc:
        raise console.UsageError(f"--link-key: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Send the command; print the reply. Refusals raise ConnectionError (exit 1)."""
    from flowrouter.net.control import query_control

    if args.cmd not in COMMANDS:
        raise console.UsageError(f"unknown command {args.cmd!r}; the control interface "
                                 f"accepts: {', '.join(COMMANDS)} (flowrouter ctl -h)")
    fields = _arguments(args.args, args.cmd)
    reply = asyncio.run(query_control(args.control, args.cmd, timeout=args.timeout,
                                      token=_token(args), link_key=_link_key(args.link_key),
                                      **fields))
    print(json.dumps({k: v for k, v in reply.items() if k != "ok"}, indent=2))
    return 0
