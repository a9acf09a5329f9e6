"""Chat origins bound to site keys (issue 26): attacks on the room flow as unit tests of the
IGO state machine on virtual time (flowchat.loopnet), plus the key files and the CLI.

Each attack is an attacker frame injected at a site: a listener of the room forging another
site's message (origin, incarnation, next sequence number), a forged duplicate sent ahead of
the real message, and a site that holds its own key forging another site's origin. In a
keyed room none is shown and the real message is; in a room without keys the forgery can
be shown (documented) but a conflicting second version is always reported, never dropped
silently as a duplicate."""

from __future__ import annotations

import os
import struct

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowchat import cli
from flowchat.igo import Conflict, DataMsg, IGOConfig, encode_data, room_tag
from flowchat.igo.wire import SIG_LEN, data_signed_bytes
from flowchat.loopnet import LoopNet
from flowchat.sitekeys import SiteKeys, load_site_keys, parse_public, public_hex

ABC = ("a", "b", "c")
CFG = IGOConfig(sites=ABC)
TAG = room_tag(CFG)
PRIVATE = {s: Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32)
           for i, s in enumerate(ABC)}
PUBLIC = {s: k.public_key() for s, k in PRIVATE.items()}


def keys(site: str) -> SiteKeys:
    return SiteKeys(site, PRIVATE[site], PUBLIC)


def keyed_net(**kw) -> LoopNet:
    return LoopNet(CFG, auth={s: keys(s) for s in ABC}, **kw)


def forged(net: LoopNet, origin: str, text: bytes, *, tx: str | None = None,
           signer: SiteKeys | None = None, seq: int | None = None) -> bytes:
    """The frame an attacker makes: *origin*'s current incarnation and next sequence number
    (what anyone listening to the room sees), optionally signed with *signer*'s key (a site
    forging another's origin with its own key)."""
    site = net.sites[origin]
    o = CFG.index(origin)
    n = site.seq + 1 if seq is None else seq
    d = DataMsg(o, site.inc, n, site.clock, net.now, 0, (), text)
    if signer is not None:
        d = d._replace(sig=signer.sign(data_signed_bytes(TAG, o, site.inc, n, site.clock,
                                                        net.now, (), text)))
    frame = encode_data(TAG, CFG.index(tx or origin), d)
    if signer is not None:
        frame += signer.sign(frame)
    return frame


def inject(net: LoopNet, at: str, frame: bytes, band: int | None = None) -> None:
    net.inject(at, band or CFG.data_band, frame)


def shown(net: LoopNet, site: str) -> list[tuple[str, bytes]]:
    return [(d.origin, d.payload) for d in net.log[site]]


def conflicts(net: LoopNet, site: str) -> list[Conflict]:
    return [e for e in net.events[site] if isinstance(e, Conflict)]


def test_a_keyed_room_delivers_everything_in_one_order_with_loss() -> None:
    net = keyed_net(seed=3, loss=0.2)
    for i in range(30):
        net.at(1.0 + i * 0.1, net.submit, ABC[i % 3])
    net.run_until(20.0)
    orders = {s: net.order(s) for s in ABC}
    assert len(orders["a"]) == 30 and orders["a"] == orders["b"] == orders["c"]
    # repairs resent other sites' messages with their origin's signature: all accepted
    assert sum(net.sites[s].counters["received.resent"] for s in ABC) > 0
    assert not any(k.startswith("auth.") for s in ABC for k in net.sites[s].counters)


@pytest.mark.parametrize("tx", ["a", "c"])
def test_a_listener_cannot_show_a_message_under_another_sites_origin(tx: str) -> None:
    net = keyed_net()
    net.run_until(1.0)
    # (long enough that the frame minus a would-be 64-byte trailer still parses: the
    # forgery reaches the signature check, not only the length check)
    text = b"forged by a listener, " * 4
    inject(net, "b", forged(net, "a", text, tx=tx))
    net.run_until(2.0)
    assert (("a", text)) not in shown(net, "b")
    assert net.sites["b"].counters["auth.bad-signature"] == 1
    net.submit("a", b"the real one")
    net.run_until(4.0)
    assert shown(net, "b") == [("a", b"the real one")]


def test_a_forged_duplicate_cannot_suppress_the_real_message() -> None:
    net = keyed_net()
    net.run_until(1.0)
    frame = forged(net, "a", b"forged first")
    for s in ("b", "c"):
        inject(net, s, frame)
    net.submit("a", b"real")
    net.run_until(4.0)
    for s in ("b", "c"):
        assert shown(net, s) == [("a", b"real")]
        assert net.sites[s].counters["data.duplicate"] == 0


def test_a_site_with_its_own_key_cannot_forge_another_sites_origin() -> None:
    net = keyed_net()
    net.run_until(1.0)
    # c signs the frame (valid transmitter signature) and the message (its own key)
    frame = forged(net, "a", b"c speaking as a", tx="c", signer=keys("c"))
    inject(net, "b", frame)
    net.run_until(2.0)
    assert shown(net, "b") == []
    assert net.sites["b"].counters["auth.bad-origin-signature"] == 1
    net.submit("a", b"real")
    net.run_until(4.0)
    assert shown(net, "b") == [("a", b"real")]


def test_without_keys_a_conflicting_second_version_is_reported_not_dropped_silently() -> None:
    """A room without keys cannot tell which version is genuine: the first stays shown, the
    other is counted and handed to the application (the server shows a warning)."""
    net = LoopNet(CFG)
    net.run_until(1.0)
    frame = forged(net, "a", b"forged first")
    inject(net, "b", frame)
    net.submit("a", b"real")
    net.run_until(4.0)
    assert shown(net, "b") == [("a", b"forged first")]  # what the README says can happen
    reports = conflicts(net, "b")
    assert [(c.origin, c.seq, c.kept, c.other) for c in reports] == \
        [("a", 1, b"forged first", b"real")]
    assert net.sites["b"].counters["conflict.data"] == 1
    # the site whose name was used learns of it too (the forgery reached it)
    inject(net, "a", frame)
    assert [(c.kept, c.other) for c in conflicts(net, "a")] == [(b"real", b"forged first")]
    # genuine duplicates (resends, echoes) are no conflict
    assert net.sites["c"].counters["conflict.data"] == 0


def test_without_keys_a_forgery_waiting_behind_a_gap_is_reported_too() -> None:
    net = LoopNet(CFG)
    net.run_until(1.0)
    inject(net, "b", forged(net, "a", b"forged #2", seq=2))  # held beyond the gap
    net.submit("a", b"one")
    net.submit("a", b"two")
    net.run_until(4.0)
    assert [(c.seq, c.kept, c.other) for c in conflicts(net, "b")] == \
        [(2, b"forged #2", b"two")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_mutation_of_a_signed_frame_is_shown_as_something_else(data) -> None:
    """Any change to a genuine frame (any byte, any length) is refused in a keyed room:
    what a site shows under an origin is exactly what the origin signed."""
    net = keyed_net(sites=("a", "b"))
    net.run_until(0.5)
    captured: list[bytes] = []
    a = net.sites["a"]
    for act in a.submit(b"genuine words", net.now):
        if getattr(act, "kind", "") == "data":
            captured.append(act.payload)
    frame = bytearray(captured[0])
    how = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if how == "flip":
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        frame = frame[:data.draw(st.integers(0, len(frame) - 1))]
    else:
        frame += data.draw(st.binary(min_size=1, max_size=80))
    inject(net, "b", bytes(frame))
    net.run_until(1.0)
    assert all(p == b"genuine words" for o, p in shown(net, "b") if o == "a")
    assert not [x for x in shown(net, "b") if x[0] != "a"]


@settings(max_examples=60, deadline=None)
@given(origin=st.sampled_from(["a", "c"]), tx=st.sampled_from(ABC), seq=st.integers(1, 5),
       sig=st.binary(min_size=SIG_LEN, max_size=SIG_LEN), trailer=st.binary(max_size=70),
       signer=st.sampled_from([None, "b", "c"]))
def test_no_forged_data_frame_is_shown_in_a_keyed_room(origin, tx, seq, sig, trailer,
                                                       signer) -> None:
    net = keyed_net(sites=("b",))
    o = CFG.index(origin)
    d = DataMsg(o, 1000 + o, seq, 0, 0.0, 0, (), b"forged", sig)
    frame = encode_data(TAG, CFG.index(tx), d)
    frame += keys(signer).sign(frame) if signer else trailer
    inject(net, "b", frame)
    net.run_until(1.0)
    assert shown(net, "b") == []


def test_key_files_and_keygen(tmp_path, capsys) -> None:
    out = tmp_path / "a.key"
    assert cli.main(["keygen", "--site", "a", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("a ") and len(line.split()[1]) == 64
    assert os.stat(out).st_mode & 0o077 == 0  # private
    assert cli.main(["keygen", "--site", "a", "--out", str(out)]) != 0  # never overwrites
    pub = tmp_path / "room.keys"
    pub.write_text(f"# the room's sites\n{line}\nb {public_hex(PRIVATE['b'])}\n")
    k = load_site_keys("a", out, pub)
    assert k.verify("a", b"x", k.sign(b"x")) and not k.verify("b", b"x", k.sign(b"x"))
    with pytest.raises(ValueError, match="not this site's key"):
        load_site_keys("b", out, pub)
    raw = tmp_path / "b.hex"
    raw.write_text((bytes([2]) * 32).hex())
    assert load_site_keys("b", raw, pub).sign(b"y") == PRIVATE["b"].sign(b"y")
    for bad in ("a", "a zz", f"a {'00' * 31}", f"{line}\n{line}"):
        with pytest.raises(ValueError):
            parse_public(bad)
    with pytest.raises(ValueError, match="no public key for site"):
        k.check_sites(["a", "b", "c"])


def test_server_options_make_a_keyed_room(tmp_path, capsys) -> None:
    (tmp_path / "a.key").write_text((bytes([1]) * 32).hex())
    (tmp_path / "room.keys").write_text(
        "".join(f"{s} {public_hex(PRIVATE[s])}\n" for s in ABC))
    base = ["server", "--site", "a", "--sites", "a,b,c", "--router", "127.0.0.1:1"]
    a = cli.build_parser().parse_args(base + ["--site-key", str(tmp_path / "a.key"),
                                              "--site-keys", str(tmp_path / "room.keys")])
    srv = cli.make_server(a)
    assert srv.auth is not None and srv.auth.verify("a", b"m", PRIVATE["a"].sign(b"m"))
    with pytest.raises(ValueError, match="both"):
        cli.make_server(cli.build_parser().parse_args(
            base + ["--site-key", str(tmp_path / "a.key")]))
    assert cli.make_server(cli.build_parser().parse_args(base)).auth is None
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["server", "--help"])
    text = capsys.readouterr().out
    assert "--site-key" in text and "--site-keys" in text and "keyed room" in text


def test_decode_of_signed_data_round_trips() -> None:
    d = DataMsg(0, 7, 1, 2, 3.0, 0, ((1, 9, 4),), b"hi", b"s" * SIG_LEN)
    frame = encode_data(TAG, 0, d)
    from flowchat.igo import decode
    _, _, got = decode(frame, TAG, 3)
    assert got == d._replace(flags=4)
    assert struct.unpack_from("!B", frame, 9 + 37)[0] == 4  # after the view (8)


# ------------------------------------------------------------------ on a real router
def _room(tmp_path, keyed: bool):
    import asyncio

    import flowlib
    from flowchat.client import ChatClient
    from flowchat.server import ChatServer
    from flowrouter.net.config import NodeConfig
    from flowrouter.net.runtime import RouterNode

    fast = {"heartbeat_interval": 0.25, "missed_heartbeats": 3, "disconnect_interval": 3.0}

    async def main() -> tuple[list[tuple[str, str]], list[str], int]:
        node = RouterNode(NodeConfig("r", listen="127.0.0.1:0", default_lsid=0x10,
                                     core_lsids=frozenset({0x10})))
        await node.start()
        where = "%s:%d" % node.tcp_address
        srv = {s: ChatServer(s, [where], sites=ABC, room="trust", listen="127.0.0.1:0",
                             use_directory=False, state_dir=str(tmp_path / s),
                             auth=keys(s) if keyed else None, **fast) for s in ABC}
        attacker = None
        try:
            for x in srv.values():
                await x.start()
            loop = asyncio.get_running_loop()
            while not all(len(x.igo.ordering.members) == 3 for x in srv.values()):
                assert loop.time() < 30
                await asyncio.sleep(0.02)
            client = await ChatClient.connect("%s:%d" % srv["b"].address[:2], "bob")
            seen: list[tuple[str, str]] = []
            notices: list[str] = []

            async def read() -> None:
                async for ev in client:
                    if ev["ev"] == "msg":
                        seen.append((ev["site"], ev["text"]))
                    elif ev["ev"] == "notice":
                        notices.append(ev["text"])

            reader = asyncio.ensure_future(read())
            # a listener of the room: it sees a's incarnation and next number on the flow
            attacker = await flowlib.connect([where], name="eavesdropper")
            a = srv["a"].igo.ordering
            from flowchat.protocol import SAY, encode_chat
            text = encode_chat(SAY, "alice", "forged: transfer the funds")
            n = a.seq + 1
            frame = encode_data(room_tag(a.cfg), 0, DataMsg(0, a.inc, n, a.clock, 0.0, 0, (),
                                                            text))
            attacker.send_nowait(srv["a"].flow, frame, band=a.cfg.data_band)
            await asyncio.sleep(0.5)
            srv["a"].submit(SAY, "alice", "the real words")
            deadline = loop.time() + 15
            while not (("a", "the real words") in seen or
                       any("two different messages" in t for t in notices)):
                assert loop.time() < deadline, (seen, notices)
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            reader.cancel()
            await client.close()
            return seen, notices, srv["b"].conflicts
        finally:
            if attacker is not None:
                await attacker.close()
            for x in srv.values():
                await x.stop()
            await node.stop()

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_on_a_router_a_keyed_room_shows_the_real_message_not_the_forgery(tmp_path) -> None:
    seen, notices, conflicts_seen = _room(tmp_path, keyed=True)
    assert ("a", "the real words") in seen
    assert not [t for o, t in seen if t.startswith("forged")]
    assert conflicts_seen == 0


def test_on_a_router_a_room_without_keys_warns_its_users_of_the_forgery(tmp_path) -> None:
    seen, notices, conflicts_seen = _room(tmp_path, keyed=False)
    assert ("a", "forged: transfer the funds") in seen  # documented: unkeyed rooms are open
    assert conflicts_seen == 1
    assert any("two different messages claim to be a #" in t and "the real words" in t
               for t in notices)


FRAME_KINDS = st.sampled_from(["heartbeat", "nack", "gone", "order", "data"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=FRAME_KINDS, tx=st.sampled_from(["a", "c"]), inc=st.integers(1, 2**64 - 1),
       n=st.integers(1, 2**32 - 1), trailer=st.binary(max_size=SIG_LEN + 8),
       wrong_signer=st.booleans())
def test_no_frame_of_any_kind_without_its_transmitters_signature_is_believed(
        kind, tx, inc, n, trailer, wrong_signer) -> None:
    """Heartbeats (a restart, a high sequence number), repair requests, GONE answers and
    ORDER records in a site's name change nothing at a keyed site unless that site signed
    them: each is counted as refused and nothing else happens."""
    from flowchat.igo import (
        BAND_HEARTBEAT,
        BAND_ORDER,
        BAND_REPAIR,
        Gone,
        Heartbeat,
        Nack,
        Order,
        encode_gone,
        encode_heartbeat,
        encode_nack,
        encode_order,
    )

    cfg = IGOConfig(sites=ABC, mode="leader", leader="a")
    tag = room_tag(cfg)
    net = LoopNet(cfg, sites=("b",), auth={"b": keys("b")})
    net.run_until(0.5)
    before = dict(net.sites["b"].counters)
    t = CFG.index(tx)
    frame, band = {
        "heartbeat": (lambda: encode_heartbeat(tag, t, Heartbeat(inc, n, n, 7, n, 0,
                                                                 (n, n, n))), BAND_HEARTBEAT),
        "nack": (lambda: encode_nack(tag, t, Nack(1, 0, 0, ((1, 5),), inc)), BAND_REPAIR),
        "gone": (lambda: encode_gone(tag, t, Gone(1, t, n, inc)), BAND_REPAIR),
        "order": (lambda: encode_order(tag, t, Order(inc, 7, 1, ((t, inc, 1, 0),))),
                  BAND_ORDER),
        "data": (lambda: encode_data(tag, t, DataMsg(t, inc, 1, n, 0.0, 0, (), b"x")),
                 cfg.data_band),
    }[kind]
    body = frame()
    body += keys("c" if tx == "a" else "a").sign(body) if wrong_signer else trailer
    net.inject("b", band, body)
    after = net.sites["b"].counters
    changed = {k for k in after if after[k] != before.get(k, 0)}
    # refused for its signature, or (a trailer cut into the frame) as malformed
    assert changed and all(k == "auth.bad-signature" or k.startswith("malformed.")
                           for k in changed)
    assert net.log["b"] == []
    peers = net.sites["b"].status()["peers"]
    assert all(p["state"] != "S1" for p in peers.values())  # no peer is alive on a forgery


@pytest.mark.parametrize("mode", ["hasten", "leader"])
def test_without_keys_every_mode_reports_a_conflict_at_every_site(mode: str) -> None:
    cfg = IGOConfig(sites=ABC, mode=mode, leader="a" if mode == "leader" else None)
    net = LoopNet(cfg)
    net.run_until(1.0)
    c = net.sites["c"]
    frame = encode_data(room_tag(cfg), 2, DataMsg(2, c.inc, c.seq + 1, c.clock, net.now, 0,
                                                  (), b"forged"))
    for s in ("a", "b"):
        net.inject(s, cfg.data_band, frame)
    net.submit("c", b"real")
    net.run_until(5.0)
    for s in ABC:  # the two receivers, and c, which heard its own words forged
        net.inject(s, cfg.data_band, frame)
        assert [(x.origin, x.seq) for x in conflicts(net, s)][:1] == [("c", 1)], s
        assert net.sites[s].counters["conflict.data"] >= 1
