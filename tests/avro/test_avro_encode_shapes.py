"""The native encoder's column shapes of their own (a record that may be null, an enum given as
an index or as a string, a union of leaves): the same bytes as fastavro and as the pure-Python
encoder, and the same errors, on the edges of each shape's fast path."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from _avro_arrow import to_batch
from _avro_strategies import write
from arrowstash import AvroEncodeError
from arrowstash.avro import encode, parse_schema
from arrowstash.avro import encoder as encoder_module

pytestmark = pytest.mark.skipif(encoder_module._cencode is None,
                                reason="the native encoder is not built")


def reference(schema: Any, records: list[Any]) -> list[bytes]:
    return write(json.loads(parse_schema(schema).json), records)


def both(batch: pa.RecordBatch, schema: Any) -> list[bytes]:
    """The native encoder's messages, checked equal to the pure-Python encoder's."""
    native = encode(batch, schema).to_pylist()
    with pytest.MonkeyPatch.context() as m:
        m.setenv("ARROWSTASH_AVRO_NATIVE", "0")
        python = encode(batch, schema).to_pylist()
    assert native == python
    return native


def both_fail(batch: pa.RecordBatch, schema: Any, match: str) -> None:
    with pytest.raises(AvroEncodeError, match=match) as native:
        encode(batch, schema)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("ARROWSTASH_AVRO_NATIVE", "0")
        with pytest.raises(AvroEncodeError) as python:
            encode(batch, schema)
    assert str(native.value) == str(python.value)


INNER = {"type": "record", "name": "In", "fields": [
    {"name": "x", "type": "int"}, {"name": "s", "type": ["null", "string"]}]}
NESTED = {"type": "record", "name": "R", "fields": [
    {"name": "a", "type": "long"},
    {"name": "o", "type": ["null", {"type": "record", "name": "Out", "fields": [
        {"name": "i", "type": ["null", INNER]},
        {"name": "t", "type": "string"}]}]},
    {"name": "z", "type": "boolean"}]}


def test_records_that_may_be_null_nested_in_each_other() -> None:
    records = [
        {"a": 1, "o": None, "z": True},
        {"a": 2, "o": {"i": None, "t": "x" * 70}, "z": False},
        {"a": -3, "o": {"i": {"x": 5, "s": None}, "t": ""}, "z": True},
        {"a": 4, "o": {"i": {"x": -6, "s": "é" * 40}, "t": "t"}, "z": False},
    ]
    batch = pa.RecordBatch.from_pylist(records, schema=parse_schema(NESTED).arrow_schema)
    assert both(batch, NESTED) == reference(NESTED, records)
    assert both(batch.slice(1, 3), NESTED) == reference(NESTED, records[1:])


def test_children_of_a_null_record_are_not_read() -> None:
    """Under a null record the children hold nulls even where their type has none: skipped."""
    x = pa.array([None, 7], pa.int32())
    s = pa.array([None, "b"], pa.string())
    inner = pa.StructArray.from_arrays([x, s], names=["x", "s"],
                                       mask=pa.array([True, False]))
    batch = pa.RecordBatch.from_pydict({"r": inner})
    schema = {"type": "record", "name": "R", "fields": [{"name": "r", "type": ["null", INNER]}]}
    assert both(batch, schema) == reference(schema, [{"r": None}, {"r": {"x": 7, "s": "b"}}])


def test_a_null_record_where_the_schema_has_none_is_refused() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "r", "type": INNER}]}
    column = pa.array([{"x": 1, "s": None}, None], pa.struct([("x", pa.int32()),
                                                             ("s", pa.string())]))
    both_fail(pa.RecordBatch.from_pydict({"r": column}), schema, r"row 1, column 'r'")


def test_a_record_in_a_union_with_other_branches() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "u", "type": [INNER, "null"]}]}
    records = [{"u": {"x": 1, "s": "a"}}, {"u": None}]
    batch = pa.RecordBatch.from_pylist(records, schema=parse_schema(schema).arrow_schema)
    assert both(batch, schema) == reference(schema, records)


SYMBOLS = ["A", "AB", "ABCDEFGH", "ABCDEFGHI", "Z" * 20]
ENUM = {"type": "record", "name": "R", "fields": [
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": SYMBOLS}}]}


@pytest.mark.parametrize("last", SYMBOLS)
def test_enum_strings_short_long_prefixes_and_at_the_end_of_the_data(last: str) -> None:
    """Symbols of up to 8 bytes are matched as a word when 8 bytes can be read; the last
    string of the data buffer (nothing after it) and prefixes of other symbols still match."""
    values = [*SYMBOLS, last]
    batch = pa.RecordBatch.from_pydict({"e": pa.array(values, pa.string())})
    assert both(batch, ENUM) == reference(ENUM, [{"e": v} for v in values])
    as_dictionary = pa.RecordBatch.from_pydict(
        {"e": pa.array(values, pa.string()).dictionary_encode()})
    assert both(as_dictionary, ENUM) == reference(ENUM, [{"e": v} for v in values])


@pytest.mark.parametrize("bad", ["", "a", "ABC", "ABCDEFG", "ABCDEFGH\x00", "B" * 20])
def test_strings_that_are_no_symbol_are_refused(bad: str) -> None:
    batch = pa.RecordBatch.from_pydict({"e": pa.array(["AB", bad, "A"], pa.string())})
    both_fail(batch, ENUM, r"row 1, column 'e'")


def test_enum_indexes_out_of_range_are_refused() -> None:
    indices = pa.array([0, 5], pa.int32())
    column = pa.DictionaryArray.from_arrays(indices, pa.array([*SYMBOLS, "X"]))
    with pytest.raises(AvroEncodeError, match=r"row 1, column 'e'"):
        encode(pa.RecordBatch.from_pydict({"e": column}), ENUM)


UNION = {"type": "record", "name": "R", "fields": [
    {"name": "u", "type": ["null", "string", "int", "boolean", "long", "double"]}]}


def _sparse(values: list[Any]) -> pa.UnionArray:
    kinds = [(type(None), pa.null()), (str, pa.string()), (int, pa.int32()),
             (bool, pa.bool_()), (None, pa.int64()), (float, pa.float64())]
    codes = [next(k for k, (t, _) in enumerate(kinds) if type(v) is t) for v in values]
    children = [pa.array([v if c == k else None for v, c in zip(values, codes, strict=True)],
                         arrow) for k, (_, arrow) in enumerate(kinds)]
    return pa.UnionArray.from_sparse(pa.array(codes, pa.int8()), children,
                                     ["null", "string", "int", "boolean", "long", "double"])


def test_a_union_of_leaves_sparse_and_dense() -> None:
    values = [None, "s", "é" * 64, 3, True, 2.5, "", -(2**31), False, None]
    records = [{"u": v} for v in values]
    sparse = pa.RecordBatch.from_pydict({"u": _sparse(values)})
    assert both(sparse, UNION) == reference(UNION, records)
    dense = to_batch(parse_schema(UNION), records)
    assert both(dense, UNION) == reference(UNION, records)
    assert both(sparse.slice(2, 5), UNION) == reference(UNION, records[2:7])


def test_a_null_in_the_chosen_branch_of_a_union() -> None:
    """A null where the union points into a branch that is not null is refused, by the
    generic path, as the pure-Python encoder refuses it."""
    children = [pa.nulls(2), pa.array(["a", None]), pa.array([None, None], pa.int32()),
                pa.array([None, None], pa.bool_()), pa.array([None, None], pa.int64()),
                pa.array([None, None], pa.float64())]
    column = pa.UnionArray.from_sparse(pa.array([1, 1], pa.int8()), children,
                                       ["null", "string", "int", "boolean", "long", "double"])
    batch = pa.RecordBatch.from_pydict({"u": column})
    both_fail(batch, UNION, r"row 1, column 'u<string>': null in a non-nullable field")
