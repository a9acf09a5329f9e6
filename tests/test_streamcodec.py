"""The link stream codec alone (no sockets): handshake frames, then sealed records or plain
frames; any split of the bytes reads the same; malformed input raises one typed error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrouter.wire.header import MalformedFrame, pack_header
from flowrouter.wire.linkrecords import LinkCipher, SecureStream, encode_record
from flowrouter.wire.streamcodec import BadRecord, Phase, StreamCodec

KEY = bytes(range(16))
K1, K2 = b"\x01" * 32, b"\x02" * 32

#: the handshake: HELLO-like frames on band 0; the last one ends it
HANDSHAKE = [pack_header(KEY, len(p), 0) + p for p in (b"hello", b"auth" * 10)]
#: what follows: data frames of several sizes (an empty one too)
AFTER = [pack_header(KEY, len(p), 32) + p for p in (b"a", b"b" * 1000, b"", b"c" * 5000)]


def streams() -> tuple[SecureStream, SecureStream]:
    """A sender's and a receiver's record layer under the same keys."""
    return SecureStream(LinkCipher(K1, K2)), SecureStream(LinkCipher(K2, K1))


def wire(sealed: SecureStream | None) -> bytes:
    """The whole stream: the handshake in plain, then the frames (in two records if sealed:
    records need not line up with frames)."""
    rest = b"".join(AFTER)
    if sealed is not None:
        rest = sealed.encode(rest[:1500]) + sealed.encode(rest[1500:])
    return b"".join(HANDSHAKE) + rest


def read(codec: StreamCodec, chunks: list[bytes], keys: SecureStream | None) -> list[bytes]:
    """Feed *chunks* as an owner would: the handshake ends after its last frame, with keys
    (sealed) or without (plain)."""
    got: list[bytes] = []
    for chunk in chunks:
        for header, payload in codec.receive_data(chunk):
            assert len(header) == 24
            got.append(bytes(header) + bytes(payload))
            if codec.phase is Phase.HANDSHAKE and len(got) == len(HANDSHAKE):
                if keys is not None:
                    codec.start_sealed(keys)
                else:
                    codec.end_handshake()
    return got


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


@pytest.mark.parametrize("sealed", [False, True])
def test_split_at_every_boundary_reads_the_same_frames(sealed: bool) -> None:
    tx, _ = streams()
    data = wire(tx if sealed else None)
    for cut in range(len(data) + 1):
        _, rx = streams()
        codec = StreamCodec()
        assert read(codec, [data[:cut], data[cut:]], rx if sealed else None) == \
            HANDSHAKE + AFTER, cut
        assert codec.pending == codec.pending_record == 0
        assert codec.phase is (Phase.SEALED if sealed else Phase.PLAIN)


@pytest.mark.parametrize("sealed", [False, True])
def test_byte_by_byte(sealed: bool) -> None:
    tx, rx = streams()
    data = wire(tx if sealed else None)
    codec = StreamCodec()
    assert read(codec, [data[i:i + 1] for i in range(len(data))], rx if sealed else None) \
        == HANDSHAKE + AFTER


def test_switch_to_sealed_with_records_already_buffered() -> None:
    """The handshake's last frame and the first records arrive in one read: the bytes
    behind the frame that installed the keys are opened as records, not split as frames."""
    tx, rx = streams()
    codec = StreamCodec()
    frames = codec.receive_data(wire(tx))
    assert [bytes(h) + bytes(p) for h, p in (next(frames), next(frames))] == HANDSHAKE
    assert codec.phase is Phase.HANDSHAKE
    codec.start_sealed(rx)
    assert [bytes(h) + bytes(p) for h, p in frames] == AFTER
    assert codec.sealed is rx


def test_owner_takes_the_plain_rest_and_reads_it_itself() -> None:
    """The router's forwarding engine reads plain frames in place: at the end of the
    handshake it takes the bytes already received past it, exactly those."""
    codec = StreamCodec()
    data = wire(None) + b"\x00" * 5  # and the first bytes of a next frame
    frames = codec.receive_data(data)
    for _ in HANDSHAKE:
        next(frames)
    assert codec.take_buffered() == b""  # still the handshake: nothing is past it yet
    codec.end_handshake()
    assert codec.take_buffered() == b"".join(AFTER) + b"\x00" * 5
    assert codec.take_buffered() == b""
    assert list(frames) == []  # nothing is left for the codec


def test_an_abandoned_read_leaves_its_rest_to_the_next() -> None:
    """An owner that stops iterating at the switch (and takes nothing) loses nothing: the
    next read starts with the bytes buffered past the switch."""
    codec = StreamCodec()
    data = wire(None)
    frames = codec.receive_data(data[:-3])
    for _ in HANDSHAKE:
        next(frames)
    codec.end_handshake()
    del frames
    got = [bytes(h) + bytes(p) for h, p in codec.receive_data(data[-3:])]
    assert got == AFTER


def test_plaintext_is_what_the_records_hold() -> None:
    tx, rx = streams()
    codec = StreamCodec()
    codec.start_sealed(rx)
    assert codec.plaintext(tx.encode(b"xyz")[:5]) == []
    assert codec.pending_record == 5
    plain = StreamCodec()
    plain.end_handshake()
    data = b"any bytes"
    assert plain.plaintext(data) == [data]


def test_send_data_seals_once_keyed() -> None:
    tx, rx = streams()
    codec = StreamCodec()
    frame = AFTER[1]
    assert codec.send_data(frame) is frame  # the handshake goes in plain
    codec.start_sealed(tx)
    record = codec.send_data(frame)
    assert record != frame and len(record) == len(frame) + 28
    assert rx.decode(record) == [frame]


def test_keys_only_during_the_handshake() -> None:
    codec = StreamCodec()
    codec.end_handshake()
    codec.end_handshake()  # idempotent
    with pytest.raises(ValueError, match="handshake"):
        codec.start_sealed(streams()[1])


# ------------------------------------------------------------------------------- malformed input
@pytest.mark.parametrize("phase", ["handshake", "plain", "sealed"])
def test_a_bad_header_raises_malformed_frame_at_its_24th_byte(phase: str) -> None:
    tx, rx = streams()
    bad = pack_header(KEY, 10, 200)  # band 200 does not exist
    codec = StreamCodec()
    if phase != "handshake":
        list(codec.receive_data(HANDSHAKE[0]))
        codec.start_sealed(rx) if phase == "sealed" else codec.end_handshake()
        if phase == "sealed":
            bad = tx.encode(bad)
    with pytest.raises(MalformedFrame) as info:
        list(codec.receive_data(bad))
    assert info.value.reason == "bad-band"
    assert not isinstance(info.value, BadRecord)


@pytest.mark.parametrize("phase", ["handshake", "plain"])
def test_an_oversized_frame_is_refused_before_its_payload(phase: str) -> None:
    codec = StreamCodec(max_payload=100)
    if phase == "plain":
        codec.end_handshake()
    with pytest.raises(MalformedFrame, match="oversized"):
        list(codec.receive_data(pack_header(KEY, 101, 32)))


def test_a_tampered_record_is_a_bad_record() -> None:
    tx, rx = streams()
    codec = StreamCodec()
    codec.start_sealed(rx)
    record = bytearray(tx.encode(AFTER[0]))
    record[-1] ^= 1
    with pytest.raises(BadRecord) as info:
        list(codec.receive_data(bytes(record)))
    assert isinstance(info.value, MalformedFrame)
    assert info.value.reason == "bad-record" and "bad-tag" in info.value.detail


def test_an_impossible_record_length_is_refused_at_once() -> None:
    codec = StreamCodec()
    codec.start_sealed(streams()[1])
    with pytest.raises(BadRecord, match="oversized"):
        list(codec.receive_data(encode_record(b"\0" * (1 << 20))[:4]))


def test_a_truncated_stream_ends_without_waiting_and_says_what_is_pending() -> None:
    codec = StreamCodec()
    data = wire(None)
    assert read(codec, [data[:-7]], None) == HANDSHAKE + AFTER[:-1]
    assert codec.pending == len(AFTER[-1]) - 7


# ------------------------------------------------------------------------------------ property
@settings(max_examples=200, deadline=None)
@given(sealed=st.booleans(), cuts=st.lists(st.integers(min_value=0), max_size=30),
       extra=st.lists(st.binary(max_size=300), max_size=5))
def test_any_split_of_a_valid_stream_yields_the_same_frames(
        sealed: bool, cuts: list[int], extra: list[bytes]) -> None:
    tx, rx = streams()
    more = [pack_header(KEY, len(p), 40) + p for p in extra]
    data = wire(tx if sealed else None)
    if more:
        tail = b"".join(more)
        data += tx.encode(tail) if sealed else tail
    codec = StreamCodec()
    assert read(codec, split(data, cuts), rx if sealed else None) == HANDSHAKE + AFTER + more
    assert codec.pending == codec.pending_record == 0
