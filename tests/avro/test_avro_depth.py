"""Deep nesting is refused with a clear error, never a RecursionError: schemas given as dicts, as
JSON and in a container file's header past ``MAX_DEPTH``, Arrow types mapped to Avro, and values
nested through a recursive schema. Everything up to the limit works with both decoders, even when
called from a deep stack."""

from __future__ import annotations

import importlib.util
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest

from _avro_strategies import zigzag
from arrowstash.avro import decode, encode, from_arrow_schema, parse_schema, read_ocf, write_ocf
from arrowstash.avro.decode_plan import SKIP_DEPTH
from arrowstash.avro.ocf import _header_bytes
from arrowstash.avro.schema import MAX_DEPTH
from arrowstash.errors import AvroDecodeError, AvroSchemaError

NATIVE = importlib.util.find_spec("arrowstash.avro._native._cdecode") is not None
TOO_DEEP = f"types nest deeper than {MAX_DEPTH} levels"
T = TypeVar("T")


@pytest.fixture(params=["python", pytest.param("native", marks=pytest.mark.skipif(
    not NATIVE, reason="the native codec is not built"))])
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ARROWSTASH_AVRO_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


def _arrays(levels: int) -> dict[str, Any]:
    """A record whose one field nests ``levels`` schema levels in all (the record and its field
    are two of them): arrays of arrays down to a long."""
    inner: Any = "long"
    for _ in range(levels - 2):
        inner = {"type": "array", "items": inner}
    return {"type": "record", "name": "Deep", "fields": [{"name": "v", "type": inner}]}


def _mixed(levels: int) -> dict[str, Any]:
    """Unions, maps, records and type wrappers in turn, ``levels`` deep in all."""
    inner: Any = {"type": "long"}
    for i in range(levels - 2):
        inner = [
            lambda t: ["null", t],
            lambda t: {"type": "map", "values": t},
            lambda t, i=i: {"type": "record", "name": f"R{i}",
                            "fields": [{"name": "f", "type": t}]},
            lambda t: {"type": t},
        ][i % 4](inner)
    return {"type": "record", "name": "Deep", "fields": [{"name": "v", "type": inner}]}


def _from_deep_stack(frames: int, work: Callable[[], T]) -> T:
    """``work()`` called ``frames`` Python frames below here: the limit leaves room for callers."""
    return work() if frames == 0 else _from_deep_stack(frames - 1, work)


def test_the_limit_is_documented() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "avro.md").read_text()
    assert f"{MAX_DEPTH:,} levels" in docs or f"{MAX_DEPTH} levels" in docs
    assert 64 <= MAX_DEPTH <= 256  # deeper than real schemas, far inside the recursion limit


@pytest.mark.parametrize("shape", [_arrays, _mixed])
def test_a_dict_schema_one_level_past_the_limit_is_refused(shape: Callable[[int], Any]) -> None:
    assert parse_schema(shape(MAX_DEPTH)).root.name == "Deep"
    with pytest.raises(AvroSchemaError, match=re.escape(TOO_DEEP)):
        parse_schema(shape(MAX_DEPTH + 1))


def test_any_depth_of_dict_or_json_is_refused_without_recursion_error() -> None:
    for levels in (600, 5_000, 100_000):
        with pytest.raises(AvroSchemaError, match=re.escape(TOO_DEEP)):
            parse_schema(_arrays(levels))
        text = '{"type":"array","items":' * levels + '"long"' + "}" * levels
        with pytest.raises(AvroSchemaError, match=re.escape(TOO_DEEP)):
            parse_schema(text)
    looped: dict[str, Any] = {"type": "array"}
    looped["items"] = looped  # a dict that contains itself
    with pytest.raises(AvroSchemaError, match=re.escape(TOO_DEEP)):
        parse_schema(looped)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 3_000, 200_000])
def test_a_container_file_with_a_too_deep_header_schema_is_refused(levels: int) -> None:
    schema = '{"type":"array","items":' * levels + '"long"' + "}" * levels
    data = _header_bytes({"avro.schema": schema.encode(), "avro.codec": b"null"}, bytes(16))
    with pytest.raises(AvroDecodeError, match="header holds an invalid schema.*" +
                       re.escape(TOO_DEEP)):
        read_ocf(io.BytesIO(data))


def test_a_too_deep_arrow_type_is_refused() -> None:
    ok, deep = pa.int64(), pa.int64()
    for _ in range(MAX_DEPTH // 2 - 2):  # a nullable list is two Avro levels: union, array
        ok = pa.list_(ok)
    for _ in range(5_000):
        deep = pa.list_(deep)
    assert from_arrow_schema(pa.schema([("v", ok)])).arrow_schema.field("v").type == ok
    with pytest.raises(AvroSchemaError, match=re.escape(TOO_DEEP)):
        from_arrow_schema(pa.schema([("v", deep)]))


def test_values_at_the_limit_round_trip_from_a_deep_stack(codec: str, tmp_path: Path) -> None:
    """Every walker of a schema (Arrow mapping, canonical form, encoder, decoders, container
    files) handles the deepest schema allowed with 300 frames already on the stack."""
    schema_json = json.dumps(_arrays(MAX_DEPTH))

    def chain(leaf: int) -> Any:  # MAX_DEPTH - 2 lists, one inside the other
        value: Any = leaf
        for _ in range(MAX_DEPTH - 2):
            value = [value]
        return value

    rows = [{"v": chain(0)}, {"v": [*chain(7), [], [[]]]}, {"v": []}]

    def work() -> tuple[list[Any], list[Any], str]:
        schema = parse_schema(schema_json)  # a fresh parse, in this deep stack too
        table = pa.Table.from_pylist(rows, schema=schema.arrow_schema)
        messages = encode(table, schema)
        decoded = decode(messages.to_pylist(), schema).to_pylist()
        write_ocf(table, tmp_path / "deep.avro", schema)
        return decoded, read_ocf(tmp_path / "deep.avro").to_pylist(), schema.canonical_form

    decoded, from_file, canonical = _from_deep_stack(300, work)
    assert decoded == rows and from_file == rows
    assert canonical.count('"items"') == MAX_DEPTH - 2


# Values nested through a recursive schema are read past (a reader schema drops the recursion)
# with a bound of their own, SKIP_DEPTH levels: a Tree's children, arrays of Trees.
TREE = {"type": "record", "name": "Tree", "fields": [
    {"name": "children", "type": {"type": "array", "items": "Tree"}},
    {"name": "size", "type": "int"},
]}
TREE_READER = {"type": "record", "name": "Tree", "fields": [{"name": "size", "type": "int"}]}


def _tree(levels: int) -> bytes:
    """A Tree whose children array holds one Tree, ``levels`` Trees deep, encoded by hand: each
    level is a block of one item, then (after the child) the block's end and the size 7."""
    return b"\x02" * (levels - 1) + b"\x00" + b"\x0e" + b"\x00\x0e" * (levels - 1)


def test_arrays_of_arrays_through_a_recursive_schema_stop_at_the_skip_limit(codec: str) -> None:
    # Every Tree level is two skip levels (the record, its array's item).
    ok = _from_deep_stack(300, lambda: decode([_tree(SKIP_DEPTH // 2)], TREE,
                                              reader_schema=TREE_READER))
    assert ok.to_pylist() == [{"size": 7}]
    for levels in (SKIP_DEPTH // 2 + 2, 200_000):
        with pytest.raises(AvroDecodeError, match=f"nests deeper than {SKIP_DEPTH} levels"):
            decode([_tree(levels)], TREE, reader_schema=TREE_READER)


def test_a_container_file_of_too_deep_recursive_values_is_refused(codec: str) -> None:
    header = _header_bytes({"avro.schema": json.dumps(TREE).encode(), "avro.codec": b"null"},
                           bytes(16))
    datum = _tree(200_000)
    data = header + b"\x02" + zigzag(len(datum)) + datum + bytes(16)
    with pytest.raises(AvroDecodeError, match=f"nests deeper than {SKIP_DEPTH} levels"):
        read_ocf(io.BytesIO(data), reader_schema=TREE_READER)

