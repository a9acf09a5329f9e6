"""flowrouter.net.slicedjson gives json.dumps's text, byte for byte, a slice at a time."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrouter.net import slicedjson

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
DOCS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=9)
    | st.dictionaries(st.text(max_size=4), inner, max_size=5)
    | st.dictionaries(st.integers(), inner, max_size=3),  # keys json.dumps turns into text
    max_leaves=60)


@pytest.fixture(autouse=True)
def _small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicedjson, "SLICE", 2)  # every list of three items or more is sliced


@settings(max_examples=300, deadline=None)
@given(doc=DOCS, indent=st.sampled_from([None, 1, 2]))
def test_the_text_is_json_dumps_text(doc: Any, indent: int | None) -> None:
    got = "".join(asyncio.run(slicedjson.pieces(doc, indent)))
    assert got == json.dumps(doc, indent=indent, default=str)


def test_a_long_list_lets_the_loop_run_between_slices() -> None:
    doc = {"ok": True, "status": {"flows": [{"flow": f"f{i}", "n": i} for i in range(9)],
                                  "links": [], "when": object()}}
    turns = 0

    async def main() -> str:
        nonlocal turns
        done = False

        async def count() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)
        counter = asyncio.ensure_future(count())
        text = "".join(await slicedjson.pieces(doc))
        done = True
        await counter
        return text

    assert asyncio.run(main()) == json.dumps(doc, default=str)
    assert turns >= 4  # 9 rows in slices of 2: the loop ran after each slice


@settings(max_examples=100, deadline=None)
@given(doc=DOCS, indent=st.sampled_from([None, 1]))
def test_consuming_gives_the_same_text_and_drops_the_long_lists_items(
        doc: Any, indent: int | None) -> None:
    wrapped = {"status": {"flows": [doc, doc, doc, doc, doc]}}  # a long list, then dropped
    want = json.dumps(wrapped, indent=indent, default=str)
    got = "".join(asyncio.run(slicedjson.pieces(wrapped, indent, consume=True)))
    assert got == want
    assert wrapped["status"]["flows"] == [None] * 5
