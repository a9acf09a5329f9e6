"""The asyncio shell around the sans-I/O router: sockets, timers, reconnects, control queries.

Everything protocol-shaped happens in :class:`flowrouter.core.router.Router`; this module only moves
bytes and time in and actions out:

* TCP links (routers and endpoints) read into one reused buffer per connection (an
  :class:`asyncio.BufferedProtocol`, :mod:`flowrouter.net.streamio`, up to ``read_buffer``
  bytes a read); the forwarding fast path works in place in it, and each output link gets one
  gathered ``writev`` per read, so a forwarded payload is never copied by Python code.
* UDP links share one non-blocking socket, drained a bounded batch of datagrams per wake-up;
  each remote address is a link. Datagrams go through the forwarding fast path like TCP reads,
  and what a batch sends leaves in one batch (``recvmmsg``/``sendmmsg`` when the optional
  ``flowrouter.net._udpio`` is built, else Python loops; :mod:`flowrouter.net.udpio`),
  scatter/gather (no copy); a full socket buffer is a counted drop.
* Each link's output goes straight to the transport until the transport pushes back (or the
  link is shaped for emulation); then frames wait in an :class:`~flowrouter.core.linkqueue.
  OutputQueue`: control first, data fair between flows (deficit round robin), bounded by
  ``max_link_buffer`` with drops taken from the longest flow queue, counted as
  ``drop.link-congested`` and announced on the flow's fault band. An input whose outputs have
  all pushed back stops reading at once (held: its frames wait in the kernel, not copied into
  queues; :mod:`flowrouter.core.flowcontrol` decides, :mod:`flowrouter.net.backpressure`
  carries it out) until one moves or ``slow_consumer_stall`` passes. Each input link has a credit
  (``link_credit`` bytes waiting in output queues); past it the router stops reading from that
  neighbour, so TCP pushes back on the sender that causes the congestion and only on it. An
  output whose transport pushed back while a sibling fed by the same input drains gives its
  credit back (after ``slow_consumer_idle``, default 20 ms), and one that stops moving
  for ``slow_consumer_stall`` seconds does in any case: one stuck receiver never holds an
  input. Such a *slow consumer* loses its own frames
  past ``slow_consumer_bytes`` (``drop.slow-consumer``) and is closed after
  ``slow_consumer_grace`` seconds over it, with a fault notice on band 17.
* A frame that has started must arrive in full within ``frame_timeout`` seconds
  (``reaped.stalled-frame``); control commands need proof off loopback
  (:mod:`flowrouter.net.commandauth`).
* Link emulation (bandwidth, delay, loss per direction, and administrative down/up) happens
  here, so outage rehearsals need no kernel traffic control.
* Dialled peers are re-dialled with exponential back-off when their link drops.
* The control interface speaks JSON lines on TCP: ``{"cmd": "status"}`` returns the link table,
  flow table, LS routes and counters (``flowrouter status`` prints them).

The code lives in one module per concern; this module keeps the historical import path:

* :mod:`flowrouter.net.node` — :class:`RouterNode`, the daemon;
* :mod:`flowrouter.net.tcp` — TCP links; :mod:`flowrouter.net.udp` — UDP links and their
  batched datagram I/O;
* :mod:`flowrouter.net.control` — the control interface and :func:`query_control`;
* :mod:`flowrouter.net.output` — a link's output: fast path, fair queue, credits, emulation;
* :mod:`flowrouter.net.backpressure` — carries out the node's flow control, the sans-I/O
  :class:`~flowrouter.core.flowcontrol.FlowControl` (which input stops reading, which
  output holds credit or is a slow consumer), on one timer at its next deadline;
* :mod:`flowrouter.net.nodeapi` — the node interface links and outputs see, and the read
  batch.

May import the rest of :mod:`flowrouter.net` (and so everything below it).
"""

from __future__ import annotations

from flowrouter.core.tables import Modifiers
from flowrouter.net.control import CONTROL_LINE_LIMIT, query_control
from flowrouter.net.node import RouterNode

__all__ = ["CONTROL_LINE_LIMIT", "RouterNode", "query_control", "Modifiers"]
