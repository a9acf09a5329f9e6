"""The compiled engine's hot table: flows of one routing class decided once, per-flow
counters kept in 32 bits beside the key and spilled before they wrap, and both followed
through every change of the mirror, exactly as the Python twin does it.

The twin knows nothing of classes or hot slots; these tests hold the compiled engine's
outputs and counters to it while flows join a class, leave it (their routing changed, they
went, they became absent) and share it with thousands of others.
"""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrouter.core import fastpath_py
from flowrouter.core.fastpath_py import STOP_END, STOP_MISS_FLOW
from tests.test_fastpath_engine import NO_BUDGET, _key, _run, native_engine

#: flows enough for the compiled engine's look-ahead (SCOUT_MIN_FLOWS in _fastpath_tables.h)
BIG = 4200
LINKS = (1, 2, 3, 4)


def _frame(key: bytes, band: int = 40, size: int = 3, ttl: int = 5) -> bytes:
    return key + struct.pack("!IBBBB", size, band, 0, 0, ttl) + b"x" * size


def _both():  # type: ignore[no-untyped-def]
    native, twin = native_engine(), fastpath_py.Engine()
    for eng in (native, twin):
        for lk in LINKS:
            eng.set_link(lk, False, 65536, (0, 0, 0, 0))
        eng.set_route(0x10, 4)
    return native, twin


def _counts(eng, keys: list[bytes]) -> list:  # type: ignore[no-untyped-def]
    return [eng.flow_counts(k) for k in keys]


#: routings a flow may be given: few, so that many flows share each class
ROUTINGS = [(1, [(2, 1 << 40)], 1 << 40), (1, [(3, 1 << 40)], 1 << 40),
            (1, [(2, 1 << 41)], 1 << 41), (-1, [(2, 1 << 40)], 1 << 40),
            (1, [], 0), (1, [(2, 1 << 40), (3, 1 << 40)], 1 << 40),
            (1, [(2, 1 << 40)], 1 << 40 | 1 << 41)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["route", "absent", "forget", "forget_absent",
                                           "send"]),
                          st.integers(0, 7), st.integers(0, len(ROUTINGS) - 1),
                          st.lists(st.integers(0, 7), max_size=20)),
                max_size=40),
       st.booleans())
def test_classes_follow_every_change_of_the_mirror(ops: list, big: bool) -> None:
    """Flows change routing (leaving one class for another or for none), go, become absent
    and are compacted away, between reads that mix their frames: every read is forwarded
    and counted as the twin does, with a table small enough to be read frame by frame and
    one large enough for the look-ahead."""
    native, twin = _both()
    keys = [_key(i) for i in range(8)]
    if big:  # thousands of flows in one class beside the ones that change
        for eng in (native, twin):
            for i in range(BIG):
                eng.set_flow(_key(10_000 + i), 1, [(2, 1 << 40)], 1 << 40)
    filler = [_key(10_000 + i) for i in range(0, BIG, 97)] if big else []
    for kind, i, routing, picks in ops:
        if kind == "forget":  # what each hands back, and nothing after
            assert native.forget_flow(keys[i]) == twin.forget_flow(keys[i])
            continue
        for eng in (native, twin):
            if kind == "route":
                eng.set_flow(keys[i], *ROUTINGS[routing])
            elif kind == "absent":
                eng.set_absent(keys[i])
            elif kind == "forget_absent":
                eng.forget_absent()
        # every flow in each read, neighbours of every kind, beside the drawn picks
        sent = [keys[p] for p in picks] + keys + keys[::-1] + keys[::2] + filler
        data = b"".join(_frame(k, band=40 + (j % 3 == 0)) for j, k in enumerate(sent))
        for in_link in (1, 2):
            assert _run(native, in_link, data, NO_BUDGET, NO_BUDGET) == _run(
                twin, in_link, data, NO_BUDGET, NO_BUDGET)
        assert _counts(native, keys) == _counts(twin, keys)
    assert native.sizes() == twin.sizes()
    assert sorted(native.all_flow_counts()) == sorted(twin.all_flow_counts())
    assert [native.forget_flow(k) for k in keys] == [twin.forget_flow(k) for k in keys]


def test_a_flow_leaving_its_class_is_routed_by_its_own_entry() -> None:
    """Frames of many flows alike, then one of them moved to another link: within one read,
    the moved flow's frames go to its new link and its old classmates' stay."""
    native, twin = _both()
    keys = [_key(i) for i in range(BIG + 10)]
    for eng in (native, twin):
        for k in keys:
            eng.set_flow(k, 1, [(2, 1 << 40)], 1 << 40)
        eng.set_flow(keys[5], 1, [(3, 1 << 40)], 1 << 40)
    data = b"".join(_frame(k) for k in keys[:12])
    got = native.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536)
    assert got == twin.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536)
    pos, stop, outs, _counts = got
    assert (pos, stop) == (len(data), STOP_END)
    by_link = {lk: bytes(out) if not isinstance(out, list) else b"".join(out)
               for lk, out, _n in outs}
    assert by_link[3] == _frame(keys[5], ttl=4)
    assert by_link[2] == b"".join(_frame(k, ttl=4) for k in keys[:12] if k != keys[5])


def test_a_class_is_the_whole_routing_not_the_links_alone() -> None:
    """Flows with the same links but other band masks (or another aggregate) are not routed
    alike: in one read, each frame is forwarded or dropped by its own flow's masks."""
    native, twin = _both()
    a, b, c = _key(1), _key(2), _key(3)
    for eng in (native, twin):
        for i in range(BIG):  # the look-ahead on
            eng.set_flow(_key(10_000 + i), 1, [(2, 1 << 40)], 1 << 40)
        eng.set_flow(a, 1, [(2, 1 << 40)], 1 << 40)
        eng.set_flow(b, 1, [(2, 1 << 41)], 1 << 41)
        eng.set_flow(c, 1, [(2, 1 << 40)], 1 << 40 | 1 << 41)
    frames = [(a, 40), (b, 40), (a, 41), (c, 41), (b, 41), (c, 40), (a, 40)]
    data = b"".join(_frame(k, band=band) for k, band in frames)
    got = native.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536)
    assert got == twin.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536)
    (_lk, out, nframes), = got[2]
    sent = bytes(out) if not isinstance(out, list) else b"".join(out)
    assert sent == b"".join(_frame(k, band=band, ttl=4)
                            for k, band in [(a, 40), (b, 41), (c, 40), (a, 40)])
    assert nframes == 4
    assert _counts(native, [a, b, c]) == _counts(twin, [a, b, c])


def test_counters_past_four_gibibytes_are_exact() -> None:
    """A flow's counters in its hot slot are 32-bit: past 4 GiB of frames they spill into
    its 64-bit counters, and what is handed back is still every byte."""
    native, twin = _both()
    key = _key(1)
    for eng in (native, twin):
        eng.set_flow(key, 1, [(2, 1 << 40)], 1 << 40)
    size = 60_000
    data = _frame(key, size=size) * 70  # payloads by reference: nothing is copied
    rounds = (1 << 32) // len(data) + 3
    for eng in (native, twin):
        for _ in range(rounds):
            res = eng.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536, 1024)
            assert res[:2] == (len(data), STOP_END)
    want = (70 * rounds, len(data) * rounds)
    assert want[1] > 1 << 32
    assert native.flow_counts(key) == twin.flow_counts(key) == want
    assert native.all_flow_counts() == [(key, *want)]
    assert native.forget_flow(key) == want


def test_more_routings_than_classes_still_forward_alike() -> None:
    """Past MAX_CLASSES distinct routings (65,536) a flow gets no class and is decided on its
    own entry: the same outputs, only without the shortcut."""
    native, twin = _both()
    n = 65_536 + 50
    keys = [_key(i) for i in range(n)]
    for eng in (native, twin):
        for i, k in enumerate(keys):
            eng.set_flow(k, 1, [(2, 1 << 40 | i << 42)], 1 << 40 | i << 42)
    assert native.classes() == (65_536, 65_536, 50)  # held, most, flows refused one
    data = b"".join(_frame(k) for k in keys[-200:])
    assert _run(native, 1, data, NO_BUDGET, NO_BUDGET) == _run(twin, 1, data, NO_BUDGET,
                                                                 NO_BUDGET)
    for k in keys[:100]:  # classes freed, then taken again
        for eng in (native, twin):
            eng.forget_flow(k)
    for eng in (native, twin):
        eng.set_flow(keys[0], 1, [(3, 1 << 40)], 1 << 40)
    data = b"".join(_frame(k) for k in [keys[0], *keys[-50:]])
    assert _run(native, 1, data, NO_BUDGET, NO_BUDGET) == _run(twin, 1, data, NO_BUDGET,
                                                                 NO_BUDGET)
    assert _counts(native, keys[-200:]) == _counts(twin, keys[-200:])
    assert native.classes()[0] == 65_536 - 100 + 1
    native.clear()
    assert native.classes() == (0, 65_536, 0)


def test_counts_survive_growth_and_compaction() -> None:
    """What a flow took stays its own while the hot table is built again (it grows, absent
    keys are compacted away and the entries after them move) and while other flows leave
    (the last entry moves into each hole)."""
    native, twin = _both()
    keys = [_key(i) for i in range(40)]
    for eng in (native, twin):
        for i, k in enumerate(keys):
            if i % 4 == 1:
                eng.set_absent(k)
            else:
                eng.set_flow(k, 1, [(2 + i % 2, 1 << 40)], 1 << 40)
    data = b"".join(_frame(k, size=i) for i, k in enumerate(keys))
    for eng in (native, twin):
        _run(eng, 1, data, NO_BUDGET, NO_BUDGET)
        for i in range(BIG):  # grows the table several times over
            eng.set_flow(_key(10_000 + i), 1, [(2, 1 << 40)], 1 << 40)
    assert _counts(native, keys) == _counts(twin, keys)
    for eng in (native, twin):
        eng.forget_absent()
        for k in keys[:10]:
            eng.forget_flow(k)
        _run(eng, 1, data, NO_BUDGET, NO_BUDGET)
    assert _counts(native, keys) == _counts(twin, keys)
    assert sorted(native.all_flow_counts()) == sorted(twin.all_flow_counts())
    assert [native.forget_flow(k) for k in keys] == [twin.forget_flow(k) for k in keys]


@pytest.mark.parametrize(("flows", "churn"), [(740, 300), (6000, 2000)])
def test_a_packed_hot_table_finds_every_flow_through_churn(flows: int, churn: int) -> None:
    """The hot table is built at most half full and built again at 3/4 (slots in use and
    tombstones count), a probe going on to the next slot until it finds the key or an empty
    one. Close to that limit (740 flows in 1,024 slots; 6,000 in 8,192, where reads are
    looked ahead), with the tombstones of flows that left, long runs of taken slots and
    probes that wrap past the table's end, every flow present is found and forwarded as the
    twin does, and every key that left or never came is not."""
    native, twin = _both()
    rng = random.Random(flows)
    live: list[bytes] = []
    gone: list[bytes] = []
    made = 0
    for _ in range(5):
        while len(live) < flows:
            key = _key(made)
            made += 1
            for eng in (native, twin):
                eng.set_flow(key, 1, [(2 + made % 2, 1 << 40)], 1 << 40)
            live.append(key)
        rng.shuffle(live)
        for key in live[:churn]:
            assert native.forget_flow(key) == twin.forget_flow(key)
        gone += live[:churn]
        del live[:churn]
    keys = live + gone[-churn:] + [_key(10**9 + i) for i in range(50)]
    rng.shuffle(keys)
    data = b"".join(_frame(k) for k in keys * 2)
    calls = _run(native, 1, data, NO_BUDGET, NO_BUDGET)
    assert calls == _run(twin, 1, data, NO_BUDGET, NO_BUDGET)
    assert sum(c[1] == STOP_MISS_FLOW for c in calls) == 2 * (churn + 50)
    assert _counts(native, live) == _counts(twin, live)
    assert all(c[0] == 2 for c in _counts(native, live))


def _unseeded_home(key: bytes, cap: int) -> int:
    """Where a key's probe would start if the hot table's hash had no seed (hash_key in
    _fastpath_tables.h with both seed words 0): what anyone could work out beforehand."""
    m64 = (1 << 64) - 1
    a, b = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    h = (a * 0x9E3779B97F4A7C15 & m64) ^ ((b + 0x632BE59BD9B4E019) & m64)
    h ^= h >> 29
    h = h * 0xBF58476D1CE4E5B9 & m64
    h ^= h >> 32
    return h & (cap - 1)


def test_flows_made_to_collide_beforehand_do_not_line_up() -> None:
    """Flow keys are chosen by whoever creates a flow. 300 keys that would all start their
    probe in one slot of a 512-slot table under a hash known beforehand are spread by the
    engine's own seed: the longest probe stays short (without the seed it would read 300
    slots), and status reports it."""
    cap = 512  # what 300 flows grow into: 256 slots hold at most 192
    keys = [k for k in (_key(i) for i in range(200_000)) if _unseeded_home(k, cap) == 0][:300]
    assert len(keys) == 300
    native, _ = _both()
    for k in keys:
        native.set_flow(k, 1, [(2, 1 << 40)], 1 << 40)
    slots, gone, longest = native.hot_stats()
    assert (slots, gone, native.sizes()[0]) == (cap, 0, 300)
    assert longest < 100


def test_the_tables_shrink_when_most_flows_go() -> None:
    """A subscriber of thousands of flows leaves: the hot table is built again at the size
    of the flows left (its tombstones gone), and the flows left are still forwarded and
    counted as the twin does, through their going and as flows come back."""
    native, twin = _both()
    keys = [_key(10_000 + i) for i in range(3 * BIG)]
    for eng in (native, twin):
        for k in keys:
            eng.set_flow(k, 1, [(2, 1 << 40)], 1 << 40)
    data = b"".join(_frame(k) for k in keys[::7])
    assert _run(native, 1, data, NO_BUDGET, NO_BUDGET) == _run(twin, 1, data, NO_BUDGET,
                                                               NO_BUDGET)
    full = native.hot_stats()[0]
    kept = keys[::500]
    for k in keys:
        if k not in kept:
            assert native.forget_flow(k) == twin.forget_flow(k)
    slots, tombstones, _longest = native.hot_stats()
    assert slots * 16 <= full and slots < 8 * len(kept) and tombstones < slots // 2
    assert native.sizes() == twin.sizes() == (len(kept), len(LINKS))
    assert _counts(native, kept) == _counts(twin, kept)
    data = b"".join(_frame(k) for k in kept + kept[::-1])
    assert _run(native, 1, data, NO_BUDGET, NO_BUDGET) == _run(twin, 1, data, NO_BUDGET,
                                                               NO_BUDGET)
    for eng in (native, twin):  # and it grows back
        for k in keys[:BIG]:
            eng.set_flow(k, 1, [(3, 1 << 40)], 1 << 40)
    data = b"".join(_frame(k) for k in keys[:BIG:3] + kept)
    assert _run(native, 1, data, NO_BUDGET, NO_BUDGET) == _run(twin, 1, data, NO_BUDGET,
                                                               NO_BUDGET)
    assert _counts(native, keys) == _counts(twin, keys)
    assert native.hot_stats()[0] > BIG


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, BIG - 1), min_size=1, max_size=90), st.integers(0, 70),
       st.lists(st.tuples(st.integers(0, 90), st.integers(0, 70), st.integers(0, 6)),
                max_size=4),
       st.integers(0, 40), st.booleans())
def test_reads_of_one_size_and_then_others_forward_like_the_twin(
        picks: list[int], size: int, others: list, cut: int, ref: bool) -> None:
    """With a large table, while every frame of a read has one size, the look-ahead computes
    where the frame 16 ahead starts from the current frame's size instead of walking to it;
    from the first frame of another size on it walks. Reads of one size (runs of one flow
    and flows routed apart among them), with frames of other sizes, of absent keys, of
    control bands or with TTL 0 put in anywhere, and cut anywhere, are forwarded exactly as
    the twin forwards them, and every flow is counted alike."""
    native, twin = _both()
    keys = [_key(10_000 + i) for i in range(BIG)]
    for eng in (native, twin):
        for i, k in enumerate(keys):
            eng.set_flow(k, *ROUTINGS[0 if i % 11 else i % len(ROUTINGS)])
        eng.set_absent(_key(7))
    frames = [_frame(keys[p], size=size) for p in picks]
    for at, osize, kind in sorted(others, reverse=True):
        key = _key(7) if kind == 1 else keys[at % BIG]
        frames.insert(min(at, len(frames)), _frame(key, band=3 if kind == 2 else 40,
                                                   size=osize, ttl=0 if kind == 3 else 5))
    data = b"".join(frames)
    data = data[:len(data) - min(cut, len(data) - 1)]
    ref_min = 32 if ref else NO_BUDGET
    for in_link in (1, 2):
        assert _run(native, in_link, data, NO_BUDGET, NO_BUDGET, ref_min) == _run(
            twin, in_link, data, NO_BUDGET, NO_BUDGET, ref_min)
        # and each read from the middle of the buffer, where the look-ahead starts afresh
        mid = sum(len(f) for f in frames[:len(frames) // 2])
        if mid < len(data):
            assert _run_from(native, in_link, data, mid) == _run_from(twin, in_link, data, mid)
    assert sorted(native.all_flow_counts()) == sorted(twin.all_flow_counts())


def _run_from(eng, in_link: int, data: bytes, pos: int) -> tuple:  # type: ignore[no-untyped-def]
    return eng.forward(in_link, data, pos, NO_BUDGET, NO_BUDGET, 65536)
