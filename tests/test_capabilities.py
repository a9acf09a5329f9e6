"""Capabilities and flow policies: self-certifying creators, token encoding, every refusal
reason, the router-side PolicyStore, hypothesis fuzzing of the decoders, and verify() cost."""

from __future__ import annotations

import hashlib
import os
import stat
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrouter.core.policystore import PolicyStore
from flowrouter.wire.bands import BandMask
from flowrouter.wire.capabilities import (
    MAX_REVOKED,
    SIG_SIZE,
    UNLIMITED,
    Capability,
    CapabilityError,
    CreatorKey,
    Policy,
    VerifyCache,
    creator_id_of,
    verify,
    verify_policy,
)
from flowrouter.wire.header import Locality

NOW = 1_700_000_000
KEY = CreatorKey.generate()
OTHER = CreatorKey.generate()
FLOW = KEY.flow(0x10, 7)
FLOW2 = KEY.flow(0x10, 8)


def token(**kw: object) -> Capability:
    args: dict = {"join": "32-40", "send": [33, 34], "max_locality": {"geography": 2},
                  "ttl": 600, "now": NOW, "serial": 42}
    args.update(kw)
    subject = args.pop("subject", "alice")
    target = args.pop("target", FLOW)
    key = args.pop("key", KEY)
    return Capability.issue(key, target, subject, **args)  # type: ignore[arg-type]


def reason(exc: pytest.ExceptionInfo[CapabilityError]) -> str:
    return exc.value.reason


def resign(raw: bytes, key: CreatorKey) -> bytes:
    """Replace issuer and signature: what an attacker with its own key can produce."""
    body = raw[:-(SIG_SIZE + 32)] + key.public_bytes
    return body + key.sign(body)


# ---------------------------------------------------------------------------------- creators
def test_creator_id_is_derived_from_the_public_key() -> None:
    expected = int.from_bytes(
        hashlib.sha256(b"flownet-creator" + KEY.public_bytes).digest()[:8], "big")
    assert KEY.creator_id == expected == creator_id_of(KEY.public_bytes)
    assert FLOW.creator == KEY.creator_id
    assert OTHER.creator_id != KEY.creator_id
    with pytest.raises(ValueError):
        creator_id_of(b"short")


@pytest.mark.parametrize("fmt", ["pem", "raw"])
def test_key_files_are_private_and_round_trip(tmp_path, fmt: str) -> None:  # type: ignore[no-untyped-def]
    path = KEY.save(tmp_path / "sub" / f"creator.{fmt}", fmt=fmt)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = CreatorKey.load(path)
    assert loaded.creator_id == KEY.creator_id and loaded.public_bytes == KEY.public_bytes
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        CreatorKey.load(path)
    assert CreatorKey.load(path, check_permissions=False).creator_id == KEY.creator_id
    (tmp_path / "junk").write_bytes(b"x" * 10)
    os.chmod(tmp_path / "junk", 0o600)
    with pytest.raises(ValueError, match="PEM"):
        CreatorKey.load(tmp_path / "junk")


def test_load_or_create_keeps_the_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = CreatorKey.load_or_create(tmp_path / "k.pem")
    b = CreatorKey.load_or_create(tmp_path / "k.pem")
    assert a.creator_id == b.creator_id


# ---------------------------------------------------------------------------------- tokens
def test_issue_encode_decode_verify() -> None:
    cap = token()
    raw = cap.encode()
    assert len(raw) == 177 + len("alice")
    back = Capability.decode(raw)
    assert back == cap
    assert back.flow == FLOW and not back.creator_wide and back.serial == 42
    assert back.max_locality == (UNLIMITED, UNLIMITED, 2)
    got = verify(raw, flow_key=FLOW.key, subject="alice", now=NOW + 1)
    assert got == cap
    assert verify(cap, flow_key=FLOW, subject="alice", now=NOW) == cap  # FlowID works too
    assert "alice" in str(cap) and "32-40" in str(cap)


def test_band_and_locality_helpers() -> None:
    cap = token()
    assert cap.may_join(BandMask.parse("32-40"))
    assert cap.may_join("33,35")
    assert cap.may_join(0)  # the empty mask (a leave) is always fine
    assert not cap.may_join("32-41")
    assert not cap.may_join(1 << 17)  # fault band not granted
    assert cap.may_send(33) and cap.may_send(34)
    assert not cap.may_send(32) and not cap.may_send(200) and not cap.may_send(-1)
    assert cap.locality_ok(Locality.GEOGRAPHY, 2)
    assert not cap.locality_ok(Locality.GEOGRAPHY, 3)
    assert cap.locality_ok(Locality.DELAY, 250)  # not limited
    assert not cap.locality_ok(Locality.NONE, 0)  # unbounded travel escapes the limit
    assert not cap.locality_ok(9, 0)
    free = token(max_locality=None)
    assert free.locality_ok(Locality.NONE, 0) and free.locality_ok(Locality.GEOGRAPHY, 254)
    flat = token(max_locality=1)
    assert flat.max_locality == (1, 1, 1)
    seq = token(max_locality=(5, 6, 7))
    assert seq.max_locality == (5, 6, 7)
    with pytest.raises(ValueError):
        token(max_locality={"none": 1})
    with pytest.raises(ValueError):
        token(max_locality=300)


def test_creator_wide_token_covers_all_flows_of_that_creator_only() -> None:
    cap = token(target=KEY.creator_id)
    assert cap.creator_wide and cap.flow is None
    for f in (FLOW, FLOW2, KEY.flow(0x99, 1)):
        verify(cap.raw, flow_key=f.key, subject="alice", now=NOW)
    with pytest.raises(CapabilityError) as exc:
        verify(cap.raw, flow_key=OTHER.flow(0x10, 7).key, subject="alice", now=NOW)
    assert reason(exc) == "wrong-flow"


def test_wildcard_subject() -> None:
    cap = token(subject="*")
    for who in ("bob", "alice", None):
        verify(cap.raw, flow_key=FLOW.key, subject=who, now=NOW)


def test_issue_refuses_foreign_name_space_and_bad_arguments() -> None:
    with pytest.raises(ValueError, match="name space"):
        Capability.issue(OTHER, FLOW, "alice", join="data")
    with pytest.raises(ValueError):
        token(subject="")
    with pytest.raises(ValueError):
        token(subject="x" * 256)
    with pytest.raises(TypeError):
        token(target="flow")


@pytest.mark.parametrize("case, expected", [
    ("expired", "expired"),
    ("not-yet", "not-yet-valid"),
    ("other-flow", "wrong-flow"),
    ("subject", "wrong-subject"),
    ("revoked-set", "revoked"),
    ("revoked-fn", "revoked"),
    ("signature", "bad-signature"),
    ("body", "bad-signature"),
    ("foreign-key", "wrong-creator"),
    ("truncated", "malformed"),
    ("garbage", "malformed"),
])
def test_every_refusal_has_its_reason(case: str, expected: str) -> None:
    cap = token()
    raw = cap.raw
    kw: dict = {"flow_key": FLOW.key, "subject": "alice", "now": NOW + 10}
    if case == "expired":
        kw["now"] = NOW + 600
    elif case == "not-yet":
        kw["now"] = NOW - 1
    elif case == "other-flow":
        kw["flow_key"] = FLOW2.key
    elif case == "subject":
        kw["subject"] = "mallory"
    elif case == "revoked-set":
        kw["revoked"] = {41, 42}
    elif case == "revoked-fn":
        kw["revoked"] = lambda s: s == 42
    elif case == "signature":
        raw = raw[:-1] + bytes([raw[-1] ^ 1])
    elif case == "body":  # widen the send mask without re-signing
        i = raw.index(cap.send.to_bytes(16, "big"))
        raw = raw[:i] + b"\xff" * 16 + raw[i + 16:]
    elif case == "foreign-key":
        raw = resign(raw, OTHER)  # well signed, but by a key that does not own the creator
    elif case == "truncated":
        raw = raw[:-3]
    elif case == "garbage":
        raw = b"not a capability at all"
    with pytest.raises(CapabilityError) as exc:
        verify(raw, **kw)
    assert reason(exc) == expected
    assert str(exc.value).startswith(expected)


def test_decode_rejects_malformed_details() -> None:
    raw = token().raw
    for bad, what in [
        (b"XX" + raw[2:], "magic"),
        (raw[:2] + b"\x02" + raw[3:], "version"),
        (raw[:3] + b"\x02" + raw[4:], "kind"),
        (raw[:4] + b"\x80" + raw[5:], "flags"),
        (raw[:21] + b"\x00" + raw[22:], "subject"),
        (raw + b"\x00", "bytes"),
        (raw[:22] + b"\xff\xfe" + raw[24:], "UTF-8"),
        (b"", "truncated"),
        (raw[:21], "subject"),
    ]:
        with pytest.raises(CapabilityError, match=what) as exc:
            Capability.decode(bad)
        assert exc.value.reason == "malformed"
    wide = token(target=KEY.creator_id).raw
    bad = wide[:20] + b"\x01" + wide[21:]  # creator-wide with a non-zero flow part
    with pytest.raises(CapabilityError, match="creator-wide"):
        Capability.decode(bad)
    with pytest.raises(CapabilityError):
        Capability.decode("text")  # type: ignore[arg-type]


def test_capability_is_not_a_policy_and_vice_versa() -> None:
    pol = Policy.issue(KEY, FLOW, version=1, now=NOW)
    with pytest.raises(CapabilityError, match="kind"):
        Capability.decode(pol.raw)
    with pytest.raises(CapabilityError, match="kind"):
        Policy.decode(token().raw)


# ---------------------------------------------------------------------------------- cache
def test_verify_cache_skips_repeated_signature_checks() -> None:
    cache = VerifyCache(size=2)
    cap = token()
    for _ in range(3):
        verify(cap.raw, flow_key=FLOW.key, subject="alice", now=NOW, cache=cache)
    assert cache.misses == 1 and cache.hits == 2
    # context is still checked on every use
    with pytest.raises(CapabilityError, match="expired"):
        verify(cap.raw, flow_key=FLOW.key, subject="alice", now=NOW + 601, cache=cache)
    forged = cap.raw[:-1] + bytes([cap.raw[-1] ^ 1])
    for _ in range(2):
        with pytest.raises(CapabilityError, match="bad-signature"):
            verify(forged, flow_key=FLOW.key, subject="alice", now=NOW, cache=cache)
    assert cache.misses == 2  # the forged token was checked once, then remembered
    for i in range(4):  # LRU bound
        verify(token(serial=100 + i).raw, flow_key=FLOW.key, subject="alice", now=NOW,
               cache=cache)
    assert len(cache) == 2


# ---------------------------------------------------------------------------------- policies
def test_policy_round_trip_and_verification() -> None:
    pol = Policy.issue(KEY, FLOW, version=3, revoked=[5, 1, 5], require_send=False, now=NOW)
    back = verify_policy(pol.raw)
    assert back == pol and back.revoked == {1, 5} and back.version == 3
    assert back.require_join and not back.require_send
    assert len(pol.raw) == 135 + 8 * 2
    with pytest.raises(CapabilityError) as exc:
        verify_policy(resign(pol.raw, OTHER))
    assert reason(exc) == "wrong-creator"
    tampered = bytearray(pol.raw)
    tampered[30] ^= 1  # issued-at
    with pytest.raises(CapabilityError) as exc:
        verify_policy(bytes(tampered))
    assert reason(exc) == "bad-signature"
    with pytest.raises(ValueError):
        Policy.issue(OTHER, FLOW, version=1)
    with pytest.raises(ValueError):
        Policy.issue(KEY, FLOW, version=1, revoked=range(MAX_REVOKED + 1))
    big = bytearray(pol.raw)
    big[37:39] = (MAX_REVOKED + 1).to_bytes(2, "big")
    with pytest.raises(CapabilityError, match="revoked serials"):
        Policy.decode(bytes(big))


def test_policy_store_open_flows_tokens_versions_and_revocation() -> None:
    store = PolicyStore()
    alice = token(subject="alice", serial=1)
    # no policy: everything is open, tokens are not even looked at
    assert store.authorize_join(FLOW.key, None, "alice", 1 << 32, NOW) is None
    assert store.authorize_send(FLOW.key, b"junk", "x", 33, 0, 0, NOW) is None
    store.install(Policy.issue(KEY, FLOW, version=1, now=NOW).raw)
    assert store.requires(FLOW.key, "join") and store.requires(FLOW.key, "send")
    assert not store.requires(FLOW2.key, "join")  # another flow of the creator stays open
    with pytest.raises(CapabilityError, match="missing"):
        store.authorize_join(FLOW.key, None, "alice", 1 << 32, NOW)
    assert store.authorize_join(FLOW.key, alice.raw, "alice", BandMask.parse("32-33").bits,
                                NOW) == alice
    with pytest.raises(CapabilityError, match="band-denied"):
        store.authorize_join(FLOW.key, alice.raw, "alice", BandMask.parse("41").bits, NOW)
    assert store.authorize_send(FLOW.key, alice.raw, "alice", 33, Locality.GEOGRAPHY, 2, NOW)
    with pytest.raises(CapabilityError, match="band-denied"):
        store.authorize_send(FLOW.key, alice.raw, "alice", 35, 0, 0, NOW)
    with pytest.raises(CapabilityError, match="locality-denied"):
        store.authorize_send(FLOW.key, alice.raw, "alice", 33, Locality.GEOGRAPHY, 3, NOW)
    with pytest.raises(CapabilityError, match="locality-denied"):
        store.authorize_send(FLOW.key, alice.raw, "alice", 33, Locality.NONE, 0, NOW)
    with pytest.raises(CapabilityError, match="wrong-subject"):
        store.authorize_join(FLOW.key, alice.raw, "bob", 1 << 32, NOW)
    # a newer policy revokes serial 1; older or conflicting ones are refused
    store.install(Policy.issue(KEY, FLOW, version=2, revoked=[1], now=NOW))
    with pytest.raises(CapabilityError, match="revoked"):
        store.authorize_join(FLOW.key, alice.raw, "alice", 1 << 32, NOW)
    with pytest.raises(CapabilityError, match="stale-policy"):
        store.install(Policy.issue(KEY, FLOW, version=1, now=NOW))
    with pytest.raises(CapabilityError, match="stale-policy"):
        store.install(Policy.issue(KEY, FLOW, version=2, revoked=[], now=NOW))
    same = store.policy_for(FLOW.key)
    assert same is not None and store.install(same.raw) is same  # re-sending is harmless
    with pytest.raises(CapabilityError, match="wrong-creator"):
        store.install(resign(Policy.issue(KEY, FLOW, version=9, now=NOW).raw, OTHER))
    # creator-wide policy: covers FLOW2 too; revocations of both apply to FLOW
    store.install(Policy.issue(KEY, KEY.creator_id, version=1, revoked=[7],
                               require_join=False, now=NOW))
    assert store.requires(FLOW2.key, "send") and not store.requires(FLOW2.key, "join")
    assert store.revoked_for(FLOW.key) == {1, 7}
    assert store.revoked_for(FLOW2.key) == {7}
    wide = token(target=KEY.creator_id, subject="*", serial=8, send="data", max_locality=None)
    assert store.authorize_send(FLOW2.key, wide.raw, "anyone", 100, 0, 0, NOW)
    with pytest.raises(CapabilityError, match="revoked"):
        store.authorize_send(FLOW2.key, token(target=KEY.creator_id, serial=7).raw, "alice",
                             33, 0, 0, NOW)
    assert len(store) == 2
    store.remove_flow(FLOW.key)
    assert store.policy_for(FLOW.key) is not None  # falls back to the creator-wide one


# ---------------------------------------------------------------------------------- hypothesis
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400))
def test_decoders_raise_only_their_own_error(data: bytes) -> None:
    for fn in (Capability.decode, Policy.decode, verify_policy):
        try:
            fn(data)
        except CapabilityError as exc:
            assert exc.reason == "malformed" or exc.reason in ("bad-signature",
                                                               "wrong-creator")
    try:
        verify(data, flow_key=FLOW.key, subject="alice", now=NOW)
    except CapabilityError:
        pass


_VALID = token().raw
_VALID_POLICY = Policy.issue(KEY, FLOW, version=1, revoked=[3, 4], now=NOW).raw


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([_VALID, _VALID_POLICY]), st.data())
def test_any_mutation_of_a_signed_record_is_refused(raw: bytes, data: st.DataObject) -> None:
    """Bit flips, truncations and insertions: never accepted, never a foreign exception."""
    kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    if kind == "flip":
        bits = data.draw(st.lists(st.integers(0, len(raw) * 8 - 1), min_size=1, max_size=4,
                                  unique=True))
        buf = bytearray(raw)
        for b in bits:
            buf[b // 8] ^= 1 << (b % 8)
        mutated = bytes(buf)
    elif kind == "cut":
        mutated = raw[:data.draw(st.integers(0, len(raw) - 1))]
    else:
        at = data.draw(st.integers(0, len(raw)))
        mutated = raw[:at] + data.draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    with pytest.raises(CapabilityError):
        if raw is _VALID:
            verify(mutated, flow_key=FLOW.key, subject="alice", now=NOW + 1)
        else:
            verify_policy(mutated)


@settings(max_examples=100, deadline=None)
@given(subject=st.text(min_size=1, max_size=60).filter(lambda s: len(s.encode()) <= 255),
       join=st.integers(0, (1 << 128) - 1), send=st.integers(0, (1 << 128) - 1),
       loc=st.tuples(*[st.integers(0, 255)] * 3), serial=st.integers(0, (1 << 64) - 1),
       wide=st.booleans())
def test_round_trip_property(subject: str, join: int, send: int, loc: tuple[int, int, int],
                             serial: int, wide: bool) -> None:
    cap = Capability.issue(KEY, KEY.creator_id if wide else FLOW, subject, join=join,
                           send=send, max_locality=loc, serial=serial, now=NOW)
    back = verify(cap.raw, flow_key=FLOW.key, subject=subject, now=NOW)
    assert (back.subject, back.join, back.send, back.max_locality, back.serial,
            back.creator_wide) == (subject, join, send, loc, serial, wide)


# ---------------------------------------------------------------------------------- cost
def test_verify_is_cheap_enough_per_join() -> None:
    caps = [token(serial=i).raw for i in range(200)]
    t0 = time.perf_counter()
    for raw in caps:
        verify(raw, flow_key=FLOW.key, subject="alice", now=NOW)
    cold = (time.perf_counter() - t0) / len(caps)
    cache = VerifyCache()
    verify(caps[0], flow_key=FLOW.key, subject="alice", now=NOW, cache=cache)
    t0 = time.perf_counter()
    for _ in range(2000):
        verify(caps[0], flow_key=FLOW.key, subject="alice", now=NOW, cache=cache)
    warm = (time.perf_counter() - t0) / 2000
    pol = Policy.issue(KEY, FLOW, version=1, revoked=range(100), now=NOW).raw
    t0 = time.perf_counter()
    for _ in range(100):
        verify_policy(pol)
    policy_cost = (time.perf_counter() - t0) / 100
    print(f"\nverify(): cold {cold * 1e6:.1f} us, cached {warm * 1e6:.1f} us; "
          f"verify_policy (100 revoked): {policy_cost * 1e6:.1f} us")
    assert cold < 2e-3  # one Ed25519 verification; generous for slow CI machines
    assert warm < cold
