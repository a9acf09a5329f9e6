"""Soft state that repairs itself: link liveness, refresh digests, prunes.

A part of the router (see :mod:`flowrouter.core.router`): :class:`SoftState` is its own
object, owning the timer wheel, the digest rounds being received, the sender of its own
(:class:`~flowrouter.core.digestsend.DigestSender`) and the per-link timer generations,
over the shared :class:`~flowrouter.core.state.RouterState`. The Router
hands it the soft-state messages and calls its ``tick``; the links part tells it when a link
comes up or closes (:class:`~flowrouter.core.interfaces.LinkLiveness`). It changes the trees
through membership (:class:`~flowrouter.core.interfaces.TreeUpkeep`), hands sibling masks,
a fellow member's batch of mask changes (REFRESH_UPDATE, served within the work budget like
any digest), the end of a sibling's digest round and the members' graph's refresh to the
LS exchange (``SiblingMasks``) and RTT samples to measured locality (``RttSink``). A peer
it finds dead is returned by ``tick`` for the Router to close (the links part calls the soft
state, so the soft state does not call it back). It sends the PRUNE and NOT_ON_TREE notices
any part files in the shared outbox (:class:`~flowrouter.core.state.LinkNotices`).
May import :mod:`flowrouter.wire` and the core's shared modules (state, interfaces, actions,
tables, timers, traces, workbudget, digestsend); never another part. Limits it trips go
to admission's alerts (:class:`~flowrouter.core.interfaces.Alerts`).

How the tree keeps itself (seed 002 sections 3.4 and 4.2.6, made robust the way PIM-SM is):

* **Liveness.** Every link that is up is probed with an ECHO every ``liveness_interval``;
  any frame from the peer counts as a sign of life. A router peer silent for ``dead_after``
  is closed exactly like a failed link (faults on band 17, re-graft, LS re-routing), so a
  hung machine (SIGSTOP: its kernel still answers TCP) is found within ``dead_after`` plus
  one interval. An application link is held to the same rule once the application has shown
  it speaks the protocol (sent an ECHO or ECHO_REPLY); older clients are not cut off. A peer
  whose HELLO does not announce the soft-state feature (:data:`~flowrouter.wire.control.
  FEATURE_SOFT_STATE`: a node from before these messages) is sent none of them: no ECHO,
  digest, PRUNE or NOT_ON_TREE, no death for silence; its state lasts the hold time. ECHO
  replies give a smoothed RTT per link (``status()``), the input measured locality needs.
  While data flows both ways each side already hears the other, so the probe is spared
  (slow links pay for every frame) except one every ``RTT_EVERY`` intervals for the RTT.
* **Refresh digests.** Every ``refresh_interval`` a router sends each upstream neighbour one
  digest round: the (flow, aggregate mask) of every entry whose upstream that neighbour is,
  chunked to fit the link's frames and spread over the interval (no bursts; the rounds
  sent are :mod:`flowrouter.core.digestsend`'s). A round is
  sent even when empty: "I want nothing from you" is news too. Applications (flowlib) send
  the same digests of their joins and advertisements. The receiver reconciles: it sets each
  listed (flow, link) as refreshed and corrects its mask (a lost MASK or a lost widening
  JOIN is repaired), answers NOT_ON_TREE for listed flows it has no state for (a lost JOIN:
  the sender re-joins explicitly, so admission checks still apply), and when every chunk of
  a round has arrived it drops the (flow, link) pairs that neither it nor the round before
  listed and that were not joined since that one began (a lost LEAVE is repaired within two
  or three intervals). One round is not enough: a JOIN sent after a round's snapshot may
  overtake the round's first chunk (output queues serve flows round robin), so the round
  cannot list the flow although it was joined before the round began at the receiver.
* **Hold time.** A link whose rounds stop completing (peer gone quiet, chunks lost) is swept
  once its hold time (``hold_factor x refresh_interval``, or what its digests announce)
  passes: pairs not refreshed within it are collected and the link is told (PRUNE). The
  sweep visits only that link's flows and only when its timer falls due
  (:class:`~flowrouter.core.timers.TimerWheel`), so idle maintenance never scans the table.
* **Prune and re-join.** PRUNE or NOT_ON_TREE from a node's upstream makes it re-graft the
  flow (a fresh JOIN); from a downstream neighbour it makes the node forget that branch.
  Traffic arriving from the tree's side for a flow without state is answered NOT_ON_TREE,
  so no branch stays attached but starved.

* **Work budget.** Digest entries are work per entry: all links together get
  ``work_per_tick`` entries between two ticks (:class:`~flowrouter.core.workbudget.
  WorkBudget`). A chunk that does not fit waits in its link's queue and the next ticks serve
  the queues round robin, an equal share per link, so one application listing 10^6 flows it
  does not hold delays its own answers, not the router. An application link may have
  ``work_backlog`` entries waiting; chunks past that are dropped (``refresh.chunks-dropped``:
  its round then never completes, so nothing of it is removed for missing). Either trips
  the ``work-budget`` alert: counted, logged, listed, and a ``Fault(LIMIT)`` on band 17 of
  the link-local flow to that application (at most once per ``alert_interval`` a link).

Only live endpoints keep a flow alive: an application's state lasts as long as it refreshes
it, a router's as long as some downstream neighbour does; idle state goes away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from flowrouter.core.actions import Action, Send
from flowrouter.core.digestsend import DigestSender
from flowrouter.core.interfaces import Alerts, RttSink, SiblingMasks, TreeUpkeep
from flowrouter.core.state import LINK_KEY, RouterState, link_message
from flowrouter.core.tables import Link, LinkState
from flowrouter.core.timers import TimerWheel
from flowrouter.core.workbudget import Waiting, WorkBudget
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT
from flowrouter.wire.header import pack_header

_ECHO, _ROUND, _HOLD = 1, 2, 3  #: timer kinds, filed in the wheel as (kind, link id, gen)
#: (flow, link) pairs one tick expires at most (the rest wait for the next ticks)
EXPIRE_PER_TICK = 5000
#: an ECHO goes out at least every this many liveness intervals, even on a busy link
RTT_EVERY = 10
#: bounds on the hold time a neighbour may ask for (seconds)
MIN_HOLD, MAX_HOLD = 1.0, 3600.0


@dataclass(slots=True)
class RxRound:
    """A digest round being received from one downstream neighbour."""

    number: int
    count: int
    started: float
    got: set[int] = field(default_factory=set)
    entries: int = 0
    repaired: int = 0
    unknown: int = 0
    #: downstream (flow, link) pairs refreshed for the first time in this round: when it
    #: equals the link's downstream count at the end, nothing is stale and the link's flows
    #: need not be scanned
    fresh: int = 0


class SoftState:
    """Liveness, refresh digests, hold times and prunes (see the module docs)."""

    def __init__(self, state: RouterState, trees: TreeUpkeep, siblings: SiblingMasks,
                 rtt: RttSink, alerts: Alerts | None = None) -> None:
        p = state.p
        self.state = state
        self.trees = trees
        self.siblings = siblings
        self.rtt = rtt
        self.alerts = alerts
        #: digest entries all links may make us process per tick; what waits, per link
        self.budget: WorkBudget[C.Refresh] = WorkBudget(p.work_per_tick, p.work_backlog)
        #: per link: when it last heard of a tripped work budget
        self._budget_told: dict[int, float] = {}
        self.p = p
        self.links = state.links
        self.flows = state.flows
        self.counters = state.counters
        self.routing = state.routing
        self.policies = state.policies
        self.tracer = state.tracer
        self.tracing = state.tracing
        #: echoes, digest rounds and hold-time sweeps, filed as (kind, link id, generation)
        self.wheel = TimerWheel(min(p.liveness_interval, p.refresh_interval) / 4)
        #: digest rounds being sent (to each upstream neighbour)
        self.sender = DigestSender(state)
        #: digest rounds being received per link; per-link timer generations
        self._rx: dict[int, RxRound] = {}
        self._gen: dict[int, int] = {}
        #: per link: when the last complete digest round from it began here (pairs not
        #: refreshed since are what the next complete round may drop)
        self._rx_began: dict[int, float] = {}
        #: per link: keys a hold-time sweep found expired, still to collect (a few a tick)
        self._expiring: dict[int, list[bytes]] = {}
        #: peers found dead during this tick, for the Router to close: (link id, reason)
        self._dead: list[tuple[int, str]] = []

    # ------------------------------------------------------------------ link events
    def link_up(self, link: Link, now: float) -> None:
        """A link came up: start its echoes, its digest rounds (router peers) and its
        hold-time backstop."""
        lid = link.link_id
        gen = self._gen[lid] = self._gen.get(lid, 0) + 1
        link.heard = now
        wheel = self.wheel
        if _speaks_soft_state(link):  # the first echo at once: an RTT right away
            wheel.schedule((_ECHO, lid, gen), now)
        else:  # a node from before soft state would drop the link on our first ECHO
            self.counters["liveness.peer-without-soft-state"] += 1
        if link.role is C.Role.ROUTER:
            wheel.schedule((_ROUND, lid, gen), now)
        wheel.schedule((_HOLD, lid, gen), now + self.p.hold)

    def link_closed(self, link_id: int) -> None:
        """A link closed (or was found dead): its timers, rounds and notices go."""
        self._gen.pop(link_id, None)
        self._expiring.pop(link_id, None)
        self.sender.forget(link_id)
        self._rx.pop(link_id, None)
        self._rx_began.pop(link_id, None)
        self.budget.forget(link_id)
        self._budget_told.pop(link_id, None)
        self.state.notices.forget(link_id)

    def input_paused(self, link_id: int, paused: bool, now: float) -> None:
        """The shell stopped (or resumed) reading *link_id* (input credit): while it does
        not read, the peer's silence proves nothing, so liveness leaves the link alone."""
        link = self.links.get(link_id)
        if link is not None:
            link.reading_paused = paused
            link.heard = now

    # ------------------------------------------------------------------ messages
    def on_message(self, link: Link, msg: Any, now: float) -> list[Action]:
        """A link-local soft-state message (ECHO, ECHO_REPLY, REFRESH, PRUNE, NOT_ON_TREE)."""
        if isinstance(msg, C.Echo):
            link.speaks_liveness = True
            return [link_message(link.link_id, C.EchoReply(msg.seq, msg.stamp))]
        if isinstance(msg, C.EchoReply):
            link.speaks_liveness = True
            sample = now - msg.stamp / 1e6
            if 0 <= sample < 3600:
                link.last_rtt = sample
                link.rtt = sample if link.rtt is None else 0.875 * link.rtt + 0.125 * sample
                self.rtt.measure_rtt(link.link_id, sample, now)  # measured locality
            else:
                self.counters["liveness.bad-echo-reply"] += 1
            return []
        if isinstance(msg, C.Refresh):
            return self._on_refresh(link, msg, now)
        return self._on_detach(link, msg, now)

    def _on_refresh(self, link: Link, msg: C.Refresh, now: float) -> list[Action]:
        """A digest chunk: reconciled now if the work budget holds it, else queued behind
        the link's waiting chunks (or dropped past an application's backlog)."""
        lid = link.link_id
        self.counters["refresh.chunks-received"] += 1
        size = len(msg.entries)
        budget = self.budget
        if budget.try_now(lid, size):
            return self._refresh_entries(link, msg, 0, size, now, now)
        if budget.defer(lid, msg, size, now, capped=link.role is not C.Role.ROUTER):
            self.counters["work.deferred"] += size
            return self.budget_tripped(link, now, f"{budget.waiting(lid)} digest entries "
                                                  "waiting")
        self.counters["refresh.chunks-dropped"] += 1
        return self.budget_tripped(link, now, f"digest chunk of {size} entries dropped: "
                                              f"{budget.waiting(lid)} already waiting "
                                              f"(work_backlog {budget.backlog})")

    def budget_tripped(self, link: Link, now: float, what: str) -> list[Action]:
        """Count the tripped work budget; alert, and tell an application on band 17 of the
        link-local flow, at most once per alert interval per link."""
        self.counters["work.budget-tripped"] += 1
        last = self._budget_told.get(link.link_id)
        if last is not None and now - last < self.p.alert_interval:
            return []
        self._budget_told[link.link_id] = now
        detail = f"{link.describe()}: work budget exceeded: {what}"
        out = [] if self.alerts is None else self.alerts.alert("work-budget", detail, now)
        if link.role is C.Role.ENDPOINT:
            body = C.Fault(C.FaultKind.LIMIT, self.p.name, detail,
                           {"limit": "work-budget"}).encode()
            out.append(Send(link.link_id, pack_header(LINK_KEY, len(body), BAND_FAULT), body))
        return out

    def _serve_waiting(self, now: float) -> list[Action]:
        """A tick: the waiting digest chunks, as far as the refilled budget goes."""
        out: list[Action] = []

        def do(lid: int, w: Waiting[C.Refresh], n: int) -> None:
            link = self.links.get(lid)
            if link is not None and link.state is LinkState.UP:
                out.extend(self._refresh_entries(link, w.item, w.done, w.done + n, w.at, now))

        self.counters["work.served"] += self.budget.serve(do)
        return out

    def _refresh_entries(self, link: Link, msg: C.Refresh, start: int, end: int,
                         received: float, now: float) -> list[Action]:
        """Reconcile entries ``start:end`` of a chunk that arrived at *received*; the last
        of them completes the chunk."""
        lid = link.link_id
        counters = self.counters
        if msg.count == C.REFRESH_UPDATE:  # a fellow member's batch of mask changes
            return self.siblings.on_sibling_update(link, msg.entries[start:end], now)
        rx = self._rx.get(lid)
        if rx is None or rx.number != msg.round or rx.count != msg.count:
            rx = self._rx[lid] = RxRound(msg.round, msg.count, received)
        if msg.hold_ms and start == 0:
            link.hold = min(MAX_HOLD, max(MIN_HOLD, msg.hold_ms / 1000))
        out: list[Action] = []
        unknown: list[bytes] = []
        flows = self.flows
        strict = self.state.policies_active and link.role is C.Role.ENDPOINT
        wall = now + self.state.wall_offset
        entries = msg.entries if start == 0 and end == len(msg.entries) \
            else msg.entries[start:end]
        counters["refresh.entries"] += len(entries)
        for key, mask, flags in entries:
            rx.entries += 1
            if flags & C.REFRESH_SIBLING:
                out += self.siblings.on_sibling_mask(link, key, C.Mask(mask), now)
                continue
            entry = flows.get(key)
            if entry is None or not entry.has_down(lid):
                if entry is not None and entry.upstream == lid:
                    counters["refresh.from-upstream"] += 1
                else:
                    unknown.append(key)
                continue
            if strict and link.caps:
                cap = link.caps.get(key)
                if cap is not None and cap.expiry <= wall:  # refreshing re-checks it
                    out += self.trees.withdraw(link, key, "expired", now)
                    continue
            before = entry.refresh(lid, now)
            if before is None or before < rx.started:
                rx.fresh += 1
            if entry.mask_of(lid) != mask:
                if strict and self.policies.requires(key, "join"):
                    unknown.append(key)  # a different mask needs the capability: re-join
                    continue
                entry.set_down(lid, mask, now)
                entry.recompute()
                self.state.entry_changed(key)  # the fast path forwards by the new mask
                rx.repaired += 1
                counters["refresh.masks-repaired"] += 1
                if self.tracing:
                    self.tracer.link_add(now, key, lid, mask, "refresh", link.role)
                out += self.trees.push_mask(key, entry)
        if unknown:
            rx.unknown += len(unknown)
            counters["refresh.unknown"] += len(unknown)
            self.state.notices.not_on_tree(lid, unknown)
        if end < len(msg.entries):
            return out
        rx.got.add(msg.index)
        if len(rx.got) == rx.count:
            del self._rx[lid]
            out += self._round_complete(link, rx, now)
        return out

    def _round_complete(self, link: Link, rx: RxRound, now: float) -> list[Action]:
        """Every chunk of a round arrived: what neither it nor the round before listed is
        no longer wanted (unless it was joined after that round began: a JOIN that
        overtook this round's first chunk was sent after its snapshot)."""
        lid = link.link_id
        self.counters["refresh.rounds-received"] += 1
        link.round_done_at = now
        out: list[Action] = []
        started = self._rx_began.get(lid)
        self._rx_began[lid] = rx.started
        flows = self.flows
        if started is None or rx.fresh >= link.downstream:
            # the link's first round (nothing to compare with yet), or every downstream
            # pair was in the round
            stale = []
        else:
            stale = [key for key in link.dependent
                     if (e := flows.get(key)) is not None
                     and (at := e.refreshed_at(lid)) is not None and at < started]
        removed = len(stale)
        for key in sorted(stale):  # sorted: the same order in every process
            entry = flows[key]
            self.trees.drop_down(entry, key, lid, "refresh", now)
            out += self.trees.after_change(key, entry, now, "refresh")
        if removed:
            self.counters["refresh.links-removed"] += removed
        if started is not None and self.routing.sibling_link(lid):
            # a fellow LS member: the masks neither this round nor the one before listed
            out += self.siblings.sibling_round_done(link, started, now)
        if self.tracing:
            self.tracer.refresh(now, lid, "received", rx.entries, rx.count, rx.repaired,
                                removed, rx.unknown)
        return out

    def _on_detach(self, link: Link, msg: C.Prune | C.NotOnTree, now: float) -> list[Action]:
        """The neighbour dropped (PRUNE) or never had (NOT_ON_TREE) these flows' state."""
        lid = link.link_id
        what = "prune" if isinstance(msg, C.Prune) else "not-on-tree"
        self.counters[f"refresh.{what}-received"] += 1
        if self.tracing:
            self.tracer.prune(now, lid, "received", what, len(msg.keys))
        out: list[Action] = []
        for key in msg.keys:
            entry = self.flows.get(key)
            if entry is None:
                continue
            if entry.upstream == lid:
                # cut off above us: graft again (a fresh JOIN carries our aggregate)
                entry.joined = False
                if entry.up_req is None:
                    self.counters["refresh.regrafts"] += 1
                    out += self.trees.send_join_up(key, entry, now)
            elif entry.has_down(lid):
                self.trees.drop_down(entry, key, lid, what, now)
                out += self.trees.after_change(key, entry, now, what)
        return out

    # ------------------------------------------------------------------ time
    def tick(self, now: float) -> tuple[list[Action], list[tuple[int, str]]]:
        """Timers that fell due, the chunks due by now, and batched notices; and the peers
        found dead, (link id, reason), for the Router to close (their timers, rounds and
        notices are already gone)."""
        out: list[Action] = []
        gens = self._gen
        links = self.links
        for item in self.wheel.pop_due(now):
            kind, lid, gen = cast(tuple[int, int, int], item)
            if gens.get(lid) != gen:
                continue  # the link went away (or came back since): a stale timer
            link = links.get(lid)
            if link is None or link.state is not LinkState.UP:
                continue
            if kind == _ECHO:
                out += self._echo(link, gen, now)
            elif kind == _ROUND:
                period = (self.sender.start(link, now) if _speaks_soft_state(link)
                          else self.p.refresh_interval)
                self.wheel.schedule(item, now + period)
                # the LS route vector is soft state too: sent on change, repeated here so a
                # lost update cannot leave a neighbour with a stale route
                vector = C.LsRoutes(self.routing.vector_for(lid))
                out.append(link_message(lid, vector))
                if self.routing.sibling_link(lid):  # and so is the members' graph
                    out += self.siblings.topology_refresh(lid, now)
            else:
                out += self._hold_sweep(link, gen, now)
        if self.sender:
            out += self.sender.send_due(now)
        if self.budget:
            out += self._serve_waiting(now)
        else:
            self.budget.left = self.budget.per_tick
        if self.state.notices:
            out += self._flush_notices(now)
        dead, self._dead = self._dead, []
        return out, dead

    def _echo(self, link: Link, gen: int, now: float) -> list[Action]:
        p = self.p
        silent = 0.0 if link.reading_paused else now - link.heard
        if silent > p.dead_after and (link.role is C.Role.ROUTER or link.speaks_liveness):
            self.counters["liveness.dead"] += 1
            reason = (f"peer silent for {silent:.1f}s (dead after {p.dead_after:g}s): hung or "
                      "unreachable")
            self.link_closed(link.link_id)
            self._dead.append((link.link_id, reason))
            return []
        self.wheel.schedule((_ECHO, link.link_id, gen), now + p.liveness_interval)
        if (silent < p.liveness_interval and link.tx != link.tx_at_echo
                and now - link.echo_at < RTT_EVERY * p.liveness_interval):
            # data flows both ways: each side already hears the other, so the probe is
            # spared (slow links pay for every frame); one still goes out now and then to
            # keep the RTT fresh
            link.tx_at_echo = link.tx
            self.counters["liveness.echoes-spared"] += 1
            return []
        link.tx_at_echo = link.tx
        link.echo_at = now
        link.echo_seq = (link.echo_seq + 1) & 0xFFFFFFFF
        self.counters["liveness.echoes"] += 1
        stamp = int(now * 1e6) & 0xFFFFFFFFFFFFFFFF
        return [link_message(link.link_id, C.Echo(link.echo_seq, stamp))]

    def _hold_sweep(self, link: Link, gen: int, now: float) -> list[Action]:
        """Backstop for a link whose rounds stopped completing (or an application that
        never refreshes): collect what the hold time says has expired, and PRUNE it."""
        lid = link.link_id
        hold = link.hold or self.p.hold
        flows = self.flows
        limit = now - hold
        queue = self._expiring.get(lid)
        if not queue:
            self.wheel.schedule((_HOLD, lid, gen), now + hold / 2)
            if not link.downstream or now - max(link.round_done_at, link.opened_at) < hold:
                return []  # nothing downstream, or its rounds complete: nothing is overdue
            # the link's flows are the candidates; they are checked EXPIRE_PER_TICK at a
            # time, tick after tick, so neither the scan nor the expiry of a huge table
            # blocks the event loop for long
            queue = self._expiring[lid] = list(link.dependent)
        batch = queue[-EXPIRE_PER_TICK:]
        del queue[-EXPIRE_PER_TICK:]
        if queue:
            self.wheel.schedule((_HOLD, lid, gen), now)  # the rest at the next tick
        else:
            self._expiring.pop(lid, None)
        stale = [key for key in batch
                 if (e := flows.get(key)) is not None
                 and (at := e.refreshed_at(lid)) is not None and at <= limit]
        out: list[Action] = []
        for key in sorted(stale):  # sorted: the same order in every process
            entry = flows[key]
            self.trees.drop_down(entry, key, lid, "expired", now)
            self.counters["gc.links-collected"] += 1
            if not entry.down_count():
                self.counters["gc.entries-collected"] += 1
            self.state.notices.prune(lid, key)
            out += self.trees.after_change(key, entry, now, "expired")
        return out

    def _flush_notices(self, now: float) -> list[Action]:
        out: list[Action] = []
        notices = self.state.notices.take()
        for (lid, mtype), keys in sorted(notices.items()):
            link = self.links.get(lid)
            if link is None or link.state is not LinkState.UP:
                continue
            if not _speaks_soft_state(link):
                self.counters["refresh.notices-withheld"] += 1
                continue
            if mtype == C.MsgType.NOT_ON_TREE:
                # a flow joined through this neighbour since the notice was filed (a tree
                # re-grafting after a link failure): the notice is stale, and would cut
                # the branch the JOIN just made
                keys = {k for k in keys
                        if getattr(self.flows.get(k), "upstream", None) != lid}
                if not keys:
                    continue
            ordered = sorted(keys)
            per = C.keys_capacity(link.max_payload)
            cls = C.Prune if mtype == C.MsgType.PRUNE else C.NotOnTree
            what = "prune" if cls is C.Prune else "not-on-tree"
            out += [link_message(lid, cls(tuple(ordered[i:i + per])))
                    for i in range(0, len(ordered), per)]
            self.counters[f"refresh.{what}-sent"] += 1
            if self.tracing:
                self.tracer.prune(now, lid, "sent", what, len(ordered))
        return out

    # ------------------------------------------------------------------ inspection
    def liveness_status(self, link: Link, now: float | None) -> dict[str, Any]:
        """What the status query shows of a link's liveness (RTT for measured locality)."""
        return {"rtt_ms": None if link.rtt is None else round(link.rtt * 1000, 3),
                "last_rtt_ms": None if link.last_rtt is None
                else round(link.last_rtt * 1000, 3),
                "silent_s": None if now is None or link.state is not LinkState.UP
                else round(max(0.0, now - link.heard), 3),
                "hold_s": link.hold or self.p.hold}


def _speaks_soft_state(link: Link) -> bool:
    """The peer announced the soft-state messages in its HELLO (wire.control features) or
    has sent one itself; no other peer is sent any (a node from before them would drop the
    link): it is never declared dead for silence, and what it holds lasts the hold time."""
    return bool(link.features & C.FEATURE_SOFT_STATE) or link.speaks_liveness
