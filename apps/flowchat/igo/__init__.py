"""Intermittent Global Order (IGO): a sans-I/O ordering layer for a few sites on one flow.

Seed 003 (Ramanan, *Robust Chat for Airborne Command and Control*, chapters 4-6) orders the
messages of a handful of *sites* (one server per site, many thin clients behind it) so that
every site shows them in the **same order while the network allows it**, and in a weaker but
well-defined order with **bounded latency** when links fail. This module is that protocol as a
reusable state machine: one :class:`SiteOrdering` per site, fed with events and returning
actions, with the clock passed in. It knows nothing about sockets, asyncio or chat; the
simulator adapter (:mod:`flowchat.sim_adapter`) and the flowlib adapter
(:mod:`flowchat.flow_adapter`) carry its actions out.

Events in::

    actions = site.submit(app_payload, now)          # a message from this site's clients
    actions = site.on_message(band, payload, now)    # a frame received on the room flow
    actions = site.tick(now)                          # timers (call every 50-100 ms)

Actions out (plain named tuples, in the order they must be carried out):

* :class:`Send` ``(band, payload, kind)`` — multicast *payload* on *band* of the room flow;
* :class:`Deliver` ``(delivery)`` — hand a :class:`Delivery` to the application (site, origin
  site, sequence number, Lamport time, leader order number, send time, delivery time, late
  flag, local-only flag, payload);
* :class:`MembershipChange` — the ordering set (the sites this site's order includes) changed;
* :class:`StateChange` — a peer's state, or this site's overall state, changed (S1/S2/S3);
* :class:`Conflict` — two frames gave different content for one message (origin,
  incarnation, seq): a forgery or an origin equivocating; the first stays, the other is
  reported (``conflict.data``), never swapped in or dropped silently.

**Keyed rooms.** ``SiteOrdering(..., auth=FrameAuth)`` signs every frame it sends and every
message it originates, and believes a frame only with its transmitter's signature and a
message only with its origin's (:mod:`.auth`; Ed25519 keys in :mod:`flowchat.sitekeys`).
Without ``auth`` frames are believed as they come (the README says what that allows).

What it implements (seed sections in brackets)
==============================================

**Reliable FIFO per sending site** [4.2]. Every message carries its origin site and a
per-origin sequence number (from 1). Receivers keep, per origin, the highest contiguous
sequence number received; later messages wait in a buffer. A gap (seen from a later
message, from the origin's heartbeat, which carries its highest sequence number, or from
another site's acknowledgement vector) triggers a *repair request* on
:data:`~flowrouter.wire.bands.BAND_REPAIR` after ``nack_delay``, retried every ``nack_retry``.
"Multicast out, point-to-point in" (seed 004, Isis): data is multicast on the flow; the repair
request names **one** site that should answer — the origin while it is reachable, otherwise any
reachable site whose acknowledgement vector shows that it holds the messages. The answering
site coalesces requests for ``repair_coalesce`` seconds and resends each message **point to
point** (on the requester's *inbox band*, so routers filter it away from everybody else) when
one site asked, or multicast when several did, at most ``repair_rate`` messages per second.
A requester that has fallen more than ``max_lag`` messages behind (or asks for messages the
history no longer holds) is *dropped from the sender's duty*: it gets a GONE answer naming the
lowest sequence number still served, skips the rest (counted, visible as a gap) and can never
stall the others; the sender never waits for any receiver.

**Lamport clocks and all-to-all ordering** [2.1.1, 2.2.3]. Each message carries the sender's
Lamport time ``T`` (then the clock advances); every received message and heartbeat moves the
clock to ``max(C, T + 1)``. Messages wait in a buffer sorted by ``(T, origin index)`` and the
head is delivered once every site of the *ordering set* is known to have passed it: each
site's bound is ``T + 1`` of its last contiguous message or the clock in its heartbeat (used
only once every message the heartbeat counts has arrived, because routers let the heartbeat
band overtake queued data). With every site connected this is a global order.

**Heartbeats** [5.1.3.2]. Every ``heartbeat_interval`` (2 s) on
:data:`~flowrouter.wire.bands.BAND_HEARTBEAT`; any message from a site counts as a sign of life; a
site silent for ``missed_heartbeats`` intervals (3, i.e. 6 s) is disconnected.

**States** [4.3.2, Figure 10]. Per peer site: ``S1`` connected; ``S2`` short-term disconnect
(detected, silent for less than ``disconnect_interval`` = 15 s; when heard again it is
*reconciling* until every message it sent has arrived); ``S3`` long-term disconnect (silent for
``disconnect_interval`` or more). The site's overall state is S2 if any peer is in S2, else S3 if
any is in S3, else S1. Reconnecting from S2 reconciles (the gap is repaired, so there are **no
gaps in per-site sequence numbers**); reconnecting from S3 does not: the stream resumes at the
site's current sequence number and the skipped ones are a visible gap (or, with
``long_term_reconcile``, fetched later at a low rate, see below). A peer that is heard but
*stalled* (one of its messages, or of the leader's order numbers, known to exist and missing
for ``stall_timeout``: a flapping link passes heartbeats but loses data) goes to S2 too
(:mod:`.stall`), so delivery does not wait behind it for as long as the flapping lasts.

**Restarts: streams are (site, incarnation).** A restarted site starts its sequence numbers
and Lamport clock again; each run has an *incarnation* (growing from run to run, see
:func:`new_incarnation`) carried in every frame and in every reference to a message
(dependencies, acknowledgements, NACK, GONE, ORDER entries: wire version 2; version 1 is
refused and counted). A newer run of a peer gets a new stream, fetched from 1; the old run's
stream is *retired*: what this site holds of it is still delivered, what it lacks is asked
of the other sites and declared lost (counted) after ``dependency_timeout``; a dependency is
looked up in the run it names only, so an old run's time-out never skips a message of the
new run (see :mod:`.incarnations`). A restarted leader starts a new order stream, which
sites follow from 1.

**Modes** [4.3.3-4.3.5]:

* ``all-to-all`` (delay-delivery): the ordering set is this site plus every peer in S1 or S2.
  Delivery stops while a peer is disconnected (waiting for it to come back), so a short
  disconnect keeps the global order; at S3 the peer leaves the ordering set and delivery
  resumes with the remaining sites.
* ``hasten`` (all-to-all + hasten-delivery): peers leave the ordering set as soon as the
  disconnect is detected (S2) and come back once reconciled, so delivery continues among the
  connected sites; messages delivered out of Lamport order (reconciled ones) are flagged
  ``late``.
* ``leader`` (leader-based, hasten): every site still multicasts its messages (so data crosses
  each link once), and the *leader* site assigns global order numbers, multicast in small
  ORDER records on :data:`~flowrouter.wire.bands.BAND_ORDER`; sites deliver in that order. A site
  cut off from the leader (leader in S2/S3) keeps intra-site chat: its own messages are
  delivered at once (``local``), including those that were waiting for an order number when
  the cut was detected. When the leader hears a site again within the disconnect interval it
  fetches the site's missed messages and orders them flagged ``late``; the reconnected site
  itself does not receive what the others said meanwhile (seed 6.3.3: it would be deluged),
  it resumes the order stream at the leader's current number (``leader_reconcile_cut_site``
  changes that). The leader's view (the sites in S1 at the leader) is carried in its ORDER
  records and heartbeats and is the membership shown by every site connected to it.

**Causal order, always.** Each message carries a dependency vector: per stream (origin and
incarnation), the highest sequence number its sender had delivered when it sent it. A
message is never delivered before its dependencies (or before they are known to be skipped),
so replies never precede their questions even among late, reconciled messages (a dependency
on a message this site lacks fetches it from a holder; one that cannot be had within
``dependency_timeout`` is skipped).
In leader mode the leader numbers a message only once its dependencies are settled there, so
the order every site follows is causal too.

Beyond the seed (its chapter 7):

* **stability tracking** (``stability=True``): a message is delivered only once every site of
  the ordering set acknowledges having it, reports a *frontier* past it (it holds everything
  its own ordering set sent below it) and we hold everything they hold (acknowledgement
  vectors and frontiers ride on heartbeats, sent every ``ack_interval`` while they change), so
  connected sites deliver the same sequence even without transitive connectivity; with it, a
  long-term reconnect reconciles too (bounded by ``max_lag``), since a site we are connected
  to may have delivered what the reconnecting site said meanwhile;
* **long-term reconciliation** (``long_term_reconcile=True``): after an S3 reconnect, skipped
  messages are requested with a LOW-PRIORITY flag, at most ``long_term_rate`` per second, and
  answered only when no ordinary repair is waiting; they are delivered flagged ``late``;
  a request whose answer does not come is retried on its own timer (:mod:`.history`);
* **sender flow control** (``send_window``, default 32 KiB): own messages in flight are
  bounded by the acknowledgements in heartbeats; beyond it messages wait in an outbox and
  the site is congested (:class:`Congestion`; :class:`OutboxFull` when the outbox is full),
  so an overload slows the senders instead of growing every queue (:mod:`.flowcontrol`);
  repair requests never name messages beyond the highest received while the stream's data
  is still arriving (they are in flight, not lost);
* **display-rate limit** (``display_rate``): deliveries leave the layer at most that many per
  second (bursts after reconciliation are spread out; delivery time is the release time).
"""

from flowrouter.wire.bands import BAND_HEARTBEAT, BAND_ORDER, BAND_REPAIR

from .actions import (
    Action,
    Conflict,
    Congestion,
    Deliver,
    Delivery,
    MembershipChange,
    PeerState,
    Send,
    StateChange,
    ViewChange,
    ViewInstalled,
)
from .auth import FrameAuth
from .config import MODES, IGOConfig, default_config, room_tag
from .core import new_incarnation
from .flowcontrol import OutboxFull
from .site import SiteOrdering
from .wire import (
    DataMsg,
    Gone,
    Heartbeat,
    Nack,
    Order,
    ProtocolError,
    decode,
    encode_data,
    encode_gone,
    encode_heartbeat,
    encode_nack,
    encode_order,
)

__all__ = [
    "IGOConfig", "SiteOrdering", "Delivery", "Send", "Deliver", "MembershipChange",
    "StateChange", "PeerState", "ProtocolError", "MODES", "decode", "encode_data",
    "DataMsg", "Heartbeat", "Nack", "Gone", "Order", "room_tag", "Action", "default_config",
    "encode_gone", "encode_heartbeat", "encode_nack", "encode_order", "BAND_HEARTBEAT",
    "BAND_ORDER", "BAND_REPAIR", "new_incarnation", "Conflict", "FrameAuth", "Congestion",
    "OutboxFull", "ViewChange", "ViewInstalled",
]
