"""Picture sources that need PyAV (``pip install 'flownet[video]'``): video files and cameras.

* :class:`VideoFileSource`: the video stream of a file FFmpeg reads (MP4, MKV, WebM, ...),
  played in a loop at its own timestamps: ``grab(media_ms)`` gives the picture on screen at
  that media time (decoding forward; at the end it starts over). A backup that continues the
  media time continues the film.
* :class:`CameraSource`: a capture device (Video4Linux2 on Linux, e.g. ``/dev/video0``; any
  FFmpeg input format by name: ``avfoundation``, ``dshow``, ``x11grab``, or ``lavfi`` for a
  generated picture); a reader thread keeps only the newest picture, so a slow encoder
  never shows old ones.

Both raise :class:`~flowvideo.sources.SourceError` (one line) when the file or device cannot
be opened. The audio of a file is :mod:`flowvideo.audio`'s.

Imports PyAV, Pillow and :mod:`flowvideo.sources`.
"""

from __future__ import annotations

import threading
from typing import Any

from PIL import Image

from .sources import SourceError


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise SourceError("video files and cameras need PyAV: pip install 'flownet[video]'") \
            from None
    return av


class VideoFileSource:
    """A video file's pictures by media time, looped (see the module docs)."""

    def __init__(self, path: str) -> None:
        self.av = _av()
        self.path = path
        self.name = f"file {path}"
        self._lock = threading.Lock()
        self._container: Any = None
        self._frames: Any = None
        self._current: tuple[int, Image.Image] | None = None   #: (start ms, picture)
        self._next: tuple[int, Image.Image] | None = None
        self.loop_ms: int | None = None  #: the film's length, once known
        self.loops = 0
        self._open()
        if self._next is None:
            raise SourceError(f"{path} has no video pictures")

    def _open(self) -> None:
        if self._container is not None:
            self._container.close()
        try:
            self._container = self.av.open(self.path)
            stream = self._container.streams.video[0]
        except (self.av.error.FFmpegError, OSError, IndexError) as exc:
            raise SourceError(f"cannot read {self.path}: "
                              f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None
        stream.thread_type = "AUTO"
        if self._container.duration and self.loop_ms is None:
            self.loop_ms = max(1, self._container.duration // 1000)
        self._frames = self._container.decode(stream)
        self._current, self._next = None, self._read()

    def _read(self) -> tuple[int, Image.Image] | None:
        try:
            frame = next(self._frames)
        except (StopIteration, self.av.error.FFmpegError):
            return None
        t = frame.time if frame.time is not None else 0.0
        return round(t * 1000), frame.to_image()

    def grab(self, media_ms: int) -> Image.Image:
        with self._lock:
            pos = media_ms % self.loop_ms if self.loop_ms else media_ms
            if self._current is not None and pos < self._current[0]:
                self._open()  # looped (or asked for an earlier time): from the start
                self.loops += 1
            while self._next is not None and self._next[0] <= pos:
                self._current, self._next = self._next, self._read()
            if self._next is None and self.loop_ms is None and self._current is not None:
                self.loop_ms = self._current[0] + 1  # length unknown until the end
            if self._current is None:  # before the first picture's time
                assert self._next is not None
                return self._next[1]
            return self._current[1]


class CameraSource:
    """The newest picture of a capture device (see the module docs)."""

    def __init__(self, device: str = "/dev/video0", fmt: str = "v4l2") -> None:
        self.av = _av()
        self.name = f"camera {device}"
        try:
            self._container = self.av.open(device, format=fmt)
        except (self.av.error.FFmpegError, OSError, ValueError) as exc:
            raise SourceError(f"cannot open camera {device}: "
                              f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None
        self._latest: Image.Image | None = None
        #: pictures decoded so far; the condition is notified at each (wait_picture)
        self.pictures = 0
        self._new = threading.Condition()
        self._ready = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._reader, name=f"camera {device}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(10.0):
            self._stop = True
            raise SourceError(f"camera {device} gave no picture within 10 s")

    def _reader(self) -> None:
        try:
            for frame in self._container.decode(video=0):
                picture = frame.to_image()
                with self._new:
                    self._latest = picture
                    self.pictures += 1
                    self._new.notify_all()
                self._ready.set()
                if self._stop:
                    return
        except self.av.error.FFmpegError:
            return

    def grab(self, media_ms: int) -> Image.Image:
        if self._latest is None:
            raise SourceError(f"{self.name}: no picture")
        return self._latest

    def wait_picture(self, after: int, timeout: float) -> bool:
        """Wait until the device has given more than *after* pictures (``pictures``);
        False if none came within *timeout* seconds."""
        with self._new:
            return self._new.wait_for(lambda: self.pictures > after, timeout)

    def close(self) -> None:
        """Stop the reader, then close the device (never under a decode in progress)."""
        self._stop = True
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        if not self._thread.is_alive():
            self._container.close()
