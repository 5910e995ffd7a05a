"""Arrays and maps whose items take no bytes (null, an empty record, a size-0 fixed) cannot
make a tiny message cost more than its size plus a limit (issue 20, item 2): the byte count
that bounds every other block count says nothing about them."""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _avro_strategies import zigzag
from arrowstash import config
from arrowstash.avro import decode
from arrowstash.errors import AvroDecodeError

NATIVE = importlib.util.find_spec("arrowstash.avro._native._cdecode") is not None
DECODERS = ["python", pytest.param("native", marks=pytest.mark.skipif(
    not NATIVE, reason="the native Avro decoder is not built"))]

#: The 8-byte message that kept a core busy for 94 s: a block count of about 1.6e9 nulls.
BOMB = bytes.fromhex("b6d59a990ce06fcc")
EMPTY_ITEMS = [
    {"type": "array", "items": "null"},
    {"type": "array", "items": {"type": "record", "name": "Empty", "fields": []}},
    {"type": "array", "items": {"type": "fixed", "name": "Nothing", "size": 0}},
    {"type": "map", "values": "null"},  # a key takes a byte: bounded by the input anyway
]


@pytest.fixture(params=DECODERS)
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ARROWSTASH_AVRO_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)



def _nulls(count: int) -> bytes:
    """One array-of-null datum: one block of ``count`` items, then the end marker."""
    return zigzag(count) + b"\x00" if count else b"\x00"


@pytest.mark.parametrize("schema", EMPTY_ITEMS, ids=["null", "empty-record", "fixed0", "map"])
def test_the_8_byte_bomb_fails_in_under_10_ms(decoder: str, schema: dict[str, Any]) -> None:
    decode([b"\x02\x00\x00"], {"type": "array", "items": "int"})  # warm: plans, imports
    started = time.perf_counter()
    with pytest.raises(AvroDecodeError):
        decode([BOMB], schema)
    assert time.perf_counter() - started < 0.010


def test_the_error_names_the_limit_and_its_variable(decoder: str) -> None:
    with pytest.raises(AvroDecodeError, match="ARROWSTASH_AVRO_MAX_EMPTY_ITEMS") as caught:
        decode([BOMB], EMPTY_ITEMS[0])
    assert f"{config.avro_max_empty_items()}" in str(caught.value)


def test_items_up_to_the_limit_plus_the_input_size_decode(
        decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWSTASH_AVRO_MAX_EMPTY_ITEMS", "100")
    message = _nulls(100 + 3)  # 3: the message's own bytes (count varint, two bytes; end marker)
    assert len(message) == 3
    batch = decode([message], EMPTY_ITEMS[0])
    assert len(batch.column(0)[0]) == 103
    with pytest.raises(AvroDecodeError, match="take no bytes"):
        decode([_nulls(104)], EMPTY_ITEMS[0])


def test_the_budget_spans_the_batch_not_each_message(
        decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of small messages shares one budget: the limit plus the batch's bytes."""
    monkeypatch.setenv("ARROWSTASH_AVRO_MAX_EMPTY_ITEMS", "100")
    messages = [_nulls(60)] * 2  # 120 items, 4 bytes: over 104
    with pytest.raises(AvroDecodeError, match="take no bytes"):
        decode(messages, EMPTY_ITEMS[0], threads=1)
    assert len(decode([_nulls(50)] * 2, EMPTY_ITEMS[0], threads=1)) == 2


def test_a_malformed_limit_is_an_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWSTASH_AVRO_MAX_EMPTY_ITEMS", "lots")
    with pytest.raises(ValueError, match="ARROWSTASH_AVRO_MAX_EMPTY_ITEMS='lots'"):
        decode([_nulls(1)], EMPTY_ITEMS[0])


@settings(max_examples=40, deadline=None)
@given(count=st.integers(0, 3000), limit=st.integers(0, 3000))
def test_both_decoders_draw_the_line_at_the_same_place(count: int, limit: int) -> None:
    message = _nulls(count)
    verdicts = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ARROWSTASH_AVRO_MAX_EMPTY_ITEMS", str(limit))
        for native in (["0", "1"] if NATIVE else ["0"]):
            patch.setenv("ARROWSTASH_AVRO_NATIVE", native)
            try:
                verdicts.append(len(decode([message], EMPTY_ITEMS[0]).column(0)[0]))
            except AvroDecodeError:
                verdicts.append(-1)
    allowed = count == 0 or count <= limit + len(message)
    assert set(verdicts) == {count if allowed else -1}
