"""No single application makes a router do unbounded work in one step.

Refresh digests cost the router work per entry. Attack: an application sends digests that
list far more flows than it holds (here 200,000; the live attack used 10^6 and stalled the
event loop for seconds). The core (virtual time) must do at most ``work_per_tick`` entries
between two ticks, whatever arrives; answer every entry eventually (NOT_ON_TREE for each
flow it does not hold); serve an honest application fairly meanwhile; and, past an
application's backlog, drop its digests with the limit tripped visibly (counter, alert, a
Fault(LIMIT) on band 17). :class:`flowrouter.core.workbudget.WorkBudget` on its own: shares
are equal and nothing waits for ever.
"""

from __future__ import annotations

from flowrouter.core.router import Router, RouterParams, Send
from flowrouter.core.workbudget import Waiting, WorkBudget
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT
from flowrouter.wire.flowid import LINK_LOCAL_FLOW, FlowID
from flowrouter.wire.header import pack_header, parse_header

LINK_KEY = LINK_LOCAL_FLOW.key
PER_CHUNK = 1024


class App:
    """An application link of *router*, recording what the router sends it."""

    def __init__(self, h: Harness, link_id: int, name: str) -> None:
        self.h = h
        self.link_id = link_id
        self.frames: list[tuple[object, bytes]] = []
        h.do(h.r.open_link(link_id, h.now, transport="sim", address=name))
        body = C.Hello(link_id, C.Role.ENDPOINT, name, 65536).encode()
        self.send(C.hello_header(len(body), C.FEATURES), body)

    def send(self, header: bytes, body: bytes) -> None:
        self.h.do(self.h.r.receive(self.link_id, header, body, self.h.now))

    def control(self, key: bytes, msg: object) -> None:
        body = msg.encode()  # type: ignore[attr-defined]
        self.send(pack_header(key, len(body), 0), body)

    def msgs(self, kind: type) -> list:
        out = []
        for hdr, body in self.frames:
            if hdr.band < 16 or (hdr.band == BAND_FAULT and hdr.key == LINK_KEY):
                try:
                    m = C.decode(body)
                except Exception:
                    continue
                if isinstance(m, kind):
                    out.append(m)
        return out

    def not_on_tree(self) -> set[bytes]:
        return {k for m in self.msgs(C.NotOnTree) for k in m.keys}


class Harness:
    def __init__(self, **params: object) -> None:
        self.now = 0.0
        self.r = Router(RouterParams(name="r", node_id=1, core_lsids=frozenset({0x10}),
                                     **params), now=0.0)
        self.apps: dict[int, App] = {}
        #: entries the core reconciled in each call (receive or tick)
        self.steps: list[int] = []

    def app(self, link_id: int, name: str) -> App:
        self.apps[link_id] = App(self, link_id, name)
        return self.apps[link_id]

    def do(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, Send) and a.link in self.apps:
                self.apps[a.link].frames.append((parse_header(bytes(a.header)),
                                                 bytes(a.payload)))

    def call(self, fn, *args: object) -> None:
        before = self.r.counters["refresh.entries"]
        self.do(fn(*args))
        self.steps.append(self.r.counters["refresh.entries"] - before)

    def tick(self, dt: float = 0.25) -> None:
        self.now += dt
        self.call(self.r.tick, self.now)


def digest(keys: list[bytes], round_no: int = 1) -> list[C.Refresh]:
    count = -(-len(keys) // PER_CHUNK)
    return [C.Refresh(round_no, i, count, 30_000,
                      tuple((k, 1 << 32, 0) for k in keys[i * PER_CHUNK:(i + 1) * PER_CHUNK]))
            for i in range(count)]


def frame(msg: C.Refresh) -> tuple[bytes, bytes]:
    body = msg.encode()
    return pack_header(LINK_KEY, len(body), 0), body


def test_a_digest_of_200k_foreign_flows_is_answered_within_the_budget() -> None:
    budget = 5000
    h = Harness(work_per_tick=budget, work_backlog=1 << 20)
    attacker = h.app(1, "attacker")
    honest = h.app(2, "honest")
    mine = [FlowID(0xB0B, 0x10, i).key for i in range(3)]
    for k in mine:
        honest.control(k, C.Join(1, 1 << 32))
    foreign = [FlowID(0xBAD, 0x10, i).key for i in range(200_000)]
    for msg in digest(foreign):  # all at once, as fast as the socket goes
        hdr, body = frame(msg)
        h.call(h.r.receive, 1, hdr, body, h.now)
    # the honest application's own digest arrives behind the flood
    hdr, body = frame(digest(mine)[0])
    h.call(h.r.receive, 2, hdr, body, h.now)
    assert h.r.counters["work.budget-tripped"] > 0
    ticks = 0
    while h.r.counters["refresh.entries"] < len(foreign) + len(mine):
        h.tick()
        ticks += 1
        if ticks == 2:  # fair share: the honest digest does not wait for the flood
            assert h.r.counters["refresh.rounds-received"] >= 1
        assert ticks < 1000
    # never more than the budget (plus the one chunk that opened it) in any step
    assert max(h.steps) <= budget + PER_CHUNK, max(h.steps)
    assert ticks >= len(foreign) // budget - 1
    h.tick()
    # every foreign entry answered, the honest flows kept
    assert attacker.not_on_tree() == set(foreign)
    assert not honest.not_on_tree()
    assert all(k in h.r.flows for k in mine)
    st = h.r.status()
    assert st["counters"]["work.deferred"] > 0
    assert any(a["kind"] == "work-budget" for a in st["alerts"])


def test_past_the_backlog_digests_are_dropped_visibly() -> None:
    h = Harness(work_per_tick=2048, work_backlog=4096)
    attacker = h.app(1, "attacker")
    foreign = [FlowID(0xBAD, 0x10, i).key for i in range(PER_CHUNK * 20)]
    for msg in digest(foreign):
        hdr, body = frame(msg)
        h.call(h.r.receive, 1, hdr, body, h.now)
    c = h.r.counters
    # two chunks done at once, four waiting (the backlog), the rest dropped
    assert c["refresh.chunks-dropped"] == 20 - 2 - 4
    faults = attacker.msgs(C.Fault)
    assert len(faults) == 1 and faults[0].extra["limit"] == "work-budget"
    assert faults[0].kind is C.FaultKind.LIMIT
    assert c["alerts.work-budget"] == 1
    for _ in range(10):
        h.tick()
    assert max(h.steps) <= 2048
    assert len(attacker.not_on_tree()) == 6 * PER_CHUNK
    # the round never completed: nothing of the link was removed for being missing
    assert c["refresh.rounds-received"] == 0


def test_work_waiting_on_a_closed_link_is_forgotten() -> None:
    h = Harness(work_per_tick=1024, work_backlog=1 << 20)
    h.app(1, "attacker")
    for msg in digest([FlowID(0xBAD, 0x10, i).key for i in range(PER_CHUNK * 8)]):
        hdr, body = frame(msg)
        h.call(h.r.receive, 1, hdr, body, h.now)
    done = h.r.counters["refresh.entries"]
    h.do(h.r.close_link(1, h.now, "gone"))
    h.tick()
    assert h.r.counters["refresh.entries"] == done


def test_budget_shares_equally_and_serves_everything() -> None:
    b: WorkBudget[str] = WorkBudget(per_tick=300, backlog=10_000)
    assert b.try_now(1, 200) and not b.try_now(2, 200)  # 100 left: the chunk waits
    assert b.defer(2, "small", 200, 0.0, capped=True)
    for i in range(10):
        assert b.defer(1, f"big{i}", 1000, 0.0, capped=True)
    assert not b.try_now(1, 1)  # link 1 has work waiting: its new work goes behind it
    done: dict[int, int] = {1: 0, 2: 0}

    def do(lid: int, w: Waiting[str], n: int) -> None:
        assert 0 < n <= w.size - w.done
        done[lid] += n

    assert b.serve(do) == 300
    assert done == {1: 150, 2: 150}  # equal shares
    b.serve(do)
    assert done[2] == 200  # link 2 finished; its unused share went to link 1
    while b:
        assert b.serve(do) <= 300
    assert done == {1: 10_000, 2: 200}
    # a capped link past its backlog is refused; an uncapped one (a router) never
    assert b.defer(3, "x", 10_000, 0.0, capped=True)
    assert not b.defer(3, "y", 1, 0.0, capped=True)
    assert b.defer(4, "z", 20_000, 0.0, capped=False)


def test_a_join_flood_is_cut_at_the_control_budget_per_tick() -> None:
    """Attack: 200,000 JOINs in one burst (each answered, most refused by the join quota)
    cost a router 0.44 s of loop time in one read. An application link has at most
    ``control_per_tick`` control messages handled per tick; the rest of that tick's are
    dropped before they are decoded (counted), the limit trips visibly once, and the next
    tick the application is heard again."""
    h = Harness(control_per_tick=100)
    app = h.app(1, "flooder")
    for i in range(1000):
        app.control(FlowID(0xF10D, 0x10, i).key, C.Join(i + 1, 1 << 32))
    c = h.r.counters
    assert c["control.join"] == 100
    assert c["drop.control-budget"] == 900
    assert len(app.msgs(C.JoinAck)) == 100
    faults = [f for f in app.msgs(C.Fault) if f.extra.get("limit") == "work-budget"]
    assert len(faults) == 1 and "control messages" in faults[0].detail
    h.tick()
    app.control(FlowID(0xF10D, 0x10, 5000).key, C.Join(5000, 1 << 32))
    assert c["control.join"] == 101 and len(app.msgs(C.JoinAck)) == 101


def test_router_links_are_not_held_to_the_control_budget() -> None:
    h = Harness(control_per_tick=10)
    r = h.r
    r.trust.accepted_routers = frozenset({("peer", "peer")})
    h.do(r.open_link(7, h.now, transport="sim", address="peer"))
    body = C.Hello(7, C.Role.ROUTER, "peer", 65536).encode()
    h.do(r.receive(7, C.hello_header(len(body), C.FEATURES), body, h.now))
    assert r.links[7].role is C.Role.ROUTER
    for i in range(50):
        m = C.Mask(1 << 32).encode()
        h.do(r.receive(7, pack_header(FlowID(0xF10D, 0x10, i).key, len(m), 0), m, h.now))
    assert r.counters["drop.control-budget"] == 0 and r.counters["control.mask"] == 50


def test_signed_records_count_more_against_the_control_budget() -> None:
    """A policy or a join carrying a capability costs a signature check (a hundred plain
    messages): a flood of them (valid or not) is held to control_per_tick / 16 a tick."""
    from flowrouter.core.router import SIGNED_COST
    from flowrouter.wire.capabilities import CreatorKey, Policy

    h = Harness(control_per_tick=10 * SIGNED_COST)
    app = h.app(1, "signer")
    for i in range(100):
        app.control(FlowID(0xF10D, 0x10, i).key,
                    C.Join(i + 1, 1 << 32, 0, b"\x01" + bytes(120)))  # a bogus token
    c = h.r.counters
    assert c["control.join"] == 10
    assert c["drop.control-budget"] == 90
    h.tick()
    owner = CreatorKey.generate()
    for i in range(30):
        raw = Policy.issue(owner, owner.flow(0x10, i), version=1, now=0.0).encode()
        app.control(LINK_KEY, C.PolicyMsg(raw))
    assert c["policies.installed"] == 10
    # plain joins are not charged for a signature
    h.tick()
    for i in range(50):
        app.control(FlowID(0xF10D, 0x10, 1000 + i).key, C.Join(2000 + i, 1 << 32))
    assert c["control.join"] == 10 + 50
