"""The chat site server: one per site, a participant of the room flow, serving thin clients.

A :class:`ChatServer` connects to a flow router with flowlib, finds the room's flow (below),
runs the site's IGO state machine on it (:class:`~flowchat.flow_adapter.FlowSite`) and
accepts thin clients on a local TCP port speaking the JSON-lines protocol of
:mod:`flowchat.protocol`. Clients' messages are submitted to the room; every message the
ordering delivers is sent to every client of this site, in that order, with its metadata
(late, local-only, sequence numbers, times). Users logging in and out travel as JOIN/LEAVE chat
messages, so every site's user list follows the same order; when a site (re)enters the
ordering set, local users are announced again so its list is complete.

**Finding the room flow.** ``--flow`` names it outright. Otherwise the server asks the
directory (``chat:<room>``, kind ``flow``) with a short time-out; if a directory member
answers with an entry, that flow is used; if none answers, or nothing is registered, the flow
is derived from the room name (:func:`flowchat.protocol.room_flow`: creator
``0x43484154_<crc32(room)>``, the router's suggested LSID or ``--lsid``, local ID 1), so every
site server computes the same one without any directory. When a directory answered but had
no entry, the server registers the derived flow there (refreshed while it runs) so others can
find the room by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flowlib
from flowlib import FlowClient, FlowID

from .flow_adapter import FlowSite
from .igo import (
    Conflict,
    Congestion,
    Delivery,
    FrameAuth,
    IGOConfig,
    MembershipChange,
    OutboxFull,
    StateChange,
    ViewChange,
    ViewInstalled,
)
from .marks import load_marks, load_sent, marks_path, save_marks
from .protocol import (
    JOIN,
    KINDS,
    LEAVE,
    SAY,
    ChatError,
    decode_chat,
    directory_name,
    encode_chat,
    line,
    parse_line,
    room_flow,
)

log = logging.getLogger("flowchat.server")

MARKS_EVERY = 1.0  #: seconds between writes of the display marks (when they changed)

DEFAULT_LISTEN = "127.0.0.1:7600"
HISTORY = 50


@dataclass(eq=False)
class _Client:
    writer: asyncio.StreamWriter
    user: str = ""
    queue: asyncio.Queue[bytes] = field(default_factory=lambda: asyncio.Queue(10000))
    dropped: int = 0


def msg_event(d: Delivery) -> dict[str, Any] | None:
    try:
        m = decode_chat(d.payload)
    except ChatError:
        return None
    if m.kind != SAY:
        return None
    return {"ev": "msg", "site": d.origin, "user": m.user, "text": m.text, "seq": d.seq,
            "lamport": d.lamport, "gseq": d.gseq, "sent": round(d.send_time, 6),
            "delivered": round(d.delivery_time, 6), "late": d.late, "local": d.local}


def _chat_text(payload: bytes) -> str:
    """What a chat payload says, for a conflict report (raw bytes if it is no chat message)."""
    try:
        m = decode_chat(payload)
    except ChatError:
        return payload[:200].decode("utf-8", "replace")
    return f"{m.user}: {m.text}"[:200]


class ChatServer:
    def __init__(self, site: str, routers: Sequence[str], *, sites: Sequence[str],
                 room: str = "chat", mode: str = "all-to-all", leader: str | None = None,
                 listen: str | None = DEFAULT_LISTEN, flow: FlowID | str | None = None,
                 lsid: int | None = None, use_directory: bool = True,
                 directory_timeout: float = 1.0, state_dir: str | None = None,
                 tick: float = 0.1, connect_options: dict[str, Any] | None = None,
                 policies: Sequence[Any] = (), reconnect: bool = True,
                 failover_timeout: float = 30.0, reconnect_max: float = 10.0,
                 auth: FrameAuth | None = None, **igo: Any) -> None:
        self.site = site
        self.routers = list(routers)
        self.room = room
        self.listen = listen
        self.flow: FlowID | None = FlowID.parse(flow) if isinstance(flow, str) else flow
        self.lsid = lsid
        self.use_directory = use_directory
        self.directory_timeout = directory_timeout
        self.state_dir = state_dir
        self.tick = tick
        #: more keyword arguments for flowlib.connect (link_key, encrypt, capabilities):
        #: a protected room's sites present a capability covering the room flow
        self.connect_options = dict(connect_options or {})
        #: flow policies published once connected (e.g. the one protecting the room)
        self.policies = list(policies)
        self.reconnect = reconnect
        self.failover_timeout = failover_timeout
        self.reconnect_max = reconnect_max
        self.reconnects = 0  #: times the room flow was rejoined over a new client
        self._reconnect_task: asyncio.Task[None] | None = None
        self._stopping = False
        self.config = IGOConfig(sites=tuple(sites), room=room, mode=mode, leader=leader, **igo)
        if site not in self.config.sites:
            raise ValueError(f"site {site!r} is not one of --sites "
                             f"({', '.join(self.config.sites)})")
        check = getattr(auth, "check_sites", None)
        if check is not None:
            check(self.config.sites)
        #: keyed room (flowchat.sitekeys): frames signed by their transmitter, DATA by its
        #: origin; None: frames believed as they come (README: Chat, what an attacker can do)
        self.auth = auth
        self.conflicts = 0  #: conflicting versions of one message seen (forgery/equivocation)
        self.client: FlowClient | None = None
        self.igo: FlowSite | None = None
        self.users: dict[str, set[str]] = {s: set() for s in self.config.sites}
        self.clients: set[_Client] = set()
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.flow_source = ""
        self._server: asyncio.base_events.Server | None = None
        self._directory: Any = None
        self._registration: Any = None
        self.address: tuple[str, int] | None = None
        self._closed = asyncio.Event()
        self.marks_file: Path | None = None  #: the display marks (set at start)
        self._marks_saved: tuple[list[tuple[str, int, int]], tuple[int, int]] | None = None
        self._marks_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def _connect(self) -> FlowClient:
        # failover on by default, also with one router: a restarted router is dialled again
        # and the room flow re-joined by flowlib itself (issue 14)
        options = {"failover": self.reconnect or len(self.routers) > 1,
                   "failover_timeout": self.failover_timeout, **self.connect_options}
        client = await flowlib.connect(self.routers, name=f"flowchat-{self.site}",
                                       state_dir=self.state_dir, **options)
        for policy in self.policies:
            client.publish_policy(policy)
        return client

    async def start(self) -> None:
        self.client = await self._connect()
        await self._resolve_flow()
        assert self.flow is not None
        # what this site showed before a restart is not shown again: the display marks
        # live beside the site's state (flowchat.marks)
        self.marks_file = marks_path(self.state_dir, self.room, self.site)
        self.igo = FlowSite(self.client, self.flow, self.config, self.site, tick=self.tick,
                            keep=1000, on_deliver=self._on_deliver, on_event=self._on_event,
                            on_lost=self._on_lost, auth=self.auth,
                            shown=load_marks(self.marks_file),
                            sent=load_sent(self.marks_file))
        await self.igo.start()
        self._marks_task = asyncio.ensure_future(self._keep_marks())
        if self.listen:
            host, _, port = self.listen.rpartition(":")
            self._server = await asyncio.start_server(self._serve_client, host or "127.0.0.1",
                                                      int(port))
            sock = self._server.sockets[0].getsockname()
            self.address = (sock[0], sock[1])
        log.info("site %s serving room %r (flow %s, %s) on %s", self.site, self.room,
                 self.flow, self.flow_source, self.address)

    async def _keep_marks(self) -> None:
        """Write the display marks whenever they changed, at most every MARKS_EVERY s."""
        while True:
            await asyncio.sleep(MARKS_EVERY)
            self._save_marks()

    def _save_marks(self) -> None:
        if self.igo is None or self.marks_file is None:
            return
        marks = (self.igo.ordering.display_marks(), self.igo.ordering.sent_mark())
        if marks == self._marks_saved:
            return
        try:
            save_marks(self.marks_file, *marks)
            self._marks_saved = marks
        except OSError as exc:
            log.warning("site %s: cannot write the display marks %s: %s", self.site,
                        self.marks_file, exc)

    def _on_lost(self, exc: Exception) -> None:
        """Every router failed for longer than the failover time-out: keep dialling (with
        back-off) and rejoin the room flow with the same ordering state."""
        if not self.reconnect or self._stopping or self._reconnect_task is not None:
            return
        log.warning("site %s: lost the room flow (%s); reconnecting to %s", self.site, exc,
                    ", ".join(self.routers))
        self._reconnect_task = asyncio.ensure_future(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        delay = 0.1
        try:
            while not self._stopping:
                try:
                    client = await self._connect()
                except (OSError, flowlib.FlowError) as exc:
                    log.info("site %s: no router yet (%s); retry in %.1fs", self.site, exc,
                             delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.reconnect_max)
                    continue
                old, self.client = self.client, client
                if old is not None:
                    with contextlib.suppress(Exception):
                        await old.close(timeout=0.5)
                assert self.igo is not None
                await self.igo.rebind(client)
                self.reconnects += 1
                log.warning("site %s: rejoined the room flow %s via %s", self.site, self.flow,
                            client.address)
                self._broadcast({"ev": "notice", "text": "reconnected to the room"})
                return
        finally:
            self._reconnect_task = None

    async def stop(self) -> None:
        self._stopping = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reconnect_task
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for c in list(self.clients):
            c.writer.close()
        if self._registration is not None:
            with contextlib.suppress(Exception):
                await self._registration.cancel()
        if self._directory is not None:
            with contextlib.suppress(Exception):
                await self._directory.close()
        if self._marks_task is not None:
            self._marks_task.cancel()
            with contextlib.suppress(BaseException):
                await self._marks_task
        self._save_marks()
        if self.igo is not None:
            await self.igo.stop()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close(timeout=2.0)
        self._closed.set()

    async def serve_forever(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> ChatServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _resolve_flow(self) -> None:
        assert self.client is not None
        if self.flow is not None:
            self.flow_source = "given"
            return
        lsid = self.lsid or self.client.default_lsid
        name = directory_name(self.room)
        if self.use_directory and lsid:
            try:
                from flowdir import DirectoryClient, NoDirectoryMember

                self._directory = DirectoryClient(self.client, lsid=lsid, owner=self.site)
                try:
                    found = await asyncio.wait_for(
                        self._directory.lookup(name, kind="flow", expanding=False,
                                               window=self.directory_timeout,
                                               settle=min(0.2, self.directory_timeout)),
                        self.directory_timeout + 2.0)
                    if found:
                        self.flow = found.flows[0]
                        self.flow_source = "directory"
                        return
                    self.flow = room_flow(self.room, lsid)
                    self._registration = await self._directory.register(
                        name, self.flow, ttl=60.0, keep=True)
                    self.flow_source = "derived, registered in the directory"
                    return
                except (NoDirectoryMember, TimeoutError):
                    pass
            except Exception as exc:  # noqa: BLE001 - the directory is optional
                log.info("directory lookup of %s failed: %s", name, exc)
        if not lsid:
            raise flowlib.FlowError("the router suggests no LSID and none was given "
                                    "(--lsid): cannot derive the room flow")
        self.flow = room_flow(self.room, lsid)
        self.flow_source = "derived from the room name"

    # ------------------------------------------------------------------ ordering events
    def _on_deliver(self, d: Delivery) -> None:
        try:
            m = decode_chat(d.payload)
        except ChatError:
            return
        if m.kind == JOIN:
            if m.user not in self.users.setdefault(d.origin, set()):
                self.users[d.origin].add(m.user)
                self._broadcast(self.members_event())
            return
        if m.kind == LEAVE:
            self.users.setdefault(d.origin, set()).discard(m.user)
            self._broadcast(self.members_event())
            return
        ev = msg_event(d)
        if ev is not None:
            self.history.append(ev)
            self._broadcast(ev)

    def _on_event(self, e: Any) -> None:
        if isinstance(e, Conflict):
            self.conflicts += 1
            log.warning("site %s: conflicting versions of %s #%d (incarnation %d), the second "
                        "sent by %s: %s", self.site, e.origin, e.seq, e.incarnation,
                        e.transmitter, "the origin signed both" if self.auth is not None
                        else "someone on the room flow forged one (room without keys)")
            self._broadcast({"ev": "conflict", "site": e.origin, "seq": e.seq,
                             "incarnation": e.incarnation, "transmitter": e.transmitter,
                             "kept": _chat_text(e.kept), "other": _chat_text(e.other)})
            self._broadcast({"ev": "notice", "text": (
                f"WARNING: two different messages claim to be {e.origin} #{e.seq}; "
                f"showing the first, the other said: {_chat_text(e.other)!r}"),
                "time": round(e.time, 3)})
            return
        if isinstance(e, Congestion):
            # congestion is a state users see: slow down until it clears
            self._broadcast(self.members_event())
            text = (f"congested: the network takes less than is said here, {e.queued} "
                    f"message(s) wait to go; please slow down" if e.congested
                    else "no longer congested")
            self._broadcast({"ev": "notice", "text": text, "time": round(e.time, 3)})
            return
        if isinstance(e, ViewInstalled):
            # agreed views (all-to-all modes): the transitional notice, then the new view
            self._broadcast(self.members_event())
            self._broadcast({"ev": "notice", "time": round(e.time, 3), "text": (
                f"view {e.number}: {', '.join(e.members)} (came together from the last "
                f"view: {', '.join(e.transitional)})")})
            return
        if isinstance(e, ViewChange):
            return  # short (a round trip and the repairs up to the cut): shown installed
        if isinstance(e, MembershipChange):
            self._broadcast(self.members_event())
            # sites that (re)joined may have missed our users' JOINs: announce them again
            for user in sorted(u for c in self.clients if (u := c.user)):
                self.submit(JOIN, user)
        elif isinstance(e, StateChange):
            # the membership pane shows every site's state and the site's own (S1/S2/S3):
            # refresh it on every state change, not only when the ordering set changes
            # (in hasten mode S2 -> S3 leaves the set unchanged)
            self._broadcast(self.members_event())
            if e.peer is None:
                text = f"site state {e.old} -> {e.new}"
            elif e.new == "S2" and e.reason == "stalled":
                text = f"disconnected from {e.peer} (stalled: heard, but its messages do not " \
                       f"get through)"
            elif e.new == "S2":
                text = f"disconnected from {e.peer} (short-term)"
            elif e.new == "S3":
                text = f"lost {e.peer} (long-term disconnect)"
            elif e.new == "S1":
                text = f"connected to {e.peer}"
            else:
                return
            self._broadcast({"ev": "notice", "text": text, "time": round(e.time, 3)})

    def members_event(self) -> dict[str, Any]:
        assert self.igo is not None
        o = self.igo.ordering
        states = {p.name: str(p.state) for p in o.peers.values()}
        states[self.site] = "self"
        view = o.view
        return {"ev": "members", "state": str(o.state), "congested": o.congested,
                "view": {k: view[k] for k in ("number", "members", "agreed", "changing")}
                | {"transitional": view.get("transitional", view["members"])},
                "sites": [{"site": s, "state": states.get(s, "?"),
                           "users": sorted(self.users.get(s, ()))} for s in o.members],
                "all": states}

    def who_event(self) -> dict[str, Any]:
        """The answer to ``/who``: every site of the room with its state and the users this
        site knows there (the ordering set's first), and the site's overall state."""
        ev = self.members_event()
        ordering = [s["site"] for s in ev["sites"]]
        rest = [s for s in self.config.sites if s not in ordering]
        ev["ev"] = "who"
        ev["sites"] = ev["sites"] + [{"site": s, "state": ev["all"].get(s, "?"),
                                      "users": sorted(self.users.get(s, ()))} for s in rest]
        ev["ordering"] = ordering
        return ev

    def submit(self, kind: int, user: str, text: str = "") -> int:
        """Submit a chat record; a SAY refused by a congested site raises
        :class:`~flowchat.igo.OutboxFull` (the client is told), a JOIN / LEAVE refused is
        dropped (the next membership change announces the users again)."""
        assert self.igo is not None
        try:
            return self.igo.submit(encode_chat(kind, user, text))
        except OutboxFull:
            if kind == SAY:
                raise
            log.info("site %s: congested, %s of %s not sent", self.site, KINDS[kind], user)
            return 0

    # ------------------------------------------------------------------ clients
    def _broadcast(self, ev: dict[str, Any]) -> None:
        data = line(ev)
        for c in list(self.clients):
            if not c.user:
                continue
            try:
                c.queue.put_nowait(data)
            except asyncio.QueueFull:
                c.dropped += 1

    async def _writer(self, c: _Client) -> None:
        try:
            while True:
                data = await c.queue.get()
                c.writer.write(data)
                await c.writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass

    async def _serve_client(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        c = _Client(writer)
        self.clients.add(c)
        wtask = asyncio.ensure_future(self._writer(c))
        try:
            while True:
                raw = await reader.readline()
                if not raw:
                    break
                if not raw.strip():
                    continue
                try:
                    req = parse_line(raw)
                    op = req.get("op")
                    if not c.user:
                        if op != "hello" or not isinstance(req.get("user"), str) \
                                or not req["user"].strip():
                            raise ChatError('say {"op": "hello", "user": NAME} first')
                        c.user = req["user"].strip()[:64]
                        assert self.flow is not None and self.igo is not None
                        c.queue.put_nowait(line({
                            "ev": "welcome", "site": self.site, "room": self.room,
                            "flow": str(self.flow), "mode": self.config.mode,
                            "members": self.members_event(), "history": list(self.history)}))
                        self.submit(JOIN, c.user)
                    elif op == "say":
                        text = req.get("text")
                        if not isinstance(text, str):
                            raise ChatError('"say" needs a "text" string')
                        try:
                            self.submit(SAY, c.user, text)
                        except OutboxFull as exc:
                            raise ChatError(f"not sent: {exc}; please slow down") from None
                    elif op == "who":
                        c.queue.put_nowait(line(self.who_event()))
                    elif op == "bye":
                        break
                    else:
                        raise ChatError(f"unknown op {op!r}")
                except ChatError as exc:
                    with contextlib.suppress(asyncio.QueueFull):
                        c.queue.put_nowait(line({"ev": "error", "text": str(exc)}))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.clients.discard(c)
            if c.user and self.igo is not None:
                self.submit(LEAVE, c.user)
            # let the writer flush what is queued, then close
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._flush(c), 1.0)
            wtask.cancel()
            with contextlib.suppress(Exception):
                writer.close()

    async def _flush(self, c: _Client) -> None:
        while not c.queue.empty():
            await asyncio.sleep(0.01)
