"""Interoperability: container files written by other Avro implementations (../shared/avro)
read like fastavro reads them, broken ones are refused, and fastavro and arrowstash read each
other's files over hypothesis-generated schemas and records."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from _avro_arrow import read_back
from _shared import SHARED_AVRO
from arrowstash.avro import parse_schema
from arrowstash.avro.framing import ids_of, strip_header
from arrowstash.avro.ocf import header_of, read_ocf, write_ocf
from arrowstash.errors import AvroDecodeError, AvroSchemaError

fastavro = pytest.importorskip("fastavro")

SHARED = SHARED_AVRO
FILES = sorted(p for p in SHARED.glob("*/*.avro")) if SHARED.is_dir() else []

#: Deliberately broken files: reading must fail with AvroDecodeError, not crash or misread.
BROKEN = {
    "apache-avro/lang__c__tests__avro-1238-truncated.avro": "ends inside",
    "apache-avro/lang__c__tests__avro-1237-bad-union-discriminant.avro": "union",
}
#: Codecs whose fastavro reader needs a package this environment may lack.
FASTAVRO_CODEC_PACKAGES = {"zstandard": "backports.zstd (or Python >= 3.14)",
                           "snappy": "cramjam", "xz": "lzma", "bzip2": "bz2"}


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _norm(value: Any) -> Any:
    """One spelling for values both readers give in different Python types."""
    if isinstance(value, pa.MonthDayNano):  # fastavro leaves duration as its 12 bytes
        months, days, nanos = value
        return b"".join(int(x).to_bytes(4, "little") for x in (months, days, nanos // 10**6))
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if type(value).__name__ == "Timestamp":  # pandas, for nanoseconds: fastavro gives the int
        return value.value
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc)
    if isinstance(value, float) and value != value:
        return "NaN"
    return value


def _fastavro_records(path: Path) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        return list(fastavro.reader(f))


@pytest.mark.skipif(not FILES, reason=f"no sample files at {SHARED}")
@pytest.mark.parametrize("path", FILES, ids=_name)
def test_sample_files_read_like_fastavro_reads_them(path: Path) -> None:
    name = _name(path)
    if name in BROKEN:
        with pytest.raises(AvroDecodeError, match=BROKEN[name]):
            read_ocf(path)
        return
    if path.read_bytes()[:4] == b"Obj\x00":
        with pytest.raises(AvroDecodeError, match="version 0"):
            read_ocf(path)
        return
    try:
        table = read_ocf(path)
    except ImportError as exc:  # a codec whose package is not installed here
        pytest.skip(f"{name}: {exc}")
    assert table.schema == parse_schema(header_of(path).schema_json).arrow_schema
    assert_like_fastavro(table, path)


def assert_like_fastavro(table: pa.Table, path: Path) -> None:
    codec = header_of(path).codec
    try:
        expected = _fastavro_records(path)
    except UnicodeDecodeError:  # fastavro decodes metadata values as text; Avro's are bytes
        assert _name(path) == "apache-avro/share__test__data__syncInMeta.avro"
        assert table.num_rows == 6001  # what the Apache Avro test expects of this file
        return
    except ValueError as exc:
        if "install" in str(exc):
            pytest.skip(f"fastavro cannot read codec {codec} here: needs "
                        f"{FASTAVRO_CODEC_PACKAGES.get(codec, codec)}")
        raise
    assert table.num_rows == len(expected)
    ours = read_back(table)  # as to_pylist, with recursive values decoded
    if table.column_names == ["value"] and not isinstance(expected[:1] and expected[0], dict):
        ours = [row["value"] for row in ours]
    assert _norm(ours) == _norm(expected)


@pytest.mark.skipif(not (SHARED / "arrow-rs").is_dir(), reason=f"no sample files at {SHARED}")
def test_gzipped_varint_regression_file(tmp_path: Path) -> None:
    """arrow-rs keeps this file for a bug of its own reader; the file itself is valid."""
    path = tmp_path / "bad-varint-bug.avro"
    path.write_bytes(gzip.decompress((SHARED / "arrow-rs" / "bad-varint-bug.avro.gz").read_bytes()))
    table = read_ocf(path)
    assert table.to_pylist() == [{"int_array": [1, 2]}]
    assert_like_fastavro(table, path)


@pytest.mark.skipif(not (SHARED / "apache-avro").is_dir(), reason=f"no sample files at {SHARED}")
def test_the_weather_files_hold_weather_json() -> None:
    expected = [json.loads(line) for line in
                (SHARED / "apache-avro" / "share__test__data__weather.json").read_text()
                .splitlines() if line.strip()]
    for codec in ("", "-deflate", "-snappy", "-zstd"):
        path = SHARED / "apache-avro" / f"share__test__data__weather{codec}.avro"
        assert read_ocf(path).to_pylist() == expected, codec


@pytest.mark.skipif(not (SHARED / "apache-avro").is_dir(), reason=f"no sample files at {SHARED}")
def test_the_spec_single_object_message() -> None:
    folder = SHARED / "apache-avro"
    schema = parse_schema((folder / "share__test__data__messageV1__test_schema.avsc").read_text())
    message = (folder / "share__test__data__messageV1__test_message.bin").read_bytes()
    fingerprint = int.from_bytes(schema.fingerprint, "little")
    assert ids_of([message], "single-object").to_pylist() == [fingerprint]
    payload = strip_header([message], "single-object", expect=schema).payloads
    from arrowstash.avro.decoder import decode

    expected = fastavro.schemaless_reader(io.BytesIO(payload[0].as_py()),
                                          fastavro.parse_schema(json.loads(schema.json)))
    ours = decode(payload, schema).to_pylist(maps_as_pydicts="strict")
    assert _norm(ours) == _norm([expected])


# -- both directions over generated schemas -------------------------------------------------------

strategies = pytest.importorskip("_avro_strategies")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(["null", "deflate", "snappy", "bzip2", "xz"]))
def test_fastavro_and_arrowstash_read_each_others_files(data: st.DataObject, codec: str) -> None:
    schema_json = data.draw(strategies.avro_schemas())
    schema = parse_schema(schema_json)
    try:
        assert schema.arrow_schema is not None
    except AvroSchemaError:
        return
    records = data.draw(st.lists(strategies.values_for(schema.root), max_size=30))
    parsed = fastavro.parse_schema(json.loads(schema.json))
    theirs = io.BytesIO()
    try:  # fastavro tries union branches in turn; some raise instead of declining a value
        fastavro.writer(theirs, parsed, records, codec=codec, sync_interval=64)
    except (ValueError, TypeError):
        assume(False)
    table = read_ocf(theirs.getvalue())
    ours = io.BytesIO()
    write_ocf(table, ours, schema, codec=codec, block_bytes=128)
    back = list(fastavro.reader(io.BytesIO(ours.getvalue())))
    assert _norm(back) == _norm(list(fastavro.reader(io.BytesIO(theirs.getvalue()))))
    assert read_ocf(ours.getvalue()).equals(table)


def test_timestamps_read_by_fastavro_as_the_same_instants(tmp_path: Path) -> None:
    table = pa.table({"at": pa.array([dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)],
                                     pa.timestamp("us", tz="UTC"))})
    write_ocf(table, tmp_path / "t.avro", codec="null")
    assert _fastavro_records(tmp_path / "t.avro") == [{"at": table.column(0)[0].as_py()}]
