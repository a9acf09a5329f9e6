"""The directory's entries and patterns: the tuples it stores, the glob patterns that find
them, and the checks every field passes (:mod:`flowdir.protocol`
carries them in messages).

An entry is ``(name, FlowID text, kind, attr...)`` plus who owns it and how long it lives;
a pattern matches names and fields with ``*`` and ``?``. Every value that comes from the
network or a user is checked here with a message naming the offending field, raised as
:class:`ProtocolError`. Imports only the wire layer of flowrouter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flowrouter.wire.flowid import FlowID

KIND_FLOW = "flow"  #: the common kind: name -> FlowID
KIND_LS = "ls"  #: an LSID in text -> the flow its location service members share

MAX_NAME = 255  #: characters in a name (and in a name pattern)
MAX_FIELD = 255  #: characters in an attribute or owner
MAX_ATTRS = 16
MAX_ENTRIES_PER_REGISTER = 256
MAX_TTL_SECONDS = 7 * 24 * 3600.0
#: A query is small; anything bigger is refused before it is parsed (cheap to reject floods).
MAX_QUERY_BYTES = 8192
_KIND_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")


class ProtocolError(ValueError):
    """A directory message that does not follow this module's format.

    ``reason`` is short and stable (a counter key such as ``"bad-json"``); the message text
    names the offending field so a person reading an error reply knows what to fix.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail



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
        raise ProtocolError("bad-field", f"{what} must be a string, got {type_name(value)}")
    if not value and not empty_ok:
        raise ProtocolError("bad-field", f"{what} must not be empty")
    if len(value) > limit:
        raise ProtocolError("bad-field", f"{what} is {len(value)} characters; at most {limit}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ProtocolError("bad-field", f"{what} contains control characters")
    return value


def type_name(value: Any) -> str:
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
                                         f"got {type_name(flow)}")
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
            raise ProtocolError("bad-field", f"flow must be a FlowID, got {type_name(self.flow)}")
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
            raise ProtocolError("bad-field", f"{what} must be an object, got {type_name(data)}")
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
            raise ProtocolError("bad-field", f"pattern must be an object, got {type_name(data)}")
        attrs = data.get("attrs", [])
        if not isinstance(attrs, list):
            raise ProtocolError("bad-field", "pattern.attrs must be a list of strings")
        for key in ("name", "flow", "kind", "owner"):
            if not isinstance(data.get(key, "*"), str):
                raise ProtocolError("bad-field", f"pattern.{key} must be a string, got "
                                                 f"{type_name(data.get(key))}")
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


def entries_matching(pattern: Pattern, entries: Iterable[Entry]) -> list[Entry]:
    return [e for e in entries if pattern.matches(e)]
