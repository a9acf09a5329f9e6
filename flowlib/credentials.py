"""Credential files an application presents: capability tokens, flow policies, link keys.

A **capability file** or **policy file** holds one signed record of
:mod:`flowrouter.wire.capabilities`, either as its raw bytes or as text: the record in base64
(or ``hex:...``) on one line, with any number of ``#`` comment lines around it (what
:func:`write_record_file` writes, so a person can see what a file grants). Loading a file
checks the record's layout and kind and says in one line what is wrong; the signature and
validity are checked by the routers that are shown the record.

A **link key** is ``KEY_ID:SECRET``, the secret written as in a router config (``hex:...``,
``base64:...`` or ``file:PATH``): what ``flowlib.connect(link_key=...)`` takes, split.

Imports only the wire layer of flowrouter (its capability module needs ``cryptography``, so
it is imported when a record is read, not with flowlib).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Largest credential file read (a policy with the most revoked serials is about 8 KB).
MAX_RECORD_FILE = 64 * 1024


def _record_bytes(data: bytes, what: str) -> bytes:
    if data.startswith(b"FN"):
        return data
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"not a {what}: neither a raw record nor base64 text") from None
    body = "".join(line.strip() for line in text.splitlines()
                   if line.strip() and not line.lstrip().startswith("#"))
    if not body:
        raise ValueError(f"no {what} in it (only comments or blank lines)")
    try:
        if body.lower().startswith("hex:"):
            return bytes.fromhex(body[4:])
        if body.lower().startswith("base64:"):
            body = body[7:]
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"not a {what}: its text is neither base64 nor hex:...") from None


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    p = Path(path).expanduser()
    try:
        size = p.stat().st_size
        if size > MAX_RECORD_FILE:
            raise ValueError(f"{what} file {p}: {size} bytes; at most {MAX_RECORD_FILE}")
        return p.read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} file {p}: {exc.strerror or exc}") from None


def _load_record(source: Any, kind: Any, what: str) -> Any:
    """A *kind* record (Capability or Policy) from a file path, raw bytes or a *kind*."""
    from flowrouter.wire.capabilities import CapabilityError

    if isinstance(source, kind):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        where, raw = what, bytes(source)
    else:
        where, raw = f"{what} file {Path(source).expanduser()}", _read(source, what)
    try:
        return kind.decode(_record_bytes(raw, what))
    except (CapabilityError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_capability(source: Any) -> Any:
    """A :class:`~flowrouter.wire.capabilities.Capability` from a file path, raw bytes or a
    Capability; raises ``ValueError`` naming the file and the problem."""
    from flowrouter.wire.capabilities import Capability

    return _load_record(source, Capability, "capability")


def load_policy(source: Any) -> Any:
    """A :class:`~flowrouter.wire.capabilities.Policy` from a file path, raw bytes or a
    Policy; raises ``ValueError`` naming the file and the problem."""
    from flowrouter.wire.capabilities import Policy

    return _load_record(source, Policy, "policy")


def write_record_file(path: str | os.PathLike[str], record: Any,
                      comments: Iterable[str] = ()) -> Path:
    """Write a capability or policy as commented base64 text (mode 0600: a capability is a
    bearer token for its subject)."""
    p = Path(path).expanduser()
    lines = [f"# {c}" for c in comments]
    lines.append(base64.b64encode(record.encode()).decode("ascii"))
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    return p


def parse_link_key(text: str) -> tuple[str, str]:
    """``KEY_ID:SECRET`` -> ``(key_id, secret spec)``, the secret checked now (so a missing
    key file or a short key is reported before connecting)."""
    from flowrouter.wire.linkauth import parse_secret

    key_id, sep, secret = text.partition(":")
    key_id = key_id.strip()
    if not sep or not key_id or not secret.strip():
        raise ValueError(f"link key {text!r} must look like KEY_ID:SECRET, e.g. "
                         "site-2026:file:/etc/flownet/site.key or site-2026:hex:<64 digits>")
    try:
        parse_secret(secret)
    except (OSError, ValueError) as exc:
        raise ValueError(f"link key {key_id!r}: {exc}") from None
    return key_id, secret


def capability_for(capabilities: Iterable[Any], flow_key: bytes, subject: str) -> Any:
    """The capability among *capabilities* that covers *flow_key* for *subject*: one naming
    the flow beats a creator-wide one; None when none fits."""
    wide = None
    for cap in capabilities:
        if not cap.covers(flow_key) or not cap.subject_ok(subject):
            continue
        if not cap.creator_wide:
            return cap
        wide = wide or cap
    return wide


__all__ = ["load_capability", "load_policy", "write_record_file", "parse_link_key",
           "capability_for", "MAX_RECORD_FILE"]
