"""Per-site Ed25519 keys for keyed chat rooms: the :class:`~flowchat.igo.auth.FrameAuth` the
ordering layer signs and verifies with, and the key files behind ``--site-key`` /
``--site-keys`` (``flowchat keygen`` makes them). Imports only the standard library and
``cryptography``.

Files, never argv (a command line is visible to every local user):

* the *private key* of a site: PEM (PKCS#8, unencrypted) or 64 hex digits (the raw 32-byte
  seed); ``flowchat keygen`` writes PEM, mode 0600;
* the *public keys* of the room: one ``SITE HEX`` line per site (64 hex digits, the raw
  32-byte public key; ``#`` starts a comment). Every site of the room needs an entry,
  its own included (checked against its private key at start-up).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class SiteKeys:
    """One site's signing key and every site's public key (a :class:`FrameAuth`)."""

    def __init__(self, site: str, private: Ed25519PrivateKey,
                 public: Mapping[str, Ed25519PublicKey]) -> None:
        self.site = site
        self._private = private
        self.public = dict(public)
        mine = self.public.get(site)
        if mine is None:
            raise ValueError(f"the public keys name no key for this site ({site!r})")
        if _raw_public(mine) != _raw_public(private.public_key()):
            raise ValueError(f"the public key listed for {site!r} is not this site's key")

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def verify(self, site: str, data: bytes, sig: bytes) -> bool:
        key = self.public.get(site)
        if key is None or len(sig) != 64:
            return False
        try:
            key.verify(sig, data)
        except InvalidSignature:
            return False
        return True

    def check_sites(self, sites: Iterable[str]) -> None:
        """Every site of the room has a public key (else its frames could never count)."""
        missing = [s for s in sites if s not in self.public]
        if missing:
            raise ValueError(f"no public key for site(s) {', '.join(missing)}")


def public_hex(private: Ed25519PrivateKey) -> str:
    return _raw_public(private.public_key()).hex()


def parse_private(text: bytes) -> Ed25519PrivateKey:
    stripped = text.strip()
    if stripped.startswith(b"-----BEGIN"):
        key = serialization.load_pem_private_key(stripped, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the site key is not an Ed25519 key")
        return key
    try:
        raw = bytes.fromhex(stripped.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("a site key is PEM or 64 hex digits") from None
    if len(raw) != 32:
        raise ValueError("a raw site key is 32 bytes (64 hex digits)")
    return Ed25519PrivateKey.from_private_bytes(raw)


def parse_public(text: str) -> dict[str, Ed25519PublicKey]:
    keys: dict[str, Ed25519PublicKey] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"public keys, line {n}: expected 'SITE HEX'")
        site, hexkey = parts
        try:
            raw = bytes.fromhex(hexkey)
        except ValueError:
            raise ValueError(f"public keys, line {n}: not hex") from None
        if len(raw) != 32:
            raise ValueError(f"public keys, line {n}: a key is 32 bytes (64 hex digits)")
        if site in keys:
            raise ValueError(f"public keys, line {n}: site {site!r} listed twice")
        keys[site] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def load_site_keys(site: str, key_file: str | os.PathLike[str],
                   public_file: str | os.PathLike[str]) -> SiteKeys:
    """The keys of *site* from its private key file and the room's public key file."""
    private = parse_private(Path(key_file).read_bytes())
    public = parse_public(Path(public_file).read_text(encoding="utf-8"))
    return SiteKeys(site, private, public)


def write_private(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """A new key written to *path* (PEM, created 0600, never overwriting)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key
