"""Writer fields the reader schema drops are read past, never decoded: a recursive writer schema
reads with a reader that leaves the recursion out (test_avro_recursive.py reads it whole), every
kind of value can be skipped, and the native and pure-Python decoders agree on values and on
errors inside skipped bytes."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _avro_strategies import write, zigzag
from arrowstash.avro import parse_schema, read_ocf
from arrowstash.avro.decode_plan import SKIP_DEPTH
from arrowstash.avro.decoder import decode
from arrowstash.avro.resolve import pruned
from arrowstash.avro.schema import PrunedSchema, Record, Schema
from arrowstash.errors import AvroDecodeError

fastavro = pytest.importorskip("fastavro")

NATIVE = importlib.util.find_spec("arrowstash.avro._native._cdecode") is not None
DECODERS = ["python", pytest.param("native", marks=pytest.mark.skipif(
    not NATIVE, reason="the native decoder is not built"))]

NODE = {"type": "record", "name": "Node", "namespace": "list", "fields": [
    {"name": "value", "type": "long"},
    {"name": "next", "type": ["null", "Node"], "default": None},
    {"name": "tag", "type": "string"},
]}
NODE_READER = {"type": "record", "name": "Node", "namespace": "list", "fields": [
    {"name": "tag", "type": "string"},  # reordered: resolution matches by name
    {"name": "value", "type": "double"},  # promoted
]}
TREE = {"type": "record", "name": "Tree", "fields": [
    {"name": "label", "type": "string"},
    {"name": "children", "type": {"type": "array", "items": "Tree"}},
    {"name": "weights", "type": {"type": "map", "values": ["null", "Tree", "double"]}},
    {"name": "size", "type": "int"},
]}
TREE_READER = {"type": "record", "name": "Tree", "fields": [
    {"name": "size", "type": "int"}, {"name": "label", "type": "string"}]}


@pytest.fixture(params=DECODERS)
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ARROWSTASH_AVRO_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


def _chain(length: int, first: int) -> dict[str, Any] | None:
    node = None
    for k in range(length):
        node = {"value": first + k, "next": node, "tag": f"t{first + k}"}
    return node


def _tree(depth: int, label: str) -> dict[str, Any]:
    kids = [_tree(depth - 1, f"{label}.{k}") for k in range(2)] if depth else []
    weights = {"w": 0.5, "n": None, **({"t": _tree(depth - 1, label + "!")} if depth else {})}
    return {"label": label, "children": kids, "weights": weights, "size": depth}


def _fastavro_read(messages: list[bytes], writer: dict[str, Any],
                   reader: dict[str, Any]) -> list[Any]:
    w, r = fastavro.parse_schema(writer), fastavro.parse_schema(reader)
    return [fastavro.schemaless_reader(io.BytesIO(m), w, r) for m in messages]


def test_a_recursive_writer_reads_without_its_recursive_field(decoder: str) -> None:
    records = [_chain(n % 4 + 1, n) for n in range(30)] + [_chain(600, 7)]
    messages = write(NODE, records)
    batch = decode(messages, NODE, reader_schema=NODE_READER)
    assert batch.schema == parse_schema(NODE_READER).arrow_schema
    assert batch.to_pylist() == _fastavro_read(messages, NODE, NODE_READER)


def test_a_recursive_tree_with_arrays_maps_and_unions(decoder: str) -> None:
    records = [_tree(d, f"r{d}") for d in range(5)]
    messages = write(TREE, records)
    batch = decode(messages, TREE, reader_schema=TREE_READER, threads=2)
    assert batch.to_pylist() == _fastavro_read(messages, TREE, TREE_READER)


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_container_file_of_a_recursive_schema(tmp_path: Path, decoder: str, codec: str) -> None:
    records = [_chain(n % 5 + 1, n) for n in range(400)]
    path = tmp_path / "nodes.avro"
    with open(path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(NODE), records, codec=codec, sync_interval=900)
    table = read_ocf(path, reader_schema=NODE_READER, threads=2)
    with open(path, "rb") as f:
        expected = list(fastavro.reader(f, reader_schema=fastavro.parse_schema(NODE_READER)))
    assert table.to_pylist() == expected


def test_a_reader_keeping_the_recursion_reads_it_in_its_own_encoding() -> None:
    keeps = {**NODE, "fields": [NODE["fields"][1]]}  # no value, no tag: another Node
    batch = decode(write(NODE, [_chain(3, 0)]), NODE, reader_schema=keeps)
    assert batch.column("next").to_pylist() == [b"\x02\x00"]  # {"next": {"next": None}}


EVERY_KIND = {"type": "record", "name": "All", "fields": [
    {"name": "n", "type": "null"}, {"name": "b", "type": "boolean"},
    {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
    {"name": "f", "type": "float"}, {"name": "d", "type": "double"},
    {"name": "by", "type": "bytes"}, {"name": "s", "type": "string"},
    {"name": "fx", "type": {"type": "fixed", "name": "F3", "size": 3}},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    {"name": "a", "type": {"type": "array", "items": "long"}},
    {"name": "m", "type": {"type": "map", "values": "string"}},
    {"name": "u", "type": ["null", "string", {"type": "record", "name": "Inner", "fields": [
        {"name": "x", "type": "F3"}]}]},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5,
                             "scale": 2}},
    {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "keep", "type": "int"},
]}
ALL_VALUES = {"n": None, "b": True, "i": -3, "l": 2**40, "f": 1.5, "d": -2.25, "by": b"\x00\xff",
              "s": "héllo", "fx": b"abc", "e": "B", "a": [1, -2, 3], "m": {"k": "v", "w": ""},
              "u": {"x": b"xyz"}, "dec": b"\x01\x00", "uid": "0e2d2d8e-7a3c-4c4e-9d59-0e0f1c9b2a11",
              "keep": 42}


def test_every_kind_of_value_is_skipped(decoder: str) -> None:
    reader = {"type": "record", "name": "All", "fields": [{"name": "keep", "type": "int"}]}
    values = [ALL_VALUES, {**ALL_VALUES, "u": "text", "a": [], "m": {}, "keep": -1},
              {**ALL_VALUES, "u": None, "keep": 7}]
    writer = {**EVERY_KIND, "fields": [
        {**f, "type": "bytes"} if f["name"] in ("dec", "uid") else f
        for f in EVERY_KIND["fields"]]}  # fastavro writes logical values from Python objects
    messages = write(writer, [{**v, "uid": v["uid"].encode()} for v in values])
    batch = decode(messages, EVERY_KIND, reader_schema=reader)
    assert batch.to_pylist() == [{"keep": 42}, {"keep": -1}, {"keep": 7}]



LISTS = {"type": "record", "name": "L", "fields": [
    {"name": "a", "type": {"type": "array", "items": "long"}},
    {"name": "m", "type": {"type": "map", "values": "int"}},
    {"name": "k", "type": "long"}]}
LISTS_READER = {"type": "record", "name": "L", "fields": [{"name": "k", "type": "long"}]}


def test_blocks_with_byte_sizes_are_jumped_over(decoder: str) -> None:
    """A negative count is followed by the block's size in bytes (writers that buffer blocks)."""
    items = zigzag(5) + zigzag(-6)
    entries = zigzag(1) + b"x" + zigzag(9)
    message = (zigzag(-2) + zigzag(len(items)) + items + zigzag(1) + zigzag(7) + zigzag(0)
               + zigzag(-1) + zigzag(len(entries)) + entries + zigzag(0) + zigzag(99))
    assert decode([message], LISTS, reader_schema=LISTS_READER).to_pylist() == [{"k": 99}]
    assert decode([message], LISTS).to_pylist() == [
        {"a": [5, -6, 7], "m": [("x", 9)], "k": 99}]


@pytest.mark.parametrize(("message", "error"), [
    (zigzag(-1) + zigzag(50) + b"\x02", r"message 0 at byte 1: truncated: skipped array"),
    (zigzag(-1) + zigzag(-3), r"message 0 at byte 1: negative length -3 for skipped array"),
    (zigzag(10**6) + b"\x02", r"message 0 at byte 0: block count 1000000 of skipped array"),
    (zigzag(0) + zigzag(1) + zigzag(-4) + b"\x00\x00", r"message 0 at byte 2: negative "
                                                          r"length -4 for skipped map at m"),
    (zigzag(0) + b"\xff" * 11, r"message 0 at byte 1: varint longer than 64 bits in skipped"),
])
def test_bad_bytes_in_skipped_fields_are_refused(decoder: str, message: bytes,
                                                 error: str) -> None:
    with pytest.raises(AvroDecodeError, match=error):
        decode([message], LISTS, reader_schema=LISTS_READER)


def _nested(depth: int) -> bytes:
    """One Node holding ``depth`` more in its ``next`` field, encoded by hand."""
    down = b"".join(zigzag(k) + zigzag(1) for k in range(depth))  # value, then next's branch
    return down + zigzag(depth) + zigzag(0) + b"\x02t" * (depth + 1)  # null, then the tags


def test_nesting_deeper_than_the_limit_is_refused(decoder: str) -> None:
    ok = decode([_nested(SKIP_DEPTH // 2 - 1)], NODE, reader_schema=NODE_READER)
    assert ok.to_pylist() == [{"tag": "t", "value": 0.0}]
    with pytest.raises(AvroDecodeError, match=rf"^message 0 at byte \d+: skipped long at "
                                              rf"next<list.Node>.value nests deeper than "
                                              rf"{SKIP_DEPTH} levels"):
        decode([_nested(SKIP_DEPTH // 2)], NODE, reader_schema=NODE_READER)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 40), st.lists(st.tuples(st.integers(0), st.integers(0, 255)),
                                    min_size=1, max_size=3), st.booleans())
@pytest.mark.skipif(not NATIVE, reason="the native decoder is not built")
def test_both_decoders_agree_on_damaged_skipped_bytes(seed: int, flips: list[tuple[int, int]],
                                                      cut: bool) -> None:
    records = [_tree(seed % 3, f"x{seed}"), _tree(1, "y")]
    messages = write(TREE, records)
    damaged = []
    for m in messages:
        data = bytearray(m)
        for at, value in flips:
            data[at % len(data)] = value
        damaged.append(bytes(data[: len(data) - seed % 5]) if cut else bytes(data))
    outcomes = []
    for native in ("1", "0"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ARROWSTASH_AVRO_NATIVE", native)
            try:
                outcomes.append(decode(damaged, TREE, reader_schema=TREE_READER).to_pylist())
            except AvroDecodeError as exc:
                outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]


def _field_names(schema: Schema) -> list[str]:
    assert isinstance(schema.root, Record)
    return [f.name for f in schema.root.fields]


def test_pruned_keeps_what_the_reader_reads() -> None:
    writer = parse_schema(NODE)
    assert pruned(writer, writer) is writer  # nothing dropped: the writer itself
    cut = pruned(writer, parse_schema(NODE_READER))
    assert isinstance(cut, PrunedSchema) and cut.writer is writer
    assert _field_names(cut) == ["value", "tag"]
    assert [f.name for f in cut.skipped["list.Node"].fields] == ["value", "next", "tag"]
    assert cut != parse_schema(cut.json) and hash(cut) != hash(parse_schema(cut.json))
    renamed = {**NODE_READER, "fields": [{"name": "label", "type": "string", "aliases": ["tag"]}]}
    assert _field_names(pruned(writer, parse_schema(renamed))) == ["tag"]
    table = pa.Table.from_pylist([{"label": "t1"}], schema=parse_schema(renamed).arrow_schema)
    message = write(NODE, [_chain(1, 1)])
    assert decode(message, NODE, reader_schema=renamed).to_pylist() == table.to_pylist()


def test_fastavros_recursive_sample_file_reads_without_its_recursion(decoder: str) -> None:
    from _shared import SHARED_AVRO

    path = SHARED_AVRO / "fastavro" / "recursive.avro"
    if not path.exists():
        pytest.skip(f"{path} is not here")
    reader = {"type": "record", "name": "LongList", "fields": [{"name": "value", "type": "long"}]}
    with open(path, "rb") as f:
        expected = list(fastavro.reader(f, reader_schema=reader))
    assert read_ocf(path, reader_schema=reader).to_pylist() == expected


def test_container_file_columns_are_read_without_decoding_the_rest(tmp_path: Path,
                                                                   decoder: str) -> None:
    schema = {"type": "record", "name": "Row", "fields": [
        {"name": "pt", "type": {"type": "record", "name": "Pt", "fields": [
            {"name": "x", "type": "int"}]}},
        {"name": "again", "type": "Pt"},  # defined in a column that is not read
        {"name": "nodes", "type": ["null", NODE]},  # recursive: its bytes when read
        {"name": "s", "type": "string"},
    ]}
    records = [{"pt": {"x": k}, "again": {"x": -k}, "nodes": _chain(k % 3, k), "s": f"s{k}"}
               for k in range(50)]
    path = tmp_path / "rows.avro"
    with open(path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(schema), records, codec="deflate",
                        sync_interval=300)
    table = read_ocf(path, columns=["s", "again"], threads=2)
    assert table.column_names == ["s", "again"]
    assert table.to_pylist() == [{"s": r["s"], "again": r["again"]} for r in records]
    with pytest.raises(KeyError, match=r"no column\(s\) \['nope'\] in the file"):
        read_ocf(path, columns=["nope"])
    nodes = read_ocf(path, columns=["nodes"]).column("nodes")
    assert nodes.to_pylist() == [None if r["nodes"] is None else write(NODE, [r["nodes"]])[0]
                                 for r in records]
