"""Band allocation constants and BandMask text / bytes / bitarray forms."""

from __future__ import annotations

import pytest
from bitarray import bitarray
from hypothesis import given
from hypothesis import strategies as st

from flowrouter.wire import bands as B
from flowrouter.wire.bands import ALL_BANDS, NUM_BANDS, BandMask, check_band, mask_of

masks = st.integers(min_value=0, max_value=ALL_BANDS)
band_sets = st.sets(st.integers(min_value=0, max_value=NUM_BANDS - 1), max_size=40)


# --------------------------------------------------------------------------- constants
def test_band_ranges():
    assert NUM_BANDS == 128
    assert B.DATA_BAND_FIRST == 32 and B.DATA_BAND_LAST == 127
    assert B.DEFAULT_DATA_BAND == 32
    assert list(BandMask.data()) == list(range(32, 128))
    assert list(BandMask(B.ADMIN_BANDS)) == list(range(16, 32))
    assert B.ROUTER_BANDS_END == 16 and B.ADMIN_BANDS_END == 32
    assert ALL_BANDS == (1 << 128) - 1


def test_router_bands_below_16_and_admin_bands_16_to_31():
    for band in (B.BAND_MEMBERSHIP, B.BAND_GC, B.BAND_LS):
        assert band < B.ROUTER_BANDS_END
        assert B.is_router_band(band)
    assert B.BAND_MEMBERSHIP == 0
    for band in (B.BAND_HEARTBEAT, B.BAND_FAULT, B.BAND_OVERFLOW, B.BAND_APP_MEMBERSHIP,
                 B.BAND_REPAIR, B.BAND_ORDER):
        assert B.ROUTER_BANDS_END <= band < B.ADMIN_BANDS_END
        assert not B.is_router_band(band)
    assert B.BAND_FAULT == 17
    assert not B.is_router_band(B.DATA_BAND_FIRST)
    # every named band is distinct and has a distinct name
    assert len(set(B.BAND_NAMES)) == len(set(B.BAND_NAMES.values())) == len(B.BAND_NAMES)


def test_data_mask_excludes_router_and_admin_bands():
    assert BandMask.data() & BandMask(B.ADMIN_BANDS) == BandMask()
    assert 31 not in BandMask.data() and 32 in BandMask.data() and 127 in BandMask.data()


# --------------------------------------------------------------------------- text form
@given(masks)
def test_parse_str_round_trip(bits):
    m = BandMask(bits)
    text = str(m)
    assert BandMask.parse(text) == m
    assert str(BandMask.parse(text)) == text  # canonical


@given(band_sets)
def test_iter_len_contains(bands):
    m = BandMask(bands)
    assert list(m) == sorted(bands)
    assert len(m) == len(bands)
    assert bool(m) == bool(bands)
    for b in range(NUM_BANDS):
        assert (b in m) == (b in bands)


@pytest.mark.parametrize("bands, text", [
    ([], "none"),
    (range(128), "all"),
    (range(32, 128), "32-127"),
    ([0], "0"),
    ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
    ([127], "127"),
    ([17, 32, 33, 34, 100], "17,32-34,100"),
])
def test_str_examples(bands, text):
    assert str(BandMask(bands)) == text
    assert repr(BandMask(bands)) == f"BandMask({text!r})"


@pytest.mark.parametrize("text, bands", [
    ("data", range(32, 128)),
    ("DATA", range(32, 128)),
    ("fault", [17]),
    ("all", range(128)),
    ("ALL", range(128)),
    ("none", []),
    ("empty", []),
    ("membership", [0]),
    ("gc", [1]),
    ("heartbeat", [16]),
    ("app-membership", [19]),
    ("data,fault", [17, *range(32, 128)]),
    (" 32 , 40-42 ,fault ", [17, 32, 40, 41, 42]),
    ("0x20", [32]),
    ("0x20-0x22", [32, 33, 34]),
    ("5-5", [5]),
    ("0-127", range(128)),
])
def test_parse_names_and_ranges(text, bands):
    assert BandMask.parse(text) == BandMask(bands)


@pytest.mark.parametrize("text, match", [
    ("", "empty band mask"),
    ("   ", "empty band mask"),
    ("128", "bad band '128'"),
    ("foo", "bad band 'foo'"),
    ("32,,33", "bad band ''"),
    ("1.5", "bad band '1.5'"),
    ("40-32", "runs backwards"),
    ("32-x", "bad band range '32-x'"),
    ("-1", "bad band range '-1'"),
    ("32-200", "0..127"),
])
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        BandMask.parse(text)


# --------------------------------------------------------------------------- int / bytes / bits
@pytest.mark.parametrize("bad", [-1, ALL_BANDS + 1, 1 << 200])
def test_int_out_of_range(bad):
    with pytest.raises(ValueError, match="out of range"):
        BandMask(bad)


@pytest.mark.parametrize("bad", [128, -1, 1000])
def test_band_out_of_range(bad):
    with pytest.raises(ValueError, match=r"0\.\.127"):
        BandMask([bad])
    with pytest.raises(ValueError, match=r"0\.\.127"):
        check_band(bad)


def test_check_band_rejects_non_ints():
    assert check_band(0) == 0 and check_band(127) == 127
    for bad in (True, 1.0, "3", None):
        with pytest.raises(ValueError):
            check_band(bad)  # type: ignore[arg-type]


@given(masks)
def test_bytes_round_trip(bits):
    m = BandMask(bits)
    raw = m.to_bytes()
    assert len(raw) == 16
    assert BandMask.from_bytes(raw) == m
    assert BandMask.from_bytes(memoryview(raw)) == m
    assert int.from_bytes(raw, "big") == bits


@pytest.mark.parametrize("n", [0, 15, 17, 32])
def test_from_bytes_wrong_length(n):
    with pytest.raises(ValueError, match=f"16 bytes on the wire, got {n}"):
        BandMask.from_bytes(b"\0" * n)


@given(masks)
def test_bitarray_round_trip(bits):
    m = BandMask(bits)
    ba = m.to_bitarray()
    assert len(ba) == NUM_BANDS
    assert [i for i in range(NUM_BANDS) if ba[i]] == list(m)
    assert BandMask.from_bitarray(ba) == m


def test_from_bitarray_index_is_band_whatever_the_endianness():
    little = bitarray(NUM_BANDS, endian="little")
    little.setall(0)
    little[3] = little[100] = 1
    assert list(BandMask.from_bitarray(little)) == [3, 100]


@pytest.mark.parametrize("n", [0, 127, 129])
def test_from_bitarray_wrong_length(n):
    with pytest.raises(ValueError, match=f"128 bits, got {n}"):
        BandMask.from_bitarray(bitarray(n))


# --------------------------------------------------------------------------- operators, coercion
@given(masks, masks)
def test_set_operators(a, b):
    ma, mb = BandMask(a), BandMask(b)
    assert (ma | mb).bits == a | b
    assert (ma & mb).bits == a & b
    assert (ma - mb).bits == a & ~b
    assert (ma == mb) == (a == b)
    if a == b:
        assert hash(ma) == hash(mb)


def test_equality_is_not_with_ints_and_copy_constructor():
    m = BandMask([32])
    assert m != 1 << 32
    assert BandMask(m) == m
    assert BandMask.all().bits == ALL_BANDS
    assert "32" not in m and 200 not in m and -1 not in m


def test_mask_of():
    assert mask_of(BandMask([32, 40])) == (1 << 32) | (1 << 40)
    assert mask_of("fault") == 1 << 17
    assert mask_of("data") == B.DATA_BANDS
    assert mask_of(33) == 1 << 33  # a single int is one band, not a raw mask
    assert mask_of([0, 1]) == 3
    with pytest.raises(ValueError):
        mask_of(128)
    with pytest.raises(ValueError):
        mask_of("nonsense")
