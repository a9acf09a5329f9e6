"""``flowrouter keygen``: make link keys and creator keys, list creator keys.

* ``keygen link [--id ID] [--out FILE]`` — a 32-byte pre-shared link key
  (:mod:`flowrouter.wire.linksecrets`). With ``--out`` the key goes to FILE (mode 0600, one
  hex line) and the printed ``[link_auth]`` snippet refers to it as ``file:FILE``; without, the
  snippet holds the key itself (paste it into every router of the overlay, keep it secret).
* ``keygen creator --out FILE`` — an Ed25519 creator key (:class:`~flowrouter.wire.creators.
  CreatorKey`, PEM, mode 0600); prints the creator ID it names flows with.
* ``keygen list [PATH ...]`` — the creator keys in files or directories (default: the state
  directory, ``$FLOWNET_STATE_DIR`` or ``~/.local/state/flownet``) with their creator IDs; a
  file that is not a key, or is readable by others, is listed with the reason.

Existing files are never overwritten unless ``--force`` is given. Tools layer.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from flowrouter import console
from flowrouter.wire.creators import CreatorKey
from flowrouter.wire.linksecrets import KEY_SIZE


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    kg = sub.add_parser("keygen", help="make link keys and creator keys; list creator keys",
                        description=__doc__.split("\n\n")[0] if __doc__ else None)
    ksub = kg.add_subparsers(dest="keygen", metavar="KIND")
    ksub.required = True
    lk = ksub.add_parser("link", help="a pre-shared link key and its [link_auth] snippet")
    lk.add_argument("--id", default="site-key", metavar="ID",
                    help="the key id routers announce (default site-key)")
    lk.add_argument("--out", metavar="FILE", help="write the key to FILE (mode 0600)")
    lk.add_argument("--force", action="store_true", help="replace an existing FILE")
    cr = ksub.add_parser("creator", help="an Ed25519 creator key (flows and capabilities)")
    cr.add_argument("--out", required=True, metavar="FILE", help="key file to write (PEM)")
    cr.add_argument("--force", action="store_true", help="replace an existing FILE")
    ls = ksub.add_parser("list", help="creator keys and their creator IDs")
    ls.add_argument("paths", nargs="*", metavar="PATH", help="key files or directories "
                    "(default: the state directory)")


def _refuse_existing(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise console.UsageError(f"{path} exists; pass --force to replace it")


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _is_pem(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(11) == b"-----BEGIN "
    except OSError:
        return False


def _state_dir() -> Path:
    env = os.environ.get("FLOWNET_STATE_DIR")
    return Path(env) if env else Path.home() / ".local" / "state" / "flownet"


def run(args: argparse.Namespace) -> int:
    if args.keygen == "link":
        secret = os.urandom(KEY_SIZE).hex()
        if args.out:
            out = Path(args.out)
            _refuse_existing(out, args.force)
            _write_secret(out, secret + "\n")
            spec = f"file:{out.resolve()}"
            print(f"# wrote link key {args.id!r} to {out} (mode 0600); copy it to every router")
        else:
            spec = f"hex:{secret}"
            print(f"# link key {args.id!r}: keep it secret; the same on every router")
        print(f'[link_auth]\nkey_id = "{args.id}"\n[link_auth.keys]\n{args.id} = "{spec}"')
        return 0
    if args.keygen == "creator":
        out = Path(args.out)
        _refuse_existing(out, args.force)
        key = CreatorKey.generate()
        key.save(out)
        print(f"{out}: creator {key.creator_id:016x}")
        return 0
    paths = [Path(p) for p in args.paths] or [_state_dir()]
    files: list[Path] = []
    for p in paths:
        if p.is_dir():  # creator keys: every .pem, and the .key files that are PEM too
            files += sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")
                            and (f.suffix == ".pem" or f.suffix == ".key" and _is_pem(f)))
        elif p.exists():
            files.append(p)
        else:
            raise console.UsageError(f"{p}: no such file or directory")
    found = 0
    for f in files:
        try:
            key = CreatorKey.load(f)
        except (ValueError, OSError) as exc:
            print(f"{f}: not usable: {' '.join(str(exc).split())}")
            continue
        found += 1
        print(f"{f}: creator {key.creator_id:016x}")
    if not found:
        print(f"no creator keys in {', '.join(str(p) for p in paths)}")
    return 0 if found else 1


__all__ = ["add_parser", "run"]
