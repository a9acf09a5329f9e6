"""A node's UDP side, batched: a bounded batch of datagrams per wake-up through the forwarding
fast path, and everything sent meanwhile in one batch.

The node's one UDP socket is non-blocking and read when readable (``loop.add_reader``):
:func:`readable` takes up to :data:`flowrouter.net.udpio.BATCH` datagrams at once (the
rest wait for the next wake-up, so TCP reads and timers get their turn), hands them to
:func:`datagrams`, then flushes the node's outputs: what UDP links were given meanwhile
(``UdpLink._write_many`` gathers it in ``RouterNode._udp_out``) leaves in one
:func:`send_gathered` call, one ``sendmmsg`` when the compiled I/O is built
(:mod:`flowrouter.net.udpio`).

Per-link semantics are those of a datagram at a time: a new sender address is a new link,
``last_rx`` is refreshed, a datagram that is not exactly one valid frame drops its link
(``split_datagram`` says why), and the core sees every datagram the engine stops at, in
arrival order.

May import :mod:`flowrouter.core`, :mod:`flowrouter.wire` and :mod:`flowrouter.net.links`;
the node is only a type here.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from flowrouter.core.fastpath import STOP_END
from flowrouter.core.tables import LinkState
from flowrouter.wire.header import HEADER_SIZE, UDP_MAX_PAYLOAD, MalformedFrame, split_datagram

if TYPE_CHECKING:
    from flowrouter.net.links import UdpLink
    from flowrouter.net.node import RouterNode

log = logging.getLogger("flowrouter.net.runtime")


def readable(node: RouterNode) -> None:
    """The UDP socket is readable: take a bounded batch of datagrams, handle them all,
    then send everything they caused at once (``RouterNode._flush``)."""
    try:
        blob, grams = node._udp_io.recv()
    except OSError as exc:
        node.core.counters["drop.udp-error"] += 1
        log.debug("router %s: UDP receive failed: %s", node.config.name, exc)
        return
    if not grams:
        return
    node._batching = True
    try:
        datagrams(node, memoryview(blob), grams)
    finally:
        node._batching = False
        node._rx_link = 0
        node._flush()


def datagrams(node: RouterNode, view: memoryview,
              grams: list[tuple[tuple[str, int], int]]) -> None:
    """One datagram is one frame of the link of its sender's address (a new address is a
    new link). Runs of well-formed datagrams from one address go through the forwarding
    fast path in one call; the core gets every datagram the engine stops at, and each
    malformed one (which drops its link)."""
    core, fast, links = node.core, node.fast, node._udp_links
    max_payload = min(node.config.max_payload, UDP_MAX_PAYLOAD)
    now = node.now()
    n = len(grams)
    i = pos = 0
    while i < n:
        addr, size = grams[i]
        link = links.get(addr)
        if link is None:
            link = node._udp_link(addr, None)
        link.last_rx = now
        link_id = node._rx_link = link.link_id
        node._reads += 1
        if fast is not None:
            j, end = i, pos
            while j < n:  # the run: whole frames from this address, one per datagram
                a, sz = grams[j]
                if (a != addr or sz < HEADER_SIZE or int.from_bytes(
                        view[end + 16:end + 20], "big") != sz - HEADER_SIZE):
                    break
                end += sz
                j += 1
            if j > i:
                p, stop, outs = fast.forward(link_id, view[:end], pos, max_payload)
                all_links = node._links
                for lk, frames, count in outs:
                    out_link = all_links.get(lk)
                    if out_link is not None and out_link.out is not None:
                        out_link.out.send_frames(frames, count)
                while pos < p:  # the datagrams the engine took
                    pos += grams[i][1]
                    i += 1
                if stop == STOP_END:
                    _generation(node, link)
                    continue
                size = grams[i][1]  # the engine stopped here: the core's datagram
        end = pos + size
        try:
            header, payload = split_datagram(view[pos:end], max_payload)
        except MalformedFrame as exc:
            node.execute(core.drop_link(link_id, exc, now))
        else:
            actions = core.receive(link_id, header, payload, now)
            if actions:
                node.execute(actions)
        pos = end
        i += 1
        _generation(node, link)


def _generation(node: RouterNode, link: UdpLink) -> None:
    """Links changed: tell the node; a configured peer's link that came up resets its
    re-dial back-off."""
    if node.core.generation != node._seen_generation:
        node._link_state_changed()
        if link.peer is not None and link.peer.address in node._backoff:
            lk = node.core.links.get(link.link_id)
            if lk is not None and lk.state is LinkState.UP:
                node._backoff.pop(link.peer.address, None)


def send_gathered(node: RouterNode) -> None:
    """Send the datagrams gathered in ``node._udp_out`` in one batch; a full socket buffer
    (``drop.link-congested``) or an error (``drop.udp-error``) loses a datagram, counted."""
    items, node._udp_out = node._udp_out, []
    if node._udp_io is None or not items:
        return
    _sent, congested, failed, err = node._udp_io.send(items)
    if congested:
        node.core.counters["drop.link-congested"] += congested
    if failed:
        node.core.counters["drop.udp-error"] += failed
        log.debug("router %s: %d UDP datagrams not sent: %s", node.config.name, failed,
                  os.strerror(err) if err else "?")
