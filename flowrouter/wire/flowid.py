"""FlowIDs: 128-bit flow names, their one text form, and never-reused local IDs.

Layout: ``creator (64) | LSID (32) | local (32)``, the same 16 bytes that
open every wire header. The router keys its tables by those 16 raw bytes (no parsing on the
hot path); everything user-facing uses the text form ``creator:lsid:local`` in hex, with the
canonical output zero-padded (``00000000000000a1:00000010:00000001``) and the parser
accepting unpadded fields (``a1:10:1``).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

_FLOWID = struct.Struct("!QII")

#: LSID 0 is reserved: frames with it are link-local router administration, never routed.
LSID_LINK_LOCAL = 0
RESERVED_LSIDS = frozenset({LSID_LINK_LOCAL})


@dataclass(frozen=True, slots=True, order=True)
class FlowID:
    creator: int
    lsid: int
    local: int

    def __post_init__(self) -> None:
        for name, value, bits in (("creator", self.creator, 64), ("lsid", self.lsid, 32),
                                  ("local", self.local, 32)):
            if not isinstance(value, int) or not 0 <= value < (1 << bits):
                raise ValueError(f"FlowID {name} must fit in {bits} bits, got {value!r}")

    # wire form --------------------------------------------------------------------------------
    @property
    def key(self) -> bytes:
        """The 16 wire bytes; also the router's table key."""
        return _FLOWID.pack(self.creator, self.lsid, self.local)

    @classmethod
    def from_key(cls, raw: bytes | memoryview) -> FlowID:
        if len(raw) != 16:
            raise ValueError(f"a FlowID is 16 bytes, got {len(raw)}")
        return cls(*_FLOWID.unpack(raw))

    # text form --------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{self.creator:016x}:{self.lsid:08x}:{self.local:08x}"

    @classmethod
    def parse(cls, text: str) -> FlowID:
        parts = text.strip().split(":")
        if len(parts) != 3:
            raise ValueError(
                f"bad FlowID {text!r}: expected creator:lsid:local in hex, e.g. a1:10:1")
        try:
            creator, lsid, local = (int(p, 16) for p in parts)
        except ValueError:
            raise ValueError(f"bad FlowID {text!r}: fields must be hexadecimal") from None
        return cls(creator, lsid, local)

    @property
    def is_link_local(self) -> bool:
        return self.lsid in RESERVED_LSIDS


LINK_LOCAL_FLOW = FlowID(0, LSID_LINK_LOCAL, 0)


def key_lsid(key: bytes) -> int:
    """LSID of a 16-byte flow key, without building a FlowID."""
    return int.from_bytes(key[8:12], "big")


def flow_text(key: bytes) -> str:
    """Text form of a 16-byte flow key (for logs and status)."""
    return str(FlowID.from_key(key))


class LocalIdAllocator:
    """Hands out local IDs that are never reused, even across restarts.

    The state file holds the creator ID and the next local ID. Allocation takes an exclusive
    ``flock`` so several processes on one host can share a creator ID safely, and reserves IDs
    in blocks so that the file is written (and fsynced) once per block, not once per flow. A
    crash wastes at most the rest of a block; it never hands out an ID twice.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, block: int = 64) -> None:
        if path is None:
            base = os.environ.get("FLOWNET_STATE_DIR") or os.path.join(
                os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"),
                "flownet")
            path = os.path.join(base, "creator")
        self.path = Path(path)
        self.block = max(1, block)
        self._next = 0
        self._limit = 0
        self.creator = self._reserve(0)[0]

    def _reserve(self, count: int) -> tuple[int, int]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.read(fd, 256).decode("ascii", "replace").split()
            if raw:  # only an empty file means "new creator"; anything else must parse
                try:
                    creator, nxt = (int(x, 16) for x in raw)
                except ValueError:
                    raise ValueError(
                        f"corrupt creator state file {self.path}: expected 'CREATOR NEXT' "
                        "in hex; move it aside only if you know no flows were created "
                        "with it") from None
            else:
                creator, nxt = secrets.randbits(64) or 1, 1
            if nxt + count > 1 << 32:
                raise RuntimeError(f"local ID space of creator {creator:x} is exhausted")
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, f"{creator:016x} {nxt + count:08x}\n".encode())
            os.fsync(fd)
            return creator, nxt
        finally:
            os.close(fd)

    def allocate(self) -> int:
        if self._next >= self._limit:
            _, start = self._reserve(self.block)
            self._next, self._limit = start, start + self.block
        value = self._next
        self._next += 1
        return value

    def new_flow(self, lsid: int) -> FlowID:
        return FlowID(self.creator, lsid, self.allocate())
