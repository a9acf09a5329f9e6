"""The flowrouter command: the demo (README's main job), config checking, status, help."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flownet.demo import run_demo
from flowrouter.net.config import ConfigError
from flowrouter.net.configfile import load_config
from flowrouter.net.runtime import RouterNode
from flowrouter.tools.cli import main


def test_demo_carries_traffic_and_filters(monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FLOWNET_STATE_DIR", str(tmp_path))
    assert asyncio.run(asyncio.wait_for(run_demo(count=3), 60)) == 0
    out = capsys.readouterr().out
    assert "A received 6: band 32 x3, band 33 x3" in out
    assert "B received 6: band 33 x3, band 34 x3" in out
    assert "r2 -> r1 carried 6 data frames" in out
    assert "demo OK" in out


GOOD = """
[router]
name = "r1"
listen = "127.0.0.1:7001"
core_lsids = [0x10]

[gc]
epoch = 2.0
ping_after = 2
delete_after = 4

[[peer]]
name = "r2"
address = "127.0.0.1:7002"
locality = { geography = 3 }

[routes]
0x20 = "r2"
default = "r2"
"""


def test_config_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "r1.toml"
    path.write_text(GOOD)
    cfg = load_config(path)
    assert cfg.name == "r1" and cfg.core_lsids == {0x10}
    assert cfg.peers[0].modifiers.geography == 3
    assert cfg.routes == {0x20: "r2"} and cfg.default_route == "r2"
    assert cfg.params().gc_delete_after == 4


@pytest.mark.parametrize("bad, words", [
    ('[router]\nname = "r1"\nlisten = "nonsense"', ["listen", "HOST:PORT"]),
    ('[router]\nname = "r1"\nlisten_on = "127.0.0.1:1"', ["unknown key", "listen_on", "[router]"]),
    ('[router]\nname = "r1"\n[gc]\nping_after = 5\ndelete_after = 3', ["gc_ping_after"]),
    ('[router]\nname = "r1"\n[[peer]]\nname = "x"', ["[[peer]] #1", "address"]),
    ('[router]\nname = "r1"\n[[peer]]\naddress = "1.2.3.4:5"\ntransport = "sctp"',
     ["transport", "sctp"]),
    ('[router]\nname = "r1"\ncore_lsids = [0]', ["LSID"]),
    ('[router]\nname = "r1"\n[[peer]]\naddress = "127.0.0.1:5"\nlocality = { height = 2 }',
     ["height"]),
    ('[router\nname = "r1"', ["not valid TOML", "line 1"]),
])
def test_config_errors_name_file_and_key(tmp_path: Path, bad: str, words: list[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert str(path) in text
    for w in words:
        assert w in text


def test_check_config_command(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r1.toml"
    path.write_text(GOOD)
    assert main(["check-config", str(path)]) == 0
    assert "OK: router r1" in capsys.readouterr().out
    path.write_text('[router]\nname = "r1"\nbogus = 1')
    assert main(["check-config", str(path)]) == 2
    assert "bogus" in capsys.readouterr().err


def test_in_process_commands_leave_the_event_loop_policy_alone(tmp_path: Path) -> None:
    """uvloop is the routers' default loop; a command called in-process (tests, tools) must
    not switch the caller's asyncio to it (uvloop lacks some loop methods asyncio has)."""
    before = asyncio.get_event_loop_policy()
    path = tmp_path / "r1.toml"
    path.write_text(GOOD)
    for argv in (["check-config", str(path)], ["--uvloop", "check-config", str(path)]):
        assert main(argv) == 0
        assert asyncio.get_event_loop_policy() is before


def test_routers_run_on_uvloop_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrouter.tools.cli import _use_uvloop

    uvloop = pytest.importorskip("uvloop")  # a dependency of flownet on CPython
    before = asyncio.get_event_loop_policy()
    try:
        monkeypatch.delenv("FLOWNET_UVLOOP", raising=False)
        assert _use_uvloop(None) == f"uvloop {uvloop.__version__}"
        assert isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy)
        asyncio.set_event_loop_policy(before)
        assert _use_uvloop(False) == "asyncio (uvloop turned off)"
        monkeypatch.setenv("FLOWNET_UVLOOP", "0")
        assert _use_uvloop(None) == "asyncio (uvloop turned off)"
        assert asyncio.get_event_loop_policy() is before
        assert _use_uvloop(True).startswith("uvloop")  # the flag wins over the environment
    finally:
        asyncio.set_event_loop_policy(before)


def test_run_needs_a_name(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["run"]) == 2
    assert "--name" in capsys.readouterr().err


def test_help_explains_every_run_option(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for opt in ("--config", "--listen", "--udp", "--control", "--peer", "--core-lsid",
                "--route", "--default-route", "--epoch", "examples:"):
        assert opt in out


def test_status_command_against_a_running_router(capsys) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        from flowrouter.net.config import NodeConfig
        node = RouterNode(NodeConfig("rs", listen="127.0.0.1:0", control="127.0.0.1:0",
                                     core_lsids=frozenset({0x10})))
        await node.start()
        try:
            ctl = "%s:%d" % node.control_address
            assert await asyncio.to_thread(main, ["status", "--control", ctl]) == 0
            out = capsys.readouterr().out
            assert "router rs" in out and "LOCATION SERVICE ROUTES" in out and "0x10" in out
            assert "event loop: asyncio" in out  # this test's router runs on asyncio's loop
        finally:
            await node.stop()
        assert await asyncio.to_thread(main, ["status", "--control", ctl]) == 1
        assert "no router control interface answers" in capsys.readouterr().err
    asyncio.run(asyncio.wait_for(scenario(), 30))
