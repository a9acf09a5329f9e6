"""A fan-out batch queued whole (OutputQueue.push_run): no work per frame, the same frames
served in each flow's order, counted as its frames for the longest-queue rule, and every
frame of a dropped run reported (the output queue of a receiver that fell behind)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flowrouter.core import fastpath_py
from flowrouter.core.linkqueue import OutputQueue
from flowrouter.wire.header import pack_header

from .fastpath_support import native_module

KEYS = [bytes([k]) * 16 for k in range(3)]


def _frames(key: bytes, sizes: list[int], band: int = 40) -> bytes:
    return b"".join(pack_header(key, n, band) + bytes([n % 251]) * n for n in sizes)


def _served(q: OutputQueue) -> dict[bytes, bytes]:
    """Each flow's bytes in the order the queue serves them."""
    out: dict[bytes, bytes] = {}
    while (fr := q.pop(10.0)) is not None:
        key = bytes(fr[0][:16])
        out[key] = out.get(key, b"") + bytes(fr[0]) + bytes(fr[1])
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2]),
                          st.lists(st.sampled_from([0, 16, 1000, 9000]), min_size=1,
                                   max_size=20)), min_size=1, max_size=8))
def test_a_run_is_served_as_its_frames_are(batches: list[tuple[int, list[int]]]) -> None:
    runs, frames = OutputQueue(1 << 40), OutputQueue(1 << 40)
    for k, sizes in batches:
        batch = _frames(KEYS[k], sizes)
        assert runs.push_run(batch, len(sizes), 0.0, 7) == []
        assert frames.push_frames(batch, 0.0, 7) == []
        assert (runs.bytes, len(runs)) == (frames.bytes, len(frames))
    assert _served(runs) == _served(frames)
    assert runs.bytes == 0 and len(runs) == 0 and not runs.flows and not runs.frames


def test_a_run_over_the_bound_is_queued_frame_by_frame_and_only_the_excess_dropped() -> None:
    """A run that fits waits as one entry; one that would take the queue past its bound goes
    in frame by frame, and the longest queue (in frames) loses only the excess, newest
    first: the queue stays at its bound, so a stuck receiver stays over its slow-consumer
    limit until the grace time closes it (dropping whole runs let its queue fall below
    half the limit at once, and it was never closed)."""
    q = OutputQueue(10_000)
    other = _frames(KEYS[1], [100] * 3)
    q.push_frames(other, 0.0, 2)
    flood = _frames(KEYS[0], [16] * 200)  # 8,000 bytes in one entry, 200 frames
    assert q.push_run(flood, 200, 0.0, 1) == []
    assert len(q.flows[KEYS[0]]) == 1  # one entry
    dropped = q.push_run(flood, 200, 0.0, 1)  # over the bound: the flooder pays
    room = (10_000 - len(other) - len(flood)) // 40
    assert dropped == [(KEYS[0], 40, 1)] * (200 - room)
    assert (q.dropped, q.dropped_bytes) == (200 - room, 40 * (200 - room))
    assert len(q) == 203 + room and q.bytes == len(other) + len(flood) + 40 * room
    assert q.bytes > 10_000 - 40


def test_both_engines_say_alike_which_batches_are_one_flows_data() -> None:
    native = native_module()
    engines = [fastpath_py.Engine()] + ([native.Engine()] if native else [])
    one = _frames(KEYS[0], [0, 16, 1000])
    cases = {one: True, _frames(KEYS[0], [16]): True, b"": False, one[:-1]: False,
             one + _frames(KEYS[1], [16]): False, _frames(KEYS[0], [16], band=20): False,
             one + one[:10]: False}
    for eng in engines:
        assert {case: eng.one_flow(case) for case in cases} == cases
