"""Flow capabilities: who may join a flow or send on it, signed by the flow's creator (Ed25519).

Seed 002 section 6.1 asks for access control per flow, per band and on the maximum locality,
decided above the router by whoever owns the flow, and checked cheaply in the network. This
module is the self-contained building block; the router core calls it.

Self-certifying creators
------------------------
A creator's 64-bit ID (the first 64 bits of every FlowID it creates) is derived from its
Ed25519 public key::

    creator_id = int.from_bytes(sha256(b"flownet-creator" + pubkey_raw).digest()[:8], "big")

So the key *is* the name space: anybody can check that a signed record about flow
``creator:lsid:local`` was signed by the owner of ``creator``, without any directory or PKI,
and nobody can issue capabilities or policies for another creator's flows without its private
key. (Squatting a creator ID means a 2^64 second-preimage search on SHA-256.) Creators whose
ID was not derived this way (the random IDs of ``LocalIdAllocator``) simply cannot protect
their flows: flows without a policy stay open, as in the seed.

Records
-------
Two signed records share one encoding style: a 4-byte prefix ``b"FN" | version | kind``,
fixed-size big-endian fields, then the issuer's 32-byte public key and a 64-byte Ed25519
signature over every byte before the signature. The kind byte keeps a capability from ever
being read as a policy (and vice versa).

Capability (kind 1, version 1), 177 bytes + subject::

    off  size  field
    0    2     magic b"FN"
    2    1     version (1)
    3    1     kind (1 = capability)
    4    1     flags: bit 0 = creator-wide (all flows of the creator); other bits must be 0
    5    16    flow key (creator | lsid | local); creator-wide: creator | 8 zero bytes
    21   1     subject length n (0 < n <= 255)
    22   n     subject, UTF-8: an endpoint name, or "*" for anyone
    22+n 16    join band mask (bit b = may receive band b)
    38+n 16    send band mask (bit b = may send on band b)
    54+n 3     max locality value for BANDWIDTH, DELAY, GEOGRAPHY (255 = unlimited)
    57+n 8     not-before, unix seconds
    65+n 8     expiry, unix seconds (exclusive)
    73+n 8     serial (for revocation; unique per creator)
    81+n 32    issuer public key (raw Ed25519)
    113+n 64   signature over bytes 0 .. 113+n

A message without a locality budget (type NONE) travels unbounded, so it is allowed only
when the capability limits no locality type at all.

Policy (kind 2, version 1), 135 bytes + 8 per revoked serial::

    off  size  field
    0    2     magic b"FN"
    2    1     version (1)
    3    1     kind (2 = policy)
    4    1     flags: bit 0 creator-wide, bit 1 joins need a capability,
                      bit 2 sends need a capability
    5    16    flow key (as above)
    21   8     policy version (a newer version replaces an older one)
    29   8     issued at, unix seconds (informational)
    37   2     number of revoked serials r (<= MAX_REVOKED)
    39   8*r   revoked serials (uint64)
    39+8r 32   issuer public key
    71+8r 64   signature

Deployment (the router integrates this): the creator hands its Policy to the flow's core (the
location service) when it creates/advertises the flow; the core / first on-tree router checks
the capability carried by a join, the first-hop router checks the capability of a sender;
flows with no policy stay open. The router-side state is
:class:`flowrouter.core.policystore.PolicyStore`; creators' keys are
:mod:`flowrouter.wire.creators`.

Costs: a cold ``verify()`` is one Ed25519 verification (tens of microseconds); repeated checks
of the same token hit :class:`VerifyCache` (a dictionary lookup). See the tests for numbers.
"""

from __future__ import annotations

import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from flowrouter.wire.bands import ALL_BANDS, NUM_BANDS, BandMask, mask_of
from flowrouter.wire.creators import PUBKEY_SIZE, CreatorKey, creator_id_of
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import Locality

__all__ = [
    "MAX_REVOKED",
    "UNLIMITED",
    "Capability",
    "CapabilityError",
    "CreatorKey",
    "Policy",
    "VerifyCache",
    "creator_id_of",
    "verify",
    "verify_policy",
]

MAGIC = b"FN"
VERSION = 1
KIND_CAPABILITY = 1
KIND_POLICY = 2

FLAG_CREATOR_WIDE = 0x01
POLICY_JOIN = 0x02
POLICY_SEND = 0x04

UNLIMITED = 255  #: max locality value meaning "no limit for this type"
MAX_REVOKED = 1024  #: revoked serials one policy may carry (8 KB)
SIG_SIZE = 64
WILDCARD_SUBJECT = "*"

_PREFIX = struct.Struct("!2sBBB16s")  # magic, version, kind, flags, flow key (21 bytes)
_CAP_TAIL = struct.Struct("!16s16s3BQQQ")  # join, send, 3 locality maxima, nbf, exp, serial
_POL_MID = struct.Struct("!QQH")  # policy version, issued at, revoked count

#: Reasons carried by :class:`CapabilityError` (stable strings: use them as counter keys).
REASONS = frozenset({
    "malformed", "bad-signature", "expired", "not-yet-valid", "wrong-flow", "wrong-creator",
    "wrong-subject", "revoked", "missing", "band-denied", "locality-denied", "stale-policy",
})


class CapabilityError(ValueError):
    """A token or policy that must not be honoured; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# ---------------------------------------------------------------------------------- helpers
def _flow_key_of(target: FlowID | bytes | int) -> tuple[bytes, bool]:
    """(16-byte key, creator_wide) for a FlowID, a 16-byte key, or a bare creator ID."""
    if isinstance(target, FlowID):
        return target.key, False
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < 1 << 64:
            raise ValueError("a creator ID is 64 bits")
        return target.to_bytes(8, "big") + bytes(8), True
    if isinstance(target, (bytes, bytearray, memoryview)) and len(target) == 16:
        return bytes(target), False
    raise TypeError("flow_or_creator must be a FlowID, a 16-byte flow key, or a creator ID")


def _locality_tuple(value: int | Mapping[int | str, int] | Iterable[int] | None
                    ) -> tuple[int, int, int]:
    """Normalise a max-locality spec to (bandwidth, delay, geography), 255 = unlimited."""
    if value is None:
        return (UNLIMITED, UNLIMITED, UNLIMITED)
    if isinstance(value, bool):
        raise TypeError("max_locality must be a number, a mapping or three numbers")
    if isinstance(value, int):
        out = [value] * 3
    elif isinstance(value, Mapping):
        out = [UNLIMITED] * 3
        for k, v in value.items():
            t = Locality.parse(k)
            if t is Locality.NONE:
                raise ValueError("locality type NONE has no value to limit")
            out[t - 1] = v
    else:
        out = list(value)
        if len(out) != 3:
            raise ValueError("max_locality sequence must be (bandwidth, delay, geography)")
    for v in out:
        if not isinstance(v, int) or not 0 <= v <= 255:
            raise ValueError(f"locality maxima are 0..255, got {v!r}")
    return (out[0], out[1], out[2])


def _check_sig(pub: bytes, sig: bytes, body: bytes) -> None:
    try:
        Ed25519PublicKey.from_public_bytes(pub).verify(sig, body)
    except (InvalidSignature, ValueError):
        raise CapabilityError("bad-signature", "Ed25519 signature does not verify") from None


def _decode_prefix(raw: bytes, kind: int, what: str) -> tuple[int, bytes]:
    if len(raw) < _PREFIX.size:
        raise CapabilityError("malformed", f"{what} of {len(raw)} bytes is truncated")
    magic, version, k, flags, key = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise CapabilityError("malformed", f"{what} has a wrong magic")
    if version != VERSION:
        raise CapabilityError("malformed", f"{what} version {version} is not supported "
                                           f"(this node speaks {VERSION})")
    if k != kind:
        raise CapabilityError("malformed", f"record kind {k} is not a {what}")
    return flags, key


def _check_target(flags: int, key: bytes, what: str) -> None:
    if flags & FLAG_CREATOR_WIDE and any(key[8:]):
        raise CapabilityError("malformed", f"creator-wide {what} with a non-zero flow part")


def _as_bytes(raw: object, what: str) -> bytes:
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return bytes(raw)
    raise CapabilityError("malformed", f"{what} must be bytes, got {type(raw).__name__}")


# ---------------------------------------------------------------------------------- capability
@dataclass(frozen=True, slots=True)
class Capability:
    """A decoded capability token (see the module docs for the byte layout)."""

    flow_key: bytes  #: 16 bytes; for a creator-wide token: creator | 8 zero bytes
    creator_wide: bool
    subject: str
    join: int  #: band mask as an int (bit b = band b)
    send: int
    max_locality: tuple[int, int, int]  #: bandwidth, delay, geography; 255 = unlimited
    not_before: int
    expiry: int
    serial: int
    issuer: bytes  #: raw Ed25519 public key
    signature: bytes
    raw: bytes = field(repr=False, compare=False)

    # construction ------------------------------------------------------------------------------
    @classmethod
    def issue(cls, key: CreatorKey, flow_or_creator: FlowID | bytes | int,
              subject: str = WILDCARD_SUBJECT, *,
              join: BandMask | int | str | Iterable[int] = 0,
              send: BandMask | int | str | Iterable[int] = 0,
              max_locality: int | Mapping[int | str, int] | Iterable[int] | None = None,
              ttl: float = 24 * 3600, not_before: int | None = None,
              serial: int | None = None, now: float | None = None) -> Capability:
        """Sign a token granting *subject* the *join* / *send* bands on a flow.

        ``flow_or_creator``: a FlowID (or its 16-byte key) for one flow, or the creator ID
        (an int) for all of the key's flows. Masks take anything :func:`bands.mask_of`
        takes, but an ``int`` here is a raw bit mask (use ``[33]`` for one band). ``ttl``:
        seconds from ``not_before`` (default: now) to expiry. ``serial``: random if omitted.
        """
        key16, wide = _flow_key_of(flow_or_creator)
        creator = int.from_bytes(key16[:8], "big")
        if creator != key.creator_id:
            raise ValueError(f"creator {creator:016x} is not the name space of this key "
                             f"({key.creator_id:016x})")
        raw_subject = subject.encode("utf-8")
        if not 0 < len(raw_subject) <= 255:
            raise ValueError("subject must be 1..255 bytes of UTF-8 (or '*')")
        join_bits = join if isinstance(join, int) and not isinstance(join, bool) else mask_of(join)
        send_bits = send if isinstance(send, int) and not isinstance(send, bool) else mask_of(send)
        for bits in (join_bits, send_bits):
            if not 0 <= bits <= ALL_BANDS:
                raise ValueError("band masks cover bands 0..127")
        loc = _locality_tuple(max_locality)
        t = int(time.time() if now is None else now)
        nbf = t if not_before is None else int(not_before)
        exp = nbf + int(ttl)
        if serial is None:
            serial = int.from_bytes(os.urandom(8), "big")
        for what, v in (("not_before", nbf), ("expiry", exp), ("serial", serial)):
            if not 0 <= v < 1 << 64:
                raise ValueError(f"{what} must fit in 64 bits")
        body = (_PREFIX.pack(MAGIC, VERSION, KIND_CAPABILITY, FLAG_CREATOR_WIDE if wide else 0,
                             key16)
                + bytes([len(raw_subject)]) + raw_subject
                + _CAP_TAIL.pack(join_bits.to_bytes(16, "big"), send_bits.to_bytes(16, "big"),
                                 *loc, nbf, exp, serial)
                + key.public_bytes)
        sig = key.sign(body)
        return cls(key16, wide, subject, join_bits, send_bits, loc, nbf, exp, serial,
                   key.public_bytes, sig, body + sig)

    @classmethod
    def decode(cls, raw: bytes | bytearray | memoryview) -> Capability:
        """Parse a token (no signature check: use :func:`verify`). Raises CapabilityError."""
        raw = _as_bytes(raw, "capability")
        flags, key = _decode_prefix(raw, KIND_CAPABILITY, "capability")
        if flags & ~FLAG_CREATOR_WIDE:
            raise CapabilityError("malformed", f"unknown capability flags {flags:#x}")
        _check_target(flags, key, "capability")
        pos = _PREFIX.size
        if len(raw) <= pos:
            raise CapabilityError("malformed", "capability truncated before the subject")
        n = raw[pos]
        pos += 1
        if n == 0:
            raise CapabilityError("malformed", "empty capability subject")
        expected = pos + n + _CAP_TAIL.size + PUBKEY_SIZE + SIG_SIZE
        if len(raw) != expected:
            raise CapabilityError("malformed", f"capability is {len(raw)} bytes, its subject "
                                               f"length says {expected}")
        try:
            subject = raw[pos:pos + n].decode("utf-8")
        except UnicodeDecodeError:
            raise CapabilityError("malformed", "capability subject is not UTF-8") from None
        pos += n
        join, send, bw, dl, geo, nbf, exp, serial = _CAP_TAIL.unpack_from(raw, pos)
        pos += _CAP_TAIL.size
        issuer = raw[pos:pos + PUBKEY_SIZE]
        sig = raw[pos + PUBKEY_SIZE:]
        return cls(key, bool(flags & FLAG_CREATOR_WIDE), subject, int.from_bytes(join, "big"),
                   int.from_bytes(send, "big"), (bw, dl, geo), nbf, exp, serial, issuer, sig,
                   raw)

    def encode(self) -> bytes:
        return self.raw

    # views ---------------------------------------------------------------------------------
    @property
    def creator(self) -> int:
        return int.from_bytes(self.flow_key[:8], "big")

    @property
    def flow(self) -> FlowID | None:
        """The flow this token is for (None for a creator-wide token)."""
        return None if self.creator_wide else FlowID.from_key(self.flow_key)

    @property
    def signed_body(self) -> bytes:
        return self.raw[:-SIG_SIZE]

    def covers(self, flow_key: bytes) -> bool:
        """Does this token name *flow_key* (exactly, or through its creator wildcard)?"""
        if self.creator_wide:
            return flow_key[:8] == self.flow_key[:8]
        return flow_key == self.flow_key

    def subject_ok(self, subject: str | None) -> bool:
        return self.subject == WILDCARD_SUBJECT or (subject is not None
                                                    and subject == self.subject)

    def may_join(self, mask: BandMask | int | str | Iterable[int]) -> bool:
        """True if every band of *mask* (an int is a raw bit mask) is granted for joining."""
        bits = mask if isinstance(mask, int) and not isinstance(mask, bool) else mask_of(mask)
        return bits & ~self.join == 0

    def may_send(self, band: int) -> bool:
        return 0 <= band < NUM_BANDS and bool(self.send >> band & 1)

    def locality_ok(self, loc_type: int, value: int) -> bool:
        """May a message carry this locality budget? Type NONE (unbounded) only if no type is
        limited; otherwise *value* must not exceed the maximum for its type."""
        if loc_type == Locality.NONE:
            return all(m == UNLIMITED for m in self.max_locality)
        if not 1 <= loc_type <= 3:
            return False
        limit = self.max_locality[loc_type - 1]
        return limit == UNLIMITED or value <= limit

    def __str__(self) -> str:
        target = (f"creator {self.creator:016x} (all flows)" if self.creator_wide
                  else str(FlowID.from_key(self.flow_key)))
        return (f"capability #{self.serial:016x} for {self.subject!r} on {target}: join "
                f"{BandMask(self.join)}, send {BandMask(self.send)}, locality max "
                f"{self.max_locality}, valid {self.not_before}..{self.expiry}")


RevokedSpec = Collection[int] | Callable[[int], bool] | None


def _is_revoked(revoked: RevokedSpec, serial: int) -> bool:
    if revoked is None:
        return False
    if callable(revoked):
        return bool(revoked(serial))
    return serial in revoked


def _check_creator(issuer: bytes, flow_key: bytes, what: str) -> None:
    if creator_id_of(issuer) != int.from_bytes(flow_key[:8], "big"):
        raise CapabilityError("wrong-creator", f"{what} issuer key does not own creator "
                                               f"{flow_key[:8].hex()}")


def verify(raw_or_cap: bytes | bytearray | memoryview | Capability, *, flow_key: bytes | FlowID,
           subject: str | None, now: float, revoked: RevokedSpec = None,
           cache: VerifyCache | None = None) -> Capability:
    """Check a token for use on *flow_key* by *subject* at time *now*; return it decoded.

    Cheap checks come first (format, flow, creator, subject, revocation, time) and the
    Ed25519 verification last, so junk costs no public-key work; with a :class:`VerifyCache`
    a token seen before skips the signature check. Raises :class:`CapabilityError` with
    reason ``malformed``, ``wrong-flow``, ``wrong-creator``, ``wrong-subject``, ``revoked``,
    ``not-yet-valid``, ``expired`` or ``bad-signature``.
    """
    if isinstance(flow_key, FlowID):
        flow_key = flow_key.key
    if isinstance(raw_or_cap, Capability):
        cap = raw_or_cap
    else:
        cap = cache.decode(raw_or_cap) if cache is not None else Capability.decode(raw_or_cap)
    if not cap.covers(flow_key):
        raise CapabilityError("wrong-flow", f"token is for {cap.flow_key.hex()}, not "
                                            f"{bytes(flow_key).hex()}")
    _check_creator(cap.issuer, cap.flow_key, "capability")
    if not cap.subject_ok(subject):
        raise CapabilityError("wrong-subject", f"token is for {cap.subject!r}, not {subject!r}")
    if _is_revoked(revoked, cap.serial):
        raise CapabilityError("revoked", f"serial {cap.serial:#x} is revoked")
    if now < cap.not_before:
        raise CapabilityError("not-yet-valid", f"valid from {cap.not_before}, now {int(now)}")
    if now >= cap.expiry:
        raise CapabilityError("expired", f"expired at {cap.expiry}, now {int(now)}")
    if cache is not None:
        cache.check_signature(cap)
    else:
        _check_sig(cap.issuer, cap.signature, cap.signed_body)
    return cap


# ---------------------------------------------------------------------------------- policy
@dataclass(frozen=True, slots=True)
class Policy:
    """A creator's signed statement that a flow (or all its flows) requires capabilities."""

    flow_key: bytes
    creator_wide: bool
    require_join: bool
    require_send: bool
    version: int
    issued_at: int
    revoked: frozenset[int]
    issuer: bytes
    signature: bytes
    raw: bytes = field(repr=False, compare=False)

    @classmethod
    def issue(cls, key: CreatorKey, flow_or_creator: FlowID | bytes | int, *, version: int,
              require_join: bool = True, require_send: bool = True,
              revoked: Iterable[int] = (), now: float | None = None) -> Policy:
        key16, wide = _flow_key_of(flow_or_creator)
        if int.from_bytes(key16[:8], "big") != key.creator_id:
            raise ValueError("a policy can only be issued for the key's own creator ID")
        serials = sorted(set(revoked))
        if len(serials) > MAX_REVOKED:
            raise ValueError(f"at most {MAX_REVOKED} revoked serials per policy")
        for s in serials:
            if not 0 <= s < 1 << 64:
                raise ValueError("serials are 64-bit")
        if not 0 <= version < 1 << 64:
            raise ValueError("policy version must fit in 64 bits")
        issued = int(time.time() if now is None else now)
        flags = ((FLAG_CREATOR_WIDE if wide else 0) | (POLICY_JOIN if require_join else 0)
                 | (POLICY_SEND if require_send else 0))
        body = (_PREFIX.pack(MAGIC, VERSION, KIND_POLICY, flags, key16)
                + _POL_MID.pack(version, issued, len(serials))
                + b"".join(s.to_bytes(8, "big") for s in serials) + key.public_bytes)
        sig = key.sign(body)
        return cls(key16, wide, require_join, require_send, version, issued,
                   frozenset(serials), key.public_bytes, sig, body + sig)

    @classmethod
    def decode(cls, raw: bytes | bytearray | memoryview) -> Policy:
        raw = _as_bytes(raw, "policy")
        flags, key = _decode_prefix(raw, KIND_POLICY, "policy")
        if flags & ~(FLAG_CREATOR_WIDE | POLICY_JOIN | POLICY_SEND):
            raise CapabilityError("malformed", f"unknown policy flags {flags:#x}")
        _check_target(flags, key, "policy")
        pos = _PREFIX.size
        if len(raw) < pos + _POL_MID.size:
            raise CapabilityError("malformed", "policy truncated")
        version, issued, n = _POL_MID.unpack_from(raw, pos)
        if n > MAX_REVOKED:
            raise CapabilityError("malformed", f"policy lists {n} revoked serials "
                                               f"(max {MAX_REVOKED})")
        pos += _POL_MID.size
        expected = pos + 8 * n + PUBKEY_SIZE + SIG_SIZE
        if len(raw) != expected:
            raise CapabilityError("malformed", f"policy is {len(raw)} bytes, expected "
                                               f"{expected}")
        revoked = frozenset(int.from_bytes(raw[pos + 8 * i:pos + 8 * i + 8], "big")
                            for i in range(n))
        pos += 8 * n
        return cls(key, bool(flags & FLAG_CREATOR_WIDE), bool(flags & POLICY_JOIN),
                   bool(flags & POLICY_SEND), version, issued, revoked,
                   raw[pos:pos + PUBKEY_SIZE], raw[pos + PUBKEY_SIZE:], raw)

    def encode(self) -> bytes:
        return self.raw

    @property
    def creator(self) -> int:
        return int.from_bytes(self.flow_key[:8], "big")

    def covers(self, flow_key: bytes) -> bool:
        if self.creator_wide:
            return flow_key[:8] == self.flow_key[:8]
        return flow_key == self.flow_key


def verify_policy(raw_or_policy: bytes | bytearray | memoryview | Policy) -> Policy:
    """Decode a policy and check that its issuer owns the creator ID and signed it."""
    pol = raw_or_policy if isinstance(raw_or_policy, Policy) else Policy.decode(raw_or_policy)
    _check_creator(pol.issuer, pol.flow_key, "policy")
    _check_sig(pol.issuer, pol.signature, pol.raw[:-SIG_SIZE])
    return pol


# ---------------------------------------------------------------------------------- caching
class VerifyCache:
    """LRU of tokens whose format and signature were checked, keyed by the raw bytes.

    Only the *context-free* part of verification is cached (decoding and the signature);
    flow, subject, revocation and time are checked on every use. Tokens that failed are
    remembered too, so replaying one junk token costs no public-key work either.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = max(1, size)
        self._ok: OrderedDict[bytes, Capability] = OrderedDict()
        self._bad: OrderedDict[bytes, CapabilityError] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def _remember(self, table: OrderedDict, raw: bytes, value: object) -> None:  # type: ignore[type-arg]
        table[raw] = value
        if len(table) > self.size:
            table.popitem(last=False)

    def decode(self, raw: bytes | bytearray | memoryview) -> Capability:
        raw = _as_bytes(raw, "capability")
        cap = self._ok.get(raw)
        if cap is not None:
            return cap
        bad = self._bad.get(raw)
        if bad is not None:
            self.hits += 1
            raise CapabilityError(bad.reason, bad.detail)
        try:
            return Capability.decode(raw)
        except CapabilityError as exc:
            self._remember(self._bad, raw, exc)
            raise

    def check_signature(self, cap: Capability) -> None:
        raw = cap.raw
        if raw in self._ok:
            self._ok.move_to_end(raw)
            self.hits += 1
            return
        bad = self._bad.get(raw)
        if bad is not None:
            self.hits += 1
            raise CapabilityError(bad.reason, bad.detail)
        self.misses += 1
        try:
            _check_sig(cap.issuer, cap.signature, cap.signed_body)
        except CapabilityError as exc:
            self._remember(self._bad, raw, exc)
            raise
        self._remember(self._ok, raw, cap)

    def __len__(self) -> int:
        return len(self._ok)
