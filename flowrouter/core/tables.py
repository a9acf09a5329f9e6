"""The router's tables (seed 002 section 4.2): link table entries and flow route entries.

Plain slotted objects; the logic that changes them lives in :mod:`flowrouter.core.router`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flowrouter.wire.control import Role
from flowrouter.wire.header import DEFAULT_MAX_PAYLOAD, NUM_LOCALITY_TYPES, Locality


class LinkState(enum.Enum):
    HANDSHAKE = "handshake"  #: opened, waiting for the peer's HELLO
    UP = "up"
    DOWN = "down"
    #: one of a region edge's two pseudo links (flowrouter.core.regionedge): no socket
    REGION = "region"


@dataclass(frozen=True, slots=True)
class Modifiers:
    """Per-link locality modifiers: what crossing this link costs, per locality type."""

    bandwidth: int = 0
    delay: int = 0
    geography: int = 0

    def as_tuple(self) -> tuple[int, ...]:
        out = [0] * NUM_LOCALITY_TYPES
        out[Locality.BANDWIDTH] = self.bandwidth
        out[Locality.DELAY] = self.delay
        out[Locality.GEOGRAPHY] = self.geography
        return tuple(out)

    @classmethod
    def from_mapping(cls, data: dict[str, int] | None) -> Modifiers:
        data = dict(data or {})
        unknown = set(data) - {"bandwidth", "delay", "geography"}
        if unknown:
            raise ValueError(f"unknown locality modifier(s) {sorted(unknown)}; "
                             "use bandwidth, delay, geography")
        for k, v in data.items():
            if not isinstance(v, int) or not 0 <= v <= 255:
                raise ValueError(f"locality modifier {k} must be an integer 0..255, got {v!r}")
        return cls(**data)


@dataclass(slots=True, eq=False)
class Link:
    link_id: int
    transport: str  #: "tcp", "udp", "dgram" (applications' datagram links) or "sim"
    address: str  #: peer address, for status and logs
    modifiers: tuple[int, ...]  #: indexed by Locality
    expected_peer: str | None = None  #: configured name of the router we dialled
    #: False for accepted links: the costs come from the peer's HELLO (routers) or the
    #: router's endpoint defaults (applications)
    modifiers_configured: bool = True
    state: LinkState = LinkState.HANDSHAKE
    role: Role | None = None
    peer_name: str = "?"
    peer_node_id: int = 0
    max_payload: int = DEFAULT_MAX_PAYLOAD
    opened_at: float = 0.0
    #: flows whose route entry names this link (seed: "dependent flows")
    dependent: set[bytes] = field(default_factory=set)
    rx: int = 0
    tx: int = 0
    #: link authentication in progress (flowrouter.wire.linkauth.LinkAuthenticator) and the
    #: peer's HELLO held until its AUTH proves it
    auth: Any = None
    pending_hello: Any = None
    #: capabilities this application presented, per flow key (flows under a policy)
    caps: dict[bytes, Any] | None = None
    #: soft state (flowrouter.core.softstate): when we last heard anything from the peer;
    #: smoothed and last echo round trip (seconds); the last ECHO sequence number; whether
    #: the peer speaks liveness (always true of routers); the hold time its digests ask for;
    #: when its last complete digest round arrived
    heard: float = 0.0
    #: the shell stopped reading this link (input credit): its silence is ours, not the peer's
    reading_paused: bool = False
    echo_at: float = 0.0  #: when we last sent an ECHO
    tx_at_echo: int = 0  #: ``tx`` then (data sent since tells the peer we live)
    rtt: float | None = None
    last_rtt: float | None = None
    echo_seq: int = 0
    speaks_liveness: bool = False
    #: the feature bits the peer's HELLO announced (flowrouter.wire.control.FEATURES): a
    #: peer without FEATURE_SOFT_STATE is sent no soft-state message
    features: int = 0
    hold: float | None = None
    round_done_at: float = 0.0
    #: flows for which this link is a downstream link (its hold-time sweep has work only
    #: when this is above zero)
    downstream: int = 0
    #: our HELLO frame body and when we last sent it (a UDP link repeats it until the
    #: peer's arrives: a lost first HELLO must not leave the link down for good)
    hello_body: bytes = b""
    hello_at: float = 0.0
    #: an authenticated UDP link repeats its handshake the same way, AUTH included (the
    #: frame body, unchanged), and once up answers the peer's repeats with it until the
    #: handshake time-out has passed since it came up (``up_at``), at most one answer per
    #: half retry interval (``answered_at``)
    auth_body: bytes = b""
    up_at: float = 0.0
    answered_at: float = float("-inf")
    #: an application's control messages left in this tick (``RouterParams.
    #: control_per_tick``), and the tick they count in (the router's tick number)
    control_left: int = 0
    control_tick: int = -1

    def describe(self) -> str:
        return f"link {self.link_id} ({self.peer_name} via {self.transport} {self.address})"


class FlowEntry:
    """One flow's route: upstream link toward the core, downstream links with band masks.

    ``agg`` is the union of the downstream masks, so a message from upstream that no
    downstream wants is dropped by a single ``&``. Each downstream link has a band mask and
    the time it last joined or refreshed the flow (the soft state's per-(flow, link) record).

    The downstream links are read and changed only through the methods below (``has_down``,
    ``mask_of``, ``down_items``, ``targets``, ``set_down``, ``refresh``, ``remove_down``...):
    how they are stored is this class's business. Nearly every entry has one downstream link,
    and a router may hold millions of entries, so that one is kept in three slots of the
    entry itself; a dict (link -> (mask, time)) appears only past one link and goes again
    when one is left. Two dicts per entry, as before, cost about 440 bytes per flow.
    """

    __slots__ = ("upstream", "agg", "joined", "up_req", "up_req_at", "up_req_resent",
                 "waiting", "sent_up_mask", "created", "sib", "sent_sib_mask", "frames",
                 "bytes", "_link", "_mask", "_at", "_many")

    def __init__(self, upstream: int | None, joined: bool, created: float) -> None:
        self.upstream = upstream
        self.agg = 0
        self.joined = joined
        self.up_req: int | None = None
        self.up_req_at = 0.0
        self.up_req_resent = 0.0  #: when the pending JOIN was last sent again
        #: joins parked until the upstream answers: a tuple (the shared empty one while
        #: none wait, as in nearly every entry: a list here cost 56 B per flow)
        self.waiting: tuple[tuple[int, int], ...] = ()
        self.sent_up_mask: int | None = None
        self.created = created
        #: at a core: other members of the location service -> their subtree masks. Kept apart
        #: from the downstream links so ``agg`` stays our own subtree (what we announce to
        #: them).
        self.sib: dict[int, int] | None = None
        self.sent_sib_mask = 0
        #: data frames (and their bytes, headers included) of the flow this router took
        #: while it held this entry: forwarded, or dropped by the tree's masks. The
        #: forwarding fast path counts its own and hands them over when it forgets its copy
        #: (flowrouter.core.fastpath); status adds what it holds now
        self.frames = 0
        self.bytes = 0
        #: the only downstream link (None: none, or several: then ``_many`` holds them all,
        #: in the order they joined), its mask and when it last joined or refreshed
        self._link: int | None = None
        self._mask = 0
        self._at = 0.0
        self._many: dict[int, tuple[int, float]] | None = None

    # ------------------------------------------------------------------ downstream links
    def down_count(self) -> int:
        """How many downstream links joined the flow."""
        many = self._many
        if many is not None:
            return len(many)
        return 0 if self._link is None else 1

    def has_down(self, link_id: int) -> bool:
        many = self._many
        if many is not None:
            return link_id in many
        return self._link == link_id and link_id is not None

    def down_state(self, link_id: int) -> tuple[int, float] | None:
        """(mask, last join or refresh) of *link_id*, or None when it is not downstream."""
        many = self._many
        if many is not None:
            return many.get(link_id)
        return (self._mask, self._at) if self._link == link_id and link_id is not None else None

    def mask_of(self, link_id: int) -> int | None:
        """The band mask *link_id* joined with, or None when it is not downstream."""
        got = self.down_state(link_id)
        return None if got is None else got[0]

    def refreshed_at(self, link_id: int) -> float | None:
        """When *link_id* last joined or refreshed the flow (None: not downstream)."""
        got = self.down_state(link_id)
        return None if got is None else got[1]

    def last_refreshed(self) -> float | None:
        """The latest join or refresh of any downstream link (None: there is none)."""
        many = self._many
        if many is not None:
            return max(at for _m, at in many.values()) if many else None
        return None if self._link is None else self._at

    def down_links(self) -> list[int]:
        """The downstream links, in the order they joined."""
        many = self._many
        if many is not None:
            return list(many)
        return [] if self._link is None else [self._link]

    def down_items(self) -> list[tuple[int, int]]:
        """(link, mask) of each downstream link, in the order they joined."""
        many = self._many
        if many is not None:
            return [(lk, m) for lk, (m, _at) in many.items()]
        return [] if self._link is None else [(self._link, self._mask)]

    def targets(self, bit: int, skip: int | None = None) -> list[int]:
        """The downstream links whose mask has *bit* (a band's bit), but *skip*."""
        many = self._many
        if many is not None:
            return [lk for lk, (m, _at) in many.items() if m & bit and lk != skip]
        lk = self._link
        return [lk] if lk is not None and self._mask & bit and lk != skip else []

    @property
    def down(self) -> Mapping[int, int]:
        """The downstream links and their masks, a read-only copy (status, tests)."""
        return MappingProxyType(dict(self.down_items()))

    @property
    def traffic(self) -> Mapping[int, float]:
        """When each downstream link last joined or refreshed, a read-only copy (tests)."""
        many = self._many
        if many is not None:
            return MappingProxyType({lk: at for lk, (_m, at) in many.items()})
        return MappingProxyType({} if self._link is None else {self._link: self._at})

    def set_down(self, link_id: int, mask: int, now: float) -> int | None:
        """*link_id* joined (or re-joined, or changed its mask) at *now*: the mask it gave
        before, or None if it was not downstream. ``agg`` is the caller's (``recompute``)."""
        many = self._many
        if many is not None:
            got = many.get(link_id)
            many[link_id] = (mask, now)
            return None if got is None else got[0]
        lk = self._link
        if lk is None:
            self._link, self._mask, self._at = link_id, mask, now
            return None
        if lk == link_id:
            old = self._mask
            self._mask, self._at = mask, now
            return old
        self._many = {lk: (self._mask, self._at), link_id: (mask, now)}
        self._link, self._mask, self._at = None, 0, 0.0
        return None

    def refresh(self, link_id: int, now: float) -> float | None:
        """*link_id* refreshed the flow at *now*: when it did before (None: it is not
        downstream, and nothing changes)."""
        many = self._many
        if many is not None:
            got = many.get(link_id)
            if got is None:
                return None
            many[link_id] = (got[0], now)
            return got[1]
        if self._link != link_id or link_id is None:
            return None
        before, self._at = self._at, now
        return before

    def remove_down(self, link_id: int) -> tuple[int, float] | None:
        """Take *link_id* off: its (mask, last join or refresh), or None if it was not
        downstream. ``agg`` is the caller's (``recompute``)."""
        many = self._many
        if many is not None:
            got = many.pop(link_id, None)
            if len(many) == 1:  # back to one link: inline again
                ((lk, (m, at)),) = many.items()
                self._link, self._mask, self._at = lk, m, at
                self._many = None
            return got
        if self._link != link_id or link_id is None:
            return None
        got = (self._mask, self._at)
        self._link, self._mask, self._at = None, 0, 0.0
        return got

    def recompute(self) -> int:
        many = self._many
        if many is None:
            agg = self._mask if self._link is not None else 0
        else:
            agg = 0
            for m, _at in many.values():
                agg |= m
        self.agg = agg
        return agg
