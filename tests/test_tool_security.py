"""Security from every tool (issue 20, issue 17): flowcat, flowdir and flowchat take flowlib's
connection options (several routers, --link-key, --encrypt, --capability, --policy) from one
place (flowlib.cliopts); flowcat signs capability and policy files; a chat room protected by
a policy admits only the site servers holding a capability, on real loopback routers."""

from __future__ import annotations

import argparse
import asyncio
import time

import pytest

import flowlib
from flowchat import cli as chat_cli
from flowchat.client import ChatClient
from flowdir import DirectoryMember
from flowdir import cli as flowdir
from flowlib import cli as flowcat
from flowlib.cliopts import add_connection_options, connect_kwargs, routers
from flowlib.credentials import capability_for, load_capability, load_policy
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire.capabilities import CreatorKey

from .rawep import until

LSID = 0x10
KEY = "hex:" + "5a" * 32


def addr(node: RouterNode) -> str:
    return "%s:%d" % node.tcp_address


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 90))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    add_connection_options(p)
    return p


def _link_key_file(tmp_path) -> str:  # type: ignore[no-untyped-def]
    """KEY in a key file of mode 0600: how a tool is given it (never in argv)."""
    path = tmp_path / "site.key"
    path.write_text(KEY[4:] + "\n")
    path.chmod(0o600)
    return str(path)


def _key_file(tmp_path) -> tuple[CreatorKey, str]:  # type: ignore[no-untyped-def]
    key = CreatorKey.generate()
    path = tmp_path / "creator.key"
    key.save(path)
    return key, str(path)


def test_connection_options_parse_routers_keys_and_capability_files(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = _parser()
    args = p.parse_args(["--router", "127.0.0.1:7001,127.0.0.1:7002", "-r", "[::1]:7003"])
    assert routers(args) == ["127.0.0.1:7001", "127.0.0.1:7002", "[::1]:7003"]
    assert routers(p.parse_args([])) == ["127.0.0.1:7000"]
    assert connect_kwargs(p.parse_args([])) == {"link_key": None, "encrypt": False,
                                               "capabilities": []}
    key_file = _link_key_file(tmp_path)
    args = p.parse_args(["--link-key", f"site:file:{key_file}", "--encrypt"])
    assert connect_kwargs(args)["link_key"] == ("site", f"file:{key_file}")
    assert p.parse_args(["--link-key", f"site:{key_file}"]).link_key == ("site", key_file)
    with pytest.raises(ValueError, match="--encrypt needs --link-key"):
        connect_kwargs(p.parse_args(["--encrypt"]))
    bad = [(["--router", "nohost"], "router address"),
           (["--link-key", "justakey"], "KEY_ID:file:PATH or KEY_ID:env:VAR"),
           (["--link-key", f"site:{KEY}"], "not accepted on the command line"),
           (["--link-key", "site:base64:" + "A" * 44], "not accepted on the command line"),
           (["--link-key", "site:env:FLOWNET_TEST_UNSET_KEY"], "not set or empty"),
           (["--capability", str(tmp_path / "missing.cap")], "missing.cap"),
           (["--policy", str(tmp_path / "missing.policy")], "missing.policy")]
    junk = tmp_path / "junk.cap"
    junk.write_text("# a comment\nnot base64 at all!\n")
    bad.append((["--capability", str(junk)], "neither base64"))
    for argv, message in bad:
        with pytest.raises(SystemExit):
            p.parse_args(argv)
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
        assert "5a5a5a5a" not in err  # the refusal does not repeat the key


def test_a_link_key_comes_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 26: a key in argv is visible to every local user (ps); the environment is one of
    the two places a tool takes it from."""
    monkeypatch.setenv("FLOWNET_TEST_LINK_KEY", KEY)
    args = _parser().parse_args(["--link-key", "site:env:FLOWNET_TEST_LINK_KEY"])
    assert connect_kwargs(args)["link_key"] == ("site", KEY)
    monkeypatch.setenv("FLOWNET_TEST_LINK_KEY", "hex:00")
    with pytest.raises(SystemExit):
        _parser().parse_args(["--link-key", "site:env:FLOWNET_TEST_LINK_KEY"])


def test_flowcat_signs_capability_and_policy_files(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    key, key_path = _key_file(tmp_path)
    flow = key.flow(LSID, 7)
    cap_path, pol_path = tmp_path / "alice.cap", tmp_path / "room.policy"
    assert flowcat.main(["issue-capability", "--creator-key", key_path, "-o", str(cap_path),
                         str(flow), "alice", "--join", "32-40", "--send", "32"]) == 0
    assert flowcat.main(["issue-policy", "--creator-key", key_path, "-o", str(pol_path),
                         str(flow), "--version", "3", "--revoke", "ab"]) == 0
    assert cap_path.stat().st_mode & 0o077 == 0  # a bearer token: owner only
    cap = load_capability(cap_path)
    assert (cap.flow, cap.subject, cap.may_join("32-40"), cap.may_join([41]),
            cap.may_send(32), cap.may_send(33)) == (flow, "alice", True, False, True, False)
    pol = load_policy(pol_path)
    assert (pol.version, pol.require_join, pol.require_send, pol.revoked) == \
        (3, True, True, frozenset({0xAB}))
    assert capability_for([cap], flow.key, "alice") is cap
    assert capability_for([cap], flow.key, "bob") is None  # another subject
    assert capability_for([cap], key.flow(LSID, 8).key, "alice") is None  # another flow
    capsys.readouterr()
    assert flowcat.main(["show", str(cap_path)]) == 0
    assert "'alice'" in capsys.readouterr().out
    assert flowcat.main(["show", str(pol_path)]) == 0
    assert "policy v3" in capsys.readouterr().out
    # a policy file is not a capability, and a foreign flow cannot be signed for
    with pytest.raises(ValueError, match="policy"):
        load_capability(pol_path)
    other = CreatorKey.generate().flow(LSID, 1)
    assert flowcat.main(["issue-capability", "--creator-key", key_path, "-o",
                         str(tmp_path / "x.cap"), str(other), "eve"]) == 1
    assert "name space" in capsys.readouterr().err


def test_flowcat_and_flowdir_use_link_keys_and_capabilities(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A router that requires applications to authenticate; a flow under a policy. flowcat
    with --link-key and --capability listens and sends; without them it is refused with
    one line; flowdir takes the same flags."""
    key, key_path = _key_file(tmp_path)
    flow = key.flow(LSID, 9)
    files = {n: tmp_path / f"{n}.cap" for n in ("rx", "tx")}
    pol = tmp_path / "flow.policy"
    assert flowcat.main(["issue-policy", "--creator-key", key_path, "-o", str(pol),
                         str(flow)]) == 0
    assert flowcat.main(["issue-capability", "--creator-key", key_path, "-o",
                         str(files["rx"]), str(flow), "rx", "--join", "40"]) == 0
    assert flowcat.main(["issue-capability", "--creator-key", key_path, "-o",
                         str(files["tx"]), str(flow), "tx", "--send", "40"]) == 0

    async def main() -> None:
        node = RouterNode(NodeConfig("gate", listen="127.0.0.1:0", default_lsid=LSID,
                                     core_lsids=frozenset({LSID}), link_keys={"app": KEY},
                                     link_auth_endpoints=True))
        await node.start()
        try:
            common = ["--router", addr(node), "--link-key",
                      f"app:file:{_link_key_file(tmp_path)}"]
            # publish the policy with flowcat (any connecting command takes --policy)
            code = await asyncio.to_thread(flowcat.main, ["create", *common, "--policy",
                                                          str(pol), "--lsid", "0x10"])
            assert code == 0
            await until(lambda: node.core.counters["policies.installed"] >= 1,
                        what="the policy to be installed")
            refused = await asyncio.to_thread(flowcat.main, [
                "listen", *common, "--name", "rx", str(flow), "--bands", "40", "--count", "1"])
            assert refused == 1
            assert "missing" in capsys.readouterr().err
            nokey = await asyncio.to_thread(flowcat.main, [
                "listen", "--router", addr(node), str(flow), "--count", "1"])
            assert nokey == 1
            assert "authenticate" in capsys.readouterr().err
            listening = asyncio.ensure_future(asyncio.to_thread(flowcat.main, [
                "listen", *common, "--encrypt", "--name", "rx", "--capability",
                str(files["rx"]), str(flow), "--bands", "40", "--count", "1", "--timeout",
                "30", "--json"]))
            await until(lambda: bool(getattr(node.core.flows.get(flow.key), "down", None)),
                        what="the listener's join")
            sent = await asyncio.to_thread(flowcat.main, [
                "send", *common, "--name", "tx", "--capability", str(files["tx"]), "--band",
                "40", str(flow), "hello through a protected flow"])
            assert sent == 0
            assert await listening == 0
            assert '"payload": "hello through a protected flow"' in capsys.readouterr().out
            # flowdir: the same flags reach a directory member behind the same router
            member = await DirectoryMember.connect(
                [addr(node)], lsid=LSID, connect_options={"link_key": ("app", KEY)})
            try:
                assert await asyncio.to_thread(flowdir.main, [
                    *common, "register", "svc/a", str(flow), "--ttl", "60"]) == 0
                assert await asyncio.to_thread(flowdir.main, [
                    *common, "lookup", "svc/*", "--json"]) == 0
                assert str(flow) in capsys.readouterr().out
                assert await asyncio.to_thread(flowdir.main, [
                    "--router", addr(node), "lookup", "svc/*"]) == flowdir.EXIT_UNAVAILABLE
                assert "authenticate" in capsys.readouterr().err
            finally:
                await member.stop()
        finally:
            await node.stop()

    run(main())


def test_protected_chat_room_admits_only_capability_holders(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two site servers holding capabilities for the room flow chat through it; a third
    site server without one is refused when it joins, one with another site's token too,
    and a raw sender without a capability gets nothing through."""
    key, key_path = _key_file(tmp_path)
    room = key.flow(LSID, 0x43)
    pol = tmp_path / "room.policy"
    assert flowcat.main(["issue-policy", "--creator-key", key_path, "-o", str(pol),
                         str(room)]) == 0
    caps = {}
    for site in ("metropol", "kingdom"):
        caps[site] = tmp_path / f"{site}.cap"
        assert flowcat.main(["issue-capability", "--creator-key", key_path, "-o",
                             str(caps[site]), str(room), f"flowchat-{site}", "--join", "all",
                             "--send", "all"]) == 0
    sites = "metropol,kingdom,republic"

    def server_args(site: str, router: str, *extra: str) -> argparse.Namespace:
        return chat_cli.build_parser().parse_args([
            "server", "--site", site, "--sites", sites, "--router", router, "--flow",
            str(room), "--listen", "127.0.0.1:0", "--no-directory", "--state-dir",
            str(tmp_path / site), "--mode", "hasten", "--heartbeat", "0.25",
            "--disconnect-interval", "3", *extra])

    async def main() -> None:
        nodes: dict[str, RouterNode] = {}
        servers = []
        try:
            hub = RouterNode(NodeConfig("hub", listen="127.0.0.1:0", default_lsid=LSID,
                                        core_lsids=frozenset({LSID}),
                                        accept_routers=[f"{site}@127.0.0.1"
                                                        for site in sites.split(",")]))
            await hub.start()
            nodes["hub"] = hub
            for site in sites.split(","):
                n = RouterNode(NodeConfig(site, listen="127.0.0.1:0", default_lsid=LSID,
                                          peers=[PeerConfig(addr(hub), "hub")]))
                await n.start()
                nodes[site] = n
            for n in nodes.values():
                await asyncio.wait_for(n.wait_routes(LSID), 10)
            # metropol's server publishes the room's policy and presents its capability
            first = chat_cli.make_server(server_args(
                "metropol", addr(nodes["metropol"]), "--policy", str(pol), "--capability",
                str(caps["metropol"])))
            servers.append(first)
            await first.start()
            await until(lambda: all(n.core.counters["policies.installed"] >= 1
                                    for n in nodes.values()), what="the policy everywhere")
            second = chat_cli.make_server(server_args(
                "kingdom", addr(nodes["kingdom"]), "--capability", str(caps["kingdom"])))
            servers.append(second)
            await second.start()
            # a site without a capability is refused at its router when it joins ...
            outsider = chat_cli.make_server(server_args("republic", addr(nodes["republic"])))
            servers.append(outsider)
            with pytest.raises(flowlib.JoinRefused, match="missing"):
                await outsider.start()
            # ... and so is one presenting a token issued to another site
            thief = chat_cli.make_server(server_args(
                "republic", addr(nodes["republic"]), "--capability", str(caps["kingdom"])))
            servers.append(thief)
            with pytest.raises(flowlib.JoinRefused):
                await thief.start()
            # a raw client without a capability cannot send into the room either
            raw = await flowlib.connect([addr(nodes["republic"])], name="intruder",
                                        state_dir=str(tmp_path / "raw"))
            try:
                before = nodes["republic"].core.counters["drop.unauthorised"]
                raw.send_nowait(room, b"spoofed", band=32)
                await until(lambda: nodes["republic"].core.counters["drop.unauthorised"]
                            > before, what="the intruder's frame to be dropped")
            finally:
                await raw.close()
            # the holders chat
            await until(lambda: len(first.igo.ordering.members) == 2
                        and len(second.igo.ordering.members) == 2, what="both holders")
            assert first.address and second.address
            alice = await ChatClient.connect("%s:%d" % first.address, "alice")
            bob = await ChatClient.connect("%s:%d" % second.address, "bob")
            await alice.say("only holders hear this")
            async for ev in bob:
                if ev["ev"] == "msg":
                    assert (ev["site"], ev["text"]) == ("metropol", "only holders hear this")
                    break
            await alice.close()
            await bob.close()
        finally:
            for s in servers:
                await s.stop()
            for n in nodes.values():
                await n.stop()

    run(main())


def test_flowls_member_takes_the_overlay_link_key(capsys) -> None:  # type: ignore[no-untyped-def]
    """An LS member is a router: --link-key gives it the overlay's key, so it links to routers
    that require authenticated links; without it those routers refuse it."""
    from flowls import LocationServiceConfig, member_config
    from flowls.service import main as flowls_main

    async def main() -> None:
        gate = RouterNode(NodeConfig("gate", listen="127.0.0.1:0", link_keys={"app": KEY}))
        await gate.start()
        members = []
        try:
            for name, key in (("keyed", ("app", KEY)), ("keyless", None)):
                cfg = member_config(LocationServiceConfig(
                    name=name, lsids=frozenset({LSID}), listen="127.0.0.1:0",
                    peers=[PeerConfig(addr(gate), "gate")], link_key=key))
                node = RouterNode(cfg)
                await node.start()
                members.append(node)
            await asyncio.wait_for(gate.wait_routes(LSID), 15)
            await until(lambda: gate.core.counters["auth.refused.missing-credentials"] >= 1,
                        what="the keyless member to be refused")
            linked = {lk["peer"] for lk in gate.status()["links"] if lk["state"] == "up"}
            assert "keyed" in linked and "keyless" not in linked
        finally:
            for n in members:
                await n.stop()
            await gate.stop()

    run(main())
    with pytest.raises(SystemExit):
        flowls_main(["run", "--name", "m", "--lsid", "0x10", "--link-key", f"app:{KEY}"])
    err = capsys.readouterr().err
    assert "not accepted on the command line" in err and KEY[4:] not in err


def test_flowlib_presents_capabilities_given_to_connect(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """connect(capabilities=[...]) picks, per flow, the token that covers it for this
    client's name; tokens for other flows or other subjects are not presented."""
    from flowlib.credentials import write_record_file
    from flowrouter.wire.capabilities import Capability, Policy

    key = CreatorKey.generate()
    flow, other = key.flow(LSID, 21), key.flow(LSID, 22)
    now = time.time()
    mine = write_record_file(tmp_path / "mine.cap", Capability.issue(
        key, flow, "rx", join=[40], now=now))
    not_mine = Capability.issue(key, flow, "someone-else", join=[40], now=now)
    wrong_flow = Capability.issue(key, other, "rx", join=[40], now=now)
    with pytest.raises(ValueError, match="nothing.cap"):
        run(flowlib.connect(["127.0.0.1:1"], capabilities=[tmp_path / "nothing.cap"]))

    async def main() -> None:
        node = RouterNode(NodeConfig("gate", listen="127.0.0.1:0", default_lsid=LSID,
                                     core_lsids=frozenset({LSID})))
        await node.start()
        try:
            owner = await flowlib.connect([addr(node)], name="owner",
                                          state_dir=str(tmp_path))
            owner.publish_policy(Policy.issue(key, flow, version=1, now=now))
            await until(lambda: node.core.counters["policies.installed"] >= 1)
            async with await flowlib.connect([addr(node)], name="rx", state_dir=str(tmp_path),
                                             capabilities=[not_mine, wrong_flow]) as bare:
                with pytest.raises(flowlib.JoinRefused, match="missing|subject"):
                    await bare.listen(flow, [40])
            async with await flowlib.connect([addr(node)], name="rx", state_dir=str(tmp_path),
                                             capabilities=[wrong_flow, str(mine)]) as rx:
                lst = await rx.listen(flow, [40])
                await rx.unlisten(lst)
            await owner.close()
        finally:
            await node.stop()

    run(main())
