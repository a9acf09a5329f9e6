"""``flowvideo``: multi-resolution video over one flow (seed 002 section 5.2).

    flowvideo serve --router 127.0.0.1:7001 --source pattern [--resolutions 320x240,160x120]
    flowvideo serve --router 127.0.0.1:7001 --source file:film.mp4 --audio file:film.mp4 \\
        --codec h264
    flowvideo serve --router 127.0.0.1:7002 --backup --flow FLOW
    flowvideo watch --router 127.0.0.1:7003 --flow FLOW --resolution 160x120
    flowvideo web   --router 127.0.0.1:7003 --flow FLOW --listen 127.0.0.1:8090
    flowvideo demo  [--duration 12] [--web 8090]

Errors are one line on stderr (exit status 1; 2 for bad arguments).

Imports flowlib (and its shared connection flags) and the video modules; Pillow is imported
by the commands, and its absence is one line too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import flowlib
from flowlib.cliopts import add_connection_options, connect_kwargs, routers
from flowrouter import console

from . import protocol as P
from .streamer_core import StreamConfig
from .viewer_core import parse_want

DESCRIPTION = """\
Video over flows. One flow carries a stream: an advertisement band (32) lists the resolutions
and their bands, viewers ask for one on the request band (33), congestion reports go on the
feedback band (34), a backup streamer follows the primary on the state band (35), and each
active resolution has its own band (40, 41, ...). Routers forward a band only toward viewers
that watch it.
"""

EPILOG_SERVE = """\
Sources: 'pattern[:WxH]' (a moving test pattern), 'screen:DISPLAY' (an X display, e.g.
screen::99 for an Xvfb on :99; Pillow grabs it over XCB), 'file:PATH' (a video file: MP4,
MKV, WebM, ... through PyAV; or an animated GIF, APNG or WebP, or a still picture; played in
a loop), 'camera[:DEVICE[@FORMAT]]' (a capture device: /dev/video0 by default, or any
FFmpeg input format, e.g. camera:0@avfoundation; PyAV).

Sound (--audio): 'tone' (a beep every second), 'file:PATH' (the sound track of a video file;
with --source file:PATH the same file keeps picture and sound together) or 'none'. It goes on
the audio band (36) in --audio-chunk-ms chunks stamped with the pictures' media clock; a
viewer measures the audio/video skew ('watch --audio'). Codec: opus (32 kbit/s, PyAV) or pcm
(16 kHz, 256 kbit/s, no extra package).

A resolution starts when a viewer requests it and stops when no request came for
--expire-periods x --request-period seconds (viewers refresh every request period, which the
advertisement tells them).

Rate control from the network: a viewer reports congestion of its resolution when it loses
pictures (its queue overflowed, or a router dropped them: numbers missing; a router's
link-congested fault on the fault band marks those), or when its queueing delay (arrival
minus media time, above the least it saw) passes --delay-limit (0.3 s). The streamer lowers
that resolution only: its frame rate to what the viewer's received rate fits (else by half;
down to --min-fps), then its quality (down to --min-quality), then its picture size (1/2,
1/4 ... down to 1/--max-scale). After --recover-after quiet seconds it probes one step back
up; a probe that brings reports back doubles the wait (up to --max-recover-after).

Without --flow the primary creates a flow and prints it (and writes it to --flow-file). A
backup (--backup --flow FLOW) listens to the state band only and takes over the same stream
(same flow, media time, frame numbers and active resolutions) when the primary is silent for
--dead-after seconds.

What senders on the flow can make the streamer do. Viewers are the names in their messages
(claims: flownet does not tell who sent a message). A name holds one resolution at a time
(its request for another takes it off the first); a resolution tracks at most --max-viewers
names, and --max-active N caps the resolutions encoding at once (default 0: all), whatever
names ask. A congestion report counts only from a current viewer of that resolution, and cuts
it only when more than --feedback-share (0.5) of its viewers reported within a request
period: one viewer cannot degrade the others' pictures. Key-picture requests (H.264, VP8)
get at most one key picture per resolution per 0.5 s. --state-key FILE (the same secret
file at the primary and its backup; 32+ hex digits or 16+ bytes) seals state messages with
HMAC-SHA256 and makes both believe only sealed ones: without it any sender on the state band
can make a primary step down or keep a backup from taking over.
"""

EPILOG_WATCH = """\
The viewer joins the advertisement band first, then the band of the resolution it wants
(WxH, 'lowest' or 'highest'), and prints one status line per second. --move-to ROUTERS moves
the viewer to other routers after --move-after seconds (make-before-break) to show that the
stream continues. --save DIR writes every --save-every-th picture as a JPEG file.
"""


EPILOG_WEB = """\
The page (/) plays the stream in a video element (fragmented MP4, H.264, through Media
Source Extensions; needs PyAV) or as MJPEG (?mode=mjpeg), fits it to the window (?fit=0: 1:1)
and shows the frame rate, the delay and the stalls. A standard player opens the same stream:
  ffplay -fflags nobuffer 'http://HOST:PORT/stream.mp4?res=320x240'
  vlc 'http://HOST:PORT/stream.mp4?res=320x240'
Every player connection gets its own encoder and starts with a key picture; pictures of any
flow codec (JPEG, H.264, VP8) are decoded first. Also /stream.mjpg, /frame.jpg,
/resolutions.json and /status.json (?res=WxH picks the resolution).
"""


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _resolutions(text: str) -> tuple[P.Resolution, ...]:
    try:
        return P.parse_resolutions(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _want(text: str) -> P.Resolution | str:
    try:
        return parse_want(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _codec(text: str) -> int:
    from .codecs import parse_codec

    try:
        return parse_codec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _flow(text: str) -> flowlib.FlowID:
    try:
        return flowlib.FlowID.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad flow {text!r}: {exc}") from None


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"bad address {text!r} (want HOST:PORT)")
    return host or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = console.ArgumentParser(
        prog="flowvideo", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    console.add_logging_options(p, default_level=None)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="stream a source (primary, or --backup)",
                       epilog=EPILOG_SERVE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_options(s)
    s.add_argument("--flow", type=_flow, help="the stream's flow (default: create one)")
    s.add_argument("--flow-file", type=Path, help="write the flow's text form here")
    s.add_argument("--backup", action="store_true",
                   help="follow the primary of --flow and take over when it dies")
    s.add_argument("--source", default="pattern", help="pattern[:WxH], screen:DISPLAY or "
                   "file:PATH (default pattern)")
    s.add_argument("--audio", default="none", metavar="SPEC",
                   help="sound: none (default), tone, or file:PATH (a video file's track)")
    s.add_argument("--audio-codec", choices=["opus", "pcm"], default=None,
                   help="opus (default when PyAV has it) or pcm")
    s.add_argument("--audio-chunk-ms", type=int, default=40,
                   help="media milliseconds per audio message (20..1000, default 40)")
    s.add_argument("--resolutions", type=_resolutions, default="320x240,160x120,80x60",
                   help="resolutions on offer, largest first (default %(default)s)")
    s.add_argument("--fps", type=_positive, default=10.0, help="frame rate (default 10)")
    s.add_argument("--quality", type=int, default=75,
                   help="picture quality 1..95 (JPEG's scale; H.264 and VP8 map it to their "
                        "constant quality) (default 75)")
    s.add_argument("--codec", type=_codec, default=P.CODEC_JPEG, metavar="CODEC",
                   help="jpeg (default: every picture on its own, needs only Pillow), h264 or "
                        "vp8 (inter-frame, 4-10x smaller; need PyAV: pip install "
                        "'flownet[video]')")
    s.add_argument("--min-fps", type=_positive, default=1.0)
    s.add_argument("--min-quality", type=int, default=20)
    s.add_argument("--request-period", type=_positive, default=1.0)
    s.add_argument("--expire-periods", type=int, default=3)
    s.add_argument("--advert-period", type=_positive, default=0.5)
    s.add_argument("--state-period", type=_positive, default=0.2)
    s.add_argument("--dead-after", type=_positive, default=0.8)
    s.add_argument("--recover-after", type=_positive, default=2.0,
                   help="quiet seconds before a lowered resolution probes upward (default 2)")
    s.add_argument("--max-recover-after", type=_positive, default=16.0,
                   help="longest wait between probes after failed ones (default 16 s)")
    s.add_argument("--delay-limit", type=_positive, default=0.3,
                   help="queueing delay at a viewer that counts as congestion (default 0.3 s)")
    s.add_argument("--max-scale", type=int, default=4, choices=P.SCALES,
                   help="congestion may send pictures at 1/N of their size (default 4)")
    s.add_argument("--fragment-size", type=int, default=8000,
                   help="send pictures larger than this in fragments (default 8000)")
    s.add_argument("--max-active", type=int, default=0, metavar="N",
                   help="resolutions encoding at once at most (default 0: all)")
    s.add_argument("--max-viewers", type=int, default=64, metavar="N",
                   help="viewer names tracked per resolution (default 64)")
    s.add_argument("--feedback-share", type=float, default=0.5, metavar="F",
                   help="cut a resolution only when more than this share of its viewers "
                        "reported congestion (default 0.5)")
    s.add_argument("--state-key", type=Path, metavar="FILE",
                   help="shared secret of the primary and its backup (a file, never an "
                        "argument): state messages are sealed with it, unsealed ones refused")
    s.add_argument("--status-every", type=float, default=0.0,
                   help="print a JSON status line every this many seconds (0: never)")

    w = sub.add_parser("watch", help="watch a stream in the terminal (status lines)",
                       epilog=EPILOG_WATCH, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_options(w, policies=False)
    w.add_argument("--flow", type=_flow, required=True)
    w.add_argument("--resolution", type=_want, default="lowest",
                   help="WxH, lowest or highest (default lowest)")
    w.add_argument("--duration", type=_positive, help="stop after this many seconds")
    w.add_argument("--frames", type=int, help="stop after this many pictures")
    w.add_argument("--queue", type=int, default=8, help="receive queue, pictures (default 8)")
    w.add_argument("--playout", type=_positive, default=2.0,
                   help="playout buffer, seconds (gaps longer than this are underruns)")
    w.add_argument("--save", type=Path, help="directory to write pictures to")
    w.add_argument("--save-every", type=int, default=10)
    w.add_argument("--move-to", type=lambda t: [a for a in t.split(",") if a],
                   help="routers to move to (comma-separated)")
    w.add_argument("--move-after", type=_positive, default=5.0)
    w.add_argument("--json", action="store_true", help="status lines as JSON")
    w.add_argument("--audio", action="store_true",
                   help="listen to the sound too (the status shows the audio/video skew)")
    w.add_argument("--name", help="this viewer's name in requests and reports (default "
                                  "watch-HOST-PID; a name holds one resolution at a time)")

    b = sub.add_parser("web", help="serve the stream to web browsers and players (MP4, MJPEG)",
                       epilog=EPILOG_WEB, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_options(b, policies=False)
    b.add_argument("--flow", type=_flow, required=True)
    b.add_argument("--listen", type=_listen, default=("127.0.0.1", 8090),
                   help="HTTP address (default 127.0.0.1:8090)")
    b.add_argument("--idle-close", type=_positive, default=10.0,
                   help="leave a resolution nobody watched for this long (default 10 s)")
    b.add_argument("--max-clients", type=int, default=32)

    d = sub.add_parser("demo", help="three router processes, a primary and a backup "
                       "streamer, two viewers at different resolutions")
    d.add_argument("--duration", type=_positive, default=12.0)
    d.add_argument("--web", type=int, metavar="PORT",
                   help="also serve the stream to browsers on this port (0: any)")
    return p


# ------------------------------------------------------------------------------ commands
async def cmd_serve(args: argparse.Namespace) -> int:
    from .codecs import CodecUnavailable, available
    from .sources import open_source
    from .streamer import Streamer

    if not available(args.codec):
        raise CodecUnavailable(f"{P.CODEC_NAMES[args.codec]} needs PyAV with its encoder: "
                               "pip install 'flownet[video]'")
    cfg = StreamConfig(resolutions=args.resolutions, fps=args.fps, quality=args.quality,
                       codec=args.codec, audio=args.audio != "none",
                       audio_chunk_ms=args.audio_chunk_ms,
                       min_fps=args.min_fps, min_quality=args.min_quality,
                       request_period=args.request_period, expire_periods=args.expire_periods,
                       advert_period=args.advert_period, state_period=args.state_period,
                       dead_after=args.dead_after, recover_after=args.recover_after,
                       max_active=args.max_active, max_viewers=args.max_viewers,
                       feedback_share=args.feedback_share, delay_limit=args.delay_limit,
                       max_scale=args.max_scale, max_recover_after=args.max_recover_after,
                       state_key=(P.read_state_key(args.state_key.read_bytes())
                                  if args.state_key else None))
    if args.backup and args.flow is None:
        raise ValueError("--backup needs --flow (the primary's flow)")
    source = open_source(args.source)
    sound, sound_codec = _audio(args)
    client = await flowlib.connect(routers(args), name="flowvideo-backup" if args.backup
                                   else "flowvideo", fragment_size=args.fragment_size,
                                   **connect_kwargs(args))
    async with client:
        flow = args.flow or await client.create()
        print(f"flow {flow}", flush=True)
        if args.flow_file:
            args.flow_file.write_text(f"{flow}\n", encoding="utf-8")
        streamer = Streamer(client, flow, source, cfg, backup=args.backup,
                            on_event=lambda t: print(t, flush=True), audio=sound,
                            audio_codec=sound_codec)
        task = asyncio.ensure_future(streamer.run())
        try:
            while not task.done():
                every = args.status_every or 3600.0
                await asyncio.wait({task}, timeout=every)
                if args.status_every and not task.done():
                    print(json.dumps(streamer.snapshot()), flush=True)
            task.result()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return 0


def _audio(args: argparse.Namespace) -> tuple[Any, int]:
    """The sound source and codec --audio and --audio-codec ask for (None: no sound)."""
    from .audio import FileAudioSource, ToneSource, opus_available

    codec_name = args.audio_codec or ("opus" if opus_available() else "pcm")
    if codec_name == "opus" and not opus_available():
        raise ValueError("--audio-codec opus needs PyAV: pip install 'flownet[video]'")
    codec = P.AUDIO_OPUS if codec_name == "opus" else P.AUDIO_PCM
    kind, _, arg = args.audio.partition(":")
    if kind == "none":
        return None, codec
    if kind == "tone":
        return ToneSource(), codec
    if kind == "file" and arg:
        return FileAudioSource(arg), codec
    raise ValueError(f"bad --audio {args.audio!r} (none, tone or file:PATH)")


async def cmd_watch(args: argparse.Namespace) -> int:
    from .codecs import PictureDecoder
    from .sources import encode_jpeg
    from .viewer import Viewer

    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
    saved = 0
    decoder = PictureDecoder()  # H.264 / VP8 pictures are saved as JPEG files too

    def on_frame(frame: P.Frame) -> None:
        nonlocal saved
        if not args.save:
            return
        image = None if frame.codec == P.CODEC_JPEG else decoder.decode(frame)
        if frame.seq % max(1, args.save_every) == 0:
            data = frame.picture if image is None else encode_jpeg(
                image, P.Resolution(*image.size), 90)
            if frame.codec == P.CODEC_JPEG or image is not None:
                (args.save / f"frame-{frame.band}-{frame.seq:06d}.jpg").write_bytes(data)
                saved += 1

    name = args.name or f"watch-{socket.gethostname()[:40]}-{os.getpid()}"
    viewer = Viewer(routers(args), args.flow, args.resolution, name=name,
                    queue_size=args.queue, playout=args.playout,
                    connect_kwargs=connect_kwargs(args), on_frame=on_frame, audio=args.audio)
    loop = asyncio.get_running_loop()
    async with viewer:
        t0 = loop.time()
        moved = False
        while True:
            await asyncio.sleep(1.0)
            snap = viewer.snapshot()
            print(json.dumps(snap) if args.json else
                  f"[{loop.time() - t0:6.1f}s] {snap['resolution'] or 'waiting'} on band "
                  f"{snap['band']}: {snap['frames']} frames, longest gap {snap['max_gap']}s, "
                  f"underruns {snap['underruns']}, delay {snap['delay']}s, lost {snap['lost']}, "
                  f"congestion reports {snap['reports']}"
                  + (f", audio {snap['audio_chunks']} chunks, skew {snap['av_skew']}s"
                     if args.audio else ""),
                  flush=True)
            if args.move_to and not moved and loop.time() - t0 >= args.move_after:
                await viewer.move(args.move_to)
                moved = True
                print(f"moved to {','.join(args.move_to)}", flush=True)
            if args.duration and loop.time() - t0 >= args.duration:
                break
            if args.frames and snap["frames"] >= args.frames:
                break
    return 0


async def cmd_web(args: argparse.Namespace) -> int:
    from .web import WebViewer

    host, port = args.listen
    web = WebViewer(routers(args), str(args.flow), host=host, port=port,
                    connect_kwargs=connect_kwargs(args), idle_close=args.idle_close,
                    max_clients=args.max_clients)
    async with web:
        h, p = web.address
        print(f"watch flow {args.flow} at http://{h}:{p}/", flush=True)
        await asyncio.Event().wait()
    return 0


async def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    await run_demo(args.duration, args.web)
    return 0


COMMANDS = {"serve": cmd_serve, "watch": cmd_watch, "web": cmd_web, "demo": cmd_demo}


def main(argv: list[str] | None = None) -> int:
    """The ``flowvideo`` console script (errors and exit codes: flowrouter.console)."""
    return console.run("flowvideo", _main, argv)


def _main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        import PIL  # noqa: F401  (every command encodes or decodes pictures)
    except ImportError:
        print("flowvideo: error: needs Pillow: pip install 'flownet[video]'", file=sys.stderr)
        return 1
    console.setup_logging(args, node="flowvideo")
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head): the console wrapper's exit 141
        raise
    except (flowlib.FlowError, ValueError, OSError, RuntimeError) as exc:  # SourceError too
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"flowvideo {args.command}: error: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
