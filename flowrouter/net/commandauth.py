"""Who may command a router: the one rule every administrative interface applies.
Imports the standard library and :mod:`flowrouter.wire` only; no sockets (the caller passes
the interface's address and the wall clock).

Read-only queries (``status``, ``ping``, and any HTTP GET of status) are served to anyone the
interface is bound for. Commands that change the router (emulation, cutting links, reloads,
anything else) need *proof* unless the interface is bound to loopback only:

* the request carries ``"auth": {"key_id": ID, "router": NAME, "boot": HEX, "time":
  UNIX_SECONDS, "nonce": HEX, "mac": HEX}`` with ``mac = HMAC-SHA256(secret,
  b"flownet-command-v2\\n" || router name || "\\n" || boot || "\\n" || canonical JSON of the
  request without "auth" || "\\n" || time || "\\n" || nonce)``;
* *router* is the name of the router meant, so a command signed for one router is refused
  by every other router holding the same key; *boot* is that router's run nonce, random at
  each start and answered to anyone by ``ping`` (the client asks first, on the same
  connection), so a command recorded before a restart is refused after it: nothing needs
  to be persisted, and clocks need not agree to the second across restarts;
* the secret is the control token (key id ``token``, from ``[router] control_token``), or a
  link key of ``[link_auth.keys]`` under its own id only where ``[router] control_link_keys
  = true``: a link key is shared with a peer router, so by default holding one proves a
  link, not the right to command this router;
* the time must be within ``window`` seconds of the router's clock, and a nonce is accepted
  once in a run, so a recorded command cannot be replayed.

The secret itself never crosses the network. :func:`sign_command` builds the proof (the CLI
and :func:`flowrouter.net.control.query_control` use it). :meth:`CommandGuard.check_bind`
refuses a command interface on a non-loopback address without a secret to check.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from flowrouter.wire.address import AddressError

__all__ = ["READ_ONLY_COMMANDS", "CommandGuard", "is_loopback", "sign_command"]

#: commands that only read; everything else changes the router
READ_ONLY_COMMANDS = frozenset({"status", "ping"})
TOKEN_ID = "token"
_LABEL = b"flownet-command-v2\n"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127/8, ::1)."""
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _canonical(request: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in request.items() if k != "auth"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _mac(secret: bytes, router: str, boot: str, request: Mapping[str, Any], when: int,
         nonce: str) -> str:
    msg = b"".join((_LABEL, router.encode(), b"\n", boot.encode(), b"\n", _canonical(request),
                    b"\n%d\n" % when, nonce.encode()))
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def sign_command(request: Mapping[str, Any], key_id: str, secret: bytes, now: float, *,
                 router: str, boot: str) -> dict[str, Any]:
    """*request* plus its ``auth`` proof for the router named *router* in its run *boot*
    (both from its ``ping`` reply; see the module docs); *now* is Unix time."""
    when = int(now)
    nonce = os.urandom(12).hex()
    return {**request, "auth": {"key_id": key_id, "router": router, "boot": boot,
                                "time": when, "nonce": nonce,
                                "mac": _mac(secret, router, boot, request, when, nonce)}}


class CommandGuard:
    """Decides, for one command interface, whether a request may run."""

    def __init__(self, bind_host: str, secrets: Mapping[str, bytes] | None = None, *,
                 router: str = "", always: bool = False, window: float = 60.0,
                 replay_size: int = 4096, boot: str | None = None) -> None:
        self.bind_host = bind_host
        #: the router this guard stands for: commands signed for another are refused
        self.router = router
        #: this run's nonce (a new guard at each start): commands signed before are refused
        self.boot = boot if boot is not None else os.urandom(8).hex()
        #: commands run without proof only on a loopback interface, and only when the
        #: operator has not asked for proof everywhere (``always``: a control token is set)
        self.loopback = is_loopback(bind_host) and not always
        self.secrets = dict(secrets or {})
        self.window = window
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._replay_size = replay_size
        self.refused = 0

    @staticmethod
    def check_bind(bind_host: str, secrets: Mapping[str, bytes] | None) -> None:
        """Refuse (AddressError, a config error) a non-loopback command interface that could
        not check proof."""
        if not is_loopback(bind_host) and not secrets:
            raise AddressError(
                f"control interface on {bind_host} (not loopback) needs a [router] "
                "control_token (or link keys with control_link_keys = true), or anyone who "
                "reaches it could change the router; bind it to 127.0.0.1 or set a token")

    def authorise(self, request: Mapping[str, Any], now: float) -> str | None:
        """None if *request* may run now (Unix time *now*); else why not (one line)."""
        cmd = request.get("cmd")
        if cmd in READ_ONLY_COMMANDS:
            return None
        auth = request.get("auth")
        if auth is None:
            if self.loopback:
                return None
            where = ("this router requires it (control_token is set)"
                     if is_loopback(self.bind_host) else "the interface is not on loopback")
            return self._refuse(f"command {cmd!r} changes the router and needs proof (a "
                                f"control token or a link key): {where}")
        if not isinstance(auth, dict):
            return self._refuse("malformed auth (expected an object)")
        kid, when, nonce, mac = (auth.get("key_id"), auth.get("time"), auth.get("nonce"),
                                 auth.get("mac"))
        router, boot = auth.get("router"), auth.get("boot")
        if not (isinstance(kid, str) and isinstance(when, int) and isinstance(nonce, str)
                and isinstance(mac, str) and 0 < len(nonce) <= 64
                and isinstance(router, str) and isinstance(boot, str)):
            return self._refuse("malformed auth (key_id, router, boot, time, nonce and mac "
                                "are needed; an older client? upgrade it)")
        secret = self.secrets.get(kid)
        if secret is None:
            return self._refuse(f"unknown key id {kid!r} (link keys sign commands only where "
                                "[router] control_link_keys = true; use the control token)"
                                if kid != TOKEN_ID else "no control token is set here")
        if router != self.router:
            return self._refuse(f"signed for router {router[:64]!r}, this is "
                                f"{self.router!r}")
        if boot != self.boot:
            return self._refuse("signed for an earlier run of this router (it restarted "
                                "since): sign again")
        if abs(now - when) > self.window:
            return self._refuse(f"auth time is {now - when:+.0f}s off (window "
                                f"{self.window:.0f}s); check the clocks")
        if not hmac.compare_digest(_mac(secret, self.router, self.boot, request, when, nonce),
                                   mac):
            what = "control token" if kid == TOKEN_ID else f"link key {kid!r}"
            return self._refuse(f"bad proof (the {what} does not match this router's)")
        tag = f"{kid}/{nonce}"
        if tag in self._seen:
            return self._refuse("replayed command")
        self._seen[tag] = None
        if len(self._seen) > self._replay_size:
            self._seen.popitem(last=False)
        return None

    def _refuse(self, why: str) -> str:
        self.refused += 1
        return f"not authorised: {why}"
