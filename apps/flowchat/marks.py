"""Display marks on disk: what a site server has shown, per stream, and the last message it
sent, kept beside the site's state so that a restarted server shows live traffic first,
fetches only what it did not show (in the background, flagged late; its own last messages,
sent but not shown yet when it stopped, included) and never shows a message twice.

The ordering core computes the marks (:meth:`flowchat.igo.SiteOrdering.display_marks` and
:meth:`~flowchat.igo.SiteOrdering.sent_mark`) and takes them back at start-up (``shown=``,
``sent=``); this module only reads and writes the file (JSON,
written to a temporary file and renamed, so a crash leaves the old marks or the new ones,
never half a file). Imports only the standard library."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

VERSION = 1


def state_base(state_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory a site's state lives in: *state_dir*, else ``$FLOWNET_STATE_DIR``, else
    ``$XDG_STATE_HOME/flownet`` or ``~/.local/state/flownet`` (as flowlib's)."""
    if state_dir:
        return Path(state_dir)
    env = os.environ.get("FLOWNET_STATE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"),
                "flownet")


def marks_path(state_dir: str | os.PathLike[str] | None, room: str, site: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{room}-{site}")
    return state_base(state_dir) / f"flowchat-{safe}.marks.json"


def load_marks(path: str | os.PathLike[str]) -> list[tuple[str, int, int]]:
    """The marks saved at *path* (none if there is no file or it cannot be read: a site
    that cannot tell what it showed shows its history again, flagged late)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return []
    out = []
    for item in data.get("marks", []):
        if (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                and all(isinstance(x, int) and x >= 0 for x in item[1:])):
            out.append((item[0], item[1], item[2]))
    return out


def load_sent(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """The sent mark saved at *path*, ``(incarnation, seq)`` of the last run's last own
    message (None if there is none)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sent = data.get("sent") if isinstance(data, dict) and data.get("version") == VERSION \
        else None
    if (isinstance(sent, list) and len(sent) == 2
            and all(isinstance(x, int) and x >= 0 for x in sent)):
        return (sent[0], sent[1])
    return None


def save_marks(path: str | os.PathLike[str], marks: Iterable[tuple[str, int, int]],
               sent: tuple[int, int] | None = None) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    data: dict[str, object] = {"version": VERSION, "marks": [list(m) for m in marks]}
    if sent is not None:
        data["sent"] = list(sent)
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, p)
