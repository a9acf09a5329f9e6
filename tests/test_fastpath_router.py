"""The fast path forwards exactly as the core does, with the core's tables changing under it.

Two identical routers get the same random history (links coming up with random costs and
sizes, joins, mask changes, leaves, links closing, ticks, data in reads of several frames);
one hands every frame to ``Router.receive`` (the reference), the other forwards each read
through :class:`flowrouter.core.fastpath.FastPath` and gives the core only the frames the
engine stops at, as the runtime does. The bytes sent on every link, the counters (drop
reasons included), per-link frame counts, traffic epochs, sampled trace records and per-flow
frame and byte counters (the entry's plus the engine's copy's) must be identical, for the
compiled engine and for the Python twin. Senders that are not members are part of every
history: data for keys the router holds no entry for (toward the far location service, at
the core's own LSID, to an LSID with no route), LS routes that move or vanish under them,
and joins that make such a key a flow.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrouter.core import fastpath, fastpath_py
from flowrouter.core.fastpath import STOP_END, STOP_SLOW, FastPath
from flowrouter.core.quotas import host_of
from flowrouter.core.router import Router, RouterParams, Send
from flowrouter.core.tables import Modifiers
from flowrouter.core.traces import MemoryTrace
from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import HEADER_SIZE, pack_header
from tests.fastpath_support import native_module, why_not

CORE, FAR, NOWHERE = 0x10, 0x20, 0x30
LINK_KEY = LINK_LOCAL_FLOW.key
MAX_IN = 65536


def _key(i: int, lsid: int) -> bytes:
    return (0xC0FFEE).to_bytes(8, "big") + lsid.to_bytes(4, "big") + i.to_bytes(4, "big")


FLOWS = [_key(i, lsid) for lsid in (CORE, FAR) for i in (1, 2, 3)]
#: keys nobody joined at first: their senders are not members
STRANGERS = [_key(9, lsid) for lsid in (CORE, FAR, NOWHERE)]


class Harness:
    """A router, the bytes it sent per link, and (optionally) a fast path in front of it."""

    def __init__(self, engine: Any, tracing: bool) -> None:
        tracer = MemoryTrace("r", sample_rate=0.25, seed=7) if tracing else None
        # router links are opened without an address here: accept them as routers
        params = RouterParams("r", 1, core_lsids=frozenset({CORE}),
                              accept_routers=frozenset({("*", host_of(""))}))
        self.r = Router(params, 0.0, tracer) if tracer else Router(params, 0.0)
        self.fast = FastPath(self.r, engine) if engine is not None else None
        self.sent: dict[int, bytearray] = defaultdict(bytearray)
        self.now = 0.0

    def do(self, actions: list) -> None:
        for a in actions:
            if type(a) is Send:
                self.sent[a.link] += bytes(a.header) + bytes(a.payload)

    def frame(self, link: int, frame: bytes) -> None:
        if link in self.r.links:
            self.do(self.r.receive(link, frame[:HEADER_SIZE], frame[HEADER_SIZE:], self.now))

    def read(self, link: int, data: bytes) -> None:
        """One received buffer of whole frames, as the runtime hands it over."""
        if self.fast is None:
            pos = 0
            while pos < len(data):
                end = pos + HEADER_SIZE + int.from_bytes(data[pos + 16:pos + 20], "big")
                self.frame(link, data[pos:end])
                pos = end
            return
        pos = 0
        while pos < len(data) and link in self.r.links:
            pos, stop, outs = self.fast.forward(link, data, pos, MAX_IN)
            for lk, buf, _n in outs:
                self.sent[lk] += buf if type(buf) is bytes else b"".join(buf)
            if stop == STOP_END:
                return
            assert stop == STOP_SLOW  # whole frames only here
            end = pos + HEADER_SIZE + int.from_bytes(data[pos + 16:pos + 20], "big")
            self.frame(link, data[pos:end])
            pos = end

    def open(self, link: int, role: C.Role, mods: tuple[int, int, int], max_payload: int
             ) -> None:
        self.do(self.r.open_link(link, self.now, modifiers=Modifiers(*mods)))
        hello = C.Hello(100 + link, role, f"p{link}", max_payload, modifiers=mods).encode()
        self.frame(link, pack_header(LINK_KEY, len(hello), 0) + hello)
        if role is C.Role.ROUTER:  # announce the far location service behind this link
            body = C.LsRoutes(((FAR, 1),)).encode()
            self.frame(link, pack_header(LINK_KEY, len(body), 0) + body)

    def state(self) -> tuple:
        r = self.r
        return (dict(self.sent), +r.counters, {k: (v.rx, v.tx) for k, v in r.links.items()},
                {k: (e.upstream, dict(e.down), dict(e.traffic)) for k, e in r.flows.items()},
                list(getattr(r.tracer, "records", [])),
                {k: self.flow_counters(k) for k in r.flows})

    def flow_counters(self, key: bytes) -> tuple[int, int]:
        """(frames, bytes) of flow *key* as status reports them: the core's entry plus
        what the engine counted in its copy and has not handed over yet."""
        entry = self.r.flows[key]
        frames, nbytes = self.fast.flow_counts(key) if self.fast is not None else (0, 0)
        return entry.frames + frames, entry.bytes + nbytes


masks = st.sampled_from([0, 1, 1 << 40, 1 << 40 | 1 << 19, 1 | 1 << 40, 1 << 100 | 1 << 40,
                         (1 << 128) - 1,
                         1 << 127 | 1 << 64 | 1 << 63])
ops = st.one_of(
    st.tuples(st.just("open"), st.integers(1, 4), st.sampled_from(list(C.Role)),
              st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
              st.sampled_from([50, 1000, 65536])),
    st.tuples(st.just("join"), st.integers(1, 4), st.sampled_from(FLOWS + STRANGERS), masks),
    st.tuples(st.just("routes"), st.integers(1, 4), st.lists(st.tuples(
        st.sampled_from([FAR, NOWHERE]), st.sampled_from([0, 1, 3, 32])), max_size=2,
        unique_by=lambda t: t[0])),
    st.tuples(st.just("mask"), st.integers(1, 4), st.sampled_from(FLOWS), masks),
    st.tuples(st.just("leave"), st.integers(1, 4), st.sampled_from(FLOWS)),
    st.tuples(st.just("close"), st.integers(1, 4)),
    st.tuples(st.just("tick"), st.floats(0.1, 20.0)),
    st.tuples(st.just("data"), st.integers(1, 4), st.lists(st.tuples(
        st.sampled_from(FLOWS + STRANGERS),
        st.sampled_from([0, 16, 17, 18, 19, 32, 40, 63, 64, 100, 127]),
        st.sampled_from([0, 3, 100, 1500, 9000]), st.sampled_from([0, 1, 2, 32]),
        st.sampled_from([0, 0, 1, 2, 3]), st.integers(0, 3)), min_size=1, max_size=8)),
)


#: every history starts from a router with members, so most random steps change something
#: the mirror holds
SETUP = [("open", 1, C.Role.ENDPOINT, (0, 0, 0), 65536), ("open", 2, C.Role.ROUTER,
                                                            (1, 1, 1), 65536),
         ("open", 3, C.Role.ENDPOINT, (0, 2, 0), 1000),
         *[("join", lk, key, 1 | 1 << 40 | 1 << 100) for lk in (1, 3) for key in FLOWS],
         ("data", 1, [(key, 40, 3, 9, 0, 0) for key in FLOWS + STRANGERS]),
         ("data", 2, [(key, 40, 3, 9, 0, 0) for key in FLOWS + STRANGERS])]


def _apply(h: Harness, op: tuple) -> None:
    kind = op[0]
    if kind == "open":
        _, link, role, mods, mx = op
        if link not in h.r.links:
            h.open(link, role, mods, mx)
    elif kind in ("join", "mask", "leave"):
        link, key = op[1], op[2]
        msg = (C.Join(7, op[3]) if kind == "join" else C.Mask(op[3]) if kind == "mask"
               else C.Leave())
        body = msg.encode()
        h.frame(link, pack_header(key, len(body), 0) + body)
    elif kind == "routes":  # a neighbour's LS route vector replaces what it said before
        link = h.r.links.get(op[1])
        if link is not None and link.role is C.Role.ROUTER:
            body = C.LsRoutes(tuple(op[2])).encode()
            h.frame(op[1], pack_header(LINK_KEY, len(body), 0) + body)
    elif kind == "close":
        h.do(h.r.close_link(op[1], h.now))
    elif kind == "tick":
        h.now += op[1]
        h.do(h.r.tick(h.now))
    else:
        _, link, frames = op
        data = b"".join(key + struct.pack("!IBBBB", size, band, lt, lv, ttl) + b"d" * size
                        for key, band, size, ttl, lt, lv in frames)
        h.read(link, data)


def _engines() -> list[str]:
    return ["twin", "native"]


def _engine(kind: str) -> Any:
    """A fresh engine of *kind* (the compiled one skips the test where it cannot be had)."""
    if kind == "native":
        mod = native_module()
        if mod is None:
            pytest.skip(why_not())
        return mod.Engine()
    return fastpath_py.Engine()


@pytest.mark.parametrize("kind", _engines())
@settings(max_examples=120, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(history=st.lists(ops, min_size=1, max_size=30), tracing=st.booleans())
def test_fast_path_forwards_exactly_like_the_core(kind: str, history: list, tracing: bool
                                                  ) -> None:
    engine = _engine(kind)
    ref = Harness(None, tracing)
    fast = Harness(engine, tracing)
    for op in [*SETUP, *history]:
        _apply(ref, op)
        _apply(fast, op)
        assert fast.state() == ref.state(), op


def test_a_steady_flow_is_forwarded_without_the_core() -> None:
    """Once the mirror holds the flow, a read of data frames never reaches the core."""
    h = Harness(fastpath_py.Engine(), tracing=False)
    h.open(1, C.Role.ENDPOINT, (0, 0, 0), 65536)
    h.open(2, C.Role.ENDPOINT, (0, 0, 0), 65536)
    key = FLOWS[0]
    for link in (1, 2):
        body = C.Join(1, 1 | 1 << 40).encode()
        h.frame(link, pack_header(key, len(body), 0) + body)
    h.sent.clear()
    one = key + struct.pack("!IBBBB", 5, 40, 0, 0, 9) + b"hello"
    h.read(1, one * 3)  # installs the flow on the first miss
    slow = h.fast.stats["slow"]  # type: ignore[union-attr]
    h.read(1, one * 100)
    assert h.fast.stats["slow"] == slow  # type: ignore[union-attr]
    assert bytes(h.sent[2]) == (key + struct.pack("!IBBBB", 5, 40, 0, 0, 8) + b"hello") * 103
    assert h.r.counters["forwarded"] == 103 and h.r.links[2].tx == 103
    assert h.flow_counters(key) == (103, 103 * len(one))  # the copy's, not handed over yet
    assert h.r.flows[key].frames < 103
    # a leave changes the core's entry: the copy is forgotten, nothing more goes to link 2
    body = C.Leave().encode()
    h.frame(2, pack_header(key, len(body), 0) + body)
    h.read(1, one)
    assert len(h.sent[2]) == len(one) * 103 and h.r.counters["drop.no-receivers"] == 1
    # the leave made the fast path forget its copy, which handed its counts to the entry;
    # the last frame counts in the new copy
    assert (h.r.flows[key].frames, h.r.flows[key].bytes) == (103, 103 * len(one))
    assert h.flow_counters(key) == (104, 104 * len(one))


@pytest.mark.parametrize("kind", _engines())
def test_a_sender_that_is_not_a_member_is_forwarded_without_the_core(kind: str) -> None:
    """Frames of a key the router holds no entry for go toward the flow's location service
    in the engine, counted as the core counts them; once a join creates the entry, they
    follow the tree instead, and a moved LS route is followed at once."""
    engine = _engine(kind)
    h = Harness(engine, tracing=False)
    h.open(1, C.Role.ENDPOINT, (0, 0, 0), 65536)
    h.open(2, C.Role.ROUTER, (0, 0, 0), 65536)  # announces FAR at distance 1
    key = STRANGERS[1]
    one = key + struct.pack("!IBBBB", 5, 40, 0, 0, 9) + b"hello"
    h.sent.clear()
    h.read(1, one * 3)  # mirrors the absence, its route and links on the first miss
    slow = h.fast.stats["slow"]  # type: ignore[union-attr]
    h.read(1, one * 100)
    assert h.fast.stats["slow"] == slow  # type: ignore[union-attr]
    assert bytes(h.sent[2]) == (key + struct.pack("!IBBBB", 5, 40, 0, 0, 8) + b"hello") * 103
    assert h.r.counters["forward.toward-core"] == 103 and h.r.counters["forwarded"] == 103
    # another router now offers a shorter way: the next frames take it
    h.open(3, C.Role.ROUTER, (0, 0, 0), 65536)
    body = C.LsRoutes(((FAR, 0),)).encode()
    h.frame(3, pack_header(LINK_KEY, len(body), 0) + body)
    h.sent.clear()
    h.read(1, one)
    assert len(h.sent[3]) == len(one) and not h.sent[2]
    # a member joins on link 1's side (an application on link 4): the tree takes over
    h.open(4, C.Role.ENDPOINT, (0, 0, 0), 65536)
    body = C.Join(1, 1 | 1 << 40).encode()
    h.frame(4, pack_header(key, len(body), 0) + body)
    h.sent.clear()
    h.read(1, one)
    assert len(h.sent[4]) == len(one) and h.r.counters["forward.toward-core"] == 104


@pytest.mark.parametrize("kind", _engines())
def test_a_joined_flow_is_mirrored_before_its_first_frame(kind: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Entries the core changed are copied again at the next forward call, a bounded number
    per call: the first frame of a flow joined before its traffic finds its copy in place,
    and the engine's pass over a read is not cut at every new flow to copy one from Python."""
    monkeypatch.setattr(fastpath, "REFILL_PER_CALL", 2)
    h = Harness(_engine(kind), tracing=False)
    h.open(1, C.Role.ENDPOINT, (0, 0, 0), 65536)
    h.open(2, C.Role.ENDPOINT, (0, 0, 0), 65536)
    keys = FLOWS[:3]
    for key in keys:
        for link in (1, 2):
            body = C.Join(1, 1 << 40).encode()
            h.frame(link, pack_header(key, len(body), 0) + body)
    fast = h.fast
    assert fast is not None and fast.engine.sizes()[0] == 0
    fast.forward(1, b"", 0, MAX_IN)  # two of the three copied, before any frame
    assert fast.engine.sizes()[0] == 2 and fast.stats["installs"] == 2
    calls = fast.stats["calls"]
    data = b"".join(k + struct.pack("!IBBBB", 5, 40, 0, 0, 9) + b"hello" for k in keys)
    h.read(1, data)  # the third is copied before the engine starts: one pass, no miss
    assert fast.stats["calls"] == calls + 1 and fast.stats["installs"] == 3
    assert bytes(h.sent[2]).count(b"hello") == 3 and h.r.counters["forwarded"] == 3
    # a change forgets the copy at once and copies the entry again at the next call
    body = C.Leave().encode()
    h.frame(2, pack_header(keys[0], len(body), 0) + body)
    assert fast.engine.sizes()[0] == 2
    h.read(1, data)
    assert fast.stats["calls"] == calls + 2 and fast.engine.sizes()[0] == 3
    assert bytes(h.sent[2]).count(b"hello") == 5 and h.r.counters["drop.no-receivers"] == 1


def test_copying_changes_again_stays_cheap_after_a_huge_table_drained() -> None:
    """A subscriber of 10^5 flows leaves: 10^5 changed entries drain from the refill queue.
    Each change after that (a join of the next subscriber) must cost what it costs on a
    fresh router. When the queue was a set popped, every pop walked the drained table to
    its next key (0.4 ms): the next 10^5 joins took 2.5x as long, long enough for the hold
    time to expire the first of them before their refresh (bulk.py --flows, second row).
    Compared with a fresh router in the same process, with a margin of 10 for a cost
    that was 1,000 times as high."""
    import os
    import time

    def churn(h: Harness, rounds: int) -> float:
        """*rounds* changes, each copied again at the next call (a join, then a frame)."""
        fast = h.fast
        assert fast is not None
        keys = [os.urandom(16) for _ in range(rounds)]
        t = time.perf_counter()
        for key in keys:
            fast.flow_changed(key)
            fast.forward(1, b"", 0, MAX_IN)
        return time.perf_counter() - t

    fresh = Harness(fastpath_py.Engine(), tracing=False)
    drained = Harness(fastpath_py.Engine(), tracing=False)
    for h in (fresh, drained):
        h.open(1, C.Role.ENDPOINT, (0, 0, 0), 65536)
    fast = drained.fast
    assert fast is not None
    for _ in range(100_000):  # a link with 10^5 flows went down at once
        fast.flow_changed(os.urandom(16))
    for _ in range(100_000 // fastpath.REFILL_PER_CALL + 1):  # drained 512 a call
        fast.forward(1, b"", 0, MAX_IN)
    base = min(churn(fresh, 500) for _ in range(3))
    after = min(churn(drained, 500) for _ in range(3))
    assert after < 10 * base + 0.02, (after, base)
