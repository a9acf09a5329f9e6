"""The byte stream of a TCP link, sans-I/O: bytes in, frames out, and frames back to bytes.

A link's stream has three phases. It opens with **handshake** frames (HELLO, and AUTH when
the link is authenticated), always plain. What follows the handshake is either **sealed**
records (:class:`~flowrouter.wire.linkrecords.SecureStream`) once the handshake installed
keys, or **plain** frames. The switch may fall anywhere in a read: the bytes already received
behind the frame that ended the handshake belong to the next phase. So the handshake is split
one frame at a time, and only the owner of the link (router or client) knows, after each
frame, whether the handshake is over: it says so with :meth:`StreamCodec.start_sealed` or
:meth:`StreamCodec.end_handshake` between two frames of :meth:`StreamCodec.receive_data`.

Router links and flowlib's client both read through one :class:`StreamCodec`. The router's
forwarding engine splits plain frames itself, in place in its receive buffer, so the codec
also hands out the plain stream (:meth:`StreamCodec.take_buffered`, :meth:`plaintext
<StreamCodec.plaintext>`) and its frame splitter (``frames``) instead of frames.

Anything malformed raises :class:`~flowrouter.wire.header.MalformedFrame` (a bad sealed
record as its subclass :class:`BadRecord`), never waits for more input: the link is dropped.

May import the rest of :mod:`flowrouter.wire` and the standard library only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from flowrouter.wire.header import (
    DEFAULT_MAX_PAYLOAD,
    HEADER_SIZE,
    FrameDecoder,
    MalformedFrame,
    take_frame,
)
from flowrouter.wire.linkrecords import SecureStream
from flowrouter.wire.linksecrets import LinkSecurityError

__all__ = ["BadRecord", "Frame", "Phase", "StreamCodec"]

#: one frame: its 24-byte header and its payload, views that stay valid while held
Frame = tuple[memoryview, memoryview]


class Phase(enum.Enum):
    """Where a link's stream is: handshake frames, then sealed records or plain frames."""

    HANDSHAKE = "handshake"
    PLAIN = "plain"
    SEALED = "sealed"


class BadRecord(MalformedFrame):
    """A sealed record that cannot be trusted (framing, authentication, replay): the
    record layer's error as the one error a link's stream raises (reason ``bad-record``)."""

    def __init__(self, cause: LinkSecurityError) -> None:
        super().__init__("bad-record", str(cause))


class StreamCodec:
    """One TCP link's stream: handshake frames, then sealed records or plain frames.

    :meth:`receive_data` yields frames lazily; the link's owner may end the handshake
    between two frames (:meth:`start_sealed`, :meth:`end_handshake`), and the bytes behind
    that frame are then read the new way. :meth:`send_data` turns outgoing frame bytes into
    what goes on the wire.
    """

    __slots__ = ("_hs", "frames", "phase", "sealed")

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.phase = Phase.HANDSHAKE
        #: the handshake's bytes not yet split (after it: bytes received past the switch,
        #: until read)
        self._hs = bytearray()
        #: splits the plain frame stream (plain bytes, or the records' plaintext); public
        #: for a reader that splits most frames itself (the router's forwarding engine)
        self.frames = FrameDecoder(max_payload)
        #: the record layer once keys are installed
        self.sealed: SecureStream | None = None

    # phases ------------------------------------------------------------------------------------
    def start_sealed(self, stream: SecureStream) -> None:
        """The handshake installed keys: everything after the current frame, both ways, is
        sealed records of *stream*."""
        if self.phase is not Phase.HANDSHAKE:
            raise ValueError(f"keys are installed during the handshake, not in {self.phase}")
        self.sealed = stream
        self.phase = Phase.SEALED

    def end_handshake(self) -> None:
        """The handshake is over: plain frames follow the current frame (nothing changes
        once records are sealed)."""
        if self.phase is Phase.HANDSHAKE:
            self.phase = Phase.PLAIN

    # bytes in ----------------------------------------------------------------------------------
    def receive_data(self, data: bytes | bytearray | memoryview) -> Iterator[Frame]:
        """The frames *data* completes, one by one, split across reads as they come.

        During the handshake each frame is read alone, so the owner can end the handshake
        before the next one; the bytes behind it are then read as the next phase. Raises
        :class:`MalformedFrame` (:class:`BadRecord`) for malformed input; after that the
        stream cannot be trusted and must not be read further.
        """
        if self.phase is Phase.HANDSHAKE:
            buf = self._hs
            buf += data
            while self.phase is Phase.HANDSHAKE:
                frame = take_frame(buf, self.frames.max_payload)
                if frame is None:
                    return
                view = memoryview(frame)
                yield view[:HEADER_SIZE], view[HEADER_SIZE:]
            data = self.take_buffered()
            if not data:
                return
        elif self._hs:  # bytes past the switch that the owner left to the codec
            data = self.take_buffered() + bytes(data)
        feed = self.frames.feed
        for chunk in self.plaintext(data):
            yield from feed(chunk)  # type: ignore[arg-type]

    def receive_frames(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """After the handshake: every frame *data* completes, as one list.

        The same frames :meth:`receive_data` would yield once the handshake is over, without
        a generator resumed per frame (for a reader, like flowlib's client, that takes each
        read's frames at once). Raises :class:`MalformedFrame` (:class:`BadRecord`) like it;
        ``ValueError`` during the handshake, whose frames must be read one at a time.
        """
        if self.phase is Phase.HANDSHAKE:
            raise ValueError("the handshake's frames are read with receive_data")
        if self._hs:  # bytes past the switch that the owner left to the codec
            data = self.take_buffered() + bytes(data)
        if self.sealed is None:
            return self.frames.feed(data)  # type: ignore[arg-type]
        feed = self.frames.feed
        frames: list[Frame] = []
        for chunk in self.plaintext(data):
            frames += feed(chunk)  # type: ignore[arg-type]
        return frames

    def plaintext(self, data: bytes | bytearray | memoryview
                  ) -> list[bytes | bytearray | memoryview]:
        """After the handshake: the frame stream's bytes in *data*, the opened records'
        plaintext when sealed (possibly none yet), *data* itself when plain. For a reader
        that splits frames itself; raises :class:`BadRecord`."""
        sealed = self.sealed
        if sealed is None:
            return [data]
        try:
            return sealed.decode(data)  # type: ignore[return-value]
        except LinkSecurityError as exc:
            raise BadRecord(exc) from None

    def take_buffered(self) -> bytes:
        """The bytes received past the end of the handshake and not yet read (at most one
        read's worth): for an owner that goes on reading the stream itself, e.g. the plain
        stream in place. Empty during the handshake until it ends."""
        if self.phase is Phase.HANDSHAKE or not self._hs:
            return b""
        rest = bytes(self._hs)
        self._hs.clear()
        return rest

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held after the handshake (non-zero at the end of the
        stream: a truncated frame)."""
        return self.frames.pending

    @property
    def pending_record(self) -> int:
        """Bytes of an incomplete sealed record held."""
        sealed = self.sealed
        return sealed.decoder.pending if sealed is not None else 0

    # bytes out ---------------------------------------------------------------------------------
    def send_data(self, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
        """What goes on the wire for *data* (whole frames, or any run of the frame stream):
        one sealed record once keys are installed, *data* itself before that."""
        sealed = self.sealed
        return data if sealed is None else sealed.encode(data)
