"""``flowcat``: create flows, send lines into them, print what arrives — from a shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from flowrouter.wire.bands import BAND_FAULT, BAND_OVERFLOW, DEFAULT_DATA_BAND
from flowrouter.wire.header import DEFAULT_TTL, Locality

from .client import connect
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flowcat",
        description="Talk to a flow overlay from the shell: create a flow, send lines of "
                    "text into it, or print what arrives on chosen bands.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--router", "-r", action="append", metavar="HOST:PORT",
                        help="router to connect to (repeatable: the first that answers is "
                             "used, the others are failed over to if it dies; default "
                             "127.0.0.1:7000)")
    common.add_argument("--name", default="flowcat", help="client name shown to the router")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    c = sub.add_parser("create", parents=[common], help="allocate a new FlowID and print it")
    c.add_argument("--lsid", type=lambda s: int(s, 0),
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
    return p


async def _main(args: argparse.Namespace) -> int:
    routers = args.router or ["127.0.0.1:7000"]
    async with await connect(routers, name=args.name) as client:
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
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_main(args))
    except (FlowError, ValueError) as exc:
        print(f"flowcat: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
