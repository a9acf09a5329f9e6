"""Topology files: every shipped file loads and round-trips; bad files fail precisely."""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

import pytest

from flowrouter.core.tables import Modifiers
from flowrouter.testbed import topology as T
from flowrouter.testbed.topology import Fault, TopologyError, load, loads

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"
SHIPPED = sorted(TOPOLOGIES.glob("*.toml"))


def test_the_expected_files_ship() -> None:
    names = {p.name for p in SHIPPED}
    assert {"two-site.toml", "seed003-testbed.toml", "ring-uni-20.toml", "ring-bi-20.toml",
            "linear-20.toml", "cdnnet-15.toml"} <= names
    assert (TOPOLOGIES / "README.md").exists()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_topology_loads_and_round_trips(path: Path) -> None:
    topo = load(path)
    assert topo.routers and topo.endpoints and topo.links and topo.location_services
    text = T.dumps(topo)
    again = loads(text, "dumped.toml")
    assert again == topo
    assert T.dumps(again) == text  # the written form is canonical
    # every router is reachable from every other one
    assert _connected([r.name for r in topo.routers], [(lk.a, lk.b) for lk in topo.links])
    for sc in topo.scenarios:
        assert topo.faults_for(sc.name)[: len(topo.faults)] == topo.faults


def test_dump_to_file_and_load(tmp_path: Path) -> None:
    topo = load(TOPOLOGIES / "two-site.toml")
    out = tmp_path / "copy.toml"
    T.dump(topo, out)
    assert load(out) == topo
    assert T.dumps(topo) == out.read_text()


def _connected(nodes: list[str], edges: list[tuple[str, str]]) -> bool:
    adj: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    seen = {nodes[0]}
    todo = deque([nodes[0]])
    while todo:
        for v in adj[todo.popleft()] - seen:
            seen.add(v)
            todo.append(v)
    return len(seen) == len(nodes)


def _mean_path(topo: T.Topology) -> float:
    names = [r.name for r in topo.routers]
    adj: dict[str, set[str]] = {n: set() for n in names}
    for lk in topo.links:
        adj[lk.a].add(lk.b)
        adj[lk.b].add(lk.a)
    total = count = 0
    for s in names:
        dist = {s: 0}
        todo = deque([s])
        while todo:
            u = todo.popleft()
            for v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    todo.append(v)
        total += sum(dist.values())
        count += len(dist) - 1
    return total / count


# ---------------------------------------------------------------------------- shipped content


def test_two_site_example() -> None:
    topo = load(TOPOLOGIES / "two-site.toml")
    assert [s.name for s in topo.sites] == ["vancouver", "boston"]
    assert len(topo.routers) == 3 and len(topo.endpoints) == 3
    assert topo.router("van-1").core_lsids == (0x10,)
    assert topo.lsids() == [0x10]
    lan = topo.link("van-1-van-2")
    assert lan.bandwidth == 1e9 and lan.delay == pytest.approx(0.0002)
    assert lan.modifiers == Modifiers(bandwidth=1, delay=1, geography=2)
    wan = topo.link("van-1-bos-1")  # takes the defaults
    assert wan.bandwidth == 10e6 and wan.delay == pytest.approx(0.02)
    assert topo.link("backup").transport == "udp" and topo.link("backup").loss == 0.01
    assert topo.endpoint("bob").modifiers.geography == 1
    assert topo.listen_address("bos-1") == ("127.0.0.1", 7402)
    assert topo.router_params("van-1") == {"epoch": 5.0}
    assert topo.neighbours("bos-1") == ["van-1", "van-2"]
    flap = topo.scenario("wan-flap").faults[0]
    assert flap.kind == "repeat"
    assert flap.outages(1000) == [(20, 30), (50, 60), (80, 90)]
    cut = topo.scenario("boston-cut").faults
    assert cut[0].links == ("van-1-bos-1", "backup") and cut[0].kind == "outage"
    assert cut[1].direction == "bos-1"
    assert topo.faults[0].kind == "set" and topo.faults[0].bandwidth == 512e3


SEED003_SITES = ["metropol", "commonwe", "kingdom", "republic"]


def test_seed003_testbed() -> None:
    topo = load(TOPOLOGIES / "seed003-testbed.toml")
    assert {s.name for s in topo.sites} == {*SEED003_SITES, "hub"}
    for site in SEED003_SITES:
        assert topo.router(site).site == site
        assert topo.endpoint(f"{site}-client").router == site
    assert topo.endpoint("leader").router == "hub"
    assert topo.location_services[0].cores == ("hub",)
    # the four sites fully meshed, every link (and the hub's) at 56 kbit/s
    pairs = {frozenset((lk.a, lk.b)) for lk in topo.links}
    for i, a in enumerate(SEED003_SITES):
        for b in SEED003_SITES[i + 1:]:
            assert frozenset((a, b)) in pairs
        assert frozenset((a, "hub")) in pairs
    assert all(lk.bandwidth == 56_000 for lk in topo.links)
    names = {s.name for s in topo.scenarios}
    # the seed's eight experiments, and the chat's misbehaving-network scenarios by name
    assert {"A1", "A2", "L1", "L2", "A1-25", "A2-25", "L1-25", "L2-25"} <= names
    assert {"flapping", "saturation", "site-restart", "leader-restart"} <= names

    def cut(name: str) -> set[frozenset[str]]:
        (f,) = topo.scenario(name).faults
        return {frozenset((topo.link(n).a, topo.link(n).b)) for n in f.links}

    # A1: metropol from everyone; A2: {M, C} | {K, R}; L1/L2: from the leader's machine
    assert cut("A1") == {frozenset(("metropol", x)) for x in ["commonwe", "kingdom",
                                                              "republic", "hub"]}
    a2 = cut("A2")
    assert all(len(p & {"metropol", "commonwe", "hub"}) == 1 for p in a2)
    assert len(a2) == 6
    assert cut("L1") == {frozenset(("metropol", "hub"))}
    assert cut("L2") == {frozenset(("metropol", "hub")), frozenset(("commonwe", "hub"))}
    for name in ("A1", "A2", "L1", "L2"):
        (f,) = topo.scenario(name).faults
        assert (f.down, f.up, f.until) == (10, 30, 300)
        # the seed's plots show outages at 90-100, 130-140, 170-180
        assert {(90, 100), (130, 140), (170, 180)} <= set(f.outages(300))
        (g,) = topo.scenario(f"{name}-25").faults
        assert (g.down, g.up) == (25, 25) and g.links == f.links
        assert topo.scenario(name).duration == 300


def test_seed000_topologies() -> None:
    uni = load(TOPOLOGIES / "ring-uni-20.toml")
    bi = load(TOPOLOGIES / "ring-bi-20.toml")
    lin = load(TOPOLOGIES / "linear-20.toml")
    cdn = load(TOPOLOGIES / "cdnnet-15.toml")
    for t, n in ((uni, 20), (bi, 20), (lin, 20), (cdn, 15)):
        assert len(t.routers) == n and len(t.endpoints) == n
        assert all(lk.bandwidth == 4800 for lk in t.links)
    assert len(uni.links) == len(bi.links) == 20 and len(lin.links) == 19
    assert all(lk.oneway for lk in uni.links) and not any(lk.oneway for lk in bi.links)
    # one-way ring: each router has one outgoing and one incoming link
    assert sorted(lk.a for lk in uni.links) == sorted(lk.b for lk in uni.links) == sorted(
        r.name for r in uni.routers)
    assert uni.router("r05").routes == ((0x10, "r04"),)
    # CDNnet stand-in: highly interconnected, shortest mean path of the four
    assert _mean_path(cdn) < 2.0 < _mean_path(bi) < _mean_path(lin)
    assert len(cdn.links) >= 30


# ---------------------------------------------------------------------------- parsing details


BASE = '''name = "t"
[[routers]]
name = "a"
[[routers]]
name = "b"
[[links]]
a = "a"
b = "b"
'''


def test_minimal_file_and_defaults() -> None:
    topo = loads(BASE)
    assert topo.name == "t" and topo.links[0].name == "a-b"
    lk = topo.links[0]
    assert (lk.transport, lk.bandwidth, lk.delay, lk.loss) == ("tcp", 0.0, 0.001, 0.0)
    assert topo.listen_address("a") == ("127.0.0.1", 7400)
    assert topo.listen_address("b") == ("127.0.0.1", 7401)
    assert loads(T.dumps(topo)) == topo


def test_units_and_location_service_merge() -> None:
    topo = loads(BASE + '''bandwidth = "56k"
delay = "50ms"
[[routers]]
name = "c"
core_lsids = [0x20]
[[links]]
a = "b"
b = "c"
bandwidth = "1.5M"
delay = "200us"
[[links]]                # the two members of 0x10 must be linked (not necessarily a mesh)
a = "a"
b = "c"
[[location_services]]
lsid = 0x10
name = "chat"
cores = ["a", "c"]
''')
    assert topo.link("a-b").bandwidth == 56_000 and topo.link("a-b").delay == 0.05
    assert topo.link("b-c").bandwidth == 1.5e6 and topo.link("b-c").delay == pytest.approx(2e-4)
    assert topo.router("c").core_lsids == (0x10, 0x20)
    assert topo.router("a").core_lsids == (0x10,)
    assert [(ls.lsid, ls.cores, ls.name) for ls in topo.location_services] == [
        (0x10, ("a", "c"), "chat"), (0x20, ("c",), "")]
    assert loads(T.dumps(topo)) == topo


def test_fault_kinds_and_outage_expansion() -> None:
    f = Fault(("x",), start=60, down=10, up=30, until=300)
    assert f.kind == "repeat"
    assert f.outages(1000)[:2] == [(60, 70), (100, 110)]
    assert f.outages(1000)[-1] == (260, 270)
    assert Fault(("x",), start=0, down=10, up=5, until=12).outages(100) == [(0, 10)]
    assert Fault(("x",), start=0, down=10, up=5, until=18).outages(100) == [(0, 10), (15, 18)]
    assert Fault(("x",), at=5).outages(100) == [(5, math.inf)]
    assert Fault(("x",), at=5, loss=0.5).kind == "set"


def _err(text: str) -> TopologyError:
    with pytest.raises(TopologyError) as info:
        loads(text, "bad.toml")
    return info.value


@pytest.mark.parametrize("text,line,words", [
    (BASE + '[[links]]\na = "a"\nb = "zz"\n', 11, ["unknown router 'zz'", "known: a, b"]),
    (BASE.replace('name = "b"', 'name = "a"'), 5, ["duplicate router name 'a'"]),
    (BASE + "delay = -1\n", 9, ["delay", "non-negative", "-1"]),
    (BASE + "loss = 1.5\n", 9, ["loss", "between 0 and 1", "1.5"]),
    (BASE + "loss = -0.1\n", 9, ["loss", "non-negative"]),
    (BASE + 'colour = "red"\n', 9, ["unknown key 'colour'", "allowed:"]),
    ('nmae = "x"\n' + BASE, 1, ["unknown key 'nmae'"]),
    (BASE + '[[faults]]\nlink = "a-b"\nat = 10\nuntil = 5\n', 12,
     ["out of order", "until (5)", "after at (10)"]),
    (BASE + '[scenarios.S]\nfaults = [\n  { link = "a-b", at = 1 },\n'
            '  { link = "a-b", start = 50, down = 5, up = 5, until = 20 },\n]\n', 12,
     ["scenario 'S' fault #2", "out of order", "until (20)", "start (50)"]),
    (BASE + '[scenarios.S]\nfaults = [\n  { link = "a-b", down = 10, up = 5 },\n]\n', 11,
     ["repeating", "missing start"]),
    (BASE + '[scenarios.S]\nfaults = [\n  { link = "a-b", at = 1 },\n'
            '  { link = "a-c", at = 2 },\n]\n', 12, ["fault #2", "unknown link 'a-c'"]),
    (BASE + '[[faults]]\nlink = "a-b"\nat = 1\ndirection = "c"\n', 12,
     ["direction 'c'", "not an end of link 'a-b'"]),
    (BASE + '[[faults]]\nlink = "a-b"\nstart = 1\ndown = 1\nup = 1\nbandwidth = 5\n', 14,
     ["repeating", "bandwidth"]),
    (BASE + '[[faults]]\nlink = "a-b"\n', 9, ["needs 'at'"]),
    (BASE + '[[location_services]]\nlsid = 0\ncores = ["a"]\n', 10, ["LSID", "reserved"]),
    (BASE + '[[location_services]]\nlsid = 1\ncores = ["q"]\n', 11, ["unknown router 'q'"]),
    (BASE.replace('name = "a"\n', 'name = "a"\nroutes = [{lsid = 1, via = "a"}]\n', 1), 4,
     ["static route", "not a neighbour"]),
    (BASE.replace('name = "a"\n', 'name = "a"\ndefault_route = "c"\n', 1), 4,
     ["default_route 'c'", "not a neighbour"]),
    (BASE + 'bandwidth = "fast"\n', 9, ["cannot read 'fast'"]),
    (BASE + "modifiers = { geography = 300 }\n", 9, ["geography", "0..255"]),
    (BASE + "modifiers = { colour = 3 }\n", 9, ["unknown key 'colour'", "modifiers"]),
    (BASE + '[[links]]\na = "a"\nb = "b"\n', 9, ["duplicate link name 'a-b'"]),
    (BASE + '[[links]]\na = "a"\nb = "a"\n', 11, ["connects router 'a' to itself"]),
    (BASE + '[[endpoints]]\nname = "x"\nrouter = "q"\n', 11, ["endpoint 'x'",
                                                             "unknown router 'q'"]),
    (BASE + '[[endpoints]]\nname = "a"\nrouter = "a"\n', 10, ["duplicate name 'a'"]),
    (BASE + 'transport = "sctp"\n', 9, ["transport", "tcp, udp", "sctp"]),
    (BASE + "delay = true\n", 9, ["must be a number"]),
    (BASE.replace('name = "a"\n', 'name = "a"\nsite = "mars"\n', 1), 4, ["unknown site"]),
    (BASE.replace('name = "a"\n', 'name = "a"\nping_after = 5\ndelete_after = 3\n', 1), 5,
     ["delete_after (3)", "ping_after (5)"]),
    (BASE.replace('name = "b"\n', 'name = "b"\nport_offset = 0\n', 1), 6,
     ["port 7400", "already used by router 'a'"]),
    ('name = "t"\nrouters = [{name = "a"}, {name = "b"}]\nlinks = [\n  {a = "a", b = "b"},\n'
     '  {a = "a", b = "c"},\n]\n', 5, ["unknown router 'c'"]),
    (BASE + "[[sites]]\nname = 'x y'\n", 10, ["site name", "'x y'"]),
])
def test_invalid_files_name_the_line_and_the_problem(text: str, line: int,
                                                     words: list[str]) -> None:
    err = _err(text)
    assert err.line == line, str(err)
    assert err.source == "bad.toml"
    msg = str(err)
    assert msg.startswith(f"bad.toml:{line}: "), msg
    for w in words:
        assert w in msg, msg


def test_syntax_errors_give_tomllib_line() -> None:
    err = _err(BASE + "x = = 3\n")
    assert err.line == 9 and "TOML syntax error" in str(err)
    err = _err('name = "t"\n[[routers]\nname = "a"\n')
    assert err.line == 2


def test_load_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "broken.toml"
    p.write_text(BASE + "loss = 2\n")
    with pytest.raises(TopologyError) as info:
        load(p)
    assert str(info.value).startswith(f"{p}:9: ")
    with pytest.raises(TopologyError, match="cannot read"):
        load(tmp_path / "missing.toml")


def test_unknown_lookups_raise_key_error() -> None:
    topo = loads(BASE)
    with pytest.raises(KeyError, match="no scenario 'X'"):
        topo.scenario("X")
    with pytest.raises(KeyError):
        topo.router("zz")
    with pytest.raises(KeyError):
        topo.link("zz")


def test_locator_handles_quoted_keys_and_nested_tables() -> None:
    loc = T.Locator('a = 1\n[defaults.link]\n"quoted key" = 2\n[[routers]]\nname = "r"\n'
                     '[[routers]]\nname = "s"\nroutes = [\n  { lsid = 1, via = "r" },\n]\n'
                     "[scenarios.'x-1']\nfaults = [ { link = 'q', at = 3 } ]\n")
    assert loc.line_of(("a",)) == 1
    assert loc.line_of(("defaults", "link", "quoted key")) == 3
    assert loc.line_of(("routers", 1, "name")) == 7
    assert loc.line_of(("routers", 1, "routes", 0, "via")) == 9
    assert loc.line_of(("scenarios", "x-1", "faults", 0, "at")) == 12
    assert loc.line_of(("routers", 0, "nothing", "here")) == 4
