"""When to dial a configured peer again, and what to log about it. Sans-I/O.

A router keeps dialling each configured peer whose link is not up. The schedule is the
part of that with no sockets in it, driven on the clock it is given (tests run it on
virtual time):

* Attempts are spaced by a back-off that starts at ``first`` (``reconnect_min``) and
  doubles up to ``cap`` (``reconnect_max``). The spacing runs from the *start* of an
  attempt: an attempt that spent its dial time-out waiting for an answer has used up its
  wait, so a peer behind a blackout is tried at least every ``max(cap, dial_timeout)``
  seconds and a healed network is noticed within that (plus the kernel's SYN repeats inside
  the attempt that is under way).
* The back-off starts over only when a link to the peer came *up* and stayed up for
  ``stable`` seconds. A peer that accepts the TCP connection and then refuses the handshake
  (or one whose link comes up and drops at once) keeps backing off: no re-dial storm.
* Logging follows state changes, not attempts: the first failure (with its reason), a
  change of reason, and the link coming up again (with how many attempts and how long it
  took) are worth a line each (:attr:`Step.note`); a repeat of the same failure is not.

May import only the standard library.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Step:
    """What the node does after a failure: wait ``wait`` seconds, then dial; log ``note``
    at info level when it is not empty (a change of state), else at debug level."""

    wait: float
    note: str = ""


@dataclass(slots=True)
class _Peer:
    delay: float  #: the back-off before the next attempt (from its start)
    started: float | None = None  #: when the attempt under way started
    up_at: float | None = None  #: when the link last came up (None: not up)
    down_since: float | None = None  #: when the peer was last seen going down
    reason: str = ""  #: the last failure's reason
    attempts: int = 0  #: failed attempts since it was last up for good
    noted_up: bool = False  #: "up again" was logged in this episode


def _kind(reason: str) -> str:
    """What a reason says, without its details: a connection reset and a connection closed
    by the peer are the same news (a refused handshake ends either way)."""
    head = reason.split(":", 1)[0].split("(", 1)[0].strip().lower()
    return "connection" if head.startswith("connection") else head


class DialSchedule:
    """The re-dial schedule of every configured peer (by key: its address)."""

    def __init__(self, first: float, cap: float, stable: float | None = None) -> None:
        if not 0 < first <= cap:
            raise ValueError("the back-off needs 0 < first <= cap")
        self.first = first
        self.cap = cap
        #: seconds a link must stay up before the back-off starts over (a refused
        #: handshake or a link dropped at once lives milliseconds)
        self.stable = min(cap, 2.0) if stable is None else stable
        self._peers: dict[str, _Peer] = {}

    def _peer(self, key: str) -> _Peer:
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = _Peer(self.first)
        return peer

    def reconfigure(self, first: float, cap: float) -> None:
        """New back-off bounds (a reload); delays under way are clamped to them."""
        if not 0 < first <= cap:
            raise ValueError("the back-off needs 0 < first <= cap")
        self.first, self.cap = first, cap
        for peer in self._peers.values():
            peer.delay = min(max(peer.delay, first), cap)

    def attempt(self, key: str, now: float) -> None:
        """A dial of *key* starts now."""
        self._peer(key).started = now

    def up(self, key: str, now: float) -> str:
        """The link to *key* came up; returns a line to log the first time it does after
        failing (a link that comes up and drops at once, again and again, is one episode
        of being down, not a line per attempt)."""
        peer = self._peer(key)
        note = ""
        if peer.attempts and not peer.noted_up and peer.down_since is not None:
            note = (f"up again after {peer.attempts} failed "
                    f"attempt{'s' if peer.attempts != 1 else ''} "
                    f"({now - peer.down_since:.1f}s down)")
            peer.noted_up = True
        peer.up_at, peer.started = now, None
        return note

    def failed(self, key: str, now: float, reason: str) -> Step:
        """An attempt failed, or the link went down, for *reason*: when to dial again."""
        peer = self._peer(key)
        was_up = peer.up_at is not None
        stable = was_up and now - peer.up_at >= self.stable  # type: ignore[operator]
        if stable:
            peer.delay = self.first  # it had been working: try again soon
        start = peer.started if peer.started is not None and not was_up else now
        wait = max(0.0, start + peer.delay - now)
        peer.delay = min(peer.delay * 2, self.cap)
        note = ""
        if stable or peer.down_since is None:  # a new episode of being down
            peer.down_since, peer.attempts = now, 0
            note = f"down: {reason}"
        elif _kind(reason) != _kind(peer.reason):
            note = f"still down, now: {reason}"
        if note:
            peer.noted_up = False  # the next time it comes up is news again
        peer.up_at, peer.started = None, None
        peer.reason = reason
        peer.attempts += 1
        return Step(wait, note)

    def reset(self, key: str) -> None:
        """Dial *key* soon again (an operator brought it back, or it is new)."""
        peer = self._peers.get(key)
        if peer is not None:
            peer.delay = self.first

    def forget(self, key: str) -> None:
        """*key* is no longer a configured peer."""
        self._peers.pop(key, None)

    def status(self, key: str) -> dict[str, object]:
        """The peer's dial state for status pages: failed attempts and the back-off."""
        peer = self._peers.get(key)
        if peer is None or peer.up_at is not None:
            return {"attempts": 0, "backoff": self.first}
        return {"attempts": peer.attempts, "backoff": round(peer.delay, 3)}


def peer_rows(peers: Iterable[Any], links: list[dict[str, Any]],
              errors: Mapping[str, tuple[float, str]], blocked: Collection[str],
              schedule: DialSchedule) -> list[dict[str, Any]]:
    """Every configured peer (*peers*: ``[[peer]]`` entries) with its state for status
    pages: up (and on which of *links*, the status rows) or down, its last error (*errors*:
    address -> (Unix time, why)), whether an operator cut it (*blocked* names), and its
    failed attempts and back-off (*schedule*)."""
    rows = []
    for peer in peers:
        link = next((lk for lk in links if lk["role"] == "router" and lk["state"] == "up"
                     and peer.name and lk["peer"] == peer.name), None)
        row: dict[str, Any] = {"peer": peer.name, "address": peer.address,
                               "transport": peer.transport, "up": link is not None,
                               "link": link["id"] if link else None}
        if link is None:
            err = errors.get(peer.address)
            row["last_error"] = err[1] if err else "not connected yet"
            row["since"] = round(err[0], 3) if err else None
            row["blocked"] = bool(peer.name and peer.name in blocked)
            row.update(schedule.status(peer.address))
        rows.append(row)
    return rows
