"""Recursive schemas (a linked list, a tree): below the top-level record, every value of a record
that can hold itself is kept as its own Avro encoding in a binary column whose field metadata
holds the record's standalone schema. Both decoders read it like fastavro, the bytes decode with
that schema, encode writes them back unchanged (decode -> encode is byte for byte), container
files and schema resolution keep the same cut, and bad input fails naming the message and field."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _avro_arrow import read_back
from _avro_strategies import write, zigzag
from _shared import SHARED_AVRO
from arrowstash.avro import decode, encode, from_arrow_schema, parse_schema, read_ocf, write_ocf
from arrowstash.avro.decode_plan import SKIP_DEPTH
from arrowstash.errors import AvroDecodeError, AvroEncodeError, AvroSchemaError

fastavro = pytest.importorskip("fastavro")

NATIVE = importlib.util.find_spec("arrowstash.avro._native._cdecode") is not None
CODECS = ["python", pytest.param("native", marks=pytest.mark.skipif(
    not NATIVE, reason="the native codec is not built"))]

LONG_LIST = {"name": "LongList", "type": "record", "fields": [
    {"name": "value", "type": "long"}, {"name": "next", "type": ["null", "LongList"]}]}
TREE = {"type": "record", "name": "Tree", "namespace": "t", "fields": [
    {"name": "label", "type": "string"},
    {"name": "left", "type": ["null", "Tree"]},
    {"name": "right", "type": ["Tree", "null"]},
    {"name": "kids", "type": {"type": "array", "items": "Tree"}},
    {"name": "named", "type": {"type": "map", "values": ["null", "Tree", "double"]}},
]}
#: A record holding a recursive one: the holder is not recursive, so only the list is cut.
HOLDER = {"type": "record", "name": "Holder", "fields": [
    {"name": "id", "type": "int"},
    {"name": "head", "type": LONG_LIST},
    {"name": "more", "type": ["null", "LongList"]},
]}


@pytest.fixture(params=CODECS)
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ARROWSTASH_AVRO_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


def _fastavro_read(messages: list[bytes], writer: Any, reader: Any = None) -> list[Any]:
    w = fastavro.parse_schema(writer)
    r = None if reader is None else fastavro.parse_schema(reader)
    return [fastavro.schemaless_reader(io.BytesIO(m), w, r) for m in messages]


def long_lists(max_length: int = 12) -> st.SearchStrategy[Any]:
    def chain(values: list[int]) -> Any:
        node = None
        for v in reversed(values):
            node = {"value": v, "next": node}
        return node

    return st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=max_length).map(chain)


def trees() -> st.SearchStrategy[Any]:
    label = st.text(max_size=4)
    leaf = st.builds(lambda s: {"label": s, "left": None, "right": None, "kids": [],
                                "named": {}}, label)

    def grow(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.builds(
            lambda s, left, right, kids, named: {"label": s, "left": left, "right": right,
                                                 "kids": kids, "named": named},
            label, st.none() | inner, st.none() | inner, st.lists(inner, max_size=2),
            st.dictionaries(st.text(max_size=2), st.none() | inner | st.floats(
                allow_nan=False), max_size=2))

    return st.recursive(leaf, grow, max_leaves=8)


def holders() -> st.SearchStrategy[Any]:
    return st.builds(lambda i, head, more: {"id": i, "head": head, "more": more},
                     st.integers(-(2**31), 2**31 - 1), long_lists(), st.none() | long_lists())


CASES = [(LONG_LIST, long_lists()), (TREE, trees()), (HOLDER, holders())]
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


# -- the mapping -------------------------------------------------------------------------------

def test_the_cut_is_at_each_reference_below_the_top_level_record() -> None:
    tree = parse_schema(TREE).arrow_schema
    assert tree.field("label").type == pa.string()  # the top-level record's fields are columns
    assert tree.field("left").type == pa.binary() and tree.field("left").nullable
    assert tree.field("right").type == pa.binary() and tree.field("right").nullable
    assert tree.field("kids").type == pa.list_(pa.field("item", pa.binary(), nullable=False))
    union = tree.field("named").type.item_type
    assert [union.field(i).type for i in range(3)] == [pa.null(), pa.binary(), pa.float64()]
    standalone = parse_schema(TREE).json.encode()
    kept = [tree.field("left"), tree.field("kids").type.value_field,
            tree.field("named").type.item_field.type.field(1)]
    assert all(f.metadata == {b"avro.schema": standalone} for f in kept)
    holder = parse_schema(HOLDER).arrow_schema
    assert holder.field("head").type == pa.binary()  # a recursive record is cut where it starts
    assert parse_schema(holder.field("head").metadata[b"avro.schema"]) == parse_schema(LONG_LIST)


def test_mutually_recursive_records_are_cut_at_each_record() -> None:
    schema = {"type": "record", "name": "A", "fields": [
        {"name": "b", "type": {"type": "record", "name": "B", "fields": [
            {"name": "a", "type": ["null", "A"]}, {"name": "n", "type": "int"}]}}]}
    arrow = parse_schema(schema).arrow_schema
    assert arrow.field("b").type == pa.binary()
    b_schema = parse_schema(arrow.field("b").metadata[b"avro.schema"])
    assert b_schema.root.name == "B"  # stands alone: A is defined inside it
    assert b_schema.arrow_schema.field("a").type == pa.binary()
    values = [{"b": {"a": {"b": {"a": None, "n": 2}}, "n": 1}}, {"b": {"a": None, "n": 3}}]
    messages = write(schema, values)
    assert read_back(decode(messages, schema)) == _fastavro_read(messages, schema)


# -- decode, encode -----------------------------------------------------------------------------

@pytest.mark.parametrize(("schema", "values"), CASES, ids=["LongList", "Tree", "Holder"])
def test_both_decoders_read_like_fastavro_and_encode_gives_the_bytes_back(
        codec: str, schema: Any, values: st.SearchStrategy[Any]) -> None:
    @SETTINGS
    @given(st.lists(values, min_size=1, max_size=5))
    def check(records: list[Any]) -> None:
        messages = write(schema, records)
        batch = decode(messages, schema)
        assert batch.schema == parse_schema(schema).arrow_schema
        assert read_back(batch) == _fastavro_read(messages, schema)
        assert encode(batch, schema).to_pylist() == messages

    check()


@SETTINGS
@given(records=st.lists(trees(), min_size=1, max_size=6))
def test_the_native_and_python_decoders_give_the_same_batch(records: list[Any]) -> None:
    if not NATIVE:
        pytest.skip("the native codec is not built")
    messages = write(TREE, records)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ARROWSTASH_AVRO_NATIVE", "0")
        pure = decode(messages, TREE)
    assert decode(messages, TREE, threads=2).equals(pure)


def test_kept_bytes_decode_with_their_metadata_to_the_sub_value(codec: str) -> None:
    records = [{"value": 1, "next": {"value": 2, "next": {"value": 3, "next": None}}},
               {"value": 4, "next": None}]
    batch = decode(write(LONG_LIST, records), LONG_LIST)
    field = batch.schema.field("next")
    inner = decode(batch.column("next").drop_null(), field.metadata[b"avro.schema"])
    assert inner.column("value").to_pylist() == [2]
    assert _fastavro_read(inner.column("next").drop_null().to_pylist(), LONG_LIST) == [
        {"value": 3, "next": None}]


def test_encode_takes_large_binary_and_views_and_checks_each_value(codec: str) -> None:
    batch = decode(write(LONG_LIST, [{"value": 1, "next": {"value": 2, "next": None}}]),
                   LONG_LIST)
    for kind in (pa.large_binary(), pa.binary_view()):
        other = batch.set_column(1, pa.field("next", kind), batch.column(1).cast(kind))
        assert encode(other, LONG_LIST).to_pylist() == encode(batch, LONG_LIST).to_pylist()
    bad = batch.set_column(1, "next", pa.array([b"\x04\x02"], pa.binary()))  # truncated
    with pytest.raises(AvroEncodeError, match=r"row 0, column 'next': the bytes are not one "
                                              r"whole Avro LongList: .*truncated"):
        encode(bad, LONG_LIST)
    extra = batch.set_column(1, "next", pa.array([b"\x04\x00\x00"], pa.binary()))
    with pytest.raises(AvroEncodeError, match=r"row 0, column 'next'.*trailing byte"):
        encode(extra, LONG_LIST)


# -- container files, resolution -----------------------------------------------------------------

def test_container_files_read_and_write_the_same_cut(codec: str, tmp_path: Path) -> None:
    records = [{"id": k, "head": {"value": k, "next": {"value": -k, "next": None}},
                "more": None if k % 2 else {"value": 7, "next": None}} for k in range(300)]
    path = tmp_path / "holders.avro"
    with open(path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(HOLDER), records, codec="deflate",
                        sync_interval=500)
    table = read_ocf(path, threads=2)
    assert read_back(table) == records
    again = tmp_path / "again.avro"
    write_ocf(table, again, codec="deflate")  # the schema: the table's avro.schema metadata
    with open(again, "rb") as f:
        assert list(fastavro.reader(f)) == records
    assert read_ocf(path, columns=["more"]).column("more").equals(table.column("more"))


def test_columns_without_the_schema_metadata_map_back_to_their_record(codec: str) -> None:
    records = [{"id": 1, "head": {"value": 1, "next": {"value": 2, "next": None}},
                "more": {"value": 3, "next": None}}, {"id": 2, "head": {"value": 4, "next": None},
                                                      "more": None}]
    batch = decode(write(HOLDER, records), HOLDER)
    bare = pa.Table.from_batches([batch]).replace_schema_metadata(None).select(["more", "head"])
    schema = from_arrow_schema(bare)
    assert [str(f.type) for f in schema.root.fields] == [
        "Union([null, LongList])", "Record(LongList)"]  # defined once, then named
    rows = [{"more": r["more"], "head": r["head"]} for r in records]
    assert encode(bare, schema).to_pylist() == write(json.loads(schema.json), rows)


@pytest.mark.skipif(not (SHARED_AVRO / "fastavro").is_dir(), reason=f"no sample files at "
                    f"{SHARED_AVRO} (../shared/avro)")
def test_fastavros_recursive_sample_file(codec: str) -> None:
    path = SHARED_AVRO / "fastavro" / "recursive.avro"
    with open(path, "rb") as f:
        expected = list(fastavro.reader(f))
    table = read_ocf(path)
    assert table.schema.field("next").type == pa.binary()
    assert read_back(table) == expected


@pytest.mark.skipif(not (SHARED_AVRO / "apache-avro").is_dir(), reason=f"no sample files at "
                    f"{SHARED_AVRO} (../shared/avro)")
def test_apache_avros_interop_schema_with_its_recursive_node(codec: str, tmp_path: Path) -> None:
    schema = json.loads((SHARED_AVRO / "apache-avro" / "share__test__schemas__interop.avsc")
                        .read_text())
    node = {"label": "root", "children": [{"label": "a", "children": []},
                                          {"label": "b", "children": [
                                              {"label": "c", "children": []}]}]}
    record = {"intField": 1, "longField": 2, "stringField": "s", "boolField": True,
              "floatField": 1.5, "doubleField": 2.5, "bytesField": b"b", "nullField": None,
              "arrayField": [1.0], "mapField": {"k": {"label": "f"}}, "unionField": [b"x"],
              "enumField": "B", "fixedField": bytes(16), "recordField": node}
    path = tmp_path / "interop.avro"
    with open(path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(schema), [record, {**record, "intField": 5}])
    table = read_ocf(path)
    assert table.schema.field("recordField").type == pa.binary()  # Node: a recursive record
    with open(path, "rb") as f:
        assert read_back(table) == list(fastavro.reader(f))


NODE = {"type": "record", "name": "Node", "namespace": "list", "fields": [
    {"name": "value", "type": "long"}, {"name": "next", "type": ["null", "Node"]},
    {"name": "tag", "type": "string"}]}
WRAPPED = {"type": "record", "name": "Wrap", "fields": [
    {"name": "x", "type": "int"}, {"name": "nodes", "type": ["null", NODE]}]}


def _chain(length: int) -> Any:
    node = None
    for k in range(length):
        node = {"value": k, "next": node, "tag": f"t{k}"}
    return node


def test_resolution_passes_the_same_record_through_and_re_encodes_another(codec: str) -> None:
    records = [{"x": k, "nodes": _chain(k % 4)} for k in range(12)]
    messages = write(WRAPPED, records)
    drops_x = {**WRAPPED, "fields": [WRAPPED["fields"][1]]}
    batch = decode(messages, WRAPPED, reader_schema=drops_x)
    assert batch.column("nodes").equals(decode(messages, WRAPPED).column("nodes"))  # same bytes
    assert read_back(batch) == _fastavro_read(messages, WRAPPED, drops_x)
    # the reader's Node differs (no tag, value promoted): each level decoded and encoded again
    reader_node = {**NODE, "fields": [{"name": "next", "type": ["null", "Node"]},
                                      {"name": "value", "type": "double"}]}
    reader = {**WRAPPED, "fields": [{"name": "nodes", "type": ["null", reader_node]}]}
    resolved = decode(messages, WRAPPED, reader_schema=reader)
    assert resolved.schema == parse_schema(reader).arrow_schema
    assert read_back(resolved) == _fastavro_read(messages, WRAPPED, reader)
    # a reader without the recursion reads it as a struct
    flat = {**WRAPPED, "fields": [{"name": "nodes", "type": ["null", {
        "type": "record", "name": "Node", "namespace": "list", "fields": [
            {"name": "tag", "type": "string"}]}]}]}
    assert decode(messages, WRAPPED, reader_schema=flat).to_pylist() == _fastavro_read(
        messages, WRAPPED, flat)


def test_a_recursive_record_at_the_top_resolves_against_another(codec: str) -> None:
    messages = write(NODE, [_chain(3), _chain(1)])
    reader = {**NODE, "fields": [NODE["fields"][1], NODE["fields"][2]]}
    assert read_back(decode(messages, NODE, reader_schema=reader)) == _fastavro_read(
        messages, NODE, reader)


def test_resolving_deep_data_level_by_level_is_refused_clearly() -> None:
    messages = write(NODE, [_chain(2000)])
    reader = {**NODE, "fields": NODE["fields"][:2]}  # another Node: each level re-encoded
    with pytest.raises(AvroDecodeError, match=r"Node\.next: values of the recursive Node nest "
                                              r"too deep to resolve"):
        decode(messages, NODE, reader_schema=reader)
    assert decode(messages, NODE).num_rows == 1  # without resolution the bytes are kept


def test_a_default_value_of_a_recursive_record_is_refused_by_name() -> None:
    writer = {"type": "record", "name": "W", "fields": [{"name": "x", "type": "int"}]}
    reader = {**writer, "fields": [*writer["fields"], {
        "name": "head", "type": LONG_LIST, "default": {"value": 0, "next": None}}]}
    with pytest.raises(AvroSchemaError, match=r"W\.head: default .* does not fit LongList: a "
                                              r"default value of the recursive record LongList"):
        decode(write(writer, [{"x": 1}]), writer, reader_schema=reader)
    nullable = {**writer, "fields": [*writer["fields"], {
        "name": "more", "type": ["null", LONG_LIST], "default": None}]}
    assert decode(write(writer, [{"x": 1}]), writer, reader_schema=nullable).to_pylist() == [
        {"x": 1, "more": None}]


# -- bad input ---------------------------------------------------------------------------------

def test_a_truncated_value_names_the_message_and_the_field(codec: str) -> None:
    good = write(LONG_LIST, [{"value": 1, "next": {"value": 2, "next": None}}])[0]
    with pytest.raises(AvroDecodeError, match=r"^message 1 at byte 2: truncated: long at "
                                              r"next\.value runs past the end of the data"):
        decode([good, good[:2]], LONG_LIST)
    with pytest.raises(AvroDecodeError, match=r"^message 0 at byte 3: union index 2 out of "
                                              r"range for \[null, LongList\] at next\.next"):
        decode([good[:3] + b"\x04"], LONG_LIST)


def test_deep_values_stop_at_the_decoders_depth_limit(codec: str) -> None:
    def chain(levels: int) -> bytes:  # value 0 and a next, levels deep, then null
        return b"\x00\x02" * levels + b"\x00\x00"

    assert decode([chain(SKIP_DEPTH // 2 - 2)], LONG_LIST).num_rows == 1
    for levels in (SKIP_DEPTH, 300_000):
        with pytest.raises(AvroDecodeError, match=f"nests deeper than {SKIP_DEPTH} levels"):
            decode([chain(levels)], LONG_LIST)


def test_a_block_count_past_the_bytes_left_is_refused(codec: str) -> None:
    tree = {"type": "record", "name": "T", "fields": [
        {"name": "kids", "type": {"type": "array", "items": "T"}}]}
    forged = b"\x02" + zigzag(10**9) + b"\x00"  # one kid, which claims 10**9 kids of its own
    with pytest.raises(AvroDecodeError, match=r"^message 0 at byte 1: block count 1000000000 "
                                              r"of array at kids\[\]\.kids exceeds"):
        decode([forged], tree)
