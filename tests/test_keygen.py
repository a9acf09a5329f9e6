"""`flowrouter keygen`: link keys whose snippet a router config accepts, creator keys that
load, a listing of creator keys, and no silent overwrite."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from flowrouter.net.configfile import load_config
from flowrouter.tools.cli import main
from flowrouter.wire.creators import CreatorKey


@pytest.mark.parametrize("to_file", [False, True])
def test_link_key_snippet_is_a_working_config(tmp_path: Path, to_file: bool,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "lab.key"
    assert main(["keygen", "link", "--id", "lab", *(["--out", str(key)] if to_file else [])]) \
        == 0
    snippet = "\n".join(line for line in capsys.readouterr().out.splitlines()
                        if not line.startswith("#"))
    if to_file:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    cfg = tmp_path / "r.toml"
    cfg.write_text('[router]\nname = "r1"\n' + snippet + "\n")
    ring = load_config(cfg).keyring()
    assert ring is not None and len(ring.get("lab")) == 32


def test_creator_keys_are_made_listed_and_never_overwritten(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "keys" / "me.pem"
    assert main(["keygen", "creator", "--out", str(out)]) == 0
    cid = CreatorKey.load(out).creator_id
    assert f"{cid:016x}" in capsys.readouterr().out
    assert main(["keygen", "creator", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert CreatorKey.load(out).creator_id == cid
    (tmp_path / "keys" / "junk.pem").write_text("not a key")
    (tmp_path / "keys" / "junk.pem").chmod(0o600)
    assert main(["keygen", "list", str(tmp_path / "keys")]) == 0
    listing = capsys.readouterr().out
    assert f"me.pem: creator {cid:016x}" in listing and "junk.pem: not usable" in listing


def test_keygen_list_finds_creator_keys_named_dot_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README names creator keys ``creator.key``; link keys (not PEM) there are skipped."""
    assert main(["keygen", "creator", "--out", str(tmp_path / "creator.key")]) == 0
    assert main(["keygen", "link", "--id", "s", "--out", str(tmp_path / "site.key")]) == 0
    cid = CreatorKey.load(tmp_path / "creator.key").creator_id
    capsys.readouterr()
    assert main(["keygen", "list", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert f"creator.key: creator {cid:016x}" in listing and "site.key" not in listing
