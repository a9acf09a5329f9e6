"""The forwarding fast path: a mirror of the core's tables and a forwarder over whole buffers.

As in hardware routers (RIB and FIB), the Python core (:class:`flowrouter.core.router.Router`)
stays the source of truth and the reference for every decision; :class:`FastPath` keeps an
engine's mirror of what forwarding needs and forwards the ordinary data frames of a received
buffer in one call, with no Python object per message. The engine is the compiled
``flowrouter.core._fastpath`` when it was built, else nothing: without it the shell hands
every frame to the core as before (the pure-Python twin, :mod:`flowrouter.core.fastpath_py`,
is the compiled engine's specification and test oracle, and can be forced for tests).

The mirror is emptied eagerly and filled ahead of the traffic: the core calls
:meth:`FastPath.flow_changed` / :meth:`FastPath.link_changed` on every change to an entry or
link, which forgets the copy at once; a changed entry is copied again at the next
:meth:`FastPath.forward` call (at most ``REFILL_PER_CALL`` of them per call, so a change to a
huge table does not hold up one read), so a flow joined before its first frame arrives is
mirrored when that frame comes: a router with 10^5 flows does not stop its forwarding pass
at every first frame to copy one entry from Python. Anything not copied yet (a link, an
entry past the refill queue's ``MAX_REFILL``) is copied the first time a frame needs it.
Flows the engine must not decide alone are never copied: entries of a core with LS siblings,
and every flow while any flow policy is in force (senders' capabilities are checked per frame).

A key the core holds no entry for (a sender that is not a member, the core-based-tree rule)
is mirrored as absent, with its LSID's route as the core's LS routing table gives it (the
link toward the location service, or that the core drops such frames): the engine sends its
frames on toward the location service as the core would. Creating an entry goes through
``flow_changed`` like any change, which forgets the absence; the routes are forgotten
whenever the core's ``generation`` moves (links or LS routes changed). At most
``MAX_ABSENT`` absent keys are kept (anyone may send to any key): past that they are all
forgotten and mirrored again as frames need them.

Choice of engine (reported by :func:`engine_choice` and in the router's status):
``FLOWNET_NATIVE=0`` turns the fast path off, ``FLOWNET_NATIVE=twin`` uses the Python twin
(tests), anything else uses the compiled engine when it imports.

Imports: the standard library, :mod:`flowrouter.core.fastpath_py` and
:mod:`flowrouter.wire` (sans-I/O, like the core).
"""

from __future__ import annotations

import os
from collections import deque
from typing import TYPE_CHECKING, Any

from flowrouter.core import fastpath_py
from flowrouter.core.fastpath_py import (
    COUNT_AT,
    ROUTE_NO_MEMBERS,
    ROUTE_NONE,
    STOP_END,
    STOP_MISS_FLOW,
    STOP_MISS_LINK,
    STOP_MISS_ROUTE,
    STOP_PARTIAL,
    STOP_SLOW,
)
from flowrouter.wire.flowid import key_lsid

if TYPE_CHECKING:
    from flowrouter.core.router import Router

__all__ = ["FastPath", "engine_choice", "fast_path_off", "new_engine", "STOP_END", "STOP_PARTIAL",
           "STOP_SLOW"]

ENV = "FLOWNET_NATIVE"
#: payloads this large are not copied by the engine: they leave as views of the received
#: buffer, written with the rewritten header in one writev (copying 64 KiB costs more than
#: the few Python objects a view takes; below this the copy is cheaper)
REF_MIN = 8192
#: a run of frames several links get alike (fan-out) is built once and shared by them when
#: it holds this many bytes or more (below, a copy per link costs less than the extra
#: buffer each link then writes)
SHARE_MIN = 1024
_NO_BUDGET = 1 << 62
#: absent keys mirrored at most (then all are forgotten and mirrored again as needed)
MAX_ABSENT = 1 << 16
#: changed entries waiting to be copied again at most (past that, at their first frame),
#: and how many of them one ``forward`` call copies before it forwards (a few ms at most)
MAX_REFILL = 1 << 17
REFILL_PER_CALL = 512
#: (index in the engine's counts, counter name)
_COUNTERS = tuple((i, name) for name, i in COUNT_AT.items())


def _native_engine() -> tuple[Any, str]:
    try:
        from flowrouter.core import _fastpath  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, f"compiled engine not built ({exc})"
    return _fastpath.Engine, "compiled engine (flowrouter.core._fastpath)"


def fast_path_off(env: str | None = None) -> bool:
    """Whether ``FLOWNET_NATIVE`` (or *env*) turns the fast path off on purpose. A router
    without it for any other reason (the compiled engine not built) forwards every frame
    in Python, 25-100x slower, and says so as a warning."""
    value = os.environ.get(ENV, "") if env is None else env
    return value.strip().lower() in ("0", "no", "off", "false")


def engine_choice(env: str | None = None) -> tuple[Any, str]:
    """(engine class or None, one line saying which and why) for this process."""
    value = os.environ.get(ENV, "") if env is None else env
    value = value.strip().lower()
    if fast_path_off(value):
        return None, f"fast path off ({ENV}={value}); every frame goes through the Python core"
    if value in ("twin", "py", "python"):
        return fastpath_py.Engine, f"pure-Python twin engine ({ENV}={value})"
    cls, why = _native_engine()
    if cls is None:
        return None, f"fast path unavailable: {why}; every frame goes through the Python core"
    return cls, why


def new_engine(kind: str = "auto") -> Any:
    """An engine instance: ``native``, ``twin``, or ``auto`` (native, else twin)."""
    if kind == "twin":
        return fastpath_py.Engine()
    cls, why = _native_engine()
    if cls is None:
        if kind == "native":
            raise ImportError(why)
        return fastpath_py.Engine()
    return cls()


class FastPath:
    """Forwards whole buffers for one :class:`Router` through an engine kept in step with it."""

    __slots__ = ("router", "engine", "description", "stats", "_generation", "_absent",
                 "_refill", "_refill_order")

    def __init__(self, router: Router, engine: Any, description: str = "") -> None:
        self.router = router
        self.engine = engine
        self.description = description or type(engine).__module__
        #: frames the engine took, calls, frames it left to the core, copies installed
        self.stats = {"calls": 0, "installs": 0, "slow": 0}
        #: the core's generation the mirrored routes are from; absent keys set since the
        #: last time they were all forgotten
        self._generation = router.state.generation
        self._absent = 0
        #: keys of entries changed since their copy was forgotten, to copy again, oldest
        #: first. A FIFO beside a set, not a set popped: ``set.pop`` scans from where the
        #: last pop stopped to the next key, so after 10^5 changes had drained (a
        #: subscriber of 10^5 flows left) each pop of a new change walked most of a huge,
        #: empty table: joins then took 2.5x as long and flows expired before their refresh
        self._refill: set[bytes] = set()
        self._refill_order: deque[bytes] = deque()
        router.fib = self

    # ------------------------------------------------------------------ mirror upkeep
    def flow_changed(self, key: bytes) -> None:
        """The core changed (or removed) the entry of *key*: forget the copy (what it
        counted goes to the entry, when there still is one)."""
        got = self.engine.forget_flow(key)
        if got:
            self._keep_counts(key, got[0], got[1])
        refill = self._refill
        if len(refill) < MAX_REFILL and key not in refill:
            refill.add(key)
            self._refill_order.append(key)

    def _copy_changed(self) -> None:
        """Copy again (some of) the entries changed since the last call."""
        refill, order = self._refill, self._refill_order
        flows = self.router.flows
        for _ in range(min(len(order), REFILL_PER_CALL)):
            key = order.popleft()
            refill.discard(key)
            if key in flows:
                self._install_flow(key)
        if not order:
            self._refill = set()  # its table stays at its largest size otherwise

    def _keep_counts(self, key: bytes, frames: int, nbytes: int) -> None:
        entry = self.router.flows.get(key)
        if entry is not None and frames:
            entry.frames += frames
            entry.bytes += nbytes

    def flow_counts(self, key: bytes) -> tuple[int, int]:
        """(frames, bytes) of flow *key* the engine took and has not handed to its entry."""
        return self.engine.flow_counts(key) or (0, 0)

    def link_changed(self, link_id: int) -> None:
        """The core changed (or closed) link *link_id*: forget the copy."""
        self.engine.forget_link(link_id)

    def reset(self) -> None:
        """Forget everything (policies appeared, or anything the hooks cannot name)."""
        for key, frames, nbytes in self.engine.all_flow_counts():
            self._keep_counts(key, frames, nbytes)
        self.engine.clear()
        self._absent = 0
        self._refill = set()  # new: clear() keeps the table of its largest size
        self._refill_order.clear()

    def _install_link(self, link_id: int) -> bool:
        from flowrouter.core.tables import LinkState
        from flowrouter.wire.control import Role

        link = self.router.links.get(link_id)
        if link is None or link.state is not LinkState.UP:
            return False
        self.engine.set_link(link_id, link.role is Role.ROUTER, link.max_payload,
                             tuple(link.modifiers))
        return True

    def _install_flow(self, key: bytes) -> bool:
        r = self.router
        entry = r.flows.get(key)
        if entry is None or entry.sib:
            return False
        up = entry.upstream
        down = entry.down_items()
        for lk in (*(lk for lk, _m in down), *(() if up is None else (up,))):
            if not self.engine.has_link(lk) and not self._install_link(lk):
                return False
        try:
            self.engine.set_flow(key, -1 if up is None else up, down,
                                 entry.agg)
        except ValueError:  # beyond what the engine holds (link ids, links per flow)
            return False
        self.stats["installs"] += 1
        return True

    def _install_absent(self, key: bytes) -> bool:
        """Mirror that the core holds no entry for *key*, with its LSID's route as the
        core's forwarding would take it (False: leave such frames to the core)."""
        r = self.router
        if key in r.flows:
            return self._install_flow(key)
        if key in r.state.local_keys:  # addressed to the router itself: the core's
            return False
        eng = self.engine
        lsid = key_lsid(key)
        if not eng.has_route(lsid):
            if lsid in r.p.core_lsids:
                route = ROUTE_NO_MEMBERS
            else:
                link = r.routing.link_for(lsid)
                route = ROUTE_NONE if link is None else link
                if link is not None and not eng.has_link(link) and not self._install_link(
                        link):
                    return False
            eng.set_route(lsid, route)
        if not eng.has_flow(key):
            if self._absent >= MAX_ABSENT:
                eng.forget_absent()
                self._absent = 0
            eng.set_absent(key)
            self._absent += 1
            self.stats["installs"] += 1
        return True

    # ------------------------------------------------------------------ forwarding
    def forward(self, link_id: int, data: Any, pos: int, max_payload: int,
                ref_min: int = REF_MIN, share_min: int = SHARE_MIN, in_place: bool = False
                ) -> tuple[int, int, list[tuple[int, Any, int]]]:
        """Forward the frames of *data* from *pos* on that the engine may decide alone.

        Returns ``(pos, stop, outputs)``: where it stopped and why (``STOP_END``: all done;
        ``STOP_PARTIAL``: an incomplete frame starts at *pos*; ``STOP_SLOW``: the frame at
        *pos* is the core's), and ``[(link, frames, count)]`` to write, in order: *frames*
        is bytes, or a list of buffers including views of *data* for payloads of *ref_min*
        bytes or more (see :mod:`flowrouter.core.fastpath_py`), which must be written (or
        copied) before *data*'s buffer is reused; the frames several links get alike may
        be one object shared by all of them (runs of *share_min* bytes or more), so no
        caller may change one. With *in_place* (a receive buffer the caller owns and
        reuses), a link's frames may be a view of *data*, their headers rewritten in it. Counters,
        per-link transmit counts and trace sampling are brought up to date, exactly as the
        core would have for the same frames.
        """
        r = self.router
        if r.state.policies_active:
            return pos, STOP_SLOW, []
        eng = self.engine
        if r.state.generation != self._generation:  # links or LS routes changed
            eng.forget_routes()
            self._generation = r.state.generation
        if self._refill:
            self._copy_changed()
        tracing = r.state.tracing
        tr = r.tracer
        counters = r.counters
        links = r.links
        stats = self.stats
        outputs: list[tuple[int, Any, int]] = []
        at, attempts = -1, 0
        while True:
            stats["calls"] += 1
            fb, db = (tr.fwd_left, tr.drop_left) if tracing else (_NO_BUDGET, _NO_BUDGET)
            pos, stop, outs, counts = eng.forward(link_id, data, pos, fb, db, max_payload,
                                                  ref_min, share_min, in_place)
            if outs:
                outputs += outs
                for lk, _buf, n in outs:
                    links[lk].tx += n
            if counts[8]:
                links[link_id].rx += counts[8]
            for i, name in _COUNTERS:
                if counts[i]:
                    counters[name] += counts[i]
            if tracing:
                tr.fwd_left -= counts[6]
                tr.drop_left -= counts[7]
            if stop in (STOP_MISS_FLOW, STOP_MISS_LINK, STOP_MISS_ROUTE):  # the mirror lacks one
                if pos != at:
                    at, attempts = pos, 0
                attempts += 1
                if attempts <= 2:  # the input link, then the flow (or absence) and its links
                    if stop == STOP_MISS_LINK and not eng.has_link(link_id):
                        ok = self._install_link(link_id)
                    else:
                        ok = self._install_absent(bytes(data[pos:pos + 16]))
                    if ok:
                        continue
                stop = STOP_SLOW
            if stop == STOP_SLOW:
                stats["slow"] += 1
            return pos, stop, outputs

    def one_flow(self, frames: Any) -> bool:
        """Whether *frames* (an output batch) are whole data frames of one flow, back to
        back: an output queue may keep them as one entry (``OutputQueue.push_run``)."""
        return bool(self.engine.one_flow(frames))

    def status(self) -> dict[str, Any]:
        flows, links = self.engine.sizes()
        out = {"engine": self.description, "native": bool(self.engine.native),
               "mirrored_flows": flows, "mirrored_links": links, **self.stats}
        classes = getattr(self.engine, "classes", None)  # the compiled engine's alone
        if classes is not None:
            # routing classes: flows routed alike are decided once; past the most there
            # may be, a flow is decided on its own (slower, the same outputs), counted
            held, most, refused = classes()
            out.update(routing_classes=held, routing_classes_max=most,
                       routing_classes_refused=refused)
        hot_stats = getattr(self.engine, "hot_stats", None)
        if hot_stats is not None:
            # its lookup table: slots, how many tombstones wait for the next rebuild, and
            # how far the worst-placed flow is from home (tens of slots; hundreds mean
            # keys that collide)
            slots, gone, longest = hot_stats()
            out.update(lookup_slots=slots, lookup_tombstones=gone, lookup_longest_probe=longest)
        return out
