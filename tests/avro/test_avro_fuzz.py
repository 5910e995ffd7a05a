"""Garbage in, a clear error out: random and damaged messages and container files against schemas
of every shape (skipped recursive fields included), on 1-3 threads; random tables encoded. Small
here; scripts/asan.sh runs it with ARROWSTASH_FUZZ_EXAMPLES=2000 under AddressSanitizer."""

from __future__ import annotations

import io
import os
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrowstash.avro import decode, encode, parse_schema, read_ocf
from arrowstash.errors import AvroDecodeError, AvroEncodeError, AvroSchemaError

fastavro = pytest.importorskip("fastavro")
from _avro_arrow import to_batch  # noqa: E402 - needs fastavro
from _avro_strategies import schema_and_records  # noqa: E402

EXAMPLES = int(os.environ.get("ARROWSTASH_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NODE = {"type": "record", "name": "Node", "fields": [
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "kids", "type": {"type": "array", "items": "Node"}},
    {"name": "meta", "type": {"type": "map", "values": ["null", "Node", "bytes", "double"]}},
    {"name": "when", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "cost", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                              "scale": 2}},
    {"name": "tag", "type": ["null", {"type": "enum", "name": "T", "symbols": ["A", "B"]}]},
    {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 12, "logicalType": "duration"}},
]}
NODE_READER = {"type": "record", "name": "Node", "fields": [
    f for f in NODE["fields"] if f["name"] not in ("kids", "meta")]}
SCHEMAS = [
    (NODE, NODE_READER),  # the reader skips the recursion
    (NODE_READER, None),
    ({"type": "record", "name": "U", "fields": [
        {"name": "u", "type": ["int", "string", {"type": "array", "items": "long"}]},
        {"name": "m", "type": {"type": "map", "values": {"type": "array", "items": "boolean"}}},
        {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}}]}, None),
    ("string", None),
]


@FUZZ
@given(schema=st.sampled_from(SCHEMAS), threads=st.integers(1, 3),
       garbage=st.lists(st.binary(max_size=80), min_size=1, max_size=12))
def test_random_bytes_decode_or_fail_cleanly(schema: Any, threads: int,
                                             garbage: list[bytes]) -> None:
    writer, reader = schema
    for native in ("1", "0"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ARROWSTASH_AVRO_NATIVE", native)
            try:
                batch = decode(garbage, writer, reader_schema=reader, threads=threads)
            except AvroDecodeError:
                continue
            assert batch.num_rows == len(garbage)
            batch.validate(full=True)


def _valid_messages(count: int) -> list[bytes]:
    parsed = fastavro.parse_schema(NODE)
    out = []
    for k in range(count):
        node: dict[str, Any] = {"id": f"00000000-0000-4000-8000-{k:012d}", "kids": [],
                                "meta": {"x": 1.5, "b": b"\x00"}, "when": k,
                                "cost": b"\x01", "tag": "B", "fx": bytes(12)}
        node["kids"] = [dict(node, kids=[], meta={"n": None})] * (k % 3)
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, node)
        out.append(buffer.getvalue())
    return out


VALID = _valid_messages(6)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 5), st.integers(0), st.integers(0, 255)),
                      min_size=1, max_size=6),
       cuts=st.lists(st.integers(0, 5), max_size=2), threads=st.integers(1, 3))
def test_damaged_messages_with_skipped_recursion(flips: list[tuple[int, int, int]],
                                                 cuts: list[int], threads: int) -> None:
    messages = [bytearray(m) for m in VALID]
    for which, at, value in flips:
        messages[which][at % len(messages[which])] = value
    for which in cuts:
        del messages[which][len(messages[which]) // 2 :]
    outcomes = []
    for native in ("1", "0"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ARROWSTASH_AVRO_NATIVE", native)
            try:
                batch = decode([bytes(m) for m in messages], NODE, reader_schema=NODE_READER,
                               threads=threads)
                batch.validate(full=True)
                outcomes.append(batch.to_pylist())
            except AvroDecodeError as exc:
                outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]


def _container(codec: str) -> bytes:
    out = io.BytesIO()
    records = [fastavro.schemaless_reader(io.BytesIO(m), fastavro.parse_schema(NODE))
               for m in VALID] * 5
    fastavro.writer(out, fastavro.parse_schema(NODE), records, codec=codec, sync_interval=200)
    return out.getvalue()


FILES = {codec: _container(codec) for codec in ("null", "deflate")}


@FUZZ
@given(codec=st.sampled_from(sorted(FILES)), threads=st.integers(1, 3),
       flips=st.lists(st.tuples(st.integers(0), st.integers(0, 255)), min_size=1, max_size=4))
def test_damaged_container_files_fail_cleanly(codec: str, threads: int,
                                              flips: list[tuple[int, int]]) -> None:
    data = bytearray(FILES[codec])
    for at, value in flips:
        data[at % len(data)] = value
    try:
        table = read_ocf(bytes(data), threads=threads, reader_schema=NODE_READER)
    except AvroDecodeError:
        return
    except AvroSchemaError:  # a damaged header still holding a schema names another schema,
        return  # which the reader's may not resolve from (or which maps to no Arrow type)
    for batch in table.to_batches():
        batch.validate(full=True)


@FUZZ
@given(case=schema_and_records(), threads=st.integers(1, 3))
def test_random_tables_encode_or_fail_cleanly(case: tuple[Any, list[Any]], threads: int) -> None:
    schema, records = case
    try:
        batch = to_batch(parse_schema(schema), records)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError):
        return
    for native in ("1", "0"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ARROWSTASH_AVRO_NATIVE", native)
            try:
                out = encode(batch, schema, threads=threads)
            except AvroEncodeError:
                continue
            assert len(out) == batch.num_rows
            out.validate(full=True)


def test_a_record_wider_than_128_fields_merges_across_threads() -> None:
    """The merge of the threads' parts kept child offsets in a 128-slot array even for records,
    writing past it for wider ones (found by scripts/asan.sh's UBSan)."""
    from arrowstash.avro.writer_decoder import _MIN_BYTES_PER_THREAD

    width = 200
    schema = {"type": "record", "name": "Wide",
              "fields": [{"name": f"f{i}", "type": "long"} for i in range(width)]}
    rows = 3 * _MIN_BYTES_PER_THREAD // width  # one byte per small long: 3 threads' worth
    table = pa.table({f"f{i}": pa.array([(r + i) % 60 for r in range(rows)], pa.int64())
                      for i in range(width)})
    batch = decode(encode(table, schema), schema, threads=3)
    assert all(batch.column(i).equals(table.column(i).combine_chunks()) for i in range(width))
