"""Shared by the IGO tests (test_igo.py, test_igo_faults.py): three sites, a chatter that
keeps them talking on a LoopNet, and the check that every site delivered everything."""

from __future__ import annotations

import random

from flowchat import checks
from flowchat.loopnet import LoopNet

ABC = ("a", "b", "c")


def chatter(net: LoopNet, senders, start: float = 1.0, stop: float = 1e9, seed: int = 7,
            mean_gap: float = 0.5) -> None:
    """Each sender submits with gaps uniform in [0, 2*mean_gap] from *start* until *stop*."""
    rng = random.Random(seed)

    def bot(s: str) -> None:
        if net.now >= stop:
            return
        net.submit(s)
        net.at(net.now + rng.uniform(0, 2 * mean_gap), bot, s)

    for s in senders:
        net.at(start + rng.uniform(0, mean_gap), bot, s)


def sent_counts(net: LoopNet) -> dict[str, int]:
    return {s: o.seq for s, o in net.sites.items()}


def assert_complete(net: LoopNet, sites=None) -> None:
    """Every site delivered every message of every origin exactly once."""
    sent = sent_counts(net)
    for s in sites or net.sites:
        for o, n in sent.items():
            assert checks.gaps(net.log[s], o, n) == [], f"{s} misses messages of {o}"
    assert checks.fifo_violations(net.log) == []
