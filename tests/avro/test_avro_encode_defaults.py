"""Encoding a table that lacks a field with a default writes the default, as the specification's
defaults are read: the JSON value per the field's schema (a union's in its first branch that
takes it). Checked against fastavro's writer (which fills defaults too) and reader."""

from __future__ import annotations

import datetime as dt
import decimal
import importlib.util
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from arrowstash.avro import encode, read_ocf, write_ocf
from arrowstash.errors import AvroEncodeError, AvroSchemaError

fastavro = pytest.importorskip("fastavro")

ENCODERS = ["python", pytest.param("native", marks=pytest.mark.skipif(
    importlib.util.find_spec("arrowstash.avro._native._cencode") is None,
    reason="the native encoder is not built"))]

SCHEMA = {"type": "record", "name": "Row", "namespace": "test", "fields": [
    {"name": "id", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "label", "type": ["string", "null"], "default": "none"},
    {"name": "grade", "type": {"type": "enum", "name": "Grade", "symbols": ["A", "B", "C"]},
     "default": "B"},
    {"name": "ints", "type": {"type": "array", "items": "int"}, "default": [1, -2]},
    {"name": "weights", "type": {"type": "map", "values": "double"}, "default": {"x": 1.5}},
    {"name": "raw", "type": "bytes", "default": "\u00ff\u0000A"},
    {"name": "tag", "type": {"type": "fixed", "name": "Tag", "size": 2}, "default": "ok"},
    {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
        {"name": "x", "type": "int"}, {"name": "y", "type": "string", "default": "why"}]},
     "default": {"x": 3}},
    {"name": "either", "type": ["int", "string"], "default": 7},
    {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-millis"},
     "default": 1000},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6,
                               "scale": 2}, "default": "\u0001\u0000"},
    {"name": "flag", "type": "boolean", "default": True},
    {"name": "ratio", "type": "float", "default": 0.25},
    {"name": "pair", "type": {"type": "record", "name": "Pair", "fields": [
        {"name": "k", "type": "int"}, {"name": "v", "type": "double", "default": 2.5},
        {"name": "w", "type": ["null", "long"], "default": None}]}},
]}


@pytest.fixture(params=ENCODERS)
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ARROWSTASH_AVRO_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


def _fastavro_bytes(records: list[dict[str, Any]]) -> list[bytes]:
    parsed = fastavro.parse_schema(SCHEMA)
    out = []
    for record in records:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)  # fills missing fields' defaults
        out.append(buffer.getvalue())
    return out


def _read(datums: list[bytes]) -> list[dict[str, Any]]:
    parsed = fastavro.parse_schema(SCHEMA)
    return [fastavro.schemaless_reader(io.BytesIO(d), parsed) for d in datums]


TABLE = pa.table({
    "id": pa.array([1, 2, 3], pa.int64()),
    "pair": pa.array([{"k": 1}, None, {"k": 3}], pa.struct([("k", pa.int32())])),
})


def test_missing_fields_are_encoded_as_their_defaults(encoder: str) -> None:
    pairs = [{"k": 1}, {"k": 0}, {"k": 3}]  # fastavro writes a null struct's fields as 0s...
    datums = encode(TABLE.set_column(1, "pair", pa.array(pairs, TABLE.schema.field(1).type)),
                    SCHEMA).to_pylist()
    # fastavro's writer takes bytes defaults only as bytes, so those three are given to it
    given = {"raw": b"\xff\x00A", "tag": b"ok", "price": decimal.Decimal("2.56")}
    assert datums == _fastavro_bytes([{"id": i + 1, "pair": p, **given}
                                      for i, p in enumerate(pairs)])
    first = _read(datums)[0]
    assert first == {
        "id": 1, "note": None, "label": "none", "grade": "B", "ints": [1, -2],
        "weights": {"x": 1.5}, "raw": b"\xff\x00A", "tag": b"ok", "inner": {"x": 3, "y": "why"},
        "either": 7, "seen": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc),
        "price": first["price"], "flag": True, "ratio": 0.25, "pair": {"k": 1, "v": 2.5, "w": None},
    }
    assert str(first["price"]) == "2.56"  # 0x0100 = 256 hundredths


def test_both_encoders_write_the_same_defaults() -> None:
    outs = []
    for native in ("1", "0"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ARROWSTASH_AVRO_NATIVE", native)
            outs.append(encode(TABLE.slice(0, 1), SCHEMA).to_pylist())
    assert outs[0] == outs[1]


def test_a_container_file_gets_the_defaults(tmp_path: Path, encoder: str) -> None:
    path = tmp_path / "rows.avro"
    write_ocf(TABLE.select(["id"]).append_column(
        "pair", pa.array([{"k": 5}] * 3, pa.struct([("k", pa.int32())]))), path, SCHEMA,
        codec="deflate")
    with open(path, "rb") as f:
        rows = list(fastavro.reader(f))
    assert [r["grade"] for r in rows] == ["B"] * 3 and rows[2]["pair"] == {"k": 5, "v": 2.5,
                                                                          "w": None}
    assert read_ocf(path).column("label").to_pylist() == ["none"] * 3


def test_a_field_without_default_still_needs_its_column(encoder: str) -> None:
    with pytest.raises(AvroEncodeError, match=r"column 'id': no column 'id' for the field of "
                                              r"type long, which has no default"):
        encode(TABLE.select(["pair"]), SCHEMA)
    only_v = pa.struct([("v", pa.float64())])
    lacking = pa.table({"id": [1], "pair": pa.array([{"v": 1.0}], only_v)})
    with pytest.raises(AvroEncodeError, match=r"pair\.k.*struct has no field 'k'.*no default"):
        encode(lacking, SCHEMA)


def test_a_default_that_does_not_fit_its_type_is_named(encoder: str) -> None:
    # refused when the schema is parsed, before any column is looked at
    bad = {"type": "record", "name": "Bad", "fields": [
        {"name": "id", "type": "long"}, {"name": "n", "type": "int", "default": "seven"}]}
    with pytest.raises(AvroSchemaError, match=r"Bad>\.n: bad default for int: expected an "
                                              r"integer, got \"seven\""):
        encode(pa.table({"id": [1]}), bad)
