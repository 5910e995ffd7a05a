"""Edges where the specification leaves room or an earlier release got it wrong, each as
docs/avro.md states it: a reader record without fields keeps the row count, a float64 past
float's range is refused, duplicate map keys are kept, a timestamp read in another unit keeps
its number, decimals past 76 digits are binary. Both decoders and encoders."""

from __future__ import annotations

import io
import re
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from arrowstash import AvroEncodeError
from arrowstash.avro import decode, encode, parse_schema, read_ocf

WRITER = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
NO_FIELDS = {"type": "record", "name": "R", "fields": []}


@pytest.fixture(params=["native", "python"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setenv("ARROWSTASH_AVRO_NATIVE", "0")
    return str(request.param)


def test_a_reader_record_without_fields_keeps_one_row_per_message(impl: str) -> None:
    batch = decode([b"\x02", b"\x04", b"\x06"], WRITER, reader_schema=NO_FIELDS)
    assert batch.num_rows == 3 and batch.num_columns == 0
    assert batch.to_pylist() == [{}, {}, {}]


def test_a_container_file_read_without_columns_keeps_its_rows(impl: str) -> None:
    buf = io.BytesIO()
    fastavro.writer(buf, WRITER, [{"a": 1}, {"a": 2}, {"a": 3}])
    for kwargs in ({"columns": []}, {"reader_schema": NO_FIELDS}):
        buf.seek(0)
        table = read_ocf(buf, **kwargs)  # type: ignore[arg-type]
        assert (table.num_rows, table.num_columns) == (3, 0)


FLOAT = {"type": "record", "name": "R", "fields": [{"name": "f", "type": ["null", "float"]}]}


@pytest.mark.parametrize("big", [1e300, -3.5e38])
def test_a_float64_past_floats_range_is_refused_with_its_row(impl: str, big: float) -> None:
    table = pa.table({"f": pa.array([1.5, None, big])})
    message = rf"row 2, column 'f': {re.escape(repr(big))} is out of the range of Avro float"
    with pytest.raises(AvroEncodeError, match=message):
        encode(table, FLOAT)


def test_infinities_and_nan_stay_and_the_largest_float_rounds(impl: str) -> None:
    values = [float("inf"), float("-inf"), 3.4028235e38, 0.1]
    out = encode(pa.table({"f": pa.array(values)}), FLOAT).to_pylist()
    back = decode(out, FLOAT).column("f").to_pylist()
    assert back[:2] == values[:2]
    assert back[2] == 3.4028234663852886e38  # float's largest, not an infinity
    assert back[3] == pytest.approx(0.1, rel=1e-7)
    nan = decode(encode(pa.table({"f": [float("nan")]}), FLOAT), FLOAT).column("f")[0]
    assert nan.as_py() != nan.as_py()


MAP = {"type": "record", "name": "R", "fields": [
    {"name": "m", "type": {"type": "map", "values": "int"}}]}


def test_duplicate_map_keys_are_kept_in_order(impl: str) -> None:
    message = b"\x04" + b"\x02a\x02" + b"\x02a\x04" + b"\x00"  # {"a": 1, "a": 2}
    batch = decode([message], MAP)
    assert batch.column("m").to_pylist() == [[("a", 1), ("a", 2)]]
    assert encode(batch, MAP).to_pylist() == [message]


def _ts(unit: str) -> dict[str, Any]:
    return {"type": "record", "name": "R", "fields": [
        {"name": "t", "type": {"type": "long", "logicalType": f"timestamp-{unit}"}}]}


def test_a_timestamp_read_in_another_unit_keeps_its_number(impl: str) -> None:
    """Resolution works on the underlying long (as the specification and Java's reader do):
    1,000 written as millis reads as 1,000 micros, not as the same instant."""
    batch = decode([b"\xd0\x0f"], _ts("millis"), reader_schema=_ts("micros"))
    assert batch.column("t").type == pa.timestamp("us", tz="UTC")
    assert batch.column("t").cast(pa.int64()).to_pylist() == [1000]


def test_decimals_past_76_digits_are_plain_binary() -> None:
    big = {"type": "bytes", "logicalType": "decimal", "precision": 77}
    assert parse_schema(big).arrow_schema.field(0).type == pa.binary()
    assert parse_schema({**big, "precision": 76}).arrow_schema.field(0).type == pa.decimal256(76)
