"""Authenticated (and optionally encrypted) links from pre-shared keys. Sans-I/O.

The router core (or runtime) drives one :class:`LinkAuthenticator` per link:

1. both sides put :meth:`LinkAuthenticator.hello_credentials` in their HELLO's
   ``credentials`` (they send HELLO at the same time, nobody waits for the other);
2. on the peer's HELLO, :meth:`~LinkAuthenticator.on_peer_hello` checks its credentials and
   returns our AUTH message (a proof that we hold the key, bound to both nonces);
3. on the peer's AUTH, :meth:`~LinkAuthenticator.on_peer_auth` checks its proof; the link is
   then authenticated and, if either side asked for it, :meth:`~LinkAuthenticator.cipher`
   returns the link's :class:`LinkCipher`. Every failure raises :class:`AuthError` with a
   stable ``reason``: ``unknown-key``, ``bad-proof``, ``missing-credentials``, ``replay``,
   ``malformed`` or ``state`` (a message out of order).

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

Wire formats
------------
HELLO credentials (36 + n bytes)::

    version (1) = 1 | scheme (1) = 1 (PSK, HMAC-SHA256) | flags (1): bit 0 = encrypt
    | nonce (32, random) | key id length n (1) | key id (n, UTF-8, 1..64)

AUTH message (34 bytes; the caller carries it, e.g. as a link-local control payload)::

    version (1) = 1 | kind (1) = 2 | proof (32)

Proof (each side computes its own; the peer recomputes it with the arguments swapped)::

    proof = HMAC-SHA256(key, b"flownet-link-v1" || my_nonce || peer_nonce
                             || len8(my_name) || my_name || len8(peer_name) || peer_name
                             || role || len8(key_id) || key_id || my_flags || peer_flags)

``role`` is the prover's HELLO role byte (ROUTER 1, ENDPOINT 2); names are the UTF-8 names of
the HELLOs (cut to 255 bytes like the HELLO does); lengths are single bytes so no two inputs
concatenate alike. Binding both nonces makes a proof useless on any other link (a recorded
AUTH never verifies again: our nonce is fresh), binding both flag bytes stops a
man-in-the-middle from stripping the encryption request unnoticed. A peer nonce seen before
(:class:`ReplayCache`), or equal to ours (reflection), fails with ``replay``.

Encryption
----------
Session keys: ``HKDF-SHA256(ikm = key_lo || key_hi, salt = b"flownet-link-v1",
info = b"flownet-link-v1 session" || nonce_lo || nonce_hi, length 64)``, where ``lo`` is the
side with the smaller nonce; the first 32 bytes key the lo -> hi direction, the rest hi -> lo.
Each record is ChaCha20-Poly1305 with a 96-bit nonce ``0000 || counter (u64)``; the counter
travels in clear in front of the ciphertext so a receiver can refuse a replayed or reordered
record before decrypting (streams: exactly the next counter; datagrams: a 64-record
anti-replay window). On TCP each record is length-prefixed::

    length (u32, = 8 + len(ciphertext)) | counter (u64) | ciphertext + tag (16)

The plaintext of the records is the ordinary frame stream, so records need not line up with
frames (a runtime may seal a whole ``writelines`` batch as one record). HELLO and AUTH travel
in clear; everything after the AUTH messages is sealed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import struct
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "AuthError",
    "CipherError",
    "HelloCredentials",
    "KeyRing",
    "LinkAuthenticator",
    "LinkCipher",
    "LinkSecurityError",
    "RecordDecoder",
    "RecordError",
    "ReplayCache",
    "SecureStream",
    "decode_auth",
    "derive_session_keys",
    "encode_auth",
    "encode_record",
    "make_hello_credentials",
    "make_proof",
    "parse_hello_credentials",
    "parse_secret",
    "verify_proof",
]

VERSION = 1
SCHEME_PSK_HMAC_SHA256 = 1
KIND_AUTH = 2
FLAG_ENCRYPT = 0x01
#: set by a router that requires applications to authenticate, so a client without a key can
#: fail at once with a clear message instead of after the router's refusal
FLAG_REQUIRE_ENDPOINTS = 0x02
NONCE_SIZE = 32
KEY_SIZE = 32
PROOF_SIZE = 32
MAX_KEY_ID = 64
LABEL = b"flownet-link-v1"

_CRED = struct.Struct("!BBB32sB")  # version, scheme, flags, nonce, key id length
_AUTH = struct.Struct("!BB32s")
_REC_LEN = struct.Struct("!I")
_COUNTER = struct.Struct("!Q")
TAG_SIZE = 16
RECORD_OVERHEAD = _REC_LEN.size + _COUNTER.size + TAG_SIZE  # 28 bytes per record
#: Default largest record body (counter + ciphertext): a 64 KiB payload, its header, a tag.
DEFAULT_MAX_RECORD = _COUNTER.size + 24 + 64 * 1024 + TAG_SIZE
_MIN_RECORD = _COUNTER.size + TAG_SIZE


class LinkSecurityError(ValueError):
    """Base of this module's errors; ``reason`` is short and stable (a counter key)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class AuthError(LinkSecurityError):
    """The link cannot be authenticated; close it (after telling the peer why)."""


class CipherError(LinkSecurityError):
    """A sealed record failed: ``bad-tag``, ``replay``, ``out-of-order``, ``truncated``,
    ``exhausted`` (the 64-bit counter ran out: re-key by reconnecting)."""


class RecordError(LinkSecurityError):
    """The encrypted stream's framing is broken: ``oversized`` or ``undersized``."""


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


def _check_key_id(key_id: str) -> bytes:
    raw = key_id.encode("utf-8")
    if not 0 < len(raw) <= MAX_KEY_ID:
        raise ValueError(f"key id must be 1..{MAX_KEY_ID} bytes of UTF-8, got {key_id!r}")
    return raw


class KeyRing:
    """Key id -> 32-byte secret, plus the id this node announces (``default_id``)."""

    def __init__(self, keys: Mapping[str, bytes], default_id: str | None = None) -> None:
        self._keys: dict[str, bytes] = {}
        for kid, secret in keys.items():
            _check_key_id(kid)
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


# ---------------------------------------------------------------------------------- primitives
class HelloCredentials:
    __slots__ = ("flags", "key_id", "nonce")

    def __init__(self, key_id: str, nonce: bytes, flags: int) -> None:
        self.key_id = key_id
        self.nonce = nonce
        self.flags = flags

    @property
    def encrypt(self) -> bool:
        return bool(self.flags & FLAG_ENCRYPT)

    def __repr__(self) -> str:
        return (f"HelloCredentials(key_id={self.key_id!r}, nonce={self.nonce.hex()[:16]}..., "
                f"flags={self.flags:#x})")


def make_hello_credentials(key_id: str, encrypt: bool = False, nonce: bytes | None = None,
                           require_endpoints: bool = False) -> tuple[bytes, bytes]:
    """(credentials blob for our HELLO, our nonce). The nonce is fresh unless given."""
    kid = _check_key_id(key_id)
    if nonce is None:
        nonce = os.urandom(NONCE_SIZE)
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"nonce must be {NONCE_SIZE} bytes")
    flags = (FLAG_ENCRYPT if encrypt else 0) | (FLAG_REQUIRE_ENDPOINTS if require_endpoints
                                                else 0)
    blob = _CRED.pack(VERSION, SCHEME_PSK_HMAC_SHA256, flags, nonce, len(kid)) + kid
    return blob, nonce


def parse_hello_credentials(blob: bytes | bytearray | memoryview) -> HelloCredentials:
    """Decode a HELLO credentials blob; AuthError ``missing-credentials`` or ``malformed``."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise AuthError("malformed", "credentials must be bytes")
    blob = bytes(blob)
    if not blob:
        raise AuthError("missing-credentials", "the peer's HELLO carries no credentials")
    if len(blob) < _CRED.size:
        raise AuthError("malformed", f"credentials of {len(blob)} bytes are truncated")
    version, scheme, flags, nonce, n = _CRED.unpack_from(blob)
    if version != VERSION:
        raise AuthError("malformed", f"link-auth version {version} (this node speaks "
                                     f"{VERSION})")
    if scheme != SCHEME_PSK_HMAC_SHA256:
        raise AuthError("malformed", f"unknown link-auth scheme {scheme}")
    if flags & ~(FLAG_ENCRYPT | FLAG_REQUIRE_ENDPOINTS):
        raise AuthError("malformed", f"unknown link-auth flags {flags:#x}")
    if not 0 < n <= MAX_KEY_ID or len(blob) != _CRED.size + n:
        raise AuthError("malformed", "bad key id length")
    try:
        key_id = blob[_CRED.size:].decode("utf-8")
    except UnicodeDecodeError:
        raise AuthError("malformed", "key id is not UTF-8") from None
    return HelloCredentials(key_id, nonce, flags)


def _name(name: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > 255:  # the HELLO carries at most 255 bytes, cut on a character boundary
        raw = raw[:255].decode("utf-8", "ignore").encode("utf-8")
    return bytes([len(raw)]) + raw


def make_proof(key: bytes, my_nonce: bytes, peer_nonce: bytes, my_name: str, peer_name: str,
               role: int, key_id: str = "", my_flags: int = 0, peer_flags: int = 0) -> bytes:
    """HMAC-SHA256 proof that the holder of *key* speaks on this link (see module docs)."""
    kid = key_id.encode("utf-8")
    msg = b"".join((LABEL, my_nonce, peer_nonce, _name(my_name), _name(peer_name),
                    bytes([role & 0xFF]), bytes([len(kid)]), kid,
                    bytes([my_flags & 0xFF, peer_flags & 0xFF])))
    return hmac.new(key, msg, hashlib.sha256).digest()


def verify_proof(proof: bytes, key: bytes, my_nonce: bytes, peer_nonce: bytes, my_name: str,
                 peer_name: str, role: int, key_id: str = "", my_flags: int = 0,
                 peer_flags: int = 0) -> bool:
    """Constant-time check of a proof computed with :func:`make_proof`'s arguments (from the
    prover's point of view)."""
    expected = make_proof(key, my_nonce, peer_nonce, my_name, peer_name, role, key_id,
                          my_flags, peer_flags)
    return hmac.compare_digest(expected, bytes(proof))


def encode_auth(proof: bytes) -> bytes:
    if len(proof) != PROOF_SIZE:
        raise ValueError(f"a proof is {PROOF_SIZE} bytes")
    return _AUTH.pack(VERSION, KIND_AUTH, proof)


def decode_auth(message: bytes | bytearray | memoryview) -> bytes:
    if not isinstance(message, (bytes, bytearray, memoryview)) or len(message) != _AUTH.size:
        raise AuthError("malformed", f"an AUTH message is {_AUTH.size} bytes")
    version, kind, proof = _AUTH.unpack(bytes(message))
    if version != VERSION or kind != KIND_AUTH:
        raise AuthError("malformed", f"not an AUTH message (version {version}, kind {kind})")
    return proof


def derive_session_keys(my_key: bytes, peer_key: bytes, my_nonce: bytes, peer_nonce: bytes
                        ) -> tuple[bytes, bytes]:
    """(key for what we send, key for what we receive), both 32 bytes."""
    if my_nonce == peer_nonce:
        raise AuthError("replay", "both sides used the same nonce")
    we_are_lo = my_nonce < peer_nonce
    lo_key, hi_key = (my_key, peer_key) if we_are_lo else (peer_key, my_key)
    lo_nonce, hi_nonce = (my_nonce, peer_nonce) if we_are_lo else (peer_nonce, my_nonce)
    okm = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_SIZE, salt=LABEL,
               info=LABEL + b" session" + lo_nonce + hi_nonce).derive(lo_key + hi_key)
    lo_to_hi, hi_to_lo = okm[:KEY_SIZE], okm[KEY_SIZE:]
    return (lo_to_hi, hi_to_lo) if we_are_lo else (hi_to_lo, lo_to_hi)


# ---------------------------------------------------------------------------------- state machine
class LinkAuthenticator:
    """One link's handshake: ``start`` -> ``hello-received`` -> ``authenticated`` (or
    ``failed``). Sans-I/O: the caller moves the blobs."""

    def __init__(self, keyring: KeyRing, *, my_name: str, my_role: int = 1,
                 key_id: str | None = None, encrypt: bool = False,
                 replay_cache: ReplayCache | None = None, nonce: bytes | None = None,
                 require_endpoints: bool = False) -> None:
        kid = key_id or keyring.default_id
        if kid is None or kid not in keyring:
            raise ValueError("LinkAuthenticator needs a key id present in the key ring")
        self.keyring = keyring
        self.my_name = my_name
        self.my_role = int(my_role)
        self.key_id = kid
        self.my_flags = ((FLAG_ENCRYPT if encrypt else 0)
                         | (FLAG_REQUIRE_ENDPOINTS if require_endpoints else 0))
        self.replay_cache = replay_cache
        self._creds, self.my_nonce = make_hello_credentials(kid, encrypt, nonce,
                                                            require_endpoints)
        self.state = "start"
        self.peer: HelloCredentials | None = None
        self.peer_name = ""
        self.peer_role = 0

    def hello_credentials(self) -> bytes:
        return self._creds

    def _fail(self, reason: str, detail: str) -> AuthError:
        self.state = "failed"
        return AuthError(reason, detail)

    def on_peer_hello(self, peer_name: str, peer_role: int, credentials: bytes) -> bytes:
        """Check the peer's HELLO credentials; return our AUTH message to send."""
        if self.state != "start":
            raise self._fail("state", f"peer HELLO in state {self.state}")
        try:
            creds = parse_hello_credentials(credentials)
        except AuthError:
            self.state = "failed"
            raise
        if creds.key_id not in self.keyring:
            raise self._fail("unknown-key", f"peer {peer_name!r} uses key id "
                                            f"{creds.key_id!r}, which this node does not hold")
        if creds.nonce == self.my_nonce:
            raise self._fail("replay", "the peer echoed our own nonce")
        if self.replay_cache is not None and not self.replay_cache.check_and_add(creds.nonce):
            raise self._fail("replay", f"peer {peer_name!r} reused a HELLO nonce")
        self.peer, self.peer_name, self.peer_role = creds, peer_name, int(peer_role)
        self.state = "hello-received"
        key = self.keyring.get(self.key_id)
        assert key is not None
        proof = make_proof(key, self.my_nonce, creds.nonce, self.my_name, peer_name,
                           self.my_role, self.key_id, self.my_flags, creds.flags)
        return encode_auth(proof)

    def on_peer_auth(self, message: bytes) -> None:
        """Check the peer's proof; afterwards :attr:`authenticated` is True."""
        if self.state != "hello-received" or self.peer is None:
            raise self._fail("state", f"AUTH in state {self.state}")
        try:
            proof = decode_auth(message)
        except AuthError:
            self.state = "failed"
            raise
        peer = self.peer
        key = self.keyring.get(peer.key_id)
        assert key is not None
        if not verify_proof(proof, key, peer.nonce, self.my_nonce, self.peer_name,
                            self.my_name, self.peer_role, peer.key_id, peer.flags,
                            self.my_flags):
            raise self._fail("bad-proof", f"peer {self.peer_name!r} does not hold key "
                                          f"{peer.key_id!r} (or tampered with the handshake)")
        self.state = "authenticated"

    @property
    def authenticated(self) -> bool:
        return self.state == "authenticated"

    @property
    def encrypt(self) -> bool:
        """Encryption is on if either side asked for it."""
        return bool((self.my_flags | (self.peer.flags if self.peer else 0)) & FLAG_ENCRYPT)

    def session_keys(self) -> tuple[bytes, bytes]:
        if not self.authenticated or self.peer is None:
            raise AuthError("state", "session keys exist only after authentication")
        my_key = self.keyring.get(self.key_id)
        peer_key = self.keyring.get(self.peer.key_id)
        assert my_key is not None and peer_key is not None
        return derive_session_keys(my_key, peer_key, self.my_nonce, self.peer.nonce)

    def cipher(self, ordered: bool = True) -> LinkCipher | None:
        """The link's cipher if encryption was negotiated, else None."""
        if not self.encrypt:
            return None
        send, recv = self.session_keys()
        return LinkCipher(send, recv, ordered=ordered)


# ---------------------------------------------------------------------------------- records
class LinkCipher:
    """ChaCha20-Poly1305 per direction with a 64-bit counter nonce.

    ``seal(frame) -> counter (8) | ciphertext | tag (16)``; ``open`` reverses it and refuses
    replays: with ``ordered=True`` (TCP) the counter must be exactly the next one
    (``replay`` if lower, ``out-of-order`` if higher); with ``ordered=False`` (datagrams)
    any counter newer than the last 64 received is accepted once.
    """

    WINDOW = 64

    __slots__ = ("_rx", "_rx_bits", "_rx_next", "_tx", "_tx_ctr", "ordered")

    def __init__(self, send_key: bytes, recv_key: bytes, ordered: bool = True) -> None:
        self._tx = ChaCha20Poly1305(send_key)
        self._rx = ChaCha20Poly1305(recv_key)
        self._tx_ctr = 0
        self._rx_next = 0  #: lowest counter never accepted above the window (ordered: next)
        self._rx_bits = 0  #: unordered: bit i set = counter (_rx_next - 1 - i) seen
        self.ordered = ordered

    @property
    def sent(self) -> int:
        return self._tx_ctr

    def seal(self, frame: bytes | bytearray | memoryview) -> bytes:
        ctr = self._tx_ctr
        if ctr >= 0xFFFFFFFFFFFFFFFF:
            raise CipherError("exhausted", "send counter exhausted; reconnect to re-key")
        self._tx_ctr = ctr + 1
        c = _COUNTER.pack(ctr)
        return c + self._tx.encrypt(b"\0\0\0\0" + c, bytes(frame), None)

    def seal_record(self, frame: bytes | bytearray | memoryview) -> bytes:
        """``seal`` plus the u32 length prefix used on streams."""
        return encode_record(self.seal(frame))

    def open(self, record: bytes | bytearray | memoryview) -> bytes:
        if len(record) < _MIN_RECORD:
            raise CipherError("truncated", f"sealed record of {len(record)} bytes")
        (ctr,) = _COUNTER.unpack_from(record)
        if self.ordered:
            if ctr != self._rx_next:
                raise CipherError("replay" if ctr < self._rx_next else "out-of-order",
                                  f"record {ctr}, expected {self._rx_next}")
        elif ctr < self._rx_next:
            age = self._rx_next - 1 - ctr
            if age >= self.WINDOW or self._rx_bits >> age & 1:
                raise CipherError("replay", f"record {ctr} already seen or too old")
        try:
            plain = self._rx.decrypt(b"\0\0\0\0" + bytes(record[:8]), bytes(record[8:]), None)
        except InvalidTag:
            raise CipherError("bad-tag", "record failed authentication") from None
        if self.ordered or ctr >= self._rx_next:
            shift = ctr + 1 - self._rx_next
            self._rx_bits = ((self._rx_bits << shift) | 1) & ((1 << self.WINDOW) - 1) \
                if shift < self.WINDOW else 1
            self._rx_next = ctr + 1
        else:
            self._rx_bits |= 1 << (self._rx_next - 1 - ctr)
        return plain


def encode_record(sealed: bytes) -> bytes:
    return _REC_LEN.pack(len(sealed)) + sealed


class RecordDecoder:
    """Splits an encrypted TCP stream into sealed records (sans-I/O).

    ``feed(data)`` returns the complete records (each ``counter | ciphertext``) and raises
    :class:`RecordError` as soon as a length prefix is impossible (``oversized`` above
    *max_record*, ``undersized`` below the 24 bytes of counter and tag), before buffering
    the body. Garbage that is well framed fails later, in :meth:`LinkCipher.open`.
    """

    __slots__ = ("_buf", "max_record")

    def __init__(self, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self._buf = bytearray()
        self.max_record = max_record

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = _REC_LEN.unpack_from(buf, pos)
            if size > self.max_record:
                buf.clear()
                raise RecordError("oversized", f"record of {size} bytes exceeds "
                                               f"{self.max_record}")
            if size < _MIN_RECORD:
                buf.clear()
                raise RecordError("undersized", f"record of {size} bytes is shorter than "
                                                f"its counter and tag")
            if n - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4:pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


class SecureStream:
    """An encrypted TCP link's byte stream: frames in, records out, and back.

    ``encode(frame_bytes) -> bytes`` to write; ``decode(data) -> list[bytes]`` of decrypted
    plaintext chunks (feed them to the link's ordinary ``FrameDecoder``). Raises
    :class:`RecordError` / :class:`CipherError`; the link must then be dropped.
    """

    __slots__ = ("cipher", "decoder")

    def __init__(self, cipher: LinkCipher, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self.cipher = cipher
        self.decoder = RecordDecoder(max_record)

    def encode(self, plain: bytes | bytearray | memoryview) -> bytes:
        return self.cipher.seal_record(plain)

    def decode(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        return [self.cipher.open(r) for r in self.decoder.feed(data)]
