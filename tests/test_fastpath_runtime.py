"""The fast path inside real routers over loopback: which engine runs, and what it delivers.

The normal run (``.ci/run`` builds the extension) must use the compiled engine whenever a
compiler exists; ``FLOWNET_NATIVE=0`` must leave every frame to the core; either way the
routers deliver the same messages, whole, in order, including frames split across reads
and control frames interleaved with data in one read.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from flowrouter.core.fastpath import engine_choice
from flowrouter.tools.cli import format_status
from flowrouter.wire import control as C
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import pack_header
from tests.fastpath_support import compiler_present, native_module, use_engine

from .rawep import RawEndpoint, chain

FLOW = FlowID(0xB2, 0x10, 7)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_routers_use_the_compiled_engine_when_a_compiler_is_present(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWNET_NATIVE", raising=False)
    if not compiler_present():
        pytest.skip("no C compiler: routers forward in Python here")
    assert native_module() is not None

    async def main() -> None:
        async with chain(1) as nodes:
            st = nodes[0].status()["fast_path"]
            assert st["native"] is True and "compiled" in st["engine"]
            assert "forwarding: fast path, compiled engine" in format_status(nodes[0].status())
    run(main())


def test_python_path_is_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWNET_NATIVE", "0")

    async def main() -> None:
        async with chain(1) as nodes:
            assert nodes[0].fast is None
            assert "FLOWNET_NATIVE=0" in nodes[0].status()["fast_path"]["why"]
            assert "forwarding: fast path off" in format_status(nodes[0].status())
    run(main())


def test_a_router_whose_engine_did_not_load_says_so_as_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An engine turned off is the operator's choice (info); one that failed to import
    leaves every frame to the Python core, 25-100x slower, and must not pass unseen."""
    from flowrouter.net import node

    def broken(env: str | None = None) -> tuple[None, str]:
        return None, "fast path unavailable: compiled engine not built (test)"

    async def main() -> None:
        async with chain(1) as nodes:
            assert nodes[0].fast is None

    monkeypatch.delenv("FLOWNET_NATIVE", raising=False)
    monkeypatch.setattr(node, "engine_choice", broken)
    with caplog.at_level(logging.INFO, logger="flowrouter.net.runtime"):
        run(main())
    said = [r for r in caplog.records if "forwards with" in r.getMessage()]
    assert said and all(r.levelno == logging.WARNING for r in said), said
    assert "not built" in said[0].getMessage()
    caplog.clear()
    monkeypatch.setenv("FLOWNET_NATIVE", "0")
    monkeypatch.setattr(node, "engine_choice", engine_choice)
    with caplog.at_level(logging.INFO, logger="flowrouter.net.runtime"):
        run(main())
    said = [r for r in caplog.records if "forwards with" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said), said


@pytest.mark.parametrize("engine", ["native", "twin", "0"])
def test_mixed_stream_split_across_reads_arrives_whole_and_in_order(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    use_engine(engine, monkeypatch)

    async def main() -> None:
        async with chain(3) as nodes:
            a = await RawEndpoint.connect(nodes[0], "A")
            b = await RawEndpoint.connect(nodes[-1], "B")
            assert (await a.join(FLOW, 1)).status is C.JoinStatus.OK
            assert (await b.join(FLOW, 1 | 1 << 40 | 1 << 90)).status is C.JoinStatus.OK
            frames, want = [], []
            for i in range(400):
                band = (40, 90, 41)[i % 3]  # band 41: nobody wants it
                body = (b"%05d" % i) * (1 + i % 7) + bytes(i * 7 % 3000)
                frames.append(pack_header(FLOW.key, len(body), band) + body)
                if band != 41:
                    want.append(body)
                if i % 50 == 0:  # control frames among the data: A's mask, unchanged
                    mask = C.Mask(1).encode()
                    frames.append(pack_header(FLOW.key, len(mask), 0) + mask)
            blob = b"".join(frames)
            cuts = [0, *range(7, len(blob), 9973), len(blob)]
            for lo, hi in zip(cuts, cuts[1:]):
                a.send_raw(blob[lo:hi])  # frames split across writes (and reads) everywhere
                await a.writer.drain()
            got = [p for _, p in await b.data(len(want), timeout=20)]
            assert got == want
            for node in nodes:
                assert node.core.counters["malformed"] == 0
            first = nodes[0].core.counters
            assert first["forwarded"] >= len(want)
            if engine != "0":
                st = nodes[0].status()["fast_path"]
                assert st["native"] is (engine == "native")
                assert st["mirrored_flows"] >= 1 and st["calls"] > 0
                if engine == "native":  # the flow's routing is a class of its own
                    assert st["routing_classes"] >= 1 and st["routing_classes_refused"] == 0
                    assert st["lookup_slots"] >= st["mirrored_flows"]
                    assert st["lookup_tombstones"] >= 0 and st["lookup_longest_probe"] >= 1
            for ep in (a, b):
                await ep.close()
    run(main())
