"""``flowdir``: the flow directory from a shell — serve, register, lookup, list, watch, remove.

Exit codes (also in ``flowdir --help``): 0 success; 1 nothing matched (``lookup``) or nothing
to remove (``remove``); 2 no router accepted us, or no directory member answered; 3 the
request was refused (members rejected the query, the router refused a join, ...); 64 bad
command-line usage; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily

import flowlib
from flowlib import ConnectError, FlowError, Locality
from flowlib.cliopts import add_connection_options, connect_kwargs, publish_policies, routers
from flowrouter import console
from flowrouter.monitor import Monitored, start_monitor

from . import cliargs as A
from . import protocol as P
from .client import (
    DEFAULT_MAX_RING,
    DEFAULT_SETTLE,
    DEFAULT_TTL,
    DEFAULT_WINDOW,
    Change,
    DirectoryClient,
    LookupResult,
    NoDirectoryMember,
    QueryRejected,
    Registration,
)
from .member import DirectoryMember, EntryStore

EXIT_OK, EXIT_NOTHING, EXIT_UNAVAILABLE, EXIT_REFUSED, EXIT_USAGE, EXIT_INTERRUPTED = \
    0, 1, 2, 3, 64, 130
DEFAULT_ROUTER = "127.0.0.1:7000"

log = logging.getLogger("flowdir")


class _Parser(console.ArgumentParser):
    """Exit code 2 means "directory unavailable" here (documented before the common console
    behaviour); bad usage keeps EX_USAGE (64) so scripts can tell a typo from an outage."""

    usage_exit_code = EXIT_USAGE


_EPILOG = """\
Patterns: the name is a glob (* any run, ? one character, \\ escapes); --flow, --kind,
--owner and --attr are exact or '*'. Entries are tuples (name, flow, kind, attrs...): kind
'flow' maps a name to a FlowID, kind 'ls' maps an LSID (e.g. 0x10) to its location
service's flow.

The directory is the flow 00000000d1ec7044:<LSID>:00000000; its LSID is the router's
suggested one unless --lsid is given.

exit codes: 0 ok; 1 nothing matched / nothing to remove; 2 no router answered or no
directory member answered; 3 refused (bad query, join refused); 64 usage; 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # On the main parser and (without defaults) on every subcommand, so options work in
    # either place: `flowdir --json lookup x` and `flowdir lookup x --json`.
    p = _Parser(prog="flowdir", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="The flow directory: names for flows, found by an expanding-ring "
                            "search over the overlay.", epilog=_EPILOG)
    for target, default in ((p, None), (common, argparse.SUPPRESS)):
        kw: dict[str, Any] = {} if default is None else {"default": default}
        # --router (repeatable: failover), --link-key, --encrypt, --capability, --policy
        add_connection_options(target, default_router=DEFAULT_ROUTER,
                               suppress_defaults=default is not None)
        target.add_argument("--lsid", type=A.lsid_arg, metavar="LSID",
                            help="which directory: the LSID of its flow (default: the "
                                 "router's suggested LSID)", **kw)
        target.add_argument("--json", action="store_true",
                            help="machine-readable output (one JSON document; watch prints "
                                 "one object per line)", **kw)
        target.add_argument("--name", metavar="NAME",
                            help="client name shown to the router, and the owner written "
                                 "into registered entries (default flowdir)", **kw)
        target.add_argument("--state-dir", metavar="DIR",
                            help="where the creator-ID file lives, for the reply flow "
                                 "(default $FLOWNET_STATE_DIR or ~/.local/state/flownet)",
                            **kw)
        target.add_argument("--connect-timeout", type=A.positive, metavar="SECONDS",
                            help="per-router connect and handshake timeout (default 5)",
                            **kw)
        target.add_argument("--verbose", "-v", action="count",
                            help="log more (-v info, -vv debug)", **kw)
        target.add_argument("--log-level", choices=console.LOG_LEVELS, **kw,
                            help="least severe messages logged (default warning)")
        target.add_argument("--log-file", metavar="FILE", **kw,
                            help="append log lines to FILE instead of stderr")
        target.add_argument("--log-format", choices=("text", "json"), **kw,
                            help="text lines or one JSON object per line")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common],  # type: ignore[list-item]
                              help=help_text, description=help_text,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=_EPILOG)

    def search_opts(s: argparse.ArgumentParser, expanding: bool) -> None:
        s.add_argument("--kind", type=A.kind, default="*",
                       help="only entries of this kind (flow, ls, ...; default any)")
        s.add_argument("--ring-type", type=A.ring_type, default=Locality.NONE,
                       metavar="TYPE",
                       help="what the rings measure: ttl (router hops, the default), "
                            "geography, delay or bandwidth (the links' locality modifiers)")
        s.add_argument("--max-ring", type=A.ring, default=DEFAULT_MAX_RING, metavar="N",
                       help="widest ring: the largest TTL or locality budget a query is "
                            "sent with (default %(default)s)")
        s.add_argument("--window", type=A.positive, default=DEFAULT_WINDOW if expanding
                       else 1.0, metavar="SECONDS",
                       help="how long each ring collects answers (default %(default)s)")
        if expanding:
            s.add_argument("--first-ring", type=A.ring, default=1, metavar="N",
                           help="first ring; the next ones double up to --max-ring "
                                "(default %(default)s)")
            s.add_argument("--settle", type=A.positive, default=DEFAULT_SETTLE,
                           metavar="SECONDS",
                           help="once a ring answered, how long to wait for its other "
                                "members (default %(default)s)")
            s.add_argument("--no-expand", action="store_true",
                           help="ask only the widest ring (every member within --max-ring)")

    s = add("serve", "run a directory member: store entries, answer queries, expire them")
    s.add_argument("--member-name", metavar="NAME",
                   help="name reported in answers (default member-XXXXXX@ROUTER)")
    s.add_argument("--sweep", type=A.positive, default=1.0, metavar="SECONDS",
                   help="how often expired entries are dropped (default %(default)s; "
                        "queries never return expired entries either way)")
    s.add_argument("--max-entries", type=int, default=100_000, metavar="N",
                   help="refuse registrations beyond this many entries (default %(default)s)")
    s.add_argument("--no-sync", action="store_true",
                   help="do not ask the other members for their entries at start-up")
    s.add_argument("--http", metavar="[HOST:]PORT",
                   help="serve /healthz, /status and /metrics here (a bare port: on "
                        "127.0.0.1; default: no HTTP)")
    s.add_argument("--duration", type=A.positive, metavar="SECONDS",
                   help="stop after this long (default: until interrupted)")

    r = add("register", "register NAME -> FLOWID for --ttl seconds (with --keep: refresh "
                        "until interrupted, then remove it)")
    r.add_argument("entry_name", metavar="NAME", type=A.name,
                   help="the name (no wildcards); for --kind ls an LSID such as 0x10")
    r.add_argument("flow", metavar="FLOWID", type=A.flow_arg,
                   help="the flow, creator:lsid:local in hex")
    r.add_argument("--ttl", type=A.positive, default=DEFAULT_TTL, metavar="SECONDS",
                   help="lifetime of the entry (default %(default)s)")
    r.add_argument("--kind", type=A.kind, default=P.KIND_FLOW,
                   help="what the name means: flow (default), ls, or your own word")
    r.add_argument("--attr", action="append", default=[], metavar="VALUE",
                   help="an attribute appended to the tuple (repeatable, in order)")
    r.add_argument("--keep", action="store_true",
                   help="keep running and re-register every --refresh seconds; remove the "
                        "entry on exit")
    r.add_argument("--refresh", type=A.positive, metavar="SECONDS",
                   help="refresh period with --keep (default ttl/3)")
    r.add_argument("--scope", type=A.scope, metavar="TTL|TYPE:VALUE",
                   help="only members this close store it, e.g. 1 (same router) or "
                        "geography:2 (default: every member)")
    r.add_argument("--no-confirm", action="store_true",
                   help="do not look the entry up afterwards to check a member stored it")
    r.add_argument("--window", type=A.positive, default=1.0, metavar="SECONDS",
                   help="how long to wait for the confirmation (default %(default)s)")
    r.add_argument("--duration", type=A.positive, metavar="SECONDS",
                   help="with --keep, stop after this long")

    lk = add("lookup", "find entries whose name matches PATTERN, nearest first; prints each "
                       "FlowID with the members that hold it")
    lk.add_argument("pattern", metavar="PATTERN", help="name glob, e.g. 'vnc-*'")
    lk.add_argument("--flow", type=A.flow_or_any, default="*", metavar="FLOWID",
                    help="exact flow, or * (default)")
    lk.add_argument("--owner", default="*", help="exact owner, or * (default)")
    lk.add_argument("--attr", action="append", default=[], metavar="VALUE",
                    help="attribute pattern by position: exact or * (repeatable)")
    search_opts(lk, expanding=True)

    ls = add("list", "list every entry held by the members within --max-ring")
    ls.add_argument("pattern", metavar="PATTERN", nargs="?", default="*",
                    help="name glob (default *)")
    search_opts(ls, expanding=False)

    w = add("watch", "print registrations, removals and expiries as they happen")
    w.add_argument("pattern", metavar="PATTERN", nargs="?", default="*",
                   help="name glob (default *)")
    w.add_argument("--kind", type=A.kind, default="*", help="only this kind (default any)")
    w.add_argument("--initial", action="store_true",
                   help="first print the entries already registered (as 'present')")
    w.add_argument("--count", type=int, metavar="N", help="exit after N changes")
    w.add_argument("--duration", type=A.positive, metavar="SECONDS",
                   help="exit after this long")

    rm = add("remove", "withdraw the entries named exactly NAME")
    rm.add_argument("entry_name", metavar="NAME", type=A.name, help="the exact name")
    rm.add_argument("--kind", type=A.kind, default="*", help="only this kind (default any)")
    rm.add_argument("--flow", type=A.flow_or_any, default="*", metavar="FLOWID",
                    help="only this flow (default any)")
    rm.add_argument("--no-confirm", action="store_true",
                    help="send the removal without first looking up what it removes")
    rm.add_argument("--window", type=A.positive, default=1.0, metavar="SECONDS",
                    help="how long to collect the members' answers (default %(default)s)")
    return p


# ----------------------------------------------------------------------------- output
def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(headers, widths)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"


def _result_rows(result: LookupResult) -> list[list[str]]:
    return [[m.entry.name, m.entry.kind, str(m.entry.flow), m.entry.owner or "-",
             ",".join(m.entry.attrs) or "-", _seconds(m.expires_in), ",".join(m.members),
             str(m.ring)] for m in result.matches]


_RESULT_HEADERS = ("NAME", "KIND", "FLOW", "OWNER", "ATTRS", "EXPIRES", "FOUND AT", "RING")


def _result_json(client: DirectoryClient, result: LookupResult) -> str:
    return json.dumps({"directory": str(client.flow), "pattern": result.pattern.to_json(),
                       "ring": result.ring, "rings": result.rings,
                       "members": sorted(result.members),
                       "matches": [m.to_json() for m in result.matches]}, indent=2)


def _print_result(args: argparse.Namespace, client: DirectoryClient,
                  result: LookupResult) -> None:
    if args.json:
        print(_result_json(client, result), flush=True)
        return
    if result.matches:
        print(_table(_RESULT_HEADERS, _result_rows(result)), flush=True)
    where = (f"found on ring {result.ring}" if result.ring is not None
             else f"rings tried: {', '.join(map(str, result.rings))}")
    print(f"{len(result.matches)} match(es) for {result.pattern} ({where}; "
          f"{len(result.members)} member(s) answered)", file=sys.stderr, flush=True)


def _change_line(change: Change) -> str:
    stamp = time.strftime("%H:%M:%S")
    flow = str(change.flow) if change.flow else "*"
    owner = change.entry.owner if change.entry and change.entry.owner else "-"
    ttl = _seconds(change.entry.ttl) if change.entry else "-"
    return f"{stamp}  {change.event:<8} {change.name}  {change.kind}  {flow}  {owner}  {ttl}"


# ----------------------------------------------------------------------------- commands
def _http_address(text: str | None) -> str | None:
    return None if not text else f"127.0.0.1:{text}" if text.isdigit() else text


def _member_source(member: DirectoryMember) -> Monitored:
    """The monitoring view of a directory member (flowrouter.monitor)."""
    def status() -> dict[str, Any]:
        return {"member": member.name, "flow": str(member.flow), "lsid": member.lsid,
                "router": member.client.address, "connected": member.client.connected,
                "entries": len(member.store), "synced": member.synced.is_set()}

    def metrics() -> Any:
        yield GaugeMetricFamily("flownet_directory_entries", "entries held by this member",
                                value=len(member.store))
        yield GaugeMetricFamily("flownet_directory_router_connected",
                                "1 while the member's router link is up",
                                value=1 if member.client.connected else 0)

    return Monitored(kind="directory", name=member.name, status=status, metrics=metrics,
                     health=lambda: (member.client.connected, "ok" if member.client.connected
                                     else "router link down"))


async def _serve(args: argparse.Namespace, addresses: list[str]) -> int:
    """Run a member; if its router goes away (or restarts), reconnect (trying every
    --router) with back-off and rejoin, keeping the entries: a router restart should not
    empty the directory. Only the first connection's failure is fatal."""
    store = EntryStore(max_entries=args.max_entries)
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + args.duration if args.duration else None
    backoff = 0.2
    first = True
    while True:
        try:
            member = await DirectoryMember.connect(
                addresses, name=args.member_name, lsid=args.lsid, state_dir=args.state_dir,
                timeout=args.connect_timeout or 5.0, store=store, sweep_interval=args.sweep,
                sync=not args.no_sync, connect_options=connect_kwargs(args))
            publish_policies(member.client, args)
        except FlowError as exc:  # ConnectError, or a router that is up but not ready yet
            if first:
                raise
            log.info("reconnecting to the directory failed (%s); retrying in %.1fs", exc,
                     backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
            continue
        first, backoff = False, 0.2
        args.member_name = member.name  # the same name after a reconnect
        http = await start_monitor(_member_source(member), _http_address(args.http))
        print(f"flowdir: member {member.name} serving directory {member.flow} via router "
              f"{member.client.router_name} ({member.client.address})", file=sys.stderr,
              flush=True)
        try:
            left = None if stop_at is None else max(0.0, stop_at - loop.time())
            try:
                await asyncio.wait_for(member.wait_closed(), left)
            except TimeoutError:
                return EXIT_OK
        finally:
            if http is not None:
                await http.stop()
            await member.stop()
        print(f"flowdir: lost router {member.client.address} "
              f"({member.client.close_reason}); reconnecting", file=sys.stderr, flush=True)


async def _register(args: argparse.Namespace, client: DirectoryClient) -> int:
    reg = await client.register(args.entry_name, args.flow, args.ttl, kind=args.kind,
                                attrs=args.attr, keep=args.keep, refresh=args.refresh,
                                scope=args.scope)
    try:
        return await _confirm_and_keep(args, client, reg)
    finally:
        # --keep promises the entry goes when we go, however we go (Ctrl-C, SIGTERM, error)
        if args.keep:
            await asyncio.shield(reg.cancel(remove=True))


async def _confirm_and_keep(args: argparse.Namespace, client: DirectoryClient,
                            reg: Registration) -> int:
    entry = reg.entry
    members: list[str] = []
    problem = ""
    if not args.no_confirm:
        reach = P.Reach.of(args.scope)
        ring_type, ring = (reach.locality if reach.locality else (Locality.NONE, reach.ttl))
        try:
            result = await client.lookup(P.Pattern(_escape(entry.name), str(entry.flow),
                                                   entry.kind),
                                         ring_type=ring_type, rings=[ring],
                                         window=args.window)
            members = sorted({m for match in result.matches for m in match.members})
            if not members:
                problem = (f"members answered ({', '.join(sorted(result.members))}) but "
                           f"none stored {entry.name!r}; is its --scope too small?")
        except NoDirectoryMember as exc:
            problem = f"sent the registration, but {exc}; is a member running (flowdir serve)?"
    if problem and not args.keep:
        print(f"flowdir: {problem}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        out = entry.to_json()
        out.update(stored_by=members, keep=args.keep)
        print(json.dumps(out, indent=2), flush=True)
    else:
        where = f" (stored by {', '.join(members)})" if members else ""
        print(f"registered {entry.name} -> {entry.flow} kind {entry.kind} for "
              f"{_seconds(entry.ttl)}{where}", flush=True)
    if not args.keep:
        return EXIT_OK
    if problem:  # members that start later learn the entry from the next refresh
        print(f"flowdir: warning: {problem} Refreshing anyway.", file=sys.stderr)
    print(f"flowdir: refreshing every {_seconds(reg.refresh or 0)}; interrupt to remove it",
          file=sys.stderr, flush=True)
    if args.duration:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reg.wait(), args.duration)
    else:
        await reg.wait()
    if reg.error is not None:
        print(f"flowdir: stopped refreshing: {reg.error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK


def _escape(name: str) -> str:
    """A registered name as a pattern that matches only itself (names contain no wildcards,
    but be exact anyway)."""
    return "".join("\\" + c if c in "*?\\" else c for c in name)


async def _lookup(args: argparse.Namespace, client: DirectoryClient) -> int:
    flow = args.flow
    result = await client.lookup(args.pattern, kind=args.kind, flow=flow, owner=args.owner,
                                 attrs=args.attr, ring_type=args.ring_type,
                                 first_ring=min(args.first_ring, args.max_ring),
                                 max_ring=args.max_ring, expanding=not args.no_expand,
                                 window=args.window, settle=args.settle)
    _print_result(args, client, result)
    return EXIT_OK if result.matches else EXIT_NOTHING


async def _list(args: argparse.Namespace, client: DirectoryClient) -> int:
    result = await client.list(args.pattern, kind=args.kind, ring_type=args.ring_type,
                               max_ring=args.max_ring, window=args.window)
    _print_result(args, client, result)
    return EXIT_OK


async def _watch(args: argparse.Namespace, client: DirectoryClient) -> int:
    seen = 0
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + args.duration if args.duration else None
    async with client.watch(args.pattern, kind=args.kind, initial=args.initial) as watcher:
        print(f"flowdir: watching {args.pattern} on directory {client.flow} via router "
              f"{client.flow_client.router_name}", file=sys.stderr, flush=True)
        while args.count is None or seen < args.count:
            left = None if stop_at is None else stop_at - loop.time()
            if left is not None and left <= 0:
                break
            try:
                change = await asyncio.wait_for(anext(watcher), left)
            except (TimeoutError, StopAsyncIteration):
                break
            seen += 1
            if args.json:
                print(json.dumps(change.to_json()), flush=True)
            else:
                print(_change_line(change), flush=True)
    if client.flow_client.closed:
        print(f"flowdir: {client.flow_client.close_reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK


async def _remove(args: argparse.Namespace, client: DirectoryClient) -> int:
    flow = args.flow
    found: list[dict[str, Any]] = []
    if not args.no_confirm:
        result = await client.list(P.Pattern(_escape(args.entry_name), flow, args.kind),
                                   window=args.window)
        if not result.matches:
            print(f"flowdir: nothing is registered under {args.entry_name!r}"
                  f"{'' if args.kind == '*' else ' of kind ' + args.kind}"
                  f"{'' if flow == '*' else ' for flow ' + flow} "
                  f"({len(result.members)} member(s) answered)", file=sys.stderr)
            if args.json:
                print(json.dumps({"removed": []}), flush=True)
            return EXIT_NOTHING
        found = [m.to_json() for m in result.matches]
    await client.remove(args.entry_name, kind=args.kind, flow=flow)
    if args.json:
        print(json.dumps({"removed": found}, indent=2), flush=True)
    elif found:
        for m in found:
            print(f"removed {m['name']} -> {m['flow']} kind {m['kind']} "
                  f"(was at {', '.join(m['members'])})", flush=True)
    else:
        print(f"removal of {args.entry_name!r} sent", flush=True)
    return EXIT_OK


async def _run(args: argparse.Namespace) -> int:
    addresses = routers(args, DEFAULT_ROUTER)
    if args.command == "serve":
        return await _serve(args, addresses)
    client = await DirectoryClient.connect(addresses, name=args.name or "flowdir",
                                           lsid=args.lsid, state_dir=args.state_dir,
                                           timeout=args.connect_timeout or 5.0,
                                           connect_options=connect_kwargs(args))
    try:
        publish_policies(client.flow_client, args)
        handler = {"register": _register, "lookup": _lookup, "list": _list,
                   "watch": _watch, "remove": _remove}[args.command]
        return await handler(args, client)
    finally:
        await client.close()


async def _run_cancellable(args: argparse.Namespace) -> int:
    """Run the command; SIGTERM (main thread only) stops it like Ctrl-C, so ``--keep``
    still removes its entry and ``serve`` leaves the flow politely."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    installed = False
    if task is not None and threading.current_thread() is threading.main_thread():
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
            installed = True
    try:
        return await _run(args)
    except asyncio.CancelledError:
        return EXIT_INTERRUPTED
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``flowdir`` (console script ``flowdir = "flowdir.cli:main"``)."""
    return console.run("flowdir", _main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (64)
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    for key, default in (("router", None), ("lsid", None), ("json", False), ("name", None),
                         ("state_dir", None), ("connect_timeout", None), ("verbose", 0),
                         ("link_key", None), ("encrypt", False), ("capability", None),
                         ("policy", None),
                         ("log_level", None), ("log_file", None), ("log_format", None)):
        if not hasattr(args, key):
            setattr(args, key, default)
    console.setup_logging(args, node="flowdir", level=getattr(args, "log_level", None))
    try:
        return asyncio.run(_run_cancellable(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ConnectError as exc:
        print(f"flowdir: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except NoDirectoryMember as exc:
        print(f"flowdir: {exc}; is a directory member running (flowdir serve)?",
              file=sys.stderr)
        return EXIT_UNAVAILABLE
    except QueryRejected as exc:
        print(f"flowdir: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except flowlib.ConnectionLost as exc:
        print(f"flowdir: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (FlowError, ValueError) as exc:
        print(f"flowdir: {exc}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
