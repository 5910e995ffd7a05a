"""``@cache``: options, keys, layers, TTL, counters, methods, async, and failure handling."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import inspect
import logging
import os
import pathlib
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from arrowstash import (
    Backend,
    BackendError,
    CachedFunction,
    FileBackend,
    Key,
    MemoryBackend,
    SerializationError,
    cache,
)
from arrowstash.entry.format import parse_entry

LOGGER = "arrowstash.cache"


class Counter:
    """Counts calls of the function body."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __len__(self) -> int:
        return len(self.calls)


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


# -- decoration ---------------------------------------------------------------------------------


def test_bare_decorator_and_with_arguments(file_backend: FileBackend) -> None:
    body = Counter()

    @cache
    def bare(x: int) -> int:
        body.calls.append(x)
        return x * 2

    @cache(backend=file_backend, ttl=60)
    def configured(x: int) -> int:
        body.calls.append(x)
        return x * 3

    assert isinstance(bare, CachedFunction)
    assert isinstance(configured, CachedFunction)
    assert [bare(2), bare(2), configured(2), configured(2)] == [4, 4, 6, 6]
    assert len(body) == 2


def test_wrapper_keeps_the_function_identity() -> None:
    def original(x: int, y: int = 1) -> int:
        """Doc."""
        return x + y

    cached = cache(backend=None)(original)
    assert cached.__wrapped__ is original
    assert cached.uncached is original
    assert cached.__name__ == "original"
    assert cached.__doc__ == "Doc."
    assert inspect.signature(cached) == inspect.signature(original)
    assert "original" in repr(cached)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"ttl": -1}, ValueError),
        ({"ttl": 0}, ValueError),
        ({"ttl": dt.timedelta(seconds=-5)}, ValueError),
        ({"ttl": "60"}, ValueError),
        ({"serializer": "no-such-serializer"}, ValueError),
        ({"serializer": object()}, TypeError),
        ({"namespace": ""}, ValueError),
        ({"lock_timeout": -1}, ValueError),
        ({"l1_max_entries": 0}, ValueError),
        ({"l1_max_bytes": 0}, ValueError),
        ({"ignore": ["nope"]}, ValueError),
        ({"ignore": "nope"}, ValueError),
        ({"no_such_option": 1}, TypeError),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else v.__name__,
)
def test_invalid_options_raise_at_decoration(options: dict[str, Any], error: type) -> None:
    def f(x: int) -> int:
        raise AssertionError("never called")

    with pytest.raises(error):
        cache(backend=None, **options)(f)


def test_ignore_naming_a_missing_parameter_says_which() -> None:
    with pytest.raises(ValueError, match="nope"):

        @cache(backend=None, ignore=["nope"])
        def f(x: int) -> int:
            return x


def test_decorating_a_non_function_is_refused() -> None:
    with pytest.raises(TypeError, match="function"):
        cache(backend=None)(42)


# -- default backend ----------------------------------------------------------------------------


def _entry_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.ast"))


def test_arrowstash_url_file_selects_the_default_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "from-env"
    monkeypatch.setenv("ARROWSTASH_URL", f"file://{folder}")

    @cache(l1=False)
    def f(x: int) -> list[int]:
        return [x]

    assert f(1) == [1]
    assert len(_entry_files(folder)) == 1
    assert f(1) == [1]
    assert f.cache_info().hits == 1


def test_arrowstash_url_bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "bare"
    monkeypatch.setenv("ARROWSTASH_URL", str(folder))

    @cache
    def f(x: int) -> int:
        return x

    f(1)
    assert len(_entry_files(folder)) == 1


def test_arrowstash_url_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWSTASH_URL", "memory://")
    body = Counter()

    @cache(l1=False)
    def f(x: int) -> list[int]:
        body.calls.append(x)
        return [x]

    assert "MemoryBackend" in repr(f)
    assert f(1) == f(1) == [1]
    assert len(body) == 1
    assert f.cache_info().hits == 1 and f.cache_info().l1_hits == 0
    assert _entry_files(Path(os.environ["XDG_CACHE_HOME"])) == []


def test_without_arrowstash_url_the_user_cache_folder_is_used() -> None:
    @cache
    def f(x: int) -> int:
        return x

    f(1)
    assert len(_entry_files(Path(os.environ["XDG_CACHE_HOME"]) / "arrowstash")) == 1


def test_unsupported_arrowstash_url_fails_at_decoration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWSTASH_URL", "bogus://somewhere")
    with pytest.raises(ValueError, match="bogus"):

        @cache
        def f(x: int) -> int:
            return x


def test_backend_none_is_l1_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWSTASH_URL", f"file://{tmp_path}/never")
    body = Counter()

    @cache(backend=None)
    def f(x: int) -> list[int]:
        body.calls.append(x)
        return [x]

    assert f(1) == f(1) == [1]
    assert len(body) == 1
    info = f.cache_info()
    assert (info.hits, info.l1_hits, info.misses, info.bytes_stored) == (1, 1, 1, 0)
    assert not (tmp_path / "never").exists()
    assert f.invalidate(1) is False  # no backend held it
    f(1)
    assert len(body) == 2  # ...but L1 forgot it


# -- keys ---------------------------------------------------------------------------------------


def test_positional_and_keyword_spellings_share_a_key() -> None:
    body = Counter()

    @cache(backend=None)
    def f(a: int, b: int, c: int = 3) -> int:
        body.calls.append((a, b, c))
        return a + b + c

    key = f.cache_key(1, 2)
    assert key == f.cache_key(1, b=2) == f.cache_key(a=1, b=2) == f.cache_key(b=2, a=1)
    assert key == f.cache_key(1, 2, 3) == f.cache_key(1, 2, c=3)  # defaults are applied
    assert key != f.cache_key(2, 1)
    assert f(1, 2) == f(1, b=2) == f(a=1, b=2) == 6
    assert len(body) == 1


def test_int_float_and_bool_are_different_keys() -> None:
    body = Counter()

    @cache(backend=None)
    def kind(x: Any) -> str:
        body.calls.append(x)
        return type(x).__name__

    assert len({kind.cache_key(1), kind.cache_key(1.0), kind.cache_key(True)}) == 3
    assert [kind(1), kind(1.0), kind(True), kind(1), kind(1.0), kind(True)] == [
        "int", "float", "bool", "int", "float", "bool"
    ]
    assert len(body) == 3


def test_var_keyword_order_does_not_matter() -> None:
    @cache(backend=None)
    def f(*args: int, **kwargs: int) -> int:
        return sum(args) + sum(kwargs.values())

    assert f.cache_key(x=1, y=2) == f.cache_key(y=2, x=1)
    assert f.cache_key(1, 2) != f.cache_key(2, 1)
    assert f.cache_key(1, x=2) != f.cache_key(1, y=2)


def test_ignore_leaves_a_parameter_out_of_the_key() -> None:
    body = Counter()

    @cache(backend=None, ignore=["verbose"])
    def f(x: int, verbose: bool = False) -> int:
        body.calls.append(x)
        return x

    assert f.cache_key(1) == f.cache_key(1, verbose=True) == f.cache_key(1, True)
    f(1)
    f(1, verbose=True)
    assert len(body) == 1

    @cache(backend=None, ignore="verbose")  # one name may be given as a string
    def g(x: int, verbose: bool = False) -> int:
        return x

    assert g.cache_key(1) == g.cache_key(1, verbose=True)
    assert g.cache_key(1) != g.cache_key(2)


def test_custom_key_function() -> None:
    body = Counter()

    @cache(backend=None, key=lambda user, request_id: user)
    def profile(user: str, request_id: int) -> str:
        body.calls.append(request_id)
        return user.upper()

    assert profile.cache_key("ann", 1) == profile.cache_key("ann", request_id=2)
    assert profile.cache_key("ann", 1) != profile.cache_key("bob", 1)
    assert profile("ann", 1) == profile("ann", 2) == "ANN"
    assert body.calls == [1]


def test_custom_key_returning_an_unsupported_value_names_key() -> None:
    @cache(backend=None, key=lambda x: threading.Lock())  # unpicklable: no content to hash
    def f(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="key="):
        f(1)


def test_unsupported_argument_type_names_the_parameter() -> None:
    body = Counter()

    @cache(backend=None)
    def f(x: int, payload: Any = None) -> int:
        body.calls.append(x)
        return x

    with pytest.raises(TypeError, match="'payload'"):
        f(1, payload=threading.Lock())  # unpicklable: no content to hash
    with pytest.raises(TypeError, match="'payload'"):
        f(1, [1, {"a": threading.Lock()}])
    assert body.calls == []  # refused before running the body


def test_namespace_and_version_are_part_of_the_key() -> None:
    def make(**options: Any) -> Any:
        @cache(backend=None, **options)
        def f(x: int) -> int:
            return x

        return f

    base = make().cache_key(1)
    assert base == make().cache_key(1)
    assert base != make(version=2).cache_key(1)
    assert make(version=2).cache_key(1) == make(version=2).cache_key(1)
    other = make(namespace="other").cache_key(1)
    assert other != base
    assert isinstance(base, Key)
    assert (base.namespace, other.namespace) == ("default", "other")
    assert base.function.endswith("make.<locals>.f")
    assert len(base.digest) == 16
    assert base.hex == base.digest.hex()


class Color(enum.Enum):
    RED = 1
    GREEN = 2


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


def test_documented_argument_kinds_are_keyed_by_value() -> None:
    import polars as pl
    import pyarrow as pa

    @cache(backend=None)
    def f(x: Any) -> int:
        return 0

    same = [
        ({1, 2, 3}, {3, 2, 1}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (Point(1, 2), Point(1, 2)),
        (Color.RED, Color(1)),
        (pathlib.Path("/a/b"), pathlib.Path("/a//b")),
        (pl.DataFrame({"a": [1, 2]}), pl.DataFrame({"a": [1, 2]})),
        (pa.table({"a": [1, 2, 3]}), pa.Table.from_batches(
            [pa.record_batch({"a": [1]}), pa.record_batch({"a": [2, 3]})]
        )),
        (pd.Series([1.5, 2.5], name="s"), pd.Series([1.5, 2.5], name="s")),
    ]
    for left, right in same:
        assert f.cache_key(left) == f.cache_key(right), left
    different = [
        Color.RED, Color.GREEN, 1, Point(1, 2), Point(2, 1), (1, 2), [1, 2], "/a/b",
        pathlib.Path("/a/b"), pathlib.PurePosixPath("/a/b"), int, float, Point,
        decimal.Decimal("1.0"), decimal.Decimal("1.00"), dt.date(2024, 1, 1),
        dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
        dt.timedelta(1), uuid.UUID(int=1), 1j, b"a", "a", None, {1},
        pl.DataFrame({"a": [1, 2]}), pl.DataFrame({"a": [1, 3]}), pl.Series("a", [1, 2]),
        pa.table({"a": [1, 2]}), pd.Series([1.5, 2.5], name="t"),
    ]
    keys = [f.cache_key(v) for v in different]
    assert len(set(keys)) == len(different)


def test_set_and_frozenset_bytes_and_bytearray_are_different_keys() -> None:
    """Keys tell set from frozenset and bytes from bytearray (as list from tuple): a shared tag
    would let an identity-like function return the other call's type from the cache."""

    @cache(backend=None)
    def same(x: Any) -> Any:
        return x

    assert type(same({1})) is set
    assert type(same(frozenset({1}))) is frozenset
    assert same.cache_key(b"a") != same.cache_key(bytearray(b"a"))


def test_numpy_array_arguments_are_hashed_by_content() -> None:
    body = Counter()

    @cache(backend=None)
    def total(a: Any) -> int:
        body.calls.append(1)
        return int(a.sum())

    a = np.arange(12, dtype=np.int64)
    key = total.cache_key(a)
    assert key == total.cache_key(a.copy())
    assert key == total.cache_key(np.arange(24, dtype=np.int64)[::2] // 2)  # strided view
    changed = a.copy()
    changed[7] = -1
    assert total.cache_key(changed) != key
    assert total.cache_key(a.astype(np.int32)) != key
    assert total.cache_key(a.reshape(3, 4)) != key
    assert total(a) == total(a.copy()) == 66
    assert len(body) == 1


def test_dataframe_arguments_are_hashed_by_content_not_layout() -> None:
    @cache(backend=None)
    def rows(df: Any) -> int:
        return len(df)

    from_2d = pd.DataFrame(np.arange(12, dtype=np.int64).reshape(4, 3), columns=["a", "b", "c"])
    by_column = pd.DataFrame(index=range(4))
    for position, name in enumerate(["a", "b", "c"]):
        by_column[name] = np.arange(12, dtype=np.int64).reshape(4, 3)[:, position].copy()
    pd.testing.assert_frame_equal(from_2d, by_column)
    assert from_2d._mgr.nblocks != by_column._mgr.nblocks  # really different layouts
    # by_column's labels are a 3-chunk Arrow string array: see
    # test_chunked_strings_hash_like_contiguous_ones

    key = rows.cache_key(from_2d)
    assert rows.cache_key(by_column) == key
    assert rows.cache_key(from_2d.copy()) == key
    changed = from_2d.copy()
    changed.iloc[2, 1] = 99
    assert rows.cache_key(changed) != key
    assert rows.cache_key(from_2d.rename(columns={"c": "d"})) != key
    assert rows.cache_key(from_2d.astype({"a": "int32"})) != key


def test_dataframe_block_layout_does_not_change_the_key() -> None:
    """The layout half of the test above, with labels built the same way on both sides."""

    @cache(backend=None)
    def rows(df: Any) -> int:
        return len(df)

    data = np.arange(12, dtype=np.float64).reshape(4, 3)
    one_block = pd.DataFrame(data, columns=["a", "b", "c"])
    three_blocks = pd.DataFrame(index=range(4))
    for position, name in enumerate(["a", "b", "c"]):
        three_blocks[name] = data[:, position].copy()
    three_blocks.columns = pd.Index(["a", "b", "c"])
    assert (one_block._mgr.nblocks, three_blocks._mgr.nblocks) == (1, 3)
    assert rows.cache_key(one_block) == rows.cache_key(three_blocks)
    assert rows.cache_key(one_block) == rows.cache_key(one_block.iloc[:, [0, 1, 2]])
    assert rows.cache_key(one_block) != rows.cache_key(one_block.iloc[:, [1, 0, 2]])


def test_chunked_strings_hash_like_contiguous_ones() -> None:
    """The same strings in other chunks give the same key (pandas 3 str columns and labels are
    often chunked: after pd.concat, or columns added one at a time)."""
    import pyarrow as pa

    @cache(backend=None)
    def f(x: Any) -> int:
        return 0

    assert f.cache_key(pa.chunked_array([[1, 2, 3]])) == f.cache_key(
        pa.chunked_array([[1], [2, 3]])
    )  # fixed-width types already are chunking-independent
    assert f.cache_key(pa.chunked_array([["a", "bc", None]])) == f.cache_key(
        pa.chunked_array([["a"], [], ["bc", None]])
    )
    joined = pd.concat([pd.Series(["x"]), pd.Series(["y", "z"])], ignore_index=True)
    pd.testing.assert_series_equal(joined, pd.Series(["x", "y", "z"]))
    assert f.cache_key(joined) == f.cache_key(pd.Series(["x", "y", "z"]))


# -- layers, copies and counters ----------------------------------------------------------------


@pytest.mark.parametrize("layer", ["l1", "backend"])
def test_hits_are_independent_copies(layer: str, backend: Backend) -> None:
    @cache(backend=None if layer == "l1" else backend, l1=layer == "l1")
    def f(x: int) -> dict[str, Any]:
        return {"items": [x, x + 1], "nested": {"k": [1]}}

    first = f(1)
    first["items"].append("mutated")
    first["nested"]["k"].clear()
    second = f(1)
    assert second == {"items": [1, 2], "nested": {"k": [1]}}
    second["items"].append("again")
    third = f(1)
    assert third == {"items": [1, 2], "nested": {"k": [1]}}
    assert third is not second
    info = f.cache_info()
    assert (info.hits, info.misses) == (2, 1)
    assert info.l1_hits == (2 if layer == "l1" else 0)


@pytest.mark.parametrize("where", ["l1", "file", "mapped"])
def test_frame_hits_are_independent_copies(where: str, tmp_path: Path) -> None:
    backend = {
        "l1": None,
        "file": FileBackend(tmp_path / "c"),
        "mapped": FileBackend(tmp_path / "c", mmap_threshold=64),
    }[where]

    @cache(backend=backend, l1=where == "l1")
    def frame(n: int) -> pd.DataFrame:
        return pd.DataFrame({"a": np.arange(n, dtype=np.int64), "s": [str(i) for i in range(n)]})

    expected = frame.uncached(5)
    first = frame(5)
    first.loc[0, "a"] = 100
    second = frame(5)
    pd.testing.assert_frame_equal(second, expected)
    second.loc[1, "a"] = 200
    pd.testing.assert_frame_equal(frame(5), expected)
    assert frame.cache_info().hits == 2


def test_cache_info_counters(file_backend: FileBackend) -> None:
    @cache(backend=file_backend)
    def f(x: int) -> list[int]:
        return [x] * 10

    assert f.cache_info().hits == f.cache_info().misses == 0
    f(1)
    f(2)
    f(1)
    f(1)
    info = f.cache_info()
    assert (info.hits, info.misses, info.l1_hits, info.errors) == (2, 2, 2, 0)
    assert info.l1_entries == 2
    sizes = [os.path.getsize(file_backend.path(f.cache_key(x))) for x in (1, 2)]
    assert info.bytes_stored == sum(sizes) > 0
    assert info.mean_hit_latency > 0 and info.mean_miss_latency > 0


def test_hits_from_the_backend_are_counted_apart_from_l1(memory_backend: MemoryBackend) -> None:
    @cache(backend=memory_backend)
    def f(x: int) -> list[int]:
        return [x]

    f(1)
    f._core.l1.clear()  # as if another process had stored it
    f(1)
    f(1)
    info = f.cache_info()
    assert (info.hits, info.l1_hits, info.misses) == (2, 1, 1)
    assert info.bytes_stored == memory_backend.stats()["bytes"]


def test_l1_max_entries_evicts_least_recently_used() -> None:
    body = Counter()

    @cache(backend=None, l1_max_entries=2)
    def f(x: int) -> list[int]:
        body.calls.append(x)
        return [x]

    f(1)
    f(2)
    f(1)  # 1 is now the most recently used
    f(3)  # evicts 2
    assert f.cache_info().l1_entries == 2
    assert body.calls == [1, 2, 3]
    f(1)
    f(3)
    assert body.calls == [1, 2, 3]
    f(2)
    assert body.calls == [1, 2, 3, 2]


def test_l1_max_bytes_bounds_mutable_values() -> None:
    @cache(backend=None, l1_max_bytes=120_000)
    def f(x: int) -> list[bytes]:
        return [bytes(50_000)]

    for x in range(5):
        f(x)
    assert 1 <= f.cache_info().l1_entries <= 2


def test_l1_max_bytes_bounds_large_immutable_values() -> None:
    """str/bytes (and tuples of scalars) are kept in L1 as themselves, and accounted at their
    real size so that l1_max_bytes bounds them."""

    @cache(backend=None, l1_max_bytes=120_000)
    def f(x: int) -> bytes:
        return bytes(50_000)

    for x in range(5):
        f(x)
    assert f.cache_info().l1_entries <= 2


@pytest.mark.parametrize("layer", ["l1", "file", "memory"])
def test_ttl_expiry(layer: str, tmp_path: Path) -> None:
    chosen = {"l1": None, "file": FileBackend(tmp_path / "c"), "memory": MemoryBackend()}[layer]
    l1 = layer == "l1"
    body = Counter()

    @cache(backend=chosen, l1=l1, ttl=0.2)
    def short(x: int) -> list[int]:
        body.calls.append(("short", x))
        return [x]

    @cache(backend=chosen, l1=l1, ttl=None)
    def forever(x: int) -> list[int]:
        body.calls.append(("forever", x))
        return [x]

    @cache(backend=chosen, l1=l1, ttl=dt.timedelta(minutes=5))
    def long(x: int) -> list[int]:
        body.calls.append(("long", x))
        return [x]

    for f in (short, forever, long):
        f(1)
        f(1)
    assert len(body) == 3
    time.sleep(0.3)
    for f in (short, forever, long):
        assert f(1) == [1]
    assert body.calls[3:] == [("short", 1)]
    assert short.cache_info().misses == 2
    if chosen is not None:
        entries = {e.function.rpartition(".")[2]: e for e in chosen.entries()}
        assert entries["forever"].expires == 0.0
        assert entries["long"].expires == pytest.approx(entries["long"].created + 300)


def test_expired_entry_is_not_served_from_the_file_with_l1_on(file_backend: FileBackend) -> None:
    body = Counter()

    @cache(backend=file_backend, ttl=0.2)
    def f(x: int) -> list[int]:
        body.calls.append(x)
        return [x]

    f(1)
    f._core.l1.clear()
    f(1)  # from the file, put back into L1 with the entry's own expiry
    assert len(body) == 1
    time.sleep(0.3)
    f(1)
    assert len(body) == 2


def test_none_results_are_cached(backend: Backend) -> None:
    body = Counter()

    @cache(backend=backend, l1=False)
    def from_backend(x: int) -> None:
        body.calls.append(x)

    @cache(backend=None)
    def from_l1(x: int) -> None:
        body.calls.append(x)

    for f in (from_backend, from_l1):
        assert f(1) is None
        assert f(1) is None
    assert len(body) == 2
    assert from_backend.cache_info().hits == from_l1.cache_info().hits == 1


def test_exceptions_propagate_unchanged_and_are_not_cached(file_backend: FileBackend) -> None:
    raised: list[Exception] = []

    @cache(backend=file_backend)
    def f(x: int) -> int:
        exc = ValueError(f"boom {len(raised)}")
        raised.append(exc)
        raise exc

    for _ in range(2):
        with pytest.raises(ValueError) as excinfo:
            f(1)
        assert excinfo.value is raised[-1]
    assert len(raised) == 2
    assert f.cache_info().errors == 0
    assert _entry_files(file_backend.directory) == []


def test_unserializable_result_is_returned_not_stored_and_logged_once(
    file_backend: FileBackend, caplog: pytest.LogCaptureFixture
) -> None:
    body = Counter()

    @cache(backend=file_backend)
    def f(x: int) -> Any:
        body.calls.append(x)
        return threading.Lock()  # neither plain nor picklable

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = f(1)
        second = f(1)
        f(2)
    assert type(first) is type(threading.Lock()) and first is not second
    assert len(body) == 3
    assert f.cache_info().errors == 3
    assert _entry_files(file_backend.directory) == []
    assert len(_warnings(caplog, "not cached")) == 1


def test_strict_raises_unserializable_results(file_backend: FileBackend) -> None:
    @cache(backend=file_backend, strict=True, serializer="standard")
    def f(x: int) -> Any:
        return {"rows": [1, object()]}

    with pytest.raises(SerializationError, match=r"value\['rows'\]\[1\]"):
        f(1)


def _break_folder(backend: FileBackend) -> None:
    """Make every path under the backend's folder unusable (a regular file takes its place)."""
    shutil.rmtree(backend.directory)
    backend.directory.write_text("not a folder")


@pytest.mark.parametrize("lock", [False, True], ids=["no-lock", "lock"])
def test_backend_failure_is_a_logged_miss(
    lock: bool, file_backend: FileBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """With lock=True too: a lock file that cannot be taken (NotADirectoryError here;
    PermissionError on a read-only folder) is a logged backend failure, not an error of the call."""
    body = Counter()

    @cache(backend=file_backend, l1=False, lock=lock)
    def f(x: int) -> list[int]:
        body.calls.append(x)
        return [x]

    _break_folder(file_backend)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert f(1) == [1]
        assert f(1) == [1]
    assert len(body) == 2
    assert f.cache_info().errors > 0
    assert _warnings(caplog, "failed")


def test_strict_raises_backend_failures(file_backend: FileBackend) -> None:
    @cache(backend=file_backend, strict=True)
    def f(x: int) -> list[int]:
        return [x]

    _break_folder(file_backend)
    with pytest.raises(BackendError):
        f(1)


def _corrupt(path: str, how: str) -> None:
    data = Path(path).read_bytes()
    if how == "garbage":
        Path(path).write_bytes(b"this is not an arrowstash entry at all" * 5)
    elif how == "truncated":
        Path(path).write_bytes(data[: len(data) // 2])
    elif how == "empty":
        Path(path).write_bytes(b"")
    elif how == "flipped":
        damaged = bytearray(data)
        damaged[64 + 3] ^= 0xFF  # inside the first section
        Path(path).write_bytes(bytes(damaged))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["garbage", "truncated", "empty", "flipped"])
def test_corrupt_entry_is_a_logged_miss_and_gets_rewritten(
    how: str, file_backend: FileBackend, caplog: pytest.LogCaptureFixture
) -> None:
    body = Counter()

    @cache(backend=file_backend, l1=False)
    def f(x: int) -> dict[str, int]:
        body.calls.append(x)
        return {"x": x}

    assert f(1) == {"x": 1}
    path = file_backend.path(f.cache_key(1))
    _corrupt(path, how)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert f(1) == {"x": 1}
    assert len(body) == 2
    assert _warnings(caplog, "unreadable cache entry")
    assert f.cache_info().errors >= 1
    entry = parse_entry(Path(path).read_bytes())  # rewritten with a valid entry
    assert entry.key == f.cache_key(1)
    assert f(1) == {"x": 1}
    assert len(body) == 2


def test_one_corrupt_entry_is_reported_once(
    file_backend: FileBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """A miss may look at the entry up to three times (before the in-process flight lock, under
    it, and under the cross-process lock); one corrupt file is logged and counted once."""

    @cache(backend=file_backend, l1=False)
    def f(x: int) -> int:
        return x

    f(1)
    _corrupt(file_backend.path(f.cache_key(1)), "garbage")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        f(1)
    assert len(_warnings(caplog, "unreadable cache entry")) == 1
    assert f.cache_info().errors == 1


def test_entry_of_another_key_is_not_served(file_backend: FileBackend) -> None:
    """A file copied under another key's name (a bug or a tampered folder) is a miss."""

    @cache(backend=file_backend, l1=False)
    def f(x: int) -> int:
        return x * 10

    f(1)
    f(2)
    shutil.copyfile(file_backend.path(f.cache_key(1)), file_backend.path(f.cache_key(2)))
    assert f(2) == 20


# -- managing entries ---------------------------------------------------------------------------


def test_cache_clear_only_clears_this_function(backend: Backend) -> None:
    body = Counter()

    @cache(backend=backend, l1=False)
    def f(x: int) -> int:
        body.calls.append(("f", x))
        return x

    @cache(backend=backend, l1=False)
    def g(x: int) -> int:
        body.calls.append(("g", x))
        return x

    f(1)
    f(2)
    g(1)
    # Memcached hides a cleared function's entries behind a generation and cannot count them,
    # nor list entries (documented in backends/memcached.py)
    memcached = not backend.capabilities.lists_entries
    assert f.cache_clear() == (0 if memcached else 2)
    g(1)
    assert body.calls == [("f", 1), ("f", 2), ("g", 1)]
    f(1)
    assert body.calls[-1] == ("f", 1)
    assert {e.function.rpartition(".")[2] for e in backend.entries()} == (
        set() if memcached else {"f", "g"})


def test_cache_clear_clears_l1_too() -> None:
    body = Counter()

    @cache(backend=None)
    def f(x: int) -> int:
        body.calls.append(x)
        return x

    f(1)
    assert f.cache_clear() == 0
    assert f.cache_info().l1_entries == 0
    f(1)
    assert len(body) == 2


def test_cache_clear_clears_every_version(file_backend: FileBackend) -> None:
    def make(version: int) -> Any:
        @cache(backend=file_backend, version=version, l1=False)
        def f(x: int) -> int:
            return x

        return f

    v1, v2 = make(1), make(2)
    v1(1)
    v2(1)
    assert v1.cache_clear() == 2
    assert file_backend.stats()["entries"] == 0


def test_invalidate_refresh_and_uncached(backend: Backend) -> None:
    state = {"n": 0}

    @cache(backend=backend)
    def f(x: int) -> list[int]:
        state["n"] += 1
        return [x, state["n"]]

    assert f(1) == [1, 1]
    assert f(1) == [1, 1]
    assert f.invalidate(1) is True
    assert f.invalidate(1) is False
    assert f(1) == [1, 2]
    assert f.refresh(1) == [1, 3]
    assert f(1) == [1, 3]  # the refreshed value is what hits return now
    f._core.l1.clear()
    assert f(1) == [1, 3]  # ...from the backend too
    assert f.uncached(1) == [1, 4]
    assert f(1) == [1, 3]  # uncached calls store nothing
    assert f.invalidate(99) is False


# -- methods ------------------------------------------------------------------------------------


def test_method_on_a_dataclass_instance() -> None:
    body = Counter()

    @dataclasses.dataclass
    class Model:
        scale: int
        name: str = "m"

        @cache(backend=None)
        def predict(self, x: int) -> int:
            body.calls.append((self.scale, x))
            return self.scale * x

    a, same, other = Model(2), Model(2), Model(3)
    assert a.predict(5) == a.predict(5) == 10
    assert same.predict(5) == 10  # an equal instance (same fields) shares the entry
    assert other.predict(5) == 15
    assert Model(2, name="n").predict(5) == 10  # every field is part of the key
    assert body.calls == [(2, 5), (3, 5), (2, 5)]
    assert a.predict.cache_key(5) == Model.predict.cache_key(a, 5) == same.predict.cache_key(5)
    assert a.predict.cache_key(5) != other.predict.cache_key(5)
    assert Model.predict.cache_info().misses == 3
    a.predict.refresh(5)
    assert body.calls[-1] == (2, 5) and len(body) == 4


def test_method_on_a_class_with_cache_key() -> None:
    class Account:
        def __init__(self, account_id: int) -> None:
            self.account_id = account_id
            self.noise = object()  # not a key-able value, but __cache_key__ decides
            self.calls = 0

        def __cache_key__(self) -> Any:
            return ("account", self.account_id)

        @cache(backend=None)
        def balance(self, currency: str) -> str:
            self.calls += 1
            return f"{self.account_id}:{currency}"

    first, second = Account(7), Account(7)
    assert first.balance("EUR") == second.balance("EUR") == "7:EUR"
    assert (first.calls, second.calls) == (1, 0)
    assert Account(8).balance("EUR") == "8:EUR"
    assert first.balance.cache_key("EUR") == second.balance.cache_key("EUR")
    assert first.balance.invalidate("EUR") is False  # L1 only
    second.balance("EUR")
    assert second.calls == 1


def test_method_on_a_plain_object_names_self() -> None:
    class Plain:
        @cache(backend=None)
        def method(self, x: int) -> int:
            return x

    with pytest.raises(TypeError, match="'self'"):
        Plain().method(1)


def _tools() -> tuple[type, type, Counter]:
    body = Counter()

    class Tools:
        @cache(backend=None)
        @staticmethod
        def static_outer(x: int) -> int:
            body.calls.append(("static_outer", x))
            return x + 1

        @staticmethod
        @cache(backend=None)
        def static_inner(x: int) -> int:
            body.calls.append(("static_inner", x))
            return x + 1

        @cache(backend=None)
        @classmethod
        def class_outer(cls, x: int) -> str:
            body.calls.append(("class_outer", x))
            return f"{cls.__name__}{x}"

        @classmethod
        @cache(backend=None)
        def class_inner(cls, x: int) -> str:
            body.calls.append(("class_inner", x))
            return f"{cls.__name__}{x}"

    class MoreTools(Tools):
        pass

    return Tools, MoreTools, body


@pytest.mark.parametrize("name", ["static_outer", "static_inner"])
def test_staticmethod_in_both_orders(name: str) -> None:
    tools, _, body = _tools()
    assert getattr(tools, name)(1) == getattr(tools(), name)(1) == 2
    assert getattr(tools, name)(2) == 3
    assert body.calls == [(name, 1), (name, 2)]
    assert getattr(tools, name).cache_info().l1_hits == 1
    assert getattr(tools, name).cache_key(1) == getattr(tools(), name).cache_key(1)


@pytest.mark.parametrize("name", ["class_outer", "class_inner"])
def test_classmethod_in_both_orders(name: str) -> None:
    tools, more_tools, body = _tools()
    assert getattr(tools, name)(1) == "Tools1"
    assert getattr(tools(), name)(1) == "Tools1"
    assert body.calls == [(name, 1)]
    assert getattr(more_tools, name)(1) == "MoreTools1"  # the class is part of the key
    assert body.calls == [(name, 1), (name, 1)]
    assert getattr(tools, name).cache_key(1) != getattr(more_tools, name).cache_key(1)
    assert getattr(tools, name).cache_info().hits == 1


# -- async --------------------------------------------------------------------------------------


def test_async_function(file_backend: FileBackend) -> None:
    body = Counter()

    @cache(backend=file_backend)
    async def fetch(x: int) -> list[int]:
        body.calls.append(x)
        await asyncio.sleep(0)
        return [x]

    assert inspect.iscoroutinefunction(fetch) and asyncio.iscoroutinefunction(fetch)
    assert not inspect.iscoroutinefunction(cache(backend=None)(lambda: 1))
    assert inspect.signature(fetch) == inspect.signature(fetch.uncached)

    async def main() -> None:
        assert await fetch(1) == [1]
        assert await fetch(1) == [1]
        fetch._core.l1.clear()
        assert await fetch(1) == [1]  # from the file
        assert await fetch.refresh(1) == [1]
        assert fetch.invalidate(1) is True
        assert await fetch(1) == [1]

    asyncio.run(main())
    assert body.calls == [1, 1, 1]
    info = fetch.cache_info()
    assert (info.hits, info.l1_hits, info.misses) == (2, 1, 2)


def test_async_concurrent_calls_run_the_body_once(memory_backend: MemoryBackend) -> None:
    body = Counter()

    @cache(backend=memory_backend)
    async def slow(x: int) -> int:
        body.calls.append(x)
        await asyncio.sleep(0.05)
        return x * 2

    async def main() -> list[int]:
        return list(await asyncio.gather(*(slow(3) for _ in range(5))))

    assert asyncio.run(main()) == [6] * 5
    assert body.calls == [3]


def test_async_exceptions_propagate_and_are_not_cached() -> None:
    raised: list[Exception] = []

    @cache(backend=None)
    async def fail(x: int) -> int:
        raised.append(KeyError(x))
        raise raised[-1]

    for _ in range(2):
        with pytest.raises(KeyError) as excinfo:
            asyncio.run(fail(1))
        assert excinfo.value is raised[-1]
    assert len(raised) == 2


def test_async_method() -> None:
    @dataclasses.dataclass
    class Client:
        base: str

        @cache(backend=None)
        async def get(self, path: str) -> str:
            return self.base + path

    async def main() -> tuple[str, str]:
        return await Client("a/").get("x"), await Client("a/").get("x")

    assert asyncio.run(main()) == ("a/x", "a/x")
    assert Client.get.cache_info().hits == 1
