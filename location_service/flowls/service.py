"""``flowls``: run a location-service member, look up LSIDs, show a member's view of the
members' graph and tree, list an LSID's active flows."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from flowlib.cliopts import link_key_arg
from flowrouter import console
from flowrouter.net.config import ConfigError, NodeConfig, PeerConfig
from flowrouter.net.runtime import query_control
from flowrouter.tools.cli import parse_int, parse_peer
from flowrouter.wire.flowid import FlowID


@dataclass(slots=True)
class LocationServiceConfig:
    """One LS member: which LSIDs it serves, its fellow members, and ordinary peers."""

    name: str
    lsids: frozenset[int]
    listen: str = "127.0.0.1:7500"
    control: str | None = None
    members: list[PeerConfig] = field(default_factory=list)  #: other members it dials
    peers: list[PeerConfig] = field(default_factory=list)  #: non-member routers it dials
    epoch: float = 5.0
    #: (key ID, secret spec) authenticating the member's links, as the overlay's routers do
    link_key: tuple[str, str] | None = None
    encrypt: bool = False
    #: routers (members or not) that dial this one, as "name@host" (no link keys)
    accept_routers: list[str] = field(default_factory=list)
    http: str | None = "auto"  #: HTTP monitoring address (see NodeConfig.http)

    def __post_init__(self) -> None:
        if not self.lsids:
            raise ConfigError("a location service member needs at least one --lsid")


def member_config(ls: LocationServiceConfig) -> NodeConfig:
    """The router configuration that makes a node a member of its location service(s)."""
    return NodeConfig(name=ls.name, listen=ls.listen, control=ls.control, http=ls.http,
                      core_lsids=frozenset(ls.lsids), default_lsid=min(ls.lsids),
                      peers=[*ls.members, *ls.peers], epoch=ls.epoch,
                      link_keys=dict([ls.link_key]) if ls.link_key else {},
                      link_key_id=ls.link_key[0] if ls.link_key else None,
                      link_encrypt=ls.encrypt, accept_routers=list(ls.accept_routers))


async def lookup(control: str, lsid: int) -> dict[str, Any]:
    """How the router at *control* reaches LSID *lsid*: its route row (raises LookupError)."""
    status = (await query_control(control))["status"]
    for row in status["ls_routes"]:
        if row["lsid"] == f"{lsid:#x}":
            return dict(row, router=status["name"])
    raise LookupError(f"router {status['name']} knows no location service {lsid:#x}")


async def members_of(control: str, lsid: int, expect: list[str] | None = None
                     ) -> dict[str, Any]:
    """The members' graph as the member at *control* sees it: the members it reaches over
    member-to-member links, the tree's root and its tree neighbours. Raises LookupError
    when that router is no member of *lsid*, or when an *expect*ed member is not reachable
    (the members' links do not connect them all: a partition)."""
    row = await lookup(control, lsid)
    if not row.get("core"):
        raise LookupError(f"router {row['router']} is no member of location service "
                          f"{lsid:#x}")
    missing = sorted(set(expect or ()) - set(row.get("members", ())))
    if missing:
        raise LookupError(f"location service {lsid:#x}: member(s) {', '.join(missing)} not "
                          f"reachable from {row['router']} over member-to-member links (it "
                          f"reaches {', '.join(row.get('members', ()))}): down, or the "
                          "members' graph is partitioned")
    return row


async def flows_of(control: str, lsid: int | None = None,
                   creator: int | None = None) -> list[dict[str, Any]]:
    """Active flows in a router's table, optionally only one LSID and/or one creator."""
    status = (await query_control(control))["status"]
    out = []
    for row in status["flows"]:
        fid = FlowID.parse(row["flow"])
        if (lsid is None or fid.lsid == lsid) and (creator is None or fid.creator == creator):
            out.append(row)
    return out


def _creator_arg(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"creator {text!r} is not a hexadecimal creator ID (e.g. 1a2b3c4d5e6f7081)") from None


def build_parser() -> argparse.ArgumentParser:
    p = console.ArgumentParser(
        prog="flowls",
        description="Location services: the cores of flow multicast trees. Run a member, "
                    "look up how an LSID is reached, list the flows an LS member roots.")
    console.add_logging_options(p, default_level=None)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    run = sub.add_parser(
        "run", help="run a location-service member (a core router for its LSIDs)",
        description="Run one member of a location service. Members of the same LSID must be "
                    "connected by links among themselves (--member for a fellow member, on "
                    "one side of each link), but need not form a full mesh: a ring or any "
                    "sparse connected graph will do; they agree on a spanning tree over "
                    "those links and pass traffic along it. Other routers find the nearest "
                    "member automatically.")
    run.add_argument("--name", required=True, help="member name (unique in the overlay)")
    console.add_logging_options(run, default_level="info", again=True)
    run.add_argument("--lsid", action="append", type=parse_int, required=True,
                     help="LSID served (repeatable), e.g. 0x10")
    run.add_argument("--listen", default="127.0.0.1:7500", metavar="HOST:PORT",
                     help="TCP address for routers and applications (default %(default)s)")
    run.add_argument("--control", metavar="HOST:PORT", help="status/control address")
    run.add_argument("--http", metavar="HOST:PORT", default="auto",
                     help="HTTP monitoring: /healthz, /status, /metrics (default: 127.0.0.1 on "
                          "the listen port + 1000; 'off' for none)")
    run.add_argument("--member", action="append", type=parse_peer, default=[],
                     metavar="[NAME=]HOST:PORT",
                     help="a fellow member of this LS to link to (repeatable; the members' "
                          "links must connect them all, a full mesh is not needed)")
    run.add_argument("--peer", action="append", type=parse_peer, default=[],
                     metavar="[NAME=]HOST:PORT", help="an ordinary router to link to")
    run.add_argument("--accept-router", action="append", default=[], metavar="NAME@HOST",
                     help="a router (member or not) that dials this one; needed without link "
                          "keys (repeatable)")
    run.add_argument("--epoch", type=float, default=5.0, help="GC epoch seconds")
    run.add_argument("--link-key", type=link_key_arg, metavar="ID:file:PATH|ID:env:VAR",
                     help="shared link key of an overlay with authenticated links, from a "
                          "key file or an environment variable (as flowlib's --link-key; "
                          "never the key itself on the command line)")
    run.add_argument("--encrypt", action="store_true",
                     help="seal the member's TCP links (needs --link-key)")
    lk = sub.add_parser("lookup", help="how a router reaches an LSID's location service",
                        description="Ask a router (by its control address) for its route to "
                                    "LSID: the link, distance and, at a member, its siblings, "
                                    "the members it reaches and its members' tree. "
                                    "Exit code 1 when the router knows no such LSID.")
    lk.add_argument("lsid", type=parse_int)
    lk.add_argument("--control", required=True, metavar="HOST:PORT")
    lk.add_argument("--json", action="store_true")
    mb = sub.add_parser("members", help="the members' graph and tree a member sees",
                        description="Ask a member of LSID (by its control address) which "
                                    "fellow members it reaches over member-to-member links, "
                                    "the members' tree root and its tree neighbours. With "
                                    "--expect, exit code 1 and a one-line error when an "
                                    "expected member is not reachable (a partitioned member "
                                    "graph).")
    mb.add_argument("lsid", type=parse_int)
    mb.add_argument("--control", required=True, metavar="HOST:PORT")
    mb.add_argument("--expect", action="append", default=[], metavar="NAME",
                    help="a member that must be reachable (repeatable, or comma-separated)")
    mb.add_argument("--json", action="store_true")
    fl = sub.add_parser("flows", help="list active flows at a router / LS member",
                        description="List flows in a router's table, filtered by LSID and/or "
                                    "creator (a creator's name space).")
    fl.add_argument("--control", required=True, metavar="HOST:PORT")
    fl.add_argument("--lsid", type=parse_int)
    fl.add_argument("--creator", type=_creator_arg, help="creator ID in hex")
    fl.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    """The ``flowls`` console script (errors and exit codes: flowrouter.console)."""
    return console.run("flowls", _main, argv, usage_errors=(ConfigError,),
                       runtime_errors=(ConnectionError, LookupError))


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console.setup_logging(args, node="flowls",
                          default_level="info" if args.command == "run" else "warning")
    if args.command == "run":
        from flowrouter.tools.cli import run_node

        cfg = member_config(LocationServiceConfig(
            name=args.name, lsids=frozenset(args.lsid), listen=args.listen,
            control=args.control, members=args.member, peers=args.peer,
            epoch=args.epoch, link_key=args.link_key, encrypt=args.encrypt,
            accept_routers=args.accept_router, http=args.http))
        if args.encrypt and not args.link_key:
            raise ConfigError("--encrypt needs --link-key")
        console.set_node(cfg.name)
        try:
            return asyncio.run(run_node(cfg, "location-service"))
        except OSError as exc:
            raise console.RuntimeFailure(f"cannot start member {cfg.name}: {exc}") from None
    if args.command == "lookup":
        row = asyncio.run(lookup(args.control, args.lsid))
        if args.json:
            print(json.dumps(row))
        else:
            where = "this router is a member" if row["core"] else (
                f"via link {row['link']} ({row['source']}, distance {row['distance']})")
            sib = f"; sibling members on links {row['siblings']}" if row.get(
                "siblings") else ""
            if row.get("members"):  # a member: the members' graph and its spanning tree
                sib += (f"; {len(row['members'])} member(s) reachable, tree root "
                        f"{row['root']}, tree neighbours "
                        f"{', '.join(row['tree_members']) or 'none'}")
            print(f"LSID {row['lsid']} at router {row['router']}: {where}{sib}")
        return 0
    if args.command == "members":
        expect = [n for item in args.expect for n in item.split(",") if n]
        row = asyncio.run(members_of(args.control, args.lsid, expect))
        if args.json:
            print(json.dumps(row))
        else:
            print(f"LSID {row['lsid']} at member {row['router']}: {len(row['members'])} "
                  f"member(s) reachable ({', '.join(row['members'])}); tree root "
                  f"{row['root']}; tree neighbours {', '.join(row['tree_members']) or 'none'}")
        return 0
    if args.command == "flows":
        rows = asyncio.run(flows_of(args.control, args.lsid, args.creator))
        if args.json:
            print(json.dumps(rows))
        else:
            for row in rows:
                print(f"{row['flow']}  aggregate {row['aggregate']}  "
                      f"{len(row['downstream'])} downstream link(s)")
            print(f"{len(rows)} flow(s)")
        return 0
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
