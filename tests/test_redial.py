"""Re-dialling configured peers (issue 28 "recovery in seconds", issue 26 "re-dial storm").

The schedule is sans-I/O and runs on virtual time here; two real routers on loopback show
that a refused handshake no longer re-dials ten times a second, and that a dial into a
peer that never answers gives up after ``dial_timeout`` instead of the kernel's SYN repeats.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from flowrouter.net.config import ConfigError, NodeConfig, PeerConfig
from flowrouter.net.configfile import config_from_dict
from flowrouter.net.redial import DialSchedule
from flowrouter.net.runtime import RouterNode


def test_backoff_doubles_to_the_cap_and_spaces_attempts_from_their_start() -> None:
    s = DialSchedule(0.1, 5.0)
    t, waits = 0.0, []
    for _ in range(8):
        s.attempt("p", t)
        step = s.failed("p", t, "refused")  # an instant failure (connection refused)
        waits.append(step.wait)
        t += step.wait
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    # An attempt that used 4 s of a dial time-out has used 4 s of its 5 s wait.
    s.attempt("p", t)
    assert s.failed("p", t + 4.0, "time-out").wait == pytest.approx(1.0)
    s.attempt("p", t + 5.0)
    assert s.failed("p", t + 10.0, "time-out").wait == 0.0  # a longer time-out: at once


def test_backoff_starts_over_only_after_a_link_stayed_up() -> None:
    s = DialSchedule(0.1, 5.0)
    t = 0.0
    for _ in range(5):  # the TCP connect succeeds, the handshake is refused at once
        s.attempt("p", t)
        s.up("p", t + 0.001)
        step = s.failed("p", t + 0.002, "connection closed by peer")
        t += 0.002 + step.wait
    assert step.wait == pytest.approx(1.6)  # still backing off: no storm
    s.attempt("p", t)
    s.up("p", t)
    step = s.failed("p", t + 60.0, "connection closed by peer")  # it had been working
    assert step.wait == pytest.approx(0.1)


def test_one_log_line_per_change_of_state() -> None:
    s = DialSchedule(0.1, 5.0)
    notes = []
    for t in range(6):
        s.attempt("p", t)
        notes.append(s.failed("p", t, "cannot connect: refused").note)
    s.attempt("p", 6)
    notes.append(s.failed("p", 6, "no answer within 4s").note)
    assert [n for n in notes if n] == ["down: cannot connect: refused",
                                       "still down, now: no answer within 4s"]
    assert s.up("p", 10.0) == "up again after 7 failed attempts (10.0s down)"
    # dropped at once, up again, dropped (reset or closed): one episode, no new lines
    assert s.failed("p", 10.1, "connection closed by peer").note.startswith("still down")
    assert s.up("p", 10.5) == "up again after 8 failed attempts (10.5s down)"
    assert s.failed("p", 10.6, "connection lost: [Errno 104] reset").note == ""
    assert s.up("p", 10.9) == ""
    assert s.failed("p", 11.0, "connection closed by peer").note == ""
    s.up("p", 11.0)  # then up for good (2 s or more): a new episode when it drops
    assert s.failed("p", 20.0, "connection closed by peer").note.startswith("down:")


def test_dial_timeout_is_checked() -> None:
    cfg = config_from_dict({"router": {"name": "r", "dial_timeout": 1.5}})
    assert cfg.dial_timeout == 1.5 and NodeConfig("r").dial_timeout == 4.0
    with pytest.raises(ConfigError, match="dial_timeout"):
        config_from_dict({"router": {"name": "r", "dial_timeout": 0}})


def test_refused_handshake_backs_off_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    """r1 refuses r2 (not a configured peer, no keys): r2 used to re-dial every 0.1 s for
    ever, each attempt three log lines on each side."""
    async def main() -> tuple[int, int]:
        r1 = RouterNode(NodeConfig("r1", listen="127.0.0.1:0"))
        await r1.start()
        r2 = RouterNode(NodeConfig("r2", listen=None, peers=[
            PeerConfig("%s:%d" % r1.tcp_address, "r1")], reconnect_min=0.1,
            reconnect_max=5.0))
        with caplog.at_level(logging.DEBUG, logger="flowrouter.net.runtime"):
            await r2.start()
            await asyncio.sleep(2.0)
        refused = r1.core.counters["refused.router-claim"]
        await r2.stop()
        await r1.stop()
        notes = [r.getMessage() for r in caplog.records
                 if r.name == "flowrouter.net.runtime" and r.levelno >= logging.INFO
                 and "r1 (" in r.getMessage()]
        return refused, len(notes)

    refused, notes = asyncio.run(main())
    # 0.1 + 0.2 + 0.4 + 0.8 = 1.5 s: at most five attempts in 2 s (it was about 20)
    assert 2 <= refused <= 5
    assert notes <= 3  # down, up again, perhaps a change of reason; not one per attempt


def test_dial_into_silence_gives_up_after_dial_timeout() -> None:
    """A listener whose backlog is full never completes the handshake (as a blackout):
    the dial fails after dial_timeout and the next one follows the back-off."""
    async def main() -> tuple[float, str]:
        loop = asyncio.get_running_loop()
        # A peer that never answers: a non-routable TEST-NET-1 address would leave the host,
        # so use a listening socket whose accept queue is full instead.
        sink = socket.socket()
        sink.bind(("127.0.0.1", 0))
        sink.listen(0)
        fillers = []
        for _ in range(4):
            f = socket.socket()
            f.setblocking(False)
            try:
                f.connect(sink.getsockname())
            except BlockingIOError:
                pass
            fillers.append(f)
        await asyncio.sleep(0.1)
        r2 = RouterNode(NodeConfig("r2", listen=None, peers=[
            PeerConfig("%s:%d" % sink.getsockname(), "r1")], dial_timeout=0.5,
            reconnect_min=0.1, reconnect_max=0.2))
        t0 = loop.time()
        await r2.start()
        try:
            while not r2.peer_errors:  # no event of its own: a bounded poll
                assert loop.time() - t0 < 10.0, "the dial never gave up"
                await asyncio.sleep(0.02)
            return loop.time() - t0, r2.peer_errors["%s:%d" % sink.getsockname()][1]
        finally:
            await r2.stop()
            for f in fillers:
                f.close()
            sink.close()

    took, why = asyncio.run(asyncio.wait_for(main(), 30))
    assert "dial_timeout" in why and took < 2.0


def test_a_link_brought_back_up_is_dialled_at_once_not_after_the_backoff() -> None:
    """``link up=true`` (a partition healed by the operator or a fault schedule): the dial
    waiting out a 5 s back-off goes at once."""
    async def main() -> float:
        r1 = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", accept_routers=["r2@127.0.0.1"]))
        await r1.start()
        r2 = RouterNode(NodeConfig("r2", listen=None, peers=[
            PeerConfig("%s:%d" % r1.tcp_address, "r1")], reconnect_min=5.0,
            reconnect_max=5.0))
        await r2.start()
        try:
            await r2.wait_peers_up(1)
            r2.set_link("r1", False)
            await asyncio.sleep(0.2)  # the cut link's re-dial now waits 5 s
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            r2.set_link("r1", True)
            await r2.wait_peers_up(1, timeout=4.0)
            return loop.time() - t0
        finally:
            await r2.stop()
            await r1.stop()

    assert asyncio.run(main()) < 1.0
