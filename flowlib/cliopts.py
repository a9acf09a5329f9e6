"""The connection options every flownet tool takes, in one place: flowcat, flowdir, flowchat
and flowls (as an application) connect with the same flags, meaning what
:func:`flowlib.connect` means::

    --router HOST:PORT     repeatable (or comma-separated): the first that answers is used,
                           the others are failed over to if it dies; udp://HOST:PORT is a
                           datagram link (the router's app_udp address)
    --link-key ID:file:PATH | ID:env:VAR
                           authenticate to routers that require it, with the key in a file
                           (mode 0600) or an environment variable (hex:... or base64:...);
                           never the key itself: the command line is visible to every
                           local user (ps) and stays in shell history
    --encrypt              seal the link (needs --link-key)
    --capability FILE      repeatable: capability files presented for the flows they cover
    --policy FILE          repeatable: flow policies to publish once connected

:func:`add_connection_options` adds them to a parser; :func:`connect_kwargs` turns the parsed
values into keyword arguments for :func:`flowlib.connect`; :func:`publish_policies` publishes
the ``--policy`` files. Bad values are argparse errors naming the flag. Imports only flowlib
and the wire layer of flowrouter.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .checks import parse_router_address
from .credentials import load_capability, load_policy, parse_link_key

T = TypeVar("T")

DEFAULT_ROUTER = "127.0.0.1:7000"


def _router_list(text: str) -> list[str]:
    routers = [part.strip() for part in text.split(",") if part.strip()]
    if not routers:
        raise argparse.ArgumentTypeError("empty router address")
    for r in routers:
        try:
            parse_router_address(r)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return routers


def argtype(parse: Callable[[str], T]) -> Callable[[str], T]:
    """*parse* as an argparse ``type``: the ValueError it raises becomes argparse's error
    (its message shown with the flag), not argparse's generic "invalid value"."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


def argv_link_key(text: str) -> tuple[str, str]:
    """``--link-key KEY_ID:file:PATH`` (or ``KEY_ID:/abs/path``) or ``KEY_ID:env:VAR`` ->
    ``(key_id, secret spec)``, checked now. A key written on the command line itself
    (``hex:``, ``base64:``) is refused: every local user would see it in ``ps``."""
    key_id, sep, where = text.partition(":")
    kind, _, rest = where.partition(":")
    if kind.strip().lower() == "env" and key_id.strip():
        var = rest.strip()
        value = os.environ.get(var, "").strip() if var else ""
        if not value:
            raise ValueError(f"link key {key_id.strip()!r}: environment variable {var!r} is "
                             "not set or empty")
        return parse_link_key(f"{key_id}:{value}")
    if kind.strip().lower() == "file" or where.strip().startswith(("/", "./", "../", "~")):
        return parse_link_key(text)
    if not sep or not key_id.strip() or not where.strip():
        raise ValueError("a link key must look like KEY_ID:file:PATH or KEY_ID:env:VAR, e.g. "
                         "site-2026:file:/etc/flownet/site.key")
    raise ValueError("a link key is not accepted on the command line, where every local "
                     "user sees it (ps); give KEY_ID:file:PATH (a key file, mode 0600) or "
                     "KEY_ID:env:VAR (a variable holding hex:... or base64:...)")


#: ``--link-key ID:file:PATH`` / ``ID:env:VAR`` checked (:func:`argv_link_key`)
link_key_arg = argtype(argv_link_key)
_capability = argtype(load_capability)
_policy = argtype(load_policy)


def add_connection_options(parser: argparse.ArgumentParser | Any, *,
                           default_router: str | None = DEFAULT_ROUTER,
                           required: bool = False, policies: bool = True,
                           suppress_defaults: bool = False) -> None:
    """Add the shared connection flags to *parser* (a parser or an argument group).

    *default_router* is only named in the help (read it back with :func:`routers`);
    *required* makes ``--router`` mandatory; *suppress_defaults* leaves unset flags out of
    the namespace (for options repeated on subcommands, as flowdir does).
    """
    kw: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress_defaults else {}
    default_text = f" (default {default_router})" if default_router and not required else ""
    parser.add_argument("--router", "-r", action="append", type=_router_list,
                        metavar="HOST:PORT", required=required,
                        help="flow router to connect to; repeatable or comma-separated: the "
                             "first that answers is used, the others are failed over to if "
                             "it dies; udp://HOST:PORT reaches the router's app_udp address "
                             f"over a datagram link{default_text}", **kw)
    parser.add_argument("--link-key", type=link_key_arg, metavar="ID:file:PATH|ID:env:VAR",
                        help="link key for routers that require applications to "
                             "authenticate, from a key file (mode 0600) or an environment "
                             "variable holding hex:... or base64:...; never the key itself "
                             "(the command line is visible to every local user)", **kw)
    parser.add_argument("--encrypt", action="store_true",
                        help="encrypt the link to the router (needs --link-key)", **kw)
    parser.add_argument("--capability", action="append", type=_capability, metavar="FILE",
                        help="capability file presented when joining or sending on the "
                             "flows it covers (repeatable)", **kw)
    if policies:
        parser.add_argument("--policy", action="append", type=_policy, metavar="FILE",
                            help="flow policy file to publish once connected (the flow's "
                                 "creator signed it; repeatable)", **kw)


def routers(args: argparse.Namespace, default: str | None = DEFAULT_ROUTER) -> list[str]:
    """The ``--router`` addresses in order (each flag may hold several), or *default*."""
    given = [r for group in (getattr(args, "router", None) or []) for r in group]
    if given:
        return given
    return [default] if default else []


def connect_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``link_key``, ``encrypt`` and ``capabilities`` for :func:`flowlib.connect`; raises
    ``ValueError`` for ``--encrypt`` without ``--link-key``."""
    link_key = getattr(args, "link_key", None)
    encrypt = bool(getattr(args, "encrypt", False))
    if encrypt and link_key is None:
        raise ValueError("--encrypt needs --link-key (the link's keys come from it)")
    return {"link_key": link_key, "encrypt": encrypt,
            "capabilities": list(getattr(args, "capability", None) or [])}


def publish_policies(client: Any, args: argparse.Namespace) -> int:
    """Publish the ``--policy`` files through *client*; returns how many."""
    policies: Sequence[Any] = getattr(args, "policy", None) or []
    for policy in policies:
        client.publish_policy(policy)
    return len(policies)


__all__ = ["add_connection_options", "connect_kwargs", "routers", "publish_policies",
           "argtype", "argv_link_key", "link_key_arg",
           "DEFAULT_ROUTER"]
