"""``flowcat``: create flows, send lines into them, print what arrives — from a shell; and
make the capability and policy files that protect a flow (signed with its creator's key).

Connection flags are flowlib's, shared by every tool (:mod:`flowlib.cliopts`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from flowrouter import console
from flowrouter.wire.bands import BAND_FAULT, BAND_OVERFLOW, DEFAULT_DATA_BAND
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import DEFAULT_TTL, Locality

from .client import connect
from .cliopts import add_connection_options, connect_kwargs, publish_policies, routers
from .credentials import load_capability, load_policy, write_record_file
from .errors import FlowError
from .message import decode_fault


def _locality(text: str) -> tuple[Locality, int]:
    kind, sep, value = text.partition(":")
    try:
        if not sep:
            raise ValueError("missing ':'")
        return Locality.parse(kind), int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"locality {text!r} must look like TYPE:VALUE, e.g. geography:2 ({exc})") from None


def _lsid(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"LSID {text!r} is not a number (e.g. 16 or 0x10)"
                                         ) from None


def build_parser() -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = console.ArgumentParser(
        prog="flowcat",
        description="Talk to a flow overlay from the shell: create a flow, send lines of "
                    "text into it, or print what arrives on chosen bands.")
    common = argparse.ArgumentParser(add_help=False)
    add_connection_options(common)
    common.add_argument("--name", default="flowcat",
                        help="client name shown to the router (a capability's subject)")
    console.add_logging_options(common, default_level=None)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    c = sub.add_parser("create", parents=[common], help="allocate a new FlowID and print it")
    c.add_argument("--lsid", type=_lsid,
                   help="location service for the flow (default: the router's suggestion)")
    s = sub.add_parser("send", parents=[common],
                       help="send messages (arguments, or one per line of stdin)")
    s.add_argument("flow", help="FlowID, creator:lsid:local in hex")
    s.add_argument("messages", nargs="*", help="messages; none means read lines from stdin")
    s.add_argument("--band", type=int, default=DEFAULT_DATA_BAND,
                   help="band 16..127 (default %(default)s)")
    s.add_argument("--ttl", type=int, default=DEFAULT_TTL, help="router hops (default %(default)s)")
    s.add_argument("--locality", type=_locality, metavar="TYPE:VALUE",
                   help="locality budget, e.g. geography:2 (default: none)")
    ls = sub.add_parser("listen", parents=[common], help="print messages arriving on a flow")
    ls.add_argument("flow", help="FlowID, creator:lsid:local in hex")
    ls.add_argument("--bands", default="data",
                    help="band mask: e.g. 32-40,50 or data or fault,overflow (default "
                         "%(default)s); fault and overflow notices are printed decoded")
    ls.add_argument("--count", type=int, help="exit after this many messages")
    ls.add_argument("--timeout", type=float,
                    help="exit (code 1) if no message arrives for this many seconds")
    ls.add_argument("--json", action="store_true", help="one JSON object per message")
    _record_commands(sub)
    return p


def _record_commands(sub: Any) -> None:
    keyed = argparse.ArgumentParser(add_help=False)
    keyed.add_argument("--creator-key", required=True, metavar="FILE",
                       help="the flow creator's private key (PEM or raw, mode 0600)")
    keyed.add_argument("--out", "-o", required=True, metavar="FILE", help="file to write")
    c = sub.add_parser("issue-capability", parents=[keyed],
                       help="sign a capability file granting SUBJECT bands of a flow")
    c.add_argument("flow", help="FlowID in the key's name space, or 'all' for every flow of "
                                "the key")
    c.add_argument("subject", help="the holder's client name (--name), or '*' for anyone "
                                   "holding the file")
    c.add_argument("--join", default="", metavar="BANDS",
                   help="bands it may listen to, e.g. data or 32-40 (default none)")
    c.add_argument("--send", default="", metavar="BANDS",
                   help="bands it may send on (default none)")
    c.add_argument("--ttl", type=float, default=24 * 3600.0, metavar="SECONDS",
                   help="validity from now (default one day)")
    pol = sub.add_parser("issue-policy", parents=[keyed],
                         help="sign a policy file: joins and sends on a flow need a capability")
    pol.add_argument("flow", help="FlowID in the key's name space, or 'all'")
    pol.add_argument("--version", type=int, default=1,
                     help="policy version; a newer one replaces an older (default 1)")
    pol.add_argument("--revoke", action="append", default=[], metavar="SERIAL",
                     help="capability serial (hex) no longer accepted (repeatable)")
    pol.add_argument("--open-join", action="store_true", help="joins need no capability")
    pol.add_argument("--open-send", action="store_true", help="sends need no capability")
    show = sub.add_parser("show", help="print what a capability or policy file holds")
    show.add_argument("file")


def _records(args: argparse.Namespace) -> int:
    """The commands that only read or write credential files (no router involved)."""
    if args.command == "show":
        try:
            print(load_capability(args.file))
        except ValueError:
            pol = load_policy(args.file)
            print(f"policy v{pol.version} on "
                  + ("all flows of creator " + pol.flow_key[:8].hex() if pol.creator_wide
                     else str(FlowID.from_key(pol.flow_key)))
                  + f": joins {'need' if pol.require_join else 'need no'} capability, "
                  f"sends {'need' if pol.require_send else 'need no'} capability; revoked "
                  + (", ".join(f"{s:016x}" for s in sorted(pol.revoked)) or "none"))
        return 0
    from flowrouter.wire.capabilities import Capability, CreatorKey, Policy

    key = CreatorKey.load(args.creator_key)
    target: FlowID | int = key.creator_id if args.flow == "all" else FlowID.parse(args.flow)
    if args.command == "issue-capability":
        cap = Capability.issue(key, target, args.subject, join=args.join or 0,
                               send=args.send or 0, ttl=args.ttl)
        write_record_file(args.out, cap, [str(cap)])
        print(f"wrote {args.out}: {cap}")
        return 0
    pol = Policy.issue(key, target, version=args.version, require_join=not args.open_join,
                       require_send=not args.open_send,
                       revoked=[int(s, 16) for s in args.revoke])
    write_record_file(args.out, pol, [f"flow policy v{pol.version} for {args.flow}"])
    print(f"wrote {args.out}: policy v{pol.version} for {args.flow}")
    return 0


async def _main(args: argparse.Namespace) -> int:
    if args.command in ("issue-capability", "issue-policy", "show"):
        return _records(args)
    async with await connect(routers(args), name=args.name, **connect_kwargs(args)) as client:
        publish_policies(client, args)
        if args.command == "create":
            print(await client.create(args.lsid), flush=True)
            return 0
        if args.command == "send":
            await client.advertise(args.flow)
            lines = args.messages or (line.rstrip("\n") for line in sys.stdin)
            n = 0
            for text in lines:
                await client.send(args.flow, text.encode(), band=args.band,
                                  locality=args.locality, ttl=args.ttl)
                n += 1
            print(f"sent {n} message(s) on band {args.band}", file=sys.stderr)
            return 0
        listener = await client.listen(args.flow, args.bands)
        print(f"listening to {args.flow} bands {listener.mask} via {client.router_name}",
              file=sys.stderr, flush=True)
        n = 0
        while args.count is None or n < args.count:
            try:
                msg = await asyncio.wait_for(listener.get(), args.timeout)
            except TimeoutError:
                print(f"no message for {args.timeout}s", file=sys.stderr)
                return 1
            n += 1
            notice = None
            if msg.band in (BAND_FAULT, BAND_OVERFLOW):  # router faults and flowlib notices
                try:
                    notice = decode_fault(msg)
                except ValueError:
                    pass
            if notice is not None:
                text = f"{notice.kind.name} from {notice.origin}: {notice.detail}"
            else:
                text = msg.payload.decode("utf-8", "backslashreplace")
            if args.json:
                out = {"flow": str(msg.flow), "band": msg.band, "ttl": msg.ttl, "payload": text}
                if notice is not None:
                    out["notice"] = {"kind": notice.kind.name, "origin": notice.origin,
                                     "detail": notice.detail, "extra": notice.extra}
                print(json.dumps(out), flush=True)
            else:
                print(f"[{msg.band}] {text}", flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    """The ``flowcat`` console script (errors and exit codes: flowrouter.console)."""
    return console.run("flowcat", _run, argv, runtime_errors=(FlowError, ValueError))


def _run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console.setup_logging(args, node="flowcat")
    return asyncio.run(_main(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
