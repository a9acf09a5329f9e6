"""Issue 10 end to end on real sockets: authenticated and encrypted router links, and flows
protected by creator-signed policies and capabilities, enforced at the first-hop router."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.capabilities import Capability, CreatorKey, Policy
from flowrouter.wire.flowid import LINK_LOCAL_FLOW

from .rawep import RawEndpoint, until, within

KEY_A = "hex:" + "11" * 32
KEY_B = "hex:" + "22" * 32
LSID = 0x10


def addr(node: RouterNode) -> str:
    return "%s:%d" % node.tcp_address


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _node(name: str, keys: dict[str, str] | None = None, peers: list[PeerConfig] = (),
                core: bool = False, encrypt: bool = False) -> RouterNode:
    node = RouterNode(NodeConfig(
        name, listen="127.0.0.1:0", peers=list(peers), reconnect_min=0.05,
        core_lsids=frozenset({LSID}) if core else frozenset(), default_lsid=LSID,
        link_keys=keys or {}, link_encrypt=encrypt,
        accept_routers=["edge@127.0.0.1"]))  # used only where there are no link keys
    await node.start()
    return node


def test_router_links_need_the_shared_key(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        core = await _node("core", {"k": KEY_A}, core=True)
        good = await _node("good", {"k": KEY_A}, [PeerConfig(addr(core), "core")])
        forger = await _node("forger", {"k": KEY_B}, [PeerConfig(addr(core), "core")])
        keyless = await _node("keyless", None, [PeerConfig(addr(core), "core")])
        try:
            await within(good.wait_routes(LSID))
            assert core.core.counters["auth.ok"] >= 1
            # A router that claims the key but cannot prove it, and one with no key at all.
            while (core.core.counters["auth.refused.bad-proof"] < 1
                   or core.core.counters["auth.refused.missing-credentials"] < 1):
                await within(core.wait_changed())
            assert forger.core.routing.link_for(LSID) is None
            assert keyless.core.routing.link_for(LSID) is None
            # A raw client pretending to be a router (the fuzzing's LS hijack) is refused
            # before any of its routes are believed.
            fake = await RawEndpoint.connect(core, "fake", hello=False)
            fake.send_control(LINK_LOCAL_FLOW.key, C.Hello(9, C.Role.ROUTER, "fake", 65536))
            fake.send_control(LINK_LOCAL_FLOW.key, C.LsRoutes(((0x77, 0),)))
            await within(fake.closed.wait())
            assert 0x77 not in core.core.routing.known_lsids()
            # Applications need no key unless the router asks for one.
            app = await RawEndpoint.connect(core, "app")
            await app.close()
        finally:
            for n in (keyless, forger, good, core):
                await n.stop()
    with caplog.at_level(logging.WARNING):
        run(main())
    assert any("link refused (bad-proof)" in r.getMessage() for r in caplog.records)
    assert any("link refused (missing-credentials)" in r.getMessage() for r in caplog.records)


def test_encrypted_link_carries_traffic_and_hides_it() -> None:
    async def main() -> None:
        core = await _node("core", {"k": KEY_A}, core=True, encrypt=True)
        wire: list[bytes] = []

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_r, up_w = await asyncio.open_connection(*core.tcp_address)

            async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                while data := await r.read(65536):
                    wire.append(data)
                    w.write(data)
                w.close()
            await asyncio.gather(pump(reader, up_w), pump(up_r, writer),
                                 return_exceptions=True)
        proxy = await asyncio.start_server(relay, "127.0.0.1", 0)
        paddr = "%s:%d" % proxy.sockets[0].getsockname()[:2]
        edge = await _node("edge", {"k": KEY_A}, [PeerConfig(paddr, "core")], encrypt=True)
        try:
            await within(edge.wait_routes(LSID))
            from flowrouter.wire.flowid import FlowID
            flow = FlowID(0xABC, LSID, 1)
            rx = await RawEndpoint.connect(core, "rx")
            assert (await rx.join(flow, 1 << 40)).status is C.JoinStatus.OK
            tx = await RawEndpoint.connect(edge, "tx")
            tx.send(flow, b"TOP-SECRET-PAYLOAD", band=40)
            (_, payload), = await rx.data(1)
            assert payload == b"TOP-SECRET-PAYLOAD"
            seen = b"".join(wire)
            assert b"TOP-SECRET-PAYLOAD" not in seen  # the relay saw only sealed records
            assert b"edge" in seen  # ... after a HELLO in clear
            await rx.close()
            await tx.close()
        finally:
            await edge.stop()
            proxy.close()
            await core.stop()
    run(main())


def test_capabilities_protect_join_and_send() -> None:
    async def main() -> None:
        core = await _node("core", core=True)
        edge = await _node("edge", peers=[PeerConfig(addr(core), "core")])
        try:
            await within(edge.wait_routes(LSID))
            owner = CreatorKey.generate()
            flow = owner.flow(LSID, 1)
            now = time.time()
            # The creator publishes its policy at its own router; it reaches every router.
            creator = await RawEndpoint.connect(edge, "creator")
            creator.send_control(LINK_LOCAL_FLOW.key, C.PolicyMsg(
                Policy.issue(owner, flow, version=1, now=now).encode()))
            await until(lambda: core.core.counters["policies.installed"] >= 1)
            assert edge.core.counters["policies.installed"] == 1

            alice = await RawEndpoint.connect(core, "alice")
            ack = await alice.join(flow, 1 << 40)
            assert ack.status is C.JoinStatus.REFUSED and "missing" in ack.reason
            cap_a = Capability.issue(owner, flow, "alice", join=[40], send=[], ttl=3600,
                                     now=now)
            alice.send_control(flow.key, C.Join(2, 1 << 41, 0, cap_a.encode()))
            hdr, payload = await alice.next_frame()
            assert C.decode(payload).status is C.JoinStatus.REFUSED  # 41 not granted
            alice.send_control(flow.key, C.Join(3, 1 << 40, 0, cap_a.encode()))
            hdr, payload = await alice.next_frame()
            assert C.decode(payload).status is C.JoinStatus.OK

            bob = await RawEndpoint.connect(edge, "bob")
            cap_b = Capability.issue(owner, flow, "bob", send=[40], ttl=3600, now=now)
            bob.send_control(flow.key, C.Join(1, 0, C.JOIN_FLAG_ADVERTISE, cap_b.encode()))
            hdr, payload = await bob.next_frame()
            assert C.decode(payload).status is C.JoinStatus.OK
            bob.send(flow, b"allowed", band=40)
            bob.send(flow, b"wrong-band", band=42)
            mallory = await RawEndpoint.connect(edge, "mallory")
            mallory.send(flow, b"forged", band=40)
            # A token issued to bob is useless to anyone else.
            mallory.send_control(flow.key, C.Join(1, 0, C.JOIN_FLAG_ADVERTISE, cap_b.encode()))
            hdr, payload = await mallory.next_frame()
            ack = C.decode(payload)
            assert ack.status is C.JoinStatus.REFUSED and "wrong-subject" in ack.reason
            bob.send(flow, b"marker", band=40)
            got = [p for _, p in await alice.data(2)]
            assert got == [b"allowed", b"marker"]
            assert edge.core.counters["drop.unauthorised"] == 2

            # An expired token is refused.
            old = Capability.issue(owner, flow, "carol", join=[40], ttl=10, now=now - 3600)
            carol = await RawEndpoint.connect(core, "carol")
            carol.send_control(flow.key, C.Join(1, 1 << 40, 0, old.encode()))
            hdr, payload = await carol.next_frame()
            ack = C.decode(payload)
            assert ack.status is C.JoinStatus.REFUSED and "expired" in ack.reason

            # Revocation: policy v2 revokes alice's token; she is taken off the flow.
            creator.send_control(LINK_LOCAL_FLOW.key, C.PolicyMsg(Policy.issue(
                owner, flow, version=2, revoked=[cap_a.serial], now=now).encode()))
            await until(lambda: core.core.counters["capability.revoked"] >= 1)
            bob.send(flow, b"after-revocation", band=40)
            with pytest.raises(asyncio.TimeoutError):
                await alice.data(1, timeout=0.5)
            # A forged policy (signed by another key for this creator's flow) is refused.
            other = CreatorKey.generate()
            forged = Policy.issue(other, other.flow(LSID, 1), version=9, now=now)
            creator.send_control(LINK_LOCAL_FLOW.key, C.PolicyMsg(forged.encode()[:-1] + b"x"))
            await until(lambda: edge.core.counters["refused.policy"] >= 1)
            for ep in (alice, bob, mallory, carol, creator):
                await ep.close()
        finally:
            await edge.stop()
            await core.stop()
    run(main())


def test_flowlib_with_link_keys_and_capabilities(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import flowlib

    async def main() -> None:
        node = RouterNode(NodeConfig("gate", listen="127.0.0.1:0", default_lsid=LSID,
                                     core_lsids=frozenset({LSID}), link_keys={"app": KEY_A},
                                     link_auth_endpoints=True, link_encrypt=True))
        await node.start()
        try:
            a = addr(node)
            sd = str(tmp_path)
            with pytest.raises(flowlib.ConnectError, match="requires applications to auth"):
                await flowlib.connect([a], name="nokey", state_dir=sd, timeout=3)
            with pytest.raises(flowlib.ConnectError, match="authentication"):
                await flowlib.connect([a], name="wrongkey", state_dir=sd, timeout=3,
                                      link_key=("app", KEY_B))
            owner_key = CreatorKey.generate()
            flow = owner_key.flow(LSID, 7)
            now = time.time()
            owner = await flowlib.connect([a], name="owner", state_dir=sd,
                                          link_key=("app", KEY_A))
            owner.publish_policy(Policy.issue(owner_key, flow, version=1, now=now))
            await until(lambda: node.core.counters["policies.installed"] >= 1)
            rx = await flowlib.connect([a], name="rx", state_dir=sd, link_key=("app", KEY_A))
            with pytest.raises(flowlib.JoinRefused, match="missing"):
                await rx.listen(flow, [40])
            lst = await rx.listen(flow, [40], capability=Capability.issue(
                owner_key, flow, "rx", join=[40], now=now))
            tx = await flowlib.connect([a], name="tx", state_dir=sd, link_key=("app", KEY_A))
            await tx.advertise(flow, capability=Capability.issue(owner_key, flow, "tx",
                                                                 send=[40], now=now))
            await tx.send(flow, b"through the gate", band=40)
            assert (await within(lst.get())).payload == b"through the gate"
            assert node.core.counters["auth.ok"] >= 3
            # The router asked for encryption: both ends of the application links are sealed.
            assert rx.encrypted and tx.encrypted
            sealed = [lk for lk in node.links.values() if getattr(lk, "secure", None)]
            assert len(sealed) >= 3
            for c in (owner, rx, tx):
                await c.close()
        finally:
            await node.stop()
    run(main())


def test_application_may_ask_for_an_encrypted_link(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import flowlib

    async def main() -> None:
        node = RouterNode(NodeConfig("plain", listen="127.0.0.1:0", default_lsid=LSID,
                                     core_lsids=frozenset({LSID}), link_keys={"app": KEY_A}))
        await node.start()
        try:
            sd = str(tmp_path)
            a = addr(node)
            secret = await flowlib.connect([a], name="secret", state_dir=sd,
                                           link_key=("app", KEY_A), encrypt=True)
            plain = await flowlib.connect([a], name="plain-app", state_dir=sd)
            assert secret.encrypted and not plain.encrypted
            flow = await plain.create()
            lst = await secret.listen(flow, [33])
            await plain.send(flow, b"to the sealed link", band=33)
            assert (await within(lst.get())).payload == b"to the sealed link"
            lst2 = await plain.listen(flow, [34])
            await secret.send(flow, b"from the sealed link", band=34)
            assert (await within(lst2.get())).payload == b"from the sealed link"
            with pytest.raises(ValueError, match="link_key"):
                await flowlib.connect([a], name="x", state_dir=sd, encrypt=True)
            for c in (secret, plain):
                await c.close()
        finally:
            await node.stop()
    run(main())
