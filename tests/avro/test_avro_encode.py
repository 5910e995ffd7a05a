"""arrowstash.avro.encode: Arrow -> Avro datums, checked against fastavro (the reference writer
and reader), the native encoder against the pure-Python one, and every value error."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from _avro_arrow import to_arrow, to_batch
from _avro_strategies import avro_schemas, values_for
from arrowstash import ArrowstashError, AvroEncodeError
from arrowstash.avro import decode, encode, parse_schema
from arrowstash.avro import encoder as encoder_module

NATIVE = encoder_module._cencode is not None

needs_native = pytest.mark.skipif(not NATIVE, reason="the native encoder is not built")


from fastavro._logical_writers_py import prepare_bytes_decimal  # noqa: E402


def _java_bytes_decimal(datum: Any, schema: dict[str, Any]) -> Any:
    """Bytes-decimal in its minimal two's complement (Java's BigInteger.toByteArray; fastavro
    writes one more byte for negative powers of two such as -128)."""
    if not isinstance(datum, decimal.Decimal):
        return datum
    prepare_bytes_decimal(datum, schema)  # fastavro's checks of precision and scale
    v = int(datum.scaleb(schema.get("scale", 0)))
    return v.to_bytes((v if v >= 0 else ~v).bit_length() // 8 + 1, "big", signed=True)


@pytest.fixture(scope="module", autouse=True)
def minimal_decimals() -> Iterator[None]:
    from fastavro import _logical_writers, _logical_writers_py

    saved = [m.LOGICAL_WRITERS["bytes-decimal"] for m in (_logical_writers, _logical_writers_py)]
    for m in (_logical_writers, _logical_writers_py):
        m.LOGICAL_WRITERS["bytes-decimal"] = _java_bytes_decimal
    yield
    for m, w in zip((_logical_writers, _logical_writers_py), saved, strict=True):
        m.LOGICAL_WRITERS["bytes-decimal"] = w


def fastavro_bytes(schema: Any, records: list[Any]) -> list[bytes]:
    parsed = fastavro.parse_schema(json.loads(parse_schema(schema).json))
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return out


def fastavro_read(schema: Any, datums: list[bytes]) -> list[Any]:
    parsed = fastavro.parse_schema(json.loads(parse_schema(schema).json))
    return [fastavro.schemaless_reader(io.BytesIO(d), parsed, None) for d in datums]


def python_encode(data: Any, schema: Any, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    with monkeypatch.context() as m:
        m.setenv("ARROWSTASH_AVRO_NATIVE", "0")
        return encode(data, schema, **kw)


@st.composite
def schemas_and_records(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    schema = draw(avro_schemas())
    root = parse_schema(schema).root
    records = draw(st.lists(values_for(root), max_size=6))
    try:
        fastavro_bytes(schema, records)
    except (ValueError, TypeError, AttributeError):
        # fastavro's own limits, e.g. a uuid.UUID in a union with a fixed uuid, or a string in
        # a union with a date (which it parses as an ISO date): nothing to compare against
        assume(False)
    try:
        to_batch(parse_schema(schema), records)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        assume(False)  # fastavro put a value in a branch of another type (bytes as a decimal)
    return schema, records


# -- against fastavro, and native against Python --------------------------------------------------


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas_and_records())
def test_same_bytes_as_fastavro_and_read_back(case: tuple[Any, list[Any]]) -> None:
    schema, records = case
    batch = to_batch(parse_schema(schema), records)
    out = encode(batch, schema)
    assert isinstance(out, pa.BinaryArray)
    datums = out.to_pylist()
    assert datums == fastavro_bytes(schema, records)
    if fastavro_read(schema, fastavro_bytes(schema, records)) == records:
        # (fastavro does not round-trip every value of an ambiguous union, e.g. 0 in [date, int])
        assert fastavro_read(schema, datums) == records
    # the data buffer is the datums back to back (what OCF writing slices)
    assert out.buffers()[2].to_pybytes()[: sum(map(len, datums))] == b"".join(datums)
    # round trips through the decoder, both ways
    decoded = decode(out, schema)
    assert decoded.to_pylist() == batch.to_pylist()
    assert encode(decoded, schema).to_pylist() == datums


@needs_native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas_and_records())
def test_native_and_python_encoders_agree(case: tuple[Any, list[Any]]) -> None:
    schema, records = case
    batch = to_batch(parse_schema(schema), records)
    with pytest.MonkeyPatch.context() as m:
        native = encode(batch, schema).to_pylist()
        m.setenv("ARROWSTASH_AVRO_NATIVE", "0")
        python = encode(batch, schema).to_pylist()
    assert native == python


# -- a realistic schema: pyruhvro's benchmark schema --------------------------------------------

USER = {
    "type": "record",
    "name": "User",
    "fields": [
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "age", "type": ["null", "int"], "default": None},
        {"name": "emails", "type": {"type": "array", "items": "string"}},
        {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
            {"name": "street", "type": "string"}, {"name": "city", "type": "string"},
            {"name": "zipcode", "type": "string"}]}], "default": None},
        {"name": "phone_numbers", "type": {"type": "map", "values": "string"}},
        {"name": "preferences", "type": ["null", {"type": "record", "name": "Preferences",
            "fields": [{"name": "contact_method", "type": ["null", "string"], "default": None},
                       {"name": "newsletter", "type": "boolean"}]}], "default": None},
        {"name": "status", "type": ["null", "string", "int", "boolean"], "default": None},
        {"name": "created_at", "type": "long"},
        {"name": "class", "type": {"type": "enum", "name": "enum_col", "symbols": ["A", "B", "C"]}},
    ],
}  # fmt: skip


def user_records(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append({
            "name": f"user {i}" if i % 2 else None,
            "age": i % 90 if i % 3 else None,
            "emails": [f"u{i}.{k}@example.com" for k in range(i % 4)],
            "address": {"street": f"{i} Main St", "city": "Springfield",
                        "zipcode": f"{i % 99999:05}"} if i % 5 else None,
            "phone_numbers": {f"k{k}": f"+1-555-{i:07}" for k in range(i % 3)},
            "preferences": {"contact_method": ["email", None, "phone"][i % 3],
                            "newsletter": bool(i % 2)} if i % 4 else None,
            "status": [None, f"s{i}", i, bool(i % 2)][i % 4],
            "created_at": 1_700_000_000_000 + i * 7919,
            "class": "ABC"[i % 3],
        })  # fmt: skip
    return out


@pytest.fixture(scope="module")
def users() -> tuple[pa.RecordBatch, list[bytes]]:
    records = user_records(12_000)
    return to_batch(parse_schema(USER), records), fastavro_bytes(USER, records)


def test_threads_and_chunks_do_not_change_the_output(users: Any) -> None:
    batch, expected = users
    for threads in (1, 2, 3):
        assert encode(batch, USER, threads=threads).to_pylist() == expected
    table = pa.Table.from_batches([batch.slice(0, 5000), batch.slice(5000, 1), batch.slice(5001)])
    out = encode(table, USER, threads=2)
    assert isinstance(out, pa.BinaryArray) and out.to_pylist() == expected
    # sliced inputs (offsets inside every buffer) encode their own rows
    assert encode(batch.slice(777, 3001), USER).to_pylist() == expected[777:3778]


def test_python_encoder_on_a_realistic_batch(users: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    batch, expected = users
    assert python_encode(batch.slice(100, 400), USER, monkeypatch).to_pylist() == expected[100:500]


def test_pyruhvro_layout_is_accepted(users: Any) -> None:
    """pyruhvro's batches hold enums as plain strings and other unions as sparse unions."""
    batch, expected = users
    status = batch.column("status")
    sparse = pa.UnionArray.from_sparse(
        status.type_codes,
        [pa.nulls(len(status)), *[_spread(status, k) for k in (1, 2, 3)]],
        ["null", "varchar", "int", "bit"],
    )
    columns = {n: batch.column(n) for n in batch.schema.names}
    columns["status"] = sparse
    columns["class"] = batch.column("class").cast(pa.string())
    plain = pa.RecordBatch.from_pydict(columns)
    assert encode(plain, USER).to_pylist() == expected
    assert encode(plain.slice(3, 50), USER).to_pylist() == expected[3:53]


def _spread(dense: pa.UnionArray, code: int) -> pa.Array:
    """A dense union's child laid out over every row (sparse layout)."""
    child = dense.field(code)
    picks = [o if t == code else None for t, o in
             zip(dense.type_codes.to_pylist(), dense.offsets.to_pylist(), strict=True)]
    return child.take(pa.array(picks, pa.int32()))


# -- compatible input types ---------------------------------------------------------------------


def one(schema: Any, column: pa.Array, name: str = "x") -> list[bytes]:
    record = {"type": "record", "name": "R", "fields": [{"name": name, "type": schema}]}
    return encode(pa.RecordBatch.from_arrays([column], names=[name]), record).to_pylist()


def expected(schema: Any, values: list[Any]) -> list[bytes]:
    record = {"type": "record", "name": "R", "fields": [{"name": "x", "type": schema}]}
    return fastavro_bytes(record, [{"x": v} for v in values])


@pytest.mark.parametrize(
    ("avro", "column", "values"),
    [
        ("int", pa.array([1, -2, 3], pa.int8()), [1, -2, 3]),
        ("int", pa.array([1, 2**31 - 1], pa.int64()), [1, 2**31 - 1]),
        ("int", pa.array([7], pa.uint32()), [7]),
        ("long", pa.array([1, 2**40], pa.uint64()), [1, 2**40]),
        ("double", pa.array([1.5], pa.float32()), [1.5]),
        ("float", pa.array([2], pa.int16()), [2.0]),
        ("string", pa.array(["a", "é"], pa.large_string()), ["a", "é"]),
        ("string", pa.array(["a", "b"], pa.string_view()), ["a", "b"]),
        ("string", pa.array(["p", "q", "p"]).dictionary_encode(), ["p", "q", "p"]),
        ("bytes", pa.array([b"\x00\xff"], pa.large_binary()), [b"\x00\xff"]),
        ("bytes", pa.array(["ab"]), [b"ab"]),
        (
            {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]},
            pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int8()), pa.array(["C", "A"])),
            ["C", "A", "C"],
        ),
        ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, pa.array(["B", "A"]), ["B", "A"]),
        (
            {"type": "enum", "name": "E", "symbols": ["A", "B"]},
            pa.array(["B"], pa.large_string()),
            ["B"],
        ),
        ({"type": "fixed", "name": "F", "size": 2}, pa.array([b"ab", b"cd"]), [b"ab", b"cd"]),
        (
            {"type": "long", "logicalType": "timestamp-millis"},
            pa.array([1_000_000, 2_000_000], pa.timestamp("us", tz="UTC")),
            [1000, 2000],
        ),
        (
            {"type": "long", "logicalType": "timestamp-micros"},
            pa.array([5], pa.timestamp("s", tz="Asia/Tokyo")),  # the instant: 5 s after epoch
            [5_000_000],
        ),
        (
            {"type": "long", "logicalType": "timestamp-micros"},
            pa.array([5], pa.timestamp("us")),  # naive = UTC
            [5],
        ),
        (
            {"type": "long", "logicalType": "local-timestamp-millis"},
            pa.array([0], pa.timestamp("ms", tz="Europe/Paris")),  # wall time 01:00
            [3_600_000],
        ),
        ({"type": "int", "logicalType": "date"}, pa.array([86_400_000 * 3], pa.date64()), [3]),
        (
            {"type": "int", "logicalType": "time-millis"},
            pa.array([2], pa.time32("s")),
            [2000],
        ),
        (
            {"type": "long", "logicalType": "time-micros"},
            pa.array([3000], pa.time64("ns")),
            [3],
        ),
        (
            {"type": "string", "logicalType": "uuid"},
            pa.array(["0123ABCD-0000-4000-8000-00000000000F"]),
            ["0123abcd-0000-4000-8000-00000000000f"],
        ),
        (
            {"type": "string", "logicalType": "uuid"},
            pa.array([uuid.UUID(int=5).bytes], pa.binary(16)),
            [str(uuid.UUID(int=5))],
        ),
        (
            {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            pa.array([decimal.Decimal("1.5"), decimal.Decimal("-128")], pa.decimal128(20, 1)),
            [decimal.Decimal("1.50"), decimal.Decimal("-128.00")],
        ),
        (
            {"type": "fixed", "name": "D", "size": 20, "logicalType": "decimal", "precision": 40,
             "scale": 0},
            pa.array([decimal.Decimal(-(10**39))], pa.decimal256(40, 0)),
            [decimal.Decimal(-(10**39))],
        ),
        (["null", "string", "int"], pa.array(["a", None]), ["a", None]),
        (["null", "string", "int"], pa.array([5, None], pa.int64()), [5, None]),
        (["string", "long"], pa.array([5], pa.int64()), [5]),
        ({"type": "array", "items": "int"}, pa.array([[1], None, [2, 3]],
                                                      pa.large_list(pa.int16())), None),
        ({"type": "array", "items": "long"}, pa.array([[1, 2]], pa.list_(pa.int64(), 2)),
         [[1, 2]]),
        ({"type": "map", "values": "int"}, pa.array([[("a", 1)]], pa.map_(pa.large_string(),
                                                                            pa.int8())),
         [{"a": 1}]),
    ],
)
def test_compatible_input_types(avro: Any, column: pa.Array, values: list[Any] | None) -> None:
    if values is None:  # a null list in a non-nullable array field: checked in the error tests
        return
    assert one(avro, column) == expected(avro, values)


def test_decimal_bytes_are_minimal_twos_complement() -> None:
    schema = {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 0}
    column = pa.array([decimal.Decimal(v) for v in (0, 127, 128, -1, -128, -129)],
                      pa.decimal128(5, 0))
    lengths = [d[0] >> 1 for d in one(schema, column)]
    assert lengths == [1, 1, 2, 1, 1, 2]


def test_duration_fixed() -> None:
    schema = {"type": "fixed", "name": "D", "size": 12, "logicalType": "duration"}
    column = pa.array([pa.MonthDayNano([1, 2, 3_000_000])], pa.month_day_nano_interval())
    assert one(schema, column) == [b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"]


def test_top_level_non_record_schema() -> None:
    batch = pa.RecordBatch.from_arrays([pa.array([1, None, 3], pa.int64())], names=["value"])
    out = encode(batch, ["null", "long"])
    assert out.to_pylist() == [b"\x02\x02", b"\x00", b"\x02\x06"]


def test_extra_columns_are_ignored_and_order_does_not_matter() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"},
                                                        {"name": "b", "type": "string"}]}
    batch = pa.RecordBatch.from_pydict({"b": ["x"], "zzz": [1.5], "a": pa.array([1], pa.int32())})
    assert encode(batch, schema).to_pylist() == fastavro_bytes(schema, [{"a": 1, "b": "x"}])


def test_empty_inputs() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    empty = pa.table({"a": pa.array([], pa.int32())})
    out = encode(empty, schema)
    assert isinstance(out, pa.BinaryArray) and len(out) == 0
    assert len(encode(empty.to_batches()[0] if empty.num_rows else
                      pa.RecordBatch.from_pydict({"a": pa.array([], pa.int32())}), schema)) == 0


def test_native_encoder_releases_the_gil_and_uses_threads(users: Any) -> None:
    """Another Python thread runs while a large batch encodes (the GIL is released)."""
    import threading

    batch, _ = users
    big = pa.Table.from_batches([batch] * 20)
    ticks = 0
    done = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    if not NATIVE:
        pytest.skip("the native encoder is not built")
    t = threading.Thread(target=tick)
    t.start()
    try:
        encode(big, USER, threads=1)
    finally:
        done.set()
        t.join()
    assert ticks > 1000


# -- errors -------------------------------------------------------------------------------------

REC = {"type": "record", "name": "R", "fields": [
    {"name": "i", "type": "int"},
    {"name": "s", "type": "string"},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    {"name": "f", "type": {"type": "fixed", "name": "F", "size": 2}},
    {"name": "r", "type": {"type": "record", "name": "In", "fields": [
        {"name": "l", "type": {"type": "array", "items": "int"}}]}},
]}  # fmt: skip


def rec_batch(**override: pa.Array) -> pa.RecordBatch:
    columns = {
        "i": pa.array([1, 2, 3], pa.int64()),
        "s": pa.array(["a", "b", "c"]),
        "e": pa.array(["A", "B", "A"]),
        "f": pa.array([b"ab", b"cd", b"ef"], pa.binary(2)),
        "r": pa.array([{"l": [1]}, {"l": [2]}, {"l": [3, 4]}],
                      pa.struct([("l", pa.list_(pa.int64()))])),
    }  # fmt: skip
    columns.update(override)
    return pa.RecordBatch.from_pydict(columns)


BAD = [
    ({"i": pa.array([1, 2**31, 3], pa.int64())}, r"row 1, column 'i': 2147483648 is out of"),
    ({"s": pa.array(["a", "b", None])}, r"row 2, column 's': null in a non-nullable field"),
    ({"e": pa.array(["A", "C", "A"])}, r"row 1, column 'e': 'C' is not a symbol of enum E"),
    (
        {"e": pa.DictionaryArray.from_arrays(pa.array([0, 0, 1]), pa.array(["A", "Z"]))},
        r"row 2, column 'e': 'Z' is not a symbol of enum E",
    ),
    ({"f": pa.array([b"ab", b"c", b"de"])}, r"row 1, column 'f': a value is not 2 bytes long"),
    (
        {"r": pa.array([{"l": [1]}, {"l": [2, 2**40]}, {"l": []}],
                       pa.struct([("l", pa.list_(pa.int64()))]))},
        r"row 1, column 'r\.l\[\]': 1099511627776 is out of the range of Avro int",
    ),
    (
        {"r": pa.array([{"l": [1]}, {"l": None}, {"l": []}],
                       pa.struct([("l", pa.list_(pa.int64()))]))},
        r"row 1, column 'r\.l': null in a non-nullable field",
    ),
    ({"i": pa.array(["1", "2", "3"])}, r"column 'i': Arrow type string cannot be encoded as "
                                       r"Avro int"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "message"), BAD)
def test_values_that_do_not_fit(
    override: dict[str, pa.Array], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = rec_batch(**override)
    with pytest.raises(AvroEncodeError, match=message) as native:
        encode(batch, REC)
    assert isinstance(native.value, ArrowstashError) and isinstance(native.value, ValueError)
    with pytest.raises(AvroEncodeError, match=message) as python:
        python_encode(batch, REC, monkeypatch)
    assert str(python.value) == str(native.value)


def test_errors_name_the_row_of_the_whole_table() -> None:
    batch = rec_batch()
    bad = rec_batch(s=pa.array(["a", None, "c"]))
    table = pa.Table.from_batches([batch, batch, bad])
    with pytest.raises(AvroEncodeError, match=r"row 7, column 's'"):
        encode(table, REC)


@pytest.mark.parametrize(
    ("avro", "column", "message"),
    [
        (
            {"type": "bytes", "logicalType": "decimal", "precision": 3, "scale": 0},
            pa.array([decimal.Decimal(5), decimal.Decimal(12345)], pa.decimal128(10, 0)),
            r"row 1, column 'x': Decimal value does not fit in precision 3",
        ),
        (
            {"type": "fixed", "name": "D", "size": 1, "logicalType": "decimal", "precision": 2,
             "scale": 0},
            pa.array([decimal.Decimal(99), decimal.Decimal(-99)], pa.decimal128(2, 0)),
            None,
        ),
        (
            {"type": "fixed", "name": "D", "size": 2, "logicalType": "decimal", "precision": 4,
             "scale": 0},
            # Arrow does not check a decimal's precision when buffers are assembled by hand
            pa.Array.from_buffers(pa.decimal128(4, 0), 2, [None, pa.py_buffer(
                (9999).to_bytes(16, "little") + (10**37).to_bytes(16, "little"))]),
            r"row 1, column 'x': decimal unscaled value 10{37} does not fit the 2 bytes of D",
        ),
        (
            {"type": "string", "logicalType": "uuid"},
            pa.array(["0123abcd-0000-4000-8000-00000000000f", "not-a-uuid"]),
            r"row 1, column 'x': 'not-a-uuid' is not a UUID",
        ),
        (
            {"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"},
            pa.array([pa.MonthDayNano([1, 1, 1_000_000]), pa.MonthDayNano([1, 1, 5])],
                     pa.month_day_nano_interval()),
            r"row 1, column 'x': duration \(1 months, 1 days, 5 ns\) has no Avro form",
        ),
        (
            {"type": "long", "logicalType": "timestamp-millis"},
            pa.array([1_000_000, 1_000_001], pa.timestamp("us", tz="UTC")),
            r"row 1, column 'x': Casting from timestamp.* would lose data: 1000001",
        ),
        (
            {"type": "array", "items": "int"},
            pa.array([[1], None], pa.large_list(pa.int16())),
            r"row 1, column 'x': null in a non-nullable field",
        ),
        (
            ["string", "int"],
            pa.array(["a", None]),
            r"row 1, column 'x': null in a non-nullable field",
        ),
        ("int", pa.nulls(2), r"column 'x': a column of nulls"),
        ("long", pa.array([1.5]), r"column 'x': Arrow type double cannot be encoded as Avro long"),
    ],
)
def test_type_and_range_errors(
    avro: Any, column: pa.Array, message: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if message is None:  # fits: -99 and 99 both fit one byte
        assert len(one(avro, column)) == 2
        return
    with pytest.raises(AvroEncodeError, match=message) as native:
        one(avro, column)
    with monkeypatch.context() as m:
        m.setenv("ARROWSTASH_AVRO_NATIVE", "0")
        with pytest.raises(AvroEncodeError) as python:
            one(avro, column)
    assert str(python.value) == str(native.value)


def test_missing_column_and_bad_inputs() -> None:
    with pytest.raises(AvroEncodeError, match=r"column 'i': no column 'i'"):
        encode(pa.RecordBatch.from_pydict({"s": ["a"]}), REC)
    with pytest.raises(TypeError, match=r"RecordBatch or pyarrow\.Table"):
        encode([{"i": 1}], REC)
    with pytest.raises(ValueError, match="threads must be a positive int or None, not 0"):
        encode(rec_batch(), REC, threads=0)


def test_local_timestamps_from_a_zone_are_wall_time() -> None:
    column = pa.array([dt.datetime(2024, 7, 1, 12, tzinfo=dt.timezone.utc)],
                      pa.timestamp("us", tz="America/New_York"))
    schema = {"type": "long", "logicalType": "local-timestamp-micros"}
    wall = dt.datetime(2024, 7, 1, 8)  # 12:00 UTC is 08:00 in New York in July
    assert one(schema, column) == expected(schema, [wall])


def test_null_parent_hides_its_children() -> None:
    """Values under a null record are not visited: a null there is no error."""
    schema = ["null", {"type": "record", "name": "P", "fields": [{"name": "a", "type": "int"}]}]
    column = to_arrow(parse_schema(schema).root, [None, {"a": 1}])
    assert one(schema, column) == expected(schema, [None, {"a": 1}])


def test_plans_are_compiled_once_per_schema_and_input_type() -> None:
    schema = parse_schema({"type": "record", "name": "C", "fields": [{"name": "a", "type": "int"}]})
    batch = pa.RecordBatch.from_pydict({"a": pa.array([1, 2], pa.int32())})
    encode(batch, schema)
    before = encoder_module._compiled.cache_info()
    assert encode(batch.slice(1), schema).to_pylist() == [b"\x04"]
    other = pa.RecordBatch.from_pydict({"a": pa.array([5], pa.int64())})
    assert encode(other, schema).to_pylist() == [b"\x0a"]  # another input type: compiled
    assert encode(batch, schema).to_pylist() == [b"\x02", b"\x04"]
    after = encoder_module._compiled.cache_info()
    assert after.misses == before.misses + 1


def test_strings_of_every_length_around_the_copy_fast_paths() -> None:
    """Strings up to 32 and 63 bytes are copied in fixed 32-byte moves when the input and the
    output have the room; lengths across those bounds, at the very end of the data buffer
    and after nulls, give fastavro's bytes."""
    schema = {"type": "record", "name": "S", "fields": [
        {"name": "s", "type": "string"}, {"name": "n", "type": ["null", "string"]}]}
    records = [{"s": "é" * (k % 3) + "x" * k, "n": None if k % 4 == 0 else "y" * (140 - k)}
               for k in range(141)]
    expected = fastavro_bytes(schema, records)
    batch = to_batch(parse_schema(schema), records)
    for start in (0, 60, 100, 130, 140):  # slices end where the strings' data ends
        for stop in (start + 1, 141):
            assert encode(batch.slice(start, stop - start), schema).to_pylist() == (
                expected[start:stop])


def test_strings_and_varints_inside_arrays_and_maps() -> None:
    """Arrays and maps of leaves have code of their own in the native encoder (one reservation
    per array, keys and values interleaved, up to 4 entries without a branch on their count):
    0 to 6 entries, strings across the copy bounds and longs of every varint width, also beyond
    the 8-byte word the encoder writes them as, give fastavro's bytes."""
    schema = {"type": "record", "name": "C", "fields": [
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "ints", "type": {"type": "array", "items": "int"}},
        {"name": "names", "type": {"type": "map", "values": "string"}},
        {"name": "x", "type": "long"}, {"name": "y", "type": ["null", "int"]}]}
    longs = [s * (2**k + d) for k in range(63) for d in (-1, 0, 1) for s in (1, -1)]
    longs = [v for v in longs if -(2**63) <= v < 2**63] + [2**63 - 1, -(2**63)]
    ints = [v for v in longs if -(2**31) <= v < 2**31]
    records = [{
        "tags": ["t" * ((k * 7 + j) % 140) for j in range(k % 7)],
        "counts": {"k" * (k % 70) + str(j): longs[(k + j) % len(longs)] for j in range(k % 6)},
        "ints": [ints[(k + j) % len(ints)] for j in range(k % 7)],
        "names": {str(j): "v" * ((k + 31 * j) % 100) for j in range(k % 6)},
        "x": longs[k % len(longs)], "y": None if k % 5 == 0 else ints[k % len(ints)],
    } for k in range(len(longs) + 20)]
    expected = fastavro_bytes(schema, records)
    batch = to_batch(parse_schema(schema), records)
    assert encode(batch, schema).to_pylist() == expected
    assert encode(batch.slice(7, 200), schema).to_pylist() == expected[7:207]


@needs_native
def test_the_output_grows_at_row_starts_long_strings_arrays_and_maps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The native encoder checks the room left at the start of a row and at each string of 64
    bytes or more, array and map (which reserve their own bytes). From a scratch of one byte
    (per thread), it grows at each of those places, keeping the bytes written so far."""
    fields = [{"name": "b", "type": "boolean"}, {"name": "s", "type": "string"},
              {"name": "l", "type": {"type": "array", "items": "string"}},
              {"name": "m", "type": {"type": "map", "values": "string"}}]
    schema = {"type": "record", "name": "G", "fields": fields}
    records = [{"b": i % 3 == 0, "s": "s" * (i % 300), "l": ["l" * (i % 90)] * (i % 3),
                "m": {"k": "m" * (i % 130)}} for i in range(6000)]
    expected = fastavro_bytes(schema, records)
    batch = to_batch(parse_schema(schema), records)
    monkeypatch.setattr(encoder_module, "_scratch_guess", lambda arrays, rows: 1)
    for threads in (1, 2, 3):
        assert encode(batch, schema, threads=threads).to_pylist() == expected
    for start in range(0, 60, 7):  # each row's encoding starts from a one-byte scratch
        assert encode(batch.slice(start, 1), schema).to_pylist() == expected[start : start + 1]


@needs_native
def test_native_output_memory_is_reused_once_released(users: Any) -> None:
    """The native encoder writes into memory of its own and takes it back when Arrow releases
    the output: a later call writes into the same pages (no page faults), never into an array
    still alive."""
    batch, expected = users
    first = encode(batch, USER, threads=1)
    address = first.buffers()[2].address
    second = encode(batch, USER, threads=1)
    assert second.buffers()[2].address != address
    assert first.to_pylist() == second.to_pylist() == expected
    del first
    third = encode(batch, USER, threads=1)
    assert third.buffers()[2].address == address
    assert third.to_pylist() == expected


@needs_native
def test_an_output_too_large_to_be_kept_is_trimmed_to_its_size() -> None:
    """Over 64 MiB the output is not kept for reuse, and its scratch's unused end goes back to
    the system: the datums are unchanged by that."""
    schema = {"type": "record", "name": "T", "fields": [{"name": "s", "type": "string"}]}
    text = pa.array([f"{i:07d}" * 150 for i in range(70_000)])  # 1,050 bytes each
    batch = pa.RecordBatch.from_arrays([text], names=["s"])
    out = encode(batch, schema, threads=2)
    assert out.buffers()[2].size == 70_000 * (2 + 1050) > 64 << 20
    for i in (0, 34_999, 35_000, 69_999):
        assert out[i].as_py() == b"\xb4\x10" + text[i].as_py().encode()


@needs_native
def test_with_threads_the_earliest_bad_row_is_reported() -> None:
    """Each thread stops at the first bad value of its rows: whichever thread meets which bad
    value first, the error names the earliest bad row; good rows give the same bytes at any
    thread count."""
    schema = {"type": "record", "name": "E", "fields": [
        {"name": "i", "type": "int"}, {"name": "s", "type": ["null", "string"]}]}
    n = 30_000
    ints = pa.array(range(n), pa.int64())
    good = pa.RecordBatch.from_arrays([ints, pa.array([str(i) for i in range(n)])], ["i", "s"])
    one = encode(good, schema, threads=1)
    for threads in (2, 3, 4):
        assert encode(good, schema, threads=threads).equals(one)
    for bad_rows in ([29_999, 9_000], [5_000, 20_000, 29_000], [100, 29_999], [12_287]):
        values = ints.to_pylist()
        for row in bad_rows:
            values[row] = 2**40
        bad = good.set_column(0, "i", pa.array(values, pa.int64()))
        for threads in (1, 2, 3):
            with pytest.raises(AvroEncodeError, match=rf"^row {min(bad_rows)}, column 'i'"):
                encode(bad, schema, threads=threads)


def test_threads_whose_scratch_outgrows_its_guess() -> None:
    """Booleans take a bit in Arrow and a byte in Avro: the threads' scratch buffers outgrow the
    size guessed from the input, move to their own memory, and every part is then copied into
    one output (each thread copying an equal slice, across the parts' bounds)."""
    fields = [{"name": f"b{k}", "type": "boolean"} for k in range(64)]
    schema = {"type": "record", "name": "Flags", "fields": fields}
    records = [{f"b{k}": (i * 7 + k) % 3 == 0 for k in range(64)} for i in range(9000)]
    batch = pa.RecordBatch.from_pylist(records)
    expected = fastavro_bytes(schema, records[:50])
    one = encode(batch, schema, threads=1)
    for threads in (2, 3):
        many = encode(batch, schema, threads=threads)
        assert many.equals(one)
    assert one.to_pylist()[:50] == expected


def test_nulls_over_bytes_of_their_own_in_nullable_leaves() -> None:
    """Arrow lets a null slot of a string column span bytes (and a null number hold any value):
    the native encoder writes a nullable leaf's value whether it is null or not and keeps it
    only for a value, so those bytes, 0 to 100 of them and at the end of the data, must not
    leak into the output."""
    schema = {"type": "record", "name": "N", "fields": [
        {"name": "s", "type": ["null", "string"]}, {"name": "t", "type": ["string", "null"]},
        {"name": "i", "type": ["null", "int"]}, {"name": "d", "type": ["null", "double"]}]}
    texts = ["z" * (k * 37 % 101) for k in range(40)]
    nulls = [k % 3 != 1 for k in range(40)]
    data = "".join(texts).encode()
    offsets = pa.array([sum(map(len, texts[:k])) for k in range(41)], pa.int32())
    validity = pa.array([not n for n in nulls]).buffers()[1]
    strings = pa.Array.from_buffers(
        pa.string(), 40, [validity, offsets.buffers()[1], pa.py_buffer(data)], null_count=-1)
    ints = pa.Array.from_buffers(
        pa.int32(), 40, [validity, pa.array(range(-20, 20), pa.int32()).buffers()[1]],
        null_count=-1)
    doubles = pa.Array.from_buffers(
        pa.float64(), 40, [validity, pa.array([k / 7 for k in range(40)]).buffers()[1]],
        null_count=-1)
    batch = pa.RecordBatch.from_arrays([strings, strings, ints, doubles], ["s", "t", "i", "d"])
    records = [{"s": None if n else t, "t": None if n else t, "i": None if n else k - 20,
                "d": None if n else k / 7}
               for k, (t, n) in enumerate(zip(texts, nulls, strict=True))]
    expected = fastavro_bytes(schema, records)
    for start in (0, 1, 39):
        assert encode(batch.slice(start), schema).to_pylist() == expected[start:]


def test_the_scratch_guess_is_the_rows_size_even_for_a_slice_of_a_large_table() -> None:
    """The guess sums the buffers (cheap in pyarrow), which a slice shares with its whole
    table: past 64 MiB it takes the rows' exact size instead."""
    strings = pa.array(["x" * 1000] * 100_000)  # 100 MB of string data
    batch = pa.record_batch({"s": strings, "n": pa.array(range(100_000), pa.int64())})
    small = batch.slice(500, 10)
    guess = encoder_module._scratch_guess([small], 10)
    assert guess < 64 * 1024, guess  # 10 rows of ~1 KB, not the table's 100 MB
    assert encoder_module._scratch_guess([batch], 100_000) >= batch.nbytes
    whole = pa.record_batch({"s": pa.array(["ab"] * 1000)})
    assert encoder_module._scratch_guess([whole], 1000) >= whole.nbytes
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "n", "type": "long"}]}
    assert decode(encode(small, schema), schema).to_pylist() == small.to_pylist()


def test_a_record_plan_keeps_its_checked_fields_and_checks_other_types_again() -> None:
    """The struct of normalised columns is built with the fields of the last type that passed
    the layout check; columns of another type fall back to the check, never to a wrong layout."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "e", "type": {
            "type": "enum", "name": "E", "symbols": ["A", "B"]}}, {"name": "n", "type": "long"}]}
    batch = pa.record_batch({"s": ["x", "y"], "e": ["B", "A"],
                             "n": pa.array([1, 2], pa.int8())})  # int8 for a long: normalised
    out = encode(batch, schema)
    plan = encoder_module._plan_for(parse_schema(schema), batch.schema)
    assert plan.fields is not None
    kept = [f.type for f in plan.fields]
    plan.fields = [pa.field(f.name, pa.int8()) for f in plan.fields]  # another type's fields
    assert encode(batch, schema).equals(out)
    assert [f.type for f in plan.fields] == kept
    assert decode(out, schema).to_pylist() == [{"s": "x", "e": "B", "n": 1},
                                               {"s": "y", "e": "A", "n": 2}]
