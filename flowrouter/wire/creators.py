"""Self-certifying creators: an Ed25519 key pair whose public half names a flow space.

A creator's 64-bit ID (the first 64 bits of every FlowID it creates) is
``sha256(b"flownet-creator" + pubkey_raw)[:8]``, so records about a creator's flows can be
checked against the key alone (:mod:`flowrouter.wire.capabilities` explains why). Holds
:func:`creator_id_of` and :class:`CreatorKey` (generation, signing, key files).

May import :mod:`flowrouter.wire.flowid` and the ``cryptography`` package.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from flowrouter.wire.flowid import FlowID

PUBKEY_SIZE = 32  #: raw Ed25519 public key
_CREATOR_DOMAIN = b"flownet-creator"


def creator_id_of(pubkey: bytes | Ed25519PublicKey) -> int:
    """The 64-bit creator ID that belongs to an Ed25519 public key (raw 32 bytes or object)."""
    if isinstance(pubkey, Ed25519PublicKey):
        pubkey = pubkey.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pubkey = bytes(pubkey)
    if len(pubkey) != PUBKEY_SIZE:
        raise ValueError(f"an Ed25519 public key is {PUBKEY_SIZE} bytes, got {len(pubkey)}")
    return int.from_bytes(hashlib.sha256(_CREATOR_DOMAIN + pubkey).digest()[:8], "big")


class CreatorKey:
    """A creator's Ed25519 key pair; its public half names the creator's flow space.

    Files: ``save(path)`` writes PEM (PKCS#8, unencrypted) or, with ``fmt="raw"``, the 32 raw
    private bytes; the file is created with mode 0600 and replaced atomically. ``load(path)``
    accepts either form and refuses a file that group or others can read (pass
    ``check_permissions=False`` to skip that check, e.g. for keys in a secrets store).
    """

    __slots__ = ("_key", "creator_id", "public_bytes")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_bytes: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.creator_id: int = creator_id_of(self.public_bytes)

    @classmethod
    def generate(cls) -> CreatorKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> CreatorKey:
        if len(raw) != 32:
            raise ValueError(f"a raw Ed25519 private key is 32 bytes, got {len(raw)}")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        return self._key.private_bytes(serialization.Encoding.Raw,
                                       serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption())

    def pem(self) -> bytes:
        return self._key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def flow(self, lsid: int, local: int) -> FlowID:
        """A FlowID in this creator's name space."""
        return FlowID(self.creator_id, lsid, local)

    # files -----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], fmt: str = "pem") -> Path:
        if fmt not in ("pem", "raw"):
            raise ValueError("key file format must be 'pem' or 'raw'")
        data = self.pem() if fmt == "pem" else self.private_bytes()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask or a stale temp file said
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], check_permissions: bool = True) -> CreatorKey:
        path = Path(path)
        if check_permissions:
            mode = path.stat().st_mode
            if mode & 0o077:
                raise PermissionError(
                    f"creator key {path} is readable by group or others (mode "
                    f"{mode & 0o777:o}); run: chmod 600 {path}")
        data = path.read_bytes()
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(data, password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
            return cls(key)
        if len(data) == 32:
            return cls.from_private_bytes(data)
        raise ValueError(f"{path}: expected a PEM Ed25519 private key or 32 raw bytes, "
                         f"got {len(data)} bytes")

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> CreatorKey:
        try:
            return cls.load(path)
        except FileNotFoundError:
            key = cls.generate()
            key.save(path)
            return key

    def __repr__(self) -> str:
        return f"CreatorKey(creator_id={self.creator_id:016x})"
