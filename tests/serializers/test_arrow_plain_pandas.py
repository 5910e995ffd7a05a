"""Plain pandas frames (string labels, a RangeIndex, NumPy and Arrow-convertible extension
columns) take the direct path: exact, writable, private, and chosen only where it applies."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandas.testing as tm
import pyarrow as pa
import pytest

from arrowstash import FileBackend, MemoryBackend, cache
from arrowstash.entry.format import Key, entry_bytes, parse_entry
from arrowstash.serializers.arrow import ArrowSerializer

KEY = Key("tests", "arrow_plain", bytes(16))


def plain_frame(n: int = 12) -> pd.DataFrame:
    k = np.arange(n)
    when = pd.to_datetime(k, unit="D").to_numpy().copy()
    when[1:2] = np.datetime64("NaT")
    return pd.DataFrame({
        "i64": k * 3,
        "i8": (k % 100).astype(np.int8),
        "u32": k.astype(np.uint32),
        "f64": np.where(k % 3 == 0, np.nan, k / 7),
        "f32": (k / 3).astype(np.float32),
        "flag": k % 2 == 0,
        "when": when,
        "took": pd.to_timedelta(k, unit="s").to_numpy(),
        "s": pd.array([None if j % 5 == 0 else f"v{j % 4}" for j in range(n)], dtype="str"),
        "nullable": pd.array([None if j % 4 == 0 else j for j in range(n)], dtype="Int64"),
        "maybe": pd.array([None if j % 3 == 0 else j % 2 == 0 for j in range(n)],
                          dtype="boolean"),
        "money": pd.array([None if j == 2 else j / 4 for j in range(n)], dtype="Float64"),
        "arrow": pd.array(list(k), dtype="int32[pyarrow]"),
    }, index=pd.RangeIndex(5, 5 + 2 * n, 2, name="row"))


def _entry(value: Any, codec: str | None) -> Any:
    serializer = ArrowSerializer(compression=codec)
    return parse_entry(bytes(entry_bytes(KEY, serializer.encode(value), created=time.time(),
                                         expires=None)))


@pytest.mark.parametrize("codec", [None, "zstd"])
@pytest.mark.parametrize("rows", [12, 0, 60_000])
def test_plain_frames_round_trip_exactly_through_the_plan(codec: str | None, rows: int) -> None:
    original = plain_frame(rows)
    entry = _entry(original, codec)
    assert "plain" in entry.meta
    result = ArrowSerializer().decode(entry.meta, entry.sections)
    tm.assert_frame_equal(result, original, check_exact=True)
    assert list(result.dtypes) == list(original.dtypes)
    assert result.index.equals(original.index) and result.index.name == "row"


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("codec", [None, "zstd"])
def test_plain_hits_are_writable_and_private(tmp_path: Path, codec: str | None,
                                             mmap: bool) -> None:
    original = plain_frame(50_000)
    backend = FileBackend(Path(tempfile.mkdtemp(dir=tmp_path)),
                          mmap_threshold=64 if mmap else 1 << 40)

    @cache(backend=backend, l1=False, serializer=ArrowSerializer(compression=codec))
    def produce() -> pd.DataFrame:
        return original

    produce()
    first = produce()
    for name in original.columns:
        first.loc[first.index[0], name] = original[name].iloc[3]
    second = produce()
    tm.assert_frame_equal(second, original, check_exact=True)
    assert first["i64"].iloc[0] == original["i64"].iloc[3]


def test_read_only_bytes_are_copied_not_viewed() -> None:
    """From a backend handing back immutable bytes, numbers are copied: still writable."""
    original = plain_frame(1000)

    @cache(backend=MemoryBackend(), l1=False, serializer=ArrowSerializer(compression=None))
    def produce() -> pd.DataFrame:
        return original

    produce()
    hit = produce()
    hit.loc[5, "f64"] = -1.0
    tm.assert_frame_equal(produce(), original, check_exact=True)


@pytest.mark.parametrize("frame", [
    pd.DataFrame({"a": [1, 2]}, index=pd.Index([3, 4])),                 # not a RangeIndex
    pd.DataFrame({1: [1, 2], "b": [3, 4]}),                               # a label not str
    pd.DataFrame({"a": pd.Categorical(["x", "y"])}),                      # no __from_arrow__
    pd.DataFrame({"a": pd.to_datetime([1, 2]).tz_localize("UTC")}),       # tz-aware
    pd.DataFrame({"a": pd.Series(["x", "y"], dtype=object)}),             # object
    pd.DataFrame({"a": [1, 2]}).rename_axis(columns="names"),             # named columns
    pd.DataFrame({"a": [1, 2]}, index=pd.RangeIndex(2, name=7)),          # index name not str
    pd.DataFrame(index=pd.RangeIndex(3)),                                 # no columns
], ids=["index", "label", "categorical", "tz", "object", "columns-name", "index-name", "empty"])
def test_other_frames_take_the_general_path(frame: pd.DataFrame) -> None:
    entry = _entry(frame, None)
    assert "plain" not in entry.meta
    tm.assert_frame_equal(ArrowSerializer().decode(entry.meta, entry.sections), frame,
                          check_exact=True)


def test_plain_frames_as_arrow_and_polars() -> None:
    original = plain_frame(20)
    entry = _entry(original, None)
    table = ArrowSerializer(return_format="arrow").decode(entry.meta, entry.sections)
    assert table.column_names == list(original.columns)
    assert table.column("i64").to_pylist() == original["i64"].tolist()
    assert table.schema.field("s").type == pa.large_string()
    frame = ArrowSerializer(return_format="polars").decode(entry.meta, entry.sections)
    assert frame["u32"].to_list() == original["u32"].tolist()
