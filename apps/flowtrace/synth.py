"""Synthetic but plausible router traces (schema v1) for scale tests of the flowtrace job.

A discrete-event model of the core-based shared trees, not the real router (which would be
far too slow for thousands of routers and 10^5 flows in one Python process):

* **topology** — ``cores`` core routers in a full mesh (core ``c`` is the core of LSID
  ``0x10 + c``); every other router hangs off a uniformly chosen earlier router (a random
  recursive tree, depth ~ ln N), so the path from a router to a core climbs to its own root
  core and, for a flow of another LSID, crosses the mesh. Routers without children are
  **edge** routers with ``hosts`` endpoint links each.
* **flows** — arrivals grow over the run (density ∝ t, so table size grows and the fit has
  something to fit); lifetimes are a mix of short (mean 45 s) and long (mean 600 s) flows;
  member counts are 1 + exponential (mean ``members``), capped at 200; each flow uses 1, 2 or
  4 data bands and each member subscribes to a subset; ``receivers`` of the members only
  listen. Members join near the flow's start and leave at its end or earlier; a share
  ``silent`` of them vanish without a leave, so the edge router pings them after T1 idle
  epochs and collects the link after T2 (``link_del`` cause ``gc`` with ``last``), and the
  removal cascades upstream as leaves.
* **tables** — exact per router: ``entry_add`` / ``link_add`` (join and mask changes) along the
  join path until the first on-tree router (masks propagate further while the aggregate
  changes), ``link_del`` / ``entry_del`` on the way back; periodic ``snapshot`` records are
  computed from the same state, so replaying the events reproduces the snapshots.
* **traffic** — senders emit ``rate`` messages/s each (sizes from seed 000: 70 % one 1000-byte
  fragment, 20 % 2–30, 10 % 31–100); every router of the tree makes one decision per message.
  Sampling 1-in-N is modelled as Bernoulli thinning (Poisson counts per constant-state
  segment), giving ``fwd`` records and ``drop`` records (``band-filtered`` when the band is
  not in the downstream aggregate, ``locality`` for 2 % of messages, ``no-receivers``).

Records are sharded over ``shards`` files (``synth-<k>.jsonl``) by router; order within a
file is not by time (the job does not need it). Deterministic for a given seed. The command
line (sizes, progress, the size guard) is in :mod:`flowtrace.synth_cli`.
Imports only the standard library and :mod:`flowrouter.core.traces`.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from flowrouter.core.traces import ENTRY_BYTES, LINK_BYTES

HOST_LINK_BASE = 1000  #: endpoint link ids at an edge router are HOST_LINK_BASE + host
CTRL_MASK = 1 | (0xFFFF << 16)  #: membership band 0 and the admin bands 16..31
DATA_BAND = 32
HOP_DELAY = 0.0  #: seconds a leave takes per hop (0: snapshots match replay exactly)


@dataclass
class SynthConfig:
    routers: int = 1000
    flows: int = 100_000
    duration: float = 3600.0
    seed: int = 1
    sample_rate: float = 0.01
    epoch: float = 5.0
    gc_ping_after: int = 3
    gc_delete_after: int = 6
    snapshot_interval: float = 30.0
    cores: int = 0  #: 0: max(1, routers // 100)
    hosts: int = 16
    members: float = 4.0
    silent: float = 0.25
    receivers: float = 0.2
    rate: float = 0.2
    shards: int = 16
    run: str | None = None
    out: str = "synth-traces"


class _Entry:
    __slots__ = ("up", "down", "agg", "seg", "below")

    def __init__(self, up: int | None, t: float) -> None:
        self.up = up
        self.down: dict[int, int] = {}
        self.agg = 0
        self.seg = t
        self.below = 0


class _Member:
    __slots__ = ("edge", "host", "mask", "sender", "path", "join", "live")

    def __init__(self, edge: int, host: int, mask: int, sender: bool, path: list[int]) -> None:
        self.edge, self.host, self.mask, self.sender, self.path = edge, host, mask, sender, path
        self.join = 0.0
        self.live = False


class _Flow:
    __slots__ = ("text", "core", "bands", "rate", "members", "entries", "senders", "live")

    def __init__(self, text: str, core: int, bands: list[int], rate: float) -> None:
        self.text, self.core, self.bands, self.rate = text, core, bands, rate
        self.members: list[_Member] = []
        self.entries: dict[int, _Entry] = {}
        self.senders = 0
        self.live = 0


class _Out:
    """Sharded, buffered line output."""

    def __init__(self, out_dir: str, shards: int) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.paths = [os.path.join(out_dir, f"synth-{k:03d}.jsonl") for k in range(shards)]
        self.fhs = [open(p, "w", encoding="utf-8") for p in self.paths]  # noqa: SIM115
        self.bufs: list[list[str]] = [[] for _ in range(shards)]
        self.n = 0
        self.bytes = 0

    def put(self, shard: int, line: str) -> None:
        buf = self.bufs[shard]
        buf.append(line)
        self.n += 1
        self.bytes += len(line)
        if len(buf) >= 4096:
            self.fhs[shard].writelines(buf)
            buf.clear()

    def close(self) -> int:
        size = 0
        for fh, buf in zip(self.fhs, self.bufs):
            fh.writelines(buf)
            buf.clear()
            size += fh.tell()
            fh.close()
        return size


class Synth:
    """One synthetic network run; :meth:`run` writes the traces and returns statistics."""

    def __init__(self, cfg: SynthConfig) -> None:
        if cfg.routers < 2 or cfg.flows < 1:
            raise ValueError("need at least 2 routers and 1 flow")
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.every = max(1, round(1 / cfg.sample_rate)) if cfg.sample_rate > 0 else 0
        self.counts: dict[str, int] = {}
        self._build_topology()

    # ------------------------------------------------------------------ topology
    def _build_topology(self) -> None:
        cfg, rng = self.cfg, self.rng
        n = cfg.routers
        c = cfg.cores or max(1, n // 100)
        c = min(c, n - 1) if n > 1 else 1
        self.n_cores = c
        self.parent = [-1] * n
        self.root = list(range(n))
        self.links: list[dict[int, int]] = [dict() for _ in range(n)]  # neighbour -> link id
        self.nbr: list[dict[int, int]] = [dict() for _ in range(n)]  # link id -> neighbour

        def connect(a: int, b: int) -> None:
            la, lb = len(self.links[a]), len(self.links[b])
            self.links[a][b] = la
            self.nbr[a][la] = b
            self.links[b][a] = lb
            self.nbr[b][lb] = a

        for a in range(c):
            for b in range(a + 1, c):
                connect(a, b)
        children = [0] * n
        for i in range(c, n):
            p = rng.randrange(i)
            self.parent[i] = p
            self.root[i] = self.root[p]
            children[p] += 1
            connect(i, p)
        self.edges = [i for i in range(c, n) if children[i] == 0]
        self.is_edge = [False] * n
        for e in self.edges:
            self.is_edge[e] = True
        self.names = [f"r{i:04d}" for i in range(n)]
        run = f',"run":{json.dumps(cfg.run)}' if cfg.run else ""
        self.prefix = [f',"router":"{nm}"{run},"kind":' for nm in self.names]
        self.shard = [i % cfg.shards for i in range(n)]
        # snapshot state per router
        self.n_entries = [0] * n
        self.n_links = [0] * n
        self.n_members = [0] * n
        self.n_active = [0] * n
        self.fanout: list[dict[int, int]] = [dict() for _ in range(n)]
        self._paths: dict[tuple[int, int], list[int]] = {}

    def path(self, edge: int, core: int) -> list[int]:
        key = (edge, core)
        p = self._paths.get(key)
        if p is None:
            p = [edge]
            r = edge
            while self.parent[r] >= 0:
                r = self.parent[r]
                p.append(r)
            if r != core:
                p.append(core)
            if len(self._paths) < 2_000_000:
                self._paths[key] = p
        return p

    # ------------------------------------------------------------------ output
    def emit(self, r: int, t: float, kind: str, body: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.out.put(self.shard[r], f'{{"v":1,"t":{t:.4f}{self.prefix[r]}"{kind}"{body}}}\n')

    def _fan(self, r: int, old: int | None, new: int | None) -> None:
        f = self.fanout[r]
        if old is not None:
            f[old] -= 1
        if new is not None:
            f[new] = f.get(new, 0) + 1

    # ------------------------------------------------------------------ traffic
    def _poisson(self, lam: float) -> int:
        if lam <= 0:
            return 0
        if lam > 30:
            return max(0, int(self.rng.gauss(lam, math.sqrt(lam)) + 0.5))
        limit, k, p = math.exp(-lam), 0, self.rng.random()
        while p > limit:
            k += 1
            p *= self.rng.random()
        return k

    def _size(self) -> int:
        u = self.rng.random()
        if u < 0.7:
            return self.rng.randint(64, 1000)
        if u < 0.9:
            return 1000 * self.rng.randint(2, 30)
        return 1000 * self.rng.randint(31, 100)

    def flush(self, f: _Flow, r: int, e: _Entry, t: float) -> None:
        """Sampled forwarding decisions of router r for flow f over [e.seg, t)."""
        dt = t - e.seg
        e.seg = t
        if not self.every or dt <= 0 or not f.senders:
            return
        k = self._poisson(f.senders * f.rate * dt / self.every)
        if not k:
            return
        rng = self.rng
        p_up = 0.0 if e.up is None else (f.senders - e.below) / f.senders
        downs = list(e.down.items())
        for _ in range(k):
            ts = t - dt * rng.random()
            band = rng.choice(f.bands)
            bit = 1 << band
            nbytes = self._size()
            if downs and rng.random() >= p_up:
                in_link = rng.choice(downs)[0]
                outs = sum(1 for lk, m in downs if lk != in_link and m & bit)
                if e.up is not None:
                    outs += 1
            else:
                in_link = e.up if e.up is not None else 0
                if not e.agg & bit:
                    self.emit(r, ts, "drop", f',"flow":"{f.text}","band":{band},'
                              f'"in_link":{in_link},"reason":"band-filtered","bytes":{nbytes},'
                              f'"sample":{self.every},"links":{len(downs)}')
                    continue
                outs = sum(1 for _, m in downs if m & bit)
            if outs and rng.random() < 0.02:
                self.emit(r, ts, "drop", f',"flow":"{f.text}","band":{band},'
                          f'"in_link":{in_link},"reason":"locality","bytes":{nbytes},'
                          f'"sample":{self.every}')
                continue
            if not outs:
                self.emit(r, ts, "drop", f',"flow":"{f.text}","band":{band},'
                          f'"in_link":{in_link},"reason":"no-receivers","bytes":{nbytes},'
                          f'"sample":{self.every}')
                continue
            self.emit(r, ts, "fwd", f',"flow":"{f.text}","band":{band},"in_link":{in_link},'
                      f'"out_links":{outs},"bytes":{nbytes},"sample":{self.every}')

    def flush_flow(self, f: _Flow, t: float) -> None:
        for r, e in f.entries.items():
            self.flush(f, r, e, t)

    # ------------------------------------------------------------------ membership
    def _set_live(self, f: _Flow, delta: int) -> None:
        before = f.live > 0
        f.live += delta
        after = f.live > 0
        if before != after:
            d = 1 if after else -1
            for r in f.entries:
                self.n_active[r] += d

    def join(self, f: _Flow, m: _Member, t: float) -> None:
        self.flush_flow(f, t)
        m.join, m.live = t, True
        self._set_live(f, 1)
        if m.sender:
            f.senders += 1
        path = m.path
        link_in = HOST_LINK_BASE + m.host
        mask_in = m.mask
        for i, r in enumerate(path):
            e = f.entries.get(r)
            new_entry = e is None
            if e is None:
                up = self.links[r][path[i + 1]] if i + 1 < len(path) else None
                e = f.entries[r] = _Entry(up, t)
                self.n_entries[r] += 1
                self._fan(r, None, 0)
                if f.live:
                    self.n_active[r] += 1
                self.emit(r, t, "entry_add", f',"flow":"{f.text}","upstream":'
                          f'{"null" if up is None else up}')
            if m.sender:
                e.below += 1
            old = e.down.get(link_in)
            role = "endpoint" if i == 0 else "router"
            if old is None:
                n = len(e.down)
                e.down[link_in] = mask_in
                self._fan(r, n, n + 1)
                self.n_links[r] += 1
                if i == 0:
                    self.n_members[r] += 1
                self.emit(r, t, "link_add", f',"flow":"{f.text}","link":{link_in},'
                          f'"mask":"{mask_in:x}","cause":"join","role":"{role}"')
            elif old | mask_in != old:
                e.down[link_in] = old | mask_in
                self.emit(r, t, "link_add", f',"flow":"{f.text}","link":{link_in},'
                          f'"mask":"{old | mask_in:x}","cause":"mask","role":"{role}"')
            agg = e.agg | mask_in
            changed = agg != e.agg
            e.agg = agg
            if i + 1 < len(path):
                link_in = self.links[path[i + 1]][r]
                mask_in = agg
            if not new_entry and not changed:
                # on-tree and nothing new to push: only the sender counts go further up
                if m.sender:
                    for r2 in path[i + 1:]:
                        f.entries[r2].below += 1
                break

    def depart(self, f: _Flow, m: _Member, t: float, silent: bool) -> None:
        """Member stops; a leave removes its link now, a silent one is left to the GC."""
        self.flush_flow(f, t)
        m.live = False
        self._set_live(f, -1)
        if m.sender:
            f.senders -= 1
            for r in m.path:
                e = f.entries.get(r)
                if e is not None:
                    e.below -= 1
        if not m.sender:  # keep-alive pings answered while it was there
            cfg = self.cfg
            period = (cfg.gc_ping_after + 1) * cfg.epoch
            tp = m.join + period
            link = HOST_LINK_BASE + m.host
            while tp < t:
                self.emit(m.edge, tp, "gc_ping", f',"flow":"{f.text}","link":{link},'
                          f'"epoch":{int(tp / cfg.epoch)}')
                tp += period
        if not silent:
            self.remove(f, m, t, "leave", None)
            return
        cfg = self.cfg
        last_epoch = int(t / cfg.epoch)
        phase = (zlib.crc32(f"{m.edge}/{f.text}".encode()) % 1000) / 1000 * cfg.epoch
        link = HOST_LINK_BASE + m.host
        for k in range(cfg.gc_ping_after, cfg.gc_delete_after):
            tp = (last_epoch + k) * cfg.epoch + phase
            if tp > t:
                self.emit(m.edge, tp, "gc_ping", f',"flow":"{f.text}","link":{link},'
                          f'"epoch":{last_epoch + k}')
        t_del = (last_epoch + cfg.gc_delete_after) * cfg.epoch + phase
        self.push(t_del, 3, (f, m, last_epoch * cfg.epoch))

    def remove(self, f: _Flow, m: _Member, t: float, cause: str, last: float | None) -> None:
        self.flush_flow(f, t)
        path = m.path
        link = HOST_LINK_BASE + m.host
        for i, r in enumerate(path):
            e = f.entries[r]
            mask = e.down.pop(link)
            n = len(e.down)
            self._fan(r, n + 1, n)
            self.n_links[r] -= 1
            role = "endpoint" if i == 0 else "router"
            if i == 0:
                self.n_members[r] -= 1
            extra = f',"last":{last:.4f}' if last is not None else ""
            self.emit(r, t, "link_del", f',"flow":"{f.text}","link":{link},"mask":"{mask:x}",'
                      f'"cause":"{cause}"{extra},"role":"{role}"')
            if not e.down:
                self.emit(r, t, "entry_del", f',"flow":"{f.text}","cause":"{cause}"')
                del f.entries[r]
                self.n_entries[r] -= 1
                self._fan(r, 0, None)
                if f.live:
                    self.n_active[r] -= 1
                if e.up is None:
                    return
                link = self.links[path[i + 1]][r]
                t += HOP_DELAY
                cause, last = "leave", None
                continue
            agg = 0
            for mk in e.down.values():
                agg |= mk
            if agg == e.agg:
                return
            e.agg = agg
            # narrower aggregate: update the mask upstream, hop by hop while it changes
            for j in range(i + 1, len(path)):
                p = path[j]
                pe = f.entries[p]
                lk = self.links[p][path[j - 1]]
                pe.down[lk] = agg
                self.emit(p, t, "link_add", f',"flow":"{f.text}","link":{lk},"mask":"{agg:x}",'
                          '"cause":"mask","role":"router"')
                new = 0
                for mk in pe.down.values():
                    new |= mk
                if new == pe.agg:
                    return
                pe.agg = agg = new
            return

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, r: int, t: float) -> None:
        fan = ",".join(f'"{k}":{v}' for k, v in sorted(self.fanout[r].items()) if v)
        core = r < self.n_cores
        lsids = f"[{0x10 + r}]" if core else "[]"
        ent, lt = self.n_entries[r], self.n_links[r]
        self.emit(r, t, "snapshot",
                  f',"entries":{ent},"links_total":{lt},"active_flows":{self.n_active[r]},'
                  f'"mem_bytes":{ent * ENTRY_BYTES + lt * LINK_BYTES},'
                  f'"core":{"true" if core else "false"},"fanout":{{{fan}}},'
                  f'"edge":{"true" if self.is_edge[r] else "false"},'
                  f'"members":{self.n_members[r]},"lsids":{lsids},'
                  f'"epoch":{int(t / self.cfg.epoch)}')

    # ------------------------------------------------------------------ the run
    def push(self, t: float, kind: int, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, data))

    def _make_flows(self) -> None:
        cfg, rng = self.cfg, self.rng
        hosts = cfg.hosts
        self.flows: list[_Flow] = []
        for i in range(cfg.flows):
            start = cfg.duration * 0.9 * math.sqrt(rng.random())
            life = rng.expovariate(1 / 45) if rng.random() < 0.55 else rng.expovariate(1 / 600)
            end = min(cfg.duration, start + max(1.0, life))
            core = rng.randrange(self.n_cores)
            nb = rng.choices((1, 2, 4), (0.6, 0.25, 0.15))[0]
            bands = list(range(DATA_BAND, DATA_BAND + nb))
            creator = 0xF0000000 + rng.randrange(len(self.edges) * hosts)
            text = f"{creator:016x}:{0x10 + core:08x}:{i + 1:08x}"
            f = _Flow(text, core, bands, cfg.rate * rng.lognormvariate(0, 0.5) / 1.13)
            self.flows.append(f)
            nm = 1 + min(199, int(rng.expovariate(1 / max(cfg.members - 1, 0.01))))
            seen: set[tuple[int, int]] = set()
            for j in range(nm):
                edge = rng.choice(self.edges)
                host = rng.randrange(hosts)
                if (edge, host) in seen:
                    continue
                seen.add((edge, host))
                sub = [b for b in bands if rng.random() < 0.6] or [rng.choice(bands)]
                mask = CTRL_MASK
                for b in sub:
                    mask |= 1 << b
                sender = j == 0 or rng.random() >= cfg.receivers
                m = _Member(edge, host, mask, sender, self.path(edge, core))
                f.members.append(m)
                t_join = start + (0 if j == 0 else rng.expovariate(1 / 5))
                if t_join >= end:
                    continue
                t_dep = end if rng.random() < 0.7 else rng.uniform(t_join, end)
                self.push(t_join, 1, (f, m))
                self.push(max(t_dep, t_join + 0.001), 2, (f, m, rng.random() < cfg.silent))

    def run(self, progress: Callable[[float, int, int], None] | None = None
            ) -> dict[str, Any]:
        """Simulate and write; *progress* gets (fraction of simulated time done, records,
        bytes) now and then."""
        cfg = self.cfg
        t0 = time.monotonic()
        self.out = _Out(cfg.out, cfg.shards)
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        for r in range(cfg.routers):
            for nb, lk in sorted(self.links[r].items(), key=lambda kv: kv[1]):
                self.emit(r, 0.0, "link_up", f',"link":{lk},"peer":"{self.names[nb]}",'
                          '"role":"router"')
            if self.is_edge[r]:
                for h in range(cfg.hosts):
                    self.emit(r, 0.0, "link_up", f',"link":{HOST_LINK_BASE + h},'
                              f'"peer":"host-{r}-{h}","role":"endpoint"')
            self.push(cfg.snapshot_interval * self.rng.random(), 0, r)
        self._make_flows()
        heap = self.heap
        horizon = cfg.duration + cfg.epoch * (cfg.gc_delete_after + 2)
        pops = 0
        while heap:
            t, kind, _, data = heapq.heappop(heap)
            if t > horizon:
                break
            pops += 1
            if progress is not None and not pops & 0xFFFF:
                progress(min(1.0, t / horizon), self.out.n, self.out.bytes)
            if kind == 0:
                self.snapshot(data, t)
                if t + cfg.snapshot_interval <= horizon:
                    self.push(t + cfg.snapshot_interval, 0, data)
            elif kind == 1:
                self.join(*data, t)  # type: ignore[call-arg]
            elif kind == 2:
                f, m, silent = data
                if m.live:
                    self.depart(f, m, t, silent)
            else:
                f, m, last = data
                self.remove(f, m, t, "gc", last)
        end = min(horizon, cfg.duration)
        for f in self.flows:  # the traffic still owed by entries alive at the end
            if f.entries:
                self.flush_flow(f, max(end, max(e.seg for e in f.entries.values())))
        size = self.out.close()
        wall = time.monotonic() - t0
        return {"config": asdict(cfg), "records": self.out.n, "bytes": size,
                "files": len(self.out.paths), "records_by_kind": dict(sorted(
                    self.counts.items())), "edges": len(self.edges), "cores": self.n_cores,
                "wall_seconds": round(wall, 2),
                "records_per_second": round(self.out.n / wall) if wall else None,
                "duration": end}


def generate(cfg: SynthConfig, progress: Callable[[float, int, int], None] | None = None
             ) -> dict[str, Any]:
    """Write the traces of one run under ``cfg.out``; returns statistics."""
    return Synth(cfg).run(progress)
