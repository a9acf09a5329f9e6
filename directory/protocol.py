"""The directory's names, tuples, patterns and wire messages (DESIGN.md section 8, seed 002 §5.1).

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
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from flowrouter.wire.bands import DATA_BAND_FIRST
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import MAX_TTL, Locality

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

KIND_FLOW = "flow"
KIND_LS = "ls"

MAX_NAME = 255  #: characters in a name (and in a name pattern)
MAX_FIELD = 255  #: characters in an attribute or owner
MAX_ATTRS = 16
MAX_ENTRIES_PER_REGISTER = 256
MAX_TTL_SECONDS = 7 * 24 * 3600.0
#: A query is small; anything bigger is refused before it is parsed (cheap to reject floods).
MAX_QUERY_BYTES = 8192
_KIND_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")
_QID_RE = re.compile(r"[0-9A-Za-z_-]{1,64}")


class ProtocolError(ValueError):
    """A directory message that does not follow this module's format.

    ``reason`` is short and stable (a counter key such as ``"bad-json"``); the message text
    names the offending field so a person reading an error reply knows what to fix.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def directory_flow(lsid: int) -> FlowID:
    """The well-known directory flow of location service *lsid*."""
    if isinstance(lsid, bool) or not isinstance(lsid, int) or not 0 < lsid < 1 << 32:
        raise ValueError(f"LSID must be 1..0xffffffff (0 is reserved), got {lsid!r}")
    return FlowID(DIRECTORY_CREATOR, lsid, DIRECTORY_LOCAL)


# ----------------------------------------------------------------------------- glob matching
_STAR = object()
_ANY = object()


def _tokens(pattern: str) -> list[object]:
    """``*`` -> STAR, ``?`` -> ANY, ``\\x`` -> literal x, else the literal character.

    Consecutive stars collapse into one (same meaning, and it keeps matching linear-ish).
    """
    out: list[object] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append(pattern[i + 1])
            i += 2
            continue
        if c == "*":
            if not out or out[-1] is not _STAR:
                out.append(_STAR)
        elif c == "?":
            out.append(_ANY)
        else:
            out.append(c)
        i += 1
    return out


def glob_match(pattern: str, text: str) -> bool:
    """Shell-style match: ``*`` any run (also empty), ``?`` one character, ``\\`` escapes.

    Case-sensitive and without ``[...]`` classes, on purpose: names are identifiers, and a
    matcher this small behaves the same on every member. Runs in O(len(pattern)*len(text))
    at worst (one backtrack point, the last star), so a hostile pattern cannot blow up.
    """
    toks = _tokens(pattern)
    t = p = 0
    star_p = -1
    star_t = 0
    nt, np_ = len(text), len(toks)
    while t < nt:
        if p < np_ and toks[p] is not _STAR and (toks[p] is _ANY or toks[p] == text[t]):
            t += 1
            p += 1
        elif p < np_ and toks[p] is _STAR:
            star_p, star_t = p, t
            p += 1
        elif star_p >= 0:
            star_t += 1
            t = star_t
            p = star_p + 1
        else:
            return False
    while p < np_ and toks[p] is _STAR:
        p += 1
    return p == np_


def is_wildcard(field_pattern: str) -> bool:
    return field_pattern == "*"


# ----------------------------------------------------------------------------- entries
def check_text(value: Any, what: str, limit: int = MAX_FIELD, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise ProtocolError("bad-field", f"{what} must be a string, got {_tname(value)}")
    if not value and not empty_ok:
        raise ProtocolError("bad-field", f"{what} must not be empty")
    if len(value) > limit:
        raise ProtocolError("bad-field", f"{what} is {len(value)} characters; at most {limit}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ProtocolError("bad-field", f"{what} contains control characters")
    return value


def _tname(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def check_name(name: Any) -> str:
    """Names are what people type: non-empty, printable, at most 255 characters, and free of
    the wildcard characters (so a registered name always matches itself as a pattern)."""
    name = check_text(name, "name", MAX_NAME)
    if any(c in name for c in "*?\\"):
        raise ProtocolError("bad-field", f"name {name!r} must not contain *, ? or \\ "
                                         "(they are wildcards in queries)")
    return name


def check_kind(kind: Any) -> str:
    if not isinstance(kind, str) or not _KIND_RE.fullmatch(kind):
        raise ProtocolError("bad-field", f"kind must be a short lowercase word "
                                         f"([a-z0-9_.-], at most 32), got {kind!r}")
    return kind


def check_flow(flow: Any, what: str = "flow") -> FlowID:
    if isinstance(flow, FlowID):
        return flow
    if not isinstance(flow, str):
        raise ProtocolError("bad-field", f"{what} must be FlowID text creator:lsid:local, "
                                         f"got {_tname(flow)}")
    try:
        return FlowID.parse(flow)
    except ValueError as exc:
        raise ProtocolError("bad-field", f"{what}: {exc}") from None


def check_ttl(ttl: Any) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) \
            or not 0 < ttl <= MAX_TTL_SECONDS:
        raise ProtocolError("bad-field", f"ttl must be a number of seconds in "
                                         f"(0, {MAX_TTL_SECONDS:g}], got {ttl!r}")
    return float(ttl)


@dataclass(frozen=True, slots=True)
class Entry:
    """One directory tuple: ``(name, flow, kind, *attrs)``, its owner and lifetime.

    ``ttl`` is the lifetime granted by the registration (members count it down from when they
    stored it); ``scoped`` is true when the owner limited how far the registration travelled,
    so members never copy it to others when they synchronise.
    """

    name: str
    flow: FlowID
    kind: str = KIND_FLOW
    attrs: tuple[str, ...] = ()
    owner: str = ""
    ttl: float = 60.0
    scoped: bool = False

    def __post_init__(self) -> None:
        check_name(self.name)
        check_kind(self.kind)
        if not isinstance(self.flow, FlowID):
            raise ProtocolError("bad-field", f"flow must be a FlowID, got {_tname(self.flow)}")
        if not isinstance(self.attrs, tuple) or len(self.attrs) > MAX_ATTRS:
            raise ProtocolError("bad-field", f"attrs must be a tuple of at most {MAX_ATTRS} "
                                             "strings")
        for i, a in enumerate(self.attrs):
            check_text(a, f"attrs[{i}]", empty_ok=True)
        check_text(self.owner, "owner", empty_ok=True)
        check_ttl(self.ttl)

    @property
    def key(self) -> tuple[str, str, FlowID]:
        """Identity in a member's store: one name may map to several flows (e.g. a service
        offered in two sites), but one (name, kind, flow) is one entry."""
        return (self.name, self.kind, self.flow)

    def as_tuple(self) -> tuple[str, ...]:
        """The seed's tuple form: ``(name, FlowID text, kind, *attrs)``."""
        return (self.name, str(self.flow), self.kind, *self.attrs)

    def to_json(self, expires_in: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "flow": str(self.flow), "kind": self.kind,
                               "attrs": list(self.attrs), "owner": self.owner,
                               "ttl": self.ttl, "scoped": self.scoped}
        if expires_in is not None:
            out["expires_in"] = round(max(0.0, expires_in), 3)
        return out

    @classmethod
    def from_json(cls, data: Any, what: str = "entry") -> tuple[Entry, float | None]:
        """Parse an entry object; returns it and its ``expires_in`` (None if absent)."""
        if not isinstance(data, dict):
            raise ProtocolError("bad-field", f"{what} must be an object, got {_tname(data)}")
        try:
            attrs = data.get("attrs", [])
            if not isinstance(attrs, list):
                raise ProtocolError("bad-field", f"{what}.attrs must be a list of strings")
            scoped = data.get("scoped", False)
            if not isinstance(scoped, bool):
                raise ProtocolError("bad-field", f"{what}.scoped must be true or false")
            entry = cls(name=check_name(data.get("name")),
                        flow=check_flow(data.get("flow"), f"{what}.flow"),
                        kind=check_kind(data.get("kind", KIND_FLOW)),
                        attrs=tuple(attrs), owner=data.get("owner", ""),
                        ttl=check_ttl(data.get("ttl")), scoped=scoped)
        except ProtocolError as exc:
            if exc.detail.startswith(what):
                raise
            raise ProtocolError(exc.reason, f"{what}: {exc.detail}") from None
        expires_in = data.get("expires_in")
        if expires_in is not None:
            if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) \
                    or not math.isfinite(expires_in) or expires_in < 0:
                raise ProtocolError("bad-field", f"{what}.expires_in must be a non-negative "
                                                 "number")
            expires_in = min(float(expires_in), entry.ttl)
        return entry, expires_in


# ----------------------------------------------------------------------------- patterns
@dataclass(frozen=True, slots=True)
class Pattern:
    """A tuple with wildcards: what a query asks for.

    ``name`` is a glob (``*``, ``?``, ``\\`` escapes); ``flow``, ``kind`` and ``owner`` are
    either ``"*"`` or must equal the entry's field (a flow compares as a FlowID, so padding does
    not matter); ``attrs`` are matched position by position, each ``"*"`` or exact, and an entry
    may have more attributes than the pattern names (so adding an attribute to registrations
    never breaks existing queries).
    """

    name: str = "*"
    flow: str = "*"
    kind: str = "*"
    owner: str = "*"
    attrs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_text(self.name, "pattern.name", MAX_NAME)
        if self.flow != "*":
            check_flow(self.flow, "pattern.flow")
        if self.kind != "*":
            check_kind(self.kind)
        check_text(self.owner, "pattern.owner", empty_ok=True)
        if not isinstance(self.attrs, tuple) or len(self.attrs) > MAX_ATTRS:
            raise ProtocolError("bad-field", f"pattern.attrs must be a list of at most "
                                             f"{MAX_ATTRS} strings")
        for i, a in enumerate(self.attrs):
            check_text(a, f"pattern.attrs[{i}]", empty_ok=True)

    def matches(self, entry: Entry) -> bool:
        if not glob_match(self.name, entry.name):
            return False
        if self.kind != "*" and self.kind != entry.kind:
            return False
        if self.owner != "*" and self.owner != entry.owner:
            return False
        if self.flow != "*" and FlowID.parse(self.flow) != entry.flow:
            return False
        if len(self.attrs) > len(entry.attrs):
            return False
        return all(p == "*" or p == a for p, a in zip(self.attrs, entry.attrs))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "flow": self.flow, "kind": self.kind, "owner": self.owner,
                "attrs": list(self.attrs)}

    @classmethod
    def from_json(cls, data: Any) -> Pattern:
        if not isinstance(data, dict):
            raise ProtocolError("bad-field", f"pattern must be an object, got {_tname(data)}")
        attrs = data.get("attrs", [])
        if not isinstance(attrs, list):
            raise ProtocolError("bad-field", "pattern.attrs must be a list of strings")
        for key in ("name", "flow", "kind", "owner"):
            if not isinstance(data.get(key, "*"), str):
                raise ProtocolError("bad-field", f"pattern.{key} must be a string, got "
                                                 f"{_tname(data.get(key))}")
        return cls(name=data.get("name", "*"), flow=data.get("flow", "*"),
                   kind=data.get("kind", "*"), owner=data.get("owner", "*"),
                   attrs=tuple(attrs))

    def __str__(self) -> str:
        parts = [self.name]
        for label, value in (("flow", self.flow), ("kind", self.kind), ("owner", self.owner)):
            if value != "*":
                parts.append(f"{label}={value}")
        if self.attrs:
            parts.append("attrs=" + ",".join(self.attrs))
        return " ".join(parts)


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
        raise ProtocolError("bad-json", f"message must be a JSON object, got {_tname(data)}")
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


def entries_matching(pattern: Pattern, entries: Iterable[Entry]) -> list[Entry]:
    return [e for e in entries if pattern.matches(e)]


__all__ = [
    "VERSION", "DIRECTORY_CREATOR", "DIRECTORY_LOCAL", "BAND_REGISTER", "BAND_REMOVE",
    "BAND_QUERY", "BAND_REPLY", "MEMBER_BANDS", "WATCH_BANDS", "KIND_FLOW", "KIND_LS",
    "ProtocolError", "directory_flow", "glob_match", "Entry", "Pattern", "Register", "Remove",
    "Query", "Reply", "Message", "encode", "encode_replies", "decode", "load", "salvage_reply",
    "Reach", "Scope", "expanding_rings", "entries_matching", "check_name", "check_kind",
    "check_flow", "check_ttl", "check_text",
]
