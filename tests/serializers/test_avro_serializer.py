"""AvroSerializer under @cache on the File backend and a real Redis: round trips of frames and
records, payloads another Avro library reads, refusals, and corrupt entries as misses."""

from __future__ import annotations

import datetime as dt
import decimal
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from arrowstash import AvroSerializer, Backend, FileBackend, SerializationError, cache
from arrowstash.avro import parse_schema
from arrowstash.avro.ocf import read_ocf
from arrowstash.entry.format import parse_entry
from arrowstash.errors import CorruptEntryError
from arrowstash.serializers import resolve

fastavro = pytest.importorskip("fastavro")
pd = pytest.importorskip("pandas")
pl = pytest.importorskip("polars")

SCHEMA = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                                   "scale": 2}},
        {"name": "status", "type": {"type": "enum", "name": "Status",
                                    "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "extras", "type": {"type": "map", "values": "long"}},
    ],
}
UTC = dt.timezone.utc
RECORDS = [
    {"id": i, "item": f"item-{i}", "price": decimal.Decimal(i * 101).scaleb(-2),
     "status": ["NEW", "PAID", "SHIPPED"][i % 3],
     "at": dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(minutes=i),
     "note": None if i % 2 else f"n{i}", "extras": {"k": i} if i % 3 else {}}
    for i in range(50)
]


def _frame() -> Any:
    return pd.DataFrame({
        "station": ["a", "b", None, "d"],
        "temp": [1.5, None, 3.0, -2.25],
        "count": pd.array([1, 2, 3, 4], dtype="int64"),
        "when": pd.to_datetime(["2024-01-01 10:00", "2024-01-02 00:00", "2024-01-03 00:00",
                                "2024-01-04 00:00"]).tz_localize("Europe/Paris"),
    })


def _section(backend: Backend, key: Any) -> bytes:
    """The entry's one section as stored: a whole Object Container File."""
    stored = backend.get(key)
    assert stored is not None
    entry = parse_entry(stored.data)
    assert entry.serializer == "avro"
    return bytes(entry.sections[0])


@pytest.fixture(params=["file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "file":
        return FileBackend(tmp_path / "cache")
    made: Backend = request.getfixturevalue("redis_backend")
    return made


def test_records_with_a_schema_round_trip_and_fastavro_reads_the_payload(store: Backend) -> None:
    calls = []

    @cache(backend=store, serializer=AvroSerializer(SCHEMA), l1=False)
    def orders(n: int) -> list[dict[str, Any]]:
        calls.append(n)
        return RECORDS[:n]

    assert orders(50) == RECORDS
    assert orders(50) == RECORDS  # a hit, decoded from Avro
    assert calls == [50]
    assert orders.cache_info().hits == 1
    payload = _section(store, orders.cache_key(50))
    assert payload[:4] == b"Obj\x01"
    reader = fastavro.reader(io.BytesIO(payload))
    assert reader.writer_schema["name"] == "shop.Order"
    assert list(reader) == RECORDS


@pytest.mark.parametrize("codec", ["null", "deflate", "zstd"])
def test_pandas_frames_come_back_equal(store: Backend, codec: str) -> None:
    @cache(backend=store, serializer=AvroSerializer(codec=codec), l1=False)
    def frame() -> Any:
        return _frame()

    first = frame()
    hit = frame()
    assert frame.cache_info().hits == 1
    pd.testing.assert_frame_equal(hit, first, check_dtype=False)
    assert str(hit["when"].dt.tz) == "Europe/Paris"  # the zone is restored; Avro stores UTC
    assert hit["count"].dtype == "int64"
    payload = _section(store, frame.cache_key())
    if codec == "zstd":  # fastavro's zstd needs backports.zstd before Python 3.14
        assert read_ocf(payload).column("station").to_pylist() == ["a", "b", None, "d"]
    else:
        assert [r["station"] for r in fastavro.reader(io.BytesIO(payload))] == \
            ["a", "b", None, "d"]


def test_polars_and_arrow_and_conversions(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "c")
    df = pl.DataFrame({"a": [1, 2, 3], "b": ["x", None, "z"], "c": [[1], [], [2, 3]]})

    @cache(backend=backend, serializer=AvroSerializer(), l1=False)
    def polars_frame() -> Any:
        return df

    polars_frame()
    assert polars_frame().equals(df)
    table = pa.table({"a": pa.array([1, 2], pa.int64())})

    @cache(backend=backend, serializer=AvroSerializer(return_format="records"), l1=False)
    def arrow_table() -> Any:
        return table

    arrow_table()
    assert arrow_table() == [{"a": 1}, {"a": 2}]

    @cache(backend=backend, serializer=AvroSerializer(SCHEMA, return_format="arrow"), l1=False)
    def as_arrow() -> Any:
        return RECORDS[:3]

    as_arrow()
    got = as_arrow()
    assert isinstance(got, pa.Table)
    assert got.schema == parse_schema(SCHEMA).arrow_schema
    assert got.column("status").to_pylist() == ["NEW", "PAID", "SHIPPED"]


def test_the_registered_name_decodes_entries_of_an_instance(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "c")

    @cache(backend=backend, serializer=AvroSerializer(SCHEMA), l1=False)
    def orders() -> list[dict[str, Any]]:
        return RECORDS[:5]

    orders()
    stored = backend.get(orders.cache_key())
    assert stored is not None
    entry = parse_entry(stored.data)
    by_name = resolve("avro")  # what a decorator with serializer="avro" (or "auto") uses
    assert isinstance(by_name, AvroSerializer)
    assert by_name.decode(entry.meta, entry.sections) == RECORDS[:5]


def test_values_avro_cannot_hold_are_refused() -> None:
    serializer = AvroSerializer()
    with pytest.raises(SerializationError, match="not dict"):
        serializer.encode({"a": 1})
    with pytest.raises(SerializationError, match="index"):
        serializer.encode(pd.DataFrame({"a": [1]}, index=["r"]))
    with pytest.raises(SerializationError, match="uint64"):
        serializer.encode(pa.table({"u": pa.array([1], pa.uint64())}))
    with pytest.raises(SerializationError, match="records do not fit"):
        AvroSerializer(SCHEMA).encode([{"id": "not a number"}])
    with pytest.raises(ValueError, match="return_format"):
        AvroSerializer(return_format="json")
    with pytest.raises(ValueError, match="codec"):
        AvroSerializer(codec="lz4")


def test_unstorable_values_are_returned_uncached(tmp_path: Path) -> None:
    @cache(backend=FileBackend(tmp_path / "c"), serializer=AvroSerializer(), l1=False)
    def bad() -> Any:
        return {"not": "a frame"}

    assert bad() == {"not": "a frame"}
    assert bad() == {"not": "a frame"}
    assert bad.cache_info().hits == 0


def test_a_corrupt_payload_is_a_corrupt_entry() -> None:
    serializer = AvroSerializer()
    encoded = serializer.encode(pa.table({"a": [1, 2, 3]}))
    payload = bytearray(bytes(encoded.sections[0]))
    payload[-1] ^= 0xFF  # the last sync marker
    with pytest.raises(CorruptEntryError, match="unreadable Avro container"):
        serializer.decode(encoded.meta, [memoryview(payload)])
