"""FlowID text / key forms and the never-reusing LocalIdAllocator."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowrouter.wire.flowid import (
    LINK_LOCAL_FLOW,
    LSID_LINK_LOCAL,
    FlowID,
    LocalIdAllocator,
    flow_text,
    key_lsid,
)

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
u32 = st.integers(min_value=0, max_value=(1 << 32) - 1)
flow_ids = st.builds(FlowID, u64, u32, u32)


# --------------------------------------------------------------------------- text form
@given(flow_ids)
def test_text_round_trip(fid):
    text = str(fid)
    assert FlowID.parse(text) == fid
    c, lsid, n = text.split(":")
    assert (len(c), len(lsid), len(n)) == (16, 8, 8)  # canonical form is zero-padded
    assert text == text.lower()


@given(flow_ids)
def test_parse_unpadded_and_uppercase(fid):
    text = f"{fid.creator:x}:{fid.lsid:X}:{fid.local:x}"
    assert FlowID.parse(text) == fid
    assert FlowID.parse(f"  {text}\n") == fid


def test_parse_examples():
    assert FlowID.parse("a1:10:1") == FlowID(0xA1, 0x10, 1)
    assert str(FlowID(0xA1, 0x10, 1)) == "00000000000000a1:00000010:00000001"
    assert FlowID.parse("0:0:0") == LINK_LOCAL_FLOW


@pytest.mark.parametrize("text, match", [
    ("", "expected creator:lsid:local"),
    ("a1:10", "expected creator:lsid:local"),
    ("a1:10:1:2", "expected creator:lsid:local"),
    ("a1-10-1", "expected creator:lsid:local"),
    ("g1:10:1", "must be hexadecimal"),
    ("a1::1", "must be hexadecimal"),
    ("a1:10:1.0", "must be hexadecimal"),
    ("1" * 17 + ":1:1", "creator must fit in 64 bits"),
    ("1:100000000:1", "lsid must fit in 32 bits"),
    ("1:1:100000000", "local must fit in 32 bits"),
    ("-1:1:1", "creator must fit in 64 bits"),
])
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match) as info:
        FlowID.parse(text)
    # the message names the offending text, or the field that does not fit
    assert repr(text) in str(info.value) or "must fit" in str(info.value)


@pytest.mark.parametrize("args", [(-1, 0, 0), (1 << 64, 0, 0), (0, 1 << 32, 0), (0, 0, -1),
                                  (0, 0, "1")])
def test_constructor_validates(args):
    with pytest.raises(ValueError, match="must fit"):
        FlowID(*args)


# --------------------------------------------------------------------------- key form
@given(flow_ids)
def test_key_round_trip(fid):
    key = fid.key
    assert len(key) == 16
    assert FlowID.from_key(key) == fid
    assert FlowID.from_key(memoryview(key)) == fid
    assert key_lsid(key) == fid.lsid
    assert flow_text(key) == str(fid)
    assert key[:8] == fid.creator.to_bytes(8, "big")


@pytest.mark.parametrize("n", [0, 15, 17, 24])
def test_from_key_wrong_length(n):
    with pytest.raises(ValueError, match=f"16 bytes, got {n}"):
        FlowID.from_key(b"\0" * n)


def test_link_local():
    assert LSID_LINK_LOCAL == 0
    assert LINK_LOCAL_FLOW.is_link_local
    assert FlowID(5, 0, 9).is_link_local
    assert not FlowID(5, 1, 9).is_link_local
    assert LINK_LOCAL_FLOW.key == bytes(16)


def test_ordering_and_hashing():
    a, b = FlowID(1, 2, 3), FlowID(1, 2, 4)
    assert a < b
    assert len({a, FlowID(1, 2, 3), b}) == 2


# --------------------------------------------------------------------------- allocator
def test_allocator_creates_state_file(tmp_path):
    path = tmp_path / "sub" / "creator"
    alloc = LocalIdAllocator(path, block=4)
    assert path.exists()
    assert 0 < alloc.creator < 1 << 64
    ids = [alloc.allocate() for _ in range(10)]
    assert ids == list(range(ids[0], ids[0] + 10))
    assert ids[0] >= 1
    fid = alloc.new_flow(0x10)
    assert fid.creator == alloc.creator and fid.lsid == 0x10 and fid.local not in ids
    assert os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("block", [1, 3, 64])
def test_allocator_never_reuses_across_restarts(tmp_path, block):
    path = tmp_path / "creator"
    seen: list[int] = []
    creators = set()
    for restart in range(6):  # each instance is a fresh process start
        alloc = LocalIdAllocator(path, block=block)
        creators.add(alloc.creator)
        seen += [alloc.allocate() for _ in range(restart * 2 + 1)]
        # the instance is abandoned mid-block: a "crash"
    assert len(creators) == 1
    assert len(seen) == len(set(seen))


def test_allocator_interleaved_instances_never_collide(tmp_path):
    path = tmp_path / "creator"
    a = LocalIdAllocator(path, block=3)
    b = LocalIdAllocator(path, block=5)
    assert a.creator == b.creator
    got_a, got_b = [], []
    pattern = [0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1] * 5
    for who in pattern:
        (got_a if who == 0 else got_b).append((a if who == 0 else b).allocate())
    assert len(set(got_a)) == len(got_a)
    assert len(set(got_b)) == len(got_b)
    assert not set(got_a) & set(got_b)
    # a third "process" started later still gets fresh IDs
    c = LocalIdAllocator(path, block=2)
    later = {c.allocate() for _ in range(5)}
    assert not later & (set(got_a) | set(got_b))


def _worker(path: str, n: int, q) -> None:  # pragma: no cover - runs in a child process
    alloc = LocalIdAllocator(path, block=2)
    q.put([alloc.allocate() for _ in range(n)])


def test_allocator_two_real_processes(tmp_path):
    path = str(tmp_path / "creator")
    LocalIdAllocator(path)  # create the file first so both share the creator
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, 60, q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=20) for _ in procs]
    for p in procs:
        p.join(timeout=20)
        assert p.exitcode == 0
    flat = [x for r in results for x in r]
    assert len(flat) == 120 and len(set(flat)) == 120


def test_allocator_persists_creator_and_next(tmp_path):
    path = tmp_path / "creator"
    a = LocalIdAllocator(path, block=10)
    first = a.allocate()
    creator_text, next_text = path.read_text().split()
    assert int(creator_text, 16) == a.creator
    assert int(next_text, 16) == first + 10  # the whole block is reserved on disk


def test_allocator_resumes_from_existing_state(tmp_path):
    path = tmp_path / "creator"
    path.write_text("00000000000000a1 00000100\n")
    alloc = LocalIdAllocator(path, block=4)
    assert alloc.creator == 0xA1
    assert alloc.allocate() == 0x100
    assert alloc.new_flow(7) == FlowID(0xA1, 7, 0x101)


def test_allocator_default_path_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWNET_STATE_DIR", str(tmp_path / "state"))
    alloc = LocalIdAllocator()
    assert alloc.path == tmp_path / "state" / "creator"
    assert alloc.path.exists()


def test_allocator_exhaustion(tmp_path):
    path = tmp_path / "creator"
    path.write_text("00000000000000a1 fffffff0\n")
    alloc = LocalIdAllocator(path, block=64)
    with pytest.raises(RuntimeError, match="exhausted"):
        alloc.allocate()


def test_allocator_hands_out_the_last_local_id(tmp_path):
    path = tmp_path / "creator"
    path.write_text("00000000000000a1 ffffffff\n")
    alloc = LocalIdAllocator(path, block=1)
    assert alloc.allocate() == 0xFFFFFFFF
    with pytest.raises(RuntimeError, match="exhausted"):
        alloc.allocate()


@pytest.mark.parametrize("content", ["zz yy\n", "00000000000000a1 not-hex\n",
                                     "hello world\n", "\xff\xfe 12\n"])
def test_allocator_corrupt_file(tmp_path, content):
    path = tmp_path / "creator"
    path.write_text(content, encoding="latin-1")
    before = path.read_bytes()
    with pytest.raises(ValueError, match="corrupt creator state file") as info:
        LocalIdAllocator(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before  # left untouched for the operator


@pytest.mark.parametrize("content", ["garbage\n", "00000000000000a1\n"])
def test_allocator_single_token_file_is_corrupt(tmp_path, content):
    path = tmp_path / "creator"
    path.write_text(content)
    with pytest.raises(ValueError, match="corrupt creator state file"):
        LocalIdAllocator(path)
    assert path.read_text() == content
