"""Sealed link records: ChaCha20-Poly1305 per direction, key updates, stream framing.
Sans-I/O; imports :mod:`flowrouter.wire.linksecrets` and ``cryptography`` only.

Each record is ChaCha20-Poly1305 with a 96-bit nonce ``0000 || counter (u64)``; the counter
travels in clear in front of the ciphertext so a receiver can refuse a replayed or reordered
record before decrypting (streams: exactly the next counter; datagrams: a 64-record
anti-replay window). On TCP each record is length-prefixed::

    length (u32, = 8 + len(ciphertext)) | counter (u64) | ciphertext + tag (16)

The counter's top 16 bits are the *key generation*, the low 48 bits the *record number*.
Record numbers count every record a direction sealed since the handshake and go on across
key updates (handshake version 3): the first record under a new key carries the number after
the last one under the old key, and the nonce (the whole counter) authenticates both. A
stream receiver therefore accepts only the next record number, under its key or the next
one, so an on-path attacker cannot delete records, reorder them or replay them, at a key
update either: holding back the last records of a generation and letting the next one
through leaves a gap in the numbers, and the link fails (``out-of-order``) instead of
silently losing them. (Version 2 restarted the number at 0 with each key, and a receiver
took "generation g+1, record 0" whatever it still expected.)

A sender moves to the next generation after ``rekey_records`` records under one key, or when
its owner calls :meth:`LinkCipher.rekey` (:class:`SecureStream` does so every
``rekey_interval`` seconds of its clock). After the last generation (65,535 updates: 227
days at one update every 5 minutes) the sender keeps its last key instead of failing the
link; a new handshake (the link re-dialled) starts a fresh series. The next key is
``HMAC-SHA256(key, b"flownet-link-v3 rekey")`` and the old key is forgotten, so a key taken
from a running router's memory opens only what was sealed since the last update. A receiver
follows the generation it sees, one step at a time on streams, and commits the new key only
after a record under it authenticates.

The plaintext of the records is the ordinary frame stream, so records need not line up with
frames (a runtime may seal a whole ``writelines`` batch as one record).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from flowrouter.wire.linksecrets import LinkSecurityError

__all__ = ["DEFAULT_MAX_RECORD", "DEFAULT_REKEY_INTERVAL", "DEFAULT_REKEY_RECORDS",
           "RECORD_OVERHEAD", "CipherError", "LinkCipher", "RecordDecoder", "RecordError",
           "SecureStream", "encode_record", "next_key"]

_REC_LEN = struct.Struct("!I")
_COUNTER = struct.Struct("!Q")
TAG_SIZE = 16
RECORD_OVERHEAD = _REC_LEN.size + _COUNTER.size + TAG_SIZE  # 28 bytes per record
#: Default largest record body (counter + ciphertext): a 64 KiB payload, its header, a tag.
DEFAULT_MAX_RECORD = _COUNTER.size + 24 + 64 * 1024 + TAG_SIZE
_MIN_RECORD = _COUNTER.size + TAG_SIZE
GEN_SHIFT = 48
SEQ_MASK = (1 << GEN_SHIFT) - 1
MAX_GENERATION = 0xFFFF
#: records under one key before the sender moves to the next
DEFAULT_REKEY_RECORDS = 1 << 24
#: seconds a :class:`SecureStream` with a clock keeps one sending key
DEFAULT_REKEY_INTERVAL = 300.0
#: a datagram receiver follows at most this many key generations at once
_MAX_GEN_JUMP = 4
_REKEY_LABEL = b"flownet-link-v3 rekey"


class CipherError(LinkSecurityError):
    """A sealed record failed: ``bad-tag``, ``replay``, ``out-of-order``, ``truncated``,
    ``exhausted`` (every key generation used up: reconnect)."""


class RecordError(LinkSecurityError):
    """The encrypted stream's framing is broken: ``oversized`` or ``undersized``."""


def next_key(key: bytes) -> bytes:
    """The key of the next generation (one-way: the old key cannot be recovered from it)."""
    return hmac.new(key, _REKEY_LABEL, hashlib.sha256).digest()


class LinkCipher:
    """ChaCha20-Poly1305 per direction with a counter nonce and key generations.

    ``seal(frame) -> counter (8) | ciphertext | tag (16)``; ``open`` reverses it and refuses
    replays: with ``ordered=True`` (TCP) the record number must be exactly the next one,
    under the current key generation or the next (``replay`` if lower, ``out-of-order``
    otherwise: a deleted, reordered or repeated record always fails); with ``ordered=False``
    (datagrams) any counter newer than the last 64 received is accepted once.
    """

    WINDOW = 64

    __slots__ = ("_rx", "_rx_bits", "_rx_gen", "_rx_key", "_rx_next", "_sent", "_tx",
                 "_tx_ctr", "_tx_in_gen", "_tx_key", "on_rekey", "ordered", "rekey_records")

    def __init__(self, send_key: bytes, recv_key: bytes, ordered: bool = True,
                 rekey_records: int = DEFAULT_REKEY_RECORDS) -> None:
        if not 0 < rekey_records <= SEQ_MASK:
            raise ValueError(f"rekey_records must be 1..{SEQ_MASK}")
        self._tx_key = bytes(send_key)
        self._rx_key = bytes(recv_key)
        self._tx = ChaCha20Poly1305(self._tx_key)
        self._rx = ChaCha20Poly1305(self._rx_key)
        self._tx_ctr = 0
        self._tx_in_gen = 0  #: records sealed under the current sending key
        self._sent = 0
        self._rx_gen = 0
        self._rx_next = 0  #: lowest counter above the window (ordered: the next expected)
        self._rx_bits = 0  #: unordered: bit i set = counter (_rx_next - 1 - i) seen
        self.ordered = ordered
        self.rekey_records = rekey_records
        #: called with "sent" / "received" each time a direction moves to a new key (the
        #: owner counts them); None: nobody is told
        self.on_rekey: Callable[[str], None] | None = None

    @property
    def sent(self) -> int:
        """Records sealed so far (all generations)."""
        return self._sent

    @property
    def tx_generation(self) -> int:
        return self._tx_ctr >> GEN_SHIFT

    @property
    def can_rekey(self) -> bool:
        """False once every key generation is used: the last key then stays in use (for up
        to 2^48 records) rather than the link failing; a new handshake starts over."""
        return self._tx_ctr >> GEN_SHIFT < MAX_GENERATION

    @property
    def rx_generation(self) -> int:
        return self._rx_gen

    def rekey(self) -> None:
        """Seal from now on under the next key generation and forget the current key."""
        gen = (self._tx_ctr >> GEN_SHIFT) + 1
        if gen > MAX_GENERATION:
            raise CipherError("exhausted", "every key generation is used; reconnect")
        self._tx_key = next_key(self._tx_key)
        self._tx = ChaCha20Poly1305(self._tx_key)
        # the record number goes on: the receiver sees any gap at the update
        self._tx_ctr = gen << GEN_SHIFT | self._tx_ctr & SEQ_MASK
        self._tx_in_gen = 0
        if self.on_rekey is not None:
            self.on_rekey("sent")

    def seal(self, frame: bytes | bytearray | memoryview) -> bytes:
        if self._tx_in_gen >= self.rekey_records and self.can_rekey:
            self.rekey()
        ctr = self._tx_ctr
        if ctr & SEQ_MASK == SEQ_MASK:
            raise CipherError("exhausted", "every record number is used; reconnect")
        self._tx_ctr = ctr + 1
        self._tx_in_gen += 1
        self._sent += 1
        c = _COUNTER.pack(ctr)
        return c + self._tx.encrypt(b"\0\0\0\0" + c, bytes(frame), None)

    def seal_record(self, frame: bytes | bytearray | memoryview) -> bytes:
        """``seal`` plus the u32 length prefix used on streams."""
        return encode_record(self.seal(frame))

    def _key_for(self, gen: int) -> tuple[ChaCha20Poly1305, bytes | None]:
        """The AEAD for generation *gen* and the key to commit if the record verifies."""
        if gen == self._rx_gen:
            return self._rx, None
        key = self._rx_key
        for _ in range(gen - self._rx_gen):
            key = next_key(key)
        return ChaCha20Poly1305(key), key

    def open(self, record: bytes | bytearray | memoryview) -> bytes:
        if len(record) < _MIN_RECORD:
            raise CipherError("truncated", f"sealed record of {len(record)} bytes")
        (ctr,) = _COUNTER.unpack_from(record)
        gen = ctr >> GEN_SHIFT
        if self.ordered:
            # the next record number, under this key or the next: nothing skipped, ever
            if ctr != self._rx_next and ctr != self._rx_next + (1 << GEN_SHIFT):
                raise CipherError("replay" if ctr < self._rx_next else "out-of-order",
                                  f"record {ctr & SEQ_MASK} of key generation {gen}, "
                                  f"expected record {self._rx_next & SEQ_MASK} of "
                                  f"generation {self._rx_gen} or {self._rx_gen + 1}")
        elif gen < self._rx_gen or gen > self._rx_gen + _MAX_GEN_JUMP:
            raise CipherError("replay" if gen < self._rx_gen else "out-of-order",
                              f"record of key generation {gen}, receiving {self._rx_gen}")
        elif ctr < self._rx_next:
            age = self._rx_next - 1 - ctr
            if age >= self.WINDOW or self._rx_bits >> age & 1:
                raise CipherError("replay", f"record {ctr:#x} already seen or too old")
        aead, new_key = self._key_for(gen)
        try:
            plain = aead.decrypt(b"\0\0\0\0" + bytes(record[:8]), bytes(record[8:]), None)
        except InvalidTag:
            raise CipherError("bad-tag", "record failed authentication") from None
        if new_key is not None:  # the peer moved on: so do we, and the old key is gone
            self._rx_key, self._rx, self._rx_gen = new_key, aead, gen
            if self.on_rekey is not None:
                self.on_rekey("received")
        if self.ordered or ctr >= self._rx_next:
            shift = ctr + 1 - self._rx_next
            self._rx_bits = ((self._rx_bits << shift) | 1) & ((1 << self.WINDOW) - 1) \
                if shift < self.WINDOW else 1
            self._rx_next = ctr + 1
        else:
            self._rx_bits |= 1 << (self._rx_next - 1 - ctr)
        return plain


def encode_record(sealed: bytes) -> bytes:
    return _REC_LEN.pack(len(sealed)) + sealed


class RecordDecoder:
    """Splits an encrypted TCP stream into sealed records (sans-I/O).

    ``feed(data)`` returns the complete records (each ``counter | ciphertext``) and raises
    :class:`RecordError` as soon as a length prefix is impossible (``oversized`` above
    *max_record*, ``undersized`` below the 24 bytes of counter and tag), before buffering
    the body. Garbage that is well framed fails later, in :meth:`LinkCipher.open`.
    """

    __slots__ = ("_buf", "max_record")

    def __init__(self, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self._buf = bytearray()
        self.max_record = max_record

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = _REC_LEN.unpack_from(buf, pos)
            if size > self.max_record:
                buf.clear()
                raise RecordError("oversized", f"record of {size} bytes exceeds "
                                               f"{self.max_record}")
            if size < _MIN_RECORD:
                buf.clear()
                raise RecordError("undersized", f"record of {size} bytes is shorter than "
                                                f"its counter and tag")
            if n - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4:pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


class SecureStream:
    """An encrypted TCP link's byte stream: frames in, records out, and back.

    ``encode(frame_bytes) -> bytes`` to write; ``decode(data) -> list[bytes]`` of decrypted
    plaintext chunks (feed them to the link's ordinary ``FrameDecoder``). Raises
    :class:`RecordError` / :class:`CipherError`; the link must then be dropped.

    With a *clock* (seconds, any monotonic origin; passed in, never read here) the sending
    key is updated before the first record sealed ``rekey_interval`` seconds or more after
    the previous update.
    """

    __slots__ = ("_clock", "_rekeyed_at", "cipher", "decoder", "rekey_interval")

    def __init__(self, cipher: LinkCipher, max_record: int = DEFAULT_MAX_RECORD, *,
                 clock: Callable[[], float] | None = None,
                 rekey_interval: float = DEFAULT_REKEY_INTERVAL) -> None:
        if rekey_interval <= 0:
            raise ValueError("rekey_interval must be positive")
        self.cipher = cipher
        self.decoder = RecordDecoder(max_record)
        self._clock = clock
        self.rekey_interval = rekey_interval
        self._rekeyed_at = clock() if clock is not None else 0.0

    def encode(self, plain: bytes | bytearray | memoryview) -> bytes:
        clock = self._clock
        if clock is not None:
            now = clock()
            if now - self._rekeyed_at >= self.rekey_interval and self.cipher.can_rekey:
                self.cipher.rekey()
                self._rekeyed_at = now
        return self.cipher.seal_record(plain)

    def decode(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        return [self.cipher.open(r) for r in self.decoder.feed(data)]
