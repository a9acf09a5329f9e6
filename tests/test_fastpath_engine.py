"""The compiled forwarding engine and its pure-Python twin make the same decisions.

Random link tables, flow tables (with keys mirrored as absent and LSID routes: senders that
are not members) and frame streams (hypothesis) go to both engines; every call must return
the same stop position and reason, output bytes per link and counters. The
router-level tests (test_fastpath_router.py) hold the engines to the core.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrouter.core import fastpath_py
from flowrouter.core.fastpath import engine_choice, new_engine
from flowrouter.core.fastpath_py import STOP_END, STOP_MISS_FLOW, STOP_PARTIAL, STOP_SLOW
from tests.fastpath_support import compiler_present, native_module, why_not

NO_BUDGET = 1 << 62


def native_engine():
    mod = native_module()
    if mod is None:
        pytest.skip(why_not())
    return mod.Engine()


def test_native_engine_loads_when_a_compiler_is_present() -> None:
    if not compiler_present():
        pytest.skip("no C compiler: the pure-Python path is the only one here")
    mod = native_module()
    assert mod is not None, why_not()
    assert mod.Engine().native is True
    cls, why = engine_choice("")
    assert cls is mod.Engine and "compiled" in why


def test_env_var_forces_the_python_path() -> None:
    assert engine_choice("0")[0] is None
    assert "FLOWNET_NATIVE=0" in engine_choice("0")[1]
    assert engine_choice("twin")[0] is fastpath_py.Engine
    assert new_engine("twin").native is False


def _key(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"\0\0\0\x10" + i.to_bytes(4, "big")


masks = st.integers(min_value=0, max_value=(1 << 128) - 1) | st.sampled_from(
    [0, 1 << 40, (1 << 128) - 1, 1 << 127, 1 << 63 | 1 << 64])


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list, list, list[bytes], list[int], list, list]:
    link_ids = draw(st.lists(st.integers(1, 40), min_size=1, max_size=6, unique=True))
    links = [(lk, draw(st.booleans()), draw(st.sampled_from([64, 1000, 65536])),
              (0, *draw(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)))))
             for lk in link_ids]
    flows = []
    for i in range(draw(st.integers(0, 4))):
        down = draw(st.lists(st.tuples(st.sampled_from(link_ids + [99]), masks), max_size=4,
                             unique_by=lambda t: t[0]))
        up = draw(st.sampled_from([-1, *link_ids, 77]))
        agg = 0
        for _lk, m in down:
            agg |= m
        if draw(st.booleans()):
            agg = draw(masks)  # the core's aggregate is what counts, even when odd
        flows.append((_key(i), up, down, agg))
    # keys the core holds no entry for, and where their LSID's frames go
    absent = draw(st.lists(st.sampled_from([_key(4), _key(5), _key(0)]), max_size=3))
    routes = [(0x10, r) for r in draw(st.lists(st.sampled_from(
        [fastpath_py.ROUTE_NO_MEMBERS, fastpath_py.ROUTE_NONE, *link_ids, 99]), max_size=1))]
    frames = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.integers(0, 9))
        key = _key(draw(st.integers(0, 5)))
        if kind == 0:
            key = key[:8] + b"\0\0\0\0" + key[12:]
        band = draw(st.sampled_from([0, 3, 16, 17, 19, 21, 32, 40, 63, 64, 100, 127, 128]))
        size = draw(st.sampled_from([0, 1, 16, 100, 1000, 70000]))
        ttl = draw(st.sampled_from([0, 1, 2, 32]))
        lt = draw(st.sampled_from([0, 0, 1, 2, 3, 4]))
        lv = draw(st.integers(0, 4))
        frames.append(key + struct.pack("!IBBBB", size, band, lt, lv, ttl) + b"p" * size)
    cut = draw(st.integers(0, 30))
    return (links, flows, frames, [cut, draw(st.integers(1, 5)), draw(st.integers(1, 5))],
            absent, routes)


def _load(engine, links, flows, absent=(), routes=()) -> None:
    for lk, router, mx, mods in links:
        engine.set_link(lk, router, mx, mods)
    for key, up, down, agg in flows:
        engine.set_flow(key, up, down, agg)
    for key in absent:
        engine.set_absent(key)
    for lsid, route in routes:
        engine.set_route(lsid, route)


def _run(engine, in_link: int, data: bytes, fb: int, db: int, ref_min: int = NO_BUDGET,
         share_min: int = NO_BUDGET, in_place: bool = False) -> list:
    """Forward everything, skipping each frame the engine leaves to the core."""
    pos, calls = 0, []
    while True:
        res = engine.forward(in_link, data, pos, fb, db, 65536, ref_min, share_min, in_place)
        calls.append(res)
        pos, stop = res[0], res[1]
        if stop in (STOP_END, STOP_PARTIAL):
            return calls
        if len(data) - pos < 24:
            return calls
        pos += 24 + int.from_bytes(data[pos + 16:pos + 20], "big")
        if pos > len(data):
            return calls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.booleans(), st.sampled_from([NO_BUDGET, 0, 1, 16, 100, 1000, 65536]),
       st.sampled_from([NO_BUDGET, 0, 60, 1024]))
def test_compiled_engine_matches_the_python_twin(sc, budgets: bool, ref_min: int,
                                                 share_min: int) -> None:
    links, flows, frames, (cut, fb, db), absent, routes = sc
    native = native_engine()
    twin, plain_twin = fastpath_py.Engine(), fastpath_py.Engine()
    _load(native, links, flows, absent, routes)
    _load(twin, links, flows, absent, routes)
    _load(plain_twin, links, flows, absent, routes)
    data = b"".join(frames)
    if cut and data:
        data = data[:-min(cut, len(data))]  # an incomplete last frame
    for in_link in {lk for lk, *_ in links} | {5}:
        args = (fb, db) if budgets else (NO_BUDGET, NO_BUDGET)
        got = _run(native, in_link, data, *args, ref_min, share_min)
        assert got == _run(twin, in_link, data, *args, ref_min, share_min)
        if ref_min != NO_BUDGET or share_min != NO_BUDGET:
            # the same bytes leave as without references or shared runs
            plain = _run(plain_twin, in_link, data, *args)
            assert [[(lk, _joined(out), k) for lk, out, k in c[2]] for c in got] == \
                [c[2] for c in plain]
            assert [c[:2] + c[3:] for c in got] == [c[:2] + c[3:] for c in plain]
    assert native.sizes() == twin.sizes()
    _same_flow_counts(native, twin, [key for key, *_ in flows] + [_key(4), _key(5)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.booleans(), st.sampled_from([NO_BUDGET, 16, 1000]))
def test_in_place_forwarding_matches_the_twin_and_the_copies(sc, budgets: bool,
                                                             ref_min: int) -> None:
    """Forwarding in place (a writable receive buffer): the compiled engine rewrites the
    same headers in the buffer as the twin and gives the same outputs; the bytes that leave
    each link, the counters and where each call stops are those of copying; frames the
    engine did not forward are left as they were."""
    links, flows, frames, (cut, fb, db), absent, routes = sc
    native, twin, plain = native_engine(), fastpath_py.Engine(), fastpath_py.Engine()
    for eng in (native, twin, plain):
        _load(eng, links, flows, absent, routes)
    data = b"".join(frames)
    if cut and data:
        data = data[:-min(cut, len(data))]
    args = (fb, db) if budgets else (NO_BUDGET, NO_BUDGET)
    for in_link in {lk for lk, *_ in links} | {5}:
        nbuf, tbuf = bytearray(data), bytearray(data)
        got = _run(native, in_link, nbuf, *args, ref_min, NO_BUDGET, True)
        assert got == _run(twin, in_link, tbuf, *args, ref_min, NO_BUDGET, True)
        assert nbuf == tbuf
        want = _run(plain, in_link, data, *args, ref_min)
        assert [[(lk, _joined(out), k) for lk, out, k in c[2]] for c in got] == \
            [[(lk, _joined(out), k) for lk, out, k in c[2]] for c in want]
        assert [c[:2] + c[3:] for c in got] == [c[:2] + c[3:] for c in want]
        if not any(c[2] for c in got):
            assert nbuf == data  # nothing forwarded: nothing rewritten


def test_a_unicast_stream_leaves_as_a_view_of_the_buffer_it_came_in() -> None:
    """In place, frames of one flow to one link leave as one view of the receive buffer
    (no copy), TTL and locality rewritten in it; a fan-out's frames, a buffer that may not
    be written, or in_place off, are copied as before, and the input is untouched."""
    fan = _key(2)
    for eng in (fastpath_py.Engine(), native_engine()):
        eng.set_link(1, False, 65536, (0, 0, 0, 0))
        eng.set_link(2, True, 65536, (0, 1, 0, 0))
        eng.set_link(3, False, 65536, (0, 0, 0, 0))
        eng.set_flow(_key(1), -1, [(2, 1 << 40)], 1 << 40)
        eng.set_flow(fan, -1, [(2, 1 << 40), (3, 1 << 40)], 1 << 40)
        one = b"".join(_key(1) + struct.pack("!IBBBB", 100, 40, 1, 3, 9) + b"x" * 100
                       for _ in range(5))
        buf = bytearray(one)
        pos, stop, outs, _counts = eng.forward(1, buf, 0, NO_BUDGET, NO_BUDGET, 65536,
                                               NO_BUDGET, NO_BUDGET, True)
        assert (pos, stop) == (len(one), STOP_END) and len(outs) == 1
        lk, out, n = outs[0]
        assert (lk, n) == (2, 5) and type(out) is memoryview and out.obj is buf
        assert bytes(out) == bytes(buf) and bytes(buf[21:24]) == bytes((1, 2, 8))
        for data, in_place in ((one, True), (bytearray(one), False)):
            outs = eng.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536, NO_BUDGET,
                               NO_BUDGET, in_place)[2]
            assert type(outs[0][1]) is bytes and bytes(outs[0][1]) == bytes(buf)
            assert data == one
        both = bytearray(one + _key(2) + struct.pack("!IBBBB", 4, 40, 0, 0, 9) + b"fan!")
        outs = eng.forward(1, both, 0, NO_BUDGET, NO_BUDGET, 65536, NO_BUDGET, NO_BUDGET,
                           True)[2]
        assert all(type(out) is bytes for _lk, out, _n in outs) and both[:len(one)] == one


@st.composite
def fan_out(draw: st.DrawFn) -> tuple[list, list, list[bytes], list, list]:
    """Flows with many links below and frames mostly of them (shared runs: runs broken by
    other flows' frames, by TTL and size drops that change who gets a frame, by locality
    values that differ per link)."""
    n = draw(st.integers(2, 9))
    links = [(lk, draw(st.booleans()), draw(st.sampled_from([600, 65536])),
              (0, draw(st.sampled_from([0, 0, 1])), 0, 0)) for lk in range(1, n + 1)]
    everything = (1 << 128) - 1
    flows = [(_key(0), draw(st.sampled_from([-1, 1, 2])),
              [(lk, everything) for lk in draw(st.permutations(range(1, n + 1)))], everything),
             (_key(1), -1, [(lk, 1 << 40) for lk in draw(st.lists(
                 st.integers(1, n), min_size=1, max_size=3, unique=True))], 1 << 40)]
    frames = []
    for _ in range(draw(st.integers(1, 30))):
        key = _key(draw(st.sampled_from([0, 0, 0, 0, 1])))
        size = draw(st.sampled_from([0, 16, 300, 700, 1000, 9000]))
        ttl = draw(st.sampled_from([1, 9, 9, 9]))
        lt, lv = draw(st.sampled_from([(0, 0), (0, 0), (0, 5), (1, 3), (1, 0)]))
        frames.append(key + struct.pack("!IBBBB", size, 40, lt, lv, ttl) + b"q" * size)
    in_links = draw(st.lists(st.integers(1, n), min_size=1, max_size=2, unique=True))
    budgets = draw(st.sampled_from([(NO_BUDGET, NO_BUDGET), (5, 7), (1, 2)]))
    return links, flows, frames, in_links, budgets


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fan_out(), st.sampled_from([NO_BUDGET, 500, 8192]), st.sampled_from([0, 700, 2000]))
def test_shared_runs_match_the_python_twin(sc, ref_min: int, share_min: int) -> None:
    """Fan-out through shared runs: the compiled engine gives what the twin gives (the same
    pieces), and the same bytes leave each link as with no sharing at all."""
    links, flows, frames, in_links, (fb, db) = sc
    native, twin, plain = native_engine(), fastpath_py.Engine(), fastpath_py.Engine()
    for eng in (native, twin, plain):
        _load(eng, links, flows)
    data = b"".join(frames)
    for in_link in in_links:
        got = _run(native, in_link, data, fb, db, ref_min, share_min)
        assert got == _run(twin, in_link, data, fb, db, ref_min, share_min)
        want = _run(plain, in_link, data, fb, db)
        assert [[(lk, _joined(out), k) for lk, out, k in c[2]] for c in got] == \
            [c[2] for c in want]
        assert [c[:2] + c[3:] for c in got] == [c[:2] + c[3:] for c in want]
    _same_flow_counts(native, twin, [_key(0), _key(1)])


def _same_flow_counts(native, twin, keys: list[bytes]) -> None:  # type: ignore[no-untyped-def]
    """Per-flow counters (issue 28): the same frames and bytes per entry, kept as entries
    leave the dense array (the last one moves into the hole) or absent keys are compacted
    away, and handed back once on forgetting."""
    assert sorted(native.all_flow_counts()) == sorted(twin.all_flow_counts())
    assert [native.flow_counts(k) for k in keys] == [twin.flow_counts(k) for k in keys]
    for key in keys[:1]:
        assert native.forget_flow(key) == twin.forget_flow(key)
        assert native.flow_counts(key) is None and native.forget_flow(key) is None
    native.forget_absent()
    twin.forget_absent()
    assert [native.flow_counts(k) for k in keys] == [twin.flow_counts(k) for k in keys]
    assert [native.forget_flow(k) for k in keys] == [twin.forget_flow(k) for k in keys]
    assert native.all_flow_counts() == twin.all_flow_counts() == []


def test_flow_counters_count_what_the_core_counts_in_its_entry() -> None:
    """Forwarded frames and frames the tree's masks drop count, headers included; frames of
    an absent key, and TTL-0 frames (dropped before the flow is looked up), do not."""
    for eng in (fastpath_py.Engine(), native_engine()):
        key, other = _key(1), _key(4)
        eng.set_link(1, False, 65536, (0, 0, 0, 0))
        eng.set_link(2, True, 65536, (0, 0, 0, 0))
        eng.set_flow(key, 2, [(1, 1 << 40)], 1 << 40)
        eng.set_absent(other)
        eng.set_route(0x10, 2)
        data = (key + struct.pack("!IBBBB", 3, 40, 0, 0, 9) + b"abc"  # forwarded up
                + key + struct.pack("!IBBBB", 5, 40, 0, 0, 0) + b"abcde"  # TTL 0
                + other + struct.pack("!IBBBB", 1, 40, 0, 0, 9) + b"a")  # absent: toward
        pos, stop, _outs, counts = eng.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536)
        assert (pos, stop, counts[8]) == (len(data), STOP_END, 3)
        # from upstream on band 41, which nobody below wants: dropped by the masks
        data = key + struct.pack("!IBBBB", 2, 41, 0, 0, 9) + b"de"
        assert eng.forward(2, data, 0, NO_BUDGET, NO_BUDGET, 65536)[3][2] == 1
        assert eng.flow_counts(key) == (2, 27 + 26)
        assert eng.flow_counts(other) is None and eng.flow_counts(_key(9)) is None
        assert eng.all_flow_counts() == [(key, 2, 53)]
        eng.set_flow(key, 2, [(1, 1 << 41)], 1 << 41)  # changed in place: counts stay
        assert eng.forget_flow(key) == (2, 53) and eng.forget_flow(other) is None


def _joined(out) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(out) if type(out) is list else bytes(out)


def test_large_payloads_leave_as_views_of_the_input() -> None:
    """Above ref_min a payload is not copied: the output holds the rewritten header (per
    TTL and locality, as for copies) and a view of the received bytes."""
    for eng in (fastpath_py.Engine(), native_engine()):
        key = _key(1)
        eng.set_link(1, False, 65536, (0, 0, 0, 0))
        eng.set_link(2, True, 65536, (0, 0, 2, 0))
        eng.set_link(3, False, 65536, (0, 0, 0, 0))
        eng.set_flow(key, 2, [(1, 1 << 40), (3, 1 << 40)], 1 << 40)
        big = bytes(range(256)) * 40
        data = bytearray(key + struct.pack("!IBBBB", len(big), 40, 2, 3, 9) + big
                         + key + struct.pack("!IBBBB", 2, 40, 0, 0, 9) + b"de")
        pos, stop, outs, counts = eng.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536,
                                                  1000)
        assert (pos, stop) == (len(data), STOP_END) and counts[0] == 4
        (l2, p2, n2), (l3, p3, n3) = sorted(outs, key=lambda o: o[0])
        assert (l2, n2, l3, n3) == (2, 2, 3, 2)
        assert [bytes(p) for p in p2] == [
            key + struct.pack("!IBBBB", len(big), 40, 2, 1, 8), big,
            key + struct.pack("!IBBBB", 2, 40, 0, 0, 8) + b"de"]
        assert [bytes(p) for p in p3] == [
            key + struct.pack("!IBBBB", len(big), 40, 2, 3, 8), big,
            key + struct.pack("!IBBBB", 2, 40, 0, 0, 8) + b"de"]
        data[24:28] = b"XXXX"  # a view, not a copy
        assert bytes(p2[1][:4]) == bytes(p3[1][:4]) == b"XXXX"
        del p2, p3, outs


def test_fan_out_shares_one_buffer_among_its_links() -> None:
    """Frames that several links get alike are built once: each of those links' output is
    the same object (the copy per receiver was most of a fan-out router's work); a link
    that also gets frames of its own has them around the shared run, in arrival order."""
    for eng in (fastpath_py.Engine(), native_engine()):
        key, solo = _key(1), _key(2)
        for lk in (1, 2, 3, 4):
            eng.set_link(lk, False, 65536, (0, 0, 0, 0))
        eng.set_flow(key, -1, [(2, 1 << 40), (3, 1 << 40), (4, 1 << 40)], 1 << 40)
        eng.set_flow(solo, -1, [(2, 1 << 40)], 1 << 40)

        def frame(k: bytes, size: int, ttl: int = 9) -> bytes:
            return k + struct.pack("!IBBBB", size, 40, 0, 0, ttl) + bytes([size % 251]) * size

        def out(k: bytes, size: int, ttl: int = 8) -> bytes:
            return frame(k, size, ttl)

        data = frame(solo, 5) + b"".join(frame(key, 400) for _ in range(3)) + frame(solo, 6)
        pos, stop, outs, counts = eng.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536,
                                              NO_BUDGET, 1024)
        assert (pos, stop, counts[0]) == (len(data), STOP_END, 11)
        by = {lk: (o, k) for lk, o, k in outs}
        run = out(key, 400) * 3
        assert by[3][0] == by[4][0] == run and by[3][0] is by[4][0]  # one object, shared
        assert (by[3][1], by[4][1], by[2][1]) == (3, 3, 5)
        assert type(by[2][0]) is list and by[2][0][1] is by[3][0]
        assert [bytes(p) for p in by[2][0]] == [out(solo, 5), run, out(solo, 6)]
        # below share_min (and by default) every link gets its own copy
        for share_min in (1273, NO_BUDGET):
            outs = eng.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536, NO_BUDGET,
                               share_min)[2]
            assert [(lk, o) for lk, o, _k in outs] == [
                (2, out(solo, 5) + run + out(solo, 6)), (3, run), (4, run)]
        # with payloads passed by reference, the run is a list of pieces each link shares
        data = bytearray(b"".join(frame(key, 700) for _ in range(2)))
        outs = eng.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536, 500, 1024)[2]
        assert [lk for lk, _o, _k in outs] == [2, 3, 4]
        hdr = out(key, 700)[:24]
        for _lk, o, k in outs:
            assert k == 2 and [bytes(p) for p in o] == [hdr, out(key, 700)[24:]] * 2
        data[24:28] = b"XXXX"  # views of the input
        assert bytes(outs[0][1][1][:4]) == bytes(outs[2][1][1][:4]) == b"XXXX"
        del outs


def test_forwarding_rewrites_ttl_and_locality_per_link() -> None:
    for eng in (fastpath_py.Engine(), native_engine()):
        key = _key(1)
        eng.set_link(1, False, 65536, (0, 0, 0, 0))
        eng.set_link(2, True, 65536, (0, 0, 2, 0))  # a router, delay costs 2
        eng.set_link(3, False, 65536, (0, 0, 0, 0))
        eng.set_flow(key, 2, [(1, 1 << 40), (3, 1 << 41)], 1 << 40 | 1 << 41)
        data = (key + struct.pack("!IBBBB", 3, 40, 2, 3, 9) + b"abc"
                + key + struct.pack("!IBBBB", 2, 41, 0, 7, 1) + b"de")
        pos, stop, outs, counts = eng.forward(1, data, 0, NO_BUDGET, NO_BUDGET, 65536)
        assert (pos, stop) == (len(data), STOP_END)
        # frame 1 goes upstream with TTL 8 and delay budget 3 - 2 = 1; frame 2 (TTL 1)
        # may not go to a router with TTL 0, but link 3 (an application) wants band 41
        assert outs == [(2, key + struct.pack("!IBBBB", 3, 40, 2, 1, 8) + b"abc", 1),
                        (3, key + struct.pack("!IBBBB", 2, 41, 0, 0, 0) + b"de", 1)]
        assert counts[0] == 2 and counts[1] == 1  # forwarded, drop.ttl
        # from upstream: band 41 goes to link 3 only, the locality value is cleared
        pos, stop, outs, counts = eng.forward(2, data[27:], 0, NO_BUDGET, NO_BUDGET, 65536)
        assert outs == [(3, key + struct.pack("!IBBBB", 2, 41, 0, 0, 0) + b"de", 1)]


def test_stops_before_what_only_the_core_may_decide() -> None:
    for eng in (fastpath_py.Engine(), native_engine()):
        key = _key(1)
        eng.set_link(1, False, 65536, (0, 0, 0, 0))
        ok = key + struct.pack("!IBBBB", 1, 40, 0, 0, 9) + b"a"
        control = key + struct.pack("!IBBBB", 1, 0, 0, 0, 9) + b"a"
        assert eng.forward(1, ok, 0, NO_BUDGET, NO_BUDGET, 65536)[:2] == (0, STOP_MISS_FLOW)
        eng.set_flow(key, -1, [(1, 1 << 40)], 1 << 40)
        res = eng.forward(1, ok + control + ok, 0, NO_BUDGET, NO_BUDGET, 65536)
        assert res[:2] == (len(ok), STOP_SLOW)
        assert res[3][3] == 1  # no receivers: link 1 is the only member and the sender
        # an oversized header is the core's to refuse; so is a sampled decision
        assert eng.forward(1, ok, 0, NO_BUDGET, NO_BUDGET, 0)[:2] == (0, STOP_SLOW)
        assert eng.forward(1, ok, 0, NO_BUDGET, 1, 65536)[:2] == (0, STOP_SLOW)
        assert eng.forward(1, ok[:10], 0, NO_BUDGET, NO_BUDGET, 65536)[:2] == (0,
                                                                              STOP_PARTIAL)


def test_mirror_refuses_bad_entries_alike() -> None:
    for eng in (fastpath_py.Engine(), native_engine()):
        with pytest.raises(ValueError):
            eng.set_flow(b"short", -1, [], 0)
        with pytest.raises(ValueError):
            eng.set_flow(_key(1), -1, [(1, 1 << 128)], 0)
        with pytest.raises(ValueError):
            eng.set_link(1, False, 100, (0, 0, 0))
        eng.set_flow(_key(1), -1, [(1, 1)], 1)
        eng.set_link(1, False, 100, (0, 0, 0, 0))
        assert eng.sizes() == (1, 1)
        eng.forget_flow(_key(1))
        eng.forget_link(1)
        assert eng.sizes() == (0, 0) and not eng.has_flow(_key(1)) and not eng.has_link(1)


#: flows beyond what the engine scouts ahead for (SCOUT_MIN_FLOWS in _fastpath_tables.h)
BIG_TABLE = 4200


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.lists(st.integers(0, BIG_TABLE - 1), max_size=60),
       st.lists(st.integers(0, 60), max_size=12), st.sampled_from([NO_BUDGET, 0, 1000]))
def test_a_large_table_forwards_like_the_twin(sc, picks: list[int], mix: list[int],
                                              ref_min: int) -> None:
    """With a table large enough for the compiled engine's look-ahead over a read (the
    lookups of the frames ahead prefetched), reads mixing frames of many flows, runs of
    one flow, frames the core must take, absent keys and an incomplete last frame are
    forwarded exactly as the twin forwards them."""
    links, flows, frames, (cut, fb, db), absent, routes = sc
    native, twin = native_engine(), fastpath_py.Engine()
    ids = [lk for lk, *_ in links]
    # one down link each (many flows to one subscriber are decided once, when routed alike:
    # the same up link, the same link, the same band bits), with ups and band 40 varied so
    # that neighbours are routed differently too
    big = [(_key(1000 + i), -1 if i % 5 else ids[(i // 5) % len(ids)],
            [(lk, (1 << 40 if i % 3 else 0) | 1 << (i % 128))],
            (1 << 40 if i % 7 else 0) | 1 << (i % 128))
           for i, lk in zip(range(BIG_TABLE), ids * BIG_TABLE)]
    for eng in (native, twin):
        _load(eng, links, big + flows, absent, routes)
    ours = [_key(1000 + i) + struct.pack("!IBBBB", i % 50, 40, 0, 0, 3) + b"q" * (i % 50)
            for i in picks]
    for at in sorted(mix, reverse=True):  # the scenario's frames among ours
        ours[at:at] = frames[:1]
        frames = frames[1:]
    data = b"".join(ours + frames)
    if cut and data:
        data = data[:-min(cut, len(data))]
    for in_link in {lk for lk, *_ in links} | {5}:
        got = _run(native, in_link, data, fb, db, ref_min)
        assert got == _run(twin, in_link, data, fb, db, ref_min)
    assert native.sizes() == twin.sizes()
    _same_flow_counts(native, twin, [key for key, *_ in flows]
                      + [_key(1000 + i) for i in sorted(set(picks))])


def test_many_flows_survive_growth_and_removal() -> None:
    native = native_engine()
    twin = fastpath_py.Engine()
    for eng in (native, twin):
        eng.set_link(1, False, 65536, (0, 0, 0, 0))
        eng.set_link(2, False, 65536, (0, 0, 0, 0))
        for i in range(5000):
            eng.set_flow(_key(i), 2, [(1, 1 << 40)], 1 << 40)
        for i in range(0, 5000, 2):
            eng.forget_flow(_key(i))
        for i in range(0, 5000, 4):
            eng.set_flow(_key(i), 2, [(1, 1 << 40)], 1 << 40)
    data = b"".join(_key(i) + struct.pack("!IBBBB", 1, 40, 0, 0, 5) + b"z"
                    for i in range(0, 5000, 3))
    assert _run(native, 2, data, NO_BUDGET, NO_BUDGET) == _run(twin, 2, data, NO_BUDGET,
                                                                  NO_BUDGET)
    assert native.sizes() == twin.sizes() == (3750, 2)


def test_absent_flows_go_toward_their_location_service() -> None:
    """A key the core holds no entry for goes on its LSID's route, TTL and locality charged
    as for any copy and counted as forward.toward-core; back out of the route's own link
    (NOT_ON_TREE), or without a route mirrored, it is the core's; a drop route counts why."""
    from flowrouter.core.fastpath_py import COUNT_AT, STOP_MISS_ROUTE

    for eng in (fastpath_py.Engine(), native_engine()):
        key = _key(7)
        eng.set_link(1, False, 65536, (0, 0, 0, 0))
        eng.set_link(2, True, 65536, (0, 0, 2, 0))  # a router, delay costs 2
        eng.set_absent(key)
        one = key + struct.pack("!IBBBB", 3, 40, 2, 3, 9) + b"abc"
        assert eng.forward(1, one, 0, NO_BUDGET, NO_BUDGET, 65536)[:2] == (0, STOP_MISS_ROUTE)
        eng.set_route(0x10, 2)
        assert eng.has_route(0x10) and eng.has_flow(key)
        pos, stop, outs, counts = eng.forward(1, one * 2, 0, NO_BUDGET, NO_BUDGET, 65536)
        assert (pos, stop) == (2 * len(one), STOP_END)
        assert outs == [(2, (key + struct.pack("!IBBBB", 3, 40, 2, 1, 8) + b"abc") * 2, 2)]
        assert counts[COUNT_AT["forwarded"]] == 2 and counts[COUNT_AT["forward.toward-core"]] == 2
        # TTL 1 may not go on to a router: dropped, still counted toward the core
        low = key + struct.pack("!IBBBB", 3, 40, 0, 0, 1) + b"abc"
        counts = eng.forward(1, low, 0, NO_BUDGET, NO_BUDGET, 65536)[3]
        assert counts[COUNT_AT["drop.ttl"]] == 1 and counts[COUNT_AT["forward.toward-core"]] == 1
        assert eng.forward(2, one, 0, NO_BUDGET, NO_BUDGET, 65536)[:2] == (0, STOP_SLOW)
        for route, name in ((fastpath_py.ROUTE_NO_MEMBERS, "drop.no-members"),
                            (fastpath_py.ROUTE_NONE, "drop.no-route")):
            eng.set_route(0x10, route)
            pos, stop, outs, counts = eng.forward(1, one, 0, NO_BUDGET, NO_BUDGET, 65536)
            assert (pos, outs, counts[COUNT_AT[name]]) == (len(one), [], 1)
            assert eng.forward(1, one, 0, NO_BUDGET, 1, 65536)[:2] == (0, STOP_SLOW)  # sampled
        eng.forget_routes()
        assert not eng.has_route(0x10)
        eng.forget_absent()
        assert not eng.has_flow(key) and eng.sizes() == (0, 2)
        eng.set_absent(key)
        eng.set_flow(key, -1, [(1, 1 << 40)], 1 << 40)  # an entry replaces the absence
        eng.set_route(0x10, 2)
        assert eng.forward(2, one, 0, NO_BUDGET, NO_BUDGET, 65536)[2][0][0] == 1
        eng.forget_absent()
        assert eng.has_flow(key)
        with pytest.raises(ValueError):
            eng.set_route(1 << 32, 1)
        with pytest.raises(ValueError):
            eng.set_absent(b"short")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["flow", "absent", "forget", "forget_absent"]),
                          st.integers(0, 40), st.integers(0, 3)), max_size=120))
def test_the_mirror_holds_the_same_flows_through_any_changes(ops: list) -> None:
    """Entries come and go in any order (the compiled mirror moves its last entry into each
    hole, and keeps one downstream link inline): both engines hold the same flows after,
    and forward every key the same way."""
    native, twin = native_engine(), fastpath_py.Engine()
    for eng in (native, twin):
        for lk in (1, 2, 3, 4):
            eng.set_link(lk, False, 65536, (0, 0, 0, 0))
        eng.set_route(0x10, 4)
        for kind, i, nd in ops:
            if kind == "flow":
                eng.set_flow(_key(i), 1, [(lk, 1 << 40 | lk) for lk in (2, 3, 4)[:nd]],
                             1 << 40)
            elif kind == "absent":
                eng.set_absent(_key(i))
            elif kind == "forget":
                eng.forget_flow(_key(i))
            else:
                eng.forget_absent()
    assert native.sizes() == twin.sizes()
    assert [native.has_flow(_key(i)) for i in range(41)] == [twin.has_flow(_key(i))
                                                            for i in range(41)]
    data = b"".join(_key(i) + struct.pack("!IBBBB", 1, 40, 0, 0, 5) + b"z" for i in range(41))
    for in_link in (1, 2):
        assert _run(native, in_link, data, NO_BUDGET, NO_BUDGET) == _run(
            twin, in_link, data, NO_BUDGET, NO_BUDGET)


def test_link_ids_beyond_what_a_flow_holds_are_refused_alike() -> None:
    for eng in (fastpath_py.Engine(), native_engine()):
        for up, down in ((1 << 31, []), (-2, []), (1, [(1 << 31, 1)])):
            with pytest.raises(ValueError):
                eng.set_flow(_key(1), up, down, 1)
        assert not eng.has_flow(_key(1))
