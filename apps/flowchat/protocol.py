"""The chat's own formats: what a chat message looks like inside an IGO message, the room
flow's name, and the local line protocol between a site server and its thin clients.

Chat message (the application payload of an IGO DATA message), version 1::

    "C" | version (1) = 1 | kind (1) | user length (1) | user (UTF-8) | text (UTF-8)

kinds: 1 SAY (text is the message), 2 JOIN (a user logged in at the sending site; text is
empty), 3 LEAVE (logged out). JOIN/LEAVE travel in order with the conversation, so every
site's user list follows the ordering (seed 5.1.2: membership updates are chat messages).

Client line protocol (site server <-> thin client, TCP on the server's ``--listen`` port): one
JSON object per line, UTF-8.

client -> server:

=====================================  ======================================================
``{"op": "hello", "user": "alice"}``   log in (first line); the server answers ``welcome``
``{"op": "say", "text": "..."}``       send a message to the room
``{"op": "who"}``                      ask for the membership again
``{"op": "bye"}``                      log out (or just close the connection)
=====================================  ======================================================

server -> client:

===========  ==============================================================================
``ev``       fields
===========  ==============================================================================
welcome      ``site``, ``room``, ``flow``, ``mode``, ``members`` (see members), ``history``
             (the last messages, each as a ``msg`` object)
msg          ``site`` (origin), ``user``, ``text``, ``seq``, ``lamport``, ``gseq`` (leader
             order number or null), ``sent``, ``delivered`` (seconds, server clocks), ``late``
             (delivered out of order: reconciled), ``local`` (intra-site order only)
members      ``sites``: ``[{"site", "state", "users": [...]}]`` for the sites in this site's
             ordering set, ``state`` (this site's S1/S2/S3), ``all`` (every site and its
             state)
notice       ``text`` (e.g. "disconnected from kingdom")
error        ``text``
===========  ==============================================================================
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any, NamedTuple

from flowrouter.wire.flowid import FlowID

CHAT_MAGIC = b"C"
CHAT_VERSION = 1
SAY, JOIN, LEAVE = 1, 2, 3
KINDS = {SAY: "say", JOIN: "join", LEAVE: "leave"}
_HDR = struct.Struct("!1sBBB")
MAX_USER = 64
MAX_TEXT = 16000

#: creator ID of derived room flows: "CHAT" in the high 32 bits, CRC-32 of the room below
ROOM_CREATOR_TAG = 0x43484154


class ChatError(ValueError):
    pass


class ChatMessage(NamedTuple):
    kind: int
    user: str
    text: str


def encode_chat(kind: int, user: str, text: str = "", pad_to: int = 0) -> bytes:
    """Encode a chat message; *pad_to* pads the text with spaces to make the whole payload
    about that many bytes (the experiments' ~1 KB messages)."""
    if kind not in KINDS:
        raise ChatError(f"unknown chat message kind {kind}")
    u = user.encode()[:MAX_USER]
    t = text.encode()
    if len(t) > MAX_TEXT:
        raise ChatError(f"message text over {MAX_TEXT} bytes")
    body = _HDR.pack(CHAT_MAGIC, CHAT_VERSION, kind, len(u)) + u + t
    if pad_to > len(body):
        body += b" " * (pad_to - len(body))
    return body


def decode_chat(payload: bytes) -> ChatMessage:
    if len(payload) < _HDR.size:
        raise ChatError("chat message too short")
    magic, version, kind, ulen = _HDR.unpack_from(payload)
    if magic != CHAT_MAGIC or version != CHAT_VERSION:
        raise ChatError("not a version-1 chat message")
    if kind not in KINDS:
        raise ChatError(f"unknown chat message kind {kind}")
    end = _HDR.size + ulen
    if end > len(payload):
        raise ChatError("user name runs past the message")
    try:
        user = payload[_HDR.size:end].decode()
        text = payload[end:].decode().rstrip(" ")
    except UnicodeDecodeError:
        raise ChatError("chat message is not UTF-8") from None
    return ChatMessage(kind, user, text)


def room_flow(room: str, lsid: int) -> FlowID:
    """The room's flow when no directory names it: derived from the room name alone, so
    every site server computes the same one: creator ``0x43484154_<crc32(room)>``, the given
    LSID, local ID 1."""
    if not 0 < lsid < 1 << 32:
        raise ValueError("the room flow needs an LSID (1..0xffffffff)")
    creator = ROOM_CREATOR_TAG << 32 | zlib.crc32(room.encode())
    return FlowID(creator, lsid, 1)


def directory_name(room: str) -> str:
    """The name a room's flow is registered under in the directory."""
    return f"chat:{room}"


def line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def parse_line(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChatError(f"not a JSON line: {exc}") from None
    if not isinstance(obj, dict):
        raise ChatError("a line must be a JSON object")
    return obj
