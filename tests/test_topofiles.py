"""Shipped topologies are found without a checkout next to the package: from the working
directory or its parents (what an installed `flowchat experiment` relies on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrouter.testbed import topofiles


def test_topology_found_from_the_working_directory(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topofiles, "SHIPPED", tmp_path / "site-packages" / "topologies")
    (tmp_path / "topologies").mkdir()
    want = tmp_path / "topologies" / "seed003-testbed.toml"
    want.write_text('name = "x"\n')
    (tmp_path / "results").mkdir()
    monkeypatch.chdir(tmp_path / "results")  # e.g. `cd results && flowchat experiment`
    assert topofiles.find_topology("seed003-testbed.toml") == want


def test_shipped_topology_comes_first() -> None:
    assert topofiles.find_topology("two-site.toml") == topofiles.SHIPPED / "two-site.toml"
    assert (topofiles.SHIPPED / "two-site.toml").is_file()
    assert "seed003-testbed.toml" in topofiles.shipped_names()


def test_without_package_data_the_path_named_is_the_users(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No shipped copy and none around: the error names topologies/NAME, never a path
    inside the installed package."""
    monkeypatch.setattr(topofiles, "SHIPPED", tmp_path / "site-packages" / "topologies")
    monkeypatch.chdir(tmp_path)
    want = Path("topologies/seed003-testbed.toml")
    assert topofiles.find_topology("seed003-testbed.toml") == want


def test_a_readme_topology_path_is_the_shipped_file_outside_a_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no topologies/ here
    for given in ("topologies/two-site.toml", "two-site.toml"):
        assert topofiles.resolve(given) == topofiles.SHIPPED / "two-site.toml"
    (tmp_path / "two-site.toml").write_text("mine")
    assert topofiles.resolve("two-site.toml") == Path("two-site.toml")  # the user's own wins
    assert topofiles.resolve("nope/two-site.toml") == Path("nope/two-site.toml")
