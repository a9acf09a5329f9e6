"""The directory's flow, bands and wire messages (after Warfield, Flows, 2001, §5.1); the
entries and patterns they carry are in :mod:`flowdir.entries` (re-exported here).

**The directory flow.** The directory is one well-known flow per location service, so that any
application that knows an LSID (every application does: the router suggests one in its HELLO)
can find the directory without being told a 128-bit name first::

    FlowID(creator=0xD1EC7044, lsid=LSID, local=0)          # see directory_flow()

``0xD1EC7044`` ("DIRECTORY") is a reserved creator ID; a host's random creator ID colliding
with it is a 2**-64 event, and no host ever allocates local ID 0 (allocators start at 1), so
the name cannot clash with an ordinary flow.

**Entries are tuples** ``(name, FlowID text, kind, attr...)`` plus who owns them and how long
they live. ``kind`` says what the name means: ``"flow"`` (name -> FlowID, the common case),
``"ls"`` (an LSID in text, e.g. ``"0x10"`` -> the flow its location service members share),
or any other short lowercase word an application invents.

**Messages** are UTF-8 JSON objects, one per frame, each with ``"v": 1`` (the version, checked
first so a newer member can answer an older client with a readable error) and ``"op"``. JSON
rather than a packed binary layout because directory traffic is rare and small, the payloads
show up readable in traces and captures, and each field can be validated with a precise message.
Every band below carries exactly one ``op``:

======  ==============  ===========================================================
band    op              where / content
======  ==============  ===========================================================
40      ``register``    directory flow; ``entries``: list of entry objects
41      ``remove``      directory flow; ``name`` (exact), ``kind``/``flow`` or ``"*"``,
                        ``owner`` (informational)
42      ``query``       directory flow; ``qid``, ``reply`` (FlowID text), ``pattern``,
                        ``ring``, ``empty`` (answer even with no match), ``sync``
43      ``reply`` /     the query's reply flow; ``qid``, ``member``, ``ring``,
        ``error``       ``matches`` (entries with ``expires_in``) or ``error`` text
======  ==============  ===========================================================

An entry object: ``{"name", "flow", "kind", "attrs": [str...], "owner", "ttl", "scoped"}``
(``ttl`` seconds granted at registration; in a reply ``expires_in`` says what is left, relative
so that member and client clocks need not agree).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from flowrouter.wire.bands import DATA_BAND_FIRST
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import MAX_TTL, Locality

from .entries import (
    KIND_FLOW,
    KIND_LS,
    MAX_ATTRS,
    MAX_ENTRIES_PER_REGISTER,
    MAX_FIELD,
    MAX_NAME,
    MAX_QUERY_BYTES,
    MAX_TTL_SECONDS,
    Entry,
    Pattern,
    ProtocolError,
    check_flow,
    check_kind,
    check_name,
    check_text,
    check_ttl,
    entries_matching,
    glob_match,
    is_wildcard,
    type_name,
)

#: Protocol version carried in every message as ``"v"``.
VERSION = 1

#: Creator ID of every directory flow (reserved; see the module documentation).
DIRECTORY_CREATOR = 0xD1EC7044
#: Local ID of every directory flow (never handed out by a LocalIdAllocator).
DIRECTORY_LOCAL = 0

# Dedicated application bands on the directory flow (and the reply band on reply flows).
BAND_REGISTER = 40
BAND_REMOVE = 41
BAND_QUERY = 42
BAND_REPLY = 43
#: What a member listens to on the directory flow.
MEMBER_BANDS = (BAND_REGISTER, BAND_REMOVE, BAND_QUERY)
#: What a watcher listens to on the directory flow.
WATCH_BANDS = (BAND_REGISTER, BAND_REMOVE)
assert all(b >= DATA_BAND_FIRST for b in (*MEMBER_BANDS, BAND_REPLY))

_QID_RE = re.compile(r"[0-9A-Za-z_-]{1,64}")


def directory_flow(lsid: int) -> FlowID:
    """The well-known directory flow of location service *lsid*."""
    if isinstance(lsid, bool) or not isinstance(lsid, int) or not 0 < lsid < 1 << 32:
        raise ValueError(f"LSID must be 1..0xffffffff (0 is reserved), got {lsid!r}")
    return FlowID(DIRECTORY_CREATOR, lsid, DIRECTORY_LOCAL)


# ----------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True)
class Register:
    entries: tuple[Entry, ...]
    op = "register"


@dataclass(frozen=True, slots=True)
class Remove:
    """Remove entries named exactly ``name`` (optionally only one kind or one flow)."""

    name: str
    kind: str = "*"
    flow: str = "*"
    owner: str = ""
    op = "remove"

    def matches(self, entry: Entry) -> bool:
        return (entry.name == self.name and (self.kind == "*" or self.kind == entry.kind)
                and (self.flow == "*" or FlowID.parse(self.flow) == entry.flow))


@dataclass(frozen=True, slots=True)
class Query:
    qid: str
    reply: FlowID
    pattern: Pattern
    ring: int = 0  #: the ring (TTL or locality budget) it was sent with, echoed in replies
    empty: bool = False  #: answer even with no match (so the asker learns members exist)
    sync: bool = False  #: a member catching up, not a user's lookup (counted apart)
    op = "query"


@dataclass(frozen=True, slots=True)
class Reply:
    qid: str
    member: str
    matches: tuple[tuple[Entry, float], ...] = ()  #: (entry, expires_in seconds)
    ring: int = 0
    error: str | None = None

    @property
    def op(self) -> str:
        return "error" if self.error is not None else "reply"


Message = Register | Remove | Query | Reply


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode(msg: Message) -> bytes:
    """One message -> one frame payload."""
    if isinstance(msg, Register):
        return _dumps({"v": VERSION, "op": "register",
                       "entries": [e.to_json() for e in msg.entries]})
    if isinstance(msg, Remove):
        return _dumps({"v": VERSION, "op": "remove", "name": msg.name, "kind": msg.kind,
                       "flow": msg.flow, "owner": msg.owner})
    if isinstance(msg, Query):
        return _dumps({"v": VERSION, "op": "query", "qid": msg.qid, "reply": str(msg.reply),
                       "pattern": msg.pattern.to_json(), "ring": msg.ring,
                       "empty": msg.empty, "sync": msg.sync})
    if isinstance(msg, Reply):
        out: dict[str, Any] = {"v": VERSION, "op": msg.op, "qid": msg.qid,
                               "member": msg.member, "ring": msg.ring}
        if msg.error is not None:
            out["error"] = msg.error
        else:
            out["matches"] = [e.to_json(left) for e, left in msg.matches]
        return _dumps(out)
    raise TypeError(f"not a directory message: {type(msg).__name__}")


def encode_replies(qid: str, member: str, matches: Sequence[tuple[Entry, float]], ring: int,
                   limit: int) -> Iterator[bytes]:
    """Split a reply into frames of at most *limit* bytes (a member may hold thousands of
    matching entries; one frame must still fit the router's maximum payload)."""
    head = _dumps({"v": VERSION, "op": "reply", "qid": qid, "member": member, "ring": ring,
                   "matches": []})
    budget = limit - len(head) - 16
    chunk: list[bytes] = []
    size = 0
    for entry, left in matches:
        item = _dumps(entry.to_json(left))
        if chunk and size + len(item) + 1 > budget:
            yield head[:-3] + b"[" + b",".join(chunk) + b"]}"
            chunk, size = [], 0
        chunk.append(item)
        size += len(item) + 1
    if chunk or not matches:
        yield head[:-3] + b"[" + b",".join(chunk) + b"]}"


def _int_field(data: dict[str, Any], key: str, lo: int, hi: int, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ProtocolError("bad-field", f"{key} must be an integer {lo}..{hi}, got {value!r}")
    return value


def _bool_field(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError("bad-field", f"{key} must be true or false, got {value!r}")
    return value


def load(payload: bytes | bytearray | memoryview, limit: int | None = None) -> dict[str, Any]:
    """Payload -> the JSON object with its version checked (first step of :func:`decode`)."""
    if limit is not None and len(payload) > limit:
        raise ProtocolError("too-large", f"message of {len(payload)} bytes; at most {limit}")
    try:
        data = json.loads(bytes(payload).decode("utf-8"))
    except UnicodeDecodeError:
        raise ProtocolError("bad-json", "message is not UTF-8 text") from None
    except ValueError as exc:
        raise ProtocolError("bad-json", f"message is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad-json", f"message must be a JSON object, got {type_name(data)}")
    v = data.get("v")
    if v != VERSION:
        raise ProtocolError("bad-version", f"unsupported directory protocol version {v!r} "
                                           f"(this side speaks {VERSION})")
    return data


def decode(payload: bytes | bytearray | memoryview, expect: str | None = None,
           limit: int | None = None) -> Message:
    """Payload -> message, validating every field; raises :class:`ProtocolError`.

    *expect* is the ``op`` the band it came on carries: a ``register`` arriving on the query
    band is as wrong as a broken field.
    """
    data = load(payload, limit)
    op = data.get("op")
    if expect is not None and op != expect and not (expect == "reply" and op == "error"):
        raise ProtocolError("bad-op", f"op {op!r} on the {expect} band (expected {expect!r})")
    if op == "register":
        entries = data.get("entries")
        if not isinstance(entries, list) or not entries:
            raise ProtocolError("bad-field", "entries must be a non-empty list")
        if len(entries) > MAX_ENTRIES_PER_REGISTER:
            raise ProtocolError("bad-field", f"{len(entries)} entries in one register; at "
                                             f"most {MAX_ENTRIES_PER_REGISTER}")
        return Register(tuple(Entry.from_json(e, f"entries[{i}]")[0]
                              for i, e in enumerate(entries)))
    if op == "remove":
        name = check_name(data.get("name"))
        kind = data.get("kind", "*")
        if kind != "*":
            check_kind(kind)
        flow = data.get("flow", "*")
        if flow != "*":
            flow = str(check_flow(flow))
        owner = check_text(data.get("owner", ""), "owner", empty_ok=True)
        return Remove(name, kind, flow, owner)
    if op == "query":
        return Query(qid=check_qid(data.get("qid")),
                     reply=check_reply_flow(data.get("reply")),
                     pattern=Pattern.from_json(data.get("pattern")),
                     ring=_int_field(data, "ring", 0, 255, 0),
                     empty=_bool_field(data, "empty"), sync=_bool_field(data, "sync"))
    if op in ("reply", "error"):
        qid = check_qid(data.get("qid"), allow_none=op == "error")
        member = check_text(data.get("member"), "member")
        ring = _int_field(data, "ring", 0, 255, 0)
        if op == "error":
            return Reply(qid or "", member, (), ring,
                         check_text(data.get("error"), "error", 1024))
        raw = data.get("matches")
        if not isinstance(raw, list):
            raise ProtocolError("bad-field", "matches must be a list")
        matches = []
        for i, item in enumerate(raw):
            entry, left = Entry.from_json(item, f"matches[{i}]")
            matches.append((entry, entry.ttl if left is None else left))
        return Reply(qid, member, tuple(matches), ring)
    raise ProtocolError("bad-op", f"unknown op {op!r} (expected register, remove, query, "
                                  "reply or error)")


def check_qid(qid: Any, allow_none: bool = False) -> str:
    if qid is None and allow_none:
        return ""
    if not isinstance(qid, str) or not _QID_RE.fullmatch(qid):
        raise ProtocolError("bad-field", f"qid must be 1..64 characters of [0-9A-Za-z_-], "
                                         f"got {qid!r}")
    return qid


def check_reply_flow(value: Any) -> FlowID:
    flow = check_flow(value, "reply")
    if flow.is_link_local:
        raise ProtocolError("bad-field", f"reply flow {flow} uses the reserved LSID 0")
    return flow


def salvage_reply(payload: bytes | bytearray | memoryview) -> tuple[FlowID | None, str]:
    """From a query that failed validation, the reply flow and qid if they can be read.

    The point: a client whose query is wrong deserves to be told why, even when the rest of
    the message is garbage; only a query with no usable reply flow is merely counted.
    """
    try:
        data = json.loads(bytes(payload).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, ""
    if not isinstance(data, dict):
        return None, ""
    try:
        reply = check_reply_flow(data.get("reply"))
    except ProtocolError:
        return None, ""
    try:
        qid = check_qid(data.get("qid"))
    except ProtocolError:
        qid = ""
    return reply, qid


# ----------------------------------------------------------------------------- scopes / rings
Scope = int | tuple[Locality | str | int, int]


@dataclass(frozen=True, slots=True)
class Reach:
    """How far one message may travel: a TTL in router hops, or a locality budget.

    Expanding-ring search sends the same query with growing reaches; registrations can be
    limited with one too (e.g. a printer visible only inside its site).
    """

    ttl: int = 32
    locality: tuple[Locality, int] | None = None

    @classmethod
    def of(cls, scope: Scope | Reach | None, default_ttl: int = 32) -> Reach:
        if scope is None:
            return cls(default_ttl)
        if isinstance(scope, Reach):
            return scope
        if isinstance(scope, bool):
            raise ValueError(f"scope must be a TTL or (locality type, value), got {scope!r}")
        if isinstance(scope, int):
            if not 1 <= scope <= MAX_TTL:
                raise ValueError(f"a TTL scope must be 1..{MAX_TTL}, got {scope}")
            return cls(scope)
        try:
            kind, value = scope
        except (TypeError, ValueError):
            raise ValueError(f"scope must be a TTL or (locality type, value), "
                             f"got {scope!r}") from None
        loc = Locality.parse(kind)
        if loc is Locality.NONE:
            return cls.of(int(value), default_ttl)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError(f"a locality budget must be 0..255, got {value!r}")
        return cls(default_ttl, (loc, value))

    @classmethod
    def ring(cls, ring_type: Locality, value: int, max_ttl: int = 32) -> Reach:
        """Ring *value* of an expanding-ring search of *ring_type* (NONE = TTL rings)."""
        if ring_type is Locality.NONE:
            return cls(max(1, min(value, MAX_TTL)))
        return cls(max_ttl, (ring_type, min(value, 255)))

    def send_kwargs(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "locality": self.locality}


def expanding_rings(first: int = 1, limit: int = 32) -> list[int]:
    """``first, 2*first, 4*first, ...`` up to *limit*, always ending at *limit* itself so the
    widest ring is exactly what the caller allowed (``first`` 0 is allowed for locality
    budgets: 0 reaches only zero-cost links)."""
    if first < 0 or limit < first:
        raise ValueError(f"rings need 0 <= first <= limit, got first={first} limit={limit}")
    rings: list[int] = []
    value = first
    while value < limit:
        rings.append(value)
        value = value * 2 if value else 1
    rings.append(limit)
    return rings



__all__ = [
    "VERSION", "DIRECTORY_CREATOR", "DIRECTORY_LOCAL", "BAND_REGISTER", "BAND_REMOVE",
    "BAND_QUERY", "BAND_REPLY", "MEMBER_BANDS", "WATCH_BANDS", "KIND_FLOW", "KIND_LS",
    "ProtocolError", "directory_flow", "glob_match", "Entry", "Pattern", "Register", "Remove",
    "Query", "Reply", "Message", "encode", "encode_replies", "decode", "load", "salvage_reply",
    "Reach", "Scope", "expanding_rings", "entries_matching", "check_name", "check_kind",
    "check_flow", "check_ttl", "check_text", "is_wildcard", "MAX_NAME", "MAX_FIELD", "MAX_ATTRS",
    "MAX_ENTRIES_PER_REGISTER", "MAX_TTL_SECONDS", "MAX_QUERY_BYTES",
]
