"""The message an application receives, and the helper that reads router fault notices.

A :class:`Message` owns its payload as ``bytes``: the receive path copies it out of the frame
decoder's buffer exactly once, because the decoder reuses that buffer on the next read and a
queued message can outlive many reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrouter.wire import control
from flowrouter.wire.bands import BAND_FAULT, BAND_OVERFLOW
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import Locality, MalformedFrame


@dataclass(frozen=True, slots=True)
class Message:
    """One received frame: which flow and band it came on, its payload and header extras.

    ``loc_type``/``loc_value`` are the locality budget left when it reached us (the routers
    subtract each link's modifier), and ``ttl`` the hops it had left; both let an application
    estimate how far away the sender is (e.g. in an expanding-ring search).
    """

    flow: FlowID
    band: int
    payload: bytes
    loc_type: int = Locality.NONE
    loc_value: int = 0
    ttl: int = 0

    @property
    def is_fault(self) -> bool:
        """True if this message arrived on the fault band (see :meth:`fault`)."""
        return self.band == BAND_FAULT

    @property
    def is_overflow(self) -> bool:
        """True if this message arrived on the overflow band: a notice that messages were
        dropped (decode it with :meth:`fault`; see :mod:`flowlib.notices`)."""
        return self.band == BAND_OVERFLOW

    def fault(self) -> control.Fault:
        """Decode a fault-band message (shorthand for :func:`decode_fault`)."""
        return decode_fault(self)


def decode_fault(message: Message | bytes | memoryview) -> control.Fault:
    """Read a :class:`flowrouter.wire.control.Fault` notice from a fault-band message or payload.

    Routers send these on :data:`~flowrouter.wire.bands.BAND_FAULT` when a link a flow depended on
    goes down, a limit trips, and so on; they are delivered to listeners like any band, so an
    application that subscribes to ``"fault"`` sees the network's trouble as it happens.
    flowlib's own local notices (failover on the fault band, overflow and dropped large
    messages on the overflow band) use the same encoding (:mod:`flowlib.notices`).
    Raises ``ValueError`` if the payload is not a fault notice (an application may also send
    on band 17, and its messages need not be in this format).
    """
    payload = message.payload if isinstance(message, Message) else message
    try:
        msg = control.decode(payload)
    except MalformedFrame as exc:
        raise ValueError(f"not a fault notice: {exc}") from None
    if not isinstance(msg, control.Fault):
        raise ValueError(f"not a fault notice: a {type(msg).__name__} control message")
    return msg


__all__ = ["Message", "decode_fault"]
