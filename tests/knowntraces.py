"""Hand-written flowtrace traces with known answers: a three-router tree (edge1 -- mid1 --
core1) with two flows, a record from a wrong clock, bad lines and the errors they must give.
``write_traces`` puts them in a folder; ``rec`` and ``snap`` write records.
"""

from __future__ import annotations

import json
from collections import Counter

A = "00000000000000a1:00000010:00000001"
B = "00000000000000a1:00000010:00000002"
BUCKET = 10.0


def rec(t, router, kind, **fields):
    return {"v": 1, "t": t, "router": router, "kind": kind, **fields}


def snap(t, router, entries, links, active, fanout, core=False, edge=False, members=0):
    return rec(t, router, "snapshot", entries=entries, links_total=links, active_flows=active,
               mem_bytes=700 * entries + 96 * links, core=core, edge=edge, fanout=fanout,
               members=members)


# A three-router tree: edge1 (hosts on links 5 and 6) -- mid1 -- core1 (core of LSID 0x10).
# Flow A: one member on edge1 link 5, silent after t=12, collected by the GC at t=25 (edge1)
# and torn down by leaves upstream. Flow B: members on links 5 and 6; link 6 leaves at t=31,
# link 5 is collected at t=35. Sampled traffic has sample=10.
EDGE1 = [
    rec(0.0, "edge1", "link_up", link=1, peer="mid1", role="router", extra_field={"x": 1}),
    rec(0.0, "edge1", "link_up", link=5, peer="host-a", role="endpoint"),
    rec(0.0, "edge1", "link_up", link=6, peer="host-b", role="endpoint"),
    rec(1.0, "edge1", "entry_add", flow=A, upstream=1),
    rec(1.0, "edge1", "link_add", flow=A, link=5, mask="100000001", cause="join",
        role="endpoint"),
    rec(2.0, "edge1", "entry_add", flow=B, upstream=1),
    rec(2.0, "edge1", "link_add", flow=B, link=5, mask="100000001", cause="join",
        role="endpoint"),
    rec(2.0, "edge1", "link_add", flow=B, link=6, mask="100000001", cause="join"),
    rec(3.0, "edge1", "fwd", flow=A, band=32, in_link=5, out_links=1, bytes=100, sample=10),
    rec(5.0, "edge1", "drop", flow=A, band=40, in_link=1, reason="band-filtered", bytes=200,
        sample=10, links=2),
    rec(6.0, "edge1", "drop", flow=A, band=33, in_link=1, reason="locality", bytes=50,
        sample=10),
    snap(9.0, "edge1", 2, 3, 2, {"1": 1, "2": 1}, edge=True, members=3),
    rec(12.0, "edge1", "fwd", flow=A, band=32, in_link=5, out_links=1, bytes=100, sample=10),
    rec(15.0, "edge1", "gc_ping", flow=A, link=5, epoch=3),
    snap(19.0, "edge1", 2, 3, 1, {"1": 1, "2": 1}, edge=True, members=3),
    rec(20.0, "edge1", "gc_ping", flow=A, link=5, epoch=4),
    rec(25.0, "edge1", "link_del", flow=A, link=5, mask="100000001", cause="gc", last=10.0),
    rec(25.0, "edge1", "entry_del", flow=A, cause="gc"),
    snap(29.0, "edge1", 1, 2, 0, {"2": 1}, edge=True, members=2),
    rec(31.0, "edge1", "link_del", flow=B, link=6, mask="100000001", cause="leave"),
    rec(35.0, "edge1", "link_del", flow=B, link=5, mask="100000001", cause="gc"),
    rec(35.0, "edge1", "entry_del", flow=B, cause="gc"),
    snap(39.0, "edge1", 0, 0, 0, {}, edge=True, members=0),
]
NET = [
    rec(0.0, "mid1", "link_up", link=1, peer="edge1", role="router"),
    rec(0.0, "mid1", "link_up", link=2, peer="core1", role="router"),
    # a stray record from a wrong clock: left out, counted as a clock outlier
    rec(1.0e6, "mid1", "link_up", link=9, peer="ghost", role="router"),
    rec(1.0, "mid1", "entry_add", flow=A, upstream=2),
    rec(1.0, "mid1", "link_add", flow=A, link=1, mask="100000001", cause="join", role="router"),
    rec(2.0, "mid1", "entry_add", flow=B, upstream=2),
    rec(2.0, "mid1", "link_add", flow=B, link=1, mask="100000001", cause="join", role="router"),
    rec(4.0, "mid1", "fwd", flow=A, band=32, in_link=1, out_links=1, bytes=100, sample=10),
    snap(9.0, "mid1", 2, 2, 2, {"1": 2}),
    rec(25.0, "mid1", "link_del", flow=A, link=1, mask="100000001", cause="leave"),
    rec(25.0, "mid1", "entry_del", flow=A, cause="leave"),
    rec(35.0, "mid1", "link_del", flow=B, link=1, mask="100000001", cause="leave"),
    rec(35.0, "mid1", "entry_del", flow=B, cause="leave"),
    snap(39.0, "mid1", 0, 0, 0, {}),
    rec(0.0, "core1", "link_up", link=1, peer="mid1", role="router"),
    rec(1.0, "core1", "entry_add", flow=A, upstream=None),
    rec(1.0, "core1", "link_add", flow=A, link=1, mask="100000001", cause="join"),
    rec(2.0, "core1", "entry_add", flow=B, upstream=None),
    rec(2.0, "core1", "link_add", flow=B, link=1, mask="100000001", cause="join"),
    rec(4.5, "core1", "drop", flow=A, band=32, in_link=1, reason="no-receivers", bytes=100,
        sample=10),
    snap(9.0, "core1", 2, 2, 2, {"1": 2}, core=True),
    rec(25.0, "core1", "link_del", flow=A, link=1, mask="100000001", cause="leave"),
    rec(25.0, "core1", "entry_del", flow=A, cause="leave"),
    rec(35.0, "core1", "link_del", flow=B, link=1, mask="100000001", cause="leave"),
    rec(35.0, "core1", "entry_del", flow=B, cause="leave"),
    snap(39.0, "core1", 0, 0, 0, {}, core=True),
    # schema v2 (soft state): a refresh round from downstream, read alongside v1
    rec(20.0, "core1", "refresh", link=1, dir="received", entries=1, chunks=1) | {"v": 2},
]
BAD_LINES = [
    "not json\rat all",  # a bare CR does not split a line (one corrupt line, not two)
    '{"v":1,"t":3,"router":"edge1","kind":"entry_add","fl',
    "[1, 2, 3]",
    "",
    '{"v":3,"t":1,"router":"x","kind":"fwd"}',
    '{"v":1,"t":1,"router":"x","kind":"teleport"}',
    json.dumps(rec(1.0, "x", "fwd", flow=A, band=200, in_link=1, out_links=1, bytes=1,
                   sample=1)),
    json.dumps(rec(1.0, "x", "fwd", flow=A, band="32", in_link=1, out_links=1, bytes=1,
                   sample=1)),
    json.dumps(rec(1.0, "x", "drop", flow=A, band=40, in_link=1, reason="ttl", bytes=1,
                   sample=0)),
    json.dumps(rec(1.0, "x", "entry_add", flow="A1:10:1")),
    json.dumps(rec(1.0, "x", "link_del", flow=A, link=1, mask="1", cause="gc",
                   last="yesterday")),
    json.dumps(rec(1.0, "x", "snapshot", entries=1, links_total=1, active_flows=1,
                   mem_bytes=1, core=False, fanout={"x": 1})),
    '{"v":1,"t":NaN,"router":"x","kind":"entry_add","flow":"' + A + '"}',
]
EXPECTED_ERRORS = Counter({
    ("corrupt", "not a JSON object"): 3,
    ("invalid", "unsupported version"): 1,
    ("invalid", "unknown kind"): 1,
    ("invalid", "missing or invalid field 'band'"): 2,
    ("invalid", "missing or invalid field 'flow'"): 1,
    ("invalid", "missing or invalid field 'sample'"): 1,
    ("invalid", "invalid field 'last'"): 1,
    ("invalid", "missing or invalid field 'fanout'"): 1,
    ("invalid", "missing or invalid field 't'"): 1,
})


def write_traces(d):
    d.mkdir(parents=True, exist_ok=True)
    # CRLF line ends are fine
    (d / "edge1.jsonl").write_text("".join(json.dumps(r) + "\r\n" for r in EDGE1))
    (d / "net.jsonl").write_text("".join(json.dumps(r) + "\n" for r in NET))
    (d / "bad.jsonl").write_text("\n".join(BAD_LINES) + "\n")
    return d
