"""The sans-I/O policies of the trust boundary: quotas per principal, the slow-consumer
policy, and the rule that commands changing a router need proof."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrouter.core.linkqueue import SlowConsumerPolicy
from flowrouter.core.quotas import PrincipalQuotas, QuotaLimits, host_of, principal_for
from flowrouter.net.commandauth import CommandGuard, is_loopback, sign_command
from flowrouter.wire.address import AddressError


# ---------------------------------------------------------------- quotas per principal
def test_principal_is_the_proven_name_or_the_source_host() -> None:
    assert principal_for("alice", "10.0.0.5:4000") == "name:alice"
    assert principal_for(None, "10.0.0.5:4000") == "host:10.0.0.5"
    assert principal_for(None, "[::1]:4000") == "host:::1"
    assert host_of("?") == "?"


def test_connections_are_counted_per_host_not_per_connection() -> None:
    q = PrincipalQuotas(QuotaLimits(connections_per_host=2))
    assert q.admit_connection(1, "10.0.0.5:1") and q.admit_connection(2, "10.0.0.5:2")
    assert not q.admit_connection(3, "10.0.0.5:3")  # a third from the same host
    assert q.admit_connection(4, "10.0.0.6:1")  # another host is unaffected
    q.unbind(1)
    assert q.admit_connection(5, "10.0.0.5:5")
    assert q.status()["connections_per_host"] == {"10.0.0.5": 2, "10.0.0.6": 1}


def test_join_rate_is_a_bucket_per_principal() -> None:
    q = PrincipalQuotas(QuotaLimits(joins_per_second=10, join_burst=5))
    q.bind(1, "host:a")
    q.bind(2, "host:a")  # a second connection shares the bucket
    assert [q.admit_join("host:a", 0.0) for _ in range(6)] == [True] * 5 + [False]
    assert q.admit_join("host:b", 0.0)  # others keep theirs
    assert not q.admit_join("host:a", 0.05)
    assert q.admit_join("host:a", 0.2)  # refilled at 10/s
    q.unbind(1)
    q.unbind(2)
    assert q.principal(1) is None and "host:a" not in q.links
    with pytest.raises(ValueError):
        QuotaLimits(flows=0)


# ---------------------------------------------------------------- slow consumers
def test_slow_consumer_stalls_then_expires_after_the_grace_time() -> None:
    p = SlowConsumerPolicy(limit=1000, grace=2.0, stall=0.5, now=0.0)
    assert not p.stuck(0.4) and p.stuck(0.6)  # frames waited, nothing moved
    p.progress(800, 0.6)
    assert not p.stuck(0.7)
    assert p.note_drops(2, 1.0) and not p.note_drops(1, 1.5)  # went over once
    assert p.over_since == 1.0 and p.dropped == 3 and p.stuck(1.1)  # 0.5 s since progress
    assert not p.expired(2.5)
    p.progress(600, 2.9)  # not yet down to half: still over
    assert p.expired(3.0)
    p.progress(500, 3.1)  # recovered
    assert p.over_since is None and not p.expired(10.0)
    with pytest.raises(ValueError):
        SlowConsumerPolicy(0, 1.0)


# ---------------------------------------------------------------- commands need proof
def test_loopback_interface_serves_commands_and_status_to_anyone() -> None:
    g = CommandGuard("127.0.0.1")
    assert g.authorise({"cmd": "emulate", "peer": "r2"}, 0.0) is None
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("10.1.1.1")


def test_open_interface_needs_proof_for_commands_but_not_for_status() -> None:
    with pytest.raises(AddressError, match="control_token"):
        CommandGuard.check_bind("0.0.0.0", None)
    CommandGuard.check_bind("0.0.0.0", {"token": b"t" * 16})
    g = CommandGuard("0.0.0.0", {"token": b"secret-token", "site": bytes(32)}, router="r1")
    here = {"router": "r1", "boot": g.boot}
    assert g.authorise({"cmd": "status"}, 0.0) is None
    req = {"cmd": "link", "peer": "r2", "up": False}
    assert "needs proof" in (g.authorise(req, 1000.0) or "")
    signed = sign_command(req, "token", b"secret-token", 1000.0, **here)
    assert g.authorise(signed, 1001.0) is None
    assert "replayed" in (g.authorise(signed, 1001.0) or "")
    assert g.authorise(sign_command(req, "site", bytes(32), 1000.0, **here), 1000.0) is None
    assert "bad proof" in (g.authorise(sign_command(req, "token", b"guess", 1000.0, **here),
                                       1000.0) or "")
    tampered = sign_command(req, "token", b"secret-token", 1000.0, **here)
    tampered["up"] = True  # the proof covers the whole command
    assert "bad proof" in (g.authorise(tampered, 1000.0) or "")
    assert "off" in (g.authorise(sign_command(req, "token", b"secret-token", 0.0, **here),
                                 1000.0) or "")
    assert "unknown key" in (g.authorise(sign_command(req, "x", b"k", 0.0, **here), 0.0)
                             or "")
    assert "malformed" in (g.authorise({**req, "auth": "token"}, 0.0) or "")
    assert g.refused == 7


def test_a_command_signed_for_one_router_is_refused_by_another_with_the_same_key() -> None:
    """The issue-26 attack: r1 and r2 share a link key; a command recorded on its way to r1
    is sent to r2."""
    secrets = {"site": bytes(32)}
    r1 = CommandGuard("0.0.0.0", secrets, router="r1")
    r2 = CommandGuard("0.0.0.0", secrets, router="r2", boot=r1.boot)  # even a same boot
    req = {"cmd": "link", "peer": "r3", "up": False}
    for_r1 = sign_command(req, "site", bytes(32), 1000.0, router="r1", boot=r1.boot)
    refusal = r2.authorise(for_r1, 1000.0) or ""
    assert "signed for router 'r1', this is 'r2'" in refusal
    lie = {**for_r1, "auth": {**for_r1["auth"], "router": "r2"}}  # the name is in the proof
    assert "bad proof" in (r2.authorise(lie, 1000.0) or "")
    assert r1.authorise(for_r1, 1000.0) is None


def test_a_command_is_refused_after_the_router_restarts() -> None:
    """The nonce cache lives in memory; the proof covers the run nonce, new at each start, so
    a command recorded before a restart is refused after it, within its time window too."""
    secrets = {"token": b"secret-token"}
    before = CommandGuard("0.0.0.0", secrets, router="r1")
    req = {"cmd": "emulate", "peer": "r2", "loss": 1.0}
    signed = sign_command(req, "token", b"secret-token", 1000.0, router="r1",
                          boot=before.boot)
    assert before.authorise(signed, 1000.0) is None
    after = CommandGuard("0.0.0.0", secrets, router="r1")  # the router restarted
    assert after.boot != before.boot
    assert "earlier run" in (after.authorise(signed, 1001.0) or "")
    lie = {**signed, "auth": {**signed["auth"], "boot": after.boot}}
    assert "bad proof" in (after.authorise(lie, 1001.0) or "")
    old_client = {**signed, "auth": {k: v for k, v in signed["auth"].items()
                                     if k not in ("router", "boot")}}
    assert "malformed auth" in (after.authorise(old_client, 1001.0) or "")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "pop"]), st.integers(0, 3),
                          st.integers(0, 2), st.sampled_from([10, 40, 200]),
                          st.sampled_from([2, 20, 40])), max_size=60),
       st.sampled_from([300, 2000, 10**6]), st.sampled_from([0.0, 0.01]))
def test_output_queue_names_the_input_of_every_frame_that_leaves(
        ops: list[tuple[str, int, int, int, int]], bound: int, delay: float) -> None:
    """Every frame that leaves the queue, dropped or served, names the input it came from,
    through pushes, pops, trims and delays: flow control's credit per input
    (flowrouter.core.flowcontrol) is kept from these reports, so per input what went in
    less what left never goes negative and adds up to the queue's bytes."""
    from flowrouter.core.linkqueue import OutputQueue

    q = OutputQueue(bound, delay=delay)
    waiting: dict[int, int] = {}  # recomputed from what goes in, out and is dropped
    now = 0.0
    for op, origin, flow, size, band in ops:
        now += 0.005
        if op == "push":
            hdr = bytes(20) + bytes([band]) + bytes(3)
            waiting[origin] = waiting.get(origin, 0) + 24 + size
            for _, n, org in q.push(bytes([flow]) * 16, hdr, b"p" * size, band < 16, now,
                                    origin):
                waiting[org] -= n
        else:
            fr = q.pop(now)
            if fr is not None:
                waiting[fr[2]] -= len(fr[0]) + len(fr[1])
        assert all(n >= 0 for n in waiting.values()), waiting
        assert q.bytes == sum(waiting.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([2, 20, 40, 41]),
                                   st.integers(0, 300) | st.just(9000)),
                         min_size=1, max_size=12),
                max_size=8),
       st.sampled_from([200, 1500, 20000, 10**6]), st.sampled_from([0.0, 0.01]),
       st.integers(0, 2))
def test_pushing_a_batch_is_pushing_its_frames_one_by_one(
        batches: list[list[tuple[int, int, int]]], bound: int, delay: float, origin: int
        ) -> None:
    """OutputQueue.push_frames (a fast-path batch queued in one pass) drops, keeps and
    serves exactly what push() frame by frame would (large payloads wait as views)."""
    from flowrouter.core.linkqueue import OutputQueue
    from flowrouter.wire.header import pack_header

    one, many = OutputQueue(bound, delay=delay), OutputQueue(bound, delay=delay)
    now = 0.0
    for batch in batches:
        now += 0.004
        frames = [(bytes([f]) * 16, pack_header(bytes([f]) * 16, size, band), b"p" * size)
                  for f, band, size in batch]
        dropped_one = []
        for key, hdr, pl in frames:
            dropped_one += one.push(key, hdr, pl, hdr[20] < 16, now, origin)
        dropped_many = many.push_frames(b"".join(h + p for _, h, p in frames), now, origin)
        assert dropped_many == dropped_one
        assert (many.bytes, len(many)) == (one.bytes, len(one))
    now += 1.0
    served = [(bytes(a[0]), bytes(a[1]), a[2]) for a in iter(lambda: one.pop(now), None)]
    assert [(bytes(b[0]), bytes(b[1]), b[2]) for b in iter(lambda: many.pop(now), None)] == served
