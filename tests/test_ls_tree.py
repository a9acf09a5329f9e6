"""Location services without a full mesh (issue 30), in the simulator: 30 members of one
LSID linked as a sparse graph (a ring with a few chords, degree about 2.4) keep one
spanning tree over their links, and every member's subtree receives every band it asked
for exactly once; a member failing in the middle of the tree is healed (the routers below
it re-graft, the tree is recomputed around it); control frames lost during churn leave the
same tables as a loss-free run once the loss stops."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from flowrouter.core.lstree import SETTLE, MemberTree
from flowrouter.testbed.sim import SimNetwork
from flowrouter.testbed.topology import TopologyError, loads
from flowrouter.wire.flowid import FlowID

LSID = 0x10
N = 30
REFRESH = 2.0
SOFT = dict(refresh_interval=REFRESH, hold_factor=3.5, liveness_interval=0.5, dead_after=2.0,
            join_timeout=4.0)
EP = dict(refresh_interval=REFRESH, join_timeout=2.0)
BANDS = (32, 33, 40, 41)
FLOWS = [FlowID(0xC0FFEE, LSID, i) for i in range(1, 6)]


def member_graph(n: int = N, kind: str = "ring") -> list[tuple[str, str]]:
    """*ring*: a ring of n members with a few chords (36 links for 30; a mesh has 435).
    *random*: a random tree of n members plus n/4 random extra links (seeded)."""
    names = [f"m{i:02d}" for i in range(n)]
    if kind == "random":
        rng = random.Random(f"members/{n}")
        edges = {(names[rng.randrange(i)], names[i]) for i in range(1, n)}
        while len(edges) < n - 1 + n // 4:
            a, b = sorted(rng.sample(names, 2))
            if (b, a) not in edges:
                edges.add((a, b))
        return sorted(edges)
    edges = [(names[i], names[(i + 1) % n]) for i in range(n)]
    edges += [(names[i], names[(i + n // 2) % n]) for i in range(0, n // 2, 5)]
    edges += [(names[i], names[(i + 7) % n]) for i in range(2, n, 10)]
    return edges


def network(seed: int = 1, n: int = N, kind: str = "ring") -> SimNetwork:
    """The members, one endpoint on each, and 6 edge routers each linked to two members
    far apart on the ring (with two endpoints each)."""
    net = SimNetwork(seed=seed)
    for i in range(n):
        net.add_router(f"m{i:02d}", core_lsids=[LSID], **SOFT)
    for a, b in member_graph(n, kind):
        net.add_link(a, b, delay=0.001)
    for i in range(6):
        net.add_router(f"r{i}", **SOFT)
        net.add_link(f"r{i}", f"m{(5 * i) % n:02d}", delay=0.001)
        net.add_link(f"r{i}", f"m{(5 * i + 13) % n:02d}", delay=0.002)
        for k in range(2):
            net.add_endpoint(f"e{i}{k}", f"r{i}", **EP)
    for i in range(n):
        net.add_endpoint(f"x{i:02d}", f"m{i:02d}", **EP)
    return net


def subscribe(net: SimNetwork, seed: int = 7) -> None:
    rng = random.Random(seed)
    for name in sorted(net.endpoints):
        for flow in FLOWS:
            if rng.random() < 0.3:
                net.endpoints[name].join(flow, sorted(rng.sample(BANDS, rng.randint(1, 3))))


def check_exact(net: SimNetwork, since: float, *, dead: frozenset[str] = frozenset()
                ) -> int:
    """Each flow's first live member sends every band once: every live endpoint must get
    exactly the bands it wants, each once. Returns the deliveries checked."""
    eps = [ep for name, ep in sorted(net.endpoints.items()) if ep.router not in dead]
    for flow in FLOWS:
        sender = next(ep for ep in eps if flow in ep.wanted)
        for band in BANDS:
            sender.send(flow, band, f"{flow.local}/{band}".encode())
    net.run_for(1.0)
    checked = 0
    for ep in eps:
        for flow in FLOWS:
            got = Counter(d.band for d in ep.received(flow) if d.time > since)
            mask = ep.wanted.get(flow, (0, False))[0]
            want = {b: 1 for b in BANDS if mask >> b & 1}
            sender = next(e for e in eps if flow in e.wanted)
            if ep is sender:
                continue
            assert dict(got) == want, (ep.name, flow.local, dict(got), want)
            checked += sum(want.values())
    return checked


def trees(net: SimNetwork, dead: frozenset[str] = frozenset()) -> dict[str, Any]:
    out = {}
    for name, r in sorted(net.routers.items()):
        if name.startswith("m") and name not in dead:
            t = r.routing.trees[LSID]
            out[name] = (t.root, sorted(t.tree_names), t.members())
    return out


def assert_one_tree(net: SimNetwork, dead: frozenset[str] = frozenset()) -> None:
    views = trees(net, dead)
    live = sorted(views)
    roots = {v[0] for v in views.values()}
    assert roots == {min(live)}, roots
    assert all(v[2] == live for v in views.values())
    edges = {tuple(sorted((a, b))) for a, v in views.items() for b in v[1]}
    assert len(edges) == len(live) - 1  # a spanning tree: n-1 edges, agreed at both ends
    for a, b in edges:
        assert a in views[b][1] and b in views[a][1]


@pytest.mark.parametrize("n,kind", [(30, "ring"), (20, "random"), (40, "random")])
def test_a_sparse_ls_delivers_every_band_exactly_once(n: int, kind: str) -> None:
    net = network(n=n, kind=kind)
    assert len(member_graph(n, kind)) < n * (n - 1) // 2 // 5  # far from a mesh
    net.run_until(3.0)
    assert_one_tree(net)
    subscribe(net)
    net.run_until(6.0)
    assert all(ep.is_joined(f) for ep in net.endpoints.values() for f in ep.wanted)
    assert check_exact(net, 6.0) > 50
    # every member holds each flow that has members anywhere (as with the mesh), and the
    # masks crossed only the tree's 29 links, never the 7 links off the tree
    for flow in FLOWS:
        assert all(flow.key in r.flows for n, r in net.routers.items() if n.startswith("m"))
    off = net.router_counters()["drop.off-tree"]
    assert off == 0
    assert_one_tree(net)


def test_a_member_failing_in_the_middle_is_healed() -> None:
    net = network(seed=2)
    net.run_until(3.0)
    subscribe(net)
    net.run_until(6.0)
    views = trees(net)
    # the member with the most tree links (a cut vertex of the tree): its subtrees are
    # separated when it fails
    victim = max(views, key=lambda n: (len(views[n][1]), n))
    assert len(views[victim][1]) >= 2
    for name, link in list(net.links.items()):
        if victim in (link.a, link.b):
            net.link_down(name)
    dead = frozenset({victim})
    t_fail = net.now
    net.run_for(0.5)
    assert_one_tree(net, dead)
    assert check_exact(net, net.now, dead=dead) > 40
    # and the tree healed fast: the members learnt of the failure within milliseconds
    changed = [r.counters["ls.tree-changes"] for n, r in net.routers.items()
               if n.startswith("m") and n != victim]
    assert sum(changed) >= 1
    assert net.now - t_fail < 2.0
    # it comes back: the members take it into their tree again, and it gets its bands
    for name, link in list(net.links.items()):
        if victim in (link.a, link.b):
            net.link_up(name)
    net.run_for(3.0)
    assert_one_tree(net)
    assert check_exact(net, net.now) > 50


@pytest.mark.parametrize("which", ["hub", "root"])
def test_member_failure_costs_a_short_gap_and_at_most_one_message(which: str) -> None:
    """A stream every 5 ms crosses the members' tree; the member with the most tree links
    (or the root, whose failure reshapes the whole tree) dies. Every other receiver misses
    at most one message (two when the root dies: the one in flight to it, and one while
    the members' views of the new tree differ), gets none twice, and its longest silence
    is a few link delays (links of 1 ms here: on loopback the same hops take a fraction of
    that)."""
    net = network(seed=2)
    net.run_until(3.0)
    flow = FlowID(0xC0FFEE, LSID, 99)
    for ep in net.endpoints.values():
        ep.join(flow, [32])
    net.run_until(6.0)
    views = trees(net)
    victim = max(views, key=lambda n: (len(views[n][1]), n)) if which == "hub" else \
        min(views)
    sender = net.endpoints[f"x{(int(victim[1:]) + N // 2) % N:02d}"]
    sent = iter(range(10**6))

    def stream() -> None:
        sender.send(flow, 32, b"%d" % next(sent))
        if net.now < 7.0:
            net.after(0.005, stream)

    def kill() -> None:
        for name, link in list(net.links.items()):
            if victim in (link.a, link.b):
                net.link_down(name)
    net.schedule(6.2, stream)
    net.schedule(6.5, kill)
    net.run_until(7.5)
    worst_gap, worst_lost = 0.0, 0
    for ep in net.endpoints.values():
        if ep.router == victim or ep is sender:
            continue
        got = [(d.time, int(d.payload)) for d in ep.received(flow)]
        nums = [n for _, n in got]
        assert len(nums) == len(set(nums)), ep.name  # nothing twice
        assert nums[-1] - nums[0] > 100
        lost = len(set(range(nums[0], nums[-1] + 1)) - set(nums))
        gap = max(b - a for (a, _), (b, _) in zip(got, got[1:]))
        worst_gap, worst_lost = max(worst_gap, gap), max(worst_lost, lost)
    print(f"\n{which} member {victim} of {N} died: longest silence {worst_gap * 1000:.0f} ms "
          f"(1 ms links, a message every 5 ms), at most {worst_lost} lost")
    # the root's death floods hop by hop; while the graph settles members pass frames on
    # over every member link that wants them and drop the copies (22 ms and two lost
    # without that: members dropped what came off their stale trees)
    assert worst_lost <= 1
    assert worst_gap < 0.012


def test_while_the_graph_settles_off_tree_frames_pass_and_copies_do_not() -> None:
    """MemberTree.admit: settled, a frame from a sibling off the tree is refused; for
    SETTLE seconds after the graph changed it is taken, but the same frame again (gone
    round a loop of views not yet agreed) is not; a frame passed before the change is
    remembered too."""
    tree = MemberTree(LSID, "b")
    tree.set_siblings([(1, "a"), (2, "c"), (3, "d")])
    for name, nbrs in (("a", ("b", "c")), ("c", ("a", "b", "d")), ("d", ("b", "c"))):
        tree.learn([(name, 1, nbrs)], 0.0)
    tree.compute(0.0, 10.0)
    assert tree.root == "a" and tree.tree_names == {"a", "d"}  # c is off our tree
    early = (b"k" * 16, 32, b"early")
    assert tree.admit(1, early, 1.0)  # from the tree
    assert not tree.admit(2, (b"k" * 16, 32, b"x"), 1.0)  # off the tree, settled
    tree.learn([("a", 2, ("c",))], 1.001)  # a drops its link to b: the graph changes
    tree.compute(1.001, 10.0)
    assert tree.tree_names == {"c"} and tree.settling_until == pytest.approx(1.001 + SETTLE)
    frame = (b"k" * 16, 32, b"late")
    assert tree.admit(3, frame, 1.002)  # from d: off our new tree, a tree link in d's view
    assert not tree.admit(2, frame, 1.003)  # the copy that went round
    assert not tree.admit(2, early, 1.004)  # passed before the news, back after it
    assert tree.admit(2, (b"k" * 16, 33, b"late"), 1.004)  # another band: no copy
    # while settling, frames go to every member link whose side wants the band
    for lid, m in ((1, 1 << 32), (2, 1 << 32), (3, 1 << 33)):
        tree.hear(lid, b"k" * 16, m, 1.004)
    assert tree.flood(b"k" * 16, 1 << 32, 1, 1.005) == [2]
    assert tree.flood(b"k" * 16, 1 << 33, 2, 1.005) == [3]
    later = 1.001 + SETTLE + 0.01
    assert tree.flood(b"k" * 16, 1 << 32, 1, later) is None  # settled: the tree rules
    assert not tree.admit(3, (b"k" * 16, 32, b"other"), later)  # d is off the tree
    copy = (b"k" * 16, 32, b"round")
    assert tree.admit(2, copy, later - 0.02)
    assert not tree.admit(2, copy, later)  # the flood's last copies are still caught
    assert tree.admit(2, copy, 1.001 + 2 * SETTLE + 0.01)  # and then forgotten


def tables(net: SimNetwork) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, r in sorted(net.routers.items()):
        peer = {lid: lk.peer_name for lid, lk in r.links.items()}
        out[name] = {
            FlowID.from_key(k).local: (
                peer.get(e.upstream) if e.upstream is not None else None, e.joined,
                tuple(sorted((peer.get(lid, "?"), m) for lid, m in e.down.items())),
                tuple(sorted((peer.get(lid, "?"), m) for lid, m in (e.sib or {}).items())))
            for k, e in r.flows.items()}
    return out


def churn(net: SimNetwork, until: float) -> None:
    rng = random.Random("ls-churn")
    names = sorted(net.endpoints)
    t = 4.0
    while t < until:
        t += rng.expovariate(4.0)
        ep = net.endpoints[rng.choice(names)]
        flow = rng.choice(FLOWS)
        if rng.random() < 0.6:
            net.schedule(t, ep.join, flow, sorted(rng.sample(BANDS, rng.randint(1, 3))))
        else:
            net.schedule(t, ep.leave, flow)


def run(loss: float) -> SimNetwork:
    net = network(seed=3)
    churn(net, 60.0)
    net.run_until(3.0)
    if loss:
        net.set_control_loss(loss)
    net.run_until(64.0)
    net.set_control_loss(0.0)
    net.run_until(64.0 + 3 * REFRESH)
    return net


def test_lost_control_frames_converge_to_the_loss_free_tables() -> None:
    clean = run(0.0)
    lossy = run(0.1)
    drops = sum(d.drops["control-loss"] for lk in lossy.links.values() for d in (lk.ab, lk.ba))
    assert drops > 100
    assert_one_tree(lossy)
    want, got = tables(clean), tables(lossy)
    diff = {r: (want[r], got[r]) for r in want if want[r] != got[r]}
    assert not diff, f"{len(diff)} router tables differ: {sorted(diff)}"
    assert check_exact(lossy, lossy.now) > 20


RING_TOPOLOGY = """name = "ls-ring"
[[routers]]
name = "m1"
[[routers]]
name = "m2"
[[routers]]
name = "m3"
[[routers]]
name = "m4"
[[routers]]
name = "r"
[[links]]
a = "m1"
b = "m2"
[[links]]
a = "m2"
b = "m3"
[[links]]
a = "m3"
b = "m4"
[[links]]
a = "r"
b = "m4"
[[endpoints]]
name = "e"
router = "r"
[[location_services]]
lsid = 0x10
cores = ["m1", "m2", "m3", "m4"]
"""


def test_topology_files_take_members_that_are_not_a_mesh_but_not_a_partition() -> None:
    topo = loads(RING_TOPOLOGY)  # a chain of four members: no mesh, but connected
    assert topo.location_services[0].cores == ("m1", "m2", "m3", "m4")
    cut = RING_TOPOLOGY.replace('a = "m2"\nb = "m3"', 'a = "r"\nb = "m2"')
    with pytest.raises(TopologyError) as info:
        loads(cut, "cut.toml")
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("cut.toml:") and "location service 0x10: members m3, m4 have no " \
        "path of member-to-member links to m1, m2" in text


def test_a_partition_of_the_members_delivers_within_each_piece_and_heals() -> None:
    """A chain of 8 members cut in the middle: each half agrees on a tree of its own and
    delivers among itself (counted ls.members-unreachable); healed, one tree again, and
    every band reaches every member exactly once."""
    net = SimNetwork(seed=5)
    names = [f"m{i:02d}" for i in range(8)]
    for name in names:
        net.add_router(name, core_lsids=[LSID], **SOFT)
        net.add_endpoint(f"x{name[1:]}", name, **EP)
    for a, b in zip(names, names[1:]):
        net.add_link(a, b, delay=0.001)
    net.run_until(3.0)
    assert_one_tree(net)
    flow = FLOWS[0]
    for ep in net.endpoints.values():
        ep.join(flow, [32])
    net.run_until(4.0)
    net.link_down("m03-m04")
    net.run_for(0.5)
    left, right = names[:4], names[4:]
    for half in (left, right):
        for name in half:
            assert net.routers[name].routing.trees[LSID].members() == half
    assert net.router_counters()["ls.members-unreachable"] == 8 * 4
    net.endpoints["x00"].send(flow, 32, b"left only")
    net.run_for(0.5)
    got = {ep.name for ep in net.endpoints.values()
           if any(d.payload == b"left only" for d in ep.received(flow))}
    assert got == {"x01", "x02", "x03"}
    net.link_up("m03-m04")
    net.run_for(1.0)
    assert_one_tree(net)
    net.endpoints["x00"].send(flow, 32, b"everyone")
    net.run_for(0.5)
    for ep in net.endpoints.values():
        if ep.name != "x00":
            assert [d.payload for d in ep.received(flow)].count(b"everyone") == 1, ep.name


def test_members_that_are_a_full_mesh_send_directly_not_across_a_tree() -> None:
    """A few members all linked to each other (chat's site routers serving one room) keep
    the mesh's one-hop paths: a frame entering at one member goes straight to every other
    member that wants it, and what a member gets from a fellow member goes only down. A
    tree over the mesh would carry everything across the root's links (a star), which on
    thin site links saturates them."""
    names = [f"s{i}" for i in range(5)]
    net = SimNetwork(seed=3, trace=True)
    for name in names:
        net.add_router(name, core_lsids=[LSID], **SOFT)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            net.add_link(a, b, delay=0.001)
    for name in names:
        net.add_endpoint(f"x{name}", name, **EP)
    flow = FLOWS[0]
    net.run_until(3.0)
    assert all(net.routers[n].routing.trees[LSID].mesh for n in names)
    for name in names:
        net.endpoints[f"x{name}"].join(flow, [32])
    net.run_until(6.0)
    assert all(ep.is_joined(flow) for ep in net.endpoints.values())
    start = len(net.trace or [])
    for name in names:
        net.endpoints[f"x{name}"].send(flow, 32, name.encode())
    net.run_for(1.0)
    for name in names:  # each gets every other member's message once
        got = Counter(bytes(d.payload) for d in net.endpoints[f"x{name}"].received(flow)
                      if d.time > 6.0)
        assert got == Counter(n.encode() for n in names if n != name), (name, got)
    sends = Counter(r.link for r in (net.trace or [])[start:]
                    if r.event == "send" and r.band == 32 and not r.link.startswith("x"))
    # 5 members x 4 others, one frame on each direct link each way: 20 member-link sends
    # (a star would put 16 of them on the root's 4 links and none on the other 6)
    pairs = {f"{a}-{b}" for i, a in enumerate(names) for b in names[i + 1:]}
    assert set(sends) == pairs and all(c == 2 for c in sends.values()), sends
    assert net.router_counters()["drop.off-tree"] == 0


def test_a_direct_location_service_never_relays_around_a_broken_member_link() -> None:
    """``direct = true`` (routers' ``direct_lsids``): the members are a mesh that never
    relays. With the link s0-s1 down, s1's subscriber gets nothing from s0's sender (as seed
    003's per-pair paths), where a relaying service would route it through s2."""
    from flowrouter.net.config import ConfigError
    from flowrouter.net.configfile import config_from_dict

    doc = """
name = "direct"
[[routers]]
name = "s0"
[[routers]]
name = "s1"
[[routers]]
name = "s2"
[[links]]
a = "s0"
b = "s1"
[[links]]
a = "s1"
b = "s2"
[[links]]
a = "s0"
b = "s2"
[[location_services]]
lsid = 0x10
cores = ["s0", "s1", "s2"]
direct = %s
"""
    for direct in (True, False):
        topo = loads(doc % str(direct).lower())
        assert topo.direct_lsids("s1") == (frozenset({LSID}) if direct else frozenset())
        net = SimNetwork.from_topology(topo, seed=1)
        net.add_endpoint("a", "s0", **EP)
        net.add_endpoint("b", "s1", **EP)
        flow = FLOWS[0]
        net.run_until(2.0)
        net.endpoints["b"].join(flow, [32])
        net.run_until(4.0)
        net.link_down("s0-s1")
        net.run_until(12.0)
        net.endpoints["a"].send(flow, 32, b"x")
        net.run_for(1.0)
        got = [d for d in net.endpoints["b"].received(flow) if d.time > 12.0]
        assert len(got) == (0 if direct else 1), (direct, got)
    with pytest.raises(TopologyError, match="direct must be true or false"):
        loads(doc % '"yes"')
    with pytest.raises(ConfigError, match="direct_lsids must be among core_lsids"):
        config_from_dict({"router": {"name": "r", "core_lsids": [1], "direct_lsids": [2]}})


def _healed_mesh(direct: bool) -> tuple[SimNetwork, int]:
    """Six members all linked, split 3 | 3 for 10 s; the LS_TOPOLOGY frames sent in the
    second after the split heals."""
    names = [f"s{i}" for i in range(6)]
    net = SimNetwork(seed=4)
    for name in names:
        net.add_router(name, core_lsids=[LSID],
                       direct_lsids=frozenset({LSID}) if direct else frozenset(), **SOFT)
    cut = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            net.add_link(a, b, delay=0.001)
            if (a < "s3") != (b < "s3"):
                cut.append(f"{a}-{b}")
    net.run_until(3.0)
    for name in cut:
        net.link_down(name)
    net.run_until(13.0)
    before = net.router_counters()["ls.topology-sent"]
    for name in cut:
        net.link_up(name)
    net.run_for(1.0)
    return net, net.router_counters()["ls.topology-sent"] - before


def test_a_direct_service_tells_a_sibling_its_own_links_and_floods_nothing_on() -> None:
    """Members of a direct service never relay, so none needs more of the members' graph
    than its own links: each gives a sibling its own entry and floods nothing on. After a
    partition of such a mesh heals, the LS_TOPOLOGY frames are each member's own changes
    only: on chat's 56 kbit/s site links the flood (every member's entries, sent on by
    every member, and the whole graph to each returning sibling) was 3 KB ahead of the
    chat's heartbeats and repair requests on each link (test 19: the leader's group
    showed a message 16.1 s after it was sent, 14.8 s without the flood). A relaying
    service still floods, and all of its members learn the whole graph again."""
    direct, sent_direct = _healed_mesh(True)
    relaying, sent_relaying = _healed_mesh(False)
    for net in (direct, relaying):
        assert all(net.routers[f"s{i}"].routing.trees[LSID].mesh for i in range(6))
    assert relaying.routers["s0"].routing.trees[LSID].members() == [f"s{i}" for i in range(6)]
    # 9 links come up; at each, both ends tell their (up to 5) siblings their new entry
    assert sent_direct <= 9 * 2 * 5 < sent_relaying, (sent_direct, sent_relaying)


def test_a_direct_service_passes_repeated_frames_while_its_graph_settles() -> None:
    """A direct service's members never relay (no flood, no tree), so no copy can go round
    between them: a member's application sending the very same bytes twice in a moment
    (a repeated reading, a repeated request) is delivered twice even right after the
    members' graph changed; the copy check (which hashed every frame) is for relaying
    services only."""
    tree = MemberTree(LSID, "b", relay=False)
    tree.set_siblings([(1, "a"), (2, "c")])
    for name, nbrs in (("a", ("b", "c")), ("c", ("a", "b"))):
        tree.learn([(name, 1, nbrs)], 0.0)
    tree.compute(0.0, 10.0)
    tree.learn([("a", 2, ("b",))], 1.0)  # a loses its link to c: the graph changes
    tree.compute(1.0, 10.0)
    assert tree.mesh and tree.settling_until > 1.0
    frame = (b"k" * 16, 32, b"same")
    assert tree.admit(1, frame, 1.01) and tree.admit(1, frame, 1.02)
    assert tree.admit(2, frame, 1.03)  # from another member: its own sender's frame
