"""The router core's parts stand alone: each is built from the shared state and the
collaborators its interfaces name, and can be driven by itself with stand-ins for the rest.

These tests hold the composition itself (``flowrouter.core.interfaces``): no part inherits
another or the state, a part calls only what it was handed, and the two decisions that
travel back through the Router (a dead peer, revoked members) are returned, not called.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from flowrouter.core import (
    admission,
    appmembers,
    forwarding,
    links,
    locality,
    lsexchange,
    membership,
    softstate,
)
from flowrouter.core.actions import Send
from flowrouter.core.admission import Admission
from flowrouter.core.membership import Membership
from flowrouter.core.params import RouterParams
from flowrouter.core.router import Router
from flowrouter.core.softstate import SoftState
from flowrouter.core.state import RouterState
from flowrouter.core.tables import FlowEntry, Link, LinkState
from flowrouter.wire import control as C
from flowrouter.wire.appmembers import MemberEvent
from flowrouter.wire.flowid import FlowID

LSID = 0x10
KEY = FlowID(0xBEEF, LSID, 1).key
PART_MODULES = (admission, appmembers, forwarding, links, locality, lsexchange, membership,
                softstate)


class Recorder:
    """A stand-in for any collaborator: records each call, answers *answers[name]*."""

    def __init__(self, **answers: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answers = answers

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: Any, **kw: Any) -> Any:
            self.calls.append((name, args))
            return self.answers.get(name)
        return call

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def _up_link(state: RouterState, link_id: int, role: C.Role, now: float = 0.0) -> Link:
    link = Link(link_id, "sim", f"peer{link_id}", (0, 0, 0, 0), role=role,
                state=LinkState.UP, peer_name=f"peer{link_id}", opened_at=now, up_at=now,
                heard=now, features=C.FEATURE_SOFT_STATE)
    state.links[link_id] = link
    return link


def test_no_part_inherits_another_or_the_state() -> None:
    assert Router.__mro__ == (Router, object)
    for module in PART_MODULES:
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and not name.endswith("Round"):
                assert cls.__bases__ == (object,), f"{module.__name__}.{name} inherits"


def test_soft_state_returns_a_dead_peer_instead_of_closing_it() -> None:
    p = RouterParams("r", 1, liveness_interval=0.5, dead_after=1.5, refresh_interval=1.0)
    state = RouterState(p)
    trees, siblings, rtt = Recorder(), Recorder(), Recorder()
    soft = SoftState(state, trees, siblings, rtt)
    link = _up_link(state, 7, C.Role.ROUTER)
    soft.link_up(link, 0.0)
    out, dead = soft.tick(0.25)  # (the wheel's slots are a quarter interval wide)
    assert dead == [] and any(isinstance(a, Send) and isinstance(C.decode(a.payload), C.Echo)
                              for a in out)
    now = 0.25
    while not dead and now < 5.0:  # the peer never answers
        now = round(now + 0.25, 9)
        out, dead = soft.tick(now)
    assert [lid for lid, _ in dead] == [7] and "silent" in dead[0][1]
    assert 1.5 < now <= 1.5 + 0.5 + 0.25  # within dead_after plus one interval
    assert 7 in state.links  # still there: closing is the links part's job (the Router's)
    out, dead = soft.tick(now + 1.0)  # its timers went with it: no echo, no second verdict
    assert dead == [] and not [a for a in out if a.link == 7]
    assert trees.calls == []


def test_membership_asks_admission_and_tells_app_membership() -> None:
    state = RouterState(RouterParams("core", 1, core_lsids=frozenset({LSID})))
    admit = Recorder(over_quota=[], authorize_join=None)
    members = Recorder()
    trees = Membership(state, admit, members, 0.0)
    app = _up_link(state, 3, C.Role.ENDPOINT)
    out = trees.on_join(app, KEY, C.Join(9, 1 << 32), 0.0)
    assert isinstance(out[0], Send)
    ack = C.decode(out[0].payload)
    assert isinstance(ack, C.JoinAck) and ack.status is C.JoinStatus.OK
    assert admit.names() == ["over_quota"]  # no policy in force: no capability check
    assert members.calls == [("member_changed", (KEY, app, MemberEvent.JOIN, 1 << 32, 0))]
    del state.links[3]  # the links part forgets the link, then hands it to membership
    assert trees.link_down(app, "gone", 1.0) == []
    assert members.names()[-1] == "member_changed" and members.calls[-1][1][2] is \
        MemberEvent.LEAVE
    assert KEY not in state.flows and state.counters["flows.removed"] == 1


def test_admission_returns_the_members_a_policy_excludes() -> None:
    from flowrouter.wire.capabilities import Capability, CreatorKey, Policy

    state = RouterState(RouterParams("r", 1))
    adm = Admission(state)
    owner = CreatorKey.generate()
    key = owner.flow(LSID, 1).key
    revoked, kept, bare = (_up_link(state, lid, C.Role.ENDPOINT) for lid in (4, 5, 6))
    caps = [Capability.issue(owner, key, name, join=[40], ttl=3600, now=0.0)
            for name in ("a", "b")]
    revoked.caps, kept.caps = {key: caps[0]}, {key: caps[1]}
    entry = FlowEntry(None, True, 0.0)
    state.add_entry(key, entry)
    for lid in (4, 5, 6):
        entry.set_down(lid, 1 << 40, 0.0)
    pol = state.policies.install(Policy.issue(owner, key, version=1, revoked=[caps[0].serial],
                                              now=0.0).encode())
    assert sorted(adm.excluded_by(pol, 1.0), key=lambda t: t[0].link_id) == [
        (revoked, key, "revoked"), (bare, key, "policy")]
    assert revoked.caps == {key: caps[0]}  # nothing withdrawn here: membership does it


def test_a_mask_repaired_by_a_digest_reaches_the_fast_path_mirror() -> None:
    state = RouterState(RouterParams("core", 1, core_lsids=frozenset({LSID})))
    fib = state.fib = Recorder()
    soft = SoftState(state, Recorder(push_mask=[]), Recorder(), Recorder())
    app = _up_link(state, 5, C.Role.ENDPOINT)
    entry = state.flows[KEY] = FlowEntry(None, True, 0.0)
    entry.set_down(5, 1 << 32, 0.0)  # the JOIN said band 32; a later MASK (band 33) was lost
    entry.recompute()
    digest = C.Refresh(1, 0, 1, 0, ((KEY, 1 << 33, 0),))
    assert soft.on_message(app, digest, 1.0) == []
    assert entry.down[5] == 1 << 33 and state.counters["refresh.masks-repaired"] == 1
    assert ("flow_changed", (KEY,)) in fib.calls  # else the mirror forwards band 32 still


def test_a_flow_entry_keeps_its_downstream_links_in_join_order() -> None:
    """One link inline, a dict past one, inline again when one is left: the readers see
    the same links, masks, times and order whichever way they are stored."""
    e = FlowEntry(1, True, 0.0)
    assert (e.down_count(), e.down_items(), e.last_refreshed(), e.recompute()) == (0, [], None, 0)
    assert e.set_down(7, 1 << 32, 1.0) is None and e.refresh(8, 2.0) is None
    assert e.set_down(7, 1 << 33, 1.5) == 1 << 32 and e.refresh(7, 2.0) == 1.5
    assert e.set_down(3, 1 << 32, 3.0) is None and e.set_down(9, 1 << 34, 4.0) is None
    assert e.down_items() == [(7, 1 << 33), (3, 1 << 32), (9, 1 << 34)]
    assert e.down == {7: 1 << 33, 3: 1 << 32, 9: 1 << 34} and e.down_count() == 3
    assert e.traffic == {7: 2.0, 3: 3.0, 9: 4.0} and e.last_refreshed() == 4.0
    assert e.targets(1 << 32) == [3] and e.targets(1 << 33 | 1 << 34, skip=9) == [7]
    assert e.recompute() == (1 << 32 | 1 << 33 | 1 << 34) == e.agg
    assert e.refresh(3, 5.0) == 3.0 and e.refreshed_at(3) == 5.0 and e.mask_of(3) == 1 << 32
    assert e.remove_down(7) == (1 << 33, 2.0) and e.remove_down(7) is None
    assert e.remove_down(9) == (1 << 34, 4.0)
    assert (e.down_items(), e.traffic, e.has_down(3), e.has_down(9)) == (
        [(3, 1 << 32)], {3: 5.0}, True, False)
    assert e.set_down(11, 1 << 40, 6.0) is None  # a second link again: the order holds
    assert e.down_links() == [3, 11] and e.mask_of(11) == 1 << 40 and e.mask_of(12) is None
    assert e.remove_down(3) == (1 << 32, 5.0) and e.remove_down(11) == (1 << 40, 6.0)
    assert (e.down_count(), e.targets(~0), e.recompute(), e.refreshed_at(11)) == (0, [], 0, None)
    with pytest.raises(TypeError):  # a copy to read, never to write through
        e.down[1] = 1  # type: ignore[index]
