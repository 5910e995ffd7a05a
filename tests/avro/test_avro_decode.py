"""The Avro decoder against fastavro (the reference implementation) and on bad input.

Messages written by fastavro's ``schemaless_writer`` over hypothesis-generated schemas and values
must decode to what fastavro's ``schemaless_reader`` reads from them; every kind of bad input must
raise AvroDecodeError naming the message and byte offset, never crash or return garbage. The
pure-Python decoder runs here (``native=False``); tests/test_avro_native.py compares the C one.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import struct
import uuid
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _avro_strategies import schema_and_records, uuids_as_bytes, write
from arrowstash import AvroDecodeError
from arrowstash.avro import decode, decode_blocks, parse_schema
from arrowstash.avro.writer_decoder import decode_messages


def read(schema: Any, messages: list[bytes]) -> list[Any]:
    parsed = fastavro.parse_schema(schema)
    return [fastavro.schemaless_reader(io.BytesIO(m), parsed, parsed) for m in messages]


def py(scalar: pa.Scalar) -> Any:
    """A decoded value as fastavro gives it: maps become dicts, union values their branch's."""
    t = scalar.type
    if pa.types.is_union(t):
        return py(scalar.value) if scalar.value is not None else None
    if not scalar.is_valid:
        return None
    if pa.types.is_map(t):
        entries = scalar.values
        return {k.as_py(): py(v) for k, v in zip(entries.field(0), entries.field(1), strict=False)}
    if pa.types.is_struct(t):
        return {name: py(v) for name, v in scalar.items()}
    if pa.types.is_list(t):
        return [py(v) for v in scalar.values]
    return scalar.as_py()


def rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    names = batch.schema.names
    return [{n: py(batch.column(j)[i]) for j, n in enumerate(names)} for i in range(batch.num_rows)]


def pure(messages: Any, schema: Any, **kw: Any) -> pa.RecordBatch:
    return decode_messages(messages, parse_schema(schema), native=False, **kw)[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=schema_and_records(max_size=5))
def test_decodes_what_fastavro_writes_to_what_fastavro_reads(
    case: tuple[dict[str, Any], list[Any]],
) -> None:
    schema, records = case
    messages = write(schema, records)
    batch = pure(messages, schema)
    assert batch.schema == parse_schema(schema).arrow_schema
    assert batch.num_rows == len(records)
    batch.validate(full=True)
    assert uuids_as_bytes(rows(batch)) == uuids_as_bytes(read(schema, messages))


def test_every_type_and_logical_type() -> None:
    schema = {
        "type": "record", "name": "All", "namespace": "t", "fields": [
            {"name": "n", "type": "null"},
            {"name": "b", "type": "boolean"},
            {"name": "i", "type": "int"},
            {"name": "l", "type": "long"},
            {"name": "f", "type": "float"},
            {"name": "d", "type": "double"},
            {"name": "by", "type": "bytes"},
            {"name": "s", "type": "string"},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
            {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 3}},
            {"name": "a", "type": {"type": "array", "items": ["null", "int"]}},
            {"name": "m", "type": {"type": "map", "values": "E"}},
            {"name": "u", "type": ["null", "int", "string", "E"]},
            {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                                     "scale": 3}},
            {"name": "dec256", "type": {"type": "bytes", "logicalType": "decimal",
                                        "precision": 50, "scale": 0}},
            {"name": "fdec", "type": {"type": "fixed", "name": "FD", "size": 6,
                                      "logicalType": "decimal", "precision": 14, "scale": 2}},
            {"name": "us", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "uf", "type": {"type": "fixed", "name": "UF", "size": 16,
                                    "logicalType": "uuid"}},
            {"name": "date", "type": {"type": "int", "logicalType": "date"}},
            {"name": "tms", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "tus", "type": {"type": "long", "logicalType": "time-micros"}},
            {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "tsn", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
            {"name": "lsm", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
            {"name": "lsu", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "lsn", "type": {"type": "long", "logicalType": "local-timestamp-nanos"}},
            {"name": "dur", "type": {"type": "fixed", "name": "Dur", "size": 12,
                                     "logicalType": "duration"}},
            {"name": "odd", "type": {"type": "long", "logicalType": "something-new"}},
        ]}
    u = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
    when = dt.datetime(2024, 2, 29, 12, 30, 15, 123456, tzinfo=dt.timezone.utc)
    record = {
        "n": None, "b": True, "i": -(2**31), "l": 2**63 - 1, "f": 1.5, "d": -2.25,
        "by": b"\x00\xff", "s": "héllo ✓", "e": "C", "fx": b"abc", "a": [1, None, -7],
        "m": {"x": "B", "": "A"}, "u": "str", "dec": decimal.Decimal("-123456.789"),
        "dec256": decimal.Decimal(10**49 + 1), "fdec": decimal.Decimal("-12.34"),
        "us": u, "uf": u.bytes, "date": dt.date(1969, 12, 31), "tms": dt.time(23, 59, 59, 999000),
        "tus": dt.time(0, 0, 0, 1), "tsm": when.replace(microsecond=123000), "tsu": when,
        "tsn": 1_700_000_000_123_456_789, "lsm": when.replace(tzinfo=None, microsecond=123000),
        "lsu": when.replace(tzinfo=None), "lsn": -5,
        "dur": struct.pack("<III", 14, 3, 1500), "odd": 42,
    }
    batch = pure(write(schema, [record]), schema)
    batch.validate(full=True)
    (got,) = rows(batch)
    expected = dict(record)
    expected.update(dur=pa.MonthDayNano([14, 3, 1_500_000_000]), uf=u)
    for name in ("tsn", "lsn"):  # nanoseconds: compare the raw int64s
        assert batch.column(name).cast(pa.int64())[0].as_py() == expected.pop(name)
        del got[name]
    assert got == expected
    assert batch.column("tsn").type == pa.timestamp("ns", "UTC")
    assert batch.column("e").dictionary.to_pylist() == ["A", "B", "C"]
    assert batch.column("u").type.field(3).name == "t.E"


def test_non_record_schema_and_empty_input() -> None:
    schema = ["null", {"type": "array", "items": "long"}]
    batch = pure(write(schema, [[1, 2], None, []]), schema)
    assert batch.schema.names == ["value"]
    assert batch.column(0).to_pylist() == [[1, 2], None, []]
    empty = pure([], {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    assert empty.num_rows == 0 and empty.schema.names == ["a"]


def test_negative_block_counts_with_byte_sizes() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "array", "items": "int"}},
        {"name": "m", "type": {"type": "map", "values": "string"}}]}
    # array: block of -2 items (4 bytes: 2, 4 zigzag), then a block of 1, then end; map likewise
    msg = bytes([3, 4, 2, 4, 2, 6, 0]) + bytes([1, 8, 2, ord("k"), 2, ord("v"), 0])
    assert pure([msg], schema).to_pylist() == [{"a": [1, 2, 3], "m": [("k", "v")]}]


def test_binary_array_inputs_sliced_large_chunked_and_buffer_offsets() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
    messages = write(schema, [{"s": f"v{i}" * i} for i in range(10)])
    expected = [{"s": f"v{i}" * i} for i in range(10)]
    arr = pa.array(messages, pa.binary())
    assert pure(arr, schema).to_pylist() == expected
    assert pure(arr.slice(3, 4), schema).to_pylist() == expected[3:7]
    assert pure(pa.array(messages, pa.large_binary()).slice(2), schema).to_pylist() == expected[2:]
    chunked = pa.chunked_array([arr.slice(0, 5), arr.slice(5)])
    assert pure(chunked, schema).to_pylist() == expected
    data = b"".join(messages)
    offsets = [0]
    for m in messages:
        offsets.append(offsets[-1] + len(m))
    assert pure((data, offsets), schema).to_pylist() == expected
    assert pure((pa.py_buffer(data), pa.array(offsets, pa.int64())), schema).to_pylist() == expected
    assert pure([bytearray(m) for m in messages], schema).to_pylist() == expected


def test_null_message_is_an_error_naming_it() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
    messages: list[bytes | None] = [*write(schema, [{"s": "a"}, {"s": "b"}])]
    messages.insert(1, None)
    with pytest.raises(AvroDecodeError, match=r"^message 1 at byte 0: message is null$"):
        pure(pa.array(messages, pa.binary()), schema)
    with pytest.raises(AvroDecodeError, match=r"^message 0 at byte 0: message is null$"):
        pure(pa.array(messages, pa.binary()).slice(1), schema)


def test_confluent_header_stripped_checked_and_ids_returned() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    payloads = write(schema, [{"a": 1}, {"a": -2}])
    framed = [b"\x00" + (7).to_bytes(4, "big") + payloads[0],
              b"\x00" + (2**31 - 1).to_bytes(4, "big") + payloads[1]]
    batch, ids = decode_messages(framed, parse_schema(schema), confluent=True, native=False)
    assert batch.to_pylist() == [{"a": 1}, {"a": -2}] and ids.to_pylist() == [7, 2**31 - 1]
    with_ids = decode(framed, schema, confluent=True, schema_id_column="schema_id")
    assert with_ids.column("schema_id").to_pylist() == [7, 2**31 - 1]
    with pytest.raises(AvroDecodeError, match=r"^message 1 at byte 0: Confluent magic byte is 5"):
        pure([framed[0], b"\x05" + framed[1][1:]], schema, confluent=True)
    with pytest.raises(AvroDecodeError, match=r"^message 0 at byte 0: message is shorter than"):
        pure([b"\x00\x00"], schema, confluent=True)
    with pytest.raises(AvroDecodeError, match=r"^message 0 at byte 6: 1 trailing"):
        pure([framed[0] + b"\x00"], schema, confluent=True)
    # an unstripped header is not silently decoded as data
    with pytest.raises(AvroDecodeError, match="trailing"):
        pure(framed, schema)
    with pytest.raises(ValueError, match="needs confluent=True"):
        decode(framed, schema, schema_id_column="x")


def test_decode_blocks_in_order_and_errors_name_block_and_datum() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    msgs = write(schema, [{"a": i} for i in range(7)])
    blocks = [(b"".join(msgs[:3]), 3), (b"", 0), (b"".join(msgs[3:]), 4)]
    assert decode_blocks(blocks, schema).column("a").to_pylist() == list(range(7))
    bad = [(b"".join(msgs[:3]), 3), (b"".join(msgs[3:]), 5)]
    with pytest.raises(AvroDecodeError, match=r"^block 1, datum 4 at byte 4: truncated"):
        decode_blocks(bad, schema)
    with pytest.raises(AvroDecodeError, match=r"^block 0, datum 1 at byte 2: 1 trailing"):
        decode_blocks([(b"".join(msgs[:2]) + b"\x02", 2)], schema)


INT_REC = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
STR_REC = {"type": "record", "name": "R", "fields": [
    {"name": "x", "type": "long"}, {"name": "s", "type": "string"}]}


@pytest.mark.parametrize(
    ("schema", "message", "expected"),
    [
        (INT_REC, b"", r"at byte 0: truncated: int at a runs past the end"),
        (INT_REC, b"\x80", r"at byte 0: truncated: int at a"),
        (INT_REC, b"\x80" * 10 + b"\x01", r"at byte 0: varint longer than 64 bits in int at a"),
        (INT_REC, b"\xff" * 9 + b"\x02", r"at byte 0: varint longer than 64 bits"),
        (INT_REC, b"\x80\x80\x80\x80\x80\x80\x01", r"at byte 0: 2199023255552 is out of range"),
        (INT_REC, b"\x80\x80\x80\x80\x10", r"at byte 0: 2147483648 is out of range for int at a"),
        (INT_REC, b"\x02\x00", r"at byte 1: 1 trailing byte"),
        (STR_REC, b"\x02\x03", r"at byte 1: negative length -2 for string at s"),
        (STR_REC, b"\x02\x06ab", r"at byte 1: truncated: string at s"),
        (STR_REC, b"\x02\x04\xc3\x28", r"at byte 1: invalid UTF-8 in string at s"),
        (STR_REC, b"\x02\x06\xed\xa0\x80", r"at byte 1: invalid UTF-8"),  # a surrogate
        (STR_REC, b"\x02\x04\xc0\xaf", r"at byte 1: invalid UTF-8"),  # overlong
        ({"type": "record", "name": "R", "fields": [{"name": "u", "type": ["null", "int"]}]},
         b"\x04\x02", r"at byte 0: union index 2 out of range for \[null, int\] at u"),
        ({"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string",
                                                                       "null"]}]},
         b"\x01", r"at byte 0: union index -1 out of range for \[int, string, null\] at u"),
        ({"type": "record", "name": "R", "fields": [{"name": "b", "type": "boolean"}]},
         b"\x02", r"at byte 0: boolean byte 2 is not 0 or 1 at b"),
        ({"type": "record", "name": "R", "fields": [{"name": "e", "type": {
            "type": "enum", "name": "E", "symbols": ["A"]}}]},
         b"\x02", r"at byte 0: enum index 1 out of range for E at e"),
        ({"type": "record", "name": "R", "fields": [{"name": "u", "type": {
            "type": "string", "logicalType": "uuid"}}]},
         b"\x48" + b"g" * 36, r"at byte 0: invalid uuid text in string/uuid at u"),
        ({"type": "record", "name": "R", "fields": [{"name": "u", "type": {
            "type": "string", "logicalType": "uuid"}}]},
         b"\x04ab", r"at byte 0: invalid uuid text"),
        ({"type": "record", "name": "R", "fields": [{"name": "d", "type": {
            "type": "bytes", "logicalType": "decimal", "precision": 4}}]},
         b"\x22\x01" + bytes(16), r"at byte 0: decimal value does not fit bytes/decimal at d"),
        ({"type": "record", "name": "R", "fields": [{"name": "d", "type": {  # 10000: 5 digits
            "type": "bytes", "logicalType": "decimal", "precision": 4}}]},
         b"\x04\x27\x10", r"at byte 0: decimal value does not fit bytes/decimal at d"),
        ({"type": "record", "name": "R", "fields": [{"name": "d", "type": {
            "type": "fixed", "name": "D", "size": 12, "logicalType": "duration"}}]},
         b"\xff\xff\xff\xff" + bytes(8), r"at byte 0: duration field 4294967295 exceeds"),
        ({"type": "record", "name": "R", "fields": [{"name": "a", "type": {
            "type": "array", "items": "long"}}]},
         b"\x80\x80\x80\x80\x80\x80\x01\x00", r"at byte 0: block count 2199023255552 of array"),
        ({"type": "record", "name": "R", "fields": [{"name": "a", "type": {
            "type": "map", "values": "long"}}]},
         b"\x01\x01", r"at byte 1: negative length -1 for map at a"),
        ({"type": "record", "name": "R", "fields": [{"name": "t", "type": {
            "type": "int", "logicalType": "time-millis"}}]},
         b"\x01", r"at byte 0: -1 is not a time of day \(int/time-millis at t\)"),
        ({"type": "record", "name": "R", "fields": [{"name": "t", "type": {
            "type": "long", "logicalType": "time-micros"}}]},
         b"\x80\x80\xbb\xdd\x83\x05", r"at byte 0: 86400000000 is not a time of day"),
        ({"type": "record", "name": "R", "fields": [{"name": "f", "type": "double"}]},
         b"\x00" * 7, r"at byte 0: truncated: double at f"),
        ({"type": "record", "name": "R", "fields": [{"name": "f", "type": {
            "type": "fixed", "name": "F", "size": 4}}]},
         b"abc", r"at byte 0: truncated: F at f"),
    ],
)
def test_bad_input_raises_naming_message_and_offset(
    schema: Any, message: bytes, expected: str
) -> None:
    ok = write(schema, [_zero(schema)])[0]  # the bad message comes after two good ones
    with pytest.raises(AvroDecodeError, match=f"^message 2 {expected}"):
        pure([ok, ok, message], schema)


def _zero(schema: Any) -> dict[str, Any]:
    """A valid record of these small schemas."""
    out: dict[str, Any] = {}
    for f in schema["fields"]:
        t = f["type"]
        logical = t.get("logicalType") if isinstance(t, dict) else None
        kind = t.get("type") if isinstance(t, dict) else t
        out[f["name"]] = (
            uuid.UUID(int=5) if logical == "uuid" else decimal.Decimal(1) if logical == "decimal"
            else bytes(t["size"]) if kind == "fixed" else "A" if kind == "enum"
            else [] if kind == "array" else {} if kind == "map" else None if isinstance(t, list)
            else 0 if logical in ("time-millis", "time-micros")
            else {"int": 0, "long": 0, "string": "", "boolean": False, "double": 0.0}[kind]
        )
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=schema_and_records(max_size=5), data=st.data())
def test_truncated_and_corrupted_messages_raise_never_crash(
    case: tuple[dict[str, Any], list[Any]], data: st.DataObject
) -> None:
    schema, records = case
    messages = write(schema, records)
    if not messages:
        return
    i = data.draw(st.integers(0, len(messages) - 1))
    m = messages[i]
    cut = data.draw(st.integers(0, max(0, len(m) - 1)))
    # Avro datums are prefix-free: a cut or an extended message can never be valid
    cases = [(m + b"\x00", False), (_flip(m, data), True)]
    if m:
        cases.append((m[:cut], False))
    for bad, may_pass in cases:
        trial = [*messages[:i], bad, *messages[i + 1 :]]
        try:
            batch = pure(trial, schema)
        except AvroDecodeError as exc:
            assert str(exc).startswith(f"message {i} at byte ")
        else:
            assert may_pass
            batch.validate(full=True)


def _flip(m: bytes, data: st.DataObject) -> bytes:
    if not m:
        return b"\xff"
    j = data.draw(st.integers(0, len(m) - 1))
    return m[:j] + bytes([m[j] ^ data.draw(st.integers(1, 255))]) + m[j + 1 :]


def test_validate_utf8_off_keeps_the_bytes() -> None:
    bad = b"\x02\x04\xc3\x28"
    with pytest.raises(AvroDecodeError):
        pure([bad], STR_REC)
    batch = pure([bad], STR_REC, validate_utf8=False)
    assert batch.column("s").buffers()[2].to_pybytes() == b"\xc3\x28"


def test_recursive_schema_keeps_the_recursion_as_its_bytes() -> None:
    schema = {"type": "record", "name": "L", "fields": [
        {"name": "next", "type": ["null", "L"]}]}
    assert decode([b"\x00", b"\x02\x02\x00"], schema).column("next").to_pylist() == [
        None, b"\x02\x00"]


def test_reader_schema_resolves_after_decoding_and_ids_column_follows() -> None:
    writer = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": "int"}, {"name": "gone", "type": "string"}]}
    reader = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": "x"}]}
    framed = [b"\x00\x00\x00\x00\x09" + m for m in write(writer, [{"a": 1, "gone": "z"},
                                                                  {"a": -2, "gone": ""}])]
    batch = decode(framed, writer, reader_schema=reader, confluent=True, schema_id_column="id")
    assert batch.schema.names == ["a", "b", "id"]
    assert batch.schema.field("a").type == pa.int64()
    assert batch.to_pylist() == [{"a": 1, "b": "x", "id": 9}, {"a": -2, "b": "x", "id": 9}]
