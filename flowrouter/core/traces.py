"""Router trace records: the schema (version 2), the writers the router core calls, a reader.

Routers and the simulator write **JSON Lines**: one JSON object per line, UTF-8, ``\\n``
terminated. The PySpark job in :mod:`apps.flowtrace` mines them for flow-table scaling
(DESIGN.md section 10); :func:`read_traces` is the reference validator for everything else.

Record schema, version 2
========================

Version 2 (soft state, DESIGN.md section 14) replaces the per-(flow, link) ``gc_ping``
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

Sampling: ``fwd`` and ``drop`` records are sampled, each kind with its own countdown. A record
with ``sample: N`` stands for N decisions, so ``sum(sample)`` estimates the decision count and
``sum(sample * bytes)`` the bytes (the job does exactly that). By default sampling is
*systematic*: one decision in N, with a per-router phase (CRC-32 of the router name) so that
routers are not in step; it is deterministic, which the simulator needs. With ``seed=`` it is
*Bernoulli* sampling (each decision kept with probability 1/N), drawn as geometric gaps from
``random.Random(seed)``: also deterministic, and immune to aliasing with periodic traffic.
Either way an unsampled decision costs one decrement and one test. Table changes, GC pings,
link events and snapshots are never sampled.

Files and rotation: :class:`TraceWriter` writes ``PATH`` (or ``DIR/<router>.trace.jsonl`` when
given a directory). When the file reaches ``rotate_bytes`` it is renamed ``<base>.1.jsonl``
(older ones shift to ``.2``, ``.3`` ... and those past ``keep`` are deleted), like logrotate, and
a fresh file is started; a record is never split across files. :func:`read_traces` reads a
rotated set oldest first. Writes are buffered (``buffer_bytes``) and flushed when the buffer
fills, when ``flush_interval`` seconds of trace time have passed since the last flush, and on
:meth:`~TraceWriter.flush` / :meth:`~TraceWriter.close`. A writer is not thread-safe; the core
and the asyncio runtime are single-threaded.
"""

from __future__ import annotations

import glob as _glob
import gzip
import json
import math
import os
import random
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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
_NEVER = 1 << 62  #: a countdown that never runs out (sampling off)


# ---------------------------------------------------------------------------- conversions
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


def _interval(rate: float | None, what: str) -> int:
    """Sampling rate -> 1-in-N interval (0 means: never record)."""
    if rate is None:
        return 0
    if not 0 <= rate <= 1 or math.isnan(rate):
        raise ValueError(f"{what} must be between 0 and 1, got {rate!r}")
    if rate == 0:
        return 0
    return max(1, round(1 / rate))


# ---------------------------------------------------------------------------- the interface
@runtime_checkable
class Tracer(Protocol):
    """What the router core calls. ``t`` is the core's ``now``; ``flow`` the 16-byte key.

    Implementations convert keys, masks and roles to text only when they actually write a
    record. ``enabled`` is False for :class:`NullTracer`, so callers can skip building
    arguments that cost something (for example :func:`snapshot_fields`).
    """

    enabled: bool
    #: countdowns to the next sampled fwd / drop decision (decrement inline; at zero call
    #: fwd_sampled / drop_sampled); only read when ``enabled``
    fwd_left: int
    drop_left: int

    def entry_add(self, t: float, flow: bytes, upstream: int | None) -> None: ...
    def entry_del(self, t: float, flow: bytes, cause: str) -> None: ...
    def link_add(self, t: float, flow: bytes, link: int, mask: int, cause: str = "join",
                 role: Any = None) -> None: ...
    def link_del(self, t: float, flow: bytes, link: int, mask: int, cause: str,
                 last: float | None = None, role: Any = None) -> None: ...
    def gc_ping(self, t: float, flow: bytes, link: int, epoch: int) -> None: ...
    def refresh(self, t: float, link: int, direction: str, entries: int, chunks: int,
                repaired: int | None = None, removed: int | None = None,
                unknown: int | None = None) -> None: ...
    def prune(self, t: float, link: int, direction: str, msg: str, flows: int) -> None: ...
    def link_up(self, t: float, link: int, peer: str, role: Any) -> None: ...
    def link_down(self, t: float, link: int, peer: str, role: Any,
                  reason: str | None = None) -> None: ...
    def fwd(self, t: float, flow: bytes, band: int, in_link: int, out_links: int,
            nbytes: int) -> None: ...
    def fwd_sampled(self, t: float, flow: bytes, band: int, in_link: int, out_links: int,
                    nbytes: int) -> None: ...
    def drop_sampled(self, t: float, flow: bytes, band: int, in_link: int, reason: str,
                     nbytes: int = 0, links: int = 1) -> None: ...
    def drop(self, t: float, flow: bytes, band: int, in_link: int, reason: str,
             nbytes: int = 0, links: int = 1) -> None: ...
    def snapshot(self, t: float, *, entries: int, links_total: int, active_flows: int,
                 mem_bytes: int, core: bool, fanout: Mapping[int, int],
                 edge: bool | None = None, members: int | None = None,
                 lsids: Iterable[int] | None = None, epoch: int | None = None) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class NullTracer:
    """Records nothing; every method returns at once. The router's default."""

    enabled = False
    fwd_left = drop_left = 1 << 62  # never runs out; the router does not even look

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        return None

    entry_add = entry_del = link_add = link_del = gc_ping = refresh = prune = _nothing
    link_up = link_down = fwd = drop = snapshot = emit = flush = close = _nothing
    fwd_sampled = drop_sampled = _nothing

    def __enter__(self) -> NullTracer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NULL_TRACER = NullTracer()


class BaseTracer:
    """Sampling and record building shared by :class:`TraceWriter` and :class:`MemoryTrace`.

    Subclasses implement ``_put(record: dict)``.
    """

    enabled = True

    def __init__(self, router: str, *, sample_rate: float = 0.01,
                 drop_sample_rate: float | None = None, seed: int | None = None,
                 run: str | None = None, clock: Callable[[], float] | None = None,
                 t_offset: float = 0.0) -> None:
        if not isinstance(router, str) or not router:
            raise ValueError("a tracer needs the router's name")
        self.router = router
        self.run = run
        self.clock = clock
        self.t_offset = float(t_offset)
        self.fwd_every = _interval(sample_rate, "sample_rate")
        self.drop_every = (self.fwd_every if drop_sample_rate is None
                           else _interval(drop_sample_rate, "drop_sample_rate"))
        self._rng = random.Random(seed) if seed is not None else None
        phase = zlib.crc32(router.encode())
        # Countdowns to the next sampled decision. Public so a hot path can decrement them
        # inline and call fwd_sampled()/drop_sampled() only when they reach zero (a method
        # call per decision would cost more than the rest of the sampling).
        self.fwd_left = self._first_gap(self.fwd_every, phase) if self.fwd_every else _NEVER
        self.drop_left = (self._first_gap(self.drop_every, phase >> 8) if self.drop_every
                          else _NEVER)
        if not self.fwd_every:
            self.fwd = self._off  # type: ignore[method-assign]
        if not self.drop_every:
            self.drop = self._off  # type: ignore[method-assign]

    # sampling -----------------------------------------------------------------------------
    def _first_gap(self, every: int, phase: int) -> int:
        if every <= 1:
            return 1
        if self._rng is not None:
            return self._gap(every)
        return 1 + phase % every

    def _gap(self, every: int) -> int:
        """Decisions until the next sampled one: ``every`` (systematic) or geometric."""
        rng = self._rng
        if rng is None or every <= 1:
            return every
        u = 1.0 - rng.random()  # (0, 1]
        return 1 + int(math.log(u) / math.log1p(-1.0 / every))

    def _off(self, *args: Any, **kwargs: Any) -> None:
        return None

    # record building ----------------------------------------------------------------------
    def _rec(self, kind: str, t: float | None, fields: dict[str, Any]) -> dict[str, Any]:
        if t is None:
            if self.clock is None:
                raise ValueError("no time given and the tracer has no clock")
            t = self.clock()
        rec: dict[str, Any] = {"v": SCHEMA_VERSION, "t": t + self.t_offset,
                               "router": self.router, "kind": kind}
        if self.run is not None:
            rec["run"] = self.run
        rec.update(fields)
        return rec

    def _put(self, rec: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def emit(self, kind: str, t: float | None = None, **fields: Any) -> None:
        """Write one record as given (no sampling, no conversion); ``t=None`` uses the clock."""
        if kind not in FIELDS:
            raise ValueError(f"unknown trace record kind {kind!r}; one of {', '.join(KINDS)}")
        self._put(self._rec(kind, t, fields))

    # the Tracer methods -------------------------------------------------------------------
    def fwd(self, t: float, flow: Any, band: int, in_link: int, out_links: int,
            nbytes: int) -> None:
        self.fwd_left -= 1
        if self.fwd_left <= 0:
            self.fwd_sampled(t, flow, band, in_link, out_links, nbytes)

    def fwd_sampled(self, t: float, flow: Any, band: int, in_link: int, out_links: int,
                    nbytes: int) -> None:
        """The countdown reached zero: write this decision and start the next gap."""
        every = self.fwd_every
        if not every:
            self.fwd_left = _NEVER
            return
        self.fwd_left = self._gap(every)
        self._put(self._rec("fwd", t, {"flow": flow_key_text(flow), "band": band,
                                       "in_link": in_link, "out_links": out_links,
                                       "bytes": nbytes, "sample": every}))

    def drop(self, t: float, flow: Any, band: int, in_link: int, reason: str,
             nbytes: int = 0, links: int = 1) -> None:
        self.drop_left -= 1
        if self.drop_left <= 0:
            self.drop_sampled(t, flow, band, in_link, reason, nbytes, links)

    def drop_sampled(self, t: float, flow: Any, band: int, in_link: int, reason: str,
                     nbytes: int = 0, links: int = 1) -> None:
        """The drop countdown reached zero: write this drop and start the next gap."""
        every = self.drop_every
        if not every:
            self.drop_left = _NEVER
            return
        self.drop_left = self._gap(every)
        fields = {"flow": flow_key_text(flow), "band": band, "in_link": in_link,
                  "reason": reason, "bytes": nbytes, "sample": every}
        if links != 1:
            fields["links"] = links
        self._put(self._rec("drop", t, fields))

    def entry_add(self, t: float, flow: Any, upstream: int | None) -> None:
        self._put(self._rec("entry_add", t, {"flow": flow_key_text(flow),
                                             "upstream": upstream}))

    def entry_del(self, t: float, flow: Any, cause: str) -> None:
        self._put(self._rec("entry_del", t, {"flow": flow_key_text(flow), "cause": cause}))

    def link_add(self, t: float, flow: Any, link: int, mask: int, cause: str = "join",
                 role: Any = None) -> None:
        fields = {"flow": flow_key_text(flow), "link": link, "mask": f"{mask:x}",
                  "cause": cause}
        if role is not None:
            fields["role"] = role_text(role)
        self._put(self._rec("link_add", t, fields))

    def link_del(self, t: float, flow: Any, link: int, mask: int, cause: str,
                 last: float | None = None, role: Any = None) -> None:
        fields: dict[str, Any] = {"flow": flow_key_text(flow), "link": link,
                                  "mask": f"{mask:x}", "cause": cause}
        if last is not None:
            fields["last"] = last + self.t_offset
        if role is not None:
            fields["role"] = role_text(role)
        self._put(self._rec("link_del", t, fields))

    def gc_ping(self, t: float, flow: Any, link: int, epoch: int) -> None:
        self._put(self._rec("gc_ping", t, {"flow": flow_key_text(flow), "link": link,
                                           "epoch": epoch}))

    def refresh(self, t: float, link: int, direction: str, entries: int, chunks: int,
                repaired: int | None = None, removed: int | None = None,
                unknown: int | None = None) -> None:
        fields: dict[str, Any] = {"link": link, "dir": direction, "entries": entries,
                                  "chunks": chunks}
        for name, value in (("repaired", repaired), ("removed", removed),
                            ("unknown", unknown)):
            if value is not None:
                fields[name] = value
        self._put(self._rec("refresh", t, fields))

    def prune(self, t: float, link: int, direction: str, msg: str, flows: int) -> None:
        self._put(self._rec("prune", t, {"link": link, "dir": direction, "msg": msg,
                                         "flows": flows}))

    def link_up(self, t: float, link: int, peer: str, role: Any) -> None:
        self._put(self._rec("link_up", t, {"link": link, "peer": peer or "?",
                                           "role": role_text(role)}))

    def link_down(self, t: float, link: int, peer: str, role: Any,
                  reason: str | None = None) -> None:
        fields = {"link": link, "peer": peer or "?", "role": role_text(role)}
        if reason:
            fields["reason"] = reason
        self._put(self._rec("link_down", t, fields))

    def snapshot(self, t: float, *, entries: int, links_total: int, active_flows: int,
                 mem_bytes: int, core: bool, fanout: Mapping[int, int],
                 edge: bool | None = None, members: int | None = None,
                 lsids: Iterable[int] | None = None, epoch: int | None = None) -> None:
        fields: dict[str, Any] = {
            "entries": entries, "links_total": links_total, "active_flows": active_flows,
            "mem_bytes": mem_bytes, "core": bool(core),
            "fanout": {str(k): v for k, v in sorted(fanout.items())}}
        if edge is not None:
            fields["edge"] = bool(edge)
        if members is not None:
            fields["members"] = members
        if lsids is not None:
            fields["lsids"] = sorted(lsids)
        if epoch is not None:
            fields["epoch"] = epoch
        self._put(self._rec("snapshot", t, fields))

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> BaseTracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemoryTrace(BaseTracer):
    """Keeps records as dicts in ``self.records`` (tests, the simulator). Same interface."""

    def __init__(self, router: str, **kwargs: Any) -> None:
        kwargs.setdefault("sample_rate", 1.0)
        super().__init__(router, **kwargs)
        self.records: list[dict[str, Any]] = []

    def _put(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)

    def lines(self) -> list[str]:
        """The records as the JSON lines a :class:`TraceWriter` would write."""
        return [encode_record(r) for r in self.records]

    def write_jsonl(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in self.lines())


def encode_record(rec: Mapping[str, Any]) -> str:
    """One record as its JSON line (without the newline)."""
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=False)


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class TraceWriter(BaseTracer):
    """Buffered JSON Lines writer with size-based rotation.

    ``path_or_dir``: a file path (``.../trace.jsonl``), or an existing directory (or a path
    ending in ``/``), in which case the file is ``<dir>/<router>.trace.jsonl``. Rotated files
    are ``<base>.1.jsonl`` (newest) ... ``<base>.<keep>.jsonl``; ``keep=0`` discards the full
    file instead. An existing file is appended to (after completing a torn last line).
    ``sample_rate``: fraction of forwarding decisions recorded (1-in-round(1/rate)); 0 records
    none. ``drop_sample_rate`` defaults to ``sample_rate``. ``seed``: Bernoulli instead of
    systematic sampling. ``clock``: used when a method gets ``t=None``. ``t_offset`` is added to
    every time (e.g. ``time.time() - time.monotonic()`` to turn a monotonic router clock into
    wall-clock time).
    """

    def __init__(self, path_or_dir: str | os.PathLike[str], router: str, *,
                 sample_rate: float = 0.01, drop_sample_rate: float | None = None,
                 rotate_bytes: int = 64 * 1024 * 1024, keep: int = 10,
                 buffer_bytes: int = 256 * 1024, flush_interval: float = 1.0,
                 seed: int | None = None, run: str | None = None,
                 clock: Callable[[], float] | None = None, t_offset: float = 0.0) -> None:
        super().__init__(router, sample_rate=sample_rate, drop_sample_rate=drop_sample_rate,
                         seed=seed, run=run, clock=clock, t_offset=t_offset)
        if rotate_bytes <= 0:
            raise ValueError("rotate_bytes must be positive")
        if keep < 0:
            raise ValueError("keep must be >= 0")
        target = os.fspath(path_or_dir)
        if os.path.isdir(target) or target.endswith(("/", os.sep)):
            os.makedirs(target, exist_ok=True)
            target = os.path.join(target, f"{_SAFE_NAME.sub('_', router)}.trace.jsonl")
        else:
            parent = os.path.dirname(target)
            if parent:
                os.makedirs(parent, exist_ok=True)
        self.path = target
        self._base = target[:-6] if target.endswith(".jsonl") else target
        self.rotate_bytes = rotate_bytes
        self.keep = keep
        self.buffer_bytes = max(1, buffer_bytes)
        self.flush_interval = flush_interval
        self._buf: list[str] = []
        self._buffered = 0
        self._last_flush_t: float | None = None
        self.records_written = 0
        self.rotations = 0
        self._closed = False
        self._repair()

    def rotated_path(self, index: int) -> str:
        """Path of rotated file *index* (1 = newest); 0 is the live file."""
        return self.path if index == 0 else f"{self._base}.{index}.jsonl"

    def _repair(self) -> None:
        """End a torn last line (a crash mid-write), so that only that line is corrupt."""
        try:
            with open(self.path, "rb+") as fh:
                if fh.seek(0, os.SEEK_END):
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        fh.write(b"\n")
        except FileNotFoundError:
            pass

    def _put(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, separators=(",", ":"), ensure_ascii=False) + "\n"
        self._buf.append(line)
        self._buffered += len(line)
        self.records_written += 1
        t = rec["t"]
        if self._last_flush_t is None:
            self._last_flush_t = t
        if self._buffered >= self.buffer_bytes or t - self._last_flush_t >= self.flush_interval:
            self._last_flush_t = t
            self.flush()

    def flush(self) -> None:
        """Append the buffered records, rotating between records as needed.

        The file is open only during a flush: no descriptor is held in between, so thousands of
        writers in one simulator process are fine, and the file may be moved away meanwhile.
        """
        if not self._buf:
            return
        if self._closed:
            raise ValueError(f"trace {self.path} is closed")
        buf, self._buf, self._buffered = self._buf, [], 0
        pending = [line.encode("utf-8") for line in buf]
        while pending:
            with open(self.path, "ab") as fh:
                size = fh.seek(0, os.SEEK_END)
                n = 0
                for data in pending:
                    if (size or n) and size + len(data) > self.rotate_bytes:
                        break
                    size += len(data)
                    n += 1
                fh.writelines(pending[:n])
            pending = pending[n:]
            if pending:
                self._rotate()

    def _rotate(self) -> None:
        if self.keep == 0:
            os.unlink(self.path)
        else:
            oldest = self.rotated_path(self.keep)
            if os.path.exists(oldest):
                os.unlink(oldest)
            for i in range(self.keep - 1, 0, -1):
                src = self.rotated_path(i)
                if os.path.exists(src):
                    os.replace(src, self.rotated_path(i + 1))
            os.replace(self.path, self.rotated_path(1))
        self.rotations += 1

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


def snapshot_fields(router: Any) -> dict[str, Any]:
    """The ``snapshot`` arguments for a :class:`flowrouter.core.router.Router` (duck-typed).

    Usage in the core: ``self.tracer.snapshot(now, **snapshot_fields(self))``. Walks the flow
    table once (O(entries)), so call it at the snapshot period, not per message. An entry is
    *active* when some downstream link saw traffic in the current or the previous epoch (the
    router notes traffic per downstream link only).
    """
    epoch = router.epoch
    endpoint_links = {lid for lid, lk in router.links.items()
                      if role_text(lk.role) == "endpoint"}
    fanout: dict[int, int] = {}
    links_total = active = members = 0
    for entry in router.flows.values():
        n = len(entry.down)
        links_total += n
        fanout[n] = fanout.get(n, 0) + 1
        if entry.traffic and max(entry.traffic.values()) >= epoch - 1:
            active += 1
        if endpoint_links:
            members += sum(1 for lid in entry.down if lid in endpoint_links)
    entries = len(router.flows)
    lsids = sorted(router.p.core_lsids)
    return {"entries": entries, "links_total": links_total, "active_flows": active,
            "mem_bytes": entries * ENTRY_BYTES + links_total * LINK_BYTES,
            "core": bool(lsids), "fanout": fanout, "edge": bool(endpoint_links),
            "members": members, "lsids": lsids, "epoch": epoch}


# ---------------------------------------------------------------------------- validation
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


@dataclass(frozen=True, slots=True)
class TraceError:
    """A line that is not a valid record: ``kind`` is ``corrupt`` (not a JSON object) or
    ``invalid`` (a JSON object that breaks the schema)."""

    path: str
    line: int
    kind: str
    reason: str
    text: str


def _rotation_key(path: str) -> tuple[str, int, str]:
    """Sort key putting a rotated set oldest first: base.3, base.2, base.1, base."""
    name = path[:-3] if path.endswith(".gz") else path
    m = re.fullmatch(r"(.*)\.(\d+)\.jsonl", name)
    if m:
        return (m.group(1), -int(m.group(2)), path)
    base = name[:-6] if name.endswith(".jsonl") else name
    return (base, 0, path)


def expand_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                 ) -> list[str]:
    """Files named by *paths*: files as given, directories searched recursively for
    ``*.jsonl`` / ``*.jsonl.gz``, glob patterns expanded. Raises FileNotFoundError for a
    path that names nothing."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            found = [str(f) for f in Path(p).rglob("*")
                     if f.is_file() and f.name.endswith((".jsonl", ".jsonl.gz"))]
            out += sorted(found, key=_rotation_key)
        elif os.path.exists(p):
            out.append(p)
        else:
            matches = _glob.glob(p, recursive=True)
            if not matches:
                raise FileNotFoundError(f"no trace file or directory matches {p!r}")
            files: list[str] = []
            for m in matches:
                files += expand_paths(m) if os.path.isdir(m) else [m]
            out += sorted(files, key=_rotation_key)
    return out


def read_traces(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                ) -> Iterator[dict[str, Any] | TraceError]:
    """Yield each record (a dict) or a :class:`TraceError`, file by file, line by line.

    Accepts files, directories, globs (see :func:`expand_paths`); ``.gz`` files are
    decompressed. Blank lines are skipped; invalid UTF-8 is replaced (as Spark does). Errors
    are never raised for bad lines: the caller counts them.
    """
    for path in expand_paths(paths):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as fh:  # type: ignore[operator]
            for n, raw in enumerate(fh, 1):
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError as exc:
                    yield TraceError(path, n, "corrupt", f"not JSON ({exc.msg})", text)
                    continue
                except (ValueError, RecursionError) as exc:  # e.g. absurdly deep nesting
                    yield TraceError(path, n, "corrupt", f"not JSON ({type(exc).__name__})",
                                     text)
                    continue
                if not isinstance(rec, dict):
                    yield TraceError(path, n, "corrupt", "not a JSON object", text)
                    continue
                problem = validate(rec)
                if problem is None:
                    yield rec
                else:
                    yield TraceError(path, n, "invalid", problem, text)
