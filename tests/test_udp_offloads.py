"""UDP segmentation offload and receive coalescing (flowrouter.net.udpio): with GSO a run of
equal datagrams leaves in one send and still arrives as the same datagrams; a GRO receiver
takes a coalesced receive apart again; both twins group and split by the same rule; a GSO
send the kernel refuses turns GSO off for the socket (counted) and loses nothing."""

from __future__ import annotations

import socket
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrouter.net import udpio
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import pack_header

from .udpsock import NATIVE, drain, udp_sockets

needs_native = pytest.mark.skipif(not NATIVE, reason="flowrouter.net._udpio not built")
FLOW = FlowID(0xB4, 0x10, 3)
TWINS = [udpio.PyDatagramIO, *([udpio.NativeDatagramIO] if NATIVE else [])]
SO_NO_CHECK = getattr(socket, "SO_NO_CHECK", 11)


def _frame(size: int, tag: int = 0) -> bytes:
    return pack_header(FLOW.key, size, 40) + bytes([tag % 256]) * size


def _offloads_here() -> bool:
    with udp_sockets(1) as (s,):
        return udpio.enable_offloads(s, True) == (True, True)


needs_offloads = pytest.mark.skipif(not _offloads_here(), reason="no UDP GSO/GRO here")


@settings(max_examples=200, deadline=None)
@given(grams=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 70000),
                                st.integers(1, 900), st.sampled_from([0, 1472, 65507])),
                      max_size=200))
def test_gso_runs_keep_the_kernel_rules(grams: list[tuple[str, int, int, int]]) -> None:
    runs = udpio.gso_runs(grams)
    assert sum(runs) == len(grams) and all(r >= 1 for r in runs)
    pos = 0
    for r in runs:
        run = grams[pos:pos + r]
        pos += r
        if r == 1:
            continue
        dest, seg, _p, bundle = run[0]
        assert seg <= bundle and r <= udpio.GSO_SEGMENTS
        assert all(d == dest for d, _s, _p2, _b in run)
        assert all(s == seg for _d, s, _p2, _b in run[:-1]) and run[-1][1] <= seg
        assert sum(s for _d, s, _p2, _b in run) <= udpio.GSO_BYTES
        assert sum(p for _d, _s, p, _b in run) <= udpio.MAX_SEGMENTS


def test_gro_split_gives_the_joined_datagrams() -> None:
    assert udpio.gro_split(3000, 1000) == [1000, 1000, 1000]
    assert udpio.gro_split(2500, 1000) == [1000, 1000, 500]
    assert udpio.gro_split(800, 1000) == [800] and udpio.gro_split(800, 0) == [800]


def _items(io: Any, dest: socket.socket, sizes: list[int], bundle: int) -> list[Any]:
    frames = b"".join(_frame(n, i) for i, n in enumerate(sizes))
    return [(io.dest(dest.getsockname()), [frames], bundle)]


@needs_native
@needs_offloads
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from([40, 1000, 1448, 3000]), min_size=1, max_size=120),
       bundle=st.sampled_from([0, 1472, 65507]))
def test_gso_on_or_off_the_same_datagrams_arrive(sizes: list[int], bundle: int) -> None:
    got: dict[tuple[str, bool], Any] = {}
    with udp_sockets(2, rcvbuf=16 << 20) as (tx, rx):
        for cls in TWINS:
            for gso in (False, True):
                io = cls(tx, gso=gso)
                assert io.offloads.gso is gso
                result = io.send(_items(io, rx, sizes, bundle))
                got[cls.__name__, gso] = (result, drain(rx))
    first = next(iter(got.values()))
    assert all(v == first for v in got.values())
    assert first[0][1:] == (0, 0, 0) and first[0][0] == len(first[1])


@needs_offloads
@pytest.mark.parametrize("sender", TWINS)
@pytest.mark.parametrize("receiver", TWINS)
def test_a_gso_run_arrives_coalesced_and_is_taken_apart(sender: Any, receiver: Any) -> None:
    sizes = [1400] * 30 + [1000]  # bundles of one frame each (1424 and 1024 bytes)
    with udp_sockets(3) as (tx, rx, probe):
        out = sender(tx, gso=True)
        udpio.enable_offloads(probe, True)
        out.send(_items(out, probe, sizes, 1472))
        data, anc, _flags, _addr = probe.recvmsg(65536, socket.CMSG_SPACE(4))
        gro = [int.from_bytes(d[:4], sys.byteorder) for lv, kind, d in anc
               if (lv, kind) == (udpio.SOL_UDP, udpio.UDP_GRO)]
        if not gro:
            pytest.skip("the kernel delivered the run segmented (no GRO on this path)")
        assert gro == [1424] and len(data) == 30 * 1424 + 1024  # one send, one receive
        inp = receiver(rx, gso=True)
        out.send(_items(out, rx, sizes, 1472))
        blob, grams, _drops = inp.recv()
        assert [(n, f) for _a, n, f in grams] == [(1424, 1)] * 30 + [(1024, 1)]
        assert blob == b"".join(_frame(n, i) for i, n in enumerate(sizes))


@needs_offloads
def test_a_refused_gso_send_turns_gso_off_and_loses_nothing() -> None:
    """SO_NO_CHECK makes the kernel refuse GSO sends (EINVAL): the run goes out datagram
    by datagram, GSO stays off for that socket, the refusal is counted; both twins alike."""
    sizes = [1000] * 20
    results = []
    for cls in TWINS:
        with udp_sockets(2) as (tx, rx):
            tx.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
            io = cls(tx, gso=True)
            first = io.send(_items(io, rx, sizes, 1472))
            again = io.send(_items(io, rx, sizes, 1472))
            assert first == again == (20, 0, 0, 0)
            assert (io.offloads.gso, io.offloads.gso_refused) == (False, 1)
            results.append(drain(rx))
    assert all(len(r) == 40 for r in results) and all(r == results[0] for r in results)
