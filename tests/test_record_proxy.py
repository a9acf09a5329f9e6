"""An on-path attacker between two routers with a sealed link (issue 26): deleting,
reordering or replaying records, at a key update or not, fails the link with a counted error
(``malformed.bad-record``) instead of losing messages silently.

r1 dials r2 through a small TCP proxy on 127.0.0.1 that passes both handshakes and then
reads r1's sealed records one by one (length, counter in clear) and, once armed, tampers
with the stream once. ``[link_auth] rekey_records = 4``: r1 moves to a new key every four
records, so the test traffic crosses many key updates."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable

import pytest

import flowlib
from flowrouter.net.config import NodeConfig, PeerConfig
from flowrouter.net.runtime import RouterNode
from flowrouter.wire import control as C
from flowrouter.wire.flowid import FlowID
from flowrouter.wire.header import HEADER_SIZE
from flowrouter.wire.linkrecords import GEN_SHIFT

from .rawep import RawEndpoint, run, until, within

LSID = 0x10
KEYS = {"site": "hex:" + "3c" * 32}
_SIZE = struct.Struct("!I")

#: what the attacker does with the record it holds back (*held*) when the next one (*new*)
#: arrives, given whether they are under different keys; returns what it sends now, or None
#: to pass the pair on untouched
Attack = Callable[[bytes, bytes, bool], "list[bytes] | None"]

ATTACKS: dict[str, Attack] = {
    # the attack of the issue: the last record before a key update vanishes
    "delete-before-update": lambda held, new, update: [new] if update else None,
    "swap-at-update": lambda held, new, update: [new, held] if update else None,
    "replay-old-key-after-update": lambda held, new, update:
        [held, new, held] if update else None,
    "replay-at-update": lambda held, new, update: [held, new, new] if update else None,
    "delete-within-a-key": lambda held, new, update: [new] if not update else None,
}


def _gen(record: bytes) -> int:
    return int.from_bytes(record[4:12], "big") >> GEN_SHIFT


class RecordProxy:
    """Forwards TCP connections to *target*; on the dialler's side (or the listener's), after
    the two clear handshake frames (HELLO, AUTH), it holds each sealed record until the next
    arrives (or a moment passes) and, while armed, lets its attack decide once what goes
    on."""

    def __init__(self, target: tuple[str, int], attack: Attack, *,
                 toward_dialler: bool = False) -> None:
        self.target = target
        self.attack = attack
        #: tamper with the records the listener sends (to a flowlib client) instead
        self.toward_dialler = toward_dialler
        self.armed = False
        self.attacks = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(BaseException):
                await task

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        pumps = ((self._copy(reader, up_writer), self._records(up_reader, writer))
                 if self.toward_dialler else
                 (self._records(reader, up_writer), self._copy(up_reader, writer)))
        for task in pumps:
            t = asyncio.ensure_future(task)
            self.tasks.add(t)

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
        finally:
            writer.close()

    async def _records(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        try:
            for _ in range(2):  # HELLO and AUTH, in clear
                header = await reader.readexactly(HEADER_SIZE)
                (size,) = _SIZE.unpack_from(header, 16)
                writer.write(header + await reader.readexactly(size))
            held: bytes | None = None
            while True:
                try:
                    prefix = await asyncio.wait_for(reader.readexactly(4), 0.05)
                except TimeoutError:  # nothing follows: the held record goes on
                    if held is not None:
                        writer.write(held)
                        held = None
                    prefix = await reader.readexactly(4)
                record = prefix + await reader.readexactly(_SIZE.unpack(prefix)[0])
                if held is None:
                    held = record
                    continue
                out = (self.attack(held, record, _gen(record) != _gen(held))
                       if self.armed else None)
                if out is None:
                    writer.write(held)
                    held = record
                else:
                    self.armed = False
                    self.attacks += 1
                    writer.write(b"".join(out))
                    held = None
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def proxied_pair(attack: Attack) -> AsyncIterator[tuple[RouterNode, RouterNode,
                                                               RecordProxy]]:
    """r1 -> proxy -> r2 (the core), both holding the site key, links sealed."""
    common = {"link_keys": KEYS, "link_encrypt": True, "link_rekey_records": 4}
    r2 = RouterNode(NodeConfig("r2", listen="127.0.0.1:0", core_lsids=frozenset({LSID}),
                               **common))  # type: ignore[arg-type]
    await r2.start()
    proxy = RecordProxy(r2.tcp_address, attack)
    r1: RouterNode | None = None
    try:
        address = await proxy.start()
        r1 = RouterNode(NodeConfig("r1", listen="127.0.0.1:0",
                                   peers=[PeerConfig(address, "r2")],
                                   **common))  # type: ignore[arg-type]
        await r1.start()
        await within(r1.wait_routes(LSID))
        yield r1, r2, proxy
    finally:
        if r1 is not None:
            await r1.stop()
        await proxy.close()
        await r2.stop()


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_tampering_with_sealed_records_fails_the_link_and_is_counted(name: str) -> None:
    async def main() -> None:
        async with proxied_pair(ATTACKS[name]) as (r1, r2, proxy):
            flow = FlowID(0x4E, LSID, 7)
            rx = await RawEndpoint.connect(r2, "rx")
            assert (await rx.join(flow, 1 << 40)).status is C.JoinStatus.OK
            tx = await RawEndpoint.connect(r1, "tx")
            assert r2.core.counters["malformed.bad-record"] == 0
            proxy.armed = True
            for i in range(400):
                tx.send(flow, b"%06d" % i + b"x" * 100, band=40)
                if i % 8 == 7:
                    await tx.writer.drain()
                    await asyncio.sleep(0.005)  # many small records, many key updates
                if not proxy.armed:
                    break
            assert proxy.attacks == 1
            await until(lambda: r2.core.counters["malformed.bad-record"] >= 1)
            if "update" in name:
                assert r1.core.counters["auth.rekeys.sent"] >= 1
            for ep in (rx, tx):
                await ep.close()
    run(main())


def test_an_untouched_proxied_link_crosses_many_key_updates_without_loss() -> None:
    """The proxy itself loses nothing: the same traffic, never armed, arrives whole."""
    async def main() -> None:
        async with proxied_pair(ATTACKS["delete-before-update"]) as (r1, r2, _):
            flow = FlowID(0x4E, LSID, 8)
            rx = await RawEndpoint.connect(r2, "rx")
            assert (await rx.join(flow, 1 << 40)).status is C.JoinStatus.OK
            tx = await RawEndpoint.connect(r1, "tx")
            for i in range(200):
                tx.send(flow, b"%06d" % i, band=40)
                if i % 4 == 3:
                    await tx.writer.drain()
                    await asyncio.sleep(0.005)
            got = await rx.data(200, timeout=20)
            assert [p[:6] for _, p in got] == [b"%06d" % i for i in range(200)]
            assert r1.core.counters["auth.rekeys.sent"] >= 5
            assert r2.core.counters["malformed.bad-record"] == 0
            for ep in (rx, tx):
                await ep.close()
    run(main())


def test_a_flowlib_client_fails_its_link_when_a_record_to_it_is_deleted_at_an_update() -> None:
    """The same attack between a router and a flowlib client, on what the router sends it:
    the client drops the link and tells the application why (``on_disconnect``; with
    several routers it would fail over), instead of missing messages without a word."""
    async def main() -> None:
        router = RouterNode(NodeConfig("r1", listen="127.0.0.1:0", core_lsids=frozenset({LSID}),
                                       default_lsid=LSID, link_keys=KEYS, link_encrypt=True,
                                       link_rekey_records=4))
        await router.start()
        proxy = RecordProxy(router.tcp_address, ATTACKS["delete-before-update"],
                            toward_dialler=True)
        key = ("site", KEYS["site"])
        try:
            address = await proxy.start()
            async with (await flowlib.connect([address], name="rx", link_key=key,
                                              encrypt=True) as rx,
                        await flowlib.connect(["%s:%d" % router.tcp_address], name="tx",
                                              link_key=key, encrypt=True) as tx):
                lost: list[BaseException | None] = []
                rx.on_disconnect = lost.append
                flow = await tx.create()
                await rx.listen(flow, "data")
                proxy.armed = True
                for i in range(400):
                    await tx.send(flow, b"%06d" % i, band=40)
                    if i % 4 == 3:
                        await asyncio.sleep(0.005)
                    if not proxy.armed:
                        break
                assert proxy.attacks == 1
                await until(lambda: bool(lost))
                assert isinstance(lost[0], flowlib.ConnectionLost)
                assert "bad sealed record" in str(lost[0]) and "out-of-order" in str(lost[0])
        finally:
            await proxy.close()
            await router.stop()
    run(main())
