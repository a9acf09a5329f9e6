"""The opening of a router link, as a small state machine (sans-I/O).

Both sides open the link with a HELLO on the link-local flow. The router's HELLO tells us its
name, the largest payload it takes, and the LSID it suggests for new flows; an ERROR instead
means the router refuses us. With a link key both sides then prove they hold it (AUTH) and
may switch to sealed records. :class:`Handshake` takes the router's link-local messages and
answers with a :class:`Step`: what to send, and whether the link is up, encrypted or refused.
Imports only the wire layer of flowrouter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowrouter.wire import control as C


def make_keyring(link_key: tuple[str, str | bytes] | None) -> tuple[Any, str | None]:
    """The key ring and key ID for *link_key* ``(key_id, secret)`` (None: no link auth)."""
    if link_key is None:
        return None, None
    from flowrouter.wire.linkauth import KeyRing, parse_secret

    key_id, secret = link_key
    raw = secret if isinstance(secret, bytes) else parse_secret(secret)
    return KeyRing({key_id: raw}, key_id), key_id


def requires_auth(credentials: bytes) -> bool:
    """Whether a router's HELLO credentials say applications must authenticate."""
    from flowrouter.wire.linkauth import FLAG_REQUIRE_ENDPOINTS, AuthError, parse_hello_credentials

    try:
        return bool(parse_hello_credentials(credentials).flags & FLAG_REQUIRE_ENDPOINTS)
    except AuthError:
        return False


@dataclass(slots=True)
class Step:
    """What one message of the router's handshake leads to."""

    reply: C.ControlMessage | None = None  #: to send on the link-local flow
    done: C.Hello | None = None  #: the handshake is over: the router's HELLO
    #: with *done*: the record layer when the link is now encrypted (a stream's
    #: SecureStream; a datagram link's LinkCipher in its datagram mode)
    secure: Any = None
    failed: str | None = None  #: give up on the link, for this reason
    protocol_error: bool = False  #: *failed* because the router broke the protocol


class Handshake:
    """Our HELLO, the router's HELLO, and the AUTH exchange when a link key is used."""

    def __init__(self, *, name: str, node_id: int, max_payload: int, credentials: bytes,
                 keyring: Any = None, key_id: str | None = None, encrypt: bool = False,
                 datagram: bool = False) -> None:
        self.name = name
        self.node_id = node_id
        self.max_payload = max_payload
        self.credentials = credentials
        self.keyring = keyring
        self.key_id = key_id
        self.encrypt = encrypt
        #: over a datagram link the router repeats its HELLO (and AUTH) until our next step
        #: arrives: a repeat of the HELLO we took is answered, another HELLO once we are
        #: done is ignored (a late or injected datagram must not end the link), and keys
        #: seal datagrams one by one (LinkCipher's datagram mode) instead of a stream
        self.datagram = datagram
        self._reply: C.ControlMessage | None = None
        self.auth: Any = None
        self.auth_hello: C.Hello | None = None
        #: the router's HELLO once the handshake is over
        self.hello: C.Hello | None = None
        #: the feature bits of the router's HELLO header
        self.router_features = 0

    @property
    def done(self) -> bool:
        return self.hello is not None

    def opening(self) -> list[bytes]:
        """Our HELLO (header and body), the first bytes on the link."""
        creds = self.credentials
        if self.keyring is not None:
            from flowrouter.wire.linkauth import LinkAuthenticator

            self.auth = LinkAuthenticator(self.keyring, my_name=self.name,
                                          my_role=C.Role.ENDPOINT, key_id=self.key_id,
                                          encrypt=self.encrypt)
            creds = self.auth.hello_credentials()
        hello = C.Hello(self.node_id, C.Role.ENDPOINT, self.name, self.max_payload, 0,
                        creds).encode()
        return [C.hello_header(len(hello)), hello]  # announces our features

    def on_message(self, msg: C.ControlMessage, header: memoryview) -> Step | None:
        """A link-local message; None when it is not part of the handshake."""
        if isinstance(msg, C.Error):
            return Step(failed=f"router refused us: {msg.text}")
        if isinstance(msg, C.Hello):
            self.router_features = C.hello_features(header)
            return self._on_hello(msg)
        if isinstance(msg, C.Auth) and self.auth_hello is not None and not self.done:
            return self._on_auth(msg)
        if not self.done and self.datagram:
            return Step()  # came before the HELLO it follows (lost or late): it is repeated
        if not self.done:
            return Step(failed=f"expected HELLO, got {type(msg).__name__}",
                        protocol_error=True)
        return None

    def _on_hello(self, msg: C.Hello) -> Step:
        if self.datagram and msg in (self.hello, self.auth_hello):
            return Step(reply=self._reply)  # a repeat: it lost our AUTH, or it is just late
        if self.datagram and self.done:
            return Step()
        if self.done or self.auth_hello is not None:
            return Step(failed="the router sent a second HELLO", protocol_error=True)
        if msg.role is not C.Role.ROUTER:
            return Step(failed=f"the peer is not a flow router (it says it is an "
                               f"{msg.role.name.lower()} named {msg.name!r})")
        if self.auth is None and msg.credentials and requires_auth(msg.credentials):
            return Step(failed=f"router {msg.name!r} requires applications to authenticate "
                               "(link authentication); connect with link_key=(key_id, "
                               "secret)")
        if self.auth is None:
            self.hello = msg
            return Step(done=msg)
        # Prove we hold the key; the router proves it too before we trust it.
        from flowrouter.wire.linkauth import AuthError

        try:
            proof = self.auth.on_peer_hello(msg.name, msg.role, msg.credentials)
        except AuthError as exc:
            return Step(failed=f"router {msg.name!r} failed link authentication: {exc}")
        self.auth_hello = msg
        self._reply = C.Auth(proof)
        return Step(reply=self._reply)

    def _on_auth(self, msg: C.Auth) -> Step:
        from flowrouter.wire.linkauth import AuthError

        hello = self.auth_hello
        assert hello is not None
        try:
            self.auth.on_peer_auth(msg.body)
        except AuthError as exc:
            return Step(failed=f"router {hello.name!r} failed link authentication: {exc}")
        secure: Any = None
        cipher = self.auth.cipher(ordered=not self.datagram)  # either side asked for it
        if cipher is not None and self.datagram:
            secure = cipher  # each datagram sealed alone (flowrouter.wire.appdgram)
        elif cipher is not None:
            from flowrouter.wire.linkauth import SecureStream

            secure = SecureStream(cipher)
        self.hello = hello
        return Step(done=hello, secure=secure)
