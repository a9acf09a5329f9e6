"""What an IGO site needs to authenticate frames in a room with keys: the :class:`FrameAuth`
interface (sign with this site's key, verify another site's signature) and the checks the
state machine applies. Imports only the standard library and the other IGO modules; the
Ed25519 implementation lives outside the sans-I/O core (:mod:`flowchat.sitekeys`).

Why two signatures. A frame's *transmitter* signs the whole frame (a 64-byte trailer), so a
heartbeat, repair request, GONE or ORDER record is believed only from the site that sent it.
A DATA frame also carries its *origin's* signature over what names and shows the message
(:func:`~flowchat.igo.wire.data_signed_bytes`): sites resend other sites' messages during
repairs, and a site holding its own key must not be able to put words under another site's
name. Neither signature stops a replay of a genuine frame; replays of DATA are duplicates,
and a replayed heartbeat only repeats what its site said before (see the README, Chat).
"""

from __future__ import annotations

from typing import Protocol

from .wire import SIG_LEN, DataMsg, data_signed_bytes


class FrameAuth(Protocol):
    """This site's signing key and the public keys of every site of the room."""

    def sign(self, data: bytes) -> bytes:
        """*data* signed with this site's private key (:data:`SIG_LEN` bytes)."""
        ...

    def verify(self, site: str, data: bytes, sig: bytes) -> bool:
        """Whether *sig* is *site*'s signature of *data* (False for a site without a key)."""
        ...


def split_trailer(frame: bytes) -> tuple[bytes, bytes]:
    """``(body, transmitter signature)`` of a frame of a keyed room (a frame too short to
    carry one gives an empty signature, which never verifies)."""
    if len(frame) <= SIG_LEN:
        return frame, b""
    return frame[:-SIG_LEN], frame[-SIG_LEN:]


def data_signature_ok(auth: FrameAuth, tag: int, origin_name: str, d: DataMsg) -> bool:
    """Whether DATA *d* carries its origin's valid signature."""
    if len(d.sig) != SIG_LEN:
        return False
    return auth.verify(origin_name, data_signed_bytes(tag, d.origin, d.inc, d.seq, d.lamport,
                                                      d.send_time, d.deps, d.payload,
                                                      d.view), d.sig)
