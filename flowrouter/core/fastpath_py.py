"""The forwarding engine of the fast path in pure Python: the twin of ``_fastpath.c``.

Both hold a mirror of what forwarding needs (flow key -> upstream link, downstream links with
band masks; per link: router or not, largest payload, locality costs; per LSID: where a frame
of a flow the core holds no entry for goes) and forward the ordinary data frames of a whole
received buffer at once into per-link output buffers. They decide nothing the core would not:
:mod:`flowrouter.core.fastpath` keeps the mirror in step with the core's tables and hands
every frame they stop at to the core. The equivalence tests feed both engines and the core
the same tables and frames and demand the same output.

Senders that are not members (the core-based-tree rule): a flow key the core holds no entry
for is mirrored as *absent* (``set_absent``), and its LSID's route (``set_route``: the link
toward the location service, or why the core drops such frames). A data frame of an absent
flow goes on that one link, TTL and locality charged as for any copy, and counts
``forward.toward-core`` as in the core; a frame that would go back out of the link it came in
on (the core answers NOT_ON_TREE) is the core's.

Per-flow counters: each mirrored entry counts the data frames of its flow the engine took
(forwarded, or dropped by the tree's masks: what the core counts in its entry) and their
bytes, headers included. ``forget_flow`` returns them, for the core's entry; an absent key
counts nothing.

``forward(link, data, pos, fwd_budget, drop_budget, max_payload, ref_min, share_min,
in_place)`` returns
``(pos, stop, outputs, counts)``:

* ``pos`` — where forwarding stopped; ``stop`` says why (the ``STOP_*`` codes below): the
  buffer ended (``STOP_END``), a frame is incomplete (``STOP_PARTIAL``), the frame at ``pos``
  is for the core (``STOP_SLOW``: control bands, link-local frames, invalid headers, a trace
  sample due, a band only routers originate (17..19) sent by an application link), or the
  mirror lacks its flow, one of its links or (for an absent flow) its LSID's route
  (``STOP_MISS_FLOW``, ``STOP_MISS_LINK``, ``STOP_MISS_ROUTE``). No side effect of the frame
  at ``pos`` has happened;
* ``outputs`` — ``[(link, out, frames)]``: each output link's frames, headers rewritten
  (one header per distinct TTL and locality), in arrival order. ``out`` is one ``bytes``
  object, unless a payload of ``ref_min`` bytes or more (default: none) went to that link:
  such payloads are not copied, and ``out`` is then a list of buffers to write in order,
  alternately the copied bytes up to and including such a frame's header and a view of its
  payload in ``data``, then the copied bytes after the last one, if any (the compiled engine
  gives the copied runs as views of one bytes object). Views of ``data`` are only valid
  while ``data`` is: the caller must write them before it reuses ``data``'s buffer.
  **Shared runs** (fan-out): consecutive forwarded frames that each go to the same two or
  more links (none twice), in the same order and with one locality value for all of them,
  form a run;
  a run of ``share_min`` bytes or more (headers and payloads; default: never) is built once
  and its buffers are shared by all its links instead of copied into each: the run is one
  ``bytes`` object (or, with payloads passed on, its own list of buffers as above). A
  link's ``out`` is then that object itself when the run is all it gets and is bytes, else
  a list: the link's own copied bytes before the run, the run's buffers, the bytes after.
  Frames dropped for every link do not end a run; any other frame does. No caller may
  change an ``out`` (it may be shared). **In place** (``in_place`` true, *data* writable,
  and no frame of the call going to two links or leaving its payload by reference): a link
  whose frames lie back to back in *data* gets a view of them, their headers rewritten in
  *data* itself (bytes 21..23: the rest of a forwarded header is the input's), instead of
  a copy: a unicast stream through a router then costs no copy in user space. The frames
  the call did not take are left as they were;
* ``counts`` — ``COUNT_NAMES`` in order, then the forward and drop decisions taken (the
  tracer's sampling countdowns; at most ``fwd_budget - 1`` and ``drop_budget - 1`` of them,
  so the decision that is sampled is always the core's), then the frames taken, then
  ``MORE_COUNT_NAMES`` in order (``COUNT_AT`` maps every counter name to its index).

Imports: nothing from this project (it must stay a drop-in twin of the C module).
"""

from __future__ import annotations

from typing import Any

STOP_END = 0
STOP_PARTIAL = 1
STOP_SLOW = 2
STOP_MISS_FLOW = 3
STOP_MISS_LINK = 4
STOP_MISS_ROUTE = 5

#: what a route says instead of a link (``set_route``): the core drops such frames, counted
#: as ``drop.no-members`` (we are the location service's core and hold no entry) or
#: ``drop.no-route`` (no link leads toward it)
ROUTE_NO_MEMBERS = -1
ROUTE_NONE = -2

#: counter names of ``counts[0:6]``, as the core names them
COUNT_NAMES = ("forwarded", "drop.ttl", "drop.band-filtered", "drop.no-receivers",
               "drop.locality", "drop.too-big-for-link")
#: counter names of ``counts[9:12]``
MORE_COUNT_NAMES = ("forward.toward-core", "drop.no-members", "drop.no-route")
#: counter name -> index in ``counts``
COUNT_AT = {**{name: i for i, name in enumerate(COUNT_NAMES)},
            **{name: 9 + i for i, name in enumerate(MORE_COUNT_NAMES)}}
_NCOUNTS = 12

_HEADER = 24
_ROUTER_BANDS_END = 16
#: bands only routers originate (faults, overflow notices, membership notices: the core's
#: ``ROUTER_ONLY_BANDS``): a frame on one from an application link is the core's to drop
_ROUTER_ONLY = (1 << 17) | (1 << 18) | (1 << 19)
_NUM_BANDS = 128
_NUM_LOCALITY_TYPES = 4
_MAX_DOWN = 65535


class Engine:
    """Pure-Python forwarding engine (see the module docstring)."""

    native = False

    def __init__(self) -> None:
        #: link -> (is_router, max_payload, modifiers indexed by locality type)
        self._links: dict[int, tuple[bool, int, tuple[int, ...]]] = {}
        #: key -> (upstream or -1, [(link, mask)], aggregate mask), or None: absent (the
        #: core holds no entry: frames go toward the LSID's route)
        self._flows: dict[bytes, tuple[int, list[tuple[int, int]], int] | None] = {}
        #: LSID -> link toward its location service, or ROUTE_NO_MEMBERS / ROUTE_NONE
        self._routes: dict[int, int] = {}
        #: key -> [frames, bytes] its mirrored entry took (none yet: no item)
        self._counts: dict[bytes, list[int]] = {}

    # ------------------------------------------------------------------ the mirror
    def set_link(self, link: int, router: bool, max_payload: int,
                 modifiers: tuple[int, ...]) -> None:
        if len(modifiers) != _NUM_LOCALITY_TYPES:
            raise ValueError("modifiers: one per locality type")
        self._links[link] = (bool(router), int(max_payload), tuple(int(m) for m in modifiers))

    def forget_link(self, link: int) -> None:
        self._links.pop(link, None)

    def set_flow(self, key: bytes, upstream: int, down: list[tuple[int, int]],
                 agg: int) -> None:
        """Mirror a flow entry: *upstream* (-1: none, at a core), downstream links with
        their band masks in the core's order, and the core's aggregate mask."""
        if len(key) != 16:
            raise ValueError("a flow key is 16 bytes")
        if len(down) > _MAX_DOWN:
            raise ValueError("at most 65535 downstream links per flow")
        if any(not -1 <= lk < 1 << 31 for lk in (upstream, *(lk for lk, _m in down))):
            raise ValueError("link ids in a flow are 0..2**31-1 (-1: none)")
        if not 0 <= agg < 1 << _NUM_BANDS or any(not 0 <= m < 1 << _NUM_BANDS
                                                 for _lk, m in down):
            raise ValueError("band masks are 128-bit")
        self._flows[bytes(key)] = (int(upstream), [(int(lk), int(m)) for lk, m in down],
                                   int(agg))

    def set_absent(self, key: bytes) -> None:
        """Mirror that the core holds no entry for *key*: its data frames go toward the
        location service of its LSID (see ``set_route``)."""
        if len(key) != 16:
            raise ValueError("a flow key is 16 bytes")
        self._flows[bytes(key)] = None
        self._counts.pop(bytes(key), None)  # nothing to hand over

    def forget_flow(self, key: bytes) -> tuple[int, int] | None:
        """Forget the copy of *key*'s entry, or that it is absent; returns the (frames,
        bytes) the entry took (None: absent or not mirrored)."""
        key = bytes(key)
        got = self.flow_counts(key)
        self._flows.pop(key, None)
        self._counts.pop(key, None)
        return got

    def flow_counts(self, key: bytes) -> tuple[int, int] | None:
        """(frames, bytes) *key*'s mirrored entry took (None: absent or not mirrored)."""
        key = bytes(key)
        if self._flows.get(key) is None:
            return None
        got = self._counts.get(key)
        return (got[0], got[1]) if got else (0, 0)

    def all_flow_counts(self) -> list[tuple[bytes, int, int]]:
        """(key, frames, bytes) of every mirrored entry that took frames."""
        return [(k, c[0], c[1]) for k, c in self._counts.items() if c[0]]

    def forget_absent(self) -> None:
        """Forget every absent key (there may be many: any key anyone sent to)."""
        for key in [k for k, f in self._flows.items() if f is None]:
            del self._flows[key]

    def set_route(self, lsid: int, link: int) -> None:
        """Mirror where a frame of an absent flow with this LSID goes: *link*, or
        ``ROUTE_NO_MEMBERS`` / ``ROUTE_NONE`` (dropped, counted as the core counts it)."""
        if not 0 <= lsid < 1 << 32 or link < ROUTE_NONE:
            raise ValueError("an LSID is 32 bits; a route is a link or ROUTE_*")
        self._routes[int(lsid)] = int(link)

    def forget_routes(self) -> None:
        """Forget every route (the core's LS routes or links changed)."""
        self._routes.clear()

    def clear(self) -> None:
        self._flows.clear()
        self._links.clear()
        self._routes.clear()
        self._counts.clear()

    def has_flow(self, key: bytes) -> bool:
        """True if *key*'s entry, or its absence, is mirrored."""
        return bytes(key) in self._flows

    def has_route(self, lsid: int) -> bool:
        return lsid in self._routes

    def has_link(self, link: int) -> bool:
        return link in self._links

    def sizes(self) -> tuple[int, int]:
        """(flows, links) mirrored (absent keys count as flows)."""
        return len(self._flows), len(self._links)

    # ------------------------------------------------------------------ forwarding
    def one_flow(self, buf: bytes | bytearray | memoryview) -> bool:
        """Whether *buf* holds whole frames back to back, every one data (band 32 or
        more) of the first one's flow (an output queue may keep them as one entry)."""
        data = bytes(buf)
        n, pos = len(data), 0
        if n < _HEADER:
            return False
        while pos < n:
            if n - pos < _HEADER or data[pos + 20] < 32 or data[pos:pos + 16] != data[:16]:
                return False
            pos += _HEADER + int.from_bytes(data[pos + 16:pos + 20], "big")
        return pos == n

    def forward(self, link: int, data: bytes | bytearray | memoryview, pos: int,
                fwd_budget: int, drop_budget: int, max_payload: int, ref_min: int = 1 << 62,
                share_min: int = 1 << 62, in_place: bool = False
                ) -> tuple[int, int, list[tuple[int, Any, int]], tuple[int, ...]]:
        data = memoryview(data)
        #: per link, with in_place: [start, end, back to back so far, (header at, lt,
        #: left, ttl) of each frame]
        spans: dict[int, list[Any]] = {}
        several = False  # a frame went to two links, or left its payload by reference
        n = len(data)
        links, flows, routes, flow_counts = self._links, self._flows, self._routes, self._counts
        #: per link: copied frames (bytes), for payloads passed on (header, start, end), and
        #: shared runs (_Shared)
        bufs: dict[int, list[Any]] = {}
        #: the run being gathered: its links, their locality value, its frames, its bytes
        run: list[Any] | None = None
        counts = [0] * _NCOUNTS
        stop = STOP_END
        if link not in links:
            return pos, STOP_MISS_LINK, [], tuple(counts)
        in_router = links[link][0]
        while True:
            if n - pos < _HEADER:
                stop = STOP_END if pos == n else STOP_PARTIAL
                break
            size = int.from_bytes(data[pos + 16:pos + 20], "big")
            band, lt, lv, ttl = data[pos + 20], data[pos + 21], data[pos + 22], data[pos + 23]
            if size > max_payload or band >= _NUM_BANDS or lt >= _NUM_LOCALITY_TYPES:
                stop = STOP_SLOW
                break
            end = pos + _HEADER + size
            if end > n:
                stop = STOP_PARTIAL
                break
            key = bytes(data[pos:pos + 16])
            if (band < _ROUTER_BANDS_END or key[8:12] == b"\0\0\0\0"
                    or (not in_router and _ROUTER_ONLY >> band & 1)):
                stop = STOP_SLOW
                break
            if ttl == 0:
                if counts[7] + 1 >= drop_budget:
                    stop = STOP_SLOW
                    break
                counts[1] += 1
                counts[7] += 1
                counts[8] += 1
                pos = end
                continue
            if key not in flows:
                stop = STOP_MISS_FLOW
                break
            flow = flows[key]
            drop_kind = 0
            targets: list[int] = []
            if flow is None:  # absent: toward the location service
                route = routes.get(int.from_bytes(key[8:12], "big"))
                if route is None:
                    stop = STOP_MISS_ROUTE
                    break
                if route == link:  # from the tree's side: the core answers NOT_ON_TREE
                    stop = STOP_SLOW
                    break
                if route < 0:
                    if counts[7] + 1 >= drop_budget:
                        stop = STOP_SLOW
                        break
                    counts[10 if route == ROUTE_NO_MEMBERS else 11] += 1
                    counts[7] += 1
                    counts[8] += 1
                    pos = end
                    continue
                targets = [route]
            else:
                up, down, agg = flow
                bit = 1 << band
                if link == up:
                    if not agg & bit:
                        drop_kind = 2
                    else:
                        targets = [lk for lk, m in down if m & bit]
                else:
                    targets = [lk for lk, m in down if m & bit and lk != link]
                    if up >= 0:
                        targets.append(up)
                if not drop_kind and not targets:
                    drop_kind = 3
            if drop_kind:
                if counts[7] + 1 >= drop_budget:
                    stop = STOP_SLOW
                    break
                counts[drop_kind] += 1
                counts[7] += 1
                counts[8] += 1
                _count(flow_counts, key, end - pos)
                pos = end
                continue
            if any(t not in links for t in targets):
                stop = STOP_MISS_LINK
                break
            # decide every copy first, so a frame is taken whole or not at all
            out_ttl = ttl - 1
            plan: list[tuple[int, int]] = []  # (target, locality value) sent
            drops = [0, 0, 0]  # ttl, locality, too big
            for t in targets:
                is_router, lk_max, mods = links[t]
                left = 0
                if lt:
                    left = lv - mods[lt]
                    if left < 0:
                        drops[1] += 1
                        continue
                if out_ttl == 0 and is_router:
                    drops[0] += 1
                    continue
                if size > lk_max:
                    drops[2] += 1
                    continue
                plan.append((t, left))
            ndrops = sum(drops)
            if (counts[7] + ndrops >= drop_budget
                    or (plan and counts[6] + 1 >= fwd_budget)):
                stop = STOP_SLOW
                break
            counts[1] += drops[0]
            counts[4] += drops[1]
            counts[5] += drops[2]
            counts[7] += ndrops
            counts[8] += 1
            if flow is None:
                counts[9] += 1
            else:
                _count(flow_counts, key, end - pos)
            if plan:
                counts[6] += 1
                counts[0] += len(plan)
            ref = size >= ref_min
            if len(plan) > 1 or (ref and plan):
                several = True
            elif plan and in_place:
                span = spans.get(plan[0][0])
                if span is None:
                    spans[plan[0][0]] = [pos, end, True, [(pos, lt, plan[0][1], out_ttl)]]
                else:
                    span[2] = span[2] and span[1] == pos
                    span[1] = end
                    span[3].append((pos, lt, plan[0][1], out_ttl))
            payload = b"" if ref else bytes(data[pos + _HEADER:end])
            sends = [t for t, _left in plan]
            if (len(plan) >= 2 and len({left for _t, left in plan}) == 1
                    and len(set(sends)) == len(sends)):  # shareable
                left = plan[0][1]
                one = key + size.to_bytes(4, "big") + bytes((band, lt, left, out_ttl))
                item = (one, pos + _HEADER, end) if ref else one + payload
                if run is not None and run[0] == sends and run[1] == left:
                    run[2].append(item)
                    run[3] += end - pos
                else:
                    _close_run(run, bufs, data, share_min)
                    run = [sends, left, [item], end - pos]
                pos = end
                continue
            if plan:
                _close_run(run, bufs, data, share_min)
                run = None
            headers: dict[int, bytes] = {}
            for t, left in plan:
                hdr = headers.get(left)
                if hdr is None:
                    hdr = headers[left] = (key + size.to_bytes(4, "big")
                                           + bytes((band, lt, left, out_ttl)))
                bufs.setdefault(t, []).append((hdr, pos + _HEADER, end) if ref
                                              else hdr + payload)
            pos = end
        _close_run(run, bufs, data, share_min)
        if in_place and not several and not data.readonly:
            outputs = [(t, _in_place(data, spans[t]) if spans[t][2] else _pieces(data, frames),
                        _frames(frames)) for t, frames in bufs.items()]
        else:
            outputs = [(t, _pieces(data, frames), _frames(frames))
                       for t, frames in bufs.items()]
        return pos, stop, outputs, tuple(counts)


def _in_place(data: memoryview, span: list[Any]) -> memoryview:
    """A link's frames that lie back to back in *data*: their headers rewritten there
    (locality type, value left, TTL: the rest is the input's) and a view of them."""
    for at, lt, left, ttl in span[3]:
        data[at + 21:at + 24] = bytes((lt, left, ttl))
    return data[span[0]:span[1]]


def _count(flow_counts: dict[bytes, list[int]], key: bytes, size: int) -> None:
    """One frame of *size* bytes more for the entry of *key*."""
    got = flow_counts.get(key)
    if got is None:
        flow_counts[key] = [1, size]
    else:
        got[0] += 1
        got[1] += size


class _Shared:
    """A shared run in a link's list of frames: its output (bytes or a list of buffers)
    and how many frames it holds."""

    __slots__ = ("out", "frames")

    def __init__(self, out: Any, frames: int) -> None:
        self.out = out
        self.frames = frames


def _close_run(run: list[Any] | None, bufs: dict[int, list[Any]], data: memoryview,
               share_min: int) -> None:
    """End the run being gathered: shared by its links if it is large enough, else its
    frames copied to each of them."""
    if run is None:
        return
    sends, _left, items, size = run
    if size >= share_min:
        shared = _Shared(_pieces(data, items), len(items))
        for t in sends:
            bufs.setdefault(t, []).append(shared)
        return
    for item in items:
        for t in sends:
            bufs.setdefault(t, []).append(item)


def _frames(frames: list[Any]) -> int:
    """Frames in a link's list (a shared run counts all of its own)."""
    return sum(f.frames if type(f) is _Shared else 1 for f in frames)


def _pieces(data: memoryview, frames: list[Any]) -> Any:
    """One link's output: bytes, or the list of buffers described in the module docstring."""
    if all(type(f) is bytes for f in frames):
        return b"".join(frames)
    if len(frames) == 1 and type(frames[0]) is _Shared and type(frames[0].out) is bytes:
        return frames[0].out
    pieces: list[Any] = []
    run = bytearray()
    for f in frames:
        if type(f) is bytes:
            run += f
            continue
        if type(f) is _Shared:
            if run:
                pieces.append(bytes(run))
                run = bytearray()
            if type(f.out) is bytes:
                pieces.append(f.out)
            else:
                pieces += f.out
            continue
        hdr, start, end = f
        run += hdr
        pieces.append(bytes(run))
        pieces.append(data[start:end])
        run = bytearray()
    if run:
        pieces.append(bytes(run))
    return pieces
