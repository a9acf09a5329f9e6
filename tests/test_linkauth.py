"""Link authentication from pre-shared keys and the optional encrypted record layer:
key config forms, the HELLO/AUTH state machine and every refusal, session keys, ciphers,
stream framing, hypothesis fuzzing of every decoder, and seal/open throughput."""

from __future__ import annotations

import base64
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrouter.wire.control import Role
from flowrouter.wire.header import FrameDecoder, pack_header
from flowrouter.wire.linkauth import (
    DEFAULT_MAX_RECORD,
    AuthError,
    CipherError,
    KeyRing,
    LinkAuthenticator,
    LinkCipher,
    LinkSecurityError,
    RecordDecoder,
    RecordError,
    ReplayCache,
    SecureStream,
    decode_auth,
    derive_session_keys,
    encode_auth,
    encode_record,
    make_hello_credentials,
    make_proof,
    parse_hello_credentials,
    parse_secret,
    verify_proof,
)

SECRET = bytes(range(32))
SECRET2 = bytes(range(100, 132))
RING = KeyRing({"k1": SECRET, "k2": SECRET2}, default_id="k1")


def pair(ring_a: KeyRing = RING, ring_b: KeyRing = RING, *, enc_a: bool = False,
         enc_b: bool = False, kid_a: str | None = None, kid_b: str | None = None,
         cache: ReplayCache | None = None) -> tuple[LinkAuthenticator, LinkAuthenticator]:
    a = LinkAuthenticator(ring_a, my_name="r1", my_role=Role.ROUTER, key_id=kid_a,
                          encrypt=enc_a, replay_cache=cache)
    b = LinkAuthenticator(ring_b, my_name="r2", my_role=Role.ROUTER, key_id=kid_b,
                          encrypt=enc_b, replay_cache=cache)
    return a, b


def handshake(a: LinkAuthenticator, b: LinkAuthenticator) -> None:
    """Both send HELLO at once, then both send AUTH."""
    auth_a = a.on_peer_hello("r2", Role.ROUTER, b.hello_credentials())
    auth_b = b.on_peer_hello("r1", Role.ROUTER, a.hello_credentials())
    a.on_peer_auth(auth_b)
    b.on_peer_auth(auth_a)


# ---------------------------------------------------------------------------------- keys
def test_secret_forms(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert parse_secret("hex:" + SECRET.hex()) == SECRET
    assert parse_secret(SECRET.hex()) == SECRET
    b64 = base64.b64encode(SECRET).decode()
    assert parse_secret("base64:" + b64) == SECRET
    assert parse_secret("b64:" + b64) == SECRET
    assert parse_secret(b64) == SECRET
    assert parse_secret(SECRET) == SECRET
    raw_file = tmp_path / "raw.key"
    raw_file.write_bytes(SECRET)
    os.chmod(raw_file, 0o600)
    assert parse_secret(f"file:{raw_file}") == SECRET
    assert parse_secret(str(raw_file)) == SECRET
    hex_file = tmp_path / "hex.key"
    hex_file.write_text(SECRET.hex() + "\n")
    os.chmod(hex_file, 0o600)
    assert parse_secret("file:hex.key", base_dir=tmp_path) == SECRET
    os.chmod(hex_file, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        parse_secret(f"file:{hex_file}")
    assert parse_secret(f"file:{hex_file}", check_permissions=False) == SECRET
    for bad in ("hex:abcd", "hex:zz" * 32, "base64:!!!", "base64:" + base64.b64encode(
            b"short").decode(), "nonsense", SECRET[:5]):
        with pytest.raises(ValueError):
            parse_secret(bad)  # type: ignore[arg-type]


def test_keyring_from_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ring = KeyRing.from_config({"a": "hex:" + SECRET.hex(), "b": KeyRing.generate_secret()},
                               default_id="a")
    assert ring.get("a") == SECRET and len(ring) == 2 and "b" in ring
    assert "hex" not in repr(ring) and SECRET.hex() not in repr(ring)
    assert KeyRing({"only": SECRET}).default_id == "only"
    with pytest.raises(ValueError, match="link_auth.keys.bad"):
        KeyRing.from_config({"bad": "hex:00"})
    with pytest.raises(ValueError, match="not among"):
        KeyRing({"a": SECRET}, default_id="zz")
    with pytest.raises(ValueError):
        KeyRing({"": SECRET})
    with pytest.raises(ValueError):
        KeyRing({"a": b"short"})
    with pytest.raises(ValueError):
        LinkAuthenticator(KeyRing({"a": SECRET, "b": SECRET2}), my_name="x")  # no default


# ---------------------------------------------------------------------------------- handshake
def test_mutual_authentication_and_symmetric_session_keys() -> None:
    a, b = pair()
    assert a.state == b.state == "start"
    handshake(a, b)
    assert a.authenticated and b.authenticated
    assert not a.encrypt and a.cipher() is None
    a_send, a_recv = a.session_keys()
    b_send, b_recv = b.session_keys()
    assert a_send == b_recv and a_recv == b_send and a_send != a_recv


def test_credentials_encoding() -> None:
    blob, nonce = make_hello_credentials("k1", encrypt=True)
    assert len(blob) == 68 + 2 and len(nonce) == 32
    creds = parse_hello_credentials(blob)
    assert creds.key_id == "k1" and creds.nonce == nonce and creds.encrypt
    assert "k1" in repr(creds)
    assert make_hello_credentials("k1")[1] != nonce  # fresh every time
    with pytest.raises(ValueError):
        make_hello_credentials("x" * 65)


def test_encryption_is_on_if_either_side_asks_and_records_flow_both_ways() -> None:
    a, b = pair(enc_a=True)
    handshake(a, b)
    assert a.encrypt and b.encrypt
    ca, cb = a.cipher(), b.cipher()
    assert ca is not None and cb is not None
    for i in range(5):
        assert cb.open(ca.seal(b"frame %d" % i)) == b"frame %d" % i
        assert ca.open(cb.seal(b"back %d" % i)) == b"back %d" % i


def test_key_rotation_each_side_proves_with_its_own_key() -> None:
    a, b = pair(kid_a="k1", kid_b="k2", enc_b=True)
    handshake(a, b)
    ca, cb = a.cipher(), b.cipher()
    assert ca is not None and cb is not None
    assert cb.open(ca.seal(b"x")) == b"x"


@pytest.mark.parametrize("case, expected", [
    ("unknown-key", "unknown-key"),
    ("wrong-secret", "bad-proof"),
    ("empty-creds", "missing-credentials"),
    ("garbage-creds", "malformed"),
    ("reflection", "replay"),
    ("replayed-hello", "replay"),
    ("wrong-name", "bad-proof"),
    ("wrong-role", "bad-proof"),
    ("strip-encrypt", "bad-proof"),
    ("recorded-auth", "bad-proof"),
    ("bad-auth-msg", "malformed"),
    ("auth-before-hello", "state"),
    ("hello-twice", "state"),
])
def test_every_handshake_failure_has_its_reason(case: str, expected: str) -> None:
    a, b = pair(enc_a=True, cache=ReplayCache())
    with pytest.raises(AuthError) as exc:
        if case == "unknown-key":
            stranger = LinkAuthenticator(KeyRing({"k9": SECRET}), my_name="x")
            a.on_peer_hello("x", Role.ROUTER, stranger.hello_credentials())
        elif case == "wrong-secret":  # same key id, different secret: an impostor
            impostor = LinkAuthenticator(KeyRing({"k1": SECRET2}), my_name="r2")
            auth_i = impostor.on_peer_hello("r1", Role.ROUTER, a.hello_credentials())
            a.on_peer_hello("r2", Role.ROUTER, impostor.hello_credentials())
            a.on_peer_auth(auth_i)
        elif case == "empty-creds":
            a.on_peer_hello("r2", Role.ROUTER, b"")
        elif case == "garbage-creds":
            a.on_peer_hello("r2", Role.ROUTER, b"\x03\x01\x00" + b"x" * 80)
        elif case == "reflection":  # our own HELLO bounced back at us
            a.on_peer_hello("r1", Role.ROUTER, a.hello_credentials())
        elif case == "replayed-hello":
            creds = b.hello_credentials()
            a.on_peer_hello("r2", Role.ROUTER, creds)
            a2, _ = pair(cache=a.replay_cache)
            a2.on_peer_hello("r2", Role.ROUTER, creds)
        elif case == "wrong-name":  # b's proof says "r2", the HELLO we got said "r3"
            a.on_peer_hello("r3", Role.ROUTER, b.hello_credentials())
            a.on_peer_auth(b.on_peer_hello("r1", Role.ROUTER, a.hello_credentials()))
        elif case == "wrong-role":
            a.on_peer_hello("r2", Role.ENDPOINT, b.hello_credentials())
            a.on_peer_auth(b.on_peer_hello("r1", Role.ROUTER, a.hello_credentials()))
        elif case == "strip-encrypt":  # a man in the middle clears a's encrypt flag for b
            stripped = bytearray(a.hello_credentials())
            stripped[2] = 0
            a.on_peer_hello("r2", Role.ROUTER, b.hello_credentials())
            a.on_peer_auth(b.on_peer_hello("r1", Role.ROUTER, bytes(stripped)))
        elif case == "recorded-auth":  # an AUTH from an earlier link with the same peer
            old_a, old_b = pair()
            old_auth = old_b.on_peer_hello("r1", Role.ROUTER, old_a.hello_credentials())
            a.on_peer_hello("r2", Role.ROUTER, b.hello_credentials())
            a.on_peer_auth(old_auth)
        elif case == "bad-auth-msg":
            a.on_peer_hello("r2", Role.ROUTER, b.hello_credentials())
            a.on_peer_auth(b"\x01\x02" + b"\0" * 31)
        elif case == "auth-before-hello":
            a.on_peer_auth(encode_auth(b"\0" * 32))
        elif case == "hello-twice":
            a.on_peer_hello("r2", Role.ROUTER, b.hello_credentials())
            a.on_peer_hello("r2", Role.ROUTER, b.hello_credentials())
    assert exc.value.reason == expected
    assert a.state == "failed" or case in ("replayed-hello",)
    with pytest.raises(AuthError):
        a.session_keys() if a.state != "failed" else a.on_peer_auth(b"")


def test_proof_primitives() -> None:
    n1, n2 = os.urandom(32), os.urandom(32)
    p = make_proof(SECRET, n1, n2, "r1", "r2", 1, "k1", 1, 0)
    assert len(p) == 32
    assert verify_proof(p, SECRET, n1, n2, "r1", "r2", 1, "k1", 1, 0)
    assert not verify_proof(p, SECRET, n2, n1, "r1", "r2", 1, "k1", 1, 0)
    assert not verify_proof(p, SECRET, n1, n2, "r2", "r1", 1, "k1", 1, 0)
    # length prefixes: names cannot slide into each other
    assert make_proof(SECRET, n1, n2, "ab", "c", 1) != make_proof(SECRET, n1, n2, "a", "bc", 1)
    # a name longer than a HELLO carries is cut the same way the HELLO cuts it
    long = "é" * 200
    assert make_proof(SECRET, n1, n2, long, "x", 1) == make_proof(
        SECRET, n1, n2, long.encode()[:254].decode(), "x", 1)
    assert decode_auth(encode_auth(p)) == p
    with pytest.raises(ValueError):
        encode_auth(b"short")
    with pytest.raises(AuthError):
        derive_session_keys(SECRET, SECRET, n1, n1, bytes(32))
    with pytest.raises(AuthError):  # no ephemeral secret: no session keys
        derive_session_keys(SECRET, SECRET, n1, n2, b"")


# ---------------------------------------------------------------------------------- ciphers
def ciphers(ordered: bool = True) -> tuple[LinkCipher, LinkCipher]:
    k1, k2 = os.urandom(32), os.urandom(32)
    return LinkCipher(k1, k2, ordered), LinkCipher(k2, k1, ordered)


def test_cipher_refuses_replay_reorder_tamper_and_truncation() -> None:
    tx, rx = ciphers()
    r0, r1, r2 = tx.seal(b"zero"), tx.seal(b"one"), tx.seal(b"two")
    assert len(r0) == 8 + 4 + 16
    with pytest.raises(CipherError, match="out-of-order"):
        rx.open(r1)
    assert rx.open(r0) == b"zero"
    with pytest.raises(CipherError, match="replay"):
        rx.open(r0)
    bad = bytearray(r1)
    bad[-1] ^= 1
    with pytest.raises(CipherError, match="bad-tag"):
        rx.open(bytes(bad))
    with pytest.raises(CipherError, match="truncated"):
        rx.open(r1[:10])
    assert rx.open(r1) == b"one"  # failures did not advance the receive counter
    assert rx.open(r2) == b"two"
    with pytest.raises(CipherError, match="bad-tag"):  # the two directions use different keys
        LinkCipher(os.urandom(32), os.urandom(32)).open(ciphers()[0].seal(b"self"))
    assert tx.sent == 3


def test_datagram_cipher_window() -> None:
    tx, rx = ciphers(ordered=False)
    recs = [tx.seal(b"%d" % i) for i in range(200)]
    assert rx.open(recs[5]) == b"5"
    assert rx.open(recs[3]) == b"3"  # late but new: accepted once
    with pytest.raises(CipherError, match="replay"):
        rx.open(recs[3])
    assert rx.open(recs[150]) == b"150"
    with pytest.raises(CipherError, match="replay"):
        rx.open(recs[50])  # older than the 64-record window
    assert rx.open(recs[120]) == b"120"
    with pytest.raises(CipherError, match="replay"):
        rx.open(recs[150])
    forged = recs[199][:8] + os.urandom(len(recs[199]) - 8)
    with pytest.raises(CipherError, match="bad-tag"):
        rx.open(forged)
    assert rx.open(recs[199]) == b"199"  # the forgery did not move the window


def test_record_decoder_and_secure_stream() -> None:
    a, b = pair(enc_a=True)
    handshake(a, b)
    ca, cb = a.cipher(), b.cipher()
    assert ca is not None and cb is not None
    tx, rx = SecureStream(ca), SecureStream(cb)
    key = bytes(16)
    frames = [pack_header(key, len(p), 32) + p for p in (b"a", b"b" * 1000, b"", b"c" * 70000)]
    wire = tx.encode(frames[0] + frames[1]) + tx.encode(frames[2])  # records need not align
    with pytest.raises(RecordError, match="oversized"):  # 70 KB frame > default max record
        RecordDecoder().feed(encode_record(b"\0" * (DEFAULT_MAX_RECORD + 1)))
    dec = FrameDecoder(1 << 20)
    got = []
    for i in range(0, len(wire), 7):  # dribble the stream in 7-byte pieces
        for plain in rx.decode(wire[i:i + 7]):
            got += [bytes(h) + bytes(p) for h, p in dec.feed(plain)]
    assert got == frames[:3]
    assert rx.decoder.pending == 0
    with pytest.raises(RecordError, match="undersized"):
        RecordDecoder().feed(b"\0\0\0\x05hello")
    with pytest.raises(CipherError, match="bad-tag"):  # well framed garbage
        SecureStream(ciphers()[1]).decode(encode_record(b"\0" * 8 + os.urandom(40)))


# ---------------------------------------------------------------------------------- hypothesis
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_decoders_raise_only_their_own_errors(data: bytes) -> None:
    for fn in (parse_hello_credentials, decode_auth):
        try:
            fn(data)
        except LinkSecurityError:
            pass
    a, _ = pair()
    try:
        a.on_peer_hello("r2", Role.ROUTER, data)
        a.on_peer_auth(data)
    except AuthError:
        pass
    _, rx = ciphers()
    try:
        rx.open(data)
    except CipherError:
        pass
    dec = SecureStream(rx, max_record=1024)
    try:
        dec.decode(data)
    except (RecordError, CipherError):
        pass


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1))
def test_stream_round_trip_any_chunking(chunks: list[bytes], cuts: list[int]) -> None:
    tx, rx = ciphers()
    wire = b"".join(encode_record(tx.seal(c)) for c in chunks)
    dec = RecordDecoder()
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(wire):
        step = cuts[i % len(cuts)]
        out += [rx.open(r) for r in dec.feed(wire[pos:pos + step])]
        pos += step
        i += 1
    assert out == chunks


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 8 * 60 - 1))
def test_any_bit_flip_of_a_record_is_refused(bit: int) -> None:
    tx, rx = ciphers()
    rec = bytearray(tx.seal(b"x" * 36))
    rec[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CipherError):
        rx.open(bytes(rec))


# ---------------------------------------------------------------------------------- cost
def test_seal_open_throughput() -> None:
    tx, rx = ciphers()
    lines = []
    for size, count in ((1024, 3000), (65536, 200)):
        data = os.urandom(size)
        t0 = time.perf_counter()
        recs = [tx.seal(data) for _ in range(count)]
        t1 = time.perf_counter()
        for r in recs:
            rx.open(r)
        t2 = time.perf_counter()
        mb = size * count / 1e6
        seal, opn = mb / (t1 - t0), mb / (t2 - t1)
        lines.append(f"{size // 1024} KB: seal {seal:.0f} MB/s ({(t1 - t0) / count * 1e6:.1f} "
                     f"us), open {opn:.0f} MB/s ({(t2 - t1) / count * 1e6:.1f} us)")
        assert seal > 5 and opn > 5  # far below any real machine; catches pathologies only
    t0 = time.perf_counter()
    for _ in range(200):
        a, b = pair(enc_a=True)
        handshake(a, b)
        a.cipher()
    hs = (time.perf_counter() - t0) / 200
    print("\n" + "; ".join(lines) + f"; full handshake pair + keys {hs * 1e6:.0f} us")
