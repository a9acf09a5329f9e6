"""The ``flowrouter`` console script: :mod:`flowrouter.tools.cli`'s commands plus ``demo`` and
``up``, the two that run flowlib applications over routers.

Both are :class:`flowrouter.tools.cli.Command` values handed to that module's parser and
dispatcher, so ``flowrouter --help`` lists every command in one place and the common options
(``--log-level``, ``--uvloop``) and exit codes apply to these two as to the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import asdict
from typing import Any

from flowrouter import console
from flowrouter.testbed import netns
from flowrouter.testbed.launcher import Launcher, summarize
from flowrouter.testbed.topology import TopologyError, load
from flowrouter.tools import cli

from .demo import run_demo
from .traffic import Traffic


def add_demo_parser(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="start a local 3-router overlay and carry real traffic through it",
        description="Starts three routers on loopback (r1 - r2 - r3, r3 the core), one "
                    "sender on r1 and two receivers on r2 and r3 with different band "
                    "masks, sends messages on several bands and shows who got what. Exits "
                    "0 when every receiver got exactly its bands.")
    demo.add_argument("--count", type=int, default=5, help="messages per band (default 5)")
    demo.add_argument("-v", "--verbose", action="count", default=0, dest="sub_verbose",
                      help="also show the routers' log lines (-vv: debug)")


def demo(args: argparse.Namespace) -> int:
    return asyncio.run(run_demo(args.count))


def add_up_parser(sub: Any) -> None:
    up = sub.add_parser(
        "up", help="bring a whole topology up on this machine, with its fault schedule",
        description="Start one router process per router of TOPOLOGY on loopback (the "
                    "topology's ports), connect its endpoints as applications that join one "
                    "shared flow and send at --rate, apply the fault schedule of --scenario "
                    "on time, print a live view of links and traffic, and shut everything "
                    "down cleanly at the end of --duration or on Ctrl-C. The routers die "
                    "with this launcher whatever kills it (SIGKILL included).")
    up.add_argument("topology", metavar="TOPOLOGY", help="topology TOML file (topologies/)")
    up.add_argument("--scenario", help="named fault scenario from the file")
    up.add_argument("--duration", type=float, help="seconds to run (default: the scenario's "
                                                   "or the file's duration, else 30)")
    up.add_argument("--rate", type=float, default=1.0,
                    help="messages per second each endpoint sends (default 1; 0: none)")
    up.add_argument("--size", type=int, default=200, help="message size in bytes (default 200)")
    up.add_argument("--base-port", type=int, help="shift the topology's ports to start here")
    up.add_argument("--workdir", help="where router configs and logs go (default: a temp dir)")
    up.add_argument("--router-log-level", default="info", choices=console.LOG_LEVELS,
                    help="level of the router logs written to the workdir (default info)")
    up.add_argument("--quiet", action="store_true", help="no live view, summary only")
    up.add_argument("--web", metavar="[HOST:]PORT",
                    help="serve a live dashboard of the overlay here (a bare port: on "
                         "127.0.0.1): graph, link states and rates, fault events, flow tree")
    up.add_argument("--json", action="store_true", help="print the report as JSON")
    up.add_argument("--netns", action="store_true",
                    help="as root: each site's routers in its own network namespace, sites "
                         "joined by veth links (10.77.x.y inside the namespaces only); "
                         "everything is removed at the end")


def up(args: argparse.Namespace) -> int:
    launcher_class: Any = Launcher
    if args.netns:
        why = netns.unavailable()
        if why:
            raise console.UsageError(why)
        launcher_class = netns.NetnsLauncher
    try:
        topo = load(args.topology)
        launcher = launcher_class(topo, scenario=args.scenario, duration=args.duration,
                                  view=not args.quiet, workdir=args.workdir,
                                  base_port=args.base_port, log_level=args.router_log_level,
                                  web=None if not args.web else f"127.0.0.1:{args.web}"
                                  if args.web.isdigit() else args.web)
    except (TopologyError, KeyError) as exc:
        raise console.UsageError(str(exc).strip("'\"")) from None
    except RuntimeError as exc:  # NetnsError: the plan cannot be built
        raise console.UsageError(str(exc)) from None
    interrupted: list[int] = []

    async def go() -> Any:
        traffic = Traffic(launcher, rate=args.rate, size=args.size)

        def on_signal(sig: int) -> None:
            interrupted.append(sig)
            traffic.stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        return await traffic.run()

    try:
        report = asyncio.run(go())
    except RuntimeError as exc:
        raise console.RuntimeFailure(str(exc)) from None
    finally:
        if args.netns:  # whatever happened inside the run: no namespace outlives it
            launcher.cleanup()
    print(json.dumps(asdict(report)) if args.json else summarize(report), flush=True)
    return console.EXIT_INTERRUPTED if signal.SIGINT in interrupted else 0


#: the commands flownet adds to flowrouter's
COMMANDS = (cli.Command("demo", add_demo_parser, demo), cli.Command("up", add_up_parser, up))


def build_parser() -> argparse.ArgumentParser:
    """The ``flowrouter`` console script's parser (man pages and completion are made from it)."""
    return cli.build_parser(COMMANDS)


def main(argv: list[str] | None = None) -> int:
    """The ``flowrouter`` console script."""
    return cli.main(argv, extra=COMMANDS)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
