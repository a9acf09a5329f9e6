"""Flow control between a router's inputs and outputs: which input stops reading, and when.

Two mechanisms, both ending in a TCP input that stops reading so that TCP pushes back on the
sender causing the load (a UDP socket serves every peer and is never paused):

* **Holding** (:func:`hold`, :func:`release`, :func:`check_holds`): when an output's socket
  pushes back while it writes an input's read, and every output that got frames of that
  read has pushed back too (a chain, a lone receiver, receivers all behind together), the
  input stops reading at once. Its frames
  wait in the kernel's socket buffers, not copied into our queues: at 64 KiB frames through
  a 3-router chain, copying what a pushed-back output could not take cost the first router
  40% of its CPU (page faults of fresh buffers, the copies themselves, per-frame writes from
  the queue; BENCHMARKS.md). The input reads again as soon as any of those outputs takes
  frames again, or after ``slow_consumer_stall`` seconds without that (the output is then
  stuck: frames for it queue without credit, bounded by ``slow_consumer_bytes``), so a
  hung receiver holds its sender no longer than the credit rule would.
* **Credit** (``RouterNode._credit_take``/``_credit_release`` and :func:`unblock`): frames
  that do wait in output queues (fair queueing between flows, a sibling output still
  draining) hold their input's credit; past ``link_credit`` bytes the input stops reading,
  unless the outputs holding it are not draining while a sibling is.

Imports nothing of the runtime at run time: the node and its outputs are only types here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowrouter.net.node import RouterNode
    from flowrouter.net.output import LinkOutput


def feeds(out: LinkOutput, origin: int, since: int) -> bool:
    """Whether *out* has written frames of input *origin* from read *since* (a count of the
    node's reads) on. Only that is evidence that the input's frames still flow to it: its
    last frame may be another input's (several inputs into one receiver), and an output
    that took the input's frames once, on another band or flow, may take none now."""
    return out.fed_read.get(origin, -1) >= since


def hold(node: RouterNode, out: LinkOutput) -> None:
    """*out*'s socket pushed back while writing its input's latest read: hold that input,
    if nothing else takes its frames (every other output that got frames of that read has
    pushed back too). An input already held gains *out* as one more holder; one paused for
    credit, or a push back at another time (draining a queue), is left to the credit rule."""
    origin = out.fed
    if not origin or out.stuck:
        return
    held = node._held.get(origin)
    if held is not None:
        held[0].add(out)
        return
    link = node._links.get(origin)
    if link is None or not getattr(link, "reading", False):
        return  # gone, a UDP peer (nothing to pause), or paused for credit already
    since = node._reads
    if out.fed_read.get(origin) != since:
        return  # not pushed back while writing that input's latest read: credit decides
    holders = {out}
    for other in node._links.values():
        sib = other.out
        if sib is None or sib is out or sib.link_id == origin or not feeds(sib, origin, since):
            continue
        if not sib.paused:
            return  # a sibling still takes this input's frames: credit and unblock decide
        if not sib.stuck:
            holders.add(sib)  # pushed back too: the input reads again when either moves
    node._held[origin] = (holders, node.now())
    node.core.counters["credit.held"] += 1
    stop_reading(node, origin, link)


def release(node: RouterNode, out: LinkOutput) -> None:
    """*out* takes frames again (or is gone): every input it holds reads again, unless it
    is paused for credit too."""
    for origin, (outs, _) in list(node._held.items()):
        if out in outs:
            _resume(node, origin)


def check_holds(node: RouterNode, now: float) -> None:
    """An input held for ``slow_consumer_stall`` seconds reads again; its holders are stuck
    (their frames queue without credit, up to slow_consumer_bytes, then are dropped and
    counted): a receiver that stopped reading must not stop its sender for long."""
    stall = node.config.slow_consumer_stall
    for origin, (outs, since) in list(node._held.items()):
        if now - since >= stall:
            node.core.counters["credit.hold-stalled"] += 1
            for out in outs:
                out._become_stuck()
            _resume(node, origin)


def forget(node: RouterNode, link_id: int) -> None:
    """*link_id* is gone: as an input it is held by nobody and feeds nothing; as an output
    it holds nothing."""
    node._held.pop(link_id, None)
    for link in node._links.values():
        if link.out is not None:
            link.out.fed_read.pop(link_id, None)
    for origin, (outs, _) in list(node._held.items()):
        if any(out.link_id == link_id for out in outs):
            _resume(node, origin)


def _resume(node: RouterNode, origin: int) -> None:
    node._held.pop(origin, None)
    read_again(node, origin)


def stop_reading(node: RouterNode, origin: int, link: Any) -> None:
    """Input *origin* (its *link*) stops reading, held or paused for credit; while it does,
    the peer's silence proves nothing to liveness."""
    link.set_reading(False)
    node.core.input_paused(origin, True, node.now())


def read_again(node: RouterNode, origin: int) -> None:
    """Input *origin* reads again if nothing stops it any more: neither held nor paused
    for credit (the one place both are asked)."""
    link = node._links.get(origin)
    if (link is not None and not getattr(link, "reading", True) and origin not in node._held
            and origin not in node._paused_at):
        link.set_reading(True)
        node.core.input_paused(origin, False, node.now())


def unblock(node: RouterNode, origin: int) -> None:
    """Outputs that do not drain hold no credit (slow consumers hurt only themselves).

    Called for an input paused (or about to be) for credit. An output is *not draining*
    when its transport has pushed back (paused) and it has sent nothing for
    ``slow_consumer_idle`` seconds (default 0: at once), while a sibling fed by the same
    input is draining (its transport takes that input's frames). If such outputs keep the
    input paused (the draining ones hold under an eighth of its credit), their frames stop
    holding credit (bounded by slow_consumer_bytes, then dropped and counted): the fastest
    output of an input sets its pace and the others may lag by up to slow_consumer_bytes.
    A lone receiver, or receivers all behind together, still push back on the input. (A
    detection delay would cost the healthy siblings that long at every stuck receiver: with
    a fifth of the stall time, 100 ms, they got 65-71% of their rate over a 20,000-message
    burst; BENCHMARKS.md.) If an output is not idle long enough yet, a timer looks again."""
    now, cfg = node.now(), node.config
    idle_for = cfg.slow_consumer_idle
    stalled: list[LinkOutput] = []
    wait: float | None = None
    for out in node._backlogged:
        if not out.paused or out.stuck or origin not in out.held:
            continue
        idle = now - out.slow.last_progress
        if idle >= idle_for:
            stalled.append(out)
        else:
            wait = idle_for - idle if wait is None else min(wait, idle_for - idle)
    held = sum(out.held[origin] for out in stalled)
    # a sibling drains if it has taken the input's frames since the stalled ones pushed back
    since = min((out.paused_read for out in stalled), default=node._reads)
    if stalled and node._pending_in.get(origin, 0) - held <= cfg.link_credit // 8 and any(
            link.out is not None and link.out not in stalled and feeds(link.out, origin, since)
            and (not link.out.paused or now - link.out.slow.last_progress < idle_for)
            for link in node._links.values()):
        for out in stalled:
            node.core.counters["credit.not-draining"] += 1
            out._become_stuck()
    elif wait is not None and origin in node._paused_at and node._loop is not None:
        timer = node._paused_at[origin]
        if timer is None:
            node._paused_at[origin] = node._loop.call_later(wait, _recheck, node, origin)


def _recheck(node: RouterNode, origin: int) -> None:
    """The timer unblock set: look again at an input still paused for credit."""
    if origin in node._paused_at:
        node._paused_at[origin] = None
        unblock(node, origin)
