"""Authenticated links with forward secrecy: the HELLO/AUTH handshake. Sans-I/O.
Imports :mod:`flowrouter.wire.linksecrets`, :mod:`flowrouter.wire.linkrecords` and
``cryptography``; re-exports their public names, so callers import from here.

The router core (or runtime) drives one :class:`LinkAuthenticator` per link:

1. both sides put :meth:`LinkAuthenticator.hello_credentials` in their HELLO's
   ``credentials`` (they send HELLO at the same time, nobody waits for the other): a fresh
   nonce and a fresh X25519 ephemeral public key;
2. on the peer's HELLO, :meth:`~LinkAuthenticator.on_peer_hello` checks its credentials,
   computes the ephemeral Diffie-Hellman secret and returns our AUTH message (a proof that we
   hold the pre-shared key, bound to both nonces and both ephemeral keys);
3. on the peer's AUTH, :meth:`~LinkAuthenticator.on_peer_auth` checks its proof; the link is
   then authenticated and, if either side asked for it, :meth:`~LinkAuthenticator.cipher`
   returns the link's :class:`LinkCipher`. Every failure raises :class:`AuthError` with a
   stable ``reason``: ``unknown-key``, ``bad-proof``, ``missing-credentials``, ``replay``,
   ``malformed``, ``version`` (the peer speaks another handshake version) or ``state``.

On a datagram link any handshake message may be lost, so each side repeats its last ones
unchanged (the same HELLO, the same AUTH) until the next step arrives. A repeat is recognised
by its bytes (:meth:`~LinkAuthenticator.is_repeated_hello`,
:meth:`~LinkAuthenticator.is_repeated_auth`) and answered with the same AUTH as before
(:attr:`~LinkAuthenticator.auth_message`): it starts no new session, consults no replay
cache and reveals nothing a listener has not seen, while a HELLO with a nonce seen before on
any other handshake still fails with ``replay``.

As in TLS 1.3's PSK-DHE mode and WireGuard, the pre-shared key *authenticates* and the
ephemeral exchange *keys* the session: the ephemeral private keys live only for one handshake,
so someone who records a link and later obtains the site key still cannot open the records.

Wire formats (version 3; older peers are refused with ``version``, so an old peer fails
loudly at the handshake: version 1 had no ephemeral exchange (no forward secrecy), version 2
restarted record numbers at each key update, which let an on-path attacker delete the records
before an update unnoticed, see :mod:`flowrouter.wire.linkrecords`)
---------------------------------------------------------------------------------------------
HELLO credentials (68 + n bytes)::

    version (1) = 3 | scheme (1) = 2 (PSK-HMAC-SHA256 + X25519) | flags (1): bit 0 = encrypt,
    bit 1 = the router requires applications to authenticate | nonce (32, random)
    | ephemeral X25519 public key (32) | key id length n (1) | key id (n, UTF-8, 1..64)

AUTH message (34 bytes; the caller carries it, e.g. as a link-local control payload)::

    version (1) = 3 | kind (1) = 2 | proof (32)

Proof (each side computes its own; the peer recomputes it with the arguments swapped)::

    proof = HMAC-SHA256(key, b"flownet-link-v3" || my_nonce || peer_nonce || my_eph || peer_eph
                             || len8(my_name) || my_name || len8(peer_name) || peer_name
                             || role || len8(key_id) || key_id || my_flags || peer_flags)

``role`` is the prover's HELLO role byte (ROUTER 1, ENDPOINT 2); names are the UTF-8 names of
the HELLOs (cut to 255 bytes like the HELLO does); lengths are single bytes so no two inputs
concatenate alike. Binding both nonces makes a proof useless on any other link (a recorded
AUTH never verifies again: our nonce is fresh); binding both ephemeral keys stops a
man-in-the-middle from substituting his own; binding both flag bytes stops him from
stripping the encryption request unnoticed (downgrade). A peer nonce seen before
(:class:`ReplayCache`), or equal to ours (reflection), fails with ``replay``.

Session keys: ``HKDF-SHA256(ikm = X25519(my_eph, peer_eph) || key_lo || key_hi,
salt = b"flownet-link-v3", info = b"flownet-link-v3 session" || nonce_lo || nonce_hi
|| eph_lo || eph_hi, length 64)``, where ``lo`` is the side with the smaller nonce; the first
32 bytes key the lo -> hi direction, the rest hi -> lo. Records, key updates (rekeying) and
stream framing are in :mod:`flowrouter.wire.linkrecords`. HELLO and AUTH travel in clear;
everything after the AUTH messages is sealed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flowrouter.wire.linkrecords import (
    DEFAULT_MAX_RECORD,
    DEFAULT_REKEY_INTERVAL,
    DEFAULT_REKEY_RECORDS,
    RECORD_OVERHEAD,
    CipherError,
    LinkCipher,
    RecordDecoder,
    RecordError,
    SecureStream,
    encode_record,
)
from flowrouter.wire.linksecrets import (
    KEY_SIZE,
    MAX_KEY_ID,
    KeyRing,
    LinkSecurityError,
    ReplayCache,
    check_key_id,
    parse_secret,
)

__all__ = [
    "DEFAULT_MAX_RECORD",
    "DEFAULT_REKEY_INTERVAL",
    "DEFAULT_REKEY_RECORDS",
    "KEY_SIZE",
    "MAX_KEY_ID",
    "RECORD_OVERHEAD",
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

VERSION = 3
SCHEME_PSK_X25519 = 2
KIND_AUTH = 2
FLAG_ENCRYPT = 0x01
#: set by a router that requires applications to authenticate, so a client without a key can
#: fail at once with a clear message instead of after the router's refusal
FLAG_REQUIRE_ENDPOINTS = 0x02
NONCE_SIZE = 32
PUBLIC_SIZE = 32
PROOF_SIZE = 32
#: in every proof and session key, so a handshake cannot be passed off as another version's
LABEL = b"flownet-link-v3"

_CRED = struct.Struct("!BBB32s32sB")  # version, scheme, flags, nonce, ephemeral, key id length
_AUTH = struct.Struct("!BB32s")


class AuthError(LinkSecurityError):
    """The link cannot be authenticated; close it (after telling the peer why)."""


class HelloCredentials:
    __slots__ = ("ephemeral", "flags", "key_id", "nonce")

    def __init__(self, key_id: str, nonce: bytes, flags: int, ephemeral: bytes) -> None:
        self.key_id = key_id
        self.nonce = nonce
        self.flags = flags
        self.ephemeral = ephemeral

    @property
    def encrypt(self) -> bool:
        return bool(self.flags & FLAG_ENCRYPT)

    def __repr__(self) -> str:
        return (f"HelloCredentials(key_id={self.key_id!r}, nonce={self.nonce.hex()[:16]}..., "
                f"flags={self.flags:#x})")


def _public_bytes(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes_raw()


def make_hello_credentials(key_id: str, encrypt: bool = False, nonce: bytes | None = None,
                           require_endpoints: bool = False, ephemeral: bytes | None = None
                           ) -> tuple[bytes, bytes]:
    """(credentials blob for our HELLO, our nonce). The nonce is fresh unless given;
    *ephemeral* is our X25519 public key (a throwaway one when not given)."""
    kid = check_key_id(key_id)
    if nonce is None:
        nonce = os.urandom(NONCE_SIZE)
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"nonce must be {NONCE_SIZE} bytes")
    if ephemeral is None:
        ephemeral = _public_bytes(X25519PrivateKey.generate())
    if len(ephemeral) != PUBLIC_SIZE:
        raise ValueError(f"an ephemeral public key is {PUBLIC_SIZE} bytes")
    flags = (FLAG_ENCRYPT if encrypt else 0) | (FLAG_REQUIRE_ENDPOINTS if require_endpoints
                                                else 0)
    blob = _CRED.pack(VERSION, SCHEME_PSK_X25519, flags, nonce, ephemeral, len(kid)) + kid
    return blob, nonce


def parse_hello_credentials(blob: bytes | bytearray | memoryview) -> HelloCredentials:
    """Decode a HELLO credentials blob; AuthError ``missing-credentials``, ``version`` or
    ``malformed``."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise AuthError("malformed", "credentials must be bytes")
    blob = bytes(blob)
    if not blob:
        raise AuthError("missing-credentials", "the peer's HELLO carries no credentials")
    if blob[0] != VERSION:
        raise AuthError("version", f"link-auth version {blob[0]} (this node speaks {VERSION}: "
                                   "forward secrecy, record numbers that go on across key "
                                   "updates); upgrade the older side")
    if len(blob) < _CRED.size:
        raise AuthError("malformed", f"credentials of {len(blob)} bytes are truncated")
    _, scheme, flags, nonce, ephemeral, n = _CRED.unpack_from(blob)
    if scheme != SCHEME_PSK_X25519:
        raise AuthError("malformed", f"unknown link-auth scheme {scheme}")
    if flags & ~(FLAG_ENCRYPT | FLAG_REQUIRE_ENDPOINTS):
        raise AuthError("malformed", f"unknown link-auth flags {flags:#x}")
    if not 0 < n <= MAX_KEY_ID or len(blob) != _CRED.size + n:
        raise AuthError("malformed", "bad key id length")
    try:
        key_id = blob[_CRED.size:].decode("utf-8")
    except UnicodeDecodeError:
        raise AuthError("malformed", "key id is not UTF-8") from None
    return HelloCredentials(key_id, nonce, flags, ephemeral)


def _name(name: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > 255:  # the HELLO carries at most 255 bytes, cut on a character boundary
        raw = raw[:255].decode("utf-8", "ignore").encode("utf-8")
    return bytes([len(raw)]) + raw


def make_proof(key: bytes, my_nonce: bytes, peer_nonce: bytes, my_name: str, peer_name: str,
               role: int, key_id: str = "", my_flags: int = 0, peer_flags: int = 0,
               my_ephemeral: bytes = b"", peer_ephemeral: bytes = b"") -> bytes:
    """HMAC-SHA256 proof that the holder of *key* speaks on this link (see module docs)."""
    kid = key_id.encode("utf-8")
    msg = b"".join((LABEL, my_nonce, peer_nonce, my_ephemeral, peer_ephemeral,
                    _name(my_name), _name(peer_name),
                    bytes([role & 0xFF]), bytes([len(kid)]), kid,
                    bytes([my_flags & 0xFF, peer_flags & 0xFF])))
    return hmac.new(key, msg, hashlib.sha256).digest()


def verify_proof(proof: bytes, key: bytes, my_nonce: bytes, peer_nonce: bytes, my_name: str,
                 peer_name: str, role: int, key_id: str = "", my_flags: int = 0,
                 peer_flags: int = 0, my_ephemeral: bytes = b"",
                 peer_ephemeral: bytes = b"") -> bool:
    """Constant-time check of a proof computed with :func:`make_proof`'s arguments (from the
    prover's point of view)."""
    expected = make_proof(key, my_nonce, peer_nonce, my_name, peer_name, role, key_id,
                          my_flags, peer_flags, my_ephemeral, peer_ephemeral)
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


def derive_session_keys(my_key: bytes, peer_key: bytes, my_nonce: bytes, peer_nonce: bytes,
                        dh_secret: bytes, my_ephemeral: bytes = b"",
                        peer_ephemeral: bytes = b"") -> tuple[bytes, bytes]:
    """(key for what we send, key for what we receive), both 32 bytes, from the ephemeral
    Diffie-Hellman secret mixed with both pre-shared keys."""
    if my_nonce == peer_nonce:
        raise AuthError("replay", "both sides used the same nonce")
    if len(dh_secret) != 32:
        raise AuthError("state", "session keys need the 32-byte ephemeral secret")
    we_are_lo = my_nonce < peer_nonce
    lo_key, hi_key = (my_key, peer_key) if we_are_lo else (peer_key, my_key)
    lo_nonce, hi_nonce = (my_nonce, peer_nonce) if we_are_lo else (peer_nonce, my_nonce)
    lo_eph, hi_eph = ((my_ephemeral, peer_ephemeral) if we_are_lo
                      else (peer_ephemeral, my_ephemeral))
    okm = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_SIZE, salt=LABEL,
               info=LABEL + b" session" + lo_nonce + hi_nonce + lo_eph + hi_eph
               ).derive(dh_secret + lo_key + hi_key)
    lo_to_hi, hi_to_lo = okm[:KEY_SIZE], okm[KEY_SIZE:]
    return (lo_to_hi, hi_to_lo) if we_are_lo else (hi_to_lo, lo_to_hi)


class LinkAuthenticator:
    """One link's handshake: ``start`` -> ``hello-received`` -> ``authenticated`` (or
    ``failed``). Sans-I/O: the caller moves the blobs."""

    def __init__(self, keyring: KeyRing, *, my_name: str, my_role: int = 1,
                 key_id: str | None = None, encrypt: bool = False,
                 replay_cache: ReplayCache | None = None, nonce: bytes | None = None,
                 require_endpoints: bool = False,
                 rekey_records: int = DEFAULT_REKEY_RECORDS) -> None:
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
        self.rekey_records = rekey_records
        #: the ephemeral private key lives until the session keys are derived, no longer
        self._ephemeral: X25519PrivateKey | None = X25519PrivateKey.generate()
        self.my_ephemeral = _public_bytes(self._ephemeral)
        self._creds, self.my_nonce = make_hello_credentials(
            kid, encrypt, nonce, require_endpoints, self.my_ephemeral)
        self._dh: bytes | None = None
        self._keys: tuple[bytes, bytes] | None = None
        #: what this handshake accepted and answered (credentials, the peer's AUTH, our
        #: AUTH): a datagram link's lost message is repeated byte for byte, and a repeat is
        #: recognised by these bytes, never taken for a new session
        self._peer_creds = b""
        self._peer_auth = b""
        self.auth_message = b""
        self.state = "start"
        self.peer: HelloCredentials | None = None
        self.peer_name = ""
        self.peer_role = 0

    def hello_credentials(self) -> bytes:
        return self._creds

    def _fail(self, reason: str, detail: str) -> AuthError:
        self.state = "failed"
        self._ephemeral = None
        self._dh = None
        return AuthError(reason, detail)

    def on_peer_hello(self, peer_name: str, peer_role: int, credentials: bytes) -> bytes:
        """Check the peer's HELLO credentials; return our AUTH message to send."""
        if self.state != "start" or self._ephemeral is None:
            raise self._fail("state", f"peer HELLO in state {self.state}")
        try:
            creds = parse_hello_credentials(credentials)
        except AuthError as exc:
            raise self._fail(exc.reason, exc.detail) from None
        if creds.key_id not in self.keyring:
            raise self._fail("unknown-key", f"peer {peer_name!r} uses key id "
                                            f"{creds.key_id!r}, which this node does not hold")
        if creds.nonce == self.my_nonce or creds.ephemeral == self.my_ephemeral:
            raise self._fail("replay", "the peer echoed our own nonce")
        if self.replay_cache is not None and not self.replay_cache.check_and_add(creds.nonce):
            raise self._fail("replay", f"peer {peer_name!r} reused a HELLO nonce")
        try:
            self._dh = self._ephemeral.exchange(X25519PublicKey.from_public_bytes(
                creds.ephemeral))
        except ValueError:  # a low-order point: the shared secret would be all zeros
            raise self._fail("malformed", "the peer's ephemeral key is not usable") from None
        self._ephemeral = None  # forward secrecy: the private half is needed no more
        self.peer, self.peer_name, self.peer_role = creds, peer_name, int(peer_role)
        self._peer_creds = bytes(credentials)
        self.state = "hello-received"
        key = self.keyring.get(self.key_id)
        assert key is not None
        proof = make_proof(key, self.my_nonce, creds.nonce, self.my_name, peer_name,
                           self.my_role, self.key_id, self.my_flags, creds.flags,
                           self.my_ephemeral, creds.ephemeral)
        self.auth_message = encode_auth(proof)
        return self.auth_message

    def is_repeated_hello(self, peer_name: str, peer_role: int, credentials: bytes) -> bool:
        """Whether this HELLO is, byte for byte, the one this handshake already accepted
        (a datagram link's peer repeats its HELLO until our answer arrives). A repeat
        changes nothing: it is answered with :attr:`auth_message` (the same bytes as
        before, revealing nothing new), and the replay cache is not asked, so the repeat is
        neither refused as a replay nor ever taken for a second session. Any other HELLO
        after the first is not a repeat (the caller refuses or restarts the link)."""
        return (self.state in ("hello-received", "authenticated")
                and bytes(credentials) == self._peer_creds and peer_name == self.peer_name
                and int(peer_role) == self.peer_role)

    def is_repeated_auth(self, message: bytes) -> bool:
        """Whether this AUTH is, byte for byte, the one that authenticated this handshake
        (the peer lost our AUTH and repeats its own): answered with :attr:`auth_message`,
        it proves nothing new and changes nothing."""
        return self.state == "authenticated" and bytes(message) == self._peer_auth

    def on_peer_auth(self, message: bytes) -> None:
        """Check the peer's proof; afterwards :attr:`authenticated` is True."""
        if self.state != "hello-received" or self.peer is None:
            raise self._fail("state", f"AUTH in state {self.state}")
        try:
            proof = decode_auth(message)
        except AuthError as exc:
            raise self._fail(exc.reason, exc.detail) from None
        peer = self.peer
        key = self.keyring.get(peer.key_id)
        assert key is not None
        if not verify_proof(proof, key, peer.nonce, self.my_nonce, self.peer_name,
                            self.my_name, self.peer_role, peer.key_id, peer.flags,
                            self.my_flags, peer.ephemeral, self.my_ephemeral):
            raise self._fail("bad-proof", f"peer {self.peer_name!r} does not hold key "
                                          f"{peer.key_id!r} (or tampered with the handshake)")
        my_key = self.keyring.get(self.key_id)
        assert my_key is not None and self._dh is not None
        self._keys = derive_session_keys(my_key, key, self.my_nonce, peer.nonce, self._dh,
                                         self.my_ephemeral, peer.ephemeral)
        self._dh = None
        self._peer_auth = bytes(message)
        self.state = "authenticated"

    @property
    def authenticated(self) -> bool:
        return self.state == "authenticated"

    @property
    def encrypt(self) -> bool:
        """Encryption is on if either side asked for it."""
        return bool((self.my_flags | (self.peer.flags if self.peer else 0)) & FLAG_ENCRYPT)

    def session_keys(self) -> tuple[bytes, bytes]:
        if not self.authenticated or self._keys is None:
            raise AuthError("state", "session keys exist only after authentication")
        return self._keys

    def cipher(self, ordered: bool = True) -> LinkCipher | None:
        """The link's cipher if encryption was negotiated, else None. The session keys are
        handed over once and forgotten here (the cipher ratchets them forward)."""
        if not self.encrypt:
            return None
        send, recv = self.session_keys()
        self._keys = None
        return LinkCipher(send, recv, ordered=ordered, rekey_records=self.rekey_records)
