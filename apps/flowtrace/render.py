"""Formatting numbers and rendering the report's blocks as Markdown and HTML.

A report is a list of blocks ``(kind, body)``: ``h1``/``h2``/``p`` (text), ``ul`` (lines),
``table`` ((header, rows)), ``img`` ((path, alt)), ``code``. Imports only the standard
library.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

Block = tuple[str, Any]


# ----------------------------------------------------------------------------- formatting
def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        if x == int(x) and abs(x) < 1e15:
            return f"{int(x):,}"
        if abs(x) >= 1e6:
            return f"{x:.{digits}g}"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def fmt_bytes(x: Any) -> str:
    if x is None:
        return "–"
    x = float(x)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(x) < 1024 or unit == "PiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(x)  # pragma: no cover


def pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


# ----------------------------------------------------------------------------- rendering
def render_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for kind, body in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + body)
        elif kind == "p":
            out.append(body)
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in body))
        elif kind == "img":
            path, alt = body
            out.append(f"![{alt}]({path})")
        elif kind == "table":
            header, rows = body
            esc = [[str(c).replace("|", "\\|") for c in r] for r in [header, *rows]]
            out.append("| " + " | ".join(esc[0]) + " |")
            out.append("|" + "|".join("---" for _ in header) + "|")
            out += ["| " + " | ".join(r) + " |" for r in esc[1:]]
        elif kind == "code":
            out.append("```\n" + body + "\n```")
        out.append("")
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;
padding:.25em .6em;text-align:right}th{background:#f3f3f3}td:first-child,th:first-child
{text-align:left}img{max-width:100%;border:1px solid #eee}code,pre{background:#f6f6f6}
pre{padding:.6em;overflow-x:auto}"""


def _inline(text: str) -> str:
    """Escape, then render `code` and **bold** spans."""
    parts = html.escape(text).split("`")
    for i in range(1, len(parts), 2):
        parts[i] = f"<code>{parts[i]}</code>"
    out = "".join(parts)
    bits = out.split("**")
    for i in range(1, len(bits), 2):
        bits[i] = f"<b>{bits[i]}</b>"
    return "".join(bits)


def render_html(blocks: Sequence[Block], title: str) -> str:
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"]
    for kind, body in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append(f"<{kind}>{_inline(body)}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_inline(body)}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in body) + "</ul>")
        elif kind == "img":
            path, alt = body
            out.append(f"<p><img src='{html.escape(path)}' alt='{html.escape(alt)}'></p>")
        elif kind == "table":
            header, rows = body
            out.append("<table><tr>" + "".join(f"<th>{_inline(str(h))}</th>" for h in header)
                       + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in r) + "</tr>"
                    for r in rows]
            out.append("</table>")
        elif kind == "code":
            out.append(f"<pre>{html.escape(body)}</pre>")
    out.append("</body></html>")
    return "\n".join(out)
