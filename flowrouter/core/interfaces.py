"""What each part of the router calls in another: one small protocol per need.

The parts (:mod:`~flowrouter.core.links`, :mod:`~flowrouter.core.forwarding`,
:mod:`~flowrouter.core.membership`, :mod:`~flowrouter.core.lsexchange`,
:mod:`~flowrouter.core.softstate`, :mod:`~flowrouter.core.admission`,
:mod:`~flowrouter.core.appmembers`, :mod:`~flowrouter.core.locality`) never import each
other; each receives, at construction, the collaborators it needs typed by a protocol here,
and the :class:`~flowrouter.core.router.Router` passes in the parts that implement them.
The calls form no cycle, so the Router builds the parts bottom up::

    appmembers, admission, locality       (only the shared state)
    membership   <- admission (JoinAdmission), appmembers (MemberLog)
    lsexchange   <- membership (TreeRepair), admission (Alerts)
    softstate    <- membership (TreeUpkeep), lsexchange (SiblingMasks), locality (RttSink)
    forwarding   <- admission (SendCheck)
    regionedge   <- membership (RegionTrees), forwarding (FrameForwarder)   (edges only)
    links        <- admission (LinkAdmission), lsexchange (RouteAdvertiser),
                    membership or, at an edge, regionedge (LinkLoss),
                    softstate (LinkLiveness), locality (LinkMeters)

Two calls would close a cycle and are returned to the Router instead: a peer the soft state
finds dead (``SoftState.tick`` returns it; the Router closes the link), and the members a new
policy excludes (``Admission.excluded_by``; the Router has membership withdraw them).

May import :mod:`flowrouter.wire` and the core's data modules (actions, tables); never a part.
"""

from __future__ import annotations

from typing import Protocol

from flowrouter.core.actions import Action
from flowrouter.core.tables import FlowEntry, Link
from flowrouter.wire import control as C
from flowrouter.wire.appmembers import MemberEvent


class MemberLog(Protocol):
    """Application membership (appmembers), told by membership of every local change."""

    def member_changed(self, key: bytes, link: Link | None, event: MemberEvent, mask: int,
                       old_mask: int = 0) -> None: ...


class Alerts(Protocol):
    """Limit alerts (admission): counted, logged, kept for status, told to the flow."""

    def alert(self, kind: str, detail: str, now: float, key: bytes | None = None, *,
              notice: str | None = None, budget: bool = False) -> list[Action]: ...


class JoinAdmission(Protocol):
    """What membership asks admission about an application's join."""

    def over_quota(self, link: Link, key: bytes, msg: C.Join, now: float) -> list[Action]: ...

    def authorize_join(self, link: Link, key: bytes, msg: C.Join,
                       now: float) -> str | None: ...

    def refusal_alert(self, kind: str, detail: str, limit: str, now: float,
                      key: bytes) -> list[Action]: ...


class LinkAdmission(Alerts, Protocol):
    """What the links part asks admission: alerts, and the policies a new router
    neighbour must learn."""

    def policy_frames(self, link_id: int) -> list[Action]: ...


class SendCheck(Protocol):
    """Admission's per-frame check of an application's data on a protected flow."""

    def may_send(self, link: Link, key: bytes, header: memoryview | bytes, band: int,
                 now: float) -> bool: ...


class TreeRepair(Protocol):
    """Membership, for the LS exchange: re-graft orphans when routes change, and drop an
    entry a sibling member's mask emptied."""

    def retry_orphans(self, now: float) -> list[Action]: ...

    def remove_entry(self, key: bytes, entry: FlowEntry, cause: str, now: float) -> None: ...


class TreeUpkeep(Protocol):
    """Membership, for the soft state: the tree changes refresh digests, hold times and
    prunes decide."""

    def push_mask(self, key: bytes, entry: FlowEntry) -> list[Action]: ...

    def drop_down(self, entry: FlowEntry, key: bytes, link_id: int, cause: str, now: float,
                  gone: Link | None = None) -> None: ...

    def after_change(self, key: bytes, entry: FlowEntry, now: float,
                     cause: str) -> list[Action]: ...

    def send_join_up(self, key: bytes, entry: FlowEntry, now: float) -> list[Action]: ...

    def withdraw(self, link: Link, key: bytes, why: str, now: float) -> list[Action]: ...


class LinkLoss(Protocol):
    """Membership, for the links part: repair every flow that used a link that closed."""

    def link_down(self, link: Link, reason: str, now: float) -> list[Action]: ...


class SiblingMasks(Protocol):
    """The LS exchange, for the soft state: a sibling member's mask from its digest, a
    batch of a sibling's mask changes (REFRESH_UPDATE), the end of a sibling's digest round
    (masks it no longer lists go), and the members' graph repeated every refresh interval."""

    def on_sibling_mask(self, link: Link, key: bytes, msg: C.Mask,
                        now: float) -> list[Action]: ...

    def on_sibling_update(self, link: Link, entries: tuple[tuple[bytes, int, int], ...],
                          now: float) -> list[Action]: ...

    def sibling_round_done(self, link: Link, started: float, now: float
                           ) -> list[Action]: ...

    def topology_refresh(self, link_id: int, now: float) -> list[Action]: ...


class RouteAdvertiser(Protocol):
    """The LS exchange, for the links part: routes changed (a router link came or went)."""

    def advertise_routes(self, changed: bool, now: float,
                         only: int | None = None) -> list[Action]: ...


class LinkLiveness(Protocol):
    """The soft state, for the links part: start and stop a link's timers."""

    def link_up(self, link: Link, now: float) -> None: ...

    def link_closed(self, link_id: int) -> None: ...


class RttSink(Protocol):
    """Measured locality, for the soft state: an RTT sample from the liveness echo."""

    def measure_rtt(self, link_id: int, rtt: float, now: float) -> bool: ...


class LinkMeters(Protocol):
    """Measured locality, for the links part: forget a link's meter when it closes."""

    def link_closed(self, link_id: int) -> None: ...


class RegionTrees(Protocol):
    """Membership, for a region edge: the region, as one neighbour, joins, changes its
    mask, leaves, and answers our joins; entries move when the region's exit for their
    location service moves; and (the edge stands between the links part and membership)
    a closed link's repair."""

    def on_join(self, link: Link, key: bytes, msg: C.Join, now: float) -> list[Action]: ...

    def on_join_ack(self, link: Link, key: bytes, msg: C.JoinAck,
                    now: float) -> list[Action]: ...

    def on_mask(self, link: Link, key: bytes, msg: C.Mask, now: float) -> list[Action]: ...

    def on_leave(self, link: Link, key: bytes, now: float) -> list[Action]: ...

    def regraft(self, key: bytes, now: float) -> list[Action]: ...

    def link_down(self, link: Link, reason: str, now: float) -> list[Action]: ...


class FrameForwarder(Protocol):
    """Forwarding, for a region edge: a frame that arrived from the region (unwrapped) or
    enters it (wrapped), forwarded like any other."""

    def forward(self, link_id: int, link: Link, header: memoryview | bytes,
                payload: memoryview | bytes, band: int, now: float) -> list[Action]: ...
