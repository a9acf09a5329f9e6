"""RouterState: the tables and counters every part of the router shares.

The :class:`~flowrouter.core.router.Router` is assembled from parts with one job each
(links, forwarding, membership, lsexchange, gc, admission, appmembers); each part is a class
over this shared state, and the Router inherits them all, so the hot path calls plain methods
with no per-message indirection. This module holds the state, the one helper every part uses
to build a control frame, and, for the type checker only, the calls parts make into each other (each
one is implemented by the part named beside it).

May import :mod:`flowrouter.wire` and the core's data modules (tables, lsroutes, tracers,
policystore, params, actions, trust, quotas); never another part.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from flowrouter.core.actions import Action, Send
from flowrouter.core.lsroutes import LsRouting
from flowrouter.core.params import RouterParams
from flowrouter.core.policystore import PolicyStore
from flowrouter.core.tables import FlowEntry, Link
from flowrouter.core.timers import TimerWheel
from flowrouter.core.tracers import NULL_TRACER, Tracer
from flowrouter.core.trust import TrustBoundary
from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_MEMBERSHIP
from flowrouter.wire.flowid import LINK_LOCAL_FLOW
from flowrouter.wire.header import pack_header
from flowrouter.wire.linkauth import ReplayCache

log = logging.getLogger("flowrouter.core")

#: the link-local flow's key (HELLO, AUTH, LS routes, policies, errors)
LINK_KEY = LINK_LOCAL_FLOW.key
#: LSID bytes of a link-local key
ZERO_LSID = b"\0\0\0\0"


class RouterState:
    """One router's tables, counters and clocks, shared by its parts."""

    def __init__(self, params: RouterParams, now: float = 0.0,
                 tracer: Tracer = NULL_TRACER) -> None:
        self.p = params
        #: trace records (flowrouter.core.traces); ``_tracing`` keeps the hot path at one test
        self.tracer = tracer
        self._tracing = bool(tracer.enabled)
        self._snapshot_epoch = -1
        self.links: dict[int, Link] = {}
        self.flows: dict[bytes, FlowEntry] = {}
        self.counters: Counter[str] = Counter()
        self.routing = LsRouting(params.core_lsids, params.routes, params.default_route,
                                 params.max_ls_routes)
        self.started = now
        self.epoch = 0
        self._next_req = 1
        #: soft state (flowrouter.core.softstate): the timer wheel of echoes, digest rounds
        #: and hold-time sweeps; digest rounds being sent / received per link; per-link
        #: timer generations; PRUNE / NOT_ON_TREE keys waiting for the next tick
        self.wheel = TimerWheel(min(params.liveness_interval, params.refresh_interval) / 4)
        self._soft_round = 0
        self._soft_tx: dict[int, Any] = {}
        self._soft_rx: dict[int, Any] = {}
        self._soft_gen: dict[int, int] = {}
        self._notices: dict[tuple[int, int], set[bytes]] = {}
        #: per link: keys a hold-time sweep found expired, still to collect (a few a tick)
        self._expiring: dict[int, list[bytes]] = {}
        self._orphan_retry_at = now
        #: recent tripped limits, newest last (shown by the status query)
        self.alerts: deque[dict[str, Any]] = deque(maxlen=100)
        self._alerted: dict[tuple[str, bytes | None], float] = {}
        #: limit kind -> (start of its alert interval, flows told in it): Admission.alert
        self._notice_window: dict[str, tuple[float, int]] = {}
        #: flow policies in force (capabilities.PolicyStore) and their raw records, which
        #: are gossiped to every router neighbour; ``_policies_active`` keeps the data path
        #: at one test while no flow is protected
        self.policies = PolicyStore()
        self._policy_raws: dict[bytes, None] = {}
        self._policies_active = False
        #: add to ``now`` to get Unix time (capability expiry is in Unix seconds); the
        #: runtime sets it, the simulator leaves 0
        self.wall_offset = 0.0
        self._replay = ReplayCache()
        #: who may be a router, and the quotas of everyone else (flowrouter.core.trust)
        self.trust = TrustBoundary(params.quota, params.accept_routers)
        #: links still in their handshake (the only ones a tick must check for time-outs)
        self._handshaking: set[int] = set()
        #: entries cut off from their core: retried as soon as any route changes
        self._orphans: set[bytes] = set()
        #: flows with a join awaiting the upstream answer (checked every tick, not by the GC)
        self._pending: dict[bytes, FlowEntry] = {}
        #: bumped whenever links or LS routes change, so shells can wake waiters cheaply
        self.generation = 0
        #: the forwarding fast path's mirror of our tables (flowrouter.core.fastpath), told
        #: of every change to an entry or link; None while no fast path is attached
        self.fib: Any = None
        #: application membership (flowrouter.core.appmembers): pending changes per flow
        #: (link -> latest change), flows owing a snapshot, when each flow's last snapshot went
        self._member_changes: dict[bytes, dict[int, Any]] = {}
        self._member_snapshot_due: set[bytes] = set()
        self._member_refresh_at: dict[bytes, float] = {}
        self._member_last = now
        self._member_clock = now
        self._member_seq = 0
        #: measured locality (flowrouter.core.measured): a meter per router link once it has
        #: samples, and the link's configured costs (geography stays; the rest when unmeasured)
        self.meters: dict[int, Any] = {}
        self._configured: dict[int, Any] = {}

    def _entry_changed(self, key: bytes) -> None:
        """Any change to the route entry of *key* (links, masks, upstream, removal): the
        fast path forgets its copy (the parts call this wherever they change an entry)."""
        if self.fib is not None:
            self.fib.flow_changed(key)

    def _link_changed(self, link_id: int) -> None:
        if self.fib is not None:
            self.fib.link_changed(link_id)

    def _control(self, link_id: int, key: bytes, msg: C.ControlMessage,
                 band: int = BAND_MEMBERSHIP) -> Send:
        body = msg.encode()
        return Send(link_id, pack_header(key, len(body), band), body)

    if TYPE_CHECKING:  # the calls parts make into each other (no runtime definitions here)
        def close_link(self, link_id: int, now: float,  # links
                       reason: str = ...) -> list[Action]: ...
        def _advertise_routes(self, changed: bool, now: float,  # lsexchange
                              only: int | None = None) -> list[Action]: ...
        def _rejoin(self, key: bytes, entry: FlowEntry,  # membership
                    now: float) -> list[Action]: ...
        def _join_failed(self, key: bytes, entry: FlowEntry,  # membership
                         status: C.JoinStatus, reason: str, now: float) -> list[Action]: ...
        def _drop_down(self, entry: FlowEntry, key: bytes, link_id: int,  # membership
                       cause: str, now: float, gone: Link | None = ...) -> None: ...
        def _after_change(self, key: bytes, entry: FlowEntry, now: float,  # membership
                          cause: str) -> list[Action]: ...
        def _remove_entry(self, key: bytes, entry: FlowEntry, cause: str,  # membership
                          now: float) -> None: ...
        def _push_mask(self, key: bytes, entry: FlowEntry) -> list[Action]: ...  # membership
        def _send_join_up(self, key: bytes, entry: FlowEntry,  # membership
                          now: float) -> list[Action]: ...
        def _on_sibling_mask(self, link: Link, key: bytes, msg: C.Mask,  # lsexchange
                             now: float) -> list[Action]: ...
        def _soft_link_up(self, link: Link, now: float) -> None: ...  # softstate
        def _soft_link_closed(self, link_id: int) -> None: ...  # softstate
        def _not_on_tree(self, link_id: int, key: bytes) -> None: ...  # softstate
        def _prune_notice(self, link_id: int, key: bytes) -> None: ...  # softstate
        def _soft_tick(self, now: float) -> list[Action]: ...  # softstate
        def _retry_orphans(self, now: float) -> list[Action]: ...  # lsexchange
        def _repeat_hellos(self, now: float) -> list[Action]: ...  # links
        def _hello_on_up_link(self, link: Link, msg: C.Hello,  # links
                              now: float) -> list[Action]: ...
        def _unknown_control(self, link: Link) -> list[Action]: ...  # links
        def _auth_on_up_link(self, link: Link, msg: C.Auth,  # links
                             now: float) -> list[Action]: ...
        def _emit_fault(self, key: bytes, entry: FlowEntry,  # membership
                        fault: C.Fault) -> list[Action]: ...
        def measure_rtt(self, link_id: int, rtt: float, now: float) -> bool: ...  # links
        def _member_changed(self, key: bytes, link: Link | None,  # appmembers
                            event: Any, mask: int, old_mask: int = ...) -> None: ...
        def _member_notices(self, now: float) -> list[Action]: ...  # appmembers
        def _authorize_join(self, link: Link, key: bytes, msg: C.Join,  # admission
                            now: float) -> str | None: ...
        def _over_quota(self, link: Link, key: bytes, msg: C.Join,  # admission
                        now: float) -> list[Action]: ...
        def _may_send(self, link: Link, key: bytes, header: memoryview | bytes,  # admission
                      band: int, now: float) -> bool: ...
        def _withdraw(self, link: Link, key: bytes, why: str,  # admission
                      now: float) -> list[Action]: ...
        def alert(self, kind: str, detail: str, now: float,  # admission
                  key: bytes | None = None, *, notice: str | None = None,
                  budget: bool = False) -> list[Action]: ...
        def refusal_alert(self, kind: str, detail: str, limit: str,  # admission
                          now: float, key: bytes) -> list[Action]: ...
