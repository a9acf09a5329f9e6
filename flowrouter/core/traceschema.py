"""Router trace records: the schema (version 2), its value types, and the record validator.

Routers and the simulator write **JSON Lines**: one JSON object per line, UTF-8, ``\\n``
terminated. The PySpark job in :mod:`flowtrace` mines them for flow-table scaling;
:func:`validate` is the reference validator for everything else.

Record schema, version 2
========================

Version 2 (soft state) replaces the per-(flow, link) ``gc_ping``
records by per-neighbour ``refresh`` and ``prune`` records and adds causes; the reader and
:func:`validate` accept version 1 files too (:data:`SUPPORTED_VERSIONS`). What changed:

* new kinds ``refresh`` and ``prune`` (below); routers no longer write ``gc_ping`` (still
  valid, so old tools' records validate);
* ``link_del`` / ``entry_del`` causes ``expired`` (not refreshed within the hold time),
  ``refresh`` (missing from a complete refresh round: a lost LEAVE repaired), ``prune`` and
  ``not-on-tree`` (the neighbour said it dropped or never had the state); a link whose
  peer stopped answering echoes goes down with ``link_down.reason`` saying so;
  ``link_add`` cause ``refresh`` (a mask repaired from a digest);
* ``link_del.last`` is the time the (flow, link) was last refreshed or joined (version 1: the
  last traffic the GC saw); ``snapshot.active_flows`` counts entries refreshed or joined in
  the current or previous epoch.

Every record has the common fields

=========  ======  ==========================================================================
field      type    meaning
=========  ======  ==========================================================================
``v``      int     schema version: ``2`` (readers also accept ``1``)
``t``      number  seconds on the router's clock (the ``now`` the core was given, plus the
                   writer's ``t_offset``); routers analysed together must share an origin
                   (the simulator's virtual time, or wall-clock time for daemons)
``router`` string  the router's name
``kind``   string  one of the kinds below
``run``    string  optional: names the network/experiment, so traces of several networks can
                   be analysed together (the scaling fit then sees different router counts)
=========  ======  ==========================================================================

and, per ``kind`` (``?`` marks an optional field; ``flow`` is always the FlowID text form
``creator:lsid:local`` in zero-padded lowercase hex, as ``str(FlowID)`` prints it):

=============  ==============================================================================
kind           fields
=============  ==============================================================================
``fwd``        ``flow``, ``band`` (0..127), ``in_link``, ``out_links`` (copies sent),
               ``bytes`` (payload size), ``sample`` — a *sampled* data forwarding decision
``drop``       ``flow``, ``band``, ``in_link``, ``reason``, ``bytes``, ``sample``,
               ``links?`` (link transmissions the drop avoided, default 1) — a *sampled* drop;
               reasons are the router's ``drop.*`` counter suffixes (:data:`DROP_REASONS`)
``entry_add``  ``flow``, ``upstream?`` (link id toward the core, or null at the core)
``entry_del``  ``flow``, ``cause`` (:data:`ENTRY_DEL_CAUSES`: leave, gc, refused, timeout,
               link-down)
``link_add``   ``flow``, ``link``, ``mask`` (band mask, lowercase hex, no ``0x``), ``cause``
               (:data:`LINK_ADD_CAUSES`: ``join`` adds a downstream link, ``mask`` only changes
               the mask of one already there), ``role?`` (the link's peer role)
``link_del``   ``flow``, ``link``, ``mask``, ``cause`` (:data:`LINK_DEL_CAUSES`: leave, gc,
               link-down, refused), ``last?`` (time of the last traffic the GC saw on this
               (flow, link); the job measures GC lag from it), ``role?``
``gc_ping``    ``flow``, ``link``, ``epoch`` — a keep-alive ping sent down (flow, link)
               (version 1 routers)
``refresh``    ``link``, ``dir`` (``sent``: a digest round started toward this upstream
               neighbour; ``received``: a round from this downstream neighbour completed),
               ``entries``, ``chunks``, ``repaired?`` (masks corrected), ``removed?``
               ((flow, link) pairs the round no longer listed), ``unknown?`` (entries
               answered NOT_ON_TREE) — one record per digest round, never per flow
``prune``      ``link``, ``dir`` (``sent`` / ``received``), ``msg`` (``prune`` or
               ``not-on-tree``), ``flows`` (keys in the message)
``link_up``    ``link``, ``peer`` (peer's name), ``role`` (router, endpoint, unknown)
``link_down``  ``link``, ``peer``, ``role``, ``reason?`` (free text)
``snapshot``   ``entries``, ``links_total`` (downstream links summed over entries),
               ``active_flows`` (entries with traffic in the last epoch), ``mem_bytes``
               (estimate), ``core`` (bool: core for some LSID), ``fanout`` (object: number of
               downstream links, as a decimal string, → number of entries), ``edge?`` (bool:
               has endpoint links), ``members?`` (downstream links to endpoints summed over
               entries), ``lsids?`` (array: the LSIDs it is core for), ``epoch?``
=============  ==============================================================================

Integers (``band``, link ids, counts, ``epoch``) are non-negative JSON integers (never
``3.0``), ``sample`` is at least 1; numbers are finite. Unknown extra fields are ignored by
readers, so adding an optional field does not need a new version; changing or removing one
does.

The writers are in :mod:`flowrouter.core.tracers`, the reader in
:mod:`flowrouter.core.tracereader`; :mod:`flowrouter.core.traces` gathers all three.
May import only the standard library (the Spark job builds its checks from this module).
"""

from __future__ import annotations

import math
import re
from typing import Any

SCHEMA_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)  #: what read_traces and validate accept

#: the router's ``drop.<reason>`` counters (flowrouter.core.router); other tokens are accepted too
DROP_REASONS = ("ttl", "locality", "band-filtered", "no-route", "no-members", "no-state",
                "no-receivers", "too-big-for-link")
ENTRY_DEL_CAUSES = ("leave", "gc", "refused", "timeout", "link-down", "expired", "refresh",
                    "prune", "not-on-tree")
LINK_ADD_CAUSES = ("join", "mask", "refresh")
LINK_DEL_CAUSES = ("leave", "gc", "link-down", "refused", "expired", "refresh", "prune",
                   "not-on-tree")
ROLES = ("router", "endpoint", "unknown")

#: value types of the schema (see :data:`FIELDS`); the Spark job builds its checks from these
#:  int: JSON integer, 0 <= x < 2**63        pos: JSON integer, 1 <= x < 2**63
#:  num: finite JSON number
#:  str: non-empty string                     flow: canonical FlowID text
#:  band: integer 0..127                      token: [a-z][a-z0-9._-]* (reasons, causes)
#:  hex: 1..32 lowercase hex digits           bool: true/false
#:  role: one of ROLES                        fanout: object {"<int>": int}
#:  ints: array of int
COMMON_FIELDS: tuple[tuple[str, str], ...] = (("t", "num"), ("router", "str"), ("kind", "str"))
COMMON_OPTIONAL: tuple[tuple[str, str], ...] = (("run", "str"),)

#: kind -> (required fields, optional fields), each a tuple of (name, type), in check order
FIELDS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]] = {
    "fwd": ((("flow", "flow"), ("band", "band"), ("in_link", "int"), ("out_links", "int"),
             ("bytes", "int"), ("sample", "pos")), ()),
    "drop": ((("flow", "flow"), ("band", "band"), ("in_link", "int"), ("reason", "token"),
              ("bytes", "int"), ("sample", "pos")), (("links", "int"),)),
    "entry_add": ((("flow", "flow"),), (("upstream", "int"),)),
    "entry_del": ((("flow", "flow"), ("cause", "token")), ()),
    "link_add": ((("flow", "flow"), ("link", "int"), ("mask", "hex"), ("cause", "token")),
                 (("role", "role"),)),
    "link_del": ((("flow", "flow"), ("link", "int"), ("mask", "hex"), ("cause", "token")),
                 (("last", "num"), ("role", "role"))),
    "gc_ping": ((("flow", "flow"), ("link", "int"), ("epoch", "int")), ()),
    "refresh": ((("link", "int"), ("dir", "token"), ("entries", "int"), ("chunks", "int")),
                (("repaired", "int"), ("removed", "int"), ("unknown", "int"))),
    "prune": ((("link", "int"), ("dir", "token"), ("msg", "token"), ("flows", "int")), ()),
    "link_up": ((("link", "int"), ("peer", "str"), ("role", "role")), ()),
    "link_down": ((("link", "int"), ("peer", "str"), ("role", "role")), (("reason", "str"),)),
    "snapshot": ((("entries", "int"), ("links_total", "int"), ("active_flows", "int"),
                  ("mem_bytes", "int"), ("core", "bool"), ("fanout", "fanout")),
                 (("edge", "bool"), ("members", "int"), ("lsids", "ints"), ("epoch", "int"))),
}
KINDS = tuple(FIELDS)
#: kinds that exist only in some versions (every other kind is valid in all of them)
VERSION_KINDS = {"refresh": (2,), "prune": (2,)}
SAMPLED_KINDS = ("fwd", "drop")

FLOW_RE = re.compile(r"[0-9a-f]{16}:[0-9a-f]{8}:[0-9a-f]{8}")
TOKEN_RE = re.compile(r"[a-z][a-z0-9._-]*")
HEX_RE = re.compile(r"[0-9a-f]{1,32}")
DIGITS_RE = re.compile(r"[0-9]+")
#: the same patterns for Spark's ``rlike`` (Java regex, anchored)
SPARK_PATTERNS = {"flow": "^[0-9a-f]{16}:[0-9a-f]{8}:[0-9a-f]{8}$",
                  "token": "^[a-z][a-z0-9._-]*$", "hex": "^[0-9a-f]{1,32}$",
                  "digits": "^[0-9]+$"}

#: memory model of one flow-route entry (measured with tracemalloc on FlowEntry: ~480 B bare,
#: ~860 B with one downstream link, ~2.2 kB with 16): bytes per entry plus bytes per link
ENTRY_BYTES = 700
LINK_BYTES = 96

_INT_MAX = 1 << 63


def flow_key_text(flow: Any) -> str:
    """Text form of a flow: 16-byte key (bytes/memoryview), FlowID, or text (returned as is).

    Same output as ``str(FlowID.from_key(key))`` without building a FlowID.
    """
    if isinstance(flow, str):
        return flow
    if isinstance(flow, (bytes, bytearray, memoryview)):
        h = bytes(flow).hex()
        if len(h) != 32:
            raise ValueError(f"a flow key is 16 bytes, got {len(h) // 2}")
        return f"{h[:16]}:{h[16:24]}:{h[24:]}"
    return str(flow)


def role_text(role: Any) -> str:
    """``Role.ROUTER`` / ``"router"`` -> ``"router"``; None or anything unknown -> ``"unknown"``."""
    if role is None:
        return "unknown"
    name = role if isinstance(role, str) else getattr(role, "name", str(role))
    name = name.lower()
    return name if name in ROLES else "unknown"


def _bad(value: Any, typ: str) -> bool:
    """True when *value* (not None) is not of schema type *typ*."""
    if typ == "int":
        return type(value) is not int or not 0 <= value < _INT_MAX
    if typ == "pos":
        return type(value) is not int or not 1 <= value < _INT_MAX
    if typ == "band":
        return type(value) is not int or not 0 <= value <= 127
    if typ == "num":
        if type(value) is int:
            return abs(value) >= 1e308
        return type(value) is not float or not math.isfinite(value)
    if typ == "str":
        return not isinstance(value, str) or not value
    if typ == "flow":
        return not isinstance(value, str) or FLOW_RE.fullmatch(value) is None
    if typ == "token":
        return not isinstance(value, str) or TOKEN_RE.fullmatch(value) is None
    if typ == "hex":
        return not isinstance(value, str) or HEX_RE.fullmatch(value) is None
    if typ == "bool":
        return type(value) is not bool
    if typ == "role":
        return value not in ROLES
    if typ == "fanout":
        return not isinstance(value, dict) or any(
            not isinstance(k, str) or DIGITS_RE.fullmatch(k) is None or _bad(v, "int")
            for k, v in value.items())
    if typ == "ints":
        return not isinstance(value, list) or any(_bad(x, "int") for x in value)
    raise AssertionError(typ)  # pragma: no cover


def validate(rec: Any) -> str | None:
    """None if *rec* (a parsed JSON value) is a valid record of a supported version, else
    the first problem.

    The messages (``unsupported version``, ``unknown kind``, ``missing or invalid field 'x'``,
    ``invalid field 'x'``) are the ones the Spark job reports.
    """
    if not isinstance(rec, dict):
        return "not a JSON object"
    version = rec.get("v")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        return "unsupported version"
    for name, typ in COMMON_FIELDS:
        value = rec.get(name)
        if value is None or _bad(value, typ):
            return f"missing or invalid field '{name}'"
    kind = rec["kind"]
    spec = FIELDS.get(kind)
    if spec is None or version not in VERSION_KINDS.get(kind, SUPPORTED_VERSIONS):
        return "unknown kind"
    required, optional = spec
    for name, typ in required:
        value = rec.get(name)
        if value is None or _bad(value, typ):
            return f"missing or invalid field '{name}'"
    for name, typ in (*COMMON_OPTIONAL, *optional):
        value = rec.get(name)
        if value is not None and _bad(value, typ):
            return f"invalid field '{name}'"
    return None
