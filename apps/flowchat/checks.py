"""Checks of seed 003's ordering properties (section 4.3.6) on delivery logs.

Each function takes per-site lists of :class:`~flowchat.igo.Delivery` (or anything with the
same attributes) and returns a list of human-readable violations (empty = property holds), so
tests can ``assert not violations`` and the experiment summary can count them.

* :func:`fifo_violations` — every site delivers each origin's messages in sequence order, at
  most once (per incarnation of the origin, when deliveries carry one);
* :func:`order_violations` — the messages a site delivered *in order* (not flagged late) follow
  the ordering rule: increasing ``(lamport, origin)`` in the all-to-all modes, increasing leader
  order number in leader mode; so any two sites agree on the relative order of the in-order
  messages they both delivered (global order while connected, the same order at every site of
  a partition);
* :func:`agreement_violations` — two sites' delivery sequences restricted to the messages both
  delivered (optionally only those both delivered in order) are identical;
* :func:`causal_violations` — if a site delivered *m1* before it sent *m2*, no site delivers
  *m2* before *m1* (causal order, always);
* :func:`late_disagreement` — of the messages two sites both delivered *late*, how many stand
  at a different place in the two sites' late sequences (zero: the same late order);
* :func:`late_splits` — messages two sites both delivered, in order at one and late at the
  other (none between sites that stay connected, with agreed views: see :data:`PROPERTIES`);
* :func:`gaps` — sequence numbers of an origin a site never delivered;
* :func:`view_disagreements` — views (agreed, numbered: :mod:`flowchat.igo.views`) a site
  installed naming a peer as a member, which that peer never installed (zero: connected
  sites go through the same views);
* :func:`view_delivery_violations` — two sites that moved from one view to the next
  together (each in the other's transitional set) but showed different messages in order
  in the first, or in a different order (zero: Extended Virtual Synchrony's agreement).

:data:`PROPERTIES` states what holds in which mode; the experiment summary prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Key = tuple[str, int]


def _key(d: Any) -> Key:
    return (d.origin, d.seq)


def fifo_violations(logs: Mapping[str, Sequence[Any]]) -> list[str]:
    """Per stream: an origin's run (``incarnation``, if the records carry one: a restarted
    site numbers its messages from 1 again)."""
    out = []
    for site, log in logs.items():
        last: dict[tuple[str, int], int] = {}
        seen: set[tuple[str, int, int]] = set()
        for d in log:
            run = (d.origin, getattr(d, "incarnation", 0))
            k = (*run, d.seq)
            if k in seen:
                out.append(f"{site}: {d.origin}#{d.seq} delivered twice")
                continue
            seen.add(k)
            if d.seq <= last.get(run, 0) and not d.late:
                out.append(f"{site}: {d.origin}#{d.seq} after #{last[run]}")
            last[run] = max(last.get(run, 0), d.seq)
    return out


def order_violations(logs: Mapping[str, Sequence[Any]], sites: Sequence[str],
                     leader: bool = False, epochs: Sequence[float] = ()) -> list[str]:
    """*epochs*: times a restarted leader began a new order stream (numbers from 1 again):
    the order numbers of deliveries from then on are a new sequence."""
    idx = {s: i for i, s in enumerate(sorted(sites))}
    out = []
    for site, log in logs.items():
        prev: Any = None
        pending = sorted(epochs)
        for d in log:
            while pending and d.delivery_time >= pending[0]:
                pending.pop(0)
                prev = None
            if d.late or getattr(d, "local", False):
                continue
            key = d.gseq if leader else (d.lamport, idx[d.origin])
            if key is None:
                continue
            if prev is not None and key <= prev:
                out.append(f"{site}: {d.origin}#{d.seq} key {key} not after {prev}")
            prev = key
    return out


def agreement_violations(a: Sequence[Any], b: Sequence[Any], *, in_order_only: bool = True,
                         names: tuple[str, str] = ("a", "b")) -> list[str]:
    def seq(log: Sequence[Any]) -> list[Key]:
        return [_key(d) for d in log
                if not (in_order_only and (d.late or getattr(d, "local", False)))]

    sa, sb = seq(a), seq(b)
    common = set(sa) & set(sb)
    ca = [k for k in sa if k in common]
    cb = [k for k in sb if k in common]
    if ca == cb:
        return []
    i = next(i for i, (x, y) in enumerate(zip(ca, cb)) if x != y)
    return [f"{names[0]} and {names[1]} disagree at common message {i}: {ca[i]} vs {cb[i]}"]


def late_disagreement(a: Sequence[Any], b: Sequence[Any]) -> tuple[int, int]:
    """``(common, disagreeing)``: the messages both *a* and *b* delivered flagged late, and
    how many of them sit at a different position in the two late sequences restricted to
    those common messages."""
    la = [_key(d) for d in a if d.late]
    lb = [_key(d) for d in b if d.late]
    common = set(la) & set(lb)
    ca = [k for k in la if k in common]
    cb = [k for k in lb if k in common]
    return len(common), sum(1 for x, y in zip(ca, cb) if x != y)


def late_splits(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many messages both *a* and *b* delivered, in order at one and flagged late at
    the other. With agreed views sites that stay connected agree on it; without them (leader
    mode's local chat, ``--stability``) each site decides alone when a peer leaves its
    ordering set, and two sites of one side may split a message this way around a partition
    or a merge."""
    la = {_key(d): bool(d.late) for d in a if not getattr(d, "local", False)}
    return sum(1 for d in b if not getattr(d, "local", False) and _key(d) in la
               and la[_key(d)] != bool(d.late))


#: what the checks establish, stated for the summary (all-to-all modes: agreed views, the
#: Extended Virtual Synchrony shape; leader mode: the leader's view)
PROPERTIES = (
    "FIFO per origin run, and causal order, at every site, always (late messages included).",
    "Messages a site shows in order follow one rule (views in their order, then Lamport "
    "order, or the leader's numbers), so any two sites agree on the relative order of the "
    "messages both show in order.",
    "All-to-all modes (hasten and delay): membership is an agreed, numbered view; sites "
    "that move from one view to the next together (the transitional notice names them) "
    "showed the same messages in order in it, in the same order (view agreement checks), "
    "and a message is late at one of them exactly when it is late at the others, so "
    "connected sites show no in-order/late splits. A site that leaves or joins a view "
    "during a change, or links without transitive connectivity (views keep changing, "
    "backing off), can still split; the checks count it.",
    "Sites on one side of a partition agree on the relative order of the messages both show "
    "late (one late order per partition).",
    "Delay-delivery (all-to-all) with short outages gives one global order of everything. "
    "Leader mode gives one order per leader view among the sites connected to the leader "
    "(no agreed views: a site cut from the leader chats locally).",
)


def view_disagreements(views: Mapping[str, Sequence[Any]],
                       groups: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """*views*: per site the :class:`~flowchat.igo.ViewInstalled` events it emitted (or
    anything with ``view`` and ``members``). A view a site installed that names a peer
    (of its side, if *groups* says which sites are connected) which never installed it."""
    had = {s: {v.view for v in evs} for s, evs in views.items()}
    out = []
    for site, evs in views.items():
        for v in evs:
            for peer in v.members:
                if peer == site or peer not in had:
                    continue
                if groups is not None and peer not in set(groups.get(site, ())):
                    continue
                if v.view not in had[peer]:
                    out.append(f"{site} installed view {v.number} with {peer}, "
                               f"which never installed it")
    return out


def view_delivery_violations(logs: Mapping[str, Sequence[Any]],
                             views: Mapping[str, Sequence[Any]]) -> list[str]:
    """Per pair of sites and view they both left for the same next view with each other in
    its transitional set: the messages shown in order in the view (``Delivery.view``) must
    be the same, in the same order."""
    nxt: dict[str, dict[int, Any]] = {}
    for site, evs in views.items():
        nxt[site] = {v.previous: v for v in evs}
    shown: dict[str, dict[int, list[Key]]] = {}
    for site, log in logs.items():
        per: dict[int, list[Key]] = {}
        for d in log:
            if not d.late and not getattr(d, "local", False):
                per.setdefault(getattr(d, "view", 0), []).append(_key(d))
        shown[site] = per
    out = []
    names = [s for s in logs if s in nxt]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for vid, va in nxt[a].items():
                vb = nxt[b].get(vid)
                if vb is None or va.view != vb.view or b not in va.transitional \
                        or a not in vb.transitional:
                    continue
                sa, sb = shown[a].get(vid, []), shown[b].get(vid, [])
                if sa != sb:
                    diff = len(set(sa) ^ set(sb))
                    out.append(f"{a} and {b} moved from view {vid >> 8} to {va.number} "
                               f"together but showed {len(sa)} and {len(sb)} messages in "
                               f"order in it ({diff} not in both"
                               f"{', or in another order' if not diff else ''})")
    return out


def causal_violations(logs: Mapping[str, Sequence[Any]],
                      sent_after: Mapping[Key, Iterable[Key]]) -> list[str]:
    """*sent_after* maps a message to the messages its sender had delivered before sending
    it (its causal past, one hop; FIFO and transitivity are covered by checking every
    message)."""
    out = []
    for site, log in logs.items():
        pos = {_key(d): i for i, d in enumerate(log)}
        for m, past in sent_after.items():
            pm = pos.get(m)
            if pm is None:
                continue
            for p in past:
                pp = pos.get(p)
                if pp is not None and pp > pm:
                    out.append(f"{site}: {m[0]}#{m[1]} delivered before its cause "
                               f"{p[0]}#{p[1]}")
    return out


def gaps(log: Sequence[Any], origin: str, sent: int) -> list[int]:
    """Sequence numbers 1..*sent* of *origin* that *log* never delivered."""
    got = {d.seq for d in log if d.origin == origin}
    return [s for s in range(1, sent + 1) if s not in got]
