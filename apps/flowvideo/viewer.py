"""The viewer's asyncio shell: a flowlib client listening to the advertisement band (and,
for rate control, the local overflow band and the routers' fault band), then to the one
resolution band its :class:`~flowvideo.viewer_core.ViewerCore` picks; it refreshes its
request, reports congestion on the feedback band, and can move to other routers while
watching.

Moving is make-before-break: the viewer connects to the new routers, joins the advertisement
band and its resolution band there and asks for its resolution again, and only then closes
the old connection, so the stream continues with at most the frames in flight lost.

Imports flowlib, the wire layer's band names and the video modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import flowlib
from flowrouter.wire.bands import BAND_FAULT, BAND_OVERFLOW

from . import protocol as P
from .protocol import Resolution
from .viewer_core import Action, Play, SendMsg, Show, Subscribe, ViewerCore

M = TypeVar("M", bound=P.Message)

log = logging.getLogger("flowvideo.viewer")

FrameHook = Callable[[P.Frame], None]
AudioHook = Callable[[P.Audio], None]


class Viewer:
    def __init__(self, routers: Sequence[str], flow: flowlib.FlowID | str,
                 want: Resolution | str | None, *, name: str = "viewer", queue_size: int = 8,
                 playout: float = 2.0, connect_kwargs: dict[str, Any] | None = None,
                 on_frame: FrameHook | None = None, audio: bool = False,
                 on_audio: AudioHook | None = None, delay_limit: float = 0.3) -> None:
        self.routers = list(routers)
        self.flow = flowlib.FlowID.parse(flow) if isinstance(flow, str) else flow
        self.name = name
        self.queue_size = queue_size
        self.connect_kwargs = dict(connect_kwargs or {})
        self.on_frame = on_frame
        self.audio = audio      #: listen to the audio band too
        self.on_audio = on_audio
        self._want = want
        self._playout = playout
        self._delay_limit = delay_limit
        self.core: ViewerCore | None = None
        self.client: flowlib.FlowClient | None = None
        self.latest: P.Frame | None = None
        self.adverts = 0
        self.bad_messages = 0
        self.send_failures = 0
        self.moves = 0
        self.frame_event = asyncio.Event()   #: set at every shown frame (tests clear it)
        self.advert_event = asyncio.Event()
        self._frames_l: flowlib.Listener | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._reading = asyncio.Event()  #: cleared by pause(): frames then pile up
        self._reading.set()

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    @property
    def stats(self) -> Any:
        assert self.core is not None
        return self.core.stats

    # ---------------------------------------------------------------------- life cycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.core = ViewerCore(self.name, self._want, self._now(), playout=self._playout,
                               delay_limit=self._delay_limit)
        self.client = await self._connect(self.routers)
        await self._join(self.client)
        self._spawn(self._tick())

    async def _connect(self, routers: Sequence[str]) -> flowlib.FlowClient:
        kw = {"overflow_notice_every": 1, "overflow_notice_interval": 0.5,
              **self.connect_kwargs}
        return await flowlib.connect(list(routers), name=self.name, **kw)

    async def _join(self, client: flowlib.FlowClient) -> None:
        adv = await client.listen(self.flow, [P.BAND_ADVERT, BAND_OVERFLOW, BAND_FAULT],
                                  size=64, name="adverts")
        self._spawn(self._read_adverts(client, adv))
        if self.audio:
            sound = await client.listen(self.flow, P.BAND_AUDIO, size=64,
                                        overflow="drop-oldest", name="audio")
            self._spawn(self._read_audio(client, sound))
        assert self.core is not None
        if self.core.band is not None:
            await self._subscribe(client, self.core.band)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self._closed:
            log.warning("viewer %s: %s", self.name, task.exception())

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.client is not None:
            await self.client.close()

    async def __aenter__(self) -> Viewer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def move(self, routers: Sequence[str]) -> None:
        """Continue watching through *routers* (make-before-break; see the module docs)."""
        assert self.core is not None
        old = self.client
        new = await self._connect(routers)
        self.client, self.routers = new, list(routers)
        await self._join(new)
        self.moves += 1
        await self._apply(self.core.rejoined(self._now()))
        if old is not None:
            await old.close()

    async def set_want(self, want: Resolution | str | None) -> None:
        assert self.core is not None
        await self._apply(self.core.set_want(want, self._now()))

    # ---------------------------------------------------------------------- tasks
    async def _read_adverts(self, client: flowlib.FlowClient, lst: flowlib.Listener) -> None:
        assert self.core is not None
        async for msg in lst:
            if client is not self.client:
                return
            if msg.is_overflow:
                extra = msg.fault().extra
                if self._frames_l is not None and extra.get("listener") == self._frames_l.name:
                    try:  # our picture queue overflowed
                        dropped = int(extra.get("dropped", "1"))
                    except ValueError:
                        dropped = 1
                    await self._apply(self.core.on_overflow(dropped, self._now()))
                elif self.core.band is not None and "listener" not in extra \
                        and extra.get("band") == str(self.core.band):
                    # pictures of our band lost in pieces (a router dropped some of their
                    # fragments; the reassembly gave up, seconds later): evidence of loss on
                    # the path, like a router's fault (the missing numbers count the loss)
                    await self._apply(self.core.on_fault(True, self._now()))
                continue
            if msg.band == BAND_FAULT:
                try:
                    limit = msg.fault().extra.get("limit")
                except ValueError:
                    self.bad_messages += 1
                    continue
                await self._apply(self.core.on_fault(limit == "link-congested", self._now()))
                continue
            m = self._decoded(msg.payload, P.Advert, "advert")
            if m is None:
                continue
            self.adverts += 1
            self.advert_event.set()
            await self._apply(self.core.on_advert(m, self._now()))

    def _decoded(self, payload: bytes, kind: type[M], what: str) -> M | None:
        """*payload* as a *kind* message; None, counted in ``bad_messages``, when it does not
        decode or is another message (its band carries only *kind*)."""
        try:
            m = P.decode(payload)
        except P.ProtocolError as exc:
            self.bad_messages += 1
            log.debug("bad %s: %s", what, exc)
            return None
        if not isinstance(m, kind):
            self.bad_messages += 1
            return None
        return m

    def pause(self) -> None:
        """Stop taking frames off the queue (a stuck display): the queue overflows, and the
        overflow is reported to the streamer."""
        self._reading.clear()

    def resume(self) -> None:
        self._reading.set()

    async def _read_frames(self, client: flowlib.FlowClient, lst: flowlib.Listener) -> None:
        assert self.core is not None
        while True:
            await self._reading.wait()
            try:
                msg = await lst.get()
            except flowlib.ListenerClosed:
                return
            if self._frames_l is not lst:
                return
            m = self._decoded(msg.payload, P.Frame, "frame")
            if m is not None:
                await self._apply(self.core.on_frame(m, self._now()))

    async def _read_audio(self, client: flowlib.FlowClient, lst: flowlib.Listener) -> None:
        assert self.core is not None
        async for msg in lst:
            if client is not self.client:
                return
            m = self._decoded(msg.payload, P.Audio, "audio")
            if m is not None:
                await self._apply(self.core.on_audio(m, self._now()))

    async def _tick(self) -> None:
        assert self.core is not None
        while True:
            await self._apply(self.core.poll(self._now()))
            deadline = self.core.next_deadline()
            delay = 1.0 if deadline is None else max(0.0, deadline - self._now())
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    # ---------------------------------------------------------------------- actions
    async def _apply(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Show):
                self.latest = a.frame
                self.frame_event.set()
                if self.on_frame is not None:
                    self.on_frame(a.frame)
            elif isinstance(a, Play):
                if self.on_audio is not None:
                    self.on_audio(a.chunk)
            elif isinstance(a, Subscribe):
                assert self.client is not None
                await self._subscribe(self.client, a.band)
                self._wake.set()
            elif isinstance(a, SendMsg):
                await self._send(a.band, a.payload)

    async def _subscribe(self, client: flowlib.FlowClient, band: int) -> None:
        old = self._frames_l
        lst = await client.listen(self.flow, band, size=self.queue_size,
                                  overflow="drop-oldest", name=f"video-{band}")
        self._frames_l = lst
        self._spawn(self._read_frames(client, lst))
        # (after a move the old listener belongs to the client being closed)
        if old is not None and old in client.listeners(self.flow):
            with contextlib.suppress(flowlib.FlowError):
                await client.unlisten(old)

    async def _send(self, band: int, payload: bytes) -> None:
        if self.client is None:
            return
        try:
            await self.client.send(self.flow, payload, band=band)
        except (flowlib.FailoverInProgress, flowlib.ConnectionLost) as exc:
            self.send_failures += 1
            log.debug("viewer %s: send failed: %s", self.name, exc)

    # ---------------------------------------------------------------------- reporting
    def snapshot(self) -> dict[str, Any]:
        core = self.core
        s = None if core is None else core.stats
        return {
            "name": self.name, "routers": self.routers, "flow": str(self.flow),
            "resolution": None if core is None or core.resolution is None
            else str(core.resolution),
            "band": None if core is None else core.band,
            "frames": 0 if s is None else s.frames,
            "max_gap": 0.0 if s is None else round(s.max_gap, 3),
            "underruns": 0 if s is None else s.underruns,
            "takeovers": 0 if s is None else s.takeovers,
            "reports": 0 if s is None else s.reports,
            "dropped": 0 if s is None else s.dropped,
            "lost": 0 if s is None else s.lost,
            "delay": 0.0 if s is None else round(s.delay, 3),
            "max_delay": 0.0 if s is None else round(s.max_delay, 3),
            "backwards": 0 if s is None else s.backwards,
            "audio_chunks": 0 if s is None else s.audio_chunks,
            "av_skew": 0.0 if s is None else round(s.av_skew, 3),
            "adverts": self.adverts, "moves": self.moves, "bad_messages": self.bad_messages,
        }
