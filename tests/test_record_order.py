"""Sealed stream records cannot be deleted, reordered or replayed, at a key update either
(issue 26): the record layer alone, on virtual input (no sockets).

The attack: an on-path attacker holds back the last records of a key generation and lets the
next generation through. With record numbers that restarted at each key update (handshake
version 2) the receiver took "generation g+1, record 0" whatever it still expected, and the
held records vanished with no error. Record numbers now go on across updates, so any gap,
swap or repeat fails the link. The live version, through an on-path proxy between two
routers, is in tests/test_record_proxy.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrouter.wire.control import Role
from flowrouter.wire.linkauth import (
    AuthError,
    CipherError,
    KeyRing,
    LinkAuthenticator,
    LinkCipher,
    SecureStream,
)
from flowrouter.wire.linkrecords import GEN_SHIFT, SEQ_MASK


def _pair(rekey_records: int) -> tuple[LinkCipher, LinkCipher]:
    k1, k2 = os.urandom(32), os.urandom(32)
    return LinkCipher(k1, k2, rekey_records=rekey_records), LinkCipher(k2, k1)


def _sealed(n: int, rekey_records: int = 3) -> tuple[list[bytes], list[bytes], LinkCipher]:
    """*n* records sealed under key updates every *rekey_records* records, their plaintexts,
    and the receiving cipher."""
    tx, rx = _pair(rekey_records)
    plain = [b"message %d" % i for i in range(n)]
    return [tx.seal(p) for p in plain], plain, rx


def _gen_seq(record: bytes) -> tuple[int, int]:
    ctr = int.from_bytes(record[:8], "big")
    return ctr >> GEN_SHIFT, ctr & SEQ_MASK


def test_deleting_the_last_records_of_a_generation_fails_the_link() -> None:
    recs, plain, rx = _sealed(12, rekey_records=4)
    assert [_gen_seq(r)[0] for r in recs] == [0] * 4 + [1] * 4 + [2] * 4
    for r, p in zip(recs[:2], plain[:2], strict=True):
        assert rx.open(r) == p
    # records 2 and 3 (the last two of generation 0) are held back; generation 1 goes on
    with pytest.raises(CipherError) as exc:
        rx.open(recs[4])
    assert exc.value.reason == "out-of-order" and "expected record 2" in str(exc.value)
    assert rx.rx_generation == 0  # a refused record commits no new key


def test_record_numbers_go_on_across_key_updates() -> None:
    recs, plain, rx = _sealed(10, rekey_records=3)
    assert [_gen_seq(r) for r in recs] == [(i // 3, i) for i in range(10)]
    assert [rx.open(r) for r in recs] == plain
    # an update by the owner (a clock) keeps the numbering too
    tx, rx = _pair(1000)
    first = tx.seal(b"a")
    tx.rekey()
    second = tx.seal(b"b")
    assert _gen_seq(first) == (0, 0) and _gen_seq(second) == (1, 1)
    assert rx.open(first) == b"a" and rx.open(second) == b"b" and rx.rx_generation == 1


@pytest.mark.parametrize("attack", ["swap-at-update", "replay-old-generation",
                                    "replay-new-generation", "skip-a-generation",
                                    "drop-first-of-generation"])
def test_every_reorder_and_replay_around_an_update_fails(attack: str) -> None:
    recs, plain, rx = _sealed(8, rekey_records=4)
    for r in recs[:3]:
        rx.open(r)
    if attack == "swap-at-update":
        rx.open(recs[3])
        bad = [recs[5], recs[4]]
    elif attack == "replay-old-generation":
        rx.open(recs[3])
        rx.open(recs[4])
        bad = [recs[2]]
    elif attack == "replay-new-generation":
        rx.open(recs[3])
        rx.open(recs[4])
        bad = [recs[4]]
    elif attack == "skip-a-generation":
        recs9, _, _ = _sealed(12, rekey_records=4)
        bad = [recs9[8]]  # wrong key too, but refused on its number first
    else:
        rx.open(recs[3])
        bad = [recs[5]]
    with pytest.raises(CipherError) as exc:
        for r in bad:
            rx.open(r)
    assert exc.value.reason in ("replay", "out-of-order")


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.data())
def test_whatever_an_attacker_does_the_receiver_gets_a_prefix_or_fails(
        rekey_records: int, data: st.DataObject) -> None:
    """Any sequence of the sender's records (dropped, repeated, reordered) either yields
    exactly the sent plaintexts in order, or fails the link at the first departure from
    them: the receiver never accepts a gap."""
    n = 16
    recs, plain, rx = _sealed(n, rekey_records)
    picks = data.draw(st.lists(st.integers(0, n - 1), max_size=24))
    got: list[bytes] = []
    try:
        for i in picks:
            got.append(rx.open(recs[i]))
    except CipherError as exc:
        assert exc.reason in ("replay", "out-of-order")
        assert picks[:len(got) + 1] != list(range(len(got) + 1))  # it was an attack
    else:
        assert picks == list(range(len(picks)))  # nothing refused: nothing was changed
    assert got == plain[:len(got)]


def test_a_secure_stream_fails_on_a_record_held_back_at_an_update() -> None:
    now = [0.0]
    k1, k2 = os.urandom(32), os.urandom(32)
    tx = SecureStream(LinkCipher(k1, k2), clock=lambda: now[0], rekey_interval=10.0)
    rx = SecureStream(LinkCipher(k2, k1))
    a, b = tx.encode(b"a"), tx.encode(b"b")
    now[0] = 11.0
    c = tx.encode(b"c")  # under the next key
    assert rx.decode(a) == [b"a"]
    with pytest.raises(CipherError, match="out-of-order"):
        rx.decode(c)  # b was deleted
    rx2 = SecureStream(LinkCipher(k2, k1))
    assert rx2.decode(a + b + c) == [b"a", b"b", b"c"]


def test_a_version_2_peer_fails_the_handshake_with_a_clear_reason() -> None:
    """Version 2 restarted record numbers at each key update: a mixed link would fail at its
    first update, so it fails at the handshake instead, saying why."""
    ring = KeyRing({"site": bytes(range(32))})
    new = LinkAuthenticator(ring, my_name="r1", my_role=Role.ROUTER, encrypt=True)
    peer = bytearray(LinkAuthenticator(ring, my_name="r2", my_role=Role.ROUTER,
                                       encrypt=True).hello_credentials())
    peer[0] = 2
    with pytest.raises(AuthError) as exc:
        new.on_peer_hello("r2", Role.ROUTER, bytes(peer))
    assert exc.value.reason == "version"
    assert "version 2" in str(exc.value) and "upgrade the older side" in str(exc.value)
