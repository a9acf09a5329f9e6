"""The flows a client holds: what it listens to and advertises, and what the router was told
(sans-I/O).

The router keeps *one* band mask per link and flow, so the client joins with the union of
its listeners' masks on that flow; an advertisement is a JOIN flagged ``ADVERTISE`` that keeps
the path toward the core installed even with no listener. :class:`FlowTable` is that state,
and the one thing that outlives a router link: after a failover the next router's protocol
replays it (one JOIN per wanted flow). A flow whose creator published a policy takes joins
only with a capability token; the token stays with the flow and every JOIN presents it.
Imports only the wire layer of flowrouter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.flowid import FlowID


def capability_bytes(capability: Any) -> bytes:
    """A capability (object or bytes) as the bytes a JOIN carries."""
    raw = capability.encode() if hasattr(capability, "encode") else bytes(capability)
    if len(raw) > 0xFFFF:
        raise ValueError("a capability token is at most 65535 bytes")
    return raw


class FlowEntry:
    """One flow: its listeners' masks, its advertisement, and the router's view of it."""

    __slots__ = ("flow", "masks", "union", "advertised", "adv_locality", "on_router", "sent_mask",
                 "capability", "notices")

    def __init__(self, flow: FlowID) -> None:
        self.flow = flow
        #: listener ID -> its band mask (the shell owns the listeners themselves)
        self.masks: dict[int, int] = {}
        #: the union of the listeners' masks (what the router is asked for)
        self.union = 0
        self.advertised = False
        self.adv_locality: tuple[int, int] = (0, 0)
        #: the router has (or is being asked to make) state for our link on this flow
        self.on_router = False
        #: the mask of the last JOIN we sent
        self.sent_mask: int | None = None
        #: capability token presented with every JOIN of this flow (flows under a policy)
        self.capability = b""
        #: the rate limiter of this flow's dropped-message notices (kept by the shell)
        self.notices: Any = None

    def mask(self) -> int:
        return self.union

    def add_listener(self, listener_id: int, mask: int) -> None:
        self.masks[listener_id] = mask
        self.union |= mask

    def remove_listener(self, listener_id: int) -> bool:
        """Forget a listener's mask; False if it was not there."""
        if self.masks.pop(listener_id, None) is None:
            return False
        bits = 0
        for m in self.masks.values():
            bits |= m
        self.union = bits
        return True

    @property
    def wanted(self) -> bool:
        return bool(self.masks) or self.advertised

    @property
    def in_sync(self) -> bool:
        """The router was told what we want now (no JOIN needed)."""
        return self.on_router and self.sent_mask == self.mask()

    def router_forgot(self) -> None:
        """The router holds nothing for us on this flow (a refusal, a lost link, a PRUNE)."""
        self.on_router = False
        self.sent_mask = None

    def join(self, req_id: int) -> tuple[C.Join, tuple[int, int]]:
        """The JOIN that tells the router what we want now, and its header's locality."""
        mask = self.mask()
        flags = C.JOIN_FLAG_ADVERTISE if self.advertised else 0
        self.on_router = True
        self.sent_mask = mask
        return (C.Join(req_id, mask, flags, self.capability),
                self.adv_locality if self.advertised else (0, 0))

    def refresh_entry(self) -> tuple[bytes, int, int]:
        """This flow's line in a refresh digest."""
        mask = self.sent_mask if self.sent_mask is not None else self.mask()
        return self.flow.key, mask, C.REFRESH_ADVERTISE if self.advertised else 0


class FlowTable:
    """Every flow this client holds, by flow key."""

    def __init__(self, subject: str, capabilities: Iterable[Any] = ()) -> None:
        self.subject = subject
        #: capabilities presented by default with the joins of the flows they cover
        self.capabilities = list(capabilities)
        self.entries: dict[bytes, FlowEntry] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[FlowEntry]:
        return iter(list(self.entries.values()))

    def get(self, key: bytes) -> FlowEntry | None:
        return self.entries.get(key)

    def entry(self, flow: FlowID, capability: Any = None) -> FlowEntry:
        """*flow*'s entry, made on first use; *capability* (if given) stays with it."""
        fe = self.entries.get(flow.key)
        if fe is None:
            fe = self.entries[flow.key] = FlowEntry(flow)
            if self.capabilities:
                from .credentials import capability_for

                cap = capability_for(self.capabilities, flow.key, self.subject)
                if cap is not None:
                    fe.capability = capability_bytes(cap)
        if capability is not None:
            fe.capability = capability_bytes(capability)
        return fe

    def forget(self, fe: FlowEntry) -> bool:
        """Drop *fe* if it is still this table's entry for its flow; True if it was."""
        if self.entries.get(fe.flow.key) is fe:
            del self.entries[fe.flow.key]
            return True
        return False

    def holds(self, fe: FlowEntry) -> bool:
        return self.entries.get(fe.flow.key) is fe

    def wanted(self) -> list[FlowEntry]:
        """The flows a router must hold for us (what failover replays)."""
        return [fe for fe in self.entries.values() if fe.wanted]

    def link_lost(self) -> None:
        """A router link ended: no router holds anything for us any more."""
        for fe in self.entries.values():
            fe.router_forgot()
