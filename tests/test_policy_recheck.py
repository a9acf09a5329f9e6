"""Installing or changing a flow policy re-checks the flow's current members.

Attack: an endpoint that joined a flow before its creator installed a policy kept receiving
after the policy was in force (members were never re-checked). Now a policy that arrives
(first, or a new version) takes off every application member it excludes: no capability
where it requires one to join (or, for an advertiser, to send), a revoked or expired one, or
one that does not grant the bands held. Each is told (PRUNE; a re-join without a capability
is refused), counted (``capability.<why>``) and logged; members with a valid capability, and
flows the policy does not cover, are left alone. Core on virtual time (CoreNet), two routers.
"""

from __future__ import annotations

import pytest

from flowrouter.wire import control as C
from flowrouter.wire.capabilities import Capability, CreatorKey, Policy

from .corenet import LINK_KEY, CoreNet

LSID = 0x10


@pytest.fixture
def net() -> CoreNet:
    n = CoreNet(member_notice_interval=0.0)
    n.router("core", core_lsids=frozenset({LSID}))
    n.router("edge", routes={LSID: "core"})
    n.connect("edge", "core")
    return n


def _data(ep, flow) -> list[bytes]:  # type: ignore[no-untyped-def]
    return [f.payload for f in ep.data(flow, 40)]


def test_members_that_joined_before_a_policy_are_taken_off(net: CoreNet) -> None:
    owner = CreatorKey.generate()
    flow, other = owner.flow(LSID, 1), owner.flow(LSID, 2)
    early = net.endpoint("early", "edge")      # joined before the policy, no capability
    early.refreshing = False
    holder = net.endpoint("holder", "core")    # joins later with a capability
    sender = net.endpoint("sender", "core")
    bystander = net.endpoint("bystander", "edge")  # on another flow of the same creator
    early.join(flow, [40])
    bystander.join(other, [40])
    sender.send(flow, 40, b"before")
    assert _data(early, flow) == [b"before"]
    # the creator installs a policy (join needs a capability; sending stays open)
    raw = Policy.issue(owner, flow, version=1, require_send=False, now=0.0).encode()
    creator = net.endpoint("creator", "edge")
    creator.control(LINK_KEY, C.PolicyMsg(raw))
    assert net.routers["core"].counters["policies.installed"] == 1
    edge = net.routers["edge"]
    assert edge.counters["capability.policy"] == 1
    net.tick(net.now + 0.25)  # the PRUNE leaves with the next tick's notices
    assert early.msgs(C.Prune) and flow.key in early.msgs(C.Prune)[-1].keys
    cap = Capability.issue(owner, flow, "holder", join=[40], ttl=3600, now=0.0)
    holder.control(flow, C.Join(9, 1 << 40, 0, cap.encode()))
    assert holder.acks(flow)[-1].status is C.JoinStatus.OK
    sender.send(flow, 40, b"after")
    assert _data(early, flow) == [b"before"]  # no longer receives
    assert _data(holder, flow) == [b"after"]
    # its re-join (the PRUNE's answer) is refused for want of a capability
    assert any(a.status is C.JoinStatus.REFUSED for a in early.acks(flow))
    sender.send(other, 40, b"other flow")
    assert _data(bystander, other) == [b"other flow"]  # not covered: left alone


def test_a_new_policy_version_rechecks_advertisers_and_revocations(net: CoreNet) -> None:
    owner = CreatorKey.generate()
    flow = owner.flow(LSID, 3)
    creator = net.endpoint("creator", "edge")
    creator.control(LINK_KEY, C.PolicyMsg(Policy.issue(
        owner, flow, version=1, require_join=True, require_send=False, now=0.0).encode()))
    adv = net.endpoint("adv", "core")       # an open sender: advertised without a capability
    adv.refreshing = False
    adv.join(flow, 0, C.JOIN_FLAG_ADVERTISE)
    alice = net.endpoint("alice", "core")
    alice.refreshing = False
    cap_a = Capability.issue(owner, flow, "alice", join=[40], ttl=3600, now=0.0)
    alice.control(flow, C.Join(3, 1 << 40, 0, cap_a.encode()))
    assert alice.acks(flow)[-1].status is C.JoinStatus.OK
    core = net.routers["core"]
    assert flow.key in core.flows and adv.link_id in core.flows[flow.key].down
    # version 2: sending needs a capability too, and alice's token is revoked
    creator.control(LINK_KEY, C.PolicyMsg(Policy.issue(
        owner, flow, version=2, revoked=[cap_a.serial], now=0.0).encode()))
    assert core.counters["capability.policy"] == 1   # the advertiser
    assert core.counters["capability.revoked"] == 1  # alice
    entry = core.flows.get(flow.key)
    assert entry is None or not {adv.link_id, alice.link_id} & set(entry.down)
    # the same policy again changes nothing (installed once)
    creator.control(LINK_KEY, C.PolicyMsg(Policy.issue(
        owner, flow, version=2, revoked=[cap_a.serial], now=0.0).encode()))
    assert core.counters["capability.policy"] == 1


def test_a_creator_wide_policy_covers_every_flow_of_the_creator(net: CoreNet) -> None:
    owner = CreatorKey.generate()
    flows = [owner.flow(LSID, i) for i in (5, 6)]
    members = []
    for i, f in enumerate(flows):
        m = net.endpoint(f"m{i}", "edge")
        m.refreshing = False
        m.join(f, [40])
        members.append(m)
    stranger = CreatorKey.generate().flow(LSID, 5)
    s = net.endpoint("s", "edge")
    s.join(stranger, [40])
    creator = net.endpoint("creator", "edge")
    creator.control(LINK_KEY, C.PolicyMsg(Policy.issue(
        owner, owner.creator_id, version=1, require_send=False, now=0.0).encode()))
    edge = net.routers["edge"]
    assert edge.counters["capability.policy"] == 2
    assert stranger.key in edge.flows and s.link_id in edge.flows[stranger.key].down


def test_the_creator_index_follows_the_flow_table(net: CoreNet) -> None:
    """A creator-wide policy finds its flows through an index, not a table walk (a policy
    is a message any creator can send): the index holds exactly the table's keys."""
    owners = [CreatorKey.generate() for _ in range(3)]
    eps = []
    for i in range(12):
        ep = net.endpoint(f"e{i}", "edge" if i % 2 else "core")
        ep.join(owners[i % 3].flow(LSID, i), [40])
        eps.append(ep)
    for ep in eps[::3]:
        ep.leave(next(iter(ep.wanted)) if ep.wanted else owners[0].flow(LSID, 99))
    net.disconnect(eps[1])
    for name, r in net.routers.items():
        grouped: dict[bytes, set[bytes]] = {}
        for key in r.flows:
            grouped.setdefault(key[:8], set()).add(key)
        assert r.state.by_creator == grouped, name


def test_one_principal_cannot_fill_the_policy_table() -> None:
    """Every policy is kept and passed to every router, and the table is bounded: one
    application installing policies for flow after flow of its own creator is held to
    ``[quota] policies`` targets (new versions of its own are free), counted and alerted;
    another principal is not affected."""
    from flowrouter.core.quotas import QuotaLimits

    n = CoreNet(member_notice_interval=0.0, quota=QuotaLimits(policies=3))
    n.router("core", core_lsids=frozenset({LSID}))
    owner = CreatorKey.generate()
    a = n.endpoint("a", "core")
    for i in range(5):
        a.control(LINK_KEY, C.PolicyMsg(Policy.issue(owner, owner.flow(LSID, i), version=1,
                                                     now=0.0).encode()))
    core = n.routers["core"]
    assert core.counters["policies.installed"] == 3
    assert core.counters["refused.policy-quota"] == 2
    assert any(al["kind"] == "policy-quota" for al in core.status()["alerts"])
    a.control(LINK_KEY, C.PolicyMsg(Policy.issue(owner, owner.flow(LSID, 0), version=2,
                                                 now=0.0).encode()))
    assert core.counters["policies.installed"] == 4  # a new version of its own: free
    b = CreatorKey.generate()
    n.routers["core"].open_link(99, n.now, address="10.9.9.9:1")  # another host
    body = C.Hello(99, C.Role.ENDPOINT, "b", 65536).encode()
    core.receive(99, C.hello_header(len(body), C.FEATURES), body, n.now)
    raw = Policy.issue(b, b.flow(LSID, 1), version=1, now=0.0).encode()
    body = C.PolicyMsg(raw).encode()
    from flowrouter.wire.header import pack_header
    core.receive(99, pack_header(LINK_KEY, len(body), 0), body, n.now)
    assert core.counters["policies.installed"] == 5
