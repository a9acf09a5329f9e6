"""Agreed, numbered views (the Extended Virtual Synchrony shape): which sites order together.

Without it every site decided alone when a peer left or rejoined its ordering set, so around
a partition or a merge one site showed a message in order that a connected peer showed late.
With it a change of the ordering set is a small agreement among the sites that stay
together, and everything a site shows in order belongs to one *view*: sites that install the
same two views one after the other (the *transitional set*) showed the same messages, in the
same order, in the first.

**Views.** A view is a number and a member set. Its id ``vid`` is ``counter << 8 | initiator``
(numbered; two sites proposing at once differ in the initiator, the larger id wins). Every
site starts in view 0, all configured sites (as before, a site not heard yet is presumed
connected). Each message carries the view its sender was in when it sent it.

**A change** (``ViewAgreement``, one per site; sans-I/O: events in, outputs out, the clock
passed in):

1. When the set the failure detector counts as connected (*desired*, from S1/S2/S3 per peer)
   differs from the view's members, the site *proposes*: a new vid above every counter it
   has seen, with that member set.
2. A member that receives a proposal with a larger vid than its own pending one *adopts* it
   and answers with its **flush record** (a proposal is its initiator's flush record too):
   the view it is in, its Lamport clock, and per origin stream ``(incarnation, seq)`` the
   highest contiguous message it holds. From then on it sends nothing in its old view (own
   messages wait for the new one). A proposal naming a site this one does not hear is held
   back for ``timeout`` (the other site may be heard any moment after a heal); then it is
   answered with a counter-proposal without that site.
3. Once a member holds the records of every proposed member, the **cut** is agreed: for its
   transitional set (the members whose records name its own current view) the cut of each
   stream is the highest of their positions, and the new view's clock the highest of their
   clocks. Every member of the transitional set computes the same cut.
4. The site (the coordinator, :class:`~flowchat.igo.site.SiteOrdering`) fetches what it
   lacks up to the cut from the other members (the ordinary repairs), shows the old view's
   messages up to the cut in order, and calls :meth:`ViewAgreement.complete`: the
   *transitional notice* (the members that move together) and the new view are installed;
   the clock is raised to the agreed one, so every message of the new view comes after every
   message any member showed in an old one.
5. A larger proposal during a change replaces it; a member that stops being desired (silent,
   stalled) while a change is under way restarts the change without it. Records are sent
   again every ``timeout`` while some member's record is missing, and a member repeats its
   record when it hears one of a change it has completed (its answer was lost).

Messages of an old view above the cut (a site that left had sent more than the ones staying
hold) and messages of a view the site never installed are *late*: every member of the
transitional set agrees on that. A site left out of a view does not propose to take it back
for ``rejoin_after`` (the failure detection time), so a site that still hears a departed
peer does not bounce the view while its own detector catches up.

Imports only the standard library and the IGO wire records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .wire import V_FLUSH, V_PROPOSE, V_READY, ViewRecord

Position = tuple[int, int]  #: (incarnation, seq) of one origin's stream


def make_vid(counter: int, initiator: int) -> int:
    return counter << 8 | initiator


def vid_counter(vid: int) -> int:
    return vid >> 8


def vid_initiator(vid: int) -> int:
    return vid & 0xFF


def bits(members: frozenset[int]) -> int:
    out = 0
    for m in members:
        out |= 1 << m
    return out


def unbits(mask: int, n: int) -> frozenset[int]:
    return frozenset(i for i in range(n) if mask >> i & 1)


@dataclass(frozen=True)
class View:
    vid: int
    members: frozenset[int]

    @property
    def number(self) -> int:
        """The view's counter: views a site installs are numbered upwards."""
        return vid_counter(self.vid)


class LocalState(NamedTuple):
    """What this site's flush record says: its clock and, per origin, the highest
    contiguous ``(incarnation, seq)`` it holds (its own: its last sent)."""

    clock: int
    positions: tuple[Position, ...]


@dataclass(frozen=True)
class Cut:
    """An agreed change: the view being left, the one being installed, the members that
    move together and, per origin, how far the old view's messages go."""

    old: View
    new: View
    transitional: frozenset[int]
    positions: tuple[Position, ...]
    clock: int


class Broadcast(NamedTuple):
    """Multicast this view record (to every site: the members pick it up)."""

    record: ViewRecord


class FlushStarted(NamedTuple):
    """This site adopted a proposal: send nothing more in the old view."""

    vid: int
    members: frozenset[int]


class CutAgreed(NamedTuple):
    """Every member's record is in: fetch and show the old view up to the cut, then call
    :meth:`ViewAgreement.complete`."""

    cut: Cut


class Installed(NamedTuple):
    """The new view is installed (after the old one's messages up to the cut)."""

    view: View
    previous: View
    transitional: frozenset[int]


ViewOutput = Broadcast | FlushStarted | CutAgreed | Installed


@dataclass
class _Pending:
    vid: int
    members: frozenset[int]
    started: float
    answers: dict[int, ViewRecord] = field(default_factory=dict)
    sent_at: float = 0.0
    ready: set[int] = field(default_factory=set)  #: members that hold every record


class ViewAgreement:
    """One site's side of the view agreement (see the module documentation)."""

    def __init__(self, me: int, n: int, *, timeout: float, rejoin_after: float,
                 now: float = 0.0) -> None:
        self.me = me
        self.n = n
        self.timeout = timeout
        self.rejoin_after = rejoin_after
        self.view = View(0, frozenset(range(n)))
        self.high = 0  #: the highest view counter seen anywhere
        self.pending: _Pending | None = None
        self.cut: Cut | None = None  #: agreed, not yet installed
        self.installs = 0
        #: peers' announced views (heartbeats): a peer of our view that moved on to a larger
        #: one (which left us out, or that we missed) makes us propose
        self._peer_vid: dict[int, tuple[int, float]] = {}
        self._excluded_at: dict[int, float] = {}
        self._deferred: tuple[int, ViewRecord, float] | None = None
        #: records of larger proposals that came while ours was collecting: vid -> tx ->
        #: record (used when we adopt that proposal)
        self._early: dict[int, dict[int, ViewRecord]] = {}
        self._answer: ViewRecord | None = None  #: our record for the current view
        self._answer_sent = float("-inf")
        self._last_propose = float("-inf")
        self._installed_at = now
        self._next_grow = float("-inf")
        self._grow_wait = rejoin_after
        self.counters: dict[str, int] = {}

    # ------------------------------------------------------------------ queries

    @property
    def flushing(self) -> bool:
        """A change is under way: own messages wait for the new view."""
        return self.pending is not None

    def cut_position(self, origin: int) -> Position | None:
        """During an agreed change: how far the old view's messages of *origin* go."""
        if self.cut is None or origin not in self.cut.old.members:
            return None
        return self.cut.positions[origin]

    # ------------------------------------------------------------------ events

    def tick(self, now: float, local: LocalState, desired: frozenset[int],
             heard: frozenset[int], fresh: frozenset[int] = frozenset()) -> list[ViewOutput]:
        """Timers and the failure detector: *desired* is the set the failure detector
        counts as connected (ordering set, without agreement), *heard* the peers heard
        recently (desired or reconciling), *fresh* those heard within the last heartbeat
        interval."""
        out: list[ViewOutput] = []
        target = (desired | {self.me})
        p = self.pending
        if p is not None:
            # a proposal may name sites heard but not (yet) connected here (reconciling
            # after a heal): only a member neither connected nor heard is gone
            gone = p.members - target - heard - {self.me}
            silent = p.members - set(p.answers)
            if gone and self.cut is None:
                # a member left while records were collected: change again without it
                self._count("restart.member-lost")
                self._propose(p.members - gone, now, local, out)
            elif self.cut is None and now - p.started >= 3 * self.timeout and silent:
                # heard, but not answering (it does not hear some member): without it
                self._count("restart.no-answer")
                self._propose(p.members - silent, now, local, out)
            elif gone:
                # a member left after we agreed: it cannot say READY; change without it
                # (it may have installed the view, but it is not connected to us now)
                self._count("restart.member-lost-ready")
                self._propose(p.members - gone, now, local, out)
            elif now - p.sent_at >= self.timeout:
                p.sent_at = now
                self._count("record.resent")
                rec = p.answers[self.me]
                out.append(Broadcast(rec if self.cut is None else rec._replace(op=V_READY)))
            return out
        if self._deferred is not None:
            tx, rec, since = self._deferred
            members = unbits(rec.members, self.n)
            if rec.proposal <= self.view.vid:
                self._deferred = None
            elif members <= heard | target:
                self._deferred = None
                self._consider(tx, rec, now, local, desired, fresh, out)
                return out
            elif now - since >= self.timeout and now >= self._next_grow:
                self._deferred = None
                self._count("proposal.countered")
                self._backoff(now)
                self._propose(members & (heard | target) | {self.me}, now, local, out)
                return out
        want = self._proposable(target, now)
        moved_on = any(vid > self.view.vid and now - since >= self.timeout
                       for q, (vid, since) in self._peer_vid.items()
                       if q in self.view.members and q in target)
        if now - self._last_propose < self.timeout:
            return out
        if now - self._installed_at >= 4 * self.rejoin_after:
            self._grow_wait = self.rejoin_after  # the views have been calm: back to quick
        if want < self.view.members:
            self._propose(want, now, local, out)  # a member lost: at once
        elif (want != self.view.members or moved_on) and now >= self._next_grow:
            # taking sites in (or following a peer that moved on) backs off while views
            # keep changing: without transitive connectivity two sites each hear a site
            # the other does not, and would otherwise swap views every few seconds
            self._backoff(now)
            self._propose(want, now, local, out)
        return out

    def _backoff(self, now: float) -> None:
        self._next_grow = now + self._grow_wait
        self._grow_wait = min(self._grow_wait * 2, 16 * self.rejoin_after)

    def _proposable(self, target: frozenset[int], now: float) -> frozenset[int]:
        """*target* without the sites left out of a view less than ``rejoin_after`` ago."""
        return frozenset(q for q in target if q in self.view.members or q == self.me
                         or now - self._excluded_at.get(q, float("-inf")) >= self.rejoin_after)

    def on_peer_view(self, tx: int, vid: int, now: float) -> None:
        """A peer announced the view it is in (heartbeats)."""
        self.high = max(self.high, vid_counter(vid))
        old = self._peer_vid.get(tx)
        if old is None or old[0] != vid:
            self._peer_vid[tx] = (vid, now)

    def on_record(self, tx: int, rec: ViewRecord, now: float, local: LocalState,
                  desired: frozenset[int], heard: frozenset[int],
                  fresh: frozenset[int] = frozenset()) -> list[ViewOutput]:
        """A view record (proposal or flush answer) from peer *tx*. *fresh*: the peers
        heard within the last heartbeat interval (surely alive)."""
        out: list[ViewOutput] = []
        self.high = max(self.high, vid_counter(rec.proposal))
        members = unbits(rec.members, self.n)
        if self.me not in members or tx not in members:
            self._count("record.not-ours")
            return out
        p = self.pending
        if p is not None and rec.proposal == p.vid:
            if rec.op == V_READY:
                p.ready.add(tx)
            if tx not in p.answers:
                p.answers[tx] = rec._replace(op=V_FLUSH)
                self._check_agreed(out)
            return out
        current = p.vid if p is not None else self.view.vid
        if rec.proposal == self.view.vid:
            # a member still collecting records for the view we installed: repeat ours
            if self._answer is not None and now - self._answer_sent >= self.timeout / 4:
                self._answer_sent = now
                self._count("record.repeated")
                out.append(Broadcast(self._answer._replace(op=V_READY)))
            return out
        if rec.proposal < current:
            self._count("record.stale")
            return out
        if p is not None and self.cut is not None:
            # we hold every record of our proposal and said READY: the others may install
            # it as soon as they hear our READY. Keep to it, unless a member of it moves on
            # without having said READY (then nobody installs it)
            if tx in p.members and tx not in p.ready:
                self._count("proposal.given-up")
                self.pending = None
                self.cut = None
            else:
                self._count("proposal.held")
                self._early.setdefault(rec.proposal, {})[tx] = rec
                if self._deferred is None or self._deferred[1].proposal < rec.proposal:
                    self._deferred = (tx, rec, now)
                return out
        if members <= heard | desired | {self.me}:
            self._consider(tx, rec, now, local, desired, fresh, out)
        else:
            self._count("proposal.deferred")
            if self._deferred is None or self._deferred[1].proposal < rec.proposal:
                self._deferred = (tx, rec, now)
        return out

    def _consider(self, tx: int, rec: ViewRecord, now: float, local: LocalState,
                  desired: frozenset[int], fresh: frozenset[int],
                  out: list[ViewOutput]) -> None:
        """A proposal naming only sites heard here: adopt it, unless it leaves out a member
        of our view that we hear right now (the proposer does not hear it yet, after a
        heal): then propose the union instead of splitting from that member."""
        members = unbits(rec.members, self.n)
        dropped = self.view.members & desired & fresh - members
        if dropped:
            self._count("proposal.widened")
            self._propose(members | dropped, now, local, out)
        else:
            self._adopt(tx, rec, now, local, out)

    def complete(self, now: float) -> list[ViewOutput]:
        """The coordinator showed the old view's messages up to the agreed cut: install,
        once every member said READY (else it is called again later)."""
        c = self.cut
        if c is None or self.pending is None or not self.pending.ready >= c.new.members:
            return []
        previous = self.view
        self.view = c.new
        self.cut = None
        self.pending = None
        self.installs += 1
        self._installed_at = now
        self._count("installed")
        for q in previous.members | frozenset(self._excluded_at):
            if q not in c.new.members and q != self.me:
                self._excluded_at.setdefault(q, now)
        for q in c.new.members:
            self._excluded_at.pop(q, None)
        return [Installed(c.new, previous, c.transitional)]

    # ------------------------------------------------------------------ internals

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _record(self, op: int, vid: int, members: frozenset[int],
                local: LocalState) -> ViewRecord:
        return ViewRecord(op, vid, bits(members), self.view.vid, local.clock,
                          local.positions)

    def _propose(self, members: frozenset[int], now: float, local: LocalState,
                 out: list[ViewOutput]) -> None:
        members = members | {self.me}
        self.high += 1
        vid = make_vid(self.high, self.me)
        self._last_propose = now
        self._count("proposed")
        rec = self._record(V_PROPOSE, vid, members, local)
        self._start(vid, members, rec, now, out)

    def _adopt(self, tx: int, rec: ViewRecord, now: float, local: LocalState,
               out: list[ViewOutput]) -> None:
        members = unbits(rec.members, self.n)
        mine = self._record(V_FLUSH, rec.proposal, members, local)
        self._count("adopted")
        self._start(rec.proposal, members, mine, now, out)
        assert self.pending is not None
        self.pending.answers[tx] = rec
        for q, early in self._early.get(rec.proposal, {}).items():
            self.pending.answers.setdefault(q, early)
        self._early = {v: r for v, r in self._early.items() if v > rec.proposal}
        self._check_agreed(out)

    def _start(self, vid: int, members: frozenset[int], mine: ViewRecord, now: float,
               out: list[ViewOutput]) -> None:
        self.pending = _Pending(vid, members, now, {self.me: mine}, now)
        self.cut = None
        self._deferred = None
        self._answer = mine
        self._answer_sent = now
        out.append(FlushStarted(vid, members))
        out.append(Broadcast(mine))
        self._check_agreed(out)

    def _check_agreed(self, out: list[ViewOutput]) -> None:
        p = self.pending
        if p is None or self.cut is not None or set(p.answers) != set(p.members):
            return
        old = self.view
        trans = frozenset(m for m, a in p.answers.items() if a.old == old.vid)
        positions = []
        for o in range(self.n):
            best = (0, 0)
            for m in trans:
                pos = p.answers[m].positions
                if o < len(pos) and pos[o] > best:
                    best = pos[o]
            positions.append(best)
        clock = max(a.clock for a in p.answers.values())
        self.cut = Cut(old, View(p.vid, p.members), trans, tuple(positions), clock)
        self._count("agreed")
        p.ready.add(self.me)
        out.append(Broadcast(p.answers[self.me]._replace(op=V_READY)))
        out.append(CutAgreed(self.cut))
