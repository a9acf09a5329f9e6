"""flowrouter.core.traces: the v1 record schema, the writers, sampling, rotation, the reader."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections import Counter

import pytest

from flowrouter.core import traces as TR
from flowrouter.core.traces import (
    MemoryTrace,
    NullTracer,
    TraceError,
    Tracer,
    TraceWriter,
    flow_key_text,
    read_traces,
    snapshot_fields,
    validate,
)
from flowrouter.wire.control import Role
from flowrouter.wire.flowid import FlowID

KEY = FlowID(0xA1, 0x10, 1).key
KEY2 = FlowID(0xDEADBEEF, 0x20, 0xFFFFFFFF).key


def exercise(tr: Tracer, t0: float = 0.0) -> None:
    """One call of every Tracer method (what the router core will do)."""
    tr.link_up(t0 + 0.0, 1, "r2", Role.ROUTER)
    tr.link_up(t0 + 0.1, 7, "host", Role.ENDPOINT)
    tr.entry_add(t0 + 1.0, KEY, 1)
    tr.entry_add(t0 + 1.5, KEY2, None)
    tr.link_add(t0 + 2.0, KEY, 7, (1 << 40) | 1, "join", Role.ENDPOINT)
    tr.link_add(t0 + 2.5, KEY, 7, 1 << 41, "mask")
    tr.fwd(t0 + 3.0, KEY, 40, 7, 2, 1200)
    tr.drop(t0 + 3.5, KEY, 41, 1, "band-filtered", 800, links=3)
    tr.drop(t0 + 3.6, KEY, 40, 7, "ttl")
    tr.gc_ping(t0 + 4.0, KEY, 7, 12)
    tr.refresh(t0 + 4.2, 1, "sent", 2, 1)
    tr.prune(t0 + 4.4, 7, "sent", "prune", 1)
    tr.link_del(t0 + 5.0, KEY, 7, 1 << 41, "gc", last=t0 + 1.0, role="endpoint")
    tr.entry_del(t0 + 5.0, KEY, "gc")
    tr.snapshot(t0 + 6.0, entries=1, links_total=0, active_flows=0, mem_bytes=700, core=True,
                fanout={0: 1}, edge=True, members=0, lsids=[0x20], epoch=1)
    tr.link_down(t0 + 7.0, 7, "host", None, reason="closed")


# ----------------------------------------------------------------------------- conversions
def test_flow_text_is_the_flowid_text_form():
    for fid in (FlowID(0, 1, 0), FlowID(0xA1, 0x10, 1), FlowID(2**64 - 1, 2**32 - 1, 7)):
        assert flow_key_text(fid.key) == str(fid)
        assert flow_key_text(memoryview(fid.key)) == str(fid)
        assert flow_key_text(fid) == str(fid)
        assert TR.FLOW_RE.fullmatch(flow_key_text(fid.key))
    with pytest.raises(ValueError):
        flow_key_text(b"short")


def test_role_text():
    assert TR.role_text(Role.ROUTER) == "router"
    assert TR.role_text(Role.ENDPOINT) == "endpoint"
    assert TR.role_text("Endpoint") == "endpoint"
    assert TR.role_text(None) == "unknown"
    assert TR.role_text("martian") == "unknown"


# ----------------------------------------------------------------------------- sampling
def _decisions(tr: TR.BaseTracer, n: int) -> list[int]:
    """Feed n forwarding decisions (bytes = decision index); return the indices recorded."""
    for i in range(n):
        tr.fwd(float(i), KEY, 40, 1, 1, i)
    return [r["bytes"] for r in tr.records if r["kind"] == "fwd"]  # type: ignore[attr-defined]


def test_systematic_sampling_is_one_in_n_with_a_per_router_phase():
    n = 4
    tr = MemoryTrace("edge-7", sample_rate=1 / n)
    picked = _decisions(tr, 40)
    phase = zlib.crc32(b"edge-7") % n
    assert picked == list(range(phase, 40, n))
    assert all(r["sample"] == n for r in tr.records)
    # deterministic: the same router name samples the same decisions
    assert _decisions(MemoryTrace("edge-7", sample_rate=0.25), 40) == picked


def test_sampling_rates_one_and_zero():
    tr = MemoryTrace("r", sample_rate=1.0)
    assert _decisions(tr, 5) == [0, 1, 2, 3, 4]
    assert {r["sample"] for r in tr.records} == {1}
    off = MemoryTrace("r", sample_rate=0.0)
    assert _decisions(off, 100) == []
    off.drop(1.0, KEY, 40, 1, "ttl")
    assert off.records == []
    with pytest.raises(ValueError):
        MemoryTrace("r", sample_rate=1.5)


def test_bernoulli_sampling_is_seeded_and_unbiased():
    a = _decisions(MemoryTrace("r", sample_rate=0.01, seed=42), 100_000)
    b = _decisions(MemoryTrace("r", sample_rate=0.01, seed=42), 100_000)
    c = _decisions(MemoryTrace("r", sample_rate=0.01, seed=43), 100_000)
    assert a == b
    assert a != c
    assert 850 <= len(a) <= 1150  # 1000 expected, sd ~31
    gaps = {y - x for x, y in zip(a, a[1:])}
    assert len(gaps) > 50  # not a fixed stride


def test_drops_have_their_own_countdown_and_rate():
    tr = MemoryTrace("r", sample_rate=0.5, drop_sample_rate=1.0)
    for i in range(10):
        tr.drop(float(i), KEY, 40, 1, "locality", 10)
    drops = [r for r in tr.records if r["kind"] == "drop"]
    assert len(drops) == 10 and {r["sample"] for r in drops} == {1}
    assert "links" not in drops[0]  # the default (1) is not written
    tr2 = MemoryTrace("r", sample_rate=0.5)  # drops follow sample_rate by default
    for i in range(10):
        tr2.drop(float(i), KEY, 40, 1, "locality", 10)
    assert len(tr2.records) == 5 and {r["sample"] for r in tr2.records} == {2}


# ----------------------------------------------------------------------------- records
def test_every_method_writes_valid_records():
    tr = MemoryTrace("r1", run="exp-1")
    exercise(tr)
    kinds = [r["kind"] for r in tr.records]
    assert set(kinds) == set(TR.KINDS)
    for rec in tr.records:
        assert validate(rec) is None, rec
        assert rec["v"] == 2 and rec["router"] == "r1" and rec["run"] == "exp-1"
    by: dict[str, dict] = {}
    for r in tr.records:
        by.setdefault(r["kind"], r)  # the first of each kind
    assert by["entry_add"]["flow"] == "00000000000000a1:00000010:00000001"
    assert by["link_add"]["mask"] == f"{(1 << 40) | 1:x}"
    assert by["link_add"]["role"] == "endpoint"
    assert by["drop"]["links"] == 3 and by["drop"]["reason"] == "band-filtered"
    assert by["link_del"]["last"] == 1.0
    assert by["snapshot"]["fanout"] == {"0": 1} and by["snapshot"]["lsids"] == [0x20]
    assert by["link_down"]["role"] == "unknown"
    assert [r for r in tr.records if r["kind"] == "entry_add"][1]["upstream"] is None


def test_emit_clock_and_offset():
    tr = MemoryTrace("r", clock=lambda: 100.0, t_offset=1000.0)
    tr.emit("link_up", link=3, peer="p", role="router")
    tr.emit("gc_ping", 5.0, flow=str(FlowID(1, 2, 3)), link=3, epoch=1)
    tr.link_del(6.0, KEY, 3, 1, "gc", last=2.0)
    assert [r["t"] for r in tr.records] == [1100.0, 1005.0, 1006.0]
    assert tr.records[2]["last"] == 1002.0
    with pytest.raises(ValueError):
        tr.emit("teleport", 1.0)
    with pytest.raises(ValueError):
        MemoryTrace("r").emit("link_up", link=1, peer="p", role="router")  # no t, no clock


def test_null_tracer_does_nothing():
    nt = NullTracer()
    assert isinstance(nt, Tracer) and nt.enabled is False
    exercise(nt)  # every method accepts the calls
    assert nt.fwd(1.0, KEY, 40, 1, 1, 10) is None
    nt.flush()
    nt.close()
    assert TR.NULL_TRACER.enabled is False
    assert isinstance(MemoryTrace("r"), Tracer) and MemoryTrace("r").enabled


@pytest.mark.parametrize("change, reason", [
    ({"v": 3}, "unsupported version"),
    ({"v": 1.0}, "unsupported version"),
    ({"v": None}, "unsupported version"),
    ({"t": "soon"}, "missing or invalid field 't'"),
    ({"t": float("nan")}, "missing or invalid field 't'"),
    ({"t": True}, "missing or invalid field 't'"),
    ({"router": ""}, "missing or invalid field 'router'"),
    ({"router": 5}, "missing or invalid field 'router'"),
    ({"kind": "teleport"}, "unknown kind"),
    ({"band": 128}, "missing or invalid field 'band'"),
    ({"band": "40"}, "missing or invalid field 'band'"),
    ({"band": 40.0}, "missing or invalid field 'band'"),
    ({"flow": "A1:10:1"}, "missing or invalid field 'flow'"),
    ({"in_link": -1}, "missing or invalid field 'in_link'"),
    ({"sample": None}, "missing or invalid field 'sample'"),
    ({"sample": 0}, "missing or invalid field 'sample'"),
    ({"run": 3}, "invalid field 'run'"),
])
def test_validate_rejects(change, reason):
    rec = {"v": 1, "t": 1.0, "router": "r", "kind": "fwd", "flow": str(FlowID(1, 2, 3)),
           "band": 40, "in_link": 1, "out_links": 2, "bytes": 10, "sample": 1}
    assert validate(rec) is None
    rec.update(change)
    assert validate(rec) == reason


def test_validate_kind_specific_fields():
    base = {"v": 1, "t": 2, "router": "r"}
    snap = {**base, "kind": "snapshot", "entries": 1, "links_total": 1, "active_flows": 0,
            "mem_bytes": 9, "core": False, "fanout": {"1": 1}}
    assert validate(snap) is None
    assert validate({**snap, "fanout": {"one": 1}}) == "missing or invalid field 'fanout'"
    assert validate({**snap, "core": "no"}) == "missing or invalid field 'core'"
    assert validate({**snap, "lsids": [1, -2]}) == "invalid field 'lsids'"
    ld = {**base, "kind": "link_del", "flow": str(FlowID(1, 2, 3)), "link": 3, "mask": "ff",
          "cause": "gc"}
    assert validate(ld) is None
    assert validate({**ld, "mask": "0xff"}) == "missing or invalid field 'mask'"
    assert validate({**ld, "cause": "Because!"}) == "missing or invalid field 'cause'"
    assert validate({**ld, "last": "yesterday"}) == "invalid field 'last'"
    assert validate({**ld, "role": "alien"}) == "invalid field 'role'"
    assert validate({**base, "kind": "entry_add", "flow": str(FlowID(1, 2, 3)),
                     "upstream": None}) is None
    assert validate([1, 2]) == "not a JSON object"


# ----------------------------------------------------------------------------- files
def test_writer_round_trip_matches_memory_trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    with TraceWriter(path, "r1", sample_rate=1.0) as w:
        exercise(w)
    mem = MemoryTrace("r1", sample_rate=1.0)
    exercise(mem)
    assert path.read_text().splitlines() == mem.lines()
    got = list(read_traces(path))
    assert got == mem.records
    assert not any(isinstance(g, TraceError) for g in got)


def test_directory_mode_names_the_file_after_the_router(tmp_path):
    w = TraceWriter(tmp_path, "core/1", sample_rate=1.0)
    w.entry_add(1.0, KEY, None)
    w.close()
    assert w.path == os.path.join(str(tmp_path), "core_1.trace.jsonl")
    assert [r["kind"] for r in read_traces(tmp_path)] == ["entry_add"]
    w.close()  # idempotent
    assert w.closed


def test_rotation_keeps_whole_records_and_at_most_keep_files(tmp_path):
    path = tmp_path / "trace.jsonl"
    w = TraceWriter(path, "r1", sample_rate=1.0, rotate_bytes=2000, keep=2, buffer_bytes=300)
    n = 200
    for i in range(n):
        w.gc_ping(float(i), KEY, 7, i)
    w.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["trace.1.jsonl", "trace.2.jsonl", "trace.jsonl"]
    assert w.rotations > 2
    for name in names:
        text = (tmp_path / name).read_text()
        assert len(text.encode()) <= 2000 and text.endswith("\n")
    recs = list(read_traces(tmp_path))
    assert all(isinstance(r, dict) for r in recs)
    epochs = [r["epoch"] for r in recs]
    # oldest first across the rotated set, and the newest records are all there
    assert epochs == list(range(n - len(epochs), n))
    line = len((tmp_path / "trace.jsonl").read_text().splitlines()[0]) + 1
    assert 2 * (2000 // line) <= len(epochs) < n


def test_rotation_with_keep_zero_discards(tmp_path):
    w = TraceWriter(tmp_path / "t.jsonl", "r1", sample_rate=1.0, rotate_bytes=500, keep=0,
                    buffer_bytes=1)
    for i in range(50):
        w.gc_ping(float(i), KEY, 7, i)
    w.close()
    assert os.listdir(tmp_path) == ["t.jsonl"]
    assert [r["epoch"] for r in read_traces(tmp_path)][-1] == 49


def test_buffering_flushes_on_size_and_trace_time(tmp_path):
    path = tmp_path / "trace.jsonl"
    w = TraceWriter(path, "r1", sample_rate=1.0, buffer_bytes=10_000, flush_interval=5.0)
    w.entry_add(0.0, KEY, None)
    w.entry_add(1.0, KEY2, None)
    assert not path.exists()  # buffered; the file is opened only to flush
    w.entry_del(6.0, KEY, "leave")  # 5 s of trace time later: flushed
    assert len(path.read_text().splitlines()) == 3
    w.entry_del(7.0, KEY2, "leave")
    w.flush()
    assert len(path.read_text().splitlines()) == 4
    w.close()


def test_reopening_completes_a_torn_line(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"v":1,"t":1,"router":"r1","kind":"entry_add","flow":"00')
    with TraceWriter(path, "r1") as w:
        w.entry_add(2.0, KEY, None)
    items = list(read_traces(path))
    assert [type(i) for i in items] == [TraceError, dict]
    assert items[0].kind == "corrupt" and items[0].line == 1


def test_read_traces_counts_bad_lines_and_goes_on(tmp_path):
    good = MemoryTrace("r1")
    exercise(good)
    lines = good.lines()
    bad = [
        "not json at all",
        '{"v":1,"t":3,"router":"r1","ki',
        "[1, 2, 3]",
        "",
        "   ",
        '{"v":3,"t":1,"router":"x","kind":"fwd"}',
        '{"v":1,"t":1,"router":"x","kind":"teleport"}',
        '{"v":1,"t":NaN,"router":"x","kind":"entry_add","flow":"' + str(FlowID(1, 2, 3)) + '"}',
        "\xff\xfe garbage",
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines[:5] + bad + lines[5:]) + "\n", encoding="utf-8")
    items = list(read_traces([str(path)]))
    recs = [i for i in items if isinstance(i, dict)]
    errs = [i for i in items if isinstance(i, TraceError)]
    assert recs == good.records
    assert Counter((e.kind, e.reason.split(" (")[0]) for e in errs) == Counter({
        ("corrupt", "not JSON"): 3, ("corrupt", "not a JSON object"): 1,
        ("invalid", "unsupported version"): 1, ("invalid", "unknown kind"): 1,
        ("invalid", "missing or invalid field 't'"): 1})
    assert errs[0].line == 6 and errs[0].path == str(path)


def test_read_traces_inputs(tmp_path):
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    for name in ("x.jsonl", "y.jsonl"):
        tr = MemoryTrace(name)
        tr.entry_add(1.0, KEY, None)
        tr.write_jsonl(sub / name)
    with gzip.open(sub / "z.jsonl.gz", "wt") as fh:
        fh.write(json.dumps({"v": 1, "t": 1, "router": "z", "kind": "link_up", "link": 1,
                             "peer": "p", "role": "router"}) + "\n")
    (sub / "notes.txt").write_text("ignored in directories")
    assert sorted(r["router"] for r in read_traces(tmp_path)) == ["x.jsonl", "y.jsonl", "z"]
    assert [r["router"] for r in read_traces(str(sub / "x.*"))] == ["x.jsonl"]
    assert len(list(read_traces([sub / "x.jsonl", sub / "z.jsonl.gz"]))) == 2
    with pytest.raises(FileNotFoundError):
        list(read_traces(tmp_path / "nothing-*.jsonl"))


# ----------------------------------------------------------------------------- snapshots
def test_snapshot_fields_from_a_router():
    from flowrouter.core.router import Router, RouterParams
    from flowrouter.core.tables import FlowEntry, Link

    r = Router(RouterParams(name="core", node_id=1, core_lsids=frozenset({0x10})))
    r.links[1] = Link(1, "tcp", "a", (0, 0, 0, 0), role=Role.ROUTER)
    r.links[2] = Link(2, "tcp", "b", (0, 0, 0, 0), role=Role.ENDPOINT)
    r.links[3] = Link(3, "tcp", "c", (0, 0, 0, 0), role=Role.ENDPOINT)
    r.state.epoch = 10  # epochs of 5 s: epoch 10 began at t = 50
    e1 = FlowEntry(None, True, 0.0)
    for lid, at in ((1, 51.0), (2, 15.0), (3, 15.0)):  # times of the last join or refresh
        e1.set_down(lid, 1, at)
    e2 = FlowEntry(1, True, 0.0)
    e2.set_down(2, 1, 10.0)  # not refreshed for 8 epochs
    r.flows.update({KEY: e1, KEY2: e2})
    f = snapshot_fields(r.state)
    assert f == {"entries": 2, "links_total": 4, "active_flows": 1,
                 "mem_bytes": 2 * TR.ENTRY_BYTES + 4 * TR.LINK_BYTES, "core": True,
                 "fanout": {3: 1, 1: 1}, "edge": True, "members": 3, "lsids": [0x10],
                 "epoch": 10}
    tr = MemoryTrace("core")
    tr.snapshot(5.0, **f)
    assert validate(tr.records[0]) is None
    assert tr.records[0]["fanout"] == {"1": 1, "3": 1}


def test_version_2_records_and_version_1_files_both_validate():
    tr = MemoryTrace("r1")
    tr.refresh(1.0, 3, "received", entries=120, chunks=2, repaired=1, removed=2, unknown=0)
    tr.refresh(2.0, 4, "sent", entries=5, chunks=1)
    tr.prune(3.0, 3, "sent", "not-on-tree", 7)
    recs = [json.loads(line) for line in tr.lines()]
    assert [validate(r) for r in recs] == [None, None, None]
    assert recs[0]["v"] == 2 and recs[0]["removed"] == 2 and "repaired" not in recs[1]
    old = {"v": 1, "t": 1, "router": "r", "kind": "gc_ping", "flow": str(FlowID(1, 2, 3)),
           "link": 2, "epoch": 4}
    assert validate(old) is None
    # refresh and prune records do not exist in version 1
    assert validate({**recs[2], "v": 1}) == "unknown kind"
    assert validate({**recs[2], "msg": "Prune!"}) == "missing or invalid field 'msg'"
