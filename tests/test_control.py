"""Control-message codec: round trips, strictness, and a fuzz of the decoder."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_MEMBERSHIP
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import MalformedFrame, pack_header, parse_header

u8 = st.integers(min_value=0, max_value=255)
u32 = st.integers(min_value=0, max_value=(1 << 32) - 1)
u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
mask128 = st.integers(min_value=0, max_value=(1 << 128) - 1)
# at most 4 UTF-8 bytes per character: these always fit the 255-byte short strings
short_text = st.text(max_size=63)
long_text = st.text(max_size=400)

messages = st.one_of(
    st.builds(C.Hello, node_id=u64, role=st.sampled_from(C.Role), name=short_text,
              max_payload=u32, default_lsid=u32, credentials=st.binary(max_size=300)),
    st.builds(C.Error, code=st.integers(min_value=0, max_value=0xFFFF), text=long_text),
    st.builds(C.LsRoutes, routes=st.lists(st.tuples(u32, u8), max_size=30).map(tuple)),
    st.builds(C.Join, req_id=u32, mask=mask128, flags=u8, capability=st.binary(max_size=300)),
    st.builds(C.Auth, body=st.binary(max_size=64)),
    st.builds(C.PolicyMsg, raw=st.binary(max_size=300)),
    st.builds(C.JoinAck, req_id=u32, status=st.sampled_from(C.JoinStatus), reason=short_text),
    st.just(C.Leave()),
    st.builds(C.Mask, mask=mask128),
    st.builds(C.Ping, epoch=u32),
    st.builds(C.Pong, epoch=u32),
    st.builds(C.Echo, seq=u32, stamp=u64),
    st.builds(C.EchoReply, seq=u32, stamp=u64),
    st.builds(lambda rnd, count, hold, entries: C.Refresh(rnd, count - 1, count, hold,
                                                          tuple(entries)),
              u32, st.integers(min_value=1, max_value=0xFFFF), u32,
              st.lists(st.tuples(st.binary(min_size=16, max_size=16), mask128, u8),
                       max_size=20)),
    st.builds(C.Prune, keys=st.lists(st.binary(min_size=16, max_size=16), max_size=20)
              .map(tuple)),
    st.builds(C.NotOnTree, keys=st.lists(st.binary(min_size=16, max_size=16), max_size=20)
              .map(tuple)),
    st.builds(C.LsTopology, lsid=u32, entries=st.lists(st.tuples(
        short_text, u32, st.lists(short_text, max_size=5).map(tuple)), max_size=8).map(tuple)),
    st.builds(C.Fault, kind=st.sampled_from(C.FaultKind), origin=short_text, detail=long_text,
              extra=st.dictionaries(short_text, long_text, max_size=5)),
)

EXAMPLES = [
    C.Hello(0x1122334455667788, C.Role.ROUTER, "r1", 65536, 0x10, b"cred"),
    C.Hello(1, C.Role.ENDPOINT, "", 0),
    C.Error(1, "malformed frame: bad-band"),
    C.LsRoutes(((0x10, 0), (0x20, 3))),
    C.LsRoutes(()),
    C.Join(7, (1 << 32) | (1 << 127), C.JOIN_FLAG_ADVERTISE),
    C.Join(8, 1 << 40, 0, b"capability-token"),
    C.Auth(b"\x01\x02" + b"p" * 32),
    C.PolicyMsg(b"FN-policy-bytes"),
    C.JoinAck(7, C.JoinStatus.NO_ROUTE, "no route to 0x99"),
    C.Leave(),
    C.Mask(1 << 40),
    C.Ping(3),
    C.Pong(0xFFFFFFFF),
    C.Echo(1, 123456789),
    C.EchoReply(0xFFFFFFFF, 0),
    C.Refresh(7, 1, 3, 35_000, ((b"k" * 16, 1 << 32, 0), (b"a" * 16, 0, C.REFRESH_ADVERTISE))),
    C.Prune((b"p" * 16,)),
    C.NotOnTree((b"n" * 16, b"m" * 16)),
    C.LsTopology(0x10, (("m1", 3, ("m2", "m5")), ("m2", 0xFFFFFFFF, ()))),
    C.Fault(C.FaultKind.LINK_DOWN, "r2", "link 3 went down", {"peer": "r3", "flow": "a:1:2"}),
]


@given(messages)
@example(EXAMPLES[0])
def test_round_trip(msg):
    raw = msg.encode()
    assert raw[0] == C.CONTROL_VERSION and raw[1] == msg.TYPE
    assert C.decode(raw) == msg
    assert C.decode(memoryview(raw)) == msg
    assert C.decode(bytearray(raw)) == msg


def test_every_type_has_an_example():
    assert {type(m).TYPE for m in EXAMPLES} == set(C.MsgType)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_truncation_is_rejected(msg):
    raw = msg.encode()
    for n in range(len(raw)):
        with pytest.raises(MalformedFrame) as info:
            C.decode(raw[:n])
        assert info.value.reason == "bad-control", n


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("extra", [b"\0", b"trailing"])
def test_trailing_bytes_rejected(msg, extra):
    with pytest.raises(MalformedFrame, match="trailing bytes") as info:
        C.decode(msg.encode() + extra)
    assert info.value.reason == "bad-control"


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("version", [0, 2, 255])
def test_wrong_version_rejected(msg, version):
    raw = bytes([version]) + msg.encode()[1:]
    with pytest.raises(MalformedFrame) as info:
        C.decode(raw)
    assert info.value.reason == "bad-version"


@pytest.mark.parametrize("mtype", [0, 6, 9, 23, 99, 255])
def test_unknown_type_is_its_own_error(mtype):
    """A newer peer's message type: receivers count and ignore it (UnknownControlType), so
    it is told apart from a malformed message (which drops the link)."""
    with pytest.raises(C.UnknownControlType, match=f"unknown control type {mtype}") as info:
        C.decode(bytes([C.CONTROL_VERSION, mtype]) + b"anything a newer peer put here")
    assert info.value.reason == "unknown-type" and info.value.mtype == mtype
    assert isinstance(info.value, MalformedFrame)  # code that only knows MalformedFrame


def test_hello_frames_announce_features_in_the_header():
    body = C.Hello(1, C.Role.ENDPOINT, "x", 100).encode()
    hdr = C.hello_header(len(body))
    assert C.hello_features(hdr) == C.FEATURES and C.FEATURES & C.FEATURE_SOFT_STATE
    assert hdr[:16] == LINK_LOCAL_FLOW.key and hdr[20] == BAND_MEMBERSHIP
    assert parse_header(hdr).size == len(body)
    # a node from before features sends locality NONE, value 0
    assert C.hello_features(pack_header(LINK_LOCAL_FLOW.key, len(body), 0)) == 0
    assert C.hello_features(C.hello_header(len(body), 0)) == 0
    with pytest.raises(ValueError):
        C.hello_header(len(body), 256)


def test_hello_bad_magic_and_role():
    raw = bytearray(EXAMPLES[0].encode())
    bad = bytes(raw[:2]) + b"FLOX" + bytes(raw[6:])
    with pytest.raises(MalformedFrame, match="magic") as info:
        C.decode(bad)
    assert info.value.reason == "bad-hello"
    raw[2 + 4 + 8] = 9  # role byte
    with pytest.raises(MalformedFrame, match="unknown role 9") as info:
        C.decode(bytes(raw))
    assert info.value.reason == "bad-hello"


def test_bad_enum_values_rejected():
    ack = bytearray(C.JoinAck(1, C.JoinStatus.OK).encode())
    ack[6] = 99
    with pytest.raises(MalformedFrame, match="join status 99"):
        C.decode(bytes(ack))
    fault = bytearray(EXAMPLES[-1].encode())
    fault[2] = 0
    with pytest.raises(MalformedFrame, match="fault kind"):
        C.decode(bytes(fault))


def test_non_utf8_string_rejected():
    raw = bytearray(C.JoinAck(1, C.JoinStatus.OK, "ab").encode())
    raw[-1] = 0xFF
    with pytest.raises(MalformedFrame, match="non-UTF-8") as info:
        C.decode(bytes(raw))
    assert info.value.reason == "bad-control"


def test_empty_and_one_byte_payloads():
    for raw in (b"", b"\x01"):
        with pytest.raises(MalformedFrame) as info:
            C.decode(raw)
        assert info.value.reason == "bad-control"


def test_wire_sizes():
    assert len(C.Join(1, 0).encode()) == 2 + 4 + 16 + 1 + 2  # + empty capability blob
    assert len(C.Mask(0).encode()) == 2 + 16
    assert len(C.Ping(0).encode()) == len(C.Pong(0).encode()) == 6
    assert len(C.Leave().encode()) == 2
    assert C.Join(1, 1 << 127).encode()[6] == 0x80  # masks are big-endian


def test_ascii_strings_longer_than_the_field_are_cut_but_still_decode():
    msg = C.JoinAck(1, C.JoinStatus.OK, "x" * 300)
    assert C.decode(msg.encode()).reason == "x" * 255


def test_over_long_non_ascii_string_still_decodes():
    msg = C.Fault(C.FaultKind.LINK_DOWN, "é" * 200)  # 400 bytes of UTF-8; the field holds 255
    C.decode(msg.encode())  # must not raise MalformedFrame


def test_fault_with_more_than_255_extras_encodes():
    msg = C.Fault(C.FaultKind.LIMIT, "r1", "", {f"k{i}": "v" for i in range(300)})
    assert len(C.decode(msg.encode()).extra) == 255


# --------------------------------------------------------------------------- fuzz
def _decode_or_malformed(raw: bytes) -> None:
    try:
        msg = C.decode(raw)
    except MalformedFrame as exc:
        assert exc.reason in {"bad-control", "bad-version", "bad-hello", "unknown-type"}
        return
    # anything accepted is a well-formed message: it re-encodes and decodes to itself, and
    # (apart from a FAULT whose extra map repeats a key) to exactly the same bytes
    again = msg.encode()
    assert C.decode(again) == msg
    if not isinstance(msg, C.Fault):
        assert again == raw


FUZZ = settings(max_examples=1500, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=80))
def test_fuzz_arbitrary_bytes(raw):
    _decode_or_malformed(raw)


@FUZZ
@given(st.sampled_from(C.MsgType), st.binary(max_size=80))
def test_fuzz_valid_prefix_random_body(mtype, body):
    _decode_or_malformed(bytes([C.CONTROL_VERSION, mtype]) + body)


@settings(max_examples=1000, deadline=None)
@given(messages, st.data())
def test_fuzz_mutated_valid_messages(msg, data):
    raw = bytearray(msg.encode())
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        i = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw[i] = data.draw(u8)
    _decode_or_malformed(bytes(raw))


def test_refresh_chunk_index_must_be_inside_its_round():
    raw = bytearray(C.Refresh(1, 0, 1, 1000, ()).encode())
    raw[6:8] = (2).to_bytes(2, "big")  # index 2 of a 1-chunk round
    with pytest.raises(MalformedFrame, match="chunk 2 of 1"):
        C.decode(bytes(raw))


def test_a_refresh_update_belongs_to_no_round_and_has_one_chunk():
    update = C.Refresh(0, 0, C.REFRESH_UPDATE, 0, ((b"k" * 16, 0, C.REFRESH_SIBLING),))
    assert C.decode(update.encode()) == update  # mask 0 too: a sibling's side left
    raw = bytearray(update.encode())
    raw[6:8] = (1).to_bytes(2, "big")
    with pytest.raises(MalformedFrame, match="chunk 1 of 0"):
        C.decode(bytes(raw))


def test_refresh_capacity_fits_the_link():
    for max_payload in (200, 1400, 65536):
        n = C.refresh_capacity(max_payload)
        entries = tuple((bytes(16), (1 << 128) - 1, 0) for _ in range(n))
        assert len(C.Refresh(1, 0, 1, 1, entries).encode()) <= max_payload
    assert C.refresh_capacity(1 << 20) == C.MAX_REFRESH_ENTRIES
    keys = tuple(bytes(16) for _ in range(C.keys_capacity(1400)))
    assert len(C.Prune(keys).encode()) <= 1400
