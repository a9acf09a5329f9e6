"""The client's byte stream, both ways: bytes in -> frames, frames out -> bytes (sans-I/O).

:class:`StreamFraming` is the one interface the client protocol (:mod:`flowlib.protocol`)
has to the stream's encoding: the handshake is taken one frame at a time (after the router's
AUTH the rest of the stream may be sealed records), then frames are decoded plainly or out of
sealed records; writes become one sealed record each once the link is encrypted. Imports only
the wire layer of flowrouter.
"""

from __future__ import annotations

from typing import Any

from flowrouter.wire.header import FrameDecoder, MalformedFrame, take_frame

Frame = tuple[memoryview, memoryview]


class FramingError(Exception):
    """The router's bytes cannot be trusted (malformed frame, bad sealed record)."""


class StreamFraming:
    """One link's stream codec: :meth:`feed` bytes, :meth:`pop` frames, :meth:`encode`
    writes."""

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self.decoder = FrameDecoder(max_payload)
        #: the handshake's bytes, parsed one frame at a time (None once the handshake is over)
        self._hs: bytearray | None = bytearray()
        #: bytes that arrived after the handshake, not decoded yet
        self._rest: list[bytes] = []
        #: the record layer once the link is encrypted
        self.secure: Any = None

    @property
    def in_handshake(self) -> bool:
        return self._hs is not None

    def feed(self, data: bytes) -> None:
        """Take bytes read from the link (decoded by the next :meth:`pop`)."""
        if self._hs is not None:
            self._hs += data
        else:
            self._rest.append(data)

    def end_handshake(self, secure: Any = None) -> None:
        """The handshake is over; with *secure* (a record layer) the rest is sealed."""
        if self._hs is None:
            return
        self.secure = secure
        rest = bytes(self._hs)
        self._hs = None
        if rest:
            self._rest.insert(0, rest)

    def pop(self) -> list[Frame]:
        """The frames ready now: one at a time during the handshake, then every frame the
        fed bytes hold. Raises :class:`FramingError`."""
        if self._hs is not None:
            try:
                frame = take_frame(self._hs, self.max_payload)
            except MalformedFrame as exc:
                raise FramingError(f"malformed frame from the router: {exc}") from None
            if frame is None:
                return []
            return self._decode(frame)
        if not self._rest:
            return []
        chunks, self._rest = self._rest, []
        frames: list[Frame] = []
        for data in chunks:
            if self.secure is not None:
                from flowrouter.wire.linkauth import LinkSecurityError

                try:
                    plain = self.secure.decode(data)
                except LinkSecurityError as exc:
                    raise FramingError(f"bad sealed record from the router: {exc}") from None
                for chunk in plain:
                    frames += self._decode(chunk)
            else:
                frames += self._decode(data)
        return frames

    def _decode(self, data: bytes) -> list[Frame]:
        try:
            return self.decoder.feed(data)
        except MalformedFrame as exc:
            raise FramingError(f"malformed frame from the router: {exc}") from None

    def encode(self, buffers: list[Any]) -> list[Any]:
        """What to write for one message of *buffers* (header, payload parts)."""
        if self.secure is None:
            return buffers
        return [self.secure.encode(b"".join(buffers))]
