"""Band allocation and band masks: the one place that says what each band is for.

A flow has 128 bands. Routers consume the low bands themselves (they never reach an
application); bands 16..31 carry administration that applications *can* see (heartbeats,
faults, overflow notices); bands 32..127 carry application data. Of the administration bands,
17..19 originate only at routers (:data:`ROUTER_ONLY_BANDS`): routers drop them when an
application sends them.

Inside the router a mask is a plain ``int`` (bit *b* set = band *b* wanted) because a single
``&`` is the cheapest possible filter on the forwarding path. :class:`BandMask` wraps that int
for the public API, where parsing, printing and validation matter more than nanoseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from bitarray import bitarray

NUM_BANDS = 128

# --- router bands (< 16): consumed hop by hop, never delivered to applications ---------------
BAND_MEMBERSHIP = 0  #: join / leave / mask advertisements: the flow's multicast-tree band
BAND_GC = 1  #: garbage-collection pings (down the tree) and pongs (up)
BAND_LS = 2  #: location-service coordination between LS members
ROUTER_BANDS_END = 16  #: bands below this are router administration

# --- administration visible to applications (16..31) ----------------------------------------
BAND_HEARTBEAT = 16  #: endpoint heartbeats (flowlib.heartbeat)
BAND_FAULT = 17  #: link faults and tripped limits, emitted by routers and flowlib
BAND_OVERFLOW = 18  #: receive-queue overflow notices
BAND_APP_MEMBERSHIP = 19  #: application-level membership announcements
BAND_REPAIR = 20  #: retransmission requests and repairs (reliable layers such as IGO)
BAND_ORDER = 21  #: ordering-layer control (leader sequencing, stability)
#: messages between a backbone region's edges (flowrouter.core.regions), on their inbox flows
BAND_REGION = 22
ADMIN_BANDS_END = 32
#: bands only routers originate: faults and tripped limits (17), overflow notices (18; flowlib
#: makes its own locally, never on the wire) and membership notices (19). A router never
#: forwards a frame on one of these that came from an application link (``drop.app-control``),
#: so what a listener gets on them was said by a router. Bands 16, 20 and 21 are the
#: applications' own control (heartbeats, repair, ordering) and pass as data.
ROUTER_ONLY_BANDS = (1 << BAND_FAULT) | (1 << BAND_OVERFLOW) | (1 << BAND_APP_MEMBERSHIP)

# --- application data (32..127) ---------------------------------------------------------------
DATA_BAND_FIRST = 32
DEFAULT_DATA_BAND = 32
DATA_BAND_LAST = NUM_BANDS - 1

ALL_BANDS = (1 << NUM_BANDS) - 1
DATA_BANDS = ALL_BANDS & ~((1 << DATA_BAND_FIRST) - 1)
ADMIN_BANDS = ((1 << ADMIN_BANDS_END) - 1) & ~((1 << ROUTER_BANDS_END) - 1)

BAND_NAMES = {
    BAND_MEMBERSHIP: "membership",
    BAND_GC: "gc",
    BAND_LS: "ls",
    BAND_HEARTBEAT: "heartbeat",
    BAND_FAULT: "fault",
    BAND_OVERFLOW: "overflow",
    BAND_APP_MEMBERSHIP: "app-membership",
    BAND_REPAIR: "repair",
    BAND_ORDER: "order",
    BAND_REGION: "region",
}
_BY_NAME = {name: band for band, name in BAND_NAMES.items()}
_BY_NAME["data"] = -1  # expands to the whole data range in BandMask.parse


def is_router_band(band: int) -> bool:
    return band < ROUTER_BANDS_END


def is_router_only(band: int) -> bool:
    """True for the bands only routers originate (see :data:`ROUTER_ONLY_BANDS`)."""
    return bool(ROUTER_ONLY_BANDS >> band & 1)


def check_band(band: int) -> int:
    """Return *band* if it is a valid band number, else raise ValueError naming the range."""
    if not isinstance(band, int) or isinstance(band, bool) or not 0 <= band < NUM_BANDS:
        raise ValueError(f"band must be an integer 0..{NUM_BANDS - 1}, got {band!r}")
    return band


class BandMask:
    """An immutable set of bands (0..127).

    Text form: comma-separated bands, ranges and names, e.g. ``"32-40,50,fault"`` or ``"data"``
    or ``"all"``. ``str()`` prints the same form back, so masks round-trip through configs,
    CLIs and logs.
    """

    __slots__ = ("_bits",)

    def __init__(self, bands: Iterable[int] | int | BandMask = ()) -> None:
        if isinstance(bands, BandMask):
            self._bits: int = bands.bits
        elif isinstance(bands, int):
            if not 0 <= bands <= ALL_BANDS:
                raise ValueError("mask integer out of range for 128 bands")
            self._bits = bands
        else:
            bits = 0
            for b in bands:
                bits |= 1 << check_band(b)
            self._bits = bits

    # constructors -------------------------------------------------------------------------
    @classmethod
    def all(cls) -> BandMask:
        return cls(ALL_BANDS)

    @classmethod
    def data(cls) -> BandMask:
        return cls(DATA_BANDS)

    @classmethod
    def from_bytes(cls, raw: bytes | memoryview) -> BandMask:
        if len(raw) != 16:
            raise ValueError(f"a band mask is 16 bytes on the wire, got {len(raw)}")
        return cls(int.from_bytes(raw, "big"))

    @classmethod
    def from_bitarray(cls, bits: bitarray) -> BandMask:
        if len(bits) != NUM_BANDS:
            raise ValueError(f"a band mask bitarray has {NUM_BANDS} bits, got {len(bits)}")
        return cls(b for b in bits.search(bitarray("1")))

    @classmethod
    def parse(cls, text: str) -> BandMask:
        text = text.strip().lower()
        if not text:
            raise ValueError("empty band mask (use e.g. '32', '32-40,50', 'data' or 'all')")
        if text == "all":
            return cls.all()
        if text in ("none", "empty"):
            return cls()
        bits = 0
        for part in text.split(","):
            part = part.strip()
            if part == "data":
                bits |= DATA_BANDS
            elif part in _BY_NAME:
                bits |= 1 << _BY_NAME[part]
            elif "-" in part:
                lo_s, _, hi_s = part.partition("-")
                try:
                    lo, hi = int(lo_s, 0), int(hi_s, 0)
                except ValueError:
                    raise ValueError(f"bad band range {part!r} in mask {text!r}") from None
                if lo > hi:
                    raise ValueError(f"band range {part!r} runs backwards")
                check_band(lo)
                check_band(hi)
                bits |= ((1 << (hi + 1)) - 1) & ~((1 << lo) - 1)
            else:
                try:
                    bits |= 1 << check_band(int(part, 0))
                except ValueError as exc:
                    raise ValueError(f"bad band {part!r} in mask {text!r}: {exc}") from None
        return cls(bits)

    # views ----------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self._bits

    def to_bytes(self) -> bytes:
        return self._bits.to_bytes(16, "big")

    def to_bitarray(self) -> bitarray:
        out = bitarray(NUM_BANDS)
        out.setall(0)
        for b in self:
            out[b] = 1
        return out

    def __contains__(self, band: object) -> bool:
        return isinstance(band, int) and 0 <= band < NUM_BANDS and bool(self._bits >> band & 1)

    def __iter__(self) -> Iterator[int]:
        bits, b = self._bits, 0
        while bits:
            if bits & 1:
                yield b
            bits >>= 1
            b += 1

    def __len__(self) -> int:
        return self._bits.bit_count()

    def __bool__(self) -> bool:
        return self._bits != 0

    def __or__(self, other: BandMask) -> BandMask:
        return BandMask(self._bits | BandMask(other)._bits)

    def __and__(self, other: BandMask) -> BandMask:
        return BandMask(self._bits & BandMask(other)._bits)

    def __sub__(self, other: BandMask) -> BandMask:
        return BandMask(self._bits & ~BandMask(other)._bits)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BandMask) and other._bits == self._bits

    def __hash__(self) -> int:
        return hash(self._bits)

    def __str__(self) -> str:
        if self._bits == ALL_BANDS:
            return "all"
        if not self._bits:
            return "none"
        parts: list[str] = []
        run_start = prev = -2
        for b in [*self, -5]:
            if b == prev + 1:
                prev = b
                continue
            if run_start >= 0:
                parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
            run_start = prev = b
        return ",".join(parts)

    def __repr__(self) -> str:
        return f"BandMask({str(self)!r})"


def mask_of(bands: BandMask | Iterable[int] | int | str) -> int:
    """Coerce anything mask-like (BandMask, iterable of bands, single band, text) to the int."""
    if isinstance(bands, BandMask):
        return bands.bits
    if isinstance(bands, str):
        return BandMask.parse(bands).bits
    if isinstance(bands, int) and not isinstance(bands, bool):
        return 1 << check_band(bands)
    return BandMask(bands).bits
