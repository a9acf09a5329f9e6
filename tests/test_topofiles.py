"""Shipped topologies are found without a checkout next to the package: from the working
directory or its parents (what an installed `flowchat experiment` relies on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrouter.testbed import topofiles


def test_topology_found_from_the_working_directory(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topofiles, "CHECKOUT", tmp_path / "site-packages" / "topologies")
    (tmp_path / "topologies").mkdir()
    want = tmp_path / "topologies" / "seed003-testbed.toml"
    want.write_text('name = "x"\n')
    (tmp_path / "results").mkdir()
    monkeypatch.chdir(tmp_path / "results")  # e.g. `cd results && flowchat experiment`
    assert topofiles.find_topology("seed003-testbed.toml") == want


def test_checkout_topology_comes_first() -> None:
    assert topofiles.find_topology("two-site.toml") == topofiles.CHECKOUT / "two-site.toml"
    assert (topofiles.CHECKOUT / "two-site.toml").is_file()
