"""Datagram links for applications: how frames travel in UDP datagrams between a router and
an application (flowlib's ``udp://`` router addresses), sans-I/O.

A datagram is a small prefix and then **one or more whole frames** (the frames of a TCP
link, back to back; no frame is ever split across datagrams: a message larger than a frame
is fragmented by flowlib first)::

    magic "Fd" (2) | version 1 (1) | flags (1) | sequence (4) | frame | frame | ...

On a link whose handshake negotiated encryption (link keys, and either end asked), every
datagram after the handshake is **sealed**: flags bit 0 set, and the frames are one sealed
record of :class:`~flowrouter.wire.linkrecords.LinkCipher` in its datagram mode
(ChaCha20-Poly1305, a counter nonce, a 64-record anti-replay window: a datagram may be lost
or come late, never be forged, altered or replayed). Once a side seals, it takes a plain
datagram only when it holds nothing but handshake repeats (HELLO, AUTH: what the other side
sends again until it hears the last step), so nothing can be injected in clear.

Each side numbers the datagrams it sends on a link, 1, 2, 3, ...; the receiver counts the
gaps (:class:`DatagramSequence`): datagram links lose instead of queueing, and the loss is
visible. Anything that is not a prefix followed by whole, valid frames is refused as a
whole (:func:`split_frames` raises :class:`~flowrouter.wire.header.MalformedFrame`): one bad
datagram costs itself, never its neighbours (:func:`open_datagram` also unseals).
:class:`DatagramPacker` packs outgoing frames into as few datagrams as fit, sealed when it
holds a cipher. May import the standard library and :mod:`flowrouter.wire`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from flowrouter.wire import control as C
from flowrouter.wire.header import HEADER_SIZE, MalformedFrame, validate_header
from flowrouter.wire.linkrecords import DEFAULT_REKEY_INTERVAL, LinkCipher
from flowrouter.wire.linksecrets import LinkSecurityError

MAGIC = b"Fd"
VERSION = 1
FLAG_SEALED = 0x01
_PREFIX = struct.Struct("!2sBBI")
PREFIX_SIZE = _PREFIX.size  #: 8 bytes
#: what sealing adds to a datagram (the record's counter and tag)
SEAL_OVERHEAD = 8 + 16
#: the largest datagram (IPv4's UDP payload limit)
MAX_DATAGRAM = 65507
#: the largest frame payload a datagram link carries, sealed or not
MAX_PAYLOAD = MAX_DATAGRAM - PREFIX_SIZE - SEAL_OVERHEAD - HEADER_SIZE
_HANDSHAKE = (C.MsgType.HELLO, C.MsgType.AUTH)


def prefix(seq: int, sealed: bool = False) -> bytes:
    return _PREFIX.pack(MAGIC, VERSION, FLAG_SEALED if sealed else 0, seq & 0xFFFFFFFF)


def check_frames(body: memoryview, max_payload: int = MAX_PAYLOAD) -> memoryview:
    """*body* if it is one or more whole, valid frames; MalformedFrame otherwise."""
    n = len(body)
    if n < HEADER_SIZE:
        raise MalformedFrame("bad-datagram", f"datagram of {n} bytes holds no frame")
    pos = 0
    while pos < n:
        if n - pos < HEADER_SIZE:
            raise MalformedFrame("bad-datagram", f"{n - pos} bytes after the last frame")
        end = pos + HEADER_SIZE + validate_header(body, pos, max_payload)
        if end > n:
            raise MalformedFrame("bad-datagram", "a frame runs past the datagram's end")
        pos = end
    return body


def _prefix(view: memoryview) -> tuple[int, bool]:
    if len(view) < PREFIX_SIZE:
        raise MalformedFrame("bad-datagram", f"datagram of {len(view)} bytes")
    magic, version, flags, seq = _PREFIX.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        raise MalformedFrame("bad-datagram", "not a flownet datagram (bad magic or version)")
    return seq, bool(flags & FLAG_SEALED)


def split_frames(datagram: bytes | memoryview, max_payload: int = MAX_PAYLOAD
                 ) -> tuple[int, memoryview]:
    """The sequence number and the frames of a plain datagram, checked whole;
    MalformedFrame otherwise."""
    return open_datagram(datagram, None, max_payload)


def handshake_only(frames: memoryview) -> bool:
    """Whether checked *frames* hold nothing but HELLO and AUTH on the link-local flow."""
    pos, n = 0, len(frames)
    while pos < n:
        end = pos + HEADER_SIZE + int.from_bytes(frames[pos + 16:pos + 20], "big")
        if frames[pos + 20] != 0 or bytes(frames[pos + 8:pos + 12]) != b"\0\0\0\0" \
                or end - pos < HEADER_SIZE + 2 or frames[pos + HEADER_SIZE + 1] not in _HANDSHAKE:
            return False
        pos = end
    return True


def open_datagram(datagram: bytes | memoryview, cipher: LinkCipher | None,
                  max_payload: int = MAX_PAYLOAD) -> tuple[int, memoryview]:
    """The sequence number and the checked frames of a datagram, unsealed with *cipher*
    when the link is sealed (a plain one is then taken only if it holds nothing but
    handshake repeats). MalformedFrame (``bad-datagram``, ``bad-record``: sealing failed,
    ``unsealed``: plain where sealed was due) otherwise."""
    view = memoryview(datagram)
    seq, sealed = _prefix(view)
    body = view[PREFIX_SIZE:]
    if sealed:
        if cipher is None:
            raise MalformedFrame("bad-datagram", "a sealed datagram before the keys")
        try:
            body = memoryview(cipher.open(body))
        except LinkSecurityError as exc:
            raise MalformedFrame("bad-record", str(exc)) from None
    frames = check_frames(body, max_payload)
    if cipher is not None and not sealed and not handshake_only(frames):
        raise MalformedFrame("unsealed", "a plain datagram on a sealed link")
    return seq, frames


def frame_spans(buffers: Iterable[Any]) -> list[bytes]:
    """Whole frames out of buffers that hold whole frames back to back (a frame may be a
    header and its payload in several buffers): each frame as one bytes object."""
    data = b"".join(bytes(b) if not isinstance(b, bytes) else b for b in buffers)
    out: list[bytes] = []
    pos, n = 0, len(data)
    while pos + HEADER_SIZE <= n:
        end = pos + HEADER_SIZE + int.from_bytes(data[pos + 16:pos + 20], "big")
        out.append(data[pos:end])
        pos = end
    return out


class DatagramSequence:
    """The receiving side's count of one link's datagram numbers: losses (gaps), late
    arrivals, duplicates (a datagram is still taken when late: frames carry no order
    promise beyond their flow's)."""

    __slots__ = ("highest", "received", "lost", "late")

    def __init__(self) -> None:
        self.highest = 0
        self.received = 0
        self.lost = 0  #: datagrams skipped over (a late one takes itself off again)
        self.late = 0  #: datagrams that came after a later one

    def seen(self, seq: int) -> int:
        """Note datagram *seq*; the number newly counted lost (0 if none)."""
        self.received += 1
        if self.highest == 0:
            self.highest = seq
            return 0
        ahead = (seq - self.highest) & 0xFFFFFFFF
        if ahead == 0:
            return 0
        if ahead < 0x80000000:
            if seq < self.highest:
                ahead -= 1  # the numbers wrapped, and 0 is never used
            self.highest = seq
            self.lost += ahead - 1
            return ahead - 1
        self.late += 1
        if self.lost:
            self.lost -= 1
        return 0


class DatagramPacker:
    """Packs frames into numbered datagrams of at most ``size`` bytes (a frame that alone
    is larger goes alone, as large as it is), each sealed once :meth:`seal_with` gave it
    the link's cipher. The sending key moves on every *rekey_interval* seconds of the
    clock the caller passes (and every ``rekey_records`` datagrams, the cipher's own rule),
    so a key taken from memory opens only what was sealed since."""

    __slots__ = ("size", "seq", "cipher", "rekey_interval", "keyed_at")

    def __init__(self, size: int = MAX_DATAGRAM,
                 rekey_interval: float = DEFAULT_REKEY_INTERVAL) -> None:
        self.size = size
        self.seq = 0
        #: seals every datagram from now on (set when the handshake installed keys)
        self.cipher: LinkCipher | None = None
        self.rekey_interval = rekey_interval
        self.keyed_at = 0.0

    def seal_with(self, cipher: LinkCipher | None, now: float) -> None:
        """Seal every datagram from now on with *cipher* (None: nothing changes)."""
        if cipher is not None and self.cipher is None:
            self.cipher, self.keyed_at = cipher, now

    def pack(self, frames: Iterable[bytes], now: float = 0.0) -> list[bytes]:
        out: list[bytes] = []
        parts: list[bytes] = []
        used = PREFIX_SIZE + SEAL_OVERHEAD
        cipher = self.cipher
        if (cipher is not None and now - self.keyed_at >= self.rekey_interval
                and cipher.can_rekey):
            cipher.rekey()
            self.keyed_at = now
        for frame in frames:
            if parts and used + len(frame) > self.size:
                out.append(self._datagram(parts))
                parts, used = [], PREFIX_SIZE + SEAL_OVERHEAD
            parts.append(frame)
            used += len(frame)
        if parts:
            out.append(self._datagram(parts))
        return out

    def _datagram(self, parts: list[bytes]) -> bytes:
        self.seq = (self.seq + 1) & 0xFFFFFFFF or 1
        cipher = self.cipher
        if cipher is None:
            return prefix(self.seq) + b"".join(parts)
        return prefix(self.seq, True) + cipher.seal(b"".join(parts))


__all__ = ["MAGIC", "VERSION", "FLAG_SEALED", "PREFIX_SIZE", "SEAL_OVERHEAD", "MAX_DATAGRAM",
           "MAX_PAYLOAD", "prefix", "check_frames", "split_frames", "open_datagram",
           "handshake_only", "frame_spans", "DatagramSequence", "DatagramPacker"]
