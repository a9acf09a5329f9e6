"""Membership notices: what routers tell applications on band 19 (application membership).

Seed 002 section 3.4 has leave (and join) messages travel on the membership band "for the
benefit of applications wishing to track membership". Routers consume band 0 themselves, so
they report what applications may see on :data:`~flowrouter.wire.bands.BAND_APP_MEMBERSHIP`
instead, as ordinary frames of the flow: one notice from one router lists the changes among
*its own* applications (its endpoint links) on that flow since its last notice. Nothing here
names a router's downstream routers, so a notice's size depends only on one router's local
churn, and routers batch a flow's changes per interval (see
:mod:`flowrouter.core.appmembers`), so a large flow does not flood.

Two kinds: a ``DELTA`` lists changes (join, mask change, leave); a ``SNAPSHOT`` lists every
local member the router has now (sent when a local application starts listening on band 19,
and every refresh interval while the flow has local members), and replaces whatever a
receiver held for that router. A receiver's view of the flow is the union over routers.

Wire format (network byte order), the whole payload of a band-19 frame::

    magic "FMN" | version 1 (1) | kind (1: 0 delta, 1 snapshot) | router node id (8)
    | sequence (4) | refresh seconds (2) | omitted (2) | count (2) | entries
    entry: event (1: 1 join, 2 mask, 3 leave) | member node id (8) | mask (16)
           | name length (1) | name (UTF-8, at most 64 bytes)

``omitted`` counts changes the router dropped because the notice was full (a receiver that
sees it non-zero knows its view is incomplete until the next snapshot). A member's name is
only sent when the router authenticated its link (otherwise it is empty: an unproven name
would let any application pose as another). May import only the standard library and
:mod:`flowrouter.wire`.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

MAGIC = b"FMN"
VERSION = 1
_HEAD = struct.Struct("!3sBBQIHHH")
_ENTRY = struct.Struct("!BQ16sB")
MAX_NAME = 64
#: entries one notice may carry (a notice stays well under any link's max payload)
MAX_ENTRIES = 512


class NoticeKind(enum.IntEnum):
    DELTA = 0
    SNAPSHOT = 1


class MemberEvent(enum.IntEnum):
    JOIN = 1
    MASK = 2
    LEAVE = 3


@dataclass(frozen=True, slots=True)
class MemberChange:
    event: MemberEvent
    member: int  #: the application's node id (from its HELLO)
    mask: int  #: its band mask (0 for a leave)
    name: str = ""  #: its name, only when its link was authenticated


@dataclass(frozen=True, slots=True)
class MemberNotice:
    kind: NoticeKind
    router: int  #: node id of the router that reports
    seq: int
    refresh: int  #: seconds until this router's next snapshot at the latest (0: none)
    omitted: int
    changes: tuple[MemberChange, ...]

    def encode(self) -> bytes:
        if len(self.changes) > MAX_ENTRIES:
            raise ValueError(f"a notice carries at most {MAX_ENTRIES} changes")
        parts = [_HEAD.pack(MAGIC, VERSION, int(self.kind), self.router, self.seq & 0xFFFFFFFF,
                            min(self.refresh, 0xFFFF), min(self.omitted, 0xFFFF),
                            len(self.changes))]
        for c in self.changes:
            name = c.name.encode("utf-8")[:MAX_NAME]
            parts.append(_ENTRY.pack(int(c.event), c.member, c.mask.to_bytes(16, "big"),
                                     len(name)))
            parts.append(name)
        return b"".join(parts)


def is_notice(payload: bytes | memoryview) -> bool:
    return bytes(payload[:4]) == MAGIC + bytes([VERSION])


def decode_notice(payload: bytes | memoryview) -> MemberNotice:
    """Parse one notice; ValueError (one line, saying what is wrong) for anything else."""
    data = bytes(payload)
    if len(data) < _HEAD.size:
        raise ValueError(f"membership notice too short ({len(data)} bytes)")
    magic, version, kind, router, seq, refresh, omitted, count = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a membership notice (bad magic or version)")
    try:
        nkind = NoticeKind(kind)
    except ValueError:
        raise ValueError(f"membership notice of unknown kind {kind}") from None
    if count > MAX_ENTRIES:
        raise ValueError(f"membership notice claims {count} entries (limit {MAX_ENTRIES})")
    pos = _HEAD.size
    changes = []
    for _ in range(count):
        if pos + _ENTRY.size > len(data):
            raise ValueError("membership notice truncated inside an entry")
        ev, member, mask, nlen = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        if nlen > MAX_NAME or pos + nlen > len(data):
            raise ValueError("membership notice has a bad member name length")
        try:
            event = MemberEvent(ev)
            name = data[pos:pos + nlen].decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"membership notice has a bad entry (event {ev})") from None
        pos += nlen
        changes.append(MemberChange(event, member, int.from_bytes(mask, "big"), name))
    if pos != len(data):
        raise ValueError(f"membership notice has {len(data) - pos} trailing bytes")
    return MemberNotice(nkind, router, seq, refresh, omitted, tuple(changes))
