"""Steady-state upkeep of idle flows under the seed's per-(flow, link) PING GC, as it was
before soft state (issue 14): kept so the "before" row of BENCHMARKS.md can be reproduced.

Run it from a checkout of the last commit before soft state (47e2c6e), e.g.::

    git worktree add --detach /tmp/before 47e2c6e && cd /tmp/before
    python3 /path/to/upkeep_before_softstate.py 10000 100000 1000000

Set-up as ``benchmarks/flowtable.py`` (a transit router, one upstream router link, one
application link, every flow installed with the same fields). The application answers every
PING with a PONG through ``Router.receive``; ``Router.tick`` runs every 0.25 s for 9 epochs of
5 s. Steady state is measured over epochs 3..8: two ping rounds in six epochs, the long-run
rate of one PING per flow every T1 = 3 epochs. CPU is ``time.thread_time`` of the router's
calls; frames are counted per link and direction.
"""

import json
import sys
import time

sys.path.insert(0, "benchmarks")
import flowtable as F  # noqa: E402

from flowrouter.core.router import Send  # noqa: E402
from flowrouter.wire import control as C  # noqa: E402
from flowrouter.wire.bands import BAND_GC  # noqa: E402
from flowrouter.wire.header import pack_header  # noqa: E402


def run(n: int) -> dict[str, float]:
    r = F.make_router(n)
    F.build_direct(r, n)
    r._gc_last = 0.0
    frames = {"ep_out": 0, "ep_in": 0, "up_out": 0}
    t, span, start = 0.0, 9 * r.p.epoch_length, 3 * r.p.epoch_length
    cpu = 0.0
    while t < span:
        t = round(t + F.TICK, 9)
        t0 = time.thread_time()
        out = r.tick(t)
        dt = time.thread_time() - t0
        pongs = []
        for a in out:
            if type(a) is Send and a.link == F.EP:
                msg = C.decode(a.payload)
                if isinstance(msg, C.Ping):
                    pongs.append((bytes(a.header[:16]), C.Pong(msg.epoch).encode()))
        t1 = time.thread_time()
        up = 0
        for key, body in pongs:
            up += sum(1 for b in r.receive(F.EP, pack_header(key, len(body), BAND_GC), body, t)
                      if type(b) is Send and b.link == F.UP)
        dt += time.thread_time() - t1
        if t > start:
            cpu += dt
            frames["ep_out"] += sum(1 for a in out if type(a) is Send and a.link == F.EP)
            frames["ep_in"] += len(pongs)
            frames["up_out"] += up
    w = span - start
    return {"flows": n, "cpu_share": cpu / w, **{k + "_per_s": v / w for k, v in frames.items()},
            "left": len(r.flows)}


if __name__ == "__main__":
    print(json.dumps([run(int(a)) for a in sys.argv[1:]]))
