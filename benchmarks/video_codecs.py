"""Bytes per second of flowvideo's picture codecs at each resolution, on the same pictures:
JPEG (every picture on its own, the default) beside H.264 (libx264) and VP8 (libvpx), the
inter-frame codecs PyAV brings (``pip install 'flownet[video]'``).

The pictures are the streamer's own sources, rendered at media times 0, 100, 200 ms ...
(10 fps): the moving test pattern (with its fine moving stripes: busy, like a screen with
video on it) and a calm one (bars and a moving box, like a desktop), each encoded at quality
75 at every resolution. Counts are bytes, not timings: load on the machine does not change
them. The inter-frame codecs send one key picture at the start (a viewer joining) and then
predicted ones; the table also gives the key picture's size (what a join or a switch costs).

    python3 benchmarks/video_codecs.py [--seconds 10] [--out benchmarks/results/video-codecs.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "apps")]

from flowvideo import protocol as P  # noqa: E402
from flowvideo.codecs import available, make_encoder  # noqa: E402
from flowvideo.protocol import Resolution  # noqa: E402
from flowvideo.sources import PatternSource  # noqa: E402

RESOLUTIONS = [Resolution(640, 480), Resolution(320, 240), Resolution(160, 120),
               Resolution(80, 60)]
FPS = 10


def measure(codec: int, detail: bool, res: Resolution, seconds: float,
            quality: int) -> dict[str, Any]:
    source = PatternSource(Resolution(640, 480), detail=detail)
    enc = make_encoder(codec)
    total = key_bytes = 0
    frames = round(seconds * FPS)
    for i in range(frames):
        media_ms = i * 1000 // FPS
        data, key = enc.encode(source.grab(media_ms), res, quality, FPS, media_ms, i == 0)
        total += len(data)
        if i == 0:
            key_bytes = len(data)
    return {"bytes_per_s": round(total / seconds), "kbit_per_s": round(total * 8 / seconds / 1000),
            "key_bytes": key_bytes, "frames": frames}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--quality", type=int, default=75)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    codecs = [c for c in (P.CODEC_JPEG, P.CODEC_H264, P.CODEC_VP8) if available(c)]
    rows: list[dict[str, Any]] = []
    for detail, content in ((True, "busy"), (False, "calm")):
        for res in RESOLUTIONS:
            row: dict[str, Any] = {"content": content, "resolution": str(res)}
            for codec in codecs:
                row[P.CODEC_NAMES[codec]] = measure(codec, detail, res, args.seconds,
                                                    args.quality)
            rows.append(row)
    names = [P.CODEC_NAMES[c] for c in codecs]
    print(f"quality {args.quality}, {FPS} fps, {args.seconds:g} s; bytes/s (key picture bytes)")
    print(f"{'content':8} {'size':>8} " + " ".join(f"{n:>18}" for n in names)
          + "".join(f" {'jpeg/' + n:>9}" for n in names[1:]))
    for row in rows:
        cells = " ".join(f"{row[n]['bytes_per_s']:>9} ({row[n]['key_bytes']:>6})" for n in names)
        ratios = "".join(f" {row['jpeg']['bytes_per_s'] / row[n]['bytes_per_s']:>8.1f}x"
                         for n in names[1:])
        print(f"{row['content']:8} {row['resolution']:>8} {cells}{ratios}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"quality": args.quality, "fps": FPS,
                                        "seconds": args.seconds, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
