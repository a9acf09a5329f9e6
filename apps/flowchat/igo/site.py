"""SiteOrdering: the IGO state machine of one site, a coordinator over its parts (states,
transport, repairs, Lamport or leader ordering, stability). Sans-I/O: imports only the
standard library, flowrouter.wire and the other IGO modules."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flowrouter.wire.bands import (
    BAND_HEARTBEAT,
    BAND_ORDER,
    BAND_REPAIR,
)

from .actions import Action, Congestion, PeerState, Send
from .auth import data_signature_ok, split_trailer
from .config import IGOConfig
from .core import SiteCore
from .flowcontrol import SendWindow
from .history import HistoryFetch
from .incarnations import Incarnations
from .lamport import LamportOrdering
from .leader import LeaderOrdering
from .records import Msg
from .repair import Repairs
from .stability import StabilityTracking
from .stall import StallWatch
from .states import PeerStates
from .transport import FifoTransport
from .viewsync import ViewSync
from .wire import (
    F_STABLE_ACK,
    K_DATA,
    K_GONE,
    K_HEARTBEAT,
    K_NACK,
    K_ORDER,
    K_VIEW,
    KIND_NAMES,
    DataMsg,
    ForeignFrame,
    OldVersion,
    ProtocolError,
    data_signed_bytes,
    decode,
)

if TYPE_CHECKING:
    from .auth import FrameAuth


class SiteOrdering:
    """The IGO state machine of one site. See the module documentation.

    *incarnation* tells this run of the site from earlier ones (a restarted site starts its
    sequence numbers again); it must grow from run to run (default
    :func:`~flowchat.igo.core.new_incarnation` of *now*, so *now* should be wall-clock
    time, or pass one made from it). All methods take the current time in seconds
    (any monotonic clock shared in meaning with the other sites' send times: virtual time in
    the simulator, ``time.time()`` on real hosts) and return a list of actions.

    The coordinator: it owns the shared state (:class:`~flowchat.igo.core.SiteCore`) and one
    object per concern, each given the state and the narrow interfaces (:mod:`.parts`) of
    the others it asks, and it routes events to them.
    """

    def __init__(self, config: IGOConfig, site: str, now: float = 0.0,
                 incarnation: int | None = None, auth: FrameAuth | None = None,
                 shown: Iterable[tuple[str, int, int]] = (),
                 sent: tuple[int, int] | None = None) -> None:
        core = self.core = SiteCore(config, site, now, incarnation, auth, shown)
        # what never changes after construction, for short names (and the public API)
        self.cfg = core.cfg
        self.site = core.site
        self.me = core.me
        self.n = core.n
        self.tag = core.tag
        self.inc = core.inc
        self.auth = core.auth
        self.mode = core.mode
        self.leader = core.leader
        self.is_leader = core.is_leader
        self.counters = core.counters
        self.streams = core.streams
        self.retired = core.retired
        self.peers = core.peers
        #: own messages in flight and the outbox (congestion), see flowcontrol.py
        self.flow = SendWindow(config.send_window, config.outbox_limit)
        self._congested = False
        self._liveness = liveness = PeerStates(core)
        self._incs = incs = Incarnations(core)
        self._transport = transport = FifoTransport(core)
        self._repair = repair = Repairs(core, now)
        self._ordering = ordering = LamportOrdering(core, now)
        self._stability = stability = StabilityTracking(core)
        self._leading = leading = LeaderOrdering(core)
        self._history = history = HistoryFetch(core, now)
        liveness.connect(incarnations=incs, transport=transport, repairs=repair,
                         ordering=ordering, leader=leading)
        incs.connect(liveness=liveness, transport=transport, repairs=repair,
                     ordering=ordering, leader=leading)
        transport.connect(liveness=liveness, incarnations=incs, repairs=repair,
                          ordering=ordering)
        repair.connect(liveness=liveness, transport=transport, ordering=ordering,
                       leader=leading)
        ordering.connect(liveness=liveness, transport=transport, repairs=repair,
                         stability=stability, leader=leading)
        stability.connect(liveness=liveness, repairs=repair)
        leading.connect(liveness=liveness, repairs=repair, ordering=ordering)
        history.connect(repairs=repair, transport=transport)
        self._views = views = ViewSync(core, now)
        views.connect(liveness=liveness, repairs=repair, ordering=ordering)
        liveness.attach_views(views)
        ordering.attach_views(views)
        liveness.update_membership(now)
        if sent is not None:
            history.own_tail(sent[0], sent[1], now)

    @property
    def seq(self) -> int:
        """The last own sequence number (of this run)."""
        return self.core.seq

    @property
    def clock(self) -> int:
        """The Lamport clock: the next own message gets this time."""
        return self.core.clock

    @property
    def state(self) -> PeerState:
        """The site's overall state: S1, or S2 / S3 while a peer (the leader, following
        one) is disconnected."""
        return self.core.state

    @property
    def deliveries(self) -> int:
        return self.core.deliveries

    @property
    def stalls(self) -> StallWatch:
        return self._liveness.stalls

    @property
    def undelivered(self) -> int:
        """Messages ordered and ready but not delivered yet (none once the site caught up)."""
        return len(self.core.ready)

    def _begin(self, now: float) -> None:
        self.core.now = now

    def finish(self, now: float) -> list[Action]:
        """The actions of the event just handled (orders drained and flushed, display paced);
        every event handler ends with it, and a driver calls it once after construction."""
        core = self.core
        if self.mode == "leader" and not self.is_leader:
            self._leading.drain_orders(now)
        self._leading.flush_orders()
        self._ordering.release_display(now)
        out, core.out = core.out, []
        if self.auth is not None:
            sign = self.auth.sign
            out = [Send(a.band, a.payload + sign(a.payload), a.kind) if isinstance(a, Send)
                   else a for a in out]
        return out

    def _check_band(self, kind: int, band: int, msg: Any) -> None:
        inbox = band == self.cfg.inbox_band(self.me)
        ok = {K_DATA: band == self.cfg.data_band or inbox,
              K_HEARTBEAT: band == BAND_HEARTBEAT,
              K_NACK: band == BAND_REPAIR or inbox,
              K_GONE: band == BAND_REPAIR or inbox,
              K_ORDER: band == BAND_ORDER or inbox,
              K_VIEW: band == BAND_HEARTBEAT}[kind]
        if not ok:
            raise ProtocolError("band", f"{KIND_NAMES[kind]} on band {band}")

    def bands(self) -> list[int]:
        """The bands this site must listen to on the room flow."""
        return sorted({BAND_HEARTBEAT, BAND_REPAIR, BAND_ORDER, self.cfg.data_band,
                       self.cfg.inbox_band(self.me)})

    @property
    def members(self) -> tuple[str, ...]:
        return self.core.members

    @property
    def view(self) -> dict[str, Any]:
        """The agreed view (all-to-all modes): its id and number, members, the last
        transitional set and a change under way (see :mod:`.views`)."""
        return self._views.status()

    @property
    def congested(self) -> bool:
        """More is offered than the network takes (see :mod:`.flowcontrol`): new messages
        wait in the outbox; the application should tell its users to slow down."""
        return self.flow.congested

    def submit(self, payload: bytes, now: float) -> list[Action]:
        """A message from this site's clients: number it, multicast it, order it; while
        congested it waits in the outbox instead (raises :class:`~flowchat.igo.flowcontrol.
        OutboxFull` when that is full: the message was not taken)."""
        self._begin(now)
        if self.flow.offer(bytes(payload), now):
            self._send_own(bytes(payload), now)
        else:
            self.counters["outbox.queued"] += 1
        self._pump(now)
        return self.finish(now)

    def _pump(self, now: float) -> None:
        """Acknowledgements in: let queued messages go while the window allows, and say
        when the site becomes congested or clear."""
        # whose acknowledgements count: every connected site (all-to-all, hasten); the
        # leader alone in leader mode (the others fetch what an ORDER names, and a site cut
        # off from the leader never repairs our stream: its position says nothing)
        judges = ([self.peers[self.leader]]
                  if self.leader is not None and not self.is_leader
                  else list(self.peers.values()))
        acks = [p.acks[self.me] for p in judges
                if p.state is PeerState.S1 and len(p.acks) == self.n
                and len(p.ack_incs) == self.n and p.ack_incs[self.me] == self.inc]
        if acks:
            self.flow.acked(min(acks))
        elif not any(p.state is PeerState.S1 for p in judges):
            self.flow.restart_acks()  # nobody connected to wait for
        self.flow.paused = self._views.flushing  # own messages wait for the new view
        while (payload := self.flow.next_ready(now)) is not None:
            self._send_own(payload, now)
        if self.flow.congested != self._congested:
            self._congested = self.flow.congested
            self.counters["congested.entered" if self._congested else "congested.cleared"] += 1
            self.core.emit(Congestion(now, self._congested, self.flow.queued, self.flow.in_flight))

    def _send_own(self, body: bytes, now: float) -> None:
        self.core.seq += 1
        seq = self.core.seq
        t = self.core.clock
        self.core.clock += 1
        deps = self._dependencies()
        sig = b""
        if self.auth is not None:
            sig = self.auth.sign(data_signed_bytes(self.tag, self.me, self.inc, seq, t, now,
                                                   deps, body, self._views.vid))
        msg = Msg(self.me, self.inc, seq, t, now, deps, body, now, sig, self._views.vid)
        own = self.streams[self.me]
        own.contiguous = own.known_high = seq
        own.bound = self.core.clock
        self._transport.keep(own, msg)
        self.core.emit(Send(self.cfg.data_band, self.core.encode_msg(msg, 0), "data"))
        self.counters["sent.data"] += 1
        self.flow.sent(seq, len(body))
        self._ordering.accept(msg, now)

    def _dependencies(self) -> tuple[tuple[int, int, int], ...]:
        """What this site has delivered, per stream ``(origin, incarnation, seq)``: each
        peer's current stream and, while kept, its last earlier run (a restart does not
        erase what we showed of the old one). Own messages are ordered by FIFO already."""
        deps = []
        for o in range(self.n):
            if o == self.me:
                continue
            for st in self.retired.get(o, [])[-1:] + [self.streams[o]]:
                if st.inc and st.settled:
                    deps.append((o, st.inc, st.settled))
        return tuple(deps)

    def on_message(self, band: int, payload: bytes | memoryview, now: float) -> list[Action]:
        """A frame received on the room flow (any band this site listens to)."""
        self._begin(now)
        sig = b""
        if self.auth is not None:
            payload, sig = split_trailer(bytes(payload))
        try:
            kind, tx, msg = decode(payload, self.tag, self.n)
            self._check_band(kind, band, msg)
        except ForeignFrame:
            self.counters["foreign"] += 1
            return self.finish(now)
        except OldVersion:
            self.counters["refused.old-version"] += 1
            return self.finish(now)
        except ProtocolError as exc:
            if band == BAND_HEARTBEAT and bytes(payload[:2]) == b"HB":
                self.counters["foreign.flowlib-heartbeat"] += 1
            else:
                self.counters[f"malformed.{exc.reason}"] += 1
            return self.finish(now)
        if tx == self.me:
            self.counters["own-echo"] += 1
            if kind == K_DATA:  # ours, or words someone put under our name: say which
                self._transport.own_conflict(tx, msg, now)  # type: ignore[arg-type]
            return self.finish(now)
        if self.auth is not None and not self._authentic(kind, tx, msg, bytes(payload), sig):
            return self.finish(now)
        self.counters[f"received.{KIND_NAMES[kind]}"] += 1
        try:
            if kind == K_DATA:
                self._transport.on_data(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_HEARTBEAT:
                self._liveness.on_heartbeat(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_NACK:
                self._liveness.heard(tx, now)
                self._repair.on_nack(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_GONE:
                self._liveness.heard(tx, now)
                self._repair.on_gone(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_VIEW:
                self._liveness.heard(tx, now)
                self._views.on_record(tx, msg, now)  # type: ignore[arg-type]
            else:
                self._leading.on_order(tx, msg, now)  # type: ignore[arg-type]
        except ProtocolError as exc:  # semantically invalid (e.g. ORDER from a non-leader)
            self.counters[f"malformed.{exc.reason}"] += 1
        self._pump(now)
        return self.finish(now)

    def _authentic(self, kind: int, tx: int, msg: object, body: bytes, sig: bytes) -> bool:
        """Keyed room: the frame is its transmitter's, and DATA its origin's (counted and
        dropped otherwise: ``auth.bad-signature`` / ``auth.bad-origin-signature``)."""
        assert self.auth is not None
        if not self.auth.verify(self.cfg.sites[tx], body, sig):
            self.counters["auth.bad-signature"] += 1
            return False
        if kind == K_DATA:
            d: DataMsg = msg  # type: ignore[assignment]
            if not data_signature_ok(self.auth, self.tag, self.cfg.sites[d.origin], d):
                self.counters["auth.bad-origin-signature"] += 1
                return False
        return True

    def tick(self, now: float) -> list[Action]:
        """Timers: heartbeats, failure detection, repair requests and answers, pacing."""
        self._begin(now)
        cfg = self.cfg
        core = self.core
        self._liveness.detect_silence(now)
        self._liveness.detect_stalls(now)
        self._views.tick(now)
        self._incs.expire_retired(now)
        # heartbeats (and acknowledgement beats for stability tracking)
        if now >= core.next_hb or core.urgent_hb and now - core.last_hb >= 0.25:
            self._liveness.send_heartbeat(now, 0)
        elif (cfg.stability and core.acks_changed and now - core.last_hb >= cfg.ack_interval):
            self._liveness.send_heartbeat(now, F_STABLE_ACK)
        self._repair.nacks(now)
        self._repair.serve_repairs(now)
        self._history.fetch(now)
        self._ordering.deliverable(now)
        self._leading.prune_ready(now)
        self._pump(now)
        return self.finish(now)

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot for status displays and debugging."""
        return {
            "site": self.site, "mode": self.mode, "state": str(self.core.state),
            "members": list(self.core.members), "clock": self.core.clock, "seq": self.core.seq,
            "view": self.view,
            "incarnation": self.inc,
            "peers": {p.name: {"state": str(p.state), "reconciling": p.reconciling,
                               "last_heard": p.last_heard,
                               "contiguous": self.streams[p.idx].contiguous,
                               "known_high": self.streams[p.idx].known_high,
                               "delivered": self.streams[p.idx].settled}
                      for p in self.peers.values()},
            "retired": {self.cfg.sites[o]: [{"incarnation": st.inc, "delivered": st.settled,
                                             "missing": st.known_high - st.contiguous}
                                            for st in olds]
                        for o, olds in self.retired.items() if olds},
            "waiting": len(self.core.heap) + len(self.core.late_heap) + len(self.core.orders),
            "history_waiting": len(self.core.history_heap),
            "congested": self.flow.congested, "outbox": self.flow.queued,
            "in_flight": self.flow.in_flight,
            "deliveries": self.core.deliveries,
            "counters": dict(sorted(self.counters.items())),
        }

    def display_marks(self) -> list[tuple[str, int, int]]:
        """What this site has shown, per stream: ``(origin, incarnation, seq)``, every
        message of that run up to *seq* delivered or given up (its own streams included).
        An application keeps it on disk beside the site's state, with :meth:`sent_mark`,
        and passes them as ``shown=`` and ``sent=`` to the next run, which then fetches
        only what it did not show (in the background, flagged late), its own last
        messages included, and never shows a message twice."""
        out = []
        for st in self.core.all_streams():
            if st.inc and st.settled:
                out.append((self.cfg.sites[st.origin], st.inc, st.settled))
        for (o, inc), seq in self.core.shown_before.items():  # not heard of again yet: keep
            if o != self.me and self.core.stream(o, inc) is None:
                out.append((self.cfg.sites[o], inc, seq))
        return out

    def sent_mark(self) -> tuple[int, int]:
        """``(incarnation, seq)`` of this run's last own message: kept with the display
        marks, so the next run fetches what this one sent but had not shown yet."""
        return (self.inc, self.core.seq)

    def peer_state(self, site: str) -> PeerState:
        return self.peers[self.cfg.index(site)].state
