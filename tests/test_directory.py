"""The directory service: matcher and protocol units, then members and clients on real
routers over loopback (register/lookup/remove across four routers, expanding ring, expiry,
a member dying, malformed queries) and the flowdir CLI against a running overlay."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowlib
from flowdir import (
    DirectoryClient,
    DirectoryMember,
    Entry,
    EntryStore,
    NoDirectoryMember,
    Pattern,
    ProtocolError,
    directory_flow,
    expanding_rings,
    glob_match,
)
from flowdir import protocol as P
from flowdir.cli import main as flowdir_main
from flowrouter.net.runtime import RouterNode
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import Locality

from .checkout import PYTHONPATH
from .rawep import addr, chain, within

LSID = 0x10
REPO = Path(__file__).resolve().parents[1]
FAST = {"window": 0.25, "settle": 0.05}


def overlay(n: int, geography: int = 0) -> contextlib.AbstractAsyncContextManager[
        list[RouterNode]]:
    """Routers r1 - ... - rN on loopback, rN the core of LSID 0x10, every router suggesting
    that LSID. Each ri dials r(i+1) and that direction costs *geography* (the way queries
    travel toward the core)."""
    return chain(n, LSID, geography=geography, default_lsid=LSID)


async def eventually(check: Callable[[], Awaitable[bool]] | Callable[[], bool],
                     timeout: float = 5.0, what: str = "condition") -> None:
    """Poll *check* until it holds, failing after *timeout* (never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def run(coro_fn: Callable[[], Awaitable[None]], timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), timeout))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- units
@pytest.mark.parametrize("pattern,text,expected", [
    ("vnc-*", "vnc-1", True), ("vnc-*", "vnc-", True), ("vnc-*", "vn", False),
    ("*", "", True), ("", "", True), ("", "a", False), ("?", "", False), ("?", "é", True),
    ("a*b*c", "axxbyyc", True), ("a*b*c", "axxbyy", False), ("*.*", "a.b.c", True),
    ("a?c", "abc", True), ("a?c", "ac", False), ("**a", "a", True),
    ("\\*", "*", True), ("\\*", "x", False), ("a\\?", "a?", True), ("a\\?", "ab", False),
    ("VNC-*", "vnc-1", False),
])
def test_glob_examples(pattern: str, text: str, expected: bool) -> None:
    assert glob_match(pattern, text) is expected


_ALPHABET = st.text(alphabet="ab*?.", max_size=12)


@settings(max_examples=400, deadline=None)
@given(pattern=_ALPHABET, text=st.text(alphabet="ab.", max_size=12))
def test_glob_agrees_with_fnmatchcase(pattern: str, text: str) -> None:
    # Without [ ] and \ the two languages coincide, so fnmatch is an independent oracle.
    assert glob_match(pattern, text) is fnmatch.fnmatchcase(text, pattern)


@settings(max_examples=200, deadline=None)
@given(name=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF,
                                  blacklist_characters="*?\\\x7f"), min_size=1, max_size=40))
def test_a_name_matches_itself_and_star(name: str) -> None:
    assert glob_match(name, name)
    assert glob_match("*", name)
    assert glob_match(name[0] + "*", name)


def test_pattern_fields_exact_or_wildcard() -> None:
    flow = FlowID(0xA1, LSID, 7)
    e = Entry("printer-2", flow, "flow", ("floor-3", "color"), owner="alice", ttl=30)
    assert e.as_tuple() == ("printer-2", str(flow), "flow", "floor-3", "color")
    assert Pattern("printer-?").matches(e)
    assert Pattern("*", flow="a1:10:7").matches(e)          # unpadded FlowID text is fine
    assert not Pattern("*", flow="a1:10:8").matches(e)
    assert Pattern("*", kind="flow", owner="alice").matches(e)
    assert not Pattern("*", kind="ls").matches(e)
    assert not Pattern("*", owner="bob").matches(e)
    assert Pattern("*", attrs=("floor-3",)).matches(e)      # prefix of the attributes
    assert Pattern("*", attrs=("*", "color")).matches(e)
    assert not Pattern("*", attrs=("*", "mono")).matches(e)
    assert not Pattern("*", attrs=("*", "*", "*")).matches(e)


def test_protocol_round_trip_and_clear_errors() -> None:
    flow = FlowID(0xA1, LSID, 7)
    e = Entry("vnc-1", flow, attrs=("x",), owner="o", ttl=12.5, scoped=True)
    assert P.decode(P.encode(P.Register((e,)))) == P.Register((e,))
    q = P.Query("abc", FlowID(1, 2, 3), Pattern("v*", kind="flow"), ring=4, empty=True)
    assert P.decode(P.encode(q), expect="query") == q
    rm = P.Remove("vnc-1", "*", str(flow), "o")
    assert P.decode(P.encode(rm)) == rm
    parts = list(P.encode_replies("q", "m1", [(e, 3.0)] * 50, 2, 1000))
    assert len(parts) > 1 and all(len(b) <= 1000 for b in parts)
    got = [m for b in parts
           for m in P.decode(b, expect="reply").matches]  # type: ignore[union-attr]
    assert got == [(e, 3.0)] * 50
    assert directory_flow(LSID) == FlowID(0xD1EC7044, LSID, 0)
    assert expanding_rings(1, 32) == [1, 2, 4, 8, 16, 32]
    assert expanding_rings(1, 6) == [1, 2, 4, 6]
    assert expanding_rings(0, 3) == [0, 1, 2, 3]

    def error(payload: bytes, expect: str | None = None) -> str:
        with pytest.raises(ProtocolError) as info:
            P.decode(payload, expect=expect)
        return str(info.value)

    assert "not UTF-8" in error(b"\xff\x00garbage")
    assert "not JSON" in error(b"{garbage")
    assert "version 2" in error(b'{"v":2,"op":"query"}')
    assert "unknown op" in error(b'{"v":1,"op":"frobnicate"}')
    assert "on the query band" in error(P.encode(P.Register((e,))), expect="query")
    bad = json.loads(P.encode(q))
    bad["pattern"]["name"] = 5
    assert "pattern.name must be a string" in error(json.dumps(bad).encode())
    bad = json.loads(P.encode(q))
    bad["reply"] = "zz:1"
    assert "reply" in error(json.dumps(bad).encode())
    reg = json.loads(P.encode(P.Register((e,))))
    reg["entries"][0]["ttl"] = -1
    assert "entries[0]: ttl must be" in error(json.dumps(reg).encode())
    reg["entries"][0].update(ttl=1, name="bad*name")
    assert "must not contain" in error(json.dumps(reg).encode())
    with pytest.raises(ProtocolError):
        Entry("x", flow, kind="Not A Kind")


def test_entry_store_expires_with_an_injected_clock() -> None:
    now = [100.0]
    store = EntryStore(clock=lambda: now[0], max_entries=2)
    a = Entry("a", FlowID(1, LSID, 1), ttl=10)
    b = Entry("b", FlowID(1, LSID, 2), ttl=5)
    assert store.put(a) == "added" and store.put(b) == "added"
    assert store.put(Entry("c", FlowID(1, LSID, 3))) == "refused"     # full
    now[0] += 4
    assert store.put(a) == "refreshed"                                 # a now lives to 114
    assert store.put(Entry("a", a.flow, attrs=("new",), ttl=10)) == "updated"
    now[0] += 2                                                        # b expired at 105
    assert [e.name for e, _ in store.match(Pattern())] == ["a"]        # never served stale
    assert [e.name for e in store.sweep()] == ["b"]
    assert store.put(Entry("c", FlowID(1, LSID, 3))) == "added"        # room again
    assert [e.attrs for e, _ in store.match(Pattern("a"))] == [("new",)]  # exact: indexed
    now[0] += 9
    assert [e.name for e in store.sweep()] == ["a"]
    assert store.match(Pattern("a")) == [] and len(store) == 1
    assert [e.name for e in store.remove(P.Remove("c"))] == ["c"] and len(store) == 0
    # one name, two flows: removal by flow takes one, by name alone takes the rest
    store.put(Entry("n", FlowID(1, LSID, 1)))
    store.put(Entry("n", FlowID(1, LSID, 2)))
    assert len(store.match(Pattern("n"))) == 2
    assert [e.flow.local for e in store.remove(P.Remove("n", flow="1:10:2"))] == [2]
    assert [e.flow.local for e, _ in store.match(Pattern("n"))] == [1]
    assert len(store.remove(P.Remove("n"))) == 1 and len(store) == 0


# ----------------------------------------------------------------------------- overlays
def test_register_lookup_remove_across_four_routers(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Members on r1 and r3, clients on r2 and r4; a watcher on r1; a member joining late
    catches up from the others (but not with scoped entries)."""
    sd = str(tmp_path)

    async def main() -> None:
        async with overlay(4) as (r1, r2, r3, r4):
            m1 = await DirectoryMember.connect(addr(r1), name="m1", state_dir=sd, sync=False)
            m3 = await DirectoryMember.connect(addr(r3), name="m3", state_dir=sd, sync=False)
            owner = await DirectoryClient.connect(addr(r4), name="svc", state_dir=sd)
            asker = await DirectoryClient.connect(addr(r2), name="asker", state_dir=sd)
            watcher_client = await DirectoryClient.connect(addr(r1), name="w", state_dir=sd)
            watcher = watcher_client.watch("vnc-*")
            await watcher.start()
            try:
                vnc1, vnc2, lsflow = (FlowID(0xA1, LSID, i) for i in (1, 2, 3))
                await owner.register("vnc-1", vnc1, 30, attrs=("host-a",))
                await owner.register("vnc-2", vnc2, 30)
                await owner.register_ls(LSID, lsflow, 30)
                # a scoped entry: only members within 2 hops of r4 (m3) store it
                await owner.register("local-only", vnc1, 30, scope=2)

                res = await asker.lookup("vnc-*", **FAST)
                assert sorted(map(str, res.flows)) == sorted([str(vnc1), str(vnc2)])
                # r2's first ring reaches only r2; the second reaches r1 and r3 together
                assert res.rings == [1, 2] and res.ring == 2
                assert all(set(m.members) == {"m1", "m3"} for m in res)
                assert res.matches[0].entry.owner == "svc"
                assert res.matches[0].entry.attrs == ("host-a",)

                ls = await asker.lookup(f"{LSID:#x}", kind="ls", **FAST)
                assert ls.flows == [lsflow]
                scoped = await asker.lookup("local-only", **FAST)
                assert [m.members for m in scoped] == [("m3",)]
                by_attr = await asker.lookup("*", attrs=("host-a",), **FAST)
                assert by_attr.flows == [vnc1]

                listed = await asker.list(window=0.4)
                assert {m.entry.name for m in listed} == {"vnc-1", "vnc-2", "0x10",
                                                          "local-only"}

                # removal by someone else's client (no authentication yet, as in the seed)
                await asker.remove("vnc-1")
                await eventually(lambda: not m1.entries("vnc-1") and not m3.entries("vnc-1"),
                                 what="vnc-1 removed at both members")
                res = await asker.lookup("vnc-*", **FAST)
                assert res.flows == [vnc2]

                changes = [await within(anext(watcher)) for _ in range(3)]
                assert [(c.event, c.name) for c in changes] == [
                    ("added", "vnc-1"), ("added", "vnc-2"), ("removed", "vnc-1")]

                # a member that joins late asks the others for what they hold
                m2 = await DirectoryMember.connect(addr(r2), name="m2", state_dir=sd,
                                                   sync_window=0.5)
                await within(m2.synced.wait())
                assert {e.name for e, _ in m2.entries()} == {"vnc-2", "0x10"}
                assert m2.stats["entries.synced"] == 2
                await m2.stop()
            finally:
                await watcher.close()
                for c in (owner, asker, watcher_client):
                    await c.close()
                await m1.stop()
                await m3.stop()
    run(main)


@pytest.mark.parametrize("ring_type", [Locality.NONE, Locality.GEOGRAPHY],
                         ids=["ttl", "geography"])
def test_expanding_ring_finds_the_nearest_entry_first_and_stops(
        tmp_path, ring_type) -> None:  # type: ignore[no-untyped-def]
    """The same name at a near member (r2) and a far one (r4); a lookup from r1 finds the
    near one and never queries the far member. Rings are TTLs (hops) or geography budgets
    (each link toward the core costs 1)."""
    sd = str(tmp_path)
    geo = ring_type is Locality.GEOGRAPHY

    async def main() -> None:
        async with overlay(4, geography=1 if geo else 0) as (r1, r2, r3, r4):
            near = await DirectoryMember.connect(addr(r2), name="near", state_dir=sd,
                                                 sync=False)
            far = await DirectoryMember.connect(addr(r4), name="far", state_dir=sd,
                                                sync=False)
            near_owner = await DirectoryClient.connect(addr(r2), name="near-svc", state_dir=sd)
            far_owner = await DirectoryClient.connect(addr(r4), name="far-svc", state_dir=sd)
            asker = await DirectoryClient.connect(addr(r1), name="asker", state_dir=sd)
            try:
                near_flow, far_flow = FlowID(0xB1, LSID, 1), FlowID(0xB2, LSID, 1)
                # scope 1: stored only by the members on the owner's own router
                await near_owner.register("printer", near_flow, 30, scope=1)
                await far_owner.register("printer", far_flow, 30, scope=1)
                await eventually(lambda: near.entries("printer") and far.entries("printer"),
                                 what="both registrations stored")
                assert [e.flow for e, _ in near.entries()] == [near_flow]
                assert [e.flow for e, _ in far.entries()] == [far_flow]

                res = await asker.lookup("printer", ring_type=ring_type, **FAST)
                assert res.flows == [near_flow]
                assert res.matches[0].members == ("near",)
                if geo:   # budget 1 already reaches r2 (r1 -> r2 costs 1)
                    assert res.rings == [1] and res.ring == 1
                else:     # TTL 1 is r1's own applications; TTL 2 reaches r2
                    assert res.rings == [1, 2] and res.ring == 2
                assert asker.stats["queries.sent"] == len(res.rings)
                assert near.stats["queries"] == 1
                assert far.stats["queries"] == 0        # the far ring was never queried

                # without the near entry, the rings widen until the far member answers
                await near_owner.remove("printer", scope=1)
                await eventually(lambda: not near.entries("printer"), what="near removed")
                res = await asker.lookup("printer", ring_type=ring_type, **FAST)
                assert res.flows == [far_flow] and res.matches[0].members == ("far",)
                assert res.rings == [1, 2, 4] and res.ring == 4
                assert far.stats["queries"] == 1
            finally:
                for c in (near_owner, far_owner, asker):
                    await c.close()
                await near.stop()
                await far.stop()
    run(main)


def test_entries_expire_unless_refreshed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sd = str(tmp_path)

    async def main() -> None:
        async with overlay(2) as (r1, r2):
            member = await DirectoryMember.connect(addr(r2), name="m", state_dir=sd,
                                                   sync=False, sweep_interval=0.1)
            client = await DirectoryClient.connect(addr(r1), name="c", state_dir=sd)
            watch_client = await DirectoryClient.connect(addr(r1), name="w", state_dir=sd)
            watcher = watch_client.watch("tmp-*")
            await watcher.start()
            loop = asyncio.get_running_loop()
            # A window and a ttl a loaded machine can keep: the member must answer the first
            # lookup before the entry expires, and within the window.
            quick = {"rings": [2], "window": 1.0, "settle": 0.02}
            try:
                short = FlowID(0xC1, LSID, 1)
                t0 = loop.time()
                await client.register("tmp-short", short, ttl=2.0)
                assert (await client.lookup("tmp-short", **quick)).flows == [short]

                async def gone() -> bool:
                    return not await client.lookup("tmp-short", **quick)
                await eventually(gone, what="tmp-short to expire")
                assert loop.time() - t0 >= 1.95
                await eventually(lambda: member.stats["entries.expired"] >= 1,
                                 what="the member's sweep")
                events = [await within(anext(watcher)) for _ in range(2)]
                assert [(c.event, c.name) for c in events] == [("added", "tmp-short"),
                                                              ("expired", "tmp-short")]

                # a kept registration outlives its ttl many times over
                kept = FlowID(0xC1, LSID, 2)
                reg = await client.register("tmp-kept", kept, ttl=0.5, keep=True)
                await eventually(lambda: reg.refreshes >= 4, what="four refreshes")
                assert (await client.lookup("tmp-kept", **quick)).flows == [kept]
                assert member.stats["entries.refreshed"] >= 3
                # its owner stops refreshing (as if it died): it expires by itself
                await reg.cancel(remove=False)

                async def kept_gone() -> bool:
                    return not await client.lookup("tmp-kept", **quick)
                await eventually(kept_gone, what="tmp-kept to expire")
            finally:
                await watcher.close()
                await client.close()
                await watch_client.close()
                await member.stop()
    run(main)


def test_a_dead_member_does_not_break_lookups(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """m1 is a real `flowdir serve` process, killed with SIGKILL (no goodbye on its link);
    lookups carry on with m3, and once no member is left the client is told so."""
    sd = str(tmp_path)

    async def main() -> None:
        async with overlay(3) as (r1, r2, r3):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "flowdir", "serve", "--router", addr(r1),
                "--member-name", "m1", "--no-sync", "--state-dir", sd,
                cwd=str(REPO), env={**os.environ, "PYTHONPATH": PYTHONPATH},
                stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL)
            m3 = await DirectoryMember.connect(addr(r3), name="m3", state_dir=sd, sync=False)
            client = await DirectoryClient.connect(addr(r2), name="c", state_dir=sd)
            try:
                assert proc.stderr is not None
                line = await within(proc.stderr.readline())
                assert b"member m1 serving directory" in line, line
                flow = FlowID(0xD1, LSID, 1)
                await client.register("db", flow, 30)
                res = await client.lookup("db", **FAST)
                assert set(res.matches[0].members) == {"m1", "m3"}
                proc.kill()
                await within(proc.wait())
                res = await client.lookup("db", **FAST)
                assert res.flows == [flow] and res.matches[0].members == ("m3",)
                await m3.stop()
                with pytest.raises(NoDirectoryMember, match="no directory member answered"):
                    await client.lookup("db", max_ring=4, **FAST)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                await client.close()
                await m3.stop()
    run(main)


def test_malformed_queries_get_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sd = str(tmp_path)

    async def main() -> None:
        async with overlay(2) as (r1, r2):
            member = await DirectoryMember.connect(addr(r2), name="m", state_dir=sd,
                                                   sync=False)
            raw = await flowlib.connect(addr(r1), name="raw", state_dir=sd)
            client = DirectoryClient(raw)
            try:
                reply = await raw.create()
                replies = await raw.listen(reply, P.BAND_REPLY)
                good = json.loads(P.encode(P.Query("q1", reply, Pattern("x*"))))

                async def ask(body: bytes) -> P.Reply:
                    await raw.send(client.flow, body, band=P.BAND_QUERY)
                    msg = P.decode((await within(replies.get())).payload, expect="reply")
                    assert isinstance(msg, P.Reply)
                    return msg

                bad = dict(good, pattern={"name": 5})
                ans = await ask(json.dumps(bad).encode())
                assert ans.op == "error" and ans.qid == "q1" and ans.member == "m"
                assert "malformed query: pattern.name must be a string" in (ans.error or "")
                ans = await ask(json.dumps(dict(good, v=7, qid="q2")).encode())
                assert ans.qid == "q2" and "unsupported directory protocol version 7" \
                    in (ans.error or "")
                ans = await ask(json.dumps(dict(good, ring="far", qid="q3")).encode())
                assert "ring must be an integer" in (ans.error or "")
                # no usable reply flow: nobody to tell, so counted (and logged)
                await raw.send(client.flow, b"\x00not json", band=P.BAND_QUERY)
                await raw.send(client.flow, b'{"v":1,"op":"register","entries":[{}]}',
                               band=P.BAND_REGISTER)
                await eventually(lambda: member.stats["malformed.unanswerable"] == 1
                                 and member.stats["malformed.register"] == 1,
                                 what="malformed messages counted")
                assert member.stats["malformed.query"] == 4
                # a bad pattern never leaves the client
                with pytest.raises(ProtocolError, match="kind must be"):
                    await client.lookup("x", kind="Not A Kind")
                # and the member still serves
                await client.register("x-1", FlowID(0xE1, LSID, 1), 30)
                assert len(await client.lookup("x-*", **FAST)) == 1
            finally:
                await client.close()
                await raw.close()
                await member.stop()
    run(main)


def test_flowdir_cli(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    sd = str(tmp_path)

    async def main() -> None:
        async with overlay(2) as (r1, r2):
            member = await DirectoryMember.connect(addr(r2), name="m-cli", state_dir=sd,
                                                   sync=False)
            base = ["--router", "127.0.0.1:1", "--router", addr(r1), "--state-dir", sd]
            fast = ["--window", "0.25", "--max-ring", "2"]

            async def flowdir(*args: str) -> tuple[int, str, str]:
                rc = await asyncio.to_thread(flowdir_main, [*args[:1], *base, *args[1:]])
                out, err = capsys.readouterr()
                return rc, out, err

            flow = "a1:10:5"
            try:
                rc, out, err = await flowdir("register", "printer-1", flow, "--ttl", "30",
                                             "--attr", "floor-3")
                assert rc == 0, err
                assert "registered printer-1 -> 00000000000000a1:00000010:00000005" in out
                assert "stored by m-cli" in out

                rc, out, err = await flowdir("lookup", "printer-*", *fast)
                assert rc == 0, err
                header, row = out.splitlines()
                assert header.split()[:3] == ["NAME", "KIND", "FLOW"]
                assert row.split()[:3] == ["printer-1", "flow", str(FlowID.parse(flow))]
                assert "m-cli" in row and "floor-3" in row
                assert header.index("FLOW") == row.index(str(FlowID.parse(flow)))  # aligned

                rc, out, err = await flowdir("lookup", "printer-?", "--json", *fast)
                assert rc == 0, err
                doc = json.loads(out)
                assert [(m["name"], m["flow"], m["members"]) for m in doc["matches"]] == [
                    ("printer-1", str(FlowID.parse(flow)), ["m-cli"])]
                assert doc["directory"] == str(directory_flow(LSID))

                rc, out, err = await flowdir("lookup", "scanner*", *fast)
                assert rc == 1 and out == "" and "0 match(es)" in err

                rc, out, err = await flowdir("list", "--json", "--window", "0.3")
                assert rc == 0 and len(json.loads(out)["matches"]) == 1

                rc, out, err = await flowdir("remove", "printer-1", "--window", "0.3")
                assert rc == 0 and "removed printer-1" in out and "m-cli" in out
                rc, out, err = await flowdir("remove", "printer-1", "--window", "0.3")
                assert rc == 1 and "nothing is registered under 'printer-1'" in err
                rc, out, err = await flowdir("lookup", "printer-*", *fast)
                assert rc == 1

                rc, out, err = await flowdir("lookup", "x", "--flow", "nonsense")
                assert rc == 64 and "bad FlowID" in err

                await member.stop()
                rc, out, err = await flowdir("lookup", "printer-*", *fast)
                assert rc == 2 and "no directory member answered" in err
                rc, out, err = await flowdir("register", "p", flow, "--window", "0.3")
                assert rc == 2 and "no directory member answered" in err
            finally:
                await member.stop()
            rc = await asyncio.to_thread(flowdir_main, ["--router", "127.0.0.1:1",
                                                        "lookup", "x"])
            err = capsys.readouterr().err
            assert rc == 2 and "could not connect to a flow router" in err
            assert "127.0.0.1:1" in err
    run(main)
    assert flowdir_main(["--help"]) == 0
    assert "exit codes" in capsys.readouterr().out
    assert flowdir_main(["register", "--help"]) == 0
    assert "--keep" in capsys.readouterr().out
