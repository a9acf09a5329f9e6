"""The thin chat client and the bot.

:class:`ChatClient` speaks the JSON-lines protocol of :mod:`flowchat.protocol` to a site
server: ``await ChatClient.connect("127.0.0.1:7600", "alice")``, then ``await c.say(text)``
and ``await c.next_event()`` (or ``async for ev in c``).

Two front ends:

* **plain** (``--plain``, or whenever stdin/stdout is not a terminal): line based, testable.
  Every line typed is sent, except commands, handled locally (``/who`` lists the sites,
  their states and users, ``/help`` the commands, ``/quit`` leaves; ``//x`` says ``/x``).
  Output lines::

      [12:00:03.120] [commonwe:bob] hello                       an in-order message
      [12:00:09.870] [kingdom:carol] hi  (LATE +7.9s)           reconciled, out of order
      [12:00:04.000] [metropol:alice] ok  (local)               cut off from the leader
      * members (S1, view 3): metropol[alice] commonwe[bob] kingdom[] republic[carol]
      ! disconnected from kingdom (short-term)
      ! view 4: commonwe, metropol (came together from the last view: commonwe, metropol)

* **curses** (default on a terminal): a conversation pane (late messages marked), a
  membership pane listing the sites of the ordering set with their users and states, and an
  input line.

The bot (:func:`run_bot`) logs in and says ``--size``-byte messages at ``--rate`` per second
(gaps uniform in [0, 2/rate], as seed 003's bots), for ``--count`` messages or ``--duration``
seconds, and reports what it sent and received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import AsyncIterator
from typing import Any, TextIO

from .protocol import ChatError, line, parse_line


class ChatClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 user: str) -> None:
        self.reader = reader
        self.writer = writer
        self.user = user
        self.welcome: dict[str, Any] = {}

    @classmethod
    async def connect(cls, server: str, user: str, timeout: float = 10.0) -> ChatClient:
        host, _, port = server.rpartition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host or "127.0.0.1", int(port), limit=1 << 20), timeout)
        c = cls(reader, writer, user)
        await c._send({"op": "hello", "user": user})
        ev = await asyncio.wait_for(c.next_event(), timeout)
        if ev is None or ev.get("ev") != "welcome":
            raise ChatError(f"server did not welcome us: {ev}")
        c.welcome = ev
        return c

    async def _send(self, obj: dict[str, Any]) -> None:
        self.writer.write(line(obj))
        await self.writer.drain()

    async def say(self, text: str) -> None:
        await self._send({"op": "say", "text": text})

    async def who(self) -> None:
        await self._send({"op": "who"})

    async def next_event(self) -> dict[str, Any] | None:
        raw = await self.reader.readline()
        if not raw:
            return None
        return parse_line(raw)

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            ev = await self.next_event()
            if ev is None:
                return
            yield ev

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._send({"op": "bye"})
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


# ============================================================================ formatting
def _clock(t: float) -> str:
    lt = time.localtime(t)
    return time.strftime("%H:%M:%S", lt) + f".{int((t % 1) * 1000):03d}"


def _view_tag(ev: dict[str, Any]) -> str:
    """``, view N`` (agreed views; ``changing`` while a change is under way)."""
    view = ev.get("view") or {}
    if not view.get("agreed"):
        return ""
    return f", view {view.get('number')}" + (" changing" if view.get("changing") else "")


def format_event(ev: dict[str, Any]) -> str | None:
    kind = ev.get("ev")
    if kind == "msg":
        tail = ""
        if ev.get("late"):
            tail = f"  (LATE +{ev['delivered'] - ev['sent']:.1f}s)"
        elif ev.get("local"):
            tail = "  (local)"
        return f"[{_clock(ev['delivered'])}] [{ev['site']}:{ev['user']}] {ev['text']}{tail}"
    if kind == "members":
        parts = [f"{s['site']}[{','.join(s['users'])}]" for s in ev.get("sites", [])]
        state = f"{ev.get('state')}, congested" if ev.get("congested") else ev.get("state")
        return f"* members ({state}{_view_tag(ev)}): " + " ".join(parts)
    if kind == "who":
        head = f"* who: site state {ev.get('state')}{_view_tag(ev)}"
        view = ev.get("view") or {}
        if view.get("agreed"):
            head += (f"; view members {', '.join(view.get('members', []))}, came together: "
                     f"{', '.join(view.get('transitional', []))}")
        rows = []
        for x in ev.get("sites", []):
            where = "" if x["site"] in ev.get("ordering", ()) else " (not in the ordering set)"
            users = ", ".join(x["users"]) or "no users"
            rows.append(f"*   {x['site']} [{x['state']}]{where}: {users}")
        return "\n".join([head] + rows)
    if kind == "notice":
        return f"! {ev.get('text')}"
    if kind == "error":
        return f"! error: {ev.get('text')}"
    if kind == "welcome":
        return (f"* welcome to room {ev.get('room')!r} at site {ev.get('site')} "
                f"({ev.get('mode')}, flow {ev.get('flow')})")
    return None


HELP = """\
* commands (handled here, never sent to the room):
*   /who          the sites of the room, their states and users
*   /help         this text
*   /quit, /exit  leave
* anything else is said to the room"""


async def command(c: ChatClient, text: str) -> tuple[bool, str | None]:
    """One input line: ``(quit?, text to show locally)``. Lines starting with ``/`` are
    commands, handled here; a command we do not know is reported, not sent."""
    if text in ("/quit", "/exit"):
        return True, None
    if text == "/who":
        await c.who()
        return False, None
    if text == "/help":
        return False, HELP
    if text.startswith("/") and not text.startswith("//"):
        return False, f"! unknown command {text.split()[0]!r} (/help lists them)"
    if text.startswith("//"):
        text = text[1:]  # '//x' says '/x'
    if text:
        await c.say(text)
    return False, None


# ============================================================================ plain UI
async def run_plain(server: str, user: str, *, stdin: TextIO | None = None,
                    stdout: TextIO | None = None) -> int:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    c = await ChatClient.connect(server, user)

    def out(text: str | None) -> None:
        if text is not None:
            stdout.write(text + "\n")
            stdout.flush()

    out(format_event(c.welcome))
    for ev in c.welcome.get("history", []):
        out(format_event(ev))
    out(format_event(c.welcome.get("members", {})))
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    async def reader() -> None:
        async for ev in c:
            out(format_event(ev))
        out("! the server closed the connection")
        done.set()

    async def typist() -> None:
        while True:
            text = await loop.run_in_executor(None, stdin.readline)
            if not text:
                break
            quit_, local = await command(c, text.rstrip("\n"))
            out(local)
            if quit_:
                break
        done.set()

    tasks = [asyncio.ensure_future(reader()), asyncio.ensure_future(typist())]
    await done.wait()
    await c.close()
    for t in tasks:
        t.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(asyncio.gather(tasks[0], return_exceptions=True), 1.0)
    return 0


# ============================================================================ curses UI
async def run_curses(server: str, user: str) -> int:  # pragma: no cover - interactive
    import curses

    c = await ChatClient.connect(server, user)
    scr = curses.initscr()
    curses.noecho()
    curses.cbreak()
    scr.nodelay(True)
    scr.keypad(True)
    has_colors = curses.has_colors()
    if has_colors:
        curses.start_color()
        curses.init_pair(1, curses.COLOR_RED, curses.COLOR_BLACK)
        curses.init_pair(2, curses.COLOR_YELLOW, curses.COLOR_BLACK)
    lines: list[tuple[str, int]] = []
    members: dict[str, Any] = c.welcome.get("members", {})
    buf = ""
    closed = False

    def add(ev: dict[str, Any]) -> None:
        text = format_event(ev)
        if text is None or ev.get("ev") == "members":
            return
        attr = 0
        if has_colors and ev.get("late"):
            attr = curses.color_pair(1)
        elif has_colors and ev.get("ev") in ("notice", "error"):
            attr = curses.color_pair(2)
        for row in text.splitlines():
            lines.append((row, attr))
        del lines[:-1000]

    for ev in c.welcome.get("history", []):
        add(ev)

    def draw() -> None:
        h, w = scr.getmaxyx()
        side = min(32, max(16, w // 4))
        main = w - side - 1
        scr.erase()
        shown = lines[-(h - 2):]
        for i, (text, attr) in enumerate(shown):
            scr.addnstr(i, 0, text, main - 1, attr)
        for y in range(h - 1):
            scr.addch(y, main, "|")
        state = members.get("state", "?")
        if members.get("congested"):
            state = f"{state}, congested"
        state += _view_tag(members)
        scr.addnstr(0, main + 2, f"sites ({state})", side - 2,
                    curses.A_BOLD)
        y = 1
        for s in members.get("sites", []):
            if y >= h - 2:
                break
            scr.addnstr(y, main + 2, f"{s['site']} [{s['state']}]", side - 2)
            y += 1
            for u in s.get("users", []):
                if y >= h - 2:
                    break
                scr.addnstr(y, main + 4, u, side - 4)
                y += 1
        scr.addnstr(h - 1, 0, "> " + buf, w - 1)
        scr.refresh()

    async def reader() -> None:
        nonlocal members, closed
        async for ev in c:
            if ev.get("ev") in ("members", "who"):
                members = ev  # the pane's header shows the site's state: keep it current
            add(ev)
        closed = True

    task = asyncio.ensure_future(reader())
    try:
        while not closed:
            draw()
            ch = scr.getch()
            if ch == -1:
                await asyncio.sleep(0.05)
                continue
            if ch in (10, 13, curses.KEY_ENTER):
                quit_, local = await command(c, buf)
                if quit_:
                    break
                for text in (local or "").splitlines():
                    lines.append((text, 0))
                buf = ""
            elif ch in (curses.KEY_BACKSPACE, 127, 8):
                buf = buf[:-1]
            elif 32 <= ch < 0x110000:
                with contextlib.suppress(ValueError):
                    buf += chr(ch)
    finally:
        curses.nocbreak()
        scr.keypad(False)
        curses.echo()
        curses.endwin()
        task.cancel()
        await c.close()
    return 0


# ============================================================================ bot
async def run_bot(server: str, user: str, *, rate: float, size: int = 0,
                  count: int | None = None, duration: float | None = None,
                  seed: int | None = None, stdout: TextIO | None = None,
                  quiet: bool = False) -> dict[str, Any]:
    """Say messages at *rate* per second until *count* were sent or *duration* passed, then
    wait briefly for the last ones to come back; returns (and prints) a summary."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    stdout = stdout or sys.stdout
    rng = random.Random(seed)
    c = await ChatClient.connect(server, user)
    sent = 0
    got: list[dict[str, Any]] = []
    own_back = 0
    late = 0
    finished = asyncio.Event()

    async def reader() -> None:
        nonlocal own_back, late
        async for ev in c:
            if ev.get("ev") == "msg":
                got.append(ev)
                if ev.get("late"):
                    late += 1
                if ev.get("user") == user and ev.get("site") == c.welcome.get("site"):
                    own_back += 1
                    if count is not None and own_back >= count and sent >= count:
                        finished.set()
                if not quiet:
                    text = format_event(ev)
                    if text:
                        stdout.write(text[:200] + "\n")
        finished.set()

    rtask = asyncio.ensure_future(reader())
    t0 = time.monotonic()
    try:
        while True:
            if count is not None and sent >= count:
                break
            if duration is not None and time.monotonic() - t0 >= duration:
                break
            text = f"{user} #{sent + 1}"
            if size > len(text):
                text += " " + "." * (size - len(text) - 1)
            await c.say(text)
            sent += 1
            await asyncio.sleep(rng.uniform(0.0, 2.0 / rate))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(finished.wait(), 10.0 if count is not None else 2.0)
    finally:
        rtask.cancel()
        with contextlib.suppress(BaseException):
            await rtask
        await c.close()
    lat = [ev["delivered"] - ev["sent"] for ev in got]
    summary = {"user": user, "site": c.welcome.get("site"), "sent": sent,
               "received": len(got), "own_received": own_back, "late": late,
               "mean_latency": round(sum(lat) / len(lat), 3) if lat else None,
               "seconds": round(time.monotonic() - t0, 2)}
    stdout.write(json.dumps(summary) + "\n")
    stdout.flush()
    return summary
