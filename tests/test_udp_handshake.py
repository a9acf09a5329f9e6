"""Authenticated handshakes over lossy datagram links (UDP), in the simulator and on
loopback: losing any one handshake datagram (either side's HELLO or AUTH) costs one retry
interval, not a handshake time-out and a re-dial; a repeat is answered with the same AUTH and
never taken for a new session, and replay protection still refuses a reused nonce.

UDP links are never sealed, so a router with link keys refuses authenticated UDP links (and
a UDP ``[[peer]]`` is a config error) unless ``[link_auth] allow_unsealed_udp`` accepts them:
these routers do (``auth_udp_unsealed``); the refusal is tested last."""

from __future__ import annotations

import socket

import pytest

from flowrouter.core.tables import LinkState
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.testbed.sim.links import Direction
from flowrouter.testbed.sim.network import SimNetwork
from flowrouter.wire import control as C
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.linkauth import AuthError, KeyRing, LinkAuthenticator, ReplayCache

from .ports import free_port
from .rawep import run, until

KEY = b"\x11" * 32
LIVENESS = 0.5  #: the retry interval of the handshake (the liveness interval)


def _kind(payload: bytes | memoryview) -> str:
    return type(C.decode(payload)).__name__


def lossy_sim(monkeypatch: pytest.MonkeyPatch, src: str, nth: int) -> tuple[SimNetwork, list]:
    """Two authenticated routers on a UDP link; the *nth* handshake frame *src* sends is
    lost (1: its HELLO, 2: its AUTH)."""
    sent: dict[str, int] = {}
    lost: list[tuple[float, str, str]] = []
    transmit = Direction.transmit

    def lossy(self: Direction, header: bytes, payload: bytes | memoryview) -> None:
        if bytes(header[:16]) == LINK_LOCAL_FLOW.key and _kind(payload) in ("Hello", "Auth"):
            sent[self.src] = n = sent.get(self.src, 0) + 1
            if self.src == src and n == nth:
                lost.append((self.q.now, self.src, _kind(payload)))
                return
        transmit(self, header, payload)

    monkeypatch.setattr(Direction, "transmit", lossy)
    net = SimNetwork(seed=1, tick_interval=0.05, reconnect_delay=1.0)
    for name in ("a", "b"):
        net.add_router(name, keyring=KeyRing({"site": KEY}), auth_udp_unsealed=True,
                       liveness_interval=LIVENESS,
                       dead_after=3 * LIVENESS, handshake_timeout=10.0)
    net.add_link("a", "b", transport="udp", delay=0.005)
    return net, lost


def up(net: SimNetwork, name: str) -> bool:
    return any(lk.state is LinkState.UP for lk in net.routers[name].links.values())


@pytest.mark.parametrize("src", ["a", "b"])
@pytest.mark.parametrize("nth,what", [(1, "Hello"), (2, "Auth")])
def test_a_lost_handshake_datagram_costs_one_retry_not_a_redial(
        monkeypatch: pytest.MonkeyPatch, src: str, nth: int, what: str) -> None:
    net, lost = lossy_sim(monkeypatch, src, nth)
    net.run_until(2 * LIVENESS + 0.2)  # one retry interval, a tick, the round trips
    assert [(s, k) for _, s, k in lost] == [(src, what)]
    assert up(net, "a") and up(net, "b")
    link = net.links["a-b"]
    assert link.connects == 1 and net.counters["links.closed-by-router"] == 0
    for name in ("a", "b"):
        c = net.routers[name].counters
        assert c["auth.ok"] == 1 and c["links.up"] == 1, (name, dict(c))
        assert not any(k.startswith(("auth.refused", "malformed")) for k in c), dict(c)
    net.run_until(6.0)  # and it stays up: the repeats started no second session
    assert up(net, "a") and up(net, "b")
    assert all(net.routers[n].counters["auth.ok"] == 1 for n in ("a", "b"))


def test_answers_to_repeats_stop_when_both_sides_are_up(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The side that is up answers a repeat with its AUTH at most once per half interval and
    only within the handshake time-out of coming up: two sides that both came up cannot
    keep answering each other."""
    net, _ = lossy_sim(monkeypatch, "a", 2)  # a's AUTH is lost: b repeats, a answers
    net.run_until(12.0)
    answered = sum(net.routers[n].counters["handshake.auth-answered"] for n in ("a", "b"))
    assert 1 <= answered <= 2
    frames = sum(d.frames for d in (net.links["a-b"].ab, net.links["a-b"].ba))
    net.run_until(15.0)
    later = sum(d.frames for d in (net.links["a-b"].ab, net.links["a-b"].ba))
    assert net.routers["a"].counters["handshake.auth-answered"] + net.routers["b"].counters[
        "handshake.auth-answered"] == answered  # nothing answered after the handshake
    assert later - frames < 40  # echoes and route vectors only, no AUTH ping-pong


def _pair() -> tuple[LinkAuthenticator, LinkAuthenticator, ReplayCache]:
    ring = KeyRing({"site": KEY})
    cache = ReplayCache()
    return (LinkAuthenticator(ring, my_name="a", replay_cache=cache),
            LinkAuthenticator(ring, my_name="b", replay_cache=ReplayCache()), cache)


def test_a_repeat_is_recognised_by_its_bytes_and_starts_no_session() -> None:
    a, b, cache = _pair()
    auth_a = a.on_peer_hello("b", 1, b.hello_credentials())
    auth_b = b.on_peer_hello("a", 1, a.hello_credentials())
    assert a.is_repeated_hello("b", 1, b.hello_credentials())
    assert not a.is_repeated_hello("b", 2, b.hello_credentials())  # another role
    assert not a.is_repeated_hello("c", 1, b.hello_credentials())  # another name
    fresh = LinkAuthenticator(KeyRing({"site": KEY}), my_name="b")
    assert not a.is_repeated_hello("b", 1, fresh.hello_credentials())  # another nonce
    assert a.auth_message == auth_a  # the answer to a repeat: the same bytes
    assert not a.is_repeated_auth(auth_b)  # not before it has been accepted
    a.on_peer_auth(auth_b)
    assert a.authenticated and a.is_repeated_auth(auth_b)
    assert not a.is_repeated_auth(auth_a)
    # the repeat went nowhere near the replay cache: a second session with the same nonce
    # (a recorded HELLO replayed on a new link) is still refused
    again = LinkAuthenticator(KeyRing({"site": KEY}), my_name="a", replay_cache=cache)
    with pytest.raises(AuthError) as err:
        again.on_peer_hello("b", 1, b.hello_credentials())
    assert err.value.reason == "replay"


def test_on_loopback_an_authenticated_udp_link_whose_first_hello_is_lost_comes_up() -> None:
    """ua dials ub over UDP before ub has bound its port: ua's first HELLO is lost. Its
    repeat (the same HELLO) brings the authenticated link up within a few retry intervals,
    well inside the handshake time-out (and without a re-dial)."""
    keys = {"site": "hex:" + "11" * 32}
    opts = dict(listen="", liveness_interval=LIVENESS, dead_after=4.0, link_keys=keys,
                tick_interval=0.05, link_unsealed_udp=True)

    async def main() -> None:
        port = free_port(kind=socket.SOCK_DGRAM)
        a = RouterNode(NodeConfig("ua", udp="127.0.0.1:0", peers=[
            PeerConfig(f"127.0.0.1:{port}", "ub", transport="udp")], **opts))
        await a.start()
        b = None
        try:
            await until(lambda: bool(a.core.links))  # its first HELLO has gone nowhere
            b = RouterNode(NodeConfig("ub", udp=f"127.0.0.1:{port}", **opts))
            await b.start()
            await a.wait_peers_up(1, timeout=20)
            await b.wait_peers_up(1, timeout=20)
            for node in (a, b):
                c = node.core.counters
                assert c["auth.ok"] == 1 and c["links.up"] == 1, dict(c)
                assert not any(k.startswith("auth.refused") for k in c), dict(c)
            assert a.core.counters["handshake.hello-repeated"] >= 1
            assert a.core.counters["links.down"] == 0  # the first link, never re-dialled
        finally:
            await a.stop()
            if b is not None:
                await b.stop()
    run(main())


def test_with_link_keys_unsealed_udp_links_are_refused_unless_allowed() -> None:
    from flowrouter.net.config import ConfigError
    from flowrouter.net.configfile import config_from_dict

    keys = {"keys": {"site": "hex:" + "11" * 32}}
    peer = {"name": "r2", "address": "127.0.0.1:7002", "transport": "udp"}
    with pytest.raises(ConfigError, match="UDP links are not sealed"):
        config_from_dict({"router": {"name": "r1"}, "link_auth": keys, "peer": [peer]})
    cfg = config_from_dict({"router": {"name": "r1"}, "peer": [peer],
                            "link_auth": {**keys, "allow_unsealed_udp": True}})
    assert cfg.params().auth_udp_unsealed
    config_from_dict({"router": {"name": "r1"}, "peer": [peer]})  # no keys: nothing to keep
    # a router with keys that was not told to accept them refuses the UDP handshake
    net = SimNetwork(seed=2, tick_interval=0.05)
    net.add_router("a", keyring=KeyRing({"site": KEY}), auth_udp_unsealed=True,
                   liveness_interval=LIVENESS, dead_after=3 * LIVENESS)
    net.add_router("b", keyring=KeyRing({"site": KEY}), liveness_interval=LIVENESS,
                   dead_after=3 * LIVENESS)
    net.add_link("a", "b", transport="udp", delay=0.005)
    net.run_until(2.0)
    assert not up(net, "a") and not up(net, "b")
    assert net.routers["b"].counters["refused.udp-unsealed"] >= 1
