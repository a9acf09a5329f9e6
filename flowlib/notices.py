"""Local notices: what flowlib itself tells the application on the administration bands.

Routers report trouble inside the flow, on :data:`~flowrouter.wire.bands.BAND_FAULT`. flowlib adds
notices of its own about things only the client sees. They are *local*: delivered to this
client's listeners whose band mask includes the notice's band, never sent to the network.
All use the routers' fault encoding (:class:`flowrouter.wire.control.Fault`), so one decoder,
``msg.fault()`` / :func:`flowlib.decode_fault`, reads them all; ``origin`` is the client's
name and every ``extra`` value is text.

=====================  ===========  =========================================================
notice                 band         ``kind`` and ``extra``
=====================  ===========  =========================================================
failover               17 fault     ``FAILOVER``; ``state`` (``resumed`` or
                                    ``rejoin-failed``), ``flow``, ``old`` / ``old_address``
                                    (router lost), ``new`` / ``new_address``, ``reason`` (why
                                    the old link ended), ``reconnect_ms`` (loss to the new
                                    router's HELLO), ``gap_ms`` (loss to this flow's membership
                                    being re-established at the new router)
queue overflow         18 overflow  ``OVERFLOW``; ``reason`` = ``queue-full``, ``flow``,
                                    ``listener`` (its name), ``bands``, ``dropped`` (messages
                                    lost since the previous notice about this listener),
                                    ``total`` (all it ever lost), ``size``, ``policy``
large message dropped  18 overflow  ``OVERFLOW``; ``reason`` = ``reassembly-timeout``,
                                    ``too-large``, ``memory`` or ``bad-fragment``, ``flow``,
                                    ``band``, ``dropped`` (messages of this flow lost that way
                                    since the previous such notice), ``sender`` (the fragment
                                    origin, hex), ``message`` (its id), ``bytes`` (its length),
                                    and for time-outs ``fragments`` (``received/count``)
=====================  ===========  =========================================================

Overflow notices are rate-limited as in the seed's prototype (seed 002, 4.1.3), which waited
2000 messages between notifications so that reporting an overload never adds much to it: a
listener's first drop is reported at once; after that a notice goes out only when at least
``every`` more messages were dropped **and** at least ``interval`` seconds passed since the
previous notice. Drops in between are not lost: the next notice carries their count, and
``Listener.dropped`` always has the total. A notice that finds a full queue is itself
dropped (and counted), but never causes another notice.
"""

from __future__ import annotations

from flowrouter.wire import control as C
from flowrouter.wire.bands import BAND_FAULT, BAND_OVERFLOW

DEFAULT_NOTICE_EVERY = 2000  #: the prototype's spacing, in dropped messages
DEFAULT_NOTICE_INTERVAL = 1.0  #: seconds between two notices at least


class NoticeLimiter:
    """Count events; say when a notice is due and how many events it reports.

    The first event is reported at once; later ones when ``every`` have accumulated and
    ``interval`` seconds have passed since the last notice.
    """

    __slots__ = ("every", "interval", "pending", "last", "sent")

    def __init__(self, every: int = DEFAULT_NOTICE_EVERY,
                 interval: float = DEFAULT_NOTICE_INTERVAL) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"notice spacing must be a positive integer, got {every!r}")
        if interval < 0:
            raise ValueError(f"notice interval must be >= 0, got {interval!r}")
        self.every = every
        self.interval = interval
        self.pending = 0
        self.last: float | None = None
        self.sent = 0

    def hit(self, now: float, n: int = 1) -> int:
        """Record *n* events at *now*; return how many to report now (0: no notice yet)."""
        self.pending += n
        last = self.last
        if last is not None and (self.pending < self.every or now - last < self.interval):
            return 0
        count, self.pending, self.last = self.pending, 0, now
        self.sent += 1
        return count


def overflow_fault(origin: str, detail: str, **extra: object) -> C.Fault:
    return C.Fault(C.FaultKind.OVERFLOW, origin, detail,
                   {k: str(v) for k, v in extra.items()})


def failover_fault(origin: str, detail: str, **extra: object) -> C.Fault:
    return C.Fault(C.FaultKind.FAILOVER, origin, detail,
                   {k: str(v) for k, v in extra.items()})


__all__ = ["NoticeLimiter", "overflow_fault", "failover_fault", "DEFAULT_NOTICE_EVERY",
           "DEFAULT_NOTICE_INTERVAL", "BAND_FAULT", "BAND_OVERFLOW"]
