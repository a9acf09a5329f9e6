"""Rekeying of sealed links is configurable (``[link_auth] rekey_records`` / ``rekey_seconds``),
counted, shown in status, and traffic goes on across key updates: r1 - r2 on 127.0.0.1 with
an encrypted router link, a sender on r1 and a receiver on r2 (the core)."""

from __future__ import annotations

import asyncio

import pytest

from flowrouter.net.config import ConfigError
from flowrouter.net.configfile import config_from_dict
from flowrouter.tools.cli import format_status
from flowrouter.wire import control as C
from flowrouter.wire.flowid import FlowID

from .rawep import RawEndpoint, chain, run, until

LSID = 0x10
KEYS = {"site": "hex:" + "5a" * 32}


async def _carry(r1, r2, flow: FlowID, n: int) -> None:  # type: ignore[no-untyped-def]
    """Send *n* numbered messages r1 -> r2 and check every one arrives, in order."""
    rx = await RawEndpoint.connect(r2, "rx")
    assert (await rx.join(flow, 1 << 40)).status is C.JoinStatus.OK
    tx = await RawEndpoint.connect(r1, "tx")
    for i in range(n):
        tx.send(flow, b"%06d" % i + b"x" * 200, band=40)
        if i % 16 == 15:
            await tx.writer.drain()
            await asyncio.sleep(0)  # let the router send what it has: many small records
    got = await rx.data(n, timeout=30)
    assert [p[:6] for _, p in got] == [b"%06d" % i for i in range(n)]
    for ep in (rx, tx):
        await ep.close()


def test_a_small_record_budget_rekeys_a_live_link_and_traffic_goes_on() -> None:
    async def main() -> None:
        async with chain(2, link_keys=KEYS, link_encrypt=True, link_rekey_records=4) as (r1, r2):
            await _carry(r1, r2, FlowID(0x4E, LSID, 1), 400)
            sent, received = (r1.core.counters["auth.rekeys.sent"],
                              r2.core.counters["auth.rekeys.received"])
            assert sent >= 2 and received >= 2
            st = r1.status()["link_auth"]
            assert st["rekey_records"] == 4 and st["encrypt"] is True
            (link,) = st["sealed_links"].values()
            assert link["tx_generation"] >= 2
            assert link["records_sent"] >= 4 * link["tx_generation"]
            text = format_status(r1.status())
            assert "LINK SECURITY" in text and "every 4 records" in text
            assert "5a5a" not in str(r1.status())  # key ids only, never keys
    run(main())


def test_rekeying_by_time_on_an_idle_link() -> None:
    async def main() -> None:
        async with chain(2, link_keys=KEYS, link_encrypt=True, link_rekey_seconds=0.05,
                         liveness_interval=0.1, dead_after=2.0) as (r1, r2):
            # only liveness echoes cross the link: the clock alone moves it to new keys
            await until(lambda: r1.core.counters["auth.rekeys.sent"] >= 3
                        and r2.core.counters["auth.rekeys.received"] >= 3)
            assert r1.core.counters["auth.rekeys.sent"] < 1000  # not on every record
            await _carry(r1, r2, FlowID(0x4E, LSID, 2), 50)
            assert r1.links_up() == 1 and r2.links_up() == 1
    run(main())


def test_rekey_keys_are_checked() -> None:
    base = {"router": {"name": "r1"}, "link_auth": {"keys": KEYS}}
    cfg = config_from_dict({**base, "link_auth": {"keys": KEYS, "rekey_records": 1000,
                                                   "rekey_seconds": 60}})
    assert (cfg.link_rekey_records, cfg.link_rekey_seconds) == (1000, 60.0)
    assert cfg.params().auth_rekey_records == 1000
    for bad, match in (({"rekey_records": 0}, r"rekey_records must be within 1\.\."),
                       ({"rekey_records": 1.5}, r"rekey_records must be an integer"),
                       ({"rekey_seconds": 0}, r"rekey_seconds must be within 0\.01\.\."),
                       ({"rekey_seconds": "5m"}, r"rekey_seconds must be a number")):
        with pytest.raises(ConfigError, match=match):
            config_from_dict({**base, "link_auth": {"keys": KEYS, **bad}})


def test_a_link_that_used_every_key_generation_keeps_its_last_key() -> None:
    from flowrouter.wire.linkrecords import MAX_GENERATION, LinkCipher, SecureStream

    now = [0.0]
    tx = LinkCipher(bytes(range(32)), bytes(32), rekey_records=1)
    stream = SecureStream(tx, clock=lambda: now[0], rekey_interval=1.0)
    for _ in range(MAX_GENERATION):
        tx.rekey()
    assert tx.tx_generation == MAX_GENERATION and not tx.can_rekey
    for _ in range(3):  # over the record budget and the interval: no failure, same key
        now[0] += 2.0
        stream.encode(b"frame")
    assert tx.tx_generation == MAX_GENERATION and tx.sent == 3
