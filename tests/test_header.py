"""The 24-byte wire header, its validation, the TCP stream decoder and UDP datagram split."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_TTL,
    HEADER_SIZE,
    UDP_MAX_PAYLOAD,
    FrameDecoder,
    Header,
    Locality,
    MalformedFrame,
    pack_header,
    parse_header,
    split_datagram,
    validate_header,
)

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
u32 = st.integers(min_value=0, max_value=(1 << 32) - 1)
u8 = st.integers(min_value=0, max_value=255)

headers = st.builds(
    Header, creator=u64, lsid=u32, local=u32,
    size=st.integers(min_value=0, max_value=DEFAULT_MAX_PAYLOAD),
    band=st.integers(min_value=0, max_value=127),
    loc_type=st.integers(min_value=0, max_value=3), loc_value=u8, ttl=u8)


def raw_header(size=0, band=32, loc_type=0, loc_value=0, ttl=DEFAULT_TTL, key=bytes(16)):
    """Header bytes built by hand (struct), so invalid values can be produced."""
    return key + struct.pack("!IBBBB", size, band, loc_type, loc_value, ttl)


# --------------------------------------------------------------------------- layout
def test_layout_is_the_designs():
    h = Header(0x0102030405060708, 0x090A0B0C, 0x0D0E0F10, 0x11121314, 0x15, 2, 0x17, 0x18)
    raw = h.pack()
    assert len(raw) == HEADER_SIZE == 24
    assert raw == bytes(range(1, 25)).replace(b"\x16", b"\x02")
    assert h.key == FlowID(0x0102030405060708, 0x090A0B0C, 0x0D0E0F10).key


def test_defaults():
    h = Header(1, 2, 3, 0, 32)
    assert h.loc_type == Locality.NONE and h.loc_value == 0 and h.ttl == DEFAULT_TTL


@given(headers)
def test_pack_parse_round_trip(h):
    raw = h.pack()
    assert len(raw) == 24
    assert parse_header(raw) == h
    assert parse_header(memoryview(raw)) == h
    assert parse_header(bytearray(b"xx" + raw), offset=2) == h
    assert validate_header(raw) == h.size
    key = FlowID(h.creator, h.lsid, h.local).key
    assert pack_header(key, h.size, h.band, h.loc_type, h.loc_value, h.ttl) == raw
    assert h.key == key


def test_locality_parse():
    assert Locality.parse("geography") is Locality.GEOGRAPHY
    assert Locality.parse(" Delay ") is Locality.DELAY
    assert Locality.parse(1) is Locality.BANDWIDTH
    with pytest.raises(ValueError, match="unknown locality type 'speed'"):
        Locality.parse("speed")


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("raw, reason", [
    (raw_header(size=DEFAULT_MAX_PAYLOAD + 1), "oversized"),
    (raw_header(size=0xFFFFFFFF), "oversized"),
    (raw_header(band=128), "bad-band"),
    (raw_header(band=255), "bad-band"),
    (raw_header(loc_type=4), "bad-locality"),
    (raw_header(loc_type=255), "bad-locality"),
    (raw_header()[:23], "truncated"),
    (b"", "truncated"),
])
def test_parse_header_errors(raw, reason):
    with pytest.raises(MalformedFrame) as info:
        parse_header(raw)
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith(reason)


def test_max_payload_is_per_link():
    raw = raw_header(size=1000)
    assert parse_header(raw, max_payload=1000).size == 1000
    with pytest.raises(MalformedFrame) as info:
        parse_header(raw, max_payload=999)
    assert info.value.reason == "oversized" and "999" in info.value.detail


def test_limits_accepted():
    assert parse_header(raw_header(band=127, loc_type=3, loc_value=255, ttl=255,
                                   size=DEFAULT_MAX_PAYLOAD)).band == 127


def test_malformed_frame_fields():
    exc = MalformedFrame("bad-band", "band 200")
    assert exc.reason == "bad-band" and exc.detail == "band 200"
    assert str(exc) == "bad-band: band 200"
    assert str(MalformedFrame("x")) == "x"


# --------------------------------------------------------------------------- datagrams
def test_split_datagram():
    payload = b"hello"
    hdr = raw_header(size=5)
    h, p = split_datagram(hdr + payload)
    assert bytes(h) == hdr and bytes(p) == payload


@pytest.mark.parametrize("data, reason", [
    (raw_header(size=5) + b"hell", "length-mismatch"),
    (raw_header(size=5) + b"hello!", "length-mismatch"),
    (raw_header(size=0) + b"x", "length-mismatch"),
    (raw_header(size=5)[:20], "truncated"),
    (raw_header(band=200, size=1) + b"x", "bad-band"),
    (raw_header(size=UDP_MAX_PAYLOAD + 1), "oversized"),
])
def test_split_datagram_errors(data, reason):
    with pytest.raises(MalformedFrame) as info:
        split_datagram(data)
    assert info.value.reason == reason


# --------------------------------------------------------------------------- stream decoder
frame_st = st.tuples(headers.map(lambda h: Header(h.creator, h.lsid, h.local, 0, h.band,
                                                  h.loc_type, h.loc_value, h.ttl)),
                     st.binary(max_size=300))


def build(frames):
    out = []
    for h, payload in frames:
        hdr = Header(h.creator, h.lsid, h.local, len(payload), h.band, h.loc_type,
                     h.loc_value, h.ttl).pack()
        out.append((hdr, payload))
    return out


def feed_chunks(dec, stream, cuts):
    got = []
    prev = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        for h, p in dec.feed(stream[prev:cut]):
            got.append((bytes(h), bytes(p)))  # views are only valid until the next feed
        prev = cut
    return got


@settings(max_examples=150, deadline=None)
@given(st.lists(frame_st, max_size=8), st.data())
def test_decoder_any_chunking_yields_exactly_the_frames(frames, data):
    wire = build(frames)
    stream = b"".join(h + p for h, p in wire)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=20))
    dec = FrameDecoder()
    assert feed_chunks(dec, stream, cuts) == wire
    assert dec.pending == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(frame_st, min_size=1, max_size=4), st.data())
def test_decoder_truncated_tail_is_pending(frames, data):
    wire = build(frames)
    stream = b"".join(h + p for h, p in wire)
    last = len(wire[-1][0]) + len(wire[-1][1])
    cut_tail = data.draw(st.integers(min_value=1, max_value=last))
    truncated = stream[:len(stream) - cut_tail]
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(truncated)), max_size=10))
    dec = FrameDecoder()
    assert feed_chunks(dec, truncated, cuts) == wire[:-1]
    assert dec.pending == last - cut_tail
    # the rest arrives later: the last frame comes out whole
    assert [(bytes(h), bytes(p)) for h, p in dec.feed(stream[len(truncated):])] == wire[-1:]
    assert dec.pending == 0


def test_decoder_byte_by_byte():
    wire = [(raw_header(size=3), b"abc"), (raw_header(size=0, band=40), b""),
            (raw_header(size=1), b"z")]
    stream = b"".join(h + p for h, p in wire)
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += [(bytes(h), bytes(p)) for h, p in dec.feed(stream[i:i + 1])]
        if i < 23:
            assert got == [] and dec.pending == i + 1
    assert got == wire and dec.pending == 0


@pytest.mark.parametrize("bad, reason", [
    (raw_header(band=128), "bad-band"),
    (raw_header(loc_type=7), "bad-locality"),
    (raw_header(size=DEFAULT_MAX_PAYLOAD + 1), "oversized"),
])
def test_decoder_bad_header_raises_on_its_24th_byte(bad, reason):
    good = raw_header(size=4) + b"data"
    dec = FrameDecoder()
    assert len(dec.feed(good)) == 1
    for i in range(23):
        assert dec.feed(bad[i:i + 1]) == []
    assert dec.pending == 23
    with pytest.raises(MalformedFrame) as info:
        dec.feed(bad[23:24])
    assert info.value.reason == reason


def test_decoder_oversized_refused_before_payload():
    dec = FrameDecoder(max_payload=100)
    with pytest.raises(MalformedFrame) as info:
        dec.feed(raw_header(size=101))  # no payload byte has arrived
    assert info.value.reason == "oversized"
    dec2 = FrameDecoder(max_payload=100)
    assert dec2.feed(raw_header(size=100) + bytes(100))[0][1] == bytes(100)


def test_decoder_bad_header_after_good_frames_in_one_chunk():
    dec = FrameDecoder()
    with pytest.raises(MalformedFrame) as info:
        dec.feed(raw_header(size=1) + b"x" + raw_header(band=250))
    assert info.value.reason == "bad-band"


def test_decoder_pending_counts_partial_payload():
    dec = FrameDecoder()
    assert dec.feed(raw_header(size=10) + b"12345") == []
    assert dec.pending == 29
    frames = dec.feed(b"67890" + raw_header(size=0)[:4])
    assert [bytes(p) for _, p in frames] == [b"1234567890"]
    assert dec.pending == 4


def test_take_frame_takes_exactly_one_frame_at_a_time() -> None:
    from flowrouter.wire.header import take_frame

    key = b"k" * 16
    f1 = pack_header(key, 3, 40) + b"abc"
    f2 = pack_header(key, 0, 41)
    buf = bytearray(f1 + f2 + b"SEALED-RECORDS-NOT-FRAMES")
    assert take_frame(buf) == f1
    assert take_frame(buf) == f2
    assert buf == bytearray(b"SEALED-RECORDS-NOT-FRAMES")  # the rest is left untouched
    short = bytearray(f1[:10])
    assert take_frame(short) is None and len(short) == 10
    partial = bytearray(f1[:-1])
    assert take_frame(partial) is None and bytes(partial) == f1[:-1]
    with pytest.raises(MalformedFrame):
        take_frame(bytearray(pack_header(key, 10, 200) + b"x" * 10))
