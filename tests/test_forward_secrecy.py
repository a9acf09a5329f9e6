"""Forward secrecy of encrypted links: an ephemeral X25519 exchange keys each session, the
pre-shared key only authenticates, and long-lived links move to new keys (rekey).

The attack of issue 15: someone records a link and later obtains the site key. On the old
handshake the session keys were HKDF(site key, public nonces), so the recording opened."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flowrouter.wire.control import Role
from flowrouter.wire.linkauth import (
    AuthError,
    CipherError,
    KeyRing,
    LinkAuthenticator,
    LinkCipher,
    SecureStream,
    parse_hello_credentials,
)
from flowrouter.wire.linkrecords import next_key

SITE_KEY = bytes(range(32))
RING = KeyRing({"site": SITE_KEY})


def _link(nonce_a: bytes | None = None, nonce_b: bytes | None = None
          ) -> tuple[LinkAuthenticator, LinkAuthenticator, dict[str, bytes]]:
    """An encrypted handshake between r1 and r2, and what a wire recorder saw."""
    a = LinkAuthenticator(RING, my_name="r1", my_role=Role.ROUTER, encrypt=True, nonce=nonce_a)
    b = LinkAuthenticator(RING, my_name="r2", my_role=Role.ROUTER, encrypt=True, nonce=nonce_b)
    seen = {"hello_a": a.hello_credentials(), "hello_b": b.hello_credentials()}
    seen["auth_a"] = a.on_peer_hello("r2", Role.ROUTER, seen["hello_b"])
    seen["auth_b"] = b.on_peer_hello("r1", Role.ROUTER, seen["hello_a"])
    a.on_peer_auth(seen["auth_b"])
    b.on_peer_auth(seen["auth_a"])
    return a, b, seen


def _old_style_keys(seen: dict[str, bytes], key: bytes) -> list[bytes]:
    """What the pre-shared key plus the recorded public handshake yields without the
    ephemeral secrets (the old derivation, both labels, both orders)."""
    na = parse_hello_credentials(seen["hello_a"]).nonce
    nb = parse_hello_credentials(seen["hello_b"]).nonce
    lo, hi = sorted((na, nb))
    out = []
    for label in (b"flownet-link-v1", b"flownet-link-v2"):
        okm = HKDF(algorithm=hashes.SHA256(), length=64, salt=label,
                   info=label + b" session" + lo + hi).derive(key + key)
        out += [okm[:32], okm[32:]]
    return out


def test_recorded_link_stays_sealed_when_the_site_key_leaks() -> None:
    a, b, seen = _link()
    keys = a.session_keys()
    ca, cb = a.cipher(), b.cipher()
    assert ca is not None and cb is not None
    record = ca.seal(b"a private message")
    assert cb.open(record) == b"a private message"
    for guess in _old_style_keys(seen, SITE_KEY):  # the attacker holds the site key now
        with pytest.raises(CipherError, match="bad-tag"):
            LinkCipher(bytes(32), guess).open(record)
    # the session keys are not a function of the site key and the public transcript: the
    # same key and the same nonces give other keys on every link
    a2, _, _ = _link(parse_hello_credentials(seen["hello_a"]).nonce,
                     parse_hello_credentials(seen["hello_b"]).nonce)
    assert a2.session_keys() != keys
    with pytest.raises(CipherError, match="bad-tag"):
        LinkCipher(bytes(32), a2.session_keys()[0]).open(record)


def test_ephemeral_private_key_is_forgotten_after_the_exchange() -> None:
    a, b, _ = _link()
    assert a._ephemeral is None and b._ephemeral is None and a._dh is None
    assert a.cipher() is not None
    with pytest.raises(AuthError, match="state"):  # handed over once, then gone
        a.session_keys()


def test_old_handshake_version_is_refused_with_a_clear_reason() -> None:
    a = LinkAuthenticator(RING, my_name="r1", my_role=Role.ROUTER)
    v1 = b"\x01\x01\x00" + bytes(32) + b"\x04site"
    with pytest.raises(AuthError) as exc:
        a.on_peer_hello("old", Role.ROUTER, v1)
    assert exc.value.reason == "version" and "upgrade" in str(exc.value)


def test_substituted_ephemeral_key_fails_the_proof() -> None:
    """A man in the middle without the site key swaps in his own ephemeral key."""
    a = LinkAuthenticator(RING, my_name="r1", my_role=Role.ROUTER, encrypt=True)
    b = LinkAuthenticator(RING, my_name="r2", my_role=Role.ROUTER, encrypt=True)
    mitm = LinkAuthenticator(RING, my_name="r2", my_role=Role.ROUTER, encrypt=True)
    forged = bytearray(b.hello_credentials())
    forged[35:67] = mitm.my_ephemeral
    a.on_peer_hello("r2", Role.ROUTER, bytes(forged))
    auth_b = b.on_peer_hello("r1", Role.ROUTER, a.hello_credentials())
    with pytest.raises(AuthError, match="bad-proof"):
        a.on_peer_auth(auth_b)


def test_rekey_moves_both_directions_to_new_keys_and_forgets_old_ones() -> None:
    a, b, _ = _link()
    ca, cb = a.cipher(), b.cipher()
    assert ca is not None and cb is not None
    first_key = ca._tx_key
    early = ca.seal(b"early")
    assert cb.open(early) == b"early"
    ca.rekey()
    assert ca.tx_generation == 1 and ca._tx_key == next_key(first_key) != first_key
    later = ca.seal(b"later")
    assert cb.open(later) == b"later" and cb.rx_generation == 1
    # a key taken from memory now opens nothing sealed before the update
    with pytest.raises(CipherError, match="bad-tag"):
        LinkCipher(bytes(32), ca._tx_key).open(early)
    with pytest.raises(CipherError, match="replay"):
        cb.open(early)


def test_automatic_rekey_after_a_record_budget_and_skipping_is_refused() -> None:
    tx = LinkCipher(bytes(range(32)), bytes(32), rekey_records=3)
    rx = LinkCipher(bytes(32), bytes(range(32)))
    recs = [tx.seal(b"%d" % i) for i in range(7)]
    assert tx.tx_generation == 2 and tx.sent == 7
    assert [rx.open(r) for r in recs] == [b"%d" % i for i in range(7)]
    assert rx.rx_generation == 2
    tx2 = LinkCipher(bytes(range(32)), bytes(32))
    rx2 = LinkCipher(bytes(32), bytes(range(32)))
    tx2.rekey()
    tx2.rekey()
    with pytest.raises(CipherError, match="out-of-order"):  # a stream cannot skip a generation
        rx2.open(tx2.seal(b"x"))


def test_secure_stream_rekeys_on_its_clock() -> None:
    now = [0.0]
    a, b, _ = _link()
    ca, cb = a.cipher(), b.cipher()
    assert ca is not None and cb is not None
    tx = SecureStream(ca, clock=lambda: now[0], rekey_interval=60.0)
    rx = SecureStream(cb)
    got = rx.decode(tx.encode(b"one"))
    now[0] = 61.0
    got += rx.decode(tx.encode(b"two") + tx.encode(b"three"))
    assert got == [b"one", b"two", b"three"]
    assert ca.tx_generation == 1 and cb.rx_generation == 1
