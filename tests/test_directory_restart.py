"""A directory member outlives its router (issue 14): ``flowdir serve`` (a real process) on a
real loopback router keeps its entries when that router is stopped and started again,
reconnects and rejoins the directory flow by itself, and answers lookups again."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from flowdir import DirectoryClient, NoDirectoryMember
from flowlib import ConnectError, ConnectionLost, FlowID
from flowrouter.net.config import NodeConfig
from flowrouter.net.runtime import RouterNode

from .checkout import PYTHONPATH

LSID = 0x10
ROOT = Path(__file__).resolve().parents[1]
FLOW = FlowID(0x1234, LSID, 5)


async def _router(listen: str) -> RouterNode:
    node = RouterNode(NodeConfig("solo", listen=listen, default_lsid=LSID,
                                 core_lsids=frozenset({LSID})))
    await node.start()
    return node


async def _find(address: str, state_dir: str, timeout: float = 40.0,
                name: str = "svc/restart") -> list[str]:
    """Look *name* up until a member answers with it; returns the members holding it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = "nothing tried"
    while loop.time() < deadline:
        try:
            async with await DirectoryClient.connect([address], name="asker", lsid=LSID,
                                                     state_dir=state_dir, timeout=2) as dc:
                result = await dc.lookup(name, expanding=False, window=0.5)
                if result.matches:
                    assert result.matches[0].flow == FLOW
                    return list(result.matches[0].members)
                last = "a member answered without the entry"
        except (NoDirectoryMember, ConnectError, ConnectionLost) as exc:
            last = str(exc)
        await asyncio.sleep(0.2)
    raise AssertionError(f"no member answered the lookup in {timeout}s: {last}")


def test_flowdir_serve_survives_a_restart_of_its_router(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        node = await _router("127.0.0.1:0")
        address = "%s:%d" % node.tcp_address
        env = dict(os.environ, PYTHONPATH=PYTHONPATH, FLOWNET_STATE_DIR=str(tmp_path / "m"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flowdir", "--router", address, "--lsid", hex(LSID),
            "serve", "--member-name", "keeper", "--no-sync", cwd=str(ROOT), env=env,
            stderr=asyncio.subprocess.PIPE)
        try:
            async with await DirectoryClient.connect([address], name="owner", lsid=LSID,
                                                     state_dir=str(tmp_path / "o")) as dc:
                # the member process is up once it answers (an empty list) ...
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 40
                while True:
                    try:
                        await dc.list(window=0.3)
                        break
                    except NoDirectoryMember:
                        assert loop.time() < deadline, "the member never answered"
                # ... and stores what is registered from then on
                await dc.register("svc/restart", FLOW, ttl=300)
            assert await _find(address, str(tmp_path / "a")) == ["keeper"]

            await node.stop()  # the member's router goes away ...
            node = await _router(address)  # ... and comes back on the same address
            # the member reconnects, rejoins the directory flow, and still has the entry
            assert await _find(address, str(tmp_path / "b")) == ["keeper"]
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            assert proc.stderr is not None
            err = (await asyncio.wait_for(proc.stderr.read(), 20)).decode()
            await asyncio.wait_for(proc.wait(), 20)
            await node.stop()
        assert "reconnecting" in err, err
        assert err.count("serving directory") == 2, err  # once per router life
        assert "Traceback" not in err, err

    asyncio.run(asyncio.wait_for(main(), 120))
