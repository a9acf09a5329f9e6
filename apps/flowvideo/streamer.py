"""The streamer's asyncio shell: a flowlib client, a picture source, a
:class:`~flowvideo.streamer_core.StreamerCore` deciding what to do, and (as a backup) a
:class:`~flowvideo.streamer_core.BackupWatch` on the state band first.

A primary advertises the flow, listens to the request and feedback bands, and every time the
core says so grabs one picture, scales and encodes it for each resolution due (in a worker
thread, so timers stay on time; one :class:`~flowvideo.codecs.PictureEncoder` per band: JPEG,
or H.264 / VP8, whose key pictures the core asks for) and sends it on that resolution's
band; flowlib fragments pictures larger than a frame. A backup listens to the state band
only (it never receives the stream) and, when the core's watch says the primary is silent,
becomes the primary of the same stream.

Imports flowlib, Pillow (through :mod:`flowvideo.sources`), PyAV (through
:mod:`flowvideo.codecs`, for H.264 / VP8 only) and the video modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import flowlib

from . import protocol as P
from .audio import AudioEncoder, AudioSource, make_audio_encoder
from .codecs import PictureEncoder, make_encoder
from .sources import Source
from .streamer_core import (
    Action,
    BackupWatch,
    Encode,
    EncodeAudio,
    RateChanged,
    Send,
    Started,
    Stopped,
    StreamConfig,
    StreamerCore,
    read_state,
)

log = logging.getLogger("flowvideo.streamer")

EventHook = Callable[[str], None]


class Streamer:
    def __init__(self, client: flowlib.FlowClient, flow: flowlib.FlowID, source: Source,
                 config: StreamConfig | None = None, *, backup: bool = False,
                 on_event: EventHook | None = None, audio: AudioSource | None = None,
                 audio_codec: int = P.AUDIO_PCM) -> None:
        self.client = client
        self.flow = flow
        self.source = source
        self.cfg = config or StreamConfig()
        self.audio = audio  #: sound (with cfg.audio), on the audio band
        self.audio_encoder: AudioEncoder | None = (
            make_audio_encoder(audio_codec) if audio is not None and self.cfg.audio else None)
        self.audio_sent = 0
        self.backup = backup
        self.on_event = on_event
        self.core: StreamerCore | None = None
        self.watch: BackupWatch | None = None
        self.role = "backup" if backup else "primary"
        self.took_over_at: float | None = None   #: loop time of a backup's takeover
        self.silence: float | None = None        #: primary silence when the backup took over
        self.sent_frames: Counter[int] = Counter()   #: band -> frames sent
        self.sent_bytes: Counter[int] = Counter()    #: band -> payload bytes sent
        self.bad_messages = 0
        self.unauthenticated = 0  #: states refused: not sealed with the state key
        self.send_failures = 0
        self.step_downs = 0
        self._outranked: P.State | None = None
        self.events: list[tuple[float, Action | str]] = []
        self.serving = asyncio.Event()  #: set once this streamer streams (primary or took over)
        self.encoders: dict[int, PictureEncoder] = {}  #: band -> its encoder (while active)
        self.key_frames: Counter[int] = Counter()    #: band -> key pictures sent
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _say(self, text: str) -> None:
        log.info("%s", text)
        if self.on_event is not None:
            self.on_event(text)

    # ---------------------------------------------------------------------- running
    async def run(self) -> None:
        """Stream until cancelled (a backup follows the primary first; a primary that another
        primary outranks steps down and follows it)."""
        self._loop = asyncio.get_running_loop()
        if self.backup:
            await self._follow()
        else:
            self.core = StreamerCore(self.cfg, self._now())
        while True:
            outranked = await self._serve()
            if outranked is None:
                return
            self.step_downs += 1
            self.serving.clear()
            self._say(f"another streamer (incarnation {outranked.incarnation}) outranks this "
                      "one: stepping down to follow it")
            await self._follow(outranked)

    async def _follow(self, heard: P.State | None = None) -> None:
        watch = self.watch = BackupWatch(self.cfg, self._now())
        if heard is not None:
            watch.on_state(heard, self._now())
        self.role = "backup"
        listener = await self.client.listen(self.flow, P.BAND_STATE, size=64, name="state")
        self._say(f"backup: following the primary's state on band {P.BAND_STATE}, taking over "
                  f"after {watch.dead_after():.1f}s of silence")
        try:
            while True:
                timeout = max(0.0, watch.next_deadline() - self._now())
                try:
                    msg = await asyncio.wait_for(listener.get(), timeout)
                except TimeoutError:
                    take = watch.poll(self._now())
                    if take is not None:
                        break
                    continue
                state = self._state(msg.payload)
                if state is not None:
                    watch.on_state(state, self._now())
        finally:
            with contextlib.suppress(flowlib.FlowError):
                await self.client.unlisten(listener)
        now = self._now()
        self.took_over_at, self.silence = now, take.silent_for
        if take.state is None:
            self.core = StreamerCore(self.cfg, now)
            self._say(f"backup: no primary heard for {take.silent_for:.2f}s; streaming a new "
                      "stream")
        else:
            self.core = StreamerCore.resume(self.cfg, take.state, now, take.silent_for)
            self._say(f"backup: primary silent for {take.silent_for:.2f}s; taking over stream "
                      f"{take.state.stream:08x} at {take.state.media_ms / 1000:.2f}s with "
                      f"{len(take.state.encodings)} active resolution(s)")
        self.role = "primary (took over)"

    async def _serve(self) -> P.State | None:
        """Stream; returns the state of a streamer that outranks this one (else runs until
        cancelled or the connection is lost)."""
        core = self.core
        assert core is not None
        await self.client.advertise(self.flow)
        listener = await self.client.listen(
            self.flow, [P.BAND_REQUEST, P.BAND_FEEDBACK, P.BAND_STATE], size=1024,
            name="requests")
        self.serving.set()
        self._outranked = None
        reader = asyncio.ensure_future(self._read(listener))
        try:
            while True:
                await self._apply(core.poll(self._now()))
                if self._outranked is not None:
                    return self._outranked
                if reader.done():
                    reader.result()  # raises what ended it
                    return None
                delay = max(0.0, core.next_deadline() - self._now())
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, flowlib.FlowError):
                await reader
            with contextlib.suppress(flowlib.FlowError):
                await self.client.unlisten(listener)

    async def _read(self, listener: flowlib.Listener) -> None:
        core = self.core
        assert core is not None
        async for msg in listener:
            if msg.band == P.BAND_STATE:
                state = self._state(msg.payload)
                if state is not None and core.outranked_by(state):
                    self._outranked = state
                    self._wake.set()
                    return
                continue
            try:
                m = P.decode(msg.payload)
            except P.ProtocolError as exc:
                self.bad_messages += 1
                log.debug("bad message on band %d: %s", msg.band, exc)
                continue
            if (msg.band == P.BAND_REQUEST) != isinstance(m, P.Request) or \
                    (msg.band == P.BAND_FEEDBACK) != isinstance(m, P.Feedback):
                self.bad_messages += 1
                continue
            actions = core.on_message(m, self._now())
            if actions:
                await self._apply(actions)
            self._wake.set()

    def _state(self, payload: bytes) -> P.State | None:
        """A state from the state band, if it is one this streamer believes (sealed with the
        state key when one is set: else counted in ``unauthenticated``)."""
        try:
            return read_state(self.cfg, payload)
        except P.Unauthenticated:
            self.unauthenticated += 1
        except P.ProtocolError as exc:
            self.bad_messages += 1
            log.debug("bad message on the state band: %s", exc)
        return None

    # ---------------------------------------------------------------------- actions
    async def _apply(self, actions: list[Action]) -> None:
        encodes = [a for a in actions if isinstance(a, Encode)]
        sounds = [a for a in actions if isinstance(a, EncodeAudio)]
        for a in actions:
            if isinstance(a, (Encode, EncodeAudio)):
                continue
            self.events.append((self._now(), a))
            if isinstance(a, Send):
                await self._send(a.band, a.payload)
            elif isinstance(a, Started):
                self._say(f"start {a.resolution} on band {a.band} (asked by {a.viewer})")
            elif isinstance(a, Stopped):
                self.encoders.pop(a.band, None)  # a restart begins with a new encoder
                self._say(f"stop {a.resolution} on band {a.band} (no request for "
                          f"{a.idle:.1f}s)")
            elif isinstance(a, RateChanged):
                size = "" if a.scale == 1 else f", pictures at 1/{a.scale} size"
                self._say(f"band {a.band}: {a.fps:g} fps, quality {a.quality}{size} ({a.why})")
        if sounds:  # before the pictures: sound is small and must not wait for them
            await self._send_audio(sounds)
        if encodes:
            await self._encode_and_send(encodes)

    async def _send_audio(self, sounds: list[EncodeAudio]) -> None:
        core, source, encoder = self.core, self.audio, self.audio_encoder
        if core is None or source is None or encoder is None:
            return

        def render() -> list[bytes]:
            return [encoder.encode(source.read(a.media_ms, a.ms * encoder.rate // 1000,
                                               encoder.rate)) for a in sounds]
        try:
            chunks = await asyncio.to_thread(render)
        except Exception as exc:  # a source that failed once; keep the stream alive
            self._say(f"audio {source.name}: {exc}")
            return
        for a, data in zip(sounds, chunks):
            if not data:
                continue
            msg = P.Audio(core.stream, core.incarnation, a.seq, a.media_ms, encoder.codec,
                          encoder.rate, 1, a.ms * encoder.rate // 1000, data)
            if await self._send(P.BAND_AUDIO, P.encode_audio(msg)):
                self.audio_sent += 1

    async def _encode_and_send(self, encodes: list[Encode]) -> None:
        core = self.core
        assert core is not None
        try:
            pictures = await asyncio.to_thread(self._render, encodes)
        except Exception as exc:  # a source that failed once; keep the stream alive
            self._say(f"source {self.source.name}: {exc}")
            return
        for enc, (data, key) in zip(encodes, pictures):
            if not data:
                continue  # an encoder that holds a picture back (none of ours should)
            frame = P.Frame(core.stream, core.incarnation, enc.seq, enc.media_ms, enc.band,
                            enc.resolution, enc.quality, enc.fps, data, self.cfg.codec, key)
            payload = P.encode_frame(frame)
            if await self._send(enc.band, payload):
                self.sent_frames[enc.band] += 1
                self.sent_bytes[enc.band] += len(payload)
                self.key_frames[enc.band] += key
                core.on_sent(enc.band, len(data))
            elif key:
                core.on_send_failed(enc.band)  # the next picture is a key picture again

    def _render(self, encodes: list[Encode]) -> list[tuple[bytes, bool]]:
        picture = self.source.grab(encodes[0].media_ms)
        out = []
        for e in encodes:
            encoder = self.encoders.get(e.band)
            if encoder is None:
                encoder = self.encoders[e.band] = make_encoder(self.cfg.codec)
            out.append(encoder.encode(picture, e.resolution, e.quality, e.fps, e.media_ms,
                                      e.key))
        return out

    async def _send(self, band: int, payload: bytes) -> bool:
        # Pictures over the client's fragment_size go in fragments even when a router would
        # take them whole: a link then interleaves small pictures with a big one's pieces.
        fsize = self.client.fragment_size
        fragment = True if fsize is not None and len(payload) > fsize else None
        try:
            await self.client.send(self.flow, payload, band=band, fragment=fragment)
            return True
        except (flowlib.FailoverInProgress, flowlib.MessageTooLarge) as exc:
            self.send_failures += 1
            log.warning("send on band %d failed: %s", band, exc)
            return False

    # ---------------------------------------------------------------------- reporting
    def snapshot(self) -> dict[str, Any]:
        core = self.core
        encs = [] if core is None else [
            {"band": e.band, "resolution": str(e.resolution), "active": e.active,
             "fps": e.fps, "quality": e.quality, "scale": e.scale, "frames": e.frames,
             "cuts": e.cuts,
             "raises": e.raises, "viewers": sorted(e.viewers)} for e in core.encodings]
        return {"role": self.role, "flow": str(self.flow),
                "stream": None if core is None else f"{core.stream:08x}",
                "incarnation": None if core is None else core.incarnation,
                "encodings": encs, "sent_frames": dict(self.sent_frames),
                "sent_bytes": dict(self.sent_bytes), "key_frames": dict(self.key_frames),
                "codec": P.CODEC_NAMES[self.cfg.codec], "audio_sent": self.audio_sent,
                "bad_messages": self.bad_messages,
                "unauthenticated_states": self.unauthenticated,
                "send_failures": self.send_failures,
                "counters": {} if core is None else dict(core.counters),
                "time": time.time()}
