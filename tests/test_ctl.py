"""``flowrouter ctl`` against a real router on 127.0.0.1 with a control token (issue 15: commands
need proof): run as its own process, as an operator would, while the router runs here."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from flowrouter.net.config import NodeConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.tools.cli import main as flowrouter_main

from .checkout import PYTHONPATH
from .rawep import run

TOKEN = "s3cret-token-123"
KEY = "hex:" + "ab" * 32
ROOT = str(Path(__file__).resolve().parents[1])


async def _ctl(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flowrouter.tools.cli", "ctl", *argv, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _secret_file(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def test_ctl_signs_commands_and_says_why_it_is_refused(tmp_path: Path) -> None:
    token_file = _secret_file(tmp_path / "control.token", TOKEN)
    key_file = _secret_file(tmp_path / "site.key", KEY[4:])

    async def main() -> None:
        # "x" is a router it knows (commands for unknown peers are refused)
        node = RouterNode(NodeConfig("core", listen="127.0.0.1:0", control="127.0.0.1:0",
                                     control_token=TOKEN, accept_routers=["x@127.0.0.1"],
                                     link_keys={"site": KEY}))
        await node.start()
        try:
            ctl = "%s:%d" % node.control_address
            rc, out, err = await _ctl("--control", ctl, "ping")
            assert rc == 0 and json.loads(out)["name"] == "core"
            rc, out, err = await _ctl("--control", ctl, "link", "peer=x", "up=false")
            assert rc == 1 and "not authorised" in err and "needs proof" in err
            assert len(err.strip().splitlines()) == 1
            rc, out, err = await _ctl("--control", ctl, "--token-file", token_file,
                                      "link", "peer=x", "up=false")
            assert rc == 0 and json.loads(out) == {"closed": 0}, err
            assert "x" in node.blocked_peers
            rc, out, err = await _ctl("--control", ctl, "--token-env", "CTL_TEST_TOKEN",
                                      "link", "peer=x", "up=true",
                                      env={"CTL_TEST_TOKEN": "a-wrong-token-456"})
            assert rc == 1 and "bad proof" in err and "control token" in err
            assert "x" in node.blocked_peers  # still down: the wrong token changed nothing
            # a link key is shared with a peer router: by default it proves a link, not
            # the right to command this router
            rc, out, err = await _ctl("--control", ctl, "--link-key", f"site:{key_file}",
                                      "emulate", "peer=x", "delay=0.05", "loss=0.01")
            assert rc == 1 and "not authorised" in err and "control_link_keys" in err, err
            assert node.core.counters["refused.command"] == 3
        finally:
            await node.stop()
        # where the operator allows it, a link key signs commands too
        node = RouterNode(NodeConfig("core", listen="127.0.0.1:0", control="127.0.0.1:0",
                                     control_token=TOKEN, accept_routers=["x@127.0.0.1"],
                                     link_keys={"site": KEY}, control_link_keys=True))
        await node.start()
        try:
            ctl = "%s:%d" % node.control_address
            rc, out, err = await _ctl("--control", ctl, "--link-key", f"site:{key_file}",
                                      "emulate", "peer=x", "delay=0.05", "loss=0.01")
            assert rc == 0 and "50 ms delay" in json.loads(out)["emulation"], err
        finally:
            await node.stop()
    run(main())


def test_ctl_usage_errors_are_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    def ctl(*argv: str) -> tuple[int, str]:
        rc = flowrouter_main(["ctl", *argv])
        return rc, capsys.readouterr().err.strip()

    rc, err = ctl("--control", "127.0.0.1:1", "reboot")
    assert rc == 2 and "unknown command 'reboot'" in err and "emulate" in err
    rc, err = ctl("--control", "127.0.0.1:1", "--link-key", "site:" + KEY, "ping")
    assert rc == 2 and "never on the command line" in err
    rc, err = ctl("--control", "127.0.0.1:1", "--token-env", "CTL_TEST_UNSET_VAR", "ping")
    assert rc == 2 and "CTL_TEST_UNSET_VAR is not set" in err
    short = _secret_file(tmp_path / "short.token", "abc")
    rc, err = ctl("--control", "127.0.0.1:1", "--token-file", short, "link", "peer=x")
    assert rc == 2 and "at least 12 characters" in err
    rc, err = ctl("--control", "127.0.0.1:1", "link", "peer")
    assert rc == 2 and "KEY=VALUE" in err
    with socket_closed_port() as port:
        rc, err = ctl("--control", f"127.0.0.1:{port}", "ping")
    assert rc == 1 and "no router control interface answers" in err
    assert len(err.splitlines()) == 1


class socket_closed_port:  # noqa: N801 (a context manager read like a function)
    """A port on 127.0.0.1 that nothing listens on (bound, never listening, while in use)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
