"""Pre-shared link keys: their config forms, the key ring, the replay cache, and the base of
the link-security errors. Imports only the standard library.

Keys
----
A :class:`KeyRing` maps key ids (short strings) to 32-byte secrets. In a router config::

    [link_auth]
    key_id = "site-2025"          # the key this router proves itself with
    encrypt = false               # ask for encrypted links (on if either side asks)
    [link_auth.keys]
    site-2025 = "hex:5f1c...64 hex digits"
    site-2024 = "base64:Xx8...44 characters="
    lab = "file:/etc/flownet/lab.key"

A secret is written ``hex:...`` (64 hex digits), ``base64:...`` / ``b64:...`` (32 bytes),
or ``file:PATH`` (the file holds 32 raw bytes, or one hex or base64 line; it must not be
readable by group or others). Without a prefix: 64 hex digits are hex, a string that decodes
as base64 to 32 bytes is base64, and anything starting with ``/``, ``./``, ``../`` or ``~`` is
a file. Each side proves itself with the key it announces; the verifier needs that key too,
so during a key rotation routers hold both the old and the new key.

The pre-shared keys only *authenticate* (see :mod:`flowrouter.wire.linkauth`): session keys
come from an ephemeral exchange, so a leaked site key does not open old recordings.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

__all__ = ["KEY_SIZE", "MAX_KEY_ID", "KeyRing", "LinkSecurityError", "ReplayCache",
           "check_key_id", "parse_secret"]

KEY_SIZE = 32
MAX_KEY_ID = 64


class LinkSecurityError(ValueError):
    """Base of the link-security errors; ``reason`` is short and stable (a counter key)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# ---------------------------------------------------------------------------------- keys
def _decode_secret_text(text: str, where: str) -> bytes | None:
    t = text.strip()
    if len(t) == 2 * KEY_SIZE:
        try:
            return bytes.fromhex(t)
        except ValueError:
            pass
    try:
        raw = base64.b64decode(t, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == KEY_SIZE else None


def _read_secret_file(path: Path, check_permissions: bool) -> bytes:
    if check_permissions:
        mode = path.stat().st_mode
        if mode & 0o077:
            raise ValueError(f"key file {path} is readable by group or others (mode "
                             f"{mode & 0o777:o}); run: chmod 600 {path}")
    data = path.read_bytes()
    if len(data) == KEY_SIZE:
        return data
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    secret = _decode_secret_text(text, str(path)) if text else None
    if secret is None:
        raise ValueError(f"key file {path}: expected {KEY_SIZE} raw bytes or one line of 64 "
                         "hex digits or base64 for 32 bytes")
    return secret


def parse_secret(spec: str | bytes, base_dir: str | os.PathLike[str] | None = None,
                 check_permissions: bool = True) -> bytes:
    """Turn a config value into a 32-byte secret (see the module docs for the forms)."""
    if isinstance(spec, bytes):
        if len(spec) != KEY_SIZE:
            raise ValueError(f"a link key is {KEY_SIZE} bytes, got {len(spec)}")
        return spec
    s = spec.strip()
    prefix, sep, rest = s.partition(":")
    prefix = prefix.lower()
    if sep and prefix == "hex":
        try:
            raw = bytes.fromhex(rest.strip())
        except ValueError:
            raise ValueError("hex: key is not hexadecimal") from None
        if len(raw) != KEY_SIZE:
            raise ValueError(f"hex: key must be {2 * KEY_SIZE} hex digits ({KEY_SIZE} bytes), "
                             f"got {len(raw)} bytes")
        return raw
    if sep and prefix in ("base64", "b64"):
        try:
            raw = base64.b64decode(rest.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("base64: key is not valid base64") from None
        if len(raw) != KEY_SIZE:
            raise ValueError(f"base64: key must decode to {KEY_SIZE} bytes, got {len(raw)}")
        return raw
    if sep and prefix == "file":
        path = Path(rest.strip()).expanduser()
    elif s.startswith(("/", "./", "../", "~")):
        path = Path(s).expanduser()
    else:
        raw_or_none = _decode_secret_text(s, "key")
        if raw_or_none is None:
            raise ValueError("link key must be 'hex:<64 hex digits>', 'base64:<32 bytes>' or "
                             "'file:<path>'")
        return raw_or_none
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    return _read_secret_file(path, check_permissions)


def check_key_id(key_id: str) -> bytes:
    raw = key_id.encode("utf-8")
    if not 0 < len(raw) <= MAX_KEY_ID:
        raise ValueError(f"key id must be 1..{MAX_KEY_ID} bytes of UTF-8, got {key_id!r}")
    return raw


class KeyRing:
    """Key id -> 32-byte secret, plus the id this node announces (``default_id``)."""

    def __init__(self, keys: Mapping[str, bytes], default_id: str | None = None) -> None:
        self._keys: dict[str, bytes] = {}
        for kid, secret in keys.items():
            check_key_id(kid)
            if len(secret) != KEY_SIZE:
                raise ValueError(f"key {kid!r}: a link key is {KEY_SIZE} bytes")
            self._keys[kid] = bytes(secret)
        if default_id is None and len(self._keys) == 1:
            default_id = next(iter(self._keys))
        if default_id is not None and default_id not in self._keys:
            raise ValueError(f"key id {default_id!r} is not among the configured keys "
                             f"{sorted(self._keys)}")
        self.default_id = default_id

    @classmethod
    def from_config(cls, keys: Mapping[str, str], default_id: str | None = None,
                    base_dir: str | os.PathLike[str] | None = None,
                    check_permissions: bool = True) -> KeyRing:
        parsed = {}
        for kid, spec in keys.items():
            try:
                parsed[kid] = parse_secret(spec, base_dir, check_permissions)
            except (ValueError, OSError) as exc:
                raise ValueError(f"link_auth.keys.{kid}: {exc}") from None
        return cls(parsed, default_id)

    @staticmethod
    def generate_secret() -> str:
        """A fresh secret in config form (``hex:...``)."""
        return "hex:" + os.urandom(KEY_SIZE).hex()

    def get(self, key_id: str) -> bytes | None:
        return self._keys.get(key_id)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:  # never print secrets
        return f"KeyRing(ids={sorted(self._keys)}, default={self.default_id!r})"


class ReplayCache:
    """Recently seen peer nonces (bounded), shared by all links of a router."""

    def __init__(self, size: int = 65536) -> None:
        self.size = max(1, size)
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def check_and_add(self, nonce: bytes) -> bool:
        """True if *nonce* is new (and remember it), False if it was seen before."""
        if nonce in self._seen:
            return False
        self._seen[nonce] = None
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return True


