"""The ``flowrouter`` command's router tools: run a router, query one, check a config, ctl,
keygen, the simulator.

The console script itself is ``flownet.cli.main``: it adds ``demo`` and ``up``, which run
flowlib applications over routers, through :class:`Command` and the ``extra`` arguments of
:func:`build_parser` and :func:`main` (flowrouter never imports flowlib or anything above it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from flowrouter import console
from flowrouter.net.config import ConfigError, NodeConfig, PeerConfig
from flowrouter.net.configfile import config_from_dict, load_config

log = logging.getLogger("flowrouter")
#: rows of flows (and of links) ``flowrouter status`` shows in its tables, and asks the
#: router for when no --limit is given
TABLE_ROWS = 200

RUN_EPILOG = """\
examples:
  flowrouter run --config r1.toml
  flowrouter run --name r1 --listen 127.0.0.1:7001 --core-lsid 0x10 --control 127.0.0.1:7101 \\
                 --accept-router r2@127.0.0.1
  flowrouter run --name r2 --listen 127.0.0.1:7002 --peer r1=127.0.0.1:7001

Without link keys a router accepts router links only from routers it dials, --accept-router
NAME@HOST entries and [[peer]]s; any other router is refused (and keeps re-dialling, backing
off to every reconnect_max seconds).

Flags given on the command line override the same settings from --config.
The config file format is documented in the README ("Configuring a router").
Locking a router down (README "Security"): [link_auth] keys, encrypt, rekey_records and
rekey_seconds; [quota] limits per principal (flows, joins_per_second, join_burst,
connections_per_host, flow_notices); [router] control_token, then commands are sent with
'flowrouter ctl --token-file FILE'.

signals (docs/operations.md):
  SIGHUP   reload --config (and these flags) live; a bad file keeps the running config
           and the log says why; the log lists what changed ('flowrouter ctl reload' too)
  SIGUSR1  reopen --log-file (after logrotate moved it)
  SIGUSR2  drain: stop accepting, tell applications to move to another router, exit when
           they have gone or after 30 s ('flowrouter ctl drain timeout=S' too)
  SIGTERM  stop now (exit 0); Ctrl-C: stop (exit 130)
health: /livez (alive), /readyz and /healthz (listening, and a configured peer up)
"""


def parse_peer(text: str) -> PeerConfig:
    """NAME=HOST:PORT[/udp] or HOST:PORT[/udp]."""
    name, sep, rest = text.partition("=")
    if not sep:
        name, rest = "", text
    if "@" in rest and not sep:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write a named peer as NAME=HOST:PORT (e.g. r2=127.0.0.1:7002)")
    if sep and not name:
        raise argparse.ArgumentTypeError(f"{text!r}: the peer name before '=' is empty")
    transport = "tcp"
    if rest.endswith(("/udp", "/tcp")):
        rest, transport = rest[:-4], rest[-3:]
    try:
        return PeerConfig(address=rest, name=name or None, transport=transport)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (use 16 or 0x10)") from None


def parse_route(text: str) -> tuple[int, str]:
    lsid, sep, peer = text.partition("=")
    if not sep or not peer:
        raise argparse.ArgumentTypeError(f"route {text!r} must look like LSID=PEERNAME")
    return parse_int(lsid), peer


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand a package above flowrouter adds to ``flowrouter`` (flownet adds ``demo``
    and ``up``): *add_parser* adds its subparser to the subparsers action it is given, *run*
    runs it with the parsed arguments and returns the exit code."""

    name: str
    add_parser: Callable[[Any], None]
    run: Callable[[argparse.Namespace], int]


def build_parser(extra: Sequence[Command] = ()) -> argparse.ArgumentParser:
    """The parser of ``flowrouter``, with the subcommands of *extra* after check-config."""
    p = console.ArgumentParser(
        prog="flowrouter",
        description="Flow overlay router: routes named multicast flows between applications "
                    "(flowlib) across an overlay of routers.")
    console.add_logging_options(p, default_level=None)
    p.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=None,
                   help="run on uvloop's event loop (libuv, compiled: the default when uvloop "
                        "is installed, as it is with flownet on CPython/Linux and macOS); "
                        "--no-uvloop or FLOWNET_UVLOOP=0 runs on asyncio's own")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser(
        "run", help="run one router until interrupted",
        description="Run one router. It listens for routers and applications, dials its "
                    "peers (and re-dials them when links drop), forwards flow messages and "
                    "answers status queries on its control address.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", "-c", metavar="FILE", help="TOML config file")
    console.add_logging_options(run, default_level="info", again=True)
    run.add_argument("--name", help="router name (unique in the overlay; shown to peers)")
    run.add_argument("--listen", metavar="HOST:PORT",
                     help="TCP address for routers and applications (default 127.0.0.1:7000)")
    run.add_argument("--udp", metavar="HOST:PORT", help="also accept UDP links on this address")
    run.add_argument("--app-udp", metavar="HOST:PORT",
                     help="accept applications' datagram links on this UDP address (flowlib "
                          "reaches it as udp://HOST:PORT)")
    run.add_argument("--control", metavar="HOST:PORT",
                     help="status/control interface address (for 'flowrouter status')")
    run.add_argument("--http", metavar="HOST:PORT",
                     help="HTTP monitoring: /healthz, /status, /metrics (default: 127.0.0.1 on "
                          "the listen port + 1000; 'off' for none)")
    run.add_argument("--peer", action="append", type=parse_peer, default=[],
                     metavar="[NAME=]HOST:PORT[/udp]",
                     help="a router to dial and keep connected (repeatable)")
    run.add_argument("--accept-router", action="append", default=[], metavar="NAME@HOST",
                     help="accept a router link from this name and host without link keys "
                          "(repeatable; peers given with --peer are accepted anyway)")
    run.add_argument("--core-lsid", action="append", type=parse_int, default=[], metavar="LSID",
                     help="make this router the core (location service) for LSID (repeatable)")
    run.add_argument("--default-lsid", type=parse_int, metavar="LSID",
                     help="LSID suggested to applications for new flows")
    run.add_argument("--route", action="append", type=parse_route, default=[],
                     metavar="LSID=PEER", help="static route toward an LSID's core "
                                               "(normally learned automatically)")
    run.add_argument("--default-route", metavar="PEER",
                     help="neighbour for LSIDs with no other route")
    run.add_argument("--max-payload", type=int, metavar="BYTES",
                     help="largest payload accepted on a link (default 65536)")
    run.add_argument("--epoch", type=float, metavar="SECONDS",
                     help="garbage-collection epoch length (default 5)")
    run.add_argument("--trace-dir", metavar="DIR",
                     help="write trace records (input of 'flowtrace analyze') to "
                          "DIR/<name>.trace.jsonl")
    run.add_argument("--trace-sample", type=float, metavar="FRACTION",
                     help="fraction of forwarding decisions traced (default 0.01)")

    st = sub.add_parser("status", help="show a running router's links, flows and counters",
                        description="Ask a running router (its --control address) for its "
                                    "link table, LS routes, flow table, quotas per principal, "
                                    "tripped limits (alerts), link security (rekeying) and "
                                    "counters.")
    st.add_argument("--control", required=True, metavar="HOST:PORT",
                    help="the router's control address")
    st.add_argument("--json", action="store_true", help="print the raw JSON")
    st.add_argument("--sort", metavar="FIELD",
                    help="order links and flows by FIELD, numbers largest first (-FIELD: "
                         "reversed): links by bytes_in, bytes_out, rx, tx, flows, rtt_ms, "
                         "peer ...; flows by bytes, frames, members, age, flow ...")
    st.add_argument("--limit", type=int, metavar="N",
                    help="show at most N links and N flows (the router says how many there "
                         f"are; default {TABLE_ROWS} for the tables, none with --json: every "
                         "row costs the router about 11 us, made 1,024 at a time while it "
                         "forwards, so 10^6 flows take some 15 s: raise --timeout)")
    st.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                    help="give up when the router does not answer within this (default 5)")

    chk = sub.add_parser("check-config", help="validate a router config file and exit",
                         description="Load and check a router TOML config; print what it "
                                     "would run or exactly what is wrong.")
    chk.add_argument("config", metavar="FILE")

    for command in extra:
        command.add_parser(sub)

    from flowrouter.tools import ctl, keygen

    ctl.add_parser(sub)
    keygen.add_parser(sub)

    sim = sub.add_parser("sim", help="run a topology in the deterministic simulator",
                         add_help=False)
    sim.add_argument("args", nargs=argparse.REMAINDER)
    return p


def _config_from_args(args: argparse.Namespace) -> NodeConfig:
    base: dict[str, Any] = {}
    if args.config:
        cfg = load_config(args.config)
    else:
        if not args.name:
            raise ConfigError("give --config FILE or at least --name (see flowrouter run -h)")
        cfg = config_from_dict({"router": {"name": args.name}})
    overrides = {
        "name": args.name, "listen": args.listen, "udp": args.udp, "app_udp": args.app_udp,
        "control": args.control, "http": args.http,
        "default_lsid": args.default_lsid, "default_route": args.default_route,
        "max_payload": args.max_payload, "epoch": args.epoch,
        "trace_dir": args.trace_dir, "trace_sample": args.trace_sample,
    }
    for key, value in overrides.items():
        if value is not None:
            base[key] = value
    if args.core_lsid:
        base["core_lsids"] = frozenset(cfg.core_lsids) | frozenset(args.core_lsid)
    if args.peer:
        base["peers"] = [*cfg.peers, *args.peer]
    if args.accept_router:
        base["accept_routers"] = [*cfg.accept_routers, *args.accept_router]
    if args.route:
        base["routes"] = {**cfg.routes, **dict(args.route)}
    if not base:
        return cfg
    fields = {f: getattr(cfg, f) for f in NodeConfig.__slots__}  # type: ignore[attr-defined]
    fields.update(base)
    return NodeConfig(**fields)


async def run_node(cfg: NodeConfig, kind: str = "router",
                   source: Callable[[], NodeConfig] | None = None) -> int:
    """Run a router (with its HTTP monitoring) until SIGTERM (exit code 0), Ctrl-C (130) or
    the end of a drain (0), then stop it cleanly. SIGHUP reloads the configuration from
    *source* (the config file and flags read again), SIGUSR1 reopens the log file (after
    logrotate), SIGUSR2 drains (flowrouter.net.operate)."""
    from flowrouter.monitor import start_monitor
    from flowrouter.net.observe import router_source
    from flowrouter.net.runtime import RouterNode

    node = RouterNode(cfg)
    node.ops.source = source
    stop = asyncio.Event()
    got: list[int] = []

    def on_signal(sig: int) -> None:
        got.append(sig)
        stop.set()

    def on_reopen() -> None:
        n = console.reopen_log_files()
        log.info("router %s: SIGUSR1: %s", node.config.name,
                 f"reopened {n} log file(s)" if n else "no log file to reopen (stderr)")

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    loop.add_signal_handler(signal.SIGHUP, node.ops.reload_logged)
    loop.add_signal_handler(signal.SIGUSR1, on_reopen)
    loop.add_signal_handler(signal.SIGUSR2, node.ops.drain)
    await node.start()
    http = await start_monitor(router_source(node, kind), cfg.http_address(),
                               request_timeout=cfg.limits.http_idle,
                               max_connections=cfg.limits.http_connections, check=node.gate)
    log.info("router %s running (core for %s); Ctrl-C to stop", cfg.name,
             ", ".join(f"{x:#x}" for x in sorted(cfg.core_lsids)) or "no LSID")
    drained = asyncio.ensure_future(node.ops.wait_drained())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([drained, stopped], return_when=asyncio.FIRST_COMPLETED)
    for task in (drained, stopped):
        task.cancel()
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        loop.remove_signal_handler(sig)
    log.info("router %s stopping", cfg.name)
    if http is not None:
        await http.stop()
    await node.stop()
    return console.EXIT_INTERRUPTED if got[:1] == [signal.SIGINT] else 0


def format_status(st: dict[str, Any]) -> str:
    lines = [f"router {st['name']}  node {st['node_id']}  epoch {st['epoch']}  "
             f"flows {st['flow_count']}  listen {st.get('listen')}"]
    fast = st.get("fast_path")
    if fast:
        if fast.get("engine"):
            lines.append(f"forwarding: fast path, {fast['engine']} ({fast['mirrored_flows']} "
                         f"flows mirrored, {fast['slow']} frames left to the core)")
            if fast.get("routing_classes_refused"):
                lines.append(f"  routing classes full ({fast['routing_classes_max']}): "
                             f"{fast['routing_classes_refused']} flows decided one by one")
        else:
            lines.append(f"forwarding: {fast.get('why')}")
    if st.get("event_loop"):
        lines.append(f"event loop: {st['event_loop']}")
    udp = st.get("udp_io")
    if udp:
        on = {True: "on", False: "off"}
        lines.append(f"udp: {udp['io']}; bundles up to {udp.get('bundle')} bytes "
                     f"({udp.get('links_bundling', 0)} links), GSO "
                     f"{on[bool(udp.get('gso'))]}, GRO {on[bool(udp.get('gro'))]}; "
                     f"datagrams in {udp.get('datagrams_in', 0)} out "
                     f"{udp.get('datagrams_out', 0)}; dropped by the kernel (receive buffer "
                     f"{udp['rcvbuf']} bytes) {udp.get('kernel_drops', 0)}"
                     + (f"; buffers capped: {udp['buffers_capped']}"
                        if udp.get("buffers_capped") else ""))
    lines.append("")
    lines.append("LINKS")
    lines.append(f"  {'id':>4} {'peer':<16} {'role':<9} {'state':<9} {'via':<4} "
                 f"{'address':<22} {'flows':>5} {'rx':>9} {'tx':>9} {'bytes in':>12} "
                 f"{'bytes out':>12} {'rtt ms':>8}")
    for lk in st["links"]:
        rtt = lk.get("rtt_ms")
        lines.append(f"  {lk['id']:>4} {lk['peer']:<16.16} {lk['role']:<9} {lk['state']:<9} "
                     f"{lk['transport']:<4} {lk['address']:<22} {lk['flows']:>5} "
                     f"{lk['rx']:>9} {lk['tx']:>9} {lk.get('bytes_in', 0):>12} "
                     f"{lk.get('bytes_out', 0):>12} "
                     f"{'-' if rtt is None else format(rtt, '.3f'):>8}")
    if "links_total" in st:
        lines.append(f"  ({len(st['links'])} of {st['links_total']} links)")
    peers_down = [p for p in st.get("peers", []) if not p["up"]]
    if peers_down:
        lines += ["", "CONFIGURED PEERS DOWN"]
        for p in peers_down:
            lines.append(f"  {p['peer'] or '-':<16.16} {p['address']:<22} "
                         f"{'blocked  ' if p.get('blocked') else ''}{p['last_error']} "
                         f"({p.get('attempts', 0)} failed attempts, next in up to "
                         f"{p.get('backoff', 0):g}s)")
    lines.append("")
    lines.append("LOCATION SERVICE ROUTES")
    for r in st["ls_routes"]:
        lines.append(f"  {r['lsid']:<10} {r['source']:<8} link {r['link']}  distance "
                     f"{r['distance']}")
    lines.append("")
    lines.append("FLOWS")
    for f in st["flows"][:TABLE_ROWS]:
        down = ", ".join(f"{k}:{v}" for k, v in f["downstream"].items()) or "-"
        lines.append(f"  {f['flow']}  up {f['upstream']}  agg {f['aggregate']}  "
                     f"down {down}{'' if f['joined'] else '  (joining)'}")
    if len(st["flows"]) > TABLE_ROWS:
        lines.append(f"  ... {len(st['flows']) - TABLE_ROWS} more (use --json, or "
                     "--sort/--limit)")
    if "flows_total" in st:
        lines.append(f"  ({len(st['flows'])} of {st['flows_total']} flows)")
    lines += _format_limits(st)
    auth = st.get("link_auth")
    if auth:
        lines += ["", f"LINK SECURITY: key {auth['key_id']} (of {len(auth['key_ids'])}), "
                  f"{'encrypt' if auth['encrypt'] else 'authenticate only'}"
                  f"{', applications must authenticate' if auth['require_endpoints'] else ''}; "
                  f"sealed links rekey every {auth['rekey_records']} records or "
                  f"{auth['rekey_seconds']:g} s"]
        for lid, c in auth["sealed_links"].items():
            lines.append(f"  link {lid:>4}  records sent {c['records_sent']}  key generation "
                         f"sent {c['tx_generation']} received {c['rx_generation']}")
    lines.append("")
    lines.append("COUNTERS")
    for k, v in st["counters"].items():
        lines.append(f"  {k:<32} {v}")
    return "\n".join(lines)


def _format_limits(st: dict[str, Any]) -> list[str]:
    """The QUOTA and ALERTS sections of ``flowrouter status``: the limits per principal, each
    principal's use, and the newest tripped limits (a flow's members also got those with a
    flow as a fault on band 17)."""
    lines: list[str] = []
    quota = st.get("quota")
    if quota:
        lim = quota["limits"]
        lines += ["", f"QUOTA per principal: {lim['flows']} flows, {lim['joins_per_second']:g} "
                  f"joins/s (burst {lim['join_burst']}), {lim['connections_per_host']} "
                  f"connections per host; {lim.get('flow_notices', '-')} flow notices per "
                  "limit and alert interval"]
        for name, use in quota["principals"].items():
            lines.append(f"  {name:<40} links {use['links']:>4}  flows {use.get('flows', '-')}")
    alerts = st.get("alerts") or []
    lines += ["", f"ALERTS ({len(alerts)} kept, newest last; those with a flow also went to "
              "its members on band 17)"]
    for a in alerts[-20:]:
        lines.append(f"  {a['t']:>10.3f}s  {a['kind']:<22} {a['flow'] or '-'}  {a['detail']}")
    return lines


def _use_uvloop(wanted: bool | None) -> str:
    """Run on uvloop unless told not to (--no-uvloop, FLOWNET_UVLOOP=0) or it is missing: its
    compiled event loop takes a router's per-read overhead off the Python interpreter (round
    trip through one router 137 -> 105-121 us, below nats-server's; BENCHMARKS.md). Returns
    which loop runs, and why when it is not the one asked for (a router logs it)."""
    import os

    if wanted is None:
        wanted = os.environ.get("FLOWNET_UVLOOP", "1") != "0"
    if not wanted:
        return "asyncio (uvloop turned off)"
    try:
        import uvloop
    except ImportError:
        return "asyncio (uvloop is not installed: pip install uvloop)"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return f"uvloop {uvloop.__version__}"


# Default log level per command: a daemon tells what it does, a one-shot tool only warns.
_DEFAULT_LEVEL = {"run": "info"}


def main(argv: list[str] | None = None, extra: Sequence[Command] = ()) -> int:
    """The ``flowrouter`` command with the subcommands of *extra*: one-line errors and exit
    codes (flowrouter.console). The console script is ``flownet.cli.main``, which passes
    ``demo`` and ``up``."""
    return console.run("flowrouter", partial(_main, extra=extra), argv,
                       usage_errors=(ConfigError,), runtime_errors=(ConnectionError,))


def _main(argv: list[str] | None = None, extra: Sequence[Command] = ()) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:  # the simulator has its own parser (and --help)
        from flowrouter.testbed.sim import cli_main

        return int(cli_main(argv[1:]) or 0)
    args = build_parser(extra).parse_args(argv)
    args.verbose = (args.verbose or 0) + (getattr(args, "sub_verbose", 0) or 0)
    console.setup_logging(args, node="flowrouter",
                          default_level=_DEFAULT_LEVEL.get(args.command, "warning"))
    previous = asyncio.get_event_loop_policy()
    event_loop = _use_uvloop(args.uvloop)
    try:
        for command in extra:
            if args.command == command.name:
                return command.run(args)
        return _command(args, event_loop)
    finally:  # called in-process (tests, tools): leave the caller's event loop as it was
        asyncio.set_event_loop_policy(previous)


def _command(args: argparse.Namespace, event_loop: str) -> int:
    if args.command == "run":
        cfg = _config_from_args(args)
        console.set_node(cfg.name)
        log.info("event loop: %s", event_loop)
        try:
            return asyncio.run(run_node(cfg, source=lambda: _config_from_args(args)))
        except OSError as exc:
            raise console.RuntimeFailure(f"cannot start router {cfg.name}: {exc}") from None
    if args.command == "status":
        from flowrouter.net.runtime import query_control

        view = {k: v for k, v in (("sort", args.sort), ("limit", args.limit)) if v is not None}
        if not args.json and args.limit is None:  # no more rows than the tables show: the
            view["limit"] = TABLE_ROWS  # router renders only those (flowrouter.net.flowviews)
        reply = asyncio.run(query_control(args.control, timeout=args.timeout, **view))
        print(json.dumps(reply["status"], indent=2) if args.json
              else format_status(reply["status"]))
        return 0
    if args.command == "check-config":
        cfg = load_config(args.config)
        listen = ", ".join([*([cfg.listen] if cfg.listen else []), *cfg.extra_listen,
                            *(f"{a} (routers)" for a in cfg.router_listen),
                            *(f"{a} (applications)" for a in cfg.app_listen)]) or "none"
        print(f"{args.config}: OK: router {cfg.name}, listen {listen}, "
              f"{len(cfg.peers)} peer(s), core for "
              f"{[hex(x) for x in sorted(cfg.core_lsids)] or 'no LSID'}")
        return 0
    if args.command == "ctl":
        from flowrouter.tools import ctl

        return ctl.run(args)
    if args.command == "keygen":
        from flowrouter.tools import keygen

        return keygen.run(args)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
