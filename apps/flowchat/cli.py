"""``flowchat``: the robust multi-site chat of seed 003 on flownet.

    flowchat server --site metropol --sites metropol,commonwe,kingdom,republic \\
                    --router 127.0.0.1:7500 [--room NAME] [--mode all-to-all|hasten|leader]
    flowchat client --server 127.0.0.1:7600 --user alice [--plain]
    flowchat bot --server 127.0.0.1:7600 --rate 2 [--size 1000] [--count N | --duration S]
    flowchat experiment [--only A1,L2] [--duration 90] [--real] [--out DIR]
    flowchat keygen --site NAME --out FILE

Run ``flowchat COMMAND --help`` for every option.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from flowlib.cliopts import add_connection_options, connect_kwargs, routers
from flowrouter import console
from flowrouter.monitor import Monitored, start_monitor

EPILOG_SERVER = """\
One site server per site. All servers of a room must be given the same --sites (and, in
leader mode, the same --leader): the ordering protocol numbers sites by their sorted names.
Thin clients connect to --listen with 'flowchat client'. The room's flow is --flow if given;
else the directory is asked for 'chat:ROOM' (--no-directory skips that); else it is derived
from the room name (creator 0x43484154<crc32(ROOM)>, the router's LSID or --lsid, local 1), so
servers agree without any directory; a derived flow is registered in the directory when one
answers.

A protected room: its flow is in a creator's name space (--flow), the creator's policy is
published (--policy FILE, by any one server), and every site server presents a capability
for the room flow naming it (subject flowchat-SITE, or '*'; bands: all) with --capability
FILE. A server without one is refused when it joins. Make the files with 'flowcat
issue-policy' and 'flowcat issue-capability'.

A keyed room (--site-key FILE --site-keys FILE, at every server of the room): each site signs
every frame it sends and every message it originates (Ed25519); a frame is believed only
with its transmitter's signature and a message only with its origin's, so nobody on the
room flow (a listener, or another site with its own key and capability) can show words
under a site's name or suppress its messages. Make a site's key with 'flowchat keygen' and
give every server the same public key file (one 'SITE HEX' line per site). Without keys,
anyone who can send on the room flow can forge (README: Chat); two different messages
claiming one site and sequence number are always reported to the users ('WARNING: two
different messages ...') and counted (status: counters conflict.data), keyed or not.

Modes (seed 003 chapter 4):
  all-to-all  Lamport order among all sites; during a short-term disconnect (until
              --disconnect-interval) delivery waits for the site to come back
              (delay-delivery: global order kept); after it, the site leaves the ordering set
  hasten      the same, but a disconnected site leaves the ordering set as soon as the
              disconnect is detected; its reconciled messages are shown flagged LATE
  leader      --leader sequences every message; a site cut off from the leader keeps
              intra-site chat (its own messages, marked local)

Disconnects are detected after --missed heartbeats of --heartbeat seconds (seed: 3 x 2 s).
"""

EPILOG_EXPERIMENT = """\
Runs seed 003's Table 2 on topologies/seed003-testbed.toml: 1 all-to-all A1, 2 hasten A1,
3 hasten A1-25, 4 all-to-all A2, 5 hasten A2, 6 hasten A2-25, 7 leader L1, 8 leader L2;
4 sites sending ~2 messages/s of ~1 KB over 56 kbit/s links, 5-minute runs by default.
Writes per test: deliveries-SITE.csv, events.jsonl, seq.png, latency.png, rate.png,
result.json; and summary.md / summary.json. In the simulator (default) the whole suite
takes seconds; --real starts one router process per topology router on loopback
(flowrouter.testbed.launcher) and runs in real time (default 60 s per test; use --only).

Beyond the seed (--only NAME, or --only all for everything): 9 hasten flapping and 10 leader
flapping (every metropol link 3 s down / 3 s up for a minute; the summary's "stalls" counts
peers declared disconnected because they were heard but blocked); 11 hasten saturation and 12
leader saturation (7 messages/s of 1 KB per site, ~110% of a link: senders slowed); 13
site-restart and 14 leader-restart (a server restarts after 240 s, down 10 s, keeping its
display marks: live traffic first, history late, nothing shown twice); 15 hasten A3 and 16
leader A3 (3-way partition, 10 s down / 30 s up); 17 hasten mixed (one site overloaded); 18
hasten A4 and 19 leader A3 on eight sites (topologies/chat-8sites.toml).

--ls sites (default) makes every site router a member of the room's location service, so
site-to-site chat uses the direct 56 kbit/s links as in the seed's test-bed and each side of
a partition keeps a core; --ls hub runs the topology as written (one core at the hub: all
chat crosses the hub's links, and in A2 the side without the hub has no inter-site chat).
"""


def _igo_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ordering protocol (IGO) options")
    g.add_argument("--heartbeat", type=float, default=2.0, metavar="S",
                   help="heartbeat interval in seconds (seed: 2)")
    g.add_argument("--missed", type=int, default=3, metavar="N",
                   help="heartbeats missed before a site counts as disconnected (seed: 3)")
    g.add_argument("--disconnect-interval", type=float, default=15.0, metavar="S",
                   help="silence after which a disconnect is long-term: no reconciliation "
                        "(seed: 15)")
    g.add_argument("--stability", action="store_true",
                   help="stability tracking: deliver a message only once every site of the "
                        "ordering set has it (helps connected sites without transitive "
                        "connectivity; does not make same-side sites agree on which messages "
                        "are late, see the README; adds latency)")
    g.add_argument("--long-term-reconcile", action="store_true",
                   help="after a long-term disconnect, fetch the missed messages at a low "
                        "rate (shown as late history)")
    g.add_argument("--long-term-rate", type=float, default=2.0, metavar="R",
                   help="messages per second for --long-term-reconcile (default 2)")
    g.add_argument("--display-rate", type=float, default=None, metavar="R",
                   help="deliver at most R messages per second to clients (spreads the "
                        "bursts after reconciliation; default: no limit)")
    g.add_argument("--stall-timeout", type=float, default=None, metavar="S",
                   help="a site heard, but one of whose messages (or, following a leader, an "
                        "order number, while the order stream does not drain) has been "
                        "known to exist and missing this long (a flapping link) counts as "
                        "disconnected and is reconciled later "
                        "(default: missed x heartbeat + 2, i.e. 8 s)")
    g.add_argument("--send-window", type=int, default=32768, metavar="BYTES",
                   help="own bytes in flight (not yet acknowledged by every connected site) "
                        "at most; beyond it messages wait and the site is congested "
                        "(default 32768; 0: no flow control)")
    g.add_argument("--max-lag", type=int, default=2000, metavar="N",
                   help="a site more than N messages behind is dropped from repair duty "
                        "(it skips the gap) instead of stalling the others (default 2000)")


def _igo_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return {"heartbeat_interval": a.heartbeat, "missed_heartbeats": a.missed,
            "disconnect_interval": a.disconnect_interval, "stability": a.stability,
            "long_term_reconcile": a.long_term_reconcile, "long_term_rate": a.long_term_rate,
            "display_rate": a.display_rate, "max_lag": a.max_lag,
            "stall_timeout": a.stall_timeout, "send_window": a.send_window or None}


def build_parser() -> argparse.ArgumentParser:
    p = console.ArgumentParser(
        prog="flowchat",
        description="Robust multi-site chat with Intermittent Global Order (seed 003) on "
                    "flownet: site servers on a room flow, thin clients, bots, and the "
                    "seed's experiments.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    console.add_logging_options(p, default_level=None)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("server", help="run a site server (one per site)",
                       description="Run one site's chat server: a participant of the room "
                                   "flow that orders the room's messages and serves thin "
                                   "clients on a local TCP port.",
                       epilog=EPILOG_SERVER, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--site", required=True, help="this site's name (one of --sites)")
    s.add_argument("--sites", required=True,
                   help="every site of the room, comma-separated (same list at every server; "
                        "in leader mode including the leader)")
    add_connection_options(s, required=True)  # --router, --link-key, --capability, ...
    s.add_argument("--room", default="chat", help="room name (default 'chat')")
    s.add_argument("--mode", default="all-to-all", choices=["all-to-all", "hasten", "leader"],
                   help="ordering mode (default all-to-all = delay-delivery)")
    s.add_argument("--leader", help="leader mode: the site that sequences")
    s.add_argument("--http", metavar="[HOST:]PORT",
                   help="serve /healthz, /status and /metrics here (a bare port: on "
                        "127.0.0.1; default: no HTTP)")
    s.add_argument("--listen", default="127.0.0.1:7600", metavar="HOST:PORT",
                   help="where thin clients connect (default 127.0.0.1:7600; port 0 = any)")
    s.add_argument("--flow", help="use this room flow (creator:lsid:local) instead of "
                                  "looking it up")
    s.add_argument("--lsid", type=lambda x: int(x, 0),
                   help="LSID of a derived room flow (default: the router's suggestion)")
    s.add_argument("--no-directory", action="store_true",
                   help="do not ask the directory for the room's flow")
    s.add_argument("--state-dir", help="flowlib state directory (creator ID)")
    s.add_argument("--site-key", metavar="FILE",
                   help="keyed room: this site's Ed25519 private key (PEM or 64 hex digits; "
                        "'flowchat keygen' makes one); needs --site-keys")
    s.add_argument("--site-keys", metavar="FILE",
                   help="keyed room: every site's public key, one 'SITE HEX' line per site "
                        "(the same file at every server)")
    _igo_options(s)

    k = sub.add_parser("keygen", help="make a site's key for a keyed room",
                       description="Write a new Ed25519 private key for a site to --out (PEM, "
                                   "mode 0600, never overwriting) and print its public-key "
                                   "line ('SITE HEX') for the room's --site-keys file.")
    k.add_argument("--site", required=True, help="the site the key is for")
    k.add_argument("--out", required=True, metavar="FILE", help="private key file to create")

    c = sub.add_parser("client", help="a terminal chat client",
                       description="Connect to a site server as USER: conversation (late "
                                   "messages marked), membership (the sites of this site's "
                                   "ordering set and their users), input line. /who asks "
                                   "for the membership, /quit leaves.")
    c.add_argument("--server", default="127.0.0.1:7600", metavar="HOST:PORT")
    c.add_argument("--user", required=True)
    c.add_argument("--plain", action="store_true",
                   help="line-based output and input (default when not on a terminal)")

    b = sub.add_parser("bot", help="a client that talks at a given rate",
                       description="Log in and send messages at --rate per second (gaps "
                                   "uniform in [0, 2/rate] as seed 003's bots), then print "
                                   "a JSON summary of what was sent and received.")
    b.add_argument("--server", default="127.0.0.1:7600", metavar="HOST:PORT")
    b.add_argument("--user", default="bot")
    b.add_argument("--rate", type=float, default=2.0, help="messages per second (default 2)")
    b.add_argument("--size", type=int, default=0, help="pad messages to this many bytes")
    b.add_argument("--count", type=int, help="stop after this many messages")
    b.add_argument("--duration", type=float, help="stop after this many seconds")
    b.add_argument("--seed", type=int, help="random seed for the gaps")
    b.add_argument("--quiet", action="store_true", help="print only the summary")

    e = sub.add_parser("experiment", help="run seed 003's eight experiments",
                       description="Seed 003's Table 2 experiments with delivery logs, the "
                                   "seed's three graphs per run and a summary table.",
                       epilog=EPILOG_EXPERIMENT,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--only", help="tests to run: numbers and/or scenarios, e.g. '1,5' or "
                                  "'A1,L2' or 'flapping'; 'all' adds the scenarios beyond "
                                  "the seed (default: the seed's eight)")
    e.add_argument("--duration", type=float,
                   help="seconds per run (default 300 simulated, 60 with --real)")
    e.add_argument("--real", action="store_true",
                   help="real router processes on loopback, real time")
    e.add_argument("--out", default="chat-experiments", help="output directory")
    e.add_argument("--topology", help="topology file (default topologies/seed003-testbed.toml)")
    e.add_argument("--ls", default="sites", choices=["sites", "hub"],
                   help="location service placement for the room (see below; default sites)")
    e.add_argument("--seed", type=int, default=1, help="simulator and bot seed (default 1)")
    e.add_argument("--size", type=int, default=1000, help="message size in bytes (default "
                                                          "1000)")
    e.add_argument("--rate", type=float, default=None,
                   help="messages per second per site (default: the scenario's, else 2)")
    e.add_argument("--no-plots", action="store_true", help="skip the PNG graphs")
    e.add_argument("--base-port", type=int, help="--real: router ports from here")
    _igo_options(e)
    return p


def make_server(a: argparse.Namespace) -> Any:
    """The :class:`~flowchat.server.ChatServer` that ``flowchat server`` options describe."""
    from .server import ChatServer

    sites = [x.strip() for x in a.sites.split(",") if x.strip()]
    auth = None
    if a.site_key or a.site_keys:
        if not (a.site_key and a.site_keys):
            raise ValueError("a keyed room needs both --site-key and --site-keys")
        from .sitekeys import load_site_keys

        auth = load_site_keys(a.site, a.site_key, a.site_keys)
    return ChatServer(a.site, routers(a, None), sites=sites, room=a.room, mode=a.mode,
                      auth=auth,
                      leader=a.leader, listen=a.listen, flow=a.flow, lsid=a.lsid,
                      use_directory=not a.no_directory, state_dir=a.state_dir,
                      connect_options=connect_kwargs(a), policies=a.policy or [],
                      **_igo_kwargs(a))


async def _server(a: argparse.Namespace) -> int:
    srv = make_server(a)
    await srv.start()
    http = await start_monitor(chat_source(srv), None if not a.http else
                               f"127.0.0.1:{a.http}" if a.http.isdigit() else a.http)
    print(f"flowchat: site {a.site} ({a.mode}) in room {a.room!r} on flow {srv.flow} "
          f"({srv.flow_source}); clients connect to "
          f"{srv.address[0]}:{srv.address[1]}" if srv.address else "", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    got: list[int] = []

    def on_signal(sig: int) -> None:
        got.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal, sig)
    await stop.wait()
    if http is not None:
        await http.stop()
    await srv.stop()
    # Ctrl-C exits 130, as every command does (README); SIGTERM is a normal stop (0)
    return console.EXIT_INTERRUPTED if got[:1] == [signal.SIGINT] else 0


def chat_source(srv: Any) -> Monitored:
    """The monitoring view of a site server (flowrouter.monitor)."""
    def connected() -> bool:
        return bool(srv.client is not None and srv.client.connected)

    def status() -> dict[str, Any]:
        return {"site": srv.site, "room": srv.room, "mode": srv.config.mode,
                "flow": str(srv.flow), "router_connected": connected(),
                "clients": len(srv.clients), "keyed": srv.auth is not None,
                "conflicts": srv.conflicts,
                "listen": "%s:%d" % tuple(srv.address[:2]) if srv.address else None,
                **ordering_status()}

    def ordering_status() -> dict[str, Any]:
        o = srv.igo.ordering if srv.igo is not None else None
        if o is None:
            return {}
        st = o.status()  # incarnation, retired runs of restarted peers, protocol counters
        return {k: st[k] for k in ("incarnation", "retired", "counters")}

    def metrics() -> Any:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily("flownet_chat_clients", "thin clients connected",
                                value=len(srv.clients))
        yield GaugeMetricFamily("flownet_chat_router_connected",
                                "1 while the server's router link is up",
                                value=1 if connected() else 0)

    return Monitored(kind="chat-server", name=srv.site, status=status, metrics=metrics,
                     health=lambda: (connected(), "ok" if connected() else "router link down"))


def main(argv: list[str] | None = None) -> int:
    """The ``flowchat`` console script (errors and exit codes: flowrouter.console)."""
    return console.run("flowchat", _main, argv)


def _main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    # An experiment's routers are part of its scenario: what they say (a member cut off by
    # the partition it runs) is in the summary and counters; -v shows their log lines.
    console.setup_logging(a, node=f"chat-{a.site}" if a.cmd == "server" else "flowchat",
                          default_level="error" if a.cmd == "experiment" else "warning")
    try:
        if a.cmd == "server":
            return asyncio.run(_server(a))
        if a.cmd == "client":
            from .client import run_curses, run_plain

            plain = a.plain or not (sys.stdin.isatty() and sys.stdout.isatty())
            return asyncio.run(run_plain(a.server, a.user) if plain
                               else run_curses(a.server, a.user))
        if a.cmd == "keygen":
            from .sitekeys import public_hex, write_private

            print(f"{a.site} {public_hex(write_private(a.out))}")
            return 0
        if a.cmd == "bot":
            from .client import run_bot

            if a.count is None and a.duration is None:
                print("flowchat bot: give --count or --duration", file=sys.stderr)
                return 2
            asyncio.run(run_bot(a.server, a.user, rate=a.rate, size=a.size, count=a.count,
                                duration=a.duration, seed=a.seed, quiet=a.quiet))
            return 0
        return _experiment(a)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head): the console wrapper's exit 141
        raise
    except (OSError, ValueError) as exc:
        print(f"flowchat {a.cmd}: {exc}", file=sys.stderr)
        return 1


def _experiment(a: argparse.Namespace) -> int:
    from . import experiment as X

    exps = X.select(a.only)
    kwargs: dict[str, Any] = {"ls": a.ls, "seed": a.seed, "size": a.size, "rate": a.rate,
                              "config": {k: v for k, v in _igo_kwargs(a).items()}}
    if a.topology:
        kwargs["topology"] = a.topology
    if a.real and a.base_port:
        kwargs["base_port"] = a.base_port
    rows = X.run_all(exps, out=a.out, real=a.real, duration=a.duration,
                     plots=not a.no_plots, **kwargs)
    dur = rows[0]["duration"] if rows else 0
    rate = f"{a.rate:g}/s" if a.rate else "each scenario's rate (2/s unless it says)"
    notes = [f"{'Real routers on loopback' if a.real else 'Simulator'}, {dur:g} s per run, "
             f"seed {a.seed}, {a.size}-byte messages at {rate} per site, location "
             f"service placement: {a.ls}."]
    path = X.write_summary(rows, a.out, title="flowchat experiment: seed 003 Table 2",
                           notes=notes)
    print(path.read_text(encoding="utf-8"))
    bad = [r["test"] for r in rows if any(r["violations"].values())]
    if bad:
        print(f"ordering checks failed in test(s) {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
