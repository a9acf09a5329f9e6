"""SiteOrdering: the IGO state machine of one site, a coordinator over its parts (states,
transport, repairs, Lamport or leader ordering, stability). Sans-I/O: imports only the
standard library, flowrouter.wire and the other IGO modules."""

from __future__ import annotations

from typing import Any

from flowrouter.wire.bands import (
    BAND_HEARTBEAT,
    BAND_ORDER,
    BAND_REPAIR,
)

from .actions import Action, Congestion, PeerState, Send
from .auth import data_signature_ok, split_trailer
from .incarnations import Incarnations
from .lamport import LamportOrdering
from .leader import LeaderOrdering
from .records import Msg
from .repair import Repairs
from .stability import StabilityTracking
from .states import PeerStates
from .transport import FifoTransport
from .wire import (
    F_STABLE_ACK,
    K_DATA,
    K_GONE,
    K_HEARTBEAT,
    K_NACK,
    KIND_NAMES,
    DataMsg,
    ForeignFrame,
    OldVersion,
    ProtocolError,
    data_signed_bytes,
    decode,
)


class SiteOrdering(PeerStates, Incarnations, FifoTransport, Repairs, LamportOrdering,
                   StabilityTracking, LeaderOrdering):
    """The IGO state machine of one site. See the module documentation.

    *incarnation* tells this run of the site from earlier ones (a restarted site starts its
    sequence numbers again); it must grow from run to run (default
    :func:`~flowchat.igo.core.new_incarnation` of *now*, so *now* should be wall-clock
    time, or pass one made from it). All methods take the current time in seconds
    (any monotonic clock shared in meaning with the other sites' send times: virtual time in
    the simulator, ``time.time()`` on real hosts) and return a list of actions.
    """
    def bands(self) -> list[int]:
        """The bands this site must listen to on the room flow."""
        return sorted({BAND_HEARTBEAT, BAND_REPAIR, BAND_ORDER, self.cfg.data_band,
                       self.cfg.inbox_band(self.me)})

    @property
    def members(self) -> tuple[str, ...]:
        return self._members

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
        while (payload := self.flow.next_ready(now)) is not None:
            self._send_own(payload, now)
        if self.flow.congested != self._congested:
            self._congested = self.flow.congested
            self.counters["congested.entered" if self._congested else "congested.cleared"] += 1
            self._emit(Congestion(now, self._congested, self.flow.queued, self.flow.in_flight))

    def _send_own(self, body: bytes, now: float) -> None:
        self.seq += 1
        seq = self.seq
        t = self.clock
        self.clock += 1
        deps = self._dependencies()
        sig = b""
        if self.auth is not None:
            sig = self.auth.sign(data_signed_bytes(self.tag, self.me, self.inc, seq, t, now,
                                                   deps, body))
        msg = Msg(self.me, self.inc, seq, t, now, deps, body, now, sig)
        own = self.streams[self.me]
        own.contiguous = own.known_high = seq
        own.bound = self.clock
        self._keep(own, msg)
        self._emit(Send(self.cfg.data_band, self._encode_msg(msg, 0), "data"))
        self.counters["sent.data"] += 1
        self.flow.sent(seq, len(body))
        self._accept(msg, now)

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
                self._own_conflict(tx, msg, now)  # type: ignore[arg-type]
            return self.finish(now)
        if self.auth is not None and not self._authentic(kind, tx, msg, bytes(payload), sig):
            return self.finish(now)
        self.counters[f"received.{KIND_NAMES[kind]}"] += 1
        try:
            if kind == K_DATA:
                self._on_data(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_HEARTBEAT:
                self._on_heartbeat(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_NACK:
                self._heard(tx, now)
                self._on_nack(tx, msg, now)  # type: ignore[arg-type]
            elif kind == K_GONE:
                self._heard(tx, now)
                self._on_gone(tx, msg, now)  # type: ignore[arg-type]
            else:
                self._on_order(tx, msg, now)  # type: ignore[arg-type]
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
        self._detect_silence(now)
        self._detect_stalls(now)
        self._expire_retired(now)
        # heartbeats (and acknowledgement beats for stability tracking)
        if now >= self._next_hb or self._urgent_hb and now - self._last_hb >= 0.25:
            self._send_heartbeat(now, 0)
        elif (cfg.stability and self._acks_changed and now - self._last_hb >= cfg.ack_interval):
            self._send_heartbeat(now, F_STABLE_ACK)
        self._nacks(now)
        self._serve_repairs(now)
        self._long_term(now)
        self._deliverable(now)
        self._prune_ready(now)
        self._pump(now)
        return self.finish(now)

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot for status displays and debugging."""
        return {
            "site": self.site, "mode": self.mode, "state": str(self.state),
            "members": list(self._members), "clock": self.clock, "seq": self.seq,
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
            "waiting": len(self._heap) + len(self._late_heap) + len(self._orders),
            "history_waiting": len(self._history_heap),
            "congested": self.flow.congested, "outbox": self.flow.queued,
            "in_flight": self.flow.in_flight,
            "deliveries": self.deliveries,
            "counters": dict(sorted(self.counters.items())),
        }

    def display_marks(self) -> list[tuple[str, int, int]]:
        """What this site has shown, per peer stream: ``(origin, incarnation, seq)``, every
        message of that run up to *seq* delivered or given up. An application keeps it on
        disk beside the site's state and passes it as ``shown=`` to the next run, which then
        fetches only what it did not show (in the background, flagged late) and never shows
        a message twice."""
        out = []
        for st in self._all_streams():
            if st.origin != self.me and st.inc and st.settled:
                out.append((self.cfg.sites[st.origin], st.inc, st.settled))
        for (o, inc), seq in self.shown_before.items():  # not heard of again yet: keep
            if self._stream(o, inc) is None:
                out.append((self.cfg.sites[o], inc, seq))
        return out

    def peer_state(self, site: str) -> PeerState:
        return self.peers[self.cfg.index(site)].state
