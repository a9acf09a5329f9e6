"""Large messages: fragmented by the sender, reassembled by each receiving client.

Seed 000 (Brachman, ch. 5.1) fragments a message that exceeds the maximum fragment size into
fixed-length fragments, each a complete message carrying the original message's identifier
and its place in it (``StartingByteNumber, OriginalMessageSize``); the recipient reassembles,
restarting a timer at every fragment and aborting when no fragment comes in time. flowlib
does the same above the routers, which never see anything but ordinary frames.

Where the fragment marker goes, and why
---------------------------------------
The routers carry a 24-byte header that flowlib cannot extend, and every field of it already
has a meaning the routers act on (band filtering, locality and TTL are rewritten per hop), so
the marker must be in the payload. The options:

* a dedicated band for fragments: loses the application's band, and with it the routers'
  band filtering and the receivers' per-band listeners;
* a prefix on *every* payload: costs every message bytes and breaks interoperability with
  raw senders and receivers that speak the plain wire format;
* **a prefix only on fragmented messages** (chosen): plain messages stay byte-for-byte what
  the application sent, and travel on their own band. A receiver looks at a payload only
  when its first byte is ``0xFF`` (one comparison on the receive path). The magic begins with
  ``0xFF`` because UTF-8 text, JSON and flownet control payloads (which start with the
  version byte 1) never do.

Ambiguity is removed by escaping: a plain payload that *happens* to start with the magic is
sent with the 5-byte escape prefix ``MAGIC 0x00``, which receivers strip. So every payload a
flowlib sender emits is unambiguous; only a raw (non-flowlib) sender's payload starting with
the four magic bytes would be misread, and then only if what follows parses as a fragment.

Wire format (network byte order), inside the payload of an ordinary frame on the
application's band::

    escaped plain payload:   "\\xffFRG" | 0x00 | the original payload
    fragment:                "\\xffFRG" | 0x01 | origin (8) | message id (4) | index (4)
                             | count (4) | fragment size (4) | total length (8) | data

* ``origin``: 64 random bits chosen per client (the frame header does not name the sender);
  with the message id it names the message, so fragments of interleaved senders, and of
  several messages of one sender, never mix;
* ``message id``: per-origin counter;
* ``index`` of this fragment, 0 .. ``count`` - 1, and ``count`` = ceil(total / fragment size);
* ``fragment size``: data bytes in every fragment but the last, so the fragment's offset is
  ``index * fragment size`` (Brachman's starting byte number) and a receiver can place a
  fragment, whatever order they come in, without having seen the others;
* ``total length`` of the original message (Brachman's OriginalMessageSize): the receiver
  knows from it when the message is complete (it never sizes a buffer from it: a claim costs
  nothing until data arrives).

The fragment header is 37 bytes; a fragment's data is the router's maximum payload (or the
client's ``fragment_size``) minus that. Receivers check every field (index < count, count
consistent with total and fragment size, data length exactly what the index implies, the same
count/size/total on every fragment of a message); a fragment that fails is dropped and counted.

Reassembly is bounded, and the bound counts what is really held, never what a fragment
claims. A message's buffer grows with the data that arrived (fragments in order are appended
to it; a fragment ahead of a gap is held alone until the gap fills), and the reassembler
charges every incomplete message its bookkeeping (:data:`PARTIAL_COST` per message,
:data:`FRAGMENT_COST` per fragment held out of order) plus the bytes it holds, against
``max_reassembly_bytes``. A message whose claimed total is over ``max_message_size``, or
could not be reassembled within ``max_reassembly_bytes`` even alone (its bytes plus the
bookkeeping of every fragment it claims), is refused at its first fragment, before anything
is allocated; a message whose next fragment would take the memory in use over the limit is
dropped there and its memory released (the rest of a refused or dropped message is ignored
quietly); an incomplete message whose last fragment came more than ``reassembly_timeout``
seconds ago is dropped. Each drop is counted (:attr:`Reassembler.drops`, by reason) and
reported by a notice on the overflow band (see :mod:`flowlib.notices`).

Duplicates are harmless: a fragment already held is ignored, and a client remembers the last
few thousand completed messages, so when a sender that failed over to another router in the
middle of a message sends it again (same message id), receivers that had it complete ignore
the copy and receivers that had lost fragments fill them in.
"""

from __future__ import annotations

import struct
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from flowrouter.wire.appdgram import MAX_PAYLOAD as DATAGRAM_MAX_PAYLOAD

from .errors import MessageTooLarge

MAGIC = b"\xffFRG"
KIND_ESCAPE = 0x00
KIND_FRAGMENT = 0x01
ESCAPE_PREFIX = MAGIC + bytes([KIND_ESCAPE])
ESCAPE_SIZE = len(ESCAPE_PREFIX)

_FRAG = struct.Struct("!4sBQIIIIQ")
FRAGMENT_HEADER_SIZE = _FRAG.size  #: 37 bytes
assert FRAGMENT_HEADER_SIZE == 37

DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024  #: largest message a client sends or reassembles
DEFAULT_MAX_REASSEMBLY_BYTES = 128 * 1024 * 1024  #: reassembly memory per client
DEFAULT_REASSEMBLY_TIMEOUT = 10.0  #: seconds without a new fragment before a message is dropped
_REMEMBER = 4096  #: completed/refused message ids kept to ignore late copies


def needs_escape(payload: bytes | bytearray | memoryview) -> bool:
    """True if a plain payload starts with the magic and so must be sent escaped."""
    return len(payload) >= 4 and payload[0] == 0xFF and payload[:4] == MAGIC


def plan_message(payload: bytes | bytearray | memoryview, size: int, max_payload: int,
                 fragment: bool | None, max_message_size: int,
                 fragment_size: int | None) -> int:
    """How to send a message of *size* bytes over a link whose frames carry *max_payload*:
    0 plain, -1 plain with the escape prefix, n > 0 in fragments of n data bytes. Raises
    :class:`~flowlib.errors.MessageTooLarge`.

    Unless told otherwise (*fragment*, *fragment_size*), a message is fragmented above
    what a datagram link carries too (:data:`~flowrouter.wire.appdgram.MAX_PAYLOAD`, 65,451
    bytes), so whatever a TCP sender sends also reaches receivers on datagram links."""
    auto = min(max_payload, DATAGRAM_MAX_PAYLOAD)
    escape = needs_escape(payload)
    wire = size + ESCAPE_SIZE if escape else size
    if fragment is None:
        fragment = wire > auto
    if not fragment or size == 0:
        if wire > max_payload:
            raise MessageTooLarge(size, max_payload)
        return -1 if escape else 0
    if size > max_message_size:
        raise MessageTooLarge(size, max_message_size, "max_message_size")
    limit = auto if fragment_size is None else min(fragment_size, max_payload)
    data = limit - FRAGMENT_HEADER_SIZE
    if data < 1:
        raise MessageTooLarge(size, max_payload)
    return data


def fragment_count(total: int, fragment_size: int) -> int:
    return -(-total // fragment_size)


def fragment_header(origin: int, msg_id: int, index: int, count: int, fragment_size: int,
                    total: int) -> bytes:
    return _FRAG.pack(MAGIC, KIND_FRAGMENT, origin, msg_id, index, count, fragment_size, total)


def iter_fragments(view: memoryview, origin: int, msg_id: int, fragment_size: int
                   ) -> Iterator[tuple[bytes, memoryview]]:
    """(fragment header, data view) for every fragment of *view*, in order (no copies)."""
    total = len(view)
    count = fragment_count(total, fragment_size)
    for index in range(count):
        off = index * fragment_size
        yield (fragment_header(origin, msg_id, index, count, fragment_size, total),
               view[off:off + fragment_size])


class FragmentDropped(Exception):
    """A fragment (or the message it belongs to) was refused; ``reason`` is a short tag:
    ``bad-fragment``, ``too-large`` or ``memory``."""

    def __init__(self, reason: str, detail: str, origin: int = 0, msg_id: int = 0,
                 total: int = 0) -> None:
        self.reason = reason
        self.detail = detail
        self.origin = origin
        self.msg_id = msg_id
        self.total = total
        super().__init__(detail)


@dataclass(frozen=True, slots=True)
class Expired:
    """An incomplete message dropped by :meth:`Reassembler.expire`."""

    flow_key: bytes
    band: int
    origin: int
    msg_id: int
    received: int  #: fragments that had arrived
    count: int
    total: int


#: bookkeeping charged to every incomplete message (its record, key and table entries)
PARTIAL_COST = 768
#: bookkeeping charged to every fragment held out of order (its bytes object and entry)
FRAGMENT_COST = 128


class _Partial:
    """One incomplete message: the data in order so far, and fragments ahead of a gap."""

    __slots__ = ("buf", "next", "ahead", "ahead_bytes", "received", "count", "fsize", "total",
                 "last", "cost")

    def __init__(self, total: int, count: int, fsize: int, now: float) -> None:
        self.buf = bytearray()  #: fragments 0 .. next - 1, grown as they come
        self.next = 0  #: the index of the first fragment not yet in ``buf``
        self.ahead: dict[int, bytes] = {}  #: fragments past a gap, by index
        self.ahead_bytes = 0
        self.received = 0
        self.count = count
        self.fsize = fsize
        self.total = total
        self.last = now
        self.cost = PARTIAL_COST  #: what it is charged for now (see :meth:`charge`)

    def charge(self) -> int:
        """The memory it holds: the buffer as allocated, the held fragments, bookkeeping."""
        return (PARTIAL_COST + self.buf.__sizeof__() + self.ahead_bytes
                + FRAGMENT_COST * len(self.ahead))

    def add(self, index: int, data: memoryview | bytes) -> None:
        """Take fragment *index* (not held yet): append it, and what waited behind it."""
        if index != self.next:
            self.ahead[index] = bytes(data)
            self.ahead_bytes += len(data)
            return
        buf = self.buf
        buf += data
        self.next += 1
        ahead = self.ahead
        while ahead and self.next in ahead:
            chunk = ahead.pop(self.next)
            self.ahead_bytes -= len(chunk)
            buf += chunk
            self.next += 1

    def holds(self, index: int) -> bool:
        return index < self.next or index in self.ahead


Key = tuple[bytes, int, int, int]  # flow key, band, origin, message id


class Reassembler:
    """Per-client reassembly of fragmented messages, bounded in memory and time.

    Sans-I/O: :meth:`feed` takes a fragment and the time, :meth:`expire` drops what timed
    out; the client drives both and turns refusals into counters and notices. :attr:`used`
    is the memory incomplete messages hold now, bookkeeping included; it never exceeds
    ``max_bytes``.
    """

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 max_bytes: int = DEFAULT_MAX_REASSEMBLY_BYTES,
                 timeout: float = DEFAULT_REASSEMBLY_TIMEOUT) -> None:
        self.max_message_size = max_message_size
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.partials: dict[Key, _Partial] = {}
        #: bytes held by incomplete messages, bookkeeping included (see :meth:`feed`)
        self.used = 0
        #: the most incomplete messages held at once (a statistic)
        self.peak = 0
        #: the largest :attr:`used` ever was (a statistic)
        self.peak_used = 0
        #: messages dropped, by reason (``bad-fragment``, ``too-large``, ``memory``,
        #: ``reassembly-timeout``)
        self.drops: Counter[str] = Counter()
        self._finished: OrderedDict[Key, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.partials)

    def _remember(self, key: Key) -> None:
        finished = self._finished
        finished[key] = None
        if len(finished) > _REMEMBER:
            finished.popitem(last=False)

    def _refuse(self, reason: str, detail: str, origin: int, msg_id: int, total: int
                ) -> FragmentDropped:
        self.drops[reason] += 1
        return FragmentDropped(reason, detail, origin, msg_id, total)

    def _release(self, key: Key) -> _Partial:
        part = self.partials.pop(key)
        self.used -= part.cost
        return part

    def _out_of_memory(self, key: Key, part: _Partial, new: bool) -> FragmentDropped:
        """Drop the message *part* of *key* (its next fragment does not fit): release it."""
        if not new:
            self._release(key)
        self._remember(key)
        return self._refuse("memory", f"message of {part.total} bytes dropped with "
                                      f"{part.received} of {part.count} fragments: its next "
                                      f"would take the reassembly memory over "
                                      f"{self.max_bytes} bytes ({self.used} in use)",
                            key[2], key[3], part.total)

    def feed(self, flow_key: bytes, band: int, payload: memoryview | bytes, now: float
             ) -> bytes | None:
        """Add one fragment (the whole payload, magic included).

        Returns the message once complete, ``None`` while it is not (or for a duplicate);
        raises :class:`FragmentDropped` for a malformed fragment or a refused message (at
        its first fragment, or at the fragment that would take the memory in use over the
        limit: the rest of a refused message is ignored quietly).
        """
        if len(payload) < FRAGMENT_HEADER_SIZE:
            raise self._refuse("bad-fragment", f"fragment of {len(payload)} bytes is shorter "
                                               f"than the {FRAGMENT_HEADER_SIZE}-byte header",
                               0, 0, 0)
        _, _, origin, msg_id, index, count, fsize, total = _FRAG.unpack_from(payload)
        data = payload[FRAGMENT_HEADER_SIZE:]
        if fsize < 1 or total < 1 or count != fragment_count(total, fsize) or index >= count:
            raise self._refuse("bad-fragment", f"inconsistent fragment header (index {index}, "
                                               f"count {count}, fragment size {fsize}, total "
                                               f"{total})", origin, msg_id, total)
        off = index * fsize
        if len(data) != min(fsize, total - off):
            raise self._refuse("bad-fragment", f"fragment {index} of {count} carries "
                                               f"{len(data)} bytes, expected "
                                               f"{min(fsize, total - off)}",
                               origin, msg_id, total)
        key = (flow_key, band, origin, msg_id)
        part = self.partials.get(key)
        if part is None:
            if key in self._finished:
                return None  # a late copy of a message completed (or refused) already
            if total > self.max_message_size:
                self._remember(key)
                raise self._refuse("too-large", f"message of {total} bytes exceeds "
                                                f"max_message_size ({self.max_message_size})",
                                   origin, msg_id, total)
            worst = PARTIAL_COST + total + FRAGMENT_COST * count
            if worst > self.max_bytes:
                self._remember(key)
                raise self._refuse("too-large", f"message of {total} bytes in {count} "
                                                f"fragments could need {worst} bytes to "
                                                f"reassemble, over the reassembly memory "
                                                f"({self.max_bytes})", origin, msg_id, total)
            if count == 1:
                self._remember(key)
                return bytes(data)  # a message in one fragment: nothing to hold
            part = _Partial(total, count, fsize, now)
        elif (count, fsize, total) != (part.count, part.fsize, part.total):
            raise self._refuse("bad-fragment", "fragment disagrees with the earlier "
                                               "fragments of its message", origin, msg_id,
                               total)
        elif part.holds(index):
            part.last = now
            return None
        new = key not in self.partials
        growth = len(data) + (FRAGMENT_COST if index != part.next else 0)
        if self.used + (part.cost if new else 0) + growth > self.max_bytes:
            raise self._out_of_memory(key, part, new)
        if new:
            self.partials[key] = part
            self.used += part.cost
            self.peak = max(self.peak, len(self.partials))
        part.last = now
        part.add(index, data)
        part.received += 1
        cost = part.charge()
        self.used += cost - part.cost
        part.cost = cost
        if self.used > self.max_bytes:  # the buffer's allocation grew past the estimate
            raise self._out_of_memory(key, part, False)
        if self.used > self.peak_used:
            self.peak_used = self.used
        if part.received < part.count:
            return None
        self._release(key)
        self._remember(key)
        return bytes(part.buf)

    def expire(self, now: float) -> list[Expired]:
        """Drop every incomplete message whose last fragment is ``timeout`` seconds old."""
        out: list[Expired] = []
        limit = self.timeout
        for key, part in list(self.partials.items()):
            if now - part.last >= limit:
                self._release(key)
                self.drops["reassembly-timeout"] += 1
                out.append(Expired(key[0], key[1], key[2], key[3], part.received, part.count,
                                   part.total))
        return out

    def drop_flow(self, flow_key: bytes) -> None:
        """Forget the incomplete messages of a flow nobody here listens to any more."""
        for key in [k for k in self.partials if k[0] == flow_key]:
            self._release(key)


__all__ = ["MAGIC", "KIND_ESCAPE", "KIND_FRAGMENT", "ESCAPE_PREFIX", "FRAGMENT_HEADER_SIZE",
           "DEFAULT_MAX_MESSAGE_SIZE", "DEFAULT_MAX_REASSEMBLY_BYTES",
           "DEFAULT_REASSEMBLY_TIMEOUT", "PARTIAL_COST", "FRAGMENT_COST", "Reassembler",
           "FragmentDropped", "Expired",
           "iter_fragments", "fragment_header", "fragment_count", "needs_escape"]
