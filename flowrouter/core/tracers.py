"""Router trace writers: the Tracer interface the core calls, and its implementations.

:class:`NullTracer` (tracing off: one test on the hot path), :class:`MemoryTrace` (tests,
the simulator) and :class:`TraceWriter` (JSON Lines files with rotation); records follow
the schema in :mod:`flowrouter.core.traceschema`.

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

May import :mod:`flowrouter.core.traceschema` and the standard library.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from flowrouter.core.traceschema import (
    ENTRY_BYTES,
    FIELDS,
    KINDS,
    LINK_BYTES,
    SCHEMA_VERSION,
    flow_key_text,
    role_text,
)

_NEVER = 1 << 62  #: a countdown that never runs out (sampling off)


def _interval(rate: float | None, what: str) -> int:
    """Sampling rate -> 1-in-N interval (0 means: never record)."""
    if rate is None:
        return 0
    if not 0 <= rate <= 1 or math.isnan(rate):
        raise ValueError(f"{what} must be between 0 and 1, got {rate!r}")
    if rate == 0:
        return 0
    return max(1, round(1 / rate))


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
    """The ``snapshot`` arguments for a router's shared tables
    (:class:`flowrouter.core.state.RouterState`, duck-typed: ``epoch``, ``started``, ``p``,
    ``links``, ``flows``).

    Usage in the core: ``tracer.snapshot(now, **snapshot_fields(state))``. Walks the flow
    table once (O(entries)), so call it at the snapshot period, not per message. An entry is
    *active* when some downstream link joined or refreshed it in the current or the previous
    epoch (``entry.last_refreshed()``, on the router's clock).
    """
    epoch = router.epoch
    since = router.started + (epoch - 1) * router.p.epoch_length
    endpoint_links = {lid for lid, lk in router.links.items()
                      if role_text(lk.role) == "endpoint"}
    fanout: dict[int, int] = {}
    links_total = active = members = 0
    for entry in router.flows.values():
        n = entry.down_count()
        links_total += n
        fanout[n] = fanout.get(n, 0) + 1
        last = entry.last_refreshed()
        if last is not None and last >= since:
            active += 1
        if endpoint_links:
            members += sum(1 for lid in entry.down_links() if lid in endpoint_links)
    entries = len(router.flows)
    lsids = sorted(router.p.core_lsids)
    return {"entries": entries, "links_total": links_total, "active_flows": active,
            "mem_bytes": entries * ENTRY_BYTES + links_total * LINK_BYTES,
            "core": bool(lsids), "fanout": fanout, "edge": bool(endpoint_links),
            "members": members, "lsids": lsids, "epoch": epoch}
