"""Flow control between a router's inputs and outputs: which input stops reading, and when.

Two mechanisms, both ending in a TCP input that stops reading so that TCP pushes back on the
sender causing the load (a UDP socket serves every peer and is never paused):

* **Holding** (:meth:`Backpressure.hold`, :meth:`~Backpressure.release`,
  :meth:`~Backpressure.check`): when an output's socket
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
* **Credit** (:meth:`Backpressure.take`/:meth:`~Backpressure.give` and
  :meth:`~Backpressure.unblock`): frames
  that do wait in output queues (fair queueing between flows, a sibling output still
  draining) hold their input's credit; past ``link_credit`` bytes the input stops reading,
  unless the outputs holding it are not draining while a sibling is.

:class:`Backpressure` is the node's one flow-control object: it keeps the credit each input
holds in output queues, the inputs paused for credit or held, and the outputs with a
backlog (watched for stalls and slow consumers). Outputs reach it through the node
interface (:class:`flowrouter.net.nodeapi.FlowShell`).

May import :mod:`flowrouter.core` and :mod:`flowrouter.net.nodeapi`: the node, its links and
outputs are seen only through that interface.
"""


from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowrouter.net.nodeapi import Link, Node, Output


def feeds(out: Output, origin: int, since: int) -> bool:
    """Whether *out* has written frames of input *origin* from read *since* (a count of the
    node's reads) on. Only that is evidence that the input's frames still flow to it: its
    last frame may be another input's (several inputs into one receiver), and an output
    that took the input's frames once, on another band or flow, may take none now."""
    return out.fed_read.get(origin, -1) >= since


class Backpressure:
    """A node's flow control: credit, held inputs, paused inputs and backlogged outputs."""

    def __init__(self, node: Node) -> None:
        self.node = node
        #: bytes from each input link waiting in output queues
        self.pending: dict[int, int] = {}
        #: inputs paused for credit -> the timer that looks again for outputs not draining
        self.paused_at: dict[int, asyncio.TimerHandle | None] = {}
        #: inputs held while every output they feed pushes back -> (holders, since when)
        self.held: dict[int, tuple[set[Output], float]] = {}
        #: outputs with a backlog (checked for stalls and slow consumers)
        self.backlogged: set[Output] = set()

    @property
    def paused_inputs(self) -> Collection[int]:
        return self.paused_at

    # credit -----------------------------------------------------------------------------------
    def take(self, origin: int, size: int) -> None:
        """*size* bytes of input *origin* wait in an output queue: past its credit the
        input stops reading, unless what holds it are outputs that do not drain."""
        if not origin:
            return
        node = self.node
        credit = node.config.link_credit
        pending = self.pending.get(origin, 0) + size
        self.pending[origin] = pending
        if pending > credit:
            link = node.links.get(origin)
            if link is not None and link.reading:
                self.paused_at[origin] = None
                self.unblock(origin)
                if self.pending.get(origin, 0) <= credit // 2:
                    self.paused_at.pop(origin, None)  # it was only an output not draining
                    return
                node.core.counters["credit.paused"] += 1
                self._stop_reading(origin, link)
            elif origin in self.held:  # held already: when the hold ends, credit decides
                self.paused_at.setdefault(origin, None)

    def give(self, origin: int, size: int) -> None:
        """*size* bytes of input *origin* left an output queue (or stopped holding credit)."""
        if not origin:
            return
        pending = self.pending.get(origin, 0) - size
        if pending <= 0:
            self.pending.pop(origin, None)
        else:
            self.pending[origin] = pending
        if pending <= self.node.config.link_credit // 2:
            timer = self.paused_at.pop(origin, None)
            if timer is not None:
                timer.cancel()
            self._read_again(origin)

    # holding ----------------------------------------------------------------------------------
    def hold(self, out: Output) -> None:
        """*out*'s socket pushed back while writing its input's latest read: hold that input,
        if nothing else takes its frames (every other output that got frames of that read has
        pushed back too). An input already held gains *out* as one more holder; one paused for
        credit, or a push back at another time (draining a queue), is left to the credit
        rule."""
        origin = out.fed
        if not origin or out.stuck:
            return
        held = self.held.get(origin)
        if held is not None:
            held[0].add(out)
            return
        node = self.node
        link = node.links.get(origin)
        if link is None or not link.reading:
            return  # gone, a UDP peer (nothing to pause), or paused for credit already
        since = node.reads.number
        if out.fed_read.get(origin) != since:
            return  # not pushed back while writing that input's latest read: credit decides
        holders = {out}
        for other in node.links.values():
            sib = other.out
            if (sib is None or sib is out or sib.link_id == origin
                    or not feeds(sib, origin, since)):
                continue
            if not sib.paused:
                return  # a sibling still takes this input's frames: credit and unblock decide
            if not sib.stuck:
                holders.add(sib)  # pushed back too: the input reads again when either moves
        self.held[origin] = (holders, node.now())
        node.core.counters["credit.held"] += 1
        self._stop_reading(origin, link)

    def release(self, out: Output) -> None:
        """*out* takes frames again (or is gone): every input it holds reads again, unless it
        is paused for credit too."""
        for origin, (outs, _) in list(self.held.items()):
            if out in outs:
                self._resume(origin)

    def check(self, now: float) -> None:
        """The node's tick: an input held for ``slow_consumer_stall`` seconds reads again and
        its holders are stuck (their frames queue without credit, up to slow_consumer_bytes,
        then are dropped and counted): a receiver that stopped reading must not stop its
        sender for long. Backlogged outputs that stopped moving give back their credit, and
        are closed as slow consumers after the grace time."""
        node = self.node
        stall = node.config.slow_consumer_stall
        for origin, (outs, since) in list(self.held.items()):
            if now - since >= stall:
                node.core.counters["credit.hold-stalled"] += 1
                for out in outs:
                    out.become_stuck()
                self._resume(origin)
        for out in list(self.backlogged):
            if out.slow.expired(now):
                node.close_slow_consumer(out)
            elif not out.stuck and out.slow.stuck(now):
                out.become_stuck()

    def forget(self, link_id: int) -> None:
        """*link_id* is gone: as an input it holds no credit, is held by nobody and feeds
        nothing; as an output it holds nothing."""
        self.pending.pop(link_id, None)
        timer = self.paused_at.pop(link_id, None)
        if timer is not None:
            timer.cancel()
        self.held.pop(link_id, None)
        for link in self.node.links.values():
            if link.out is not None:
                link.out.fed_read.pop(link_id, None)
        for origin, (outs, _) in list(self.held.items()):
            if any(out.link_id == link_id for out in outs):
                self._resume(origin)

    def _resume(self, origin: int) -> None:
        self.held.pop(origin, None)
        self._read_again(origin)

    def _stop_reading(self, origin: int, link: Link) -> None:
        """Input *origin* (its *link*) stops reading, held or paused for credit; while it does,
        the peer's silence proves nothing to liveness."""
        link.set_reading(False)
        node = self.node
        node.core.input_paused(origin, True, node.now())

    def _read_again(self, origin: int) -> None:
        """Input *origin* reads again if nothing stops it any more: neither held nor paused
        for credit (the one place both are asked)."""
        node = self.node
        link = node.links.get(origin)
        if (link is not None and link.reading is False and origin not in self.held
                and origin not in self.paused_at):
            link.set_reading(True)
            node.core.input_paused(origin, False, node.now())

    # outputs that do not drain ----------------------------------------------------------------
    def unblock(self, origin: int) -> None:
        """Outputs that do not drain hold no credit (slow consumers hurt only themselves).

        Called for an input paused (or about to be) for credit. An output is *not draining*
        when its transport has pushed back (paused) and it has sent nothing for
        ``slow_consumer_idle`` seconds (default 0: at once), while a sibling fed by the same
        input is draining (its transport takes that input's frames). If such outputs keep
        the input paused (the draining ones hold under an eighth of its credit), their frames
        stop holding credit (bounded by slow_consumer_bytes, then dropped and counted): the
        fastest output of an input sets its pace and the others may lag by up to
        slow_consumer_bytes. A lone receiver, or receivers all behind together, still push
        back on the input. (A detection delay would cost the healthy siblings that long at
        every stuck receiver: with a fifth of the stall time, 100 ms, they got 65-71% of
        their rate over a 20,000-message burst; BENCHMARKS.md.) If an output is not idle
        long enough yet, a timer looks again."""
        node = self.node
        now, cfg = node.now(), node.config
        idle_for = cfg.slow_consumer_idle
        stalled: list[Output] = []
        wait: float | None = None
        for out in self.backlogged:
            if not out.paused or out.stuck or origin not in out.held:
                continue
            idle = now - out.slow.last_progress
            if idle >= idle_for:
                stalled.append(out)
            else:
                wait = idle_for - idle if wait is None else min(wait, idle_for - idle)
        held = sum(out.held[origin] for out in stalled)
        # a sibling drains if it has taken the input's frames since the stalled ones pushed
        # back
        since = min((out.paused_read for out in stalled), default=node.reads.number)
        if stalled and self.pending.get(origin, 0) - held <= cfg.link_credit // 8 and any(
                link.out is not None and link.out not in stalled
                and feeds(link.out, origin, since)
                and (not link.out.paused or now - link.out.slow.last_progress < idle_for)
                for link in node.links.values()):
            for out in stalled:
                node.core.counters["credit.not-draining"] += 1
                out.become_stuck()
        elif wait is not None and origin in self.paused_at and self.paused_at[origin] is None:
            self.paused_at[origin] = node.loop.call_later(wait, self._recheck, origin)

    def _recheck(self, origin: int) -> None:
        """The timer unblock set: look again at an input still paused for credit."""
        if origin in self.paused_at:
            self.paused_at[origin] = None
            self.unblock(origin)
